//! The operand table, part 2: layout, softmax, reductions and casts,
//! batch norm, optimizer updates and the array kernels of issue 22. Each
//! function is called by [`Kernel::declare`] for its family only; a kernel
//! of another family is a [`ParamError`] (never reached from the table).

use super::table::{broadcast, count, dims, ensure, op, positive, prod, Builder, F32, I32, IN0};
use super::{DTypeRule, Len, ParamError, Ref, Role, Side};
use crate::dtype::DType;
use crate::optim::update_arity;
use crate::Kernel;

fn not_of(k: &Kernel, family: &str) -> ParamError {
    ParamError { reason: format!("{} is not a {family} kernel", k.name()) }
}

/// Concat, split, slice, broadcast and their adjoints.
pub(super) fn layout(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    // Layout kernels move any 4-byte element: every operand has input 0's dtype.
    const LIKE: DTypeRule = DTypeRule::Like(IN0);
    match k {
        Kernel::Concat { axis, shapes } => {
            ensure(!shapes.is_empty(), || "no shapes".into())?;
            let rank = shapes[0].len();
            ensure(*axis < rank, || format!("axis {axis} is out of range for rank {rank}"))?;
            b.param("axis", axis);
            let mut total = 0usize;
            for (i, s) in shapes.iter().enumerate() {
                let same =
                    s.len() == rank && s.iter().zip(&shapes[0]).enumerate().all(|(d, (a, b))| d == *axis || a == b);
                ensure(same, || format!("shape {} does not match {} outside axis {axis}", dims(s), dims(&shapes[0])))?;
                total = count(total.checked_add(s[*axis]), "the concatenated axis")?;
                let dt = if i == 0 { DTypeRule::Any } else { LIKE };
                let x = op("x", Role::Read, dt, Len::Exact(prod(s, "a shape")?), format!("shape {}", dims(s)));
                b.inputs(vec![super::OperandSig { index: Some(i), ..x }], 1);
            }
            let mut out = shapes[0].clone();
            out[*axis] = total;
            b.output("y", LIKE, Len::Exact(prod(&out, "the output shape")?), format!("shape {}", dims(&out)));
        }
        Kernel::Split { axis, shape, sizes } => {
            ensure(!sizes.is_empty(), || "no sizes".into())?;
            ensure(*axis < shape.len(), || format!("axis {axis} is out of range for {}", dims(shape)))?;
            let sum = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
            ensure(sum == Some(shape[*axis]), || {
                format!("sizes {} do not add up to dimension {axis} of {}", dims(sizes), dims(shape))
            })?;
            b.param("axis", axis);
            b.param("shape", dims(shape));
            b.param("sizes", dims(sizes));
            b.input("x", DTypeRule::Any, Len::Exact(prod(shape, "shape")?), format!("shape {}", dims(shape)));
            for (i, &s) in sizes.iter().enumerate() {
                let mut part = shape.clone();
                part[*axis] = s;
                let y =
                    op("y", Role::Write, LIKE, Len::Exact(prod(&part, "a part")?), format!("shape {}", dims(&part)));
                b.outputs(vec![super::OperandSig { index: Some(i), ..y }], 1);
            }
        }
        Kernel::Slice { shape, begin, size } | Kernel::SliceGrad { shape, begin, size } => {
            let inside = begin.len() == shape.len()
                && size.len() == shape.len()
                && (0..shape.len()).all(|d| begin[d].checked_add(size[d]).is_some_and(|e| e <= shape[d]));
            ensure(inside, || {
                format!("window begin={} size={} is not inside {}", dims(begin), dims(size), dims(shape))
            })?;
            b.param("shape", dims(shape));
            b.param("begin", dims(begin));
            b.param("size", dims(size));
            let (whole, window) = (prod(shape, "shape")?, prod(size, "size")?);
            let slice = matches!(k, Kernel::Slice { .. });
            let (x, y) = if slice { (whole, window) } else { (window, whole) };
            b.input(if slice { "x" } else { "dy" }, DTypeRule::Any, Len::Exact(x), "the parameters' shapes");
            b.output(if slice { "y" } else { "dx" }, LIKE, Len::Exact(y), "the parameters' shapes");
        }
        Kernel::BroadcastTo { x_shape, out_shape } | Kernel::SumTo { x_shape, out_shape } => {
            let bcast = matches!(k, Kernel::BroadcastTo { .. });
            let (big, small) = if bcast { (out_shape, x_shape) } else { (x_shape, out_shape) };
            ensure(broadcast(big, small).as_deref() == Some(&big[..]), || {
                format!("{} does not broadcast to {}", dims(small), dims(big))
            })?;
            b.param("x_shape", dims(x_shape));
            b.param("out_shape", dims(out_shape));
            b.input("x", F32, Len::Exact(prod(x_shape, "x_shape")?), format!("x_shape {}", dims(x_shape)));
            let out = prod(out_shape, "out_shape")?;
            b.output("y", F32, Len::Exact(out), format!("out_shape {}", dims(out_shape)));
        }
        _ => return Err(not_of(k, "layout")),
    }
    Ok(())
}

