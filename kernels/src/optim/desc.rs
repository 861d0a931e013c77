//! The optimizer family's descriptor (updates alone, averaged over
//! towers, or over many variables at once, the moving averages and the
//! step counter): operands, CUDA launches and plan text and CPU dispatch, in one place (see
//! [`crate::family`]). The learning rate is an input buffer (f32[1]) read
//! on the device each step; pointer and weight arrays are side data
//! ([`Arg::Operands`], [`Arg::F32s`]).

use crate::batchnorm;
use crate::family::prelude::*;
use crate::optim;
use crate::optim::update_arity;

entries! { "optim";
    ASSIGN_MOVING_AVERAGE = "towers_assign_moving_average_f32";
    APPLY_GRADIENT_DESCENT = "towers_apply_gradient_descent_f32";
    APPLY_MOMENTUM = "towers_apply_momentum_f32";
    APPLY_ADAM = "towers_apply_adam_f32";
    APPLY_RMSPROP = "towers_apply_rmsprop_f32";
    APPLY_ADAGRAD = "towers_apply_adagrad_f32";
    MEAN_APPLY_GRADIENT_DESCENT = "towers_mean_apply_gradient_descent_f32";
    MEAN_APPLY_MOMENTUM = "towers_mean_apply_momentum_f32";
    MEAN_APPLY_ADAM = "towers_mean_apply_adam_f32";
    MEAN_APPLY_RMSPROP = "towers_mean_apply_rmsprop_f32";
    MEAN_APPLY_ADAGRAD = "towers_mean_apply_adagrad_f32";
    MULTI_APPLY_GRADIENT_DESCENT = "towers_multi_apply_gradient_descent_f32";
    MULTI_APPLY_MOMENTUM = "towers_multi_apply_momentum_f32";
    MULTI_APPLY_ADAM = "towers_multi_apply_adam_f32";
    MULTI_APPLY_RMSPROP = "towers_multi_apply_rmsprop_f32";
    MULTI_APPLY_ADAGRAD = "towers_multi_apply_adagrad_f32";
    INCREMENT_STEP = "towers_increment_step_i32";
}

/// The optim family.
pub(crate) static DESC: Desc = Desc {
    name: "optim",
    cuda: Some(CudaFile { path: "optim/optim.cu", text: include_str!("optim.cu") }),
    entries: ENTRIES,
    declare,
    lower,
    text,
    run,
    backend_workspace: no_workspace,
};

fn declare(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
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
            let (names, shared) = update_names(apply).ok_or_else(|| ParamError::from(Foreign::of(k, DESC.name)))?;
            update_params(apply, b);
            b.input("grad", F32, Len::Like(Ref::output(0)), "the variable's length");
            shared_inputs(b, shared);
            slots(b, names, 1, 0);
        }
    }
    Ok(())
}

fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    match kernel {
        Kernel::AssignMovingAverage { decay } => {
            let v = cx.o(0)?;
            cx.launch(ASSIGN_MOVING_AVERAGE, grid_1d(v), vec![i64a(v), Arg::F32(*decay), cx.inp(0)?, cx.out(0)?]);
        }
        Kernel::ApplyGradientDescent {} => {
            let w = cx.o(0)?;
            cx.launch(APPLY_GRADIENT_DESCENT, grid_1d(w), vec![i64a(w), cx.inp(1)?, cx.inp(0)?, cx.out(0)?]);
        }
        Kernel::ApplyMomentum { momentum, nesterov } => {
            let w = cx.o(0)?;
            let args = vec![
                i64a(w),
                cx.inp(1)?,
                Arg::F32(*momentum),
                Arg::I32(*nesterov as i32),
                cx.inp(0)?,
                cx.out(0)?,
                cx.out(1)?,
            ];
            cx.launch(APPLY_MOMENTUM, grid_1d(w), args);
        }
        Kernel::ApplyAdam { beta1, beta2, epsilon } => {
            let w = cx.o(0)?;
            let args = vec![
                i64a(w),
                cx.inp(2)?,
                Arg::F32(*beta1),
                Arg::F32(*beta2),
                Arg::F32(*epsilon),
                cx.inp(0)?,
                cx.inp(1)?,
                cx.out(0)?,
                cx.out(1)?,
                cx.out(2)?,
            ];
            cx.launch(APPLY_ADAM, grid_1d(w), args);
        }
        Kernel::ApplyRmsProp { decay, momentum, epsilon } => {
            let w = cx.o(0)?;
            let args = vec![
                i64a(w),
                cx.inp(1)?,
                Arg::F32(*decay),
                Arg::F32(*momentum),
                Arg::F32(*epsilon),
                cx.inp(0)?,
                cx.out(0)?,
                cx.out(1)?,
                cx.out(2)?,
            ];
            cx.launch(APPLY_RMSPROP, grid_1d(w), args);
        }
        Kernel::ApplyAdagrad {} => {
            let w = cx.o(0)?;
            let args = vec![i64a(w), cx.inp(1)?, cx.inp(0)?, cx.out(0)?, cx.out(1)?];
            cx.launch(APPLY_ADAGRAD, grid_1d(w), args);
        }
        Kernel::MeanApply { weights, apply } => mean_apply(cx, weights, apply)?,
        Kernel::MultiApply { apply, count } => multi_apply(cx, apply, *count)?,
        Kernel::IncrementStep => {
            cx.launch_block(INCREMENT_STEP, 1, 1, vec![cx.out(0)?]);
        }
        _ => return Err(Foreign::of(kernel, DESC.name).into()),
    }
    Ok(())
}