/// Softmax, log-softmax, their gradients and the cross entropies: rows of `classes`.
pub(super) fn softmax(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    match k {
        Kernel::Softmax { classes } | Kernel::LogSoftmax { classes } => {
            positive(*classes, "classes")?;
            b.param("classes", classes);
            b.input("x", F32, Len::Multiple(*classes), "classes");
            b.output("y", F32, Len::Like(IN0), "");
        }
        Kernel::SoftmaxGrad { classes } | Kernel::LogSoftmaxGrad { classes } => {
            positive(*classes, "classes")?;
            b.param("classes", classes);
            b.input("dy", F32, Len::Multiple(*classes), "classes");
            b.input("y", F32, Len::Like(IN0), "");
            b.output("dx", F32, Len::Like(IN0), "");
        }
        Kernel::SparseSoftmaxXentMeanGrad { classes } => {
            positive(*classes, "classes")?;
            let rows = Len::Rows { of: IN0, per_row: *classes };
            b.param("classes", classes);
            b.input("logits", F32, Len::Multiple(*classes), "classes");
            b.input("labels", I32, rows, "one label per row");
            b.input("scale", F32, Len::Exact(1), "a scalar scale");
            b.output("loss", F32, rows, "one loss per row");
            b.output("mean", F32, Len::Exact(1), "the loss's mean");
            b.output("dlogits", F32, Len::Like(IN0), "the logits' length");
            b.output("db", F32, Len::Exact(*classes), "classes (the bias gradient)");
        }
        Kernel::SparseSoftmaxXent { classes } | Kernel::SoftmaxXent { classes } => {
            positive(*classes, "classes")?;
            let sparse = matches!(k, Kernel::SparseSoftmaxXent { .. });
            let rows = Len::Rows { of: IN0, per_row: *classes };
            b.param("classes", classes);
            b.input("logits", F32, Len::Multiple(*classes), "classes");
            if sparse {
                b.input("labels", I32, rows, "one label per row");
            } else {
                b.input("labels", F32, Len::Like(IN0), "one distribution per row");
            }
            b.output("loss", F32, rows, "one loss per row");
            b.output("backprop", F32, Len::Like(IN0), "the logits' length");
        }
        _ => return Err(not_of(k, "softmax")),
    }
    Ok(())
}

/// Reductions, comparisons, casts, dropout and fills.
pub(super) fn reduce(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    match k {
        Kernel::L2Loss => {
            b.input("x", F32, Len::Any, "");
            b.output("y", F32, Len::Exact(1), "a scalar");
        }
        Kernel::ReduceSum { shape, axes } | Kernel::ReduceMean { shape, axes } => {
            let mut kept = shape.clone();
            for (i, &a) in axes.iter().enumerate() {
                ensure(a < shape.len() && !axes[..i].contains(&a), || {
                    format!("axes {} are not distinct axes of {}", dims(axes), dims(shape))
                })?;
                kept[a] = 1;
            }
            b.param("shape", dims(shape));
            b.param("axes", dims(axes));
            b.input("x", F32, Len::Exact(prod(shape, "shape")?), format!("shape {}", dims(shape)));
            let y = prod(&kept, "the kept shape")?;
            b.output("y", F32, Len::Exact(y), format!("shape {} reduced", dims(shape)));
        }
        Kernel::ArgMax { shape, axis } => {
            ensure(*axis < shape.len() && shape[*axis] >= 1 && shape[*axis] <= i32::MAX as usize, || {
                format!("axis {axis} is not a non-empty axis of {}", dims(shape))
            })?;
            let mut kept = shape.clone();
            kept[*axis] = 1;
            b.param("shape", dims(shape));
            b.param("axis", axis);
            b.input("x", F32, Len::Exact(prod(shape, "shape")?), format!("shape {}", dims(shape)));
            let y = prod(&kept, "the kept shape")?;
            b.output("indices", I32, Len::Exact(y), format!("shape {} reduced", dims(shape)));
        }
        Kernel::Equal { dtype } => {
            b.param("dtype", dtype);
            b.input("a", DTypeRule::Is(*dtype), Len::Any, "");
            b.input("b", DTypeRule::Is(*dtype), Len::Like(IN0), "");
            b.output("equal", DTypeRule::Is(DType::Bool), Len::Like(IN0), "");
        }
        Kernel::Cast { from, to } => {
            b.param("from", from);
            b.param("to", to);
            b.input("x", DTypeRule::Is(*from), Len::Any, "");
            b.output("y", DTypeRule::Is(*to), Len::Like(IN0), "");
        }
        Kernel::Dropout { keep_prob, seed, elem_offset } => {
            b.param("keep_prob", keep_prob);
            b.param("seed", seed);
            b.param("elem_offset", elem_offset);
            // Element i draws from counter elem_offset + i, which must not overflow.
            let limit = (u64::MAX as usize).saturating_sub(*elem_offset);
            b.input("x", F32, Len::AtMost(limit), format!("elem_offset {elem_offset} plus the length overflows"));
            b.output("y", F32, Len::Like(IN0), "");
            b.output("mask", F32, Len::Like(IN0), "");
        }
        Kernel::Fill { value } => {
            b.param("value", value);
            b.output("y", F32, Len::Any, "");
        }
        _ => return Err(not_of(k, "reduction")),
    }
    Ok(())
}

/// Batch norm (channels last, `[rows, channels]`).
pub(super) fn batchnorm(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    let (Kernel::BatchNormTrain { channels, .. }
    | Kernel::BatchNormInfer { channels, .. }
    | Kernel::BatchNormGrad { channels }) = k
    else {
        return Err(not_of(k, "batch norm"));
    };
    positive(*channels, "channels")?;
    b.param("channels", channels);
    let c = Len::Exact(*channels);
    let (ins, outs): (&[&'static str], &[&'static str]) = match k {
        Kernel::BatchNormTrain { epsilon, .. } => {
            b.param("epsilon", epsilon);
            b.input("x", F32, Len::Multiple(*channels), "channels");
            (&["gamma", "beta"], &["batch_mean", "batch_inv_std", "batch_var"])
        }
        Kernel::BatchNormInfer { epsilon, .. } => {
            b.param("epsilon", epsilon);
            b.input("x", F32, Len::Multiple(*channels), "channels");
            (&["gamma", "beta", "moving_mean", "moving_var"], &["mean", "inv_std", "var"])
        }
        _ => {
            b.input("dy", F32, Len::Multiple(*channels), "channels");
            b.input("x", F32, Len::Like(IN0), "");
            (&["gamma", "batch_mean", "batch_inv_std"], &["dgamma", "dbeta"])
        }
    };
    for name in ins {
        b.input(name, F32, c, "channels");
    }
    b.output(if matches!(k, Kernel::BatchNormGrad { .. }) { "dx" } else { "y" }, F32, Len::Like(IN0), "");
    for name in outs {
        b.output(name, F32, c, "channels");
    }
    Ok(())
}