/// The CPU body of one of this family's kernels on a launch's operands.
///
/// # Safety
/// As [`Io`].
unsafe fn run(k: &Kernel, io: &dyn Io, lists: &mut Lists<'_>, _step: u64) -> Result<(), CpuError> {
    let i = |n: usize| io.f32(n);
    let ii = |n: usize| io.i32(n);
    let o = |n: usize| io.out_f32(n);
    match k {
        Kernel::AssignMovingAverage { decay } => batchnorm::assign_moving_average(o(0), i(0), *decay),
        Kernel::MeanApply { weights, apply } => {
            // Inputs: the towers' gradients, then (Adam) global_step, then the learning rate.
            let n = weights.len();
            let t = match apply.as_ref() {
                Kernel::ApplyAdam { .. } => optim::adam_step(ii(n)),
                _ => 1,
            };
            let lr = i(io.counts().0 - 1)[0];
            lists.f32s.with((0..n).map(|k| io.f32(k)), |gs| {
                lists.muts.with((0..io.counts().1).map(|j| io.out_f32(j)), |os| {
                    optim::mean_apply(gs, weights, apply, t, lr, os)
                })
            })?
        }
        Kernel::MultiApply { apply, count } => {
            // Inputs: the members' gradients, then (Adam) global_step, then the learning rate.
            let n = *count;
            let slots = optim::update_slots(apply, "multi_apply")?;
            let t = match apply.as_ref() {
                Kernel::ApplyAdam { .. } => optim::adam_step(ii(n)),
                _ => 1,
            };
            let lr = i(io.counts().0 - 1)[0];
            for m in 0..n {
                // Member m's variable and slots.
                let mut member: [&mut [f32]; 3] = [&mut [], &mut [], &mut []];
                for (s, b) in member.iter_mut().take(slots).enumerate() {
                    *b = o(m * slots + s);
                }
                optim::update(apply, &mut member[..slots], i(m), lr, t, "multi_apply")?;
            }
        }
        Kernel::ApplyGradientDescent {} => optim::apply_gradient_descent(o(0), i(0), i(1)[0]),
        Kernel::ApplyMomentum { momentum, nesterov } => {
            optim::apply_momentum(o(0), o(1), i(0), i(1)[0], *momentum, *nesterov)
        }
        Kernel::ApplyAdam { beta1, beta2, epsilon } => {
            optim::apply_adam(o(0), o(1), o(2), i(0), i(2)[0], *beta1, *beta2, *epsilon, optim::adam_step(ii(1)))
        }
        Kernel::IncrementStep => optim::increment_step(io.out_i32(0)),
        Kernel::ApplyRmsProp { decay, momentum, epsilon } => {
            optim::apply_rmsprop(o(0), o(1), o(2), i(0), i(1)[0], *decay, *momentum, *epsilon)
        }
        Kernel::ApplyAdagrad {} => optim::apply_adagrad(o(0), o(1), i(0), i(1)[0]),
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn text(k: &Kernel) -> Result<String, Foreign> {
    Ok(match k {
        Kernel::IncrementStep => String::new(),
        Kernel::AssignMovingAverage { decay } => format!("decay={decay}"),
        Kernel::ApplyGradientDescent {} => String::new(),
        Kernel::ApplyMomentum { momentum, nesterov } => {
            let nv = if *nesterov { " nesterov" } else { "" };
            format!("momentum={momentum}{nv}")
        }
        Kernel::ApplyAdam { beta1, beta2, epsilon } => format!("beta1={beta1} beta2={beta2} eps={epsilon}"),
        Kernel::ApplyRmsProp { decay, momentum, epsilon } => format!("decay={decay} momentum={momentum} eps={epsilon}"),
        Kernel::ApplyAdagrad {} => String::new(),
        Kernel::MeanApply { weights, apply } => {
            let p = apply.params_text();
            let sep = if p.is_empty() { "" } else { " " };
            format!("w={} {}{sep}{p}", list(weights), apply.name())
        }
        Kernel::MultiApply { apply, count } => {
            let p = apply.params_text();
            let sep = if p.is_empty() { "" } else { " " };
            format!("n={count} {}{sep}{p}", apply.name())
        }
        _ => return Err(Foreign::of(k, DESC.name)),
    })
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

/// The tower mean of `weights.len()` gradients, then the update.
/// Inputs after the gradients: (Adam's global_step,) the learning rate.
fn mean_apply(cx: &mut Cx<'_>, weights: &[f32], apply: &Kernel) -> Result<(), LaunchError> {
    let (w, count) = (cx.o(0)?, weights.len());
    let mut a = vec![
        i64a(w),
        Arg::I32(count as i32),
        Arg::Operands((0..count.min(cx.counts.ins.len())).map(Which::In).collect()),
        Arg::F32s(weights.to_vec()),
    ];
    let entry = match apply {
        Kernel::ApplyGradientDescent {} => {
            a.extend([cx.inp(count)?, cx.out(0)?]);
            MEAN_APPLY_GRADIENT_DESCENT
        }
        Kernel::ApplyMomentum { momentum, nesterov } => {
            a.extend([cx.inp(count)?, Arg::F32(*momentum), Arg::I32(*nesterov as i32), cx.out(0)?, cx.out(1)?]);
            MEAN_APPLY_MOMENTUM
        }
        Kernel::ApplyAdam { beta1, beta2, epsilon } => {
            a.extend([cx.inp(count + 1)?, Arg::F32(*beta1), Arg::F32(*beta2), Arg::F32(*epsilon), cx.inp(count)?]);
            a.extend([cx.out(0)?, cx.out(1)?, cx.out(2)?]);
            MEAN_APPLY_ADAM
        }
        Kernel::ApplyRmsProp { decay, momentum, epsilon } => {
            a.extend([cx.inp(count)?, Arg::F32(*decay), Arg::F32(*momentum), Arg::F32(*epsilon)]);
            a.extend([cx.out(0)?, cx.out(1)?, cx.out(2)?]);
            MEAN_APPLY_RMSPROP
        }
        Kernel::ApplyAdagrad {} => {
            a.extend([cx.inp(count)?, cx.out(0)?, cx.out(1)?]);
            MEAN_APPLY_ADAGRAD
        }
        other => return Err(LaunchError::CannotFuse { kernel: cx.name, inner: other.name() }),
    };
    cx.launch(entry, grid_1d(w), a);
    Ok(())
}

/// One update over `n` variables (outputs `m * slots + s`: variable `m`'s
/// slot `s`), as one launch over their concatenation.
fn multi_apply(cx: &mut Cx<'_>, apply: &Kernel, n: usize) -> Result<(), LaunchError> {
    let slots = cx.counts.outs.len() / n.max(1);
    let mut offsets: Vec<i64> = vec![0];
    for m in 0..n {
        offsets.push(offsets[m] + cx.o(m * slots)? as i64);
    }
    let total = offsets[n] as usize;
    let array = |s: usize| Arg::Operands((0..n).map(|m| Which::Out(m * slots + s)).collect());
    let mut a = vec![
        i64a(total),
        Arg::I32(n as i32),
        Arg::I64s(offsets),
        Arg::Operands((0..n.min(cx.counts.ins.len())).map(Which::In).collect()),
        array(0),
    ];
    let lr = cx.inp(cx.counts.ins.len().saturating_sub(1))?;
    let entry = match apply {
        Kernel::ApplyGradientDescent {} => {
            a.push(lr);
            MULTI_APPLY_GRADIENT_DESCENT
        }
        Kernel::ApplyMomentum { momentum, nesterov } => {
            a.extend([array(1), lr, Arg::F32(*momentum), Arg::I32(*nesterov as i32)]);
            MULTI_APPLY_MOMENTUM
        }
        Kernel::ApplyAdam { beta1, beta2, epsilon } => {
            a.extend([array(1), array(2), lr, Arg::F32(*beta1), Arg::F32(*beta2), Arg::F32(*epsilon), cx.inp(n)?]);
            MULTI_APPLY_ADAM
        }
        Kernel::ApplyRmsProp { decay, momentum, epsilon } => {
            a.extend([array(1), array(2), lr, Arg::F32(*decay), Arg::F32(*momentum), Arg::F32(*epsilon)]);
            MULTI_APPLY_RMSPROP
        }
        Kernel::ApplyAdagrad {} => {
            a.extend([array(1), lr]);
            MULTI_APPLY_ADAGRAD
        }
        other => return Err(LaunchError::CannotFuse { kernel: cx.name, inner: other.name() }),
    };
    cx.launch(entry, grid_1d(total), a);
    Ok(())
}