/// The variable and slot names of an optimizer update, and its shared
/// inputs after the gradient (Adam's global_step, then the learning rate).
fn update_names(apply: &Kernel) -> Option<(&'static [&'static str], usize)> {
    let (slots, shared) = update_arity(apply)?;
    let names: &'static [&'static str] = match apply {
        Kernel::ApplyGradientDescent {} => &["var"],
        Kernel::ApplyMomentum { .. } | Kernel::ApplyAdagrad {} => &["var", "accum"],
        Kernel::ApplyAdam { .. } => &["var", "m", "v"],
        Kernel::ApplyRmsProp { .. } => &["var", "ms", "mom"],
        _ => return None,
    };
    (names.len() == slots).then_some((names, shared))
}

/// An update's scalar parameters.
fn update_params(apply: &Kernel, b: &mut Builder) {
    match apply {
        Kernel::ApplyMomentum { momentum, nesterov } => {
            b.param("momentum", momentum);
            b.param("nesterov", nesterov);
        }
        Kernel::ApplyAdam { beta1, beta2, epsilon } => {
            b.param("beta1", beta1);
            b.param("beta2", beta2);
            b.param("epsilon", epsilon);
        }
        Kernel::ApplyRmsProp { decay, momentum, epsilon } => {
            b.param("decay", decay);
            b.param("momentum", momentum);
            b.param("epsilon", epsilon);
        }
        _ => {}
    }
}

/// The shared inputs after an update's gradients: Adam's i32 global_step, the learning rate.
fn shared_inputs(b: &mut Builder, shared: usize) {
    if shared == 2 {
        b.input("global_step", I32, Len::Exact(1), "a scalar global_step");
    }
    b.input("lr", F32, Len::Exact(1), "a scalar learning rate");
}

/// Optimizer updates (plain, tower-fused, multi-tensor), moving averages and the step.
pub(super) fn optim(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    let not_update = |a: &Kernel| ParamError { reason: format!("{} is not an optimizer update", a.name()) };
    match k {
        Kernel::AssignMovingAverage { decay } => {
            b.param("decay", decay);
            b.input("value", F32, Len::Like(Ref::output(0)), "the variable's length");
            b.update("moving", F32, Len::Any, "");
        }
        Kernel::IncrementStep => b.update("step", I32, Len::Exact(1), "a scalar step"),
        Kernel::MeanApply { weights, apply } => {
            ensure(!weights.is_empty(), || "no weights".into())?;
            let (names, shared) = update_names(apply).ok_or_else(|| not_update(apply))?;
            b.param("weights", format!("{weights:?}"));
            b.param("apply", apply.name());
            update_params(apply, b);
            let grad = op("grad", Role::Read, F32, Len::Like(Ref::output(0)), "the variable's length");
            b.inputs(vec![grad], weights.len());
            shared_inputs(b, shared);
            slots(b, names, 1, 0);
        }
        Kernel::MultiApply { apply, count: members } => {
            ensure(*members >= 1, || "count is 0".into())?;
            let (names, shared) = update_names(apply).ok_or_else(|| not_update(apply))?;
            count(members.checked_add(shared), "count + shared inputs")?;
            count(members.checked_mul(names.len()), "count * slots")?;
            b.param("count", members);
            b.param("apply", apply.name());
            update_params(apply, b);
            // Member r's gradient and slots are as long as its variable, output r * slots.
            let var = Ref { side: Side::Out, base: 0, stride: names.len() };
            let grad = op("grad", Role::Read, F32, Len::Like(var), "");
            b.inputs(vec![grad], *members);
            shared_inputs(b, shared);
            slots(b, names, *members, names.len());
        }
        apply => {
            let (names, shared) = update_names(apply).ok_or_else(|| not_of(k, "optimizer"))?;
            update_params(apply, b);
            b.input("grad", F32, Len::Like(Ref::output(0)), "the variable's length");
            shared_inputs(b, shared);
            slots(b, names, 1, 0);
        }
    }
    Ok(())
}

/// The variable and its slots, updated in place, repeated `times` times
/// (member `r`'s variable is output `r * stride`).
fn slots(b: &mut Builder, names: &[&'static str], times: usize, stride: usize) {
    let var = Ref { side: Side::Out, base: 0, stride };
    let ops = names
        .iter()
        .enumerate()
        .map(|(s, &name)| {
            let len = if s == 0 { Len::Any } else { Len::Like(var) };
            op(name, Role::Update, F32, len, if s == 0 || stride > 0 { "" } else { "the variable's length" })
        })
        .collect();
    b.outputs(ops, times);
}

/// The array kernels of issue 22: indices i32, data f32 (a transpose moves
/// any 4-byte element), rank <= 4 where the kernels pad shapes to rank 4.
pub(super) fn array(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    let rank4 = |shape: &[usize]| {
        ensure(shape.len() <= 4, || format!("shape {} has rank above 4, the kernels' limit", dims(shape)))
    };
    match k {
        Kernel::OneHot { depth, on, off } => {
            b.param("depth", depth);
            b.param("on", on);
            b.param("off", off);
            b.input("indices", I32, Len::Any, "");
            let why = format!("the indices' count times depth {depth}");
            b.output("y", F32, Len::Times { of: IN0, factor: *depth }, why);
        }
        Kernel::Transpose { shape, perm } => {
            rank4(shape)?;
            let ok = perm.len() == shape.len() && (0..shape.len()).all(|a| perm.contains(&a));
            ensure(ok, || format!("perm {} is not a permutation of the axes of {}", dims(perm), dims(shape)))?;
            b.param("shape", dims(shape));
            b.param("perm", dims(perm));
            let n = Len::Exact(prod(shape, "shape")?);
            b.input("x", DTypeRule::Any, n, "the shape's element count");
            b.output("y", DTypeRule::Like(IN0), n, "the shape's element count");
        }
        Kernel::Pad { shape, before, out_shape, value } => {
            rank4(shape)?;
            let inside = before.len() == shape.len()
                && out_shape.len() == shape.len()
                && (0..shape.len()).all(|d| before[d].checked_add(shape[d]).is_some_and(|e| e <= out_shape[d]));
            ensure(inside, || format!("{} at {} is not inside {}", dims(shape), dims(before), dims(out_shape)))?;
            b.param("shape", dims(shape));
            b.param("before", dims(before));
            b.param("out_shape", dims(out_shape));
            b.param("value", value);
            b.input("x", F32, Len::Exact(prod(shape, "shape")?), format!("shape {}", dims(shape)));
            let out = prod(out_shape, "out_shape")?;
            b.output("y", F32, Len::Exact(out), format!("out_shape {}", dims(out_shape)));
        }
        Kernel::Gather { outer, limit, inner, count } | Kernel::GatherGrad { outer, limit, inner, count } => {
            let params = prod(&[*outer, *limit, *inner], "outer*limit*inner")?;
            let gathered = prod(&[*outer, *count, *inner], "outer*count*inner")?;
            for (n, v) in [("outer", outer), ("limit", limit), ("inner", inner), ("count", count)] {
                b.param(n, v);
            }
            let gather = matches!(k, Kernel::Gather { .. });
            let (x, y) = if gather { (params, gathered) } else { (gathered, params) };
            b.input(if gather { "params" } else { "dy" }, F32, Len::Exact(x), "the parameters' shapes");
            b.input("indices", I32, Len::Exact(*count), "count indices");
            b.output(if gather { "y" } else { "dparams" }, F32, Len::Exact(y), "the parameters' shapes");
        }
        Kernel::Tile { shape, multiples } | Kernel::TileGrad { shape, multiples } => {
            rank4(shape)?;
            ensure(multiples.len() == shape.len(), || {
                format!("{} multiples for shape {}", multiples.len(), dims(shape))
            })?;
            let mut tiled = Vec::with_capacity(shape.len());
            for (d, m) in shape.iter().zip(multiples) {
                tiled.push(count(d.checked_mul(*m), "the tiled shape")?);
            }
            b.param("shape", dims(shape));
            b.param("multiples", dims(multiples));
            let (small, big) = (prod(shape, "shape")?, prod(&tiled, "the tiled shape")?);
            let tile = matches!(k, Kernel::Tile { .. });
            let (x, y) = if tile { (small, big) } else { (big, small) };
            b.input(if tile { "x" } else { "dy" }, F32, Len::Exact(x), "the parameters' shapes");
            b.output(if tile { "y" } else { "dx" }, F32, Len::Exact(y), "the parameters' shapes");
        }
        _ => return Err(not_of(k, "array")),
    }
    Ok(())
}
