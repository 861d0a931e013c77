//! The launch rule of the verifier: a launch's arity, and the element counts
//! and dtypes of its operands, agree with its kernel's parameters, and the
//! parameters agree with themselves (shapes that broadcast, axes in range,
//! positive windows, strides, classes and channels, the convolution's
//! workspace length as the kernels compute it). Counts are computed with
//! checked arithmetic; an overflow is a [`PlanError::BadParams`].

use towers_vocab::{DType, Padding};

use super::{dims, product, Operand, PlanError, Site};
use towers_kernels::{ConvGeom, Kernel, PoolGeom};

// array ops (issue 22)
mod array;

/// Which operand of a launch.
#[derive(Clone, Copy)]
enum Io {
    In(usize),
    Out(usize),
}

/// The checks of one launch against its kernel's parameters.
pub(super) struct Check<'a, 'p> {
    pub(super) at: Site<'p>,
    pub(super) kernel: &'static str,
    pub(super) ins: &'a [Operand<'p>],
    pub(super) outs: &'a [Operand<'p>],
}

impl Check<'_, '_> {
    fn operand(&self, io: Io) -> (String, &Operand<'_>) {
        match io {
            Io::In(i) => (format!("input {i}"), &self.ins[i]),
            Io::Out(i) => (format!("output {i}"), &self.outs[i]),
        }
    }

    fn arity(&self, what: &str, expected: &str, ok: bool, got: usize) -> Result<(), PlanError> {
        if ok {
            return Ok(());
        }
        Err(PlanError::Arity {
            at: self.at.to_string().into(),
            kernel: self.kernel.into(),
            what: what.into(),
            expected: expected.into(),
            got,
        })
    }

    /// Exactly `n_in` inputs and `n_out` outputs.
    fn args(&self, n_in: usize, n_out: usize) -> Result<(), PlanError> {
        self.arity("inputs", &n_in.to_string(), self.ins.len() == n_in, self.ins.len())?;
        self.arity("outputs", &n_out.to_string(), self.outs.len() == n_out, self.outs.len())
    }

    fn param(&self, ok: bool, reason: impl FnOnce() -> String) -> Result<(), PlanError> {
        if ok {
            return Ok(());
        }
        Err(PlanError::BadParams {
            at: self.at.to_string().into(),
            kernel: self.kernel.into(),
            reason: reason().into(),
        })
    }

    /// A count computed from the parameters, or an error when it overflows.
    fn count(&self, v: Option<usize>, what: &str) -> Result<usize, PlanError> {
        v.ok_or_else(|| PlanError::BadParams {
            at: self.at.to_string().into(),
            kernel: self.kernel.into(),
            reason: format!("{what} overflows").into(),
        })
    }

    fn prod(&self, d: &[usize], what: &str) -> Result<usize, PlanError> {
        self.count(product(d), what)
    }

    fn size(&self, io: Io, expected: usize, why: impl FnOnce() -> String) -> Result<(), PlanError> {
        let (operand, o) = self.operand(io);
        if o.elems == expected {
            return Ok(());
        }
        Err(PlanError::OperandSize {
            at: self.at.to_string().into(),
            kernel: self.kernel.into(),
            operand: operand.into(),
            name: o.name.into(),
            got: o.elems,
            expected,
            why: why().into(),
        })
    }

    fn dtype(&self, io: Io, dtype: DType) -> Result<(), PlanError> {
        let (operand, o) = self.operand(io);
        if o.dtype == dtype {
            return Ok(());
        }
        Err(PlanError::OperandDtype {
            at: self.at.to_string().into(),
            kernel: self.kernel.into(),
            operand: operand.into(),
            name: o.name.into(),
            got: o.ty().into(),
            expected: dtype.to_string().into(),
        })
    }

    /// Every operand is f32.
    fn all_f32(&self) -> Result<(), PlanError> {
        (0..self.ins.len()).try_for_each(|i| self.dtype(Io::In(i), DType::F32))?;
        (0..self.outs.len()).try_for_each(|i| self.dtype(Io::Out(i), DType::F32))
    }

    /// Every operand has input 0's dtype (layout kernels move any 4-byte element).
    fn same_dtype(&self) -> Result<(), PlanError> {
        let Some(d) = self.ins.first().or(self.outs.first()).map(|o| o.dtype) else { return Ok(()) };
        (0..self.ins.len()).try_for_each(|i| self.dtype(Io::In(i), d))?;
        (0..self.outs.len()).try_for_each(|i| self.dtype(Io::Out(i), d))
    }

    /// Operands `ios` all have `n` elements.
    fn sizes(&self, ios: &[Io], n: usize, why: &str) -> Result<(), PlanError> {
        ios.iter().try_for_each(|&io| self.size(io, n, || why.to_string()))
    }

    /// A positive class/channel count that divides input 0's element count: the rows.
    fn rows(&self, per_row: usize, what: &str) -> Result<usize, PlanError> {
        self.param(per_row >= 1, || format!("{what} is 0"))?;
        let n = self.ins[0].elems;
        self.param(n.is_multiple_of(per_row), || {
            format!("input 0 '{}' has {n} elements, not a multiple of {what} {per_row}", self.ins[0].name)
        })?;
        Ok(n / per_row)
    }

    pub(super) fn kernel(&self, k: &Kernel, ws: Option<&Operand>) -> Result<(), PlanError> {
        use Io::{In, Out};
        let conv_ws = matches!(
            k,
            Kernel::Conv2D { .. }
                | Kernel::Conv2DBiasAct { .. }
                | Kernel::Conv2DBackpropInput { .. }
                | Kernel::Conv2DBackpropFilter { .. }
        );
        if !conv_ws {
            if let Some(w) = ws {
                return Err(PlanError::Workspace {
                    at: self.at.to_string().into(),
                    kernel: self.kernel.into(),
                    expected: 0,
                    got: format!("'{}' with {} elements", w.name, w.elems).into(),
                });
            }
        }
        match k {
            Kernel::MatMul { m, n, k, .. } => {
                self.args(2, 1)?;
                self.all_f32()?;
                self.size(In(0), self.count(m.checked_mul(*k), "m*k")?, || format!("m*k = {m}*{k}"))?;
                self.size(In(1), self.count(k.checked_mul(*n), "k*n")?, || format!("k*n = {k}*{n}"))?;
                self.size(Out(0), self.count(m.checked_mul(*n), "m*n")?, || format!("m*n = {m}*{n}"))
            }
            Kernel::TowerMatMul { m, n, ks, weights, .. } => {
                self.tower_weights(ks, weights)?;
                self.args(2 * ks.len(), 1)?;
                self.all_f32()?;
                self.tower_pairs(*m, *n, ks)?;
                self.size(Out(0), self.count(m.checked_mul(*n), "m*n")?, || format!("m*n = {m}*{n}"))
            }
            Kernel::TowerMatMulApply { m, n, ks, weights, apply, .. } => {
                self.tower_weights(ks, weights)?;
                let slots = match **apply {
                    Kernel::ApplyGradientDescent {} => 1,
                    Kernel::ApplyMomentum { nesterov: false, .. } => 2,
                    _ => {
                        return self.param(false, || {
                            format!(
                                "{} cannot take a tower product (plain SGD or non-Nesterov momentum only)",
                                apply.name()
                            )
                        })
                    }
                };
                self.args(2 * ks.len() + 1, slots)?;
                self.all_f32()?;
                self.tower_pairs(*m, *n, ks)?;
                self.size(In(2 * ks.len()), 1, || "a scalar learning rate".into())?;
                for s in 0..slots {
                    self.size(Out(s), self.count(m.checked_mul(*n), "m*n")?, || format!("m*n = {m}*{n}"))?;
                }
                Ok(())
            }
            Kernel::MatMulBiasAct { m, n, k, .. } => {
                self.args(3, 1)?;
                self.all_f32()?;
                self.size(In(0), self.count(m.checked_mul(*k), "m*k")?, || format!("m*k = {m}*{k}"))?;
                self.size(In(1), self.count(k.checked_mul(*n), "k*n")?, || format!("k*n = {k}*{n}"))?;
                self.size(In(2), *n, || format!("n = {n} (the bias)"))?;
                self.size(Out(0), self.count(m.checked_mul(*n), "m*n")?, || format!("m*n = {m}*{n}"))
            }
            Kernel::Binary { a_shape, b_shape, out_shape, .. } => {
                self.args(2, 1)?;
                self.all_f32()?;
                let out = broadcast(a_shape, b_shape);
                self.param(out.as_deref() == Some(out_shape.as_slice()), || {
                    format!("{} and {} do not broadcast to {}", dims(a_shape), dims(b_shape), dims(out_shape))
                })?;
                self.size(In(0), self.prod(a_shape, "a_shape")?, || format!("a_shape {}", dims(a_shape)))?;
                self.size(In(1), self.prod(b_shape, "b_shape")?, || format!("b_shape {}", dims(b_shape)))?;
                self.size(Out(0), self.prod(out_shape, "out_shape")?, || format!("out_shape {}", dims(out_shape)))
            }
            Kernel::Fused { expr, in_shapes, out_shape } => {
                // A plan read from JSON carries the expression unchecked.
                let checked = towers_kernels::elementwise::FusedExpr::new(expr.steps().to_vec());
                self.param(checked.as_ref() == Ok(expr), || match checked {
                    Err(e) => e.to_string(),
                    Ok(_) => "the expression's input count does not match its steps".into(),
                })?;
                self.param(in_shapes.len() == expr.inputs(), || {
                    format!("{} input shapes for an expression of {} inputs", in_shapes.len(), expr.inputs())
                })?;
                self.args(expr.inputs(), 1)?;
                self.all_f32()?;
                let mut out: Option<Vec<usize>> = Some(Vec::new());
                for s in in_shapes {
                    out = out.and_then(|o| broadcast(&o, s));
                }
                self.param(out.as_deref() == Some(out_shape.as_slice()), || {
                    let ins: Vec<String> = in_shapes.iter().map(|s| dims(s)).collect();
                    format!("inputs {} do not broadcast to {}", ins.join(", "), dims(out_shape))
                })?;
                for (i, s) in in_shapes.iter().enumerate() {
                    self.size(In(i), self.prod(s, "an input shape")?, || format!("input shape {}", dims(s)))?;
                }
                self.size(Out(0), self.prod(out_shape, "out_shape")?, || format!("out_shape {}", dims(out_shape)))
            }
            Kernel::AddN { n } => {
                self.param(*n >= 1, || "n is 0".into())?;
                self.args(*n, 1)?;
                self.all_f32()?;
                let len = self.outs[0].elems;
                self.sizes(&(0..*n).map(In).collect::<Vec<_>>(), len, "the output's length")
            }
            Kernel::WeightedSum { weights } => {
                self.param(!weights.is_empty(), || "no weights".into())?;
                self.args(weights.len(), 1)?;
                self.all_f32()?;
                let len = self.outs[0].elems;
                self.sizes(&(0..weights.len()).map(In).collect::<Vec<_>>(), len, "the output's length")
            }
            Kernel::BiasAdd { channels } | Kernel::BiasAddAct { channels, .. } => {
                self.args(2, 1)?;
                self.all_f32()?;
                self.rows(*channels, "channels")?;
                self.size(In(1), *channels, || "channels".into())?;
                self.size(Out(0), self.ins[0].elems, || "input 0's length".into())
            }
            Kernel::UnaryGradBiasGrad { channels, .. } => {
                self.args(2, 2)?;
                self.all_f32()?;
                self.rows(*channels, "channels")?;
                self.size(In(1), self.ins[0].elems, || "input 0's length".into())?;
                self.size(Out(0), self.ins[0].elems, || "input 0's length".into())?;
                self.size(Out(1), *channels, || "channels".into())
            }
            Kernel::BiasAddGrad { channels } => {
                self.args(1, 1)?;
                self.all_f32()?;
                self.rows(*channels, "channels")?;
                self.size(Out(0), *channels, || "channels".into())
            }
            Kernel::Unary { .. } => {
                self.args(1, 1)?;
                self.all_f32()?;
                self.size(Out(0), self.ins[0].elems, || "input 0's length".into())
            }
            Kernel::UnaryGrad { .. } => {
                self.args(2, 1)?;
                self.all_f32()?;
                self.sizes(&[In(1), Out(0)], self.ins[0].elems, "input 0's length")
            }
            Kernel::Conv2D { geom, workspace_len } => {
                self.args(2, 1)?;
                self.all_f32()?;
                let c = self.conv(geom, *workspace_len, ws)?;
                self.size(In(0), c.x, || "n*h*w*c_in".into())?;
                self.size(In(1), c.filter, || "kh*kw*c_in*c_out".into())?;
                self.size(Out(0), c.y, || "n*out_h*out_w*c_out".into())
            }
            Kernel::Conv2DBiasAct { geom, workspace_len, pool, .. } => {
                self.args(3, 1 + usize::from(pool.is_some()))?;
                self.all_f32()?;
                let c = self.conv(geom, *workspace_len, ws)?;
                self.size(In(0), c.x, || "n*h*w*c_in".into())?;
                self.size(In(1), c.filter, || "kh*kw*c_in*c_out".into())?;
                self.size(In(2), geom.c_out, || "c_out (the bias)".into())?;
                self.size(Out(0), c.y, || "n*out_h*out_w*c_out".into())?;
                if let Some(pg) = pool {
                    let (px, py) = self.pool(pg)?;
                    self.param(px == c.y && pg.n == geom.n && pg.c == geom.c_out, || {
                        "the pool's input must be the convolution's output".into()
                    })?;
                    self.size(Out(1), py, || "the pool's n*out_h*out_w*c".into())?;
                }
                Ok(())
            }
            Kernel::Conv2DBackpropInput { geom, workspace_len } => {
                self.args(2, 1)?;
                self.all_f32()?;
                let c = self.conv(geom, *workspace_len, ws)?;
                self.size(In(0), c.y, || "n*out_h*out_w*c_out".into())?;
                self.size(In(1), c.filter, || "kh*kw*c_in*c_out".into())?;
                self.size(Out(0), c.x, || "n*h*w*c_in".into())
            }
            Kernel::Conv2DBackpropFilter { geom, workspace_len } => {
                self.args(2, 1)?;
                self.all_f32()?;
                let c = self.conv(geom, *workspace_len, ws)?;
                self.size(In(0), c.x, || "n*h*w*c_in".into())?;
                self.size(In(1), c.y, || "n*out_h*out_w*c_out".into())?;
                self.size(Out(0), c.filter, || "kh*kw*c_in*c_out".into())
            }
            Kernel::MaxPool { geom } | Kernel::AvgPool { geom } => {
                self.args(1, 1)?;
                self.all_f32()?;
                let (x, y) = self.pool(geom)?;
                self.size(In(0), x, || "n*h*w*c".into())?;
                self.size(Out(0), y, || "n*out_h*out_w*c".into())
            }
            Kernel::MaxPoolGrad { geom } => {
                self.args(3, 1)?;
                self.all_f32()?;
                let (x, y) = self.pool(geom)?;
                self.sizes(&[In(0), Out(0)], x, "n*h*w*c")?;
                self.sizes(&[In(1), In(2)], y, "n*out_h*out_w*c")
            }
            Kernel::MaxPoolGradActBiasGrad { geom, .. } => {
                self.args(4, 2)?;
                self.all_f32()?;
                let (x, y) = self.pool(geom)?;
                self.sizes(&[In(0), In(3), Out(0)], x, "n*h*w*c")?;
                self.sizes(&[In(1), In(2)], y, "n*out_h*out_w*c")?;
                self.size(Out(1), geom.c, || "c (the bias gradient)".into())
            }
            Kernel::AvgPoolGrad { geom } => {
                self.args(1, 1)?;
                self.all_f32()?;
                let (x, y) = self.pool(geom)?;
                self.size(In(0), y, || "n*out_h*out_w*c".into())?;
                self.size(Out(0), x, || "n*h*w*c".into())
            }
            Kernel::Concat { axis, shapes } => {
                self.param(!shapes.is_empty(), || "no shapes".into())?;
                self.args(shapes.len(), 1)?;
                self.same_dtype()?;
                let rank = shapes[0].len();
                self.param(*axis < rank, || format!("axis {axis} is out of range for rank {rank}"))?;
                let mut total = 0usize;
                for (i, s) in shapes.iter().enumerate() {
                    let same =
                        s.len() == rank && s.iter().zip(&shapes[0]).enumerate().all(|(d, (a, b))| d == *axis || a == b);
                    self.param(same, || {
                        format!("shape {} does not match {} outside axis {axis}", dims(s), dims(&shapes[0]))
                    })?;
                    total = self.count(total.checked_add(s[*axis]), "the concatenated axis")?;
                    self.size(In(i), self.prod(s, "a shape")?, || format!("shape {}", dims(s)))?;
                }
                let mut out = shapes[0].clone();
                out[*axis] = total;
                self.size(Out(0), self.prod(&out, "the output shape")?, || format!("shape {}", dims(&out)))
            }
            Kernel::Split { axis, shape, sizes } => {
                self.param(!sizes.is_empty(), || "no sizes".into())?;
                self.args(1, sizes.len())?;
                self.same_dtype()?;
                self.param(*axis < shape.len(), || format!("axis {axis} is out of range for {}", dims(shape)))?;
                let sum = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
                self.param(sum == Some(shape[*axis]), || {
                    format!("sizes {} do not add up to dimension {axis} of {}", dims(sizes), dims(shape))
                })?;
                self.size(In(0), self.prod(shape, "shape")?, || format!("shape {}", dims(shape)))?;
                for (i, &s) in sizes.iter().enumerate() {
                    let mut part = shape.clone();
                    part[*axis] = s;
                    self.size(Out(i), self.prod(&part, "a part")?, || format!("shape {}", dims(&part)))?;
                }
                Ok(())
            }
            Kernel::Slice { shape, begin, size } | Kernel::SliceGrad { shape, begin, size } => {
                self.args(1, 1)?;
                self.same_dtype()?;
                let inside = begin.len() == shape.len()
                    && size.len() == shape.len()
                    && (0..shape.len()).all(|d| begin[d].checked_add(size[d]).is_some_and(|e| e <= shape[d]));
                self.param(inside, || {
                    format!("window begin={} size={} is not inside {}", dims(begin), dims(size), dims(shape))
                })?;
                let (whole, window) = (self.prod(shape, "shape")?, self.prod(size, "size")?);
                let (x, y) = if matches!(k, Kernel::Slice { .. }) { (whole, window) } else { (window, whole) };
                self.size(In(0), x, || "the parameters' shapes".into())?;
                self.size(Out(0), y, || "the parameters' shapes".into())
            }
            Kernel::BroadcastTo { x_shape, out_shape } | Kernel::SumTo { x_shape, out_shape } => {
                self.args(1, 1)?;
                self.all_f32()?;
                let (big, small) =
                    if matches!(k, Kernel::BroadcastTo { .. }) { (out_shape, x_shape) } else { (x_shape, out_shape) };
                self.param(broadcast(big, small).as_deref() == Some(&big[..]), || {
                    format!("{} does not broadcast to {}", dims(small), dims(big))
                })?;
                self.size(In(0), self.prod(x_shape, "x_shape")?, || format!("x_shape {}", dims(x_shape)))?;
                self.size(Out(0), self.prod(out_shape, "out_shape")?, || format!("out_shape {}", dims(out_shape)))
            }
            Kernel::Softmax { classes } | Kernel::LogSoftmax { classes } => {
                self.args(1, 1)?;
                self.all_f32()?;
                self.rows(*classes, "classes")?;
                self.size(Out(0), self.ins[0].elems, || "input 0's length".into())
            }
            Kernel::SoftmaxGrad { classes } | Kernel::LogSoftmaxGrad { classes } => {
                self.args(2, 1)?;
                self.all_f32()?;
                self.rows(*classes, "classes")?;
                self.sizes(&[In(1), Out(0)], self.ins[0].elems, "input 0's length")
            }
            Kernel::SparseSoftmaxXentMeanGrad { classes } => {
                self.args(3, 4)?;
                for io in [In(0), In(2), Out(0), Out(1), Out(2), Out(3)] {
                    self.dtype(io, DType::F32)?;
                }
                self.dtype(In(1), DType::I32)?;
                let rows = self.rows(*classes, "classes")?;
                self.size(In(1), rows, || "one label per row".into())?;
                self.size(In(2), 1, || "a scalar scale".into())?;
                self.size(Out(0), rows, || "one loss per row".into())?;
                self.size(Out(1), 1, || "the loss's mean".into())?;
                self.size(Out(2), self.ins[0].elems, || "the logits' length".into())?;
                self.size(Out(3), *classes, || "classes (the bias gradient)".into())
            }
            Kernel::SparseSoftmaxXent { classes } | Kernel::SoftmaxXent { classes } => {
                self.args(2, 2)?;
                let sparse = matches!(k, Kernel::SparseSoftmaxXent { .. });
                for io in [In(0), Out(0), Out(1)] {
                    self.dtype(io, DType::F32)?;
                }
                self.dtype(In(1), if sparse { DType::I32 } else { DType::F32 })?;
                let rows = self.rows(*classes, "classes")?;
                self.size(In(1), if sparse { rows } else { self.ins[0].elems }, || "one label per row".into())?;
                self.size(Out(0), rows, || "one loss per row".into())?;
                self.size(Out(1), self.ins[0].elems, || "the logits' length".into())
            }
            Kernel::L2Loss => {
                self.args(1, 1)?;
                self.all_f32()?;
                self.size(Out(0), 1, || "a scalar".into())
            }
            Kernel::ReduceSum { shape, axes } | Kernel::ReduceMean { shape, axes } => {
                self.args(1, 1)?;
                self.all_f32()?;
                let mut kept = shape.clone();
                for (i, &a) in axes.iter().enumerate() {
                    self.param(a < shape.len() && !axes[..i].contains(&a), || {
                        format!("axes {} are not distinct axes of {}", dims(axes), dims(shape))
                    })?;
                    kept[a] = 1;
                }
                self.size(In(0), self.prod(shape, "shape")?, || format!("shape {}", dims(shape)))?;
                self.size(Out(0), self.prod(&kept, "the kept shape")?, || format!("shape {} reduced", dims(shape)))
            }
            Kernel::ArgMax { shape, axis } => {
                self.args(1, 1)?;
                self.dtype(In(0), DType::F32)?;
                self.dtype(Out(0), DType::I32)?;
                self.param(*axis < shape.len() && shape[*axis] >= 1 && shape[*axis] <= i32::MAX as usize, || {
                    format!("axis {axis} is not a non-empty axis of {}", dims(shape))
                })?;
                let mut kept = shape.clone();
                kept[*axis] = 1;
                self.size(In(0), self.prod(shape, "shape")?, || format!("shape {}", dims(shape)))?;
                self.size(Out(0), self.prod(&kept, "the kept shape")?, || format!("shape {} reduced", dims(shape)))
            }
            Kernel::Equal { dtype } => {
                self.args(2, 1)?;
                self.dtype(In(0), *dtype)?;
                self.dtype(In(1), *dtype)?;
                self.dtype(Out(0), DType::Bool)?;
                self.sizes(&[In(1), Out(0)], self.ins[0].elems, "input 0's length")
            }
            Kernel::Cast { from, to } => {
                self.args(1, 1)?;
                self.dtype(In(0), *from)?;
                self.dtype(Out(0), *to)?;
                self.size(Out(0), self.ins[0].elems, || "input 0's length".into())
            }
            Kernel::Dropout { elem_offset, .. } => {
                self.args(1, 2)?;
                self.all_f32()?;
                let n = self.ins[0].elems;
                self.param(elem_offset.checked_add(n).is_some_and(|e| e <= u64::MAX as usize), || {
                    format!("elem_offset {elem_offset} + {n} elements overflows")
                })?;
                self.sizes(&[Out(0), Out(1)], n, "input 0's length")
            }
            Kernel::Fill { .. } => {
                self.args(0, 1)?;
                self.all_f32()
            }
            Kernel::BatchNormTrain { channels, .. } | Kernel::BatchNormInfer { channels, .. } => {
                let infer = matches!(k, Kernel::BatchNormInfer { .. });
                self.args(if infer { 5 } else { 3 }, 4)?;
                self.all_f32()?;
                self.rows(*channels, "channels")?;
                let per_channel: Vec<Io> = (1..self.ins.len()).map(In).chain((1..4).map(Out)).collect();
                self.sizes(&per_channel, *channels, "channels")?;
                self.size(Out(0), self.ins[0].elems, || "input 0's length".into())
            }
            Kernel::BatchNormGrad { channels } => {
                self.args(5, 3)?;
                self.all_f32()?;
                self.rows(*channels, "channels")?;
                self.sizes(&[In(1), Out(0)], self.ins[0].elems, "input 0's length")?;
                self.sizes(&[In(2), In(3), In(4), Out(1), Out(2)], *channels, "channels")
            }
            Kernel::AssignMovingAverage { .. } => {
                self.args(1, 1)?;
                self.all_f32()?;
                self.size(In(0), self.outs[0].elems, || "the variable's length".into())
            }
            Kernel::ApplyGradientDescent { .. }
            | Kernel::ApplyMomentum { .. }
            | Kernel::ApplyAdam { .. }
            | Kernel::ApplyRmsProp { .. }
            | Kernel::ApplyAdagrad { .. } => self.apply(k, 1),
            Kernel::MeanApply { weights, apply } => {
                self.param(!weights.is_empty(), || "no weights".into())?;
                self.param(towers_kernels::optim::update_arity(apply).is_some(), || {
                    format!("{} is not an optimizer update", apply.name())
                })?;
                self.apply(apply, weights.len())
            }
            Kernel::MultiApply { apply, count } => {
                self.param(*count >= 1, || "count is 0".into())?;
                let Some((slots, shared)) = towers_kernels::optim::update_arity(apply) else {
                    return self.param(false, || format!("{} is not an optimizer update", apply.name()));
                };
                let n_in = self.count(count.checked_add(shared), "count + shared inputs")?;
                let n_out = self.count(count.checked_mul(slots), "count * slots")?;
                self.args(n_in, n_out)?;
                for m in 0..*count {
                    let len = self.outs[m * slots].elems;
                    self.dtype(In(m), DType::F32)?;
                    self.size(In(m), len, || format!("member {m}'s variable length"))?;
                    for s in 0..slots {
                        self.dtype(Out(m * slots + s), DType::F32)?;
                        self.size(Out(m * slots + s), len, || format!("member {m}'s variable length"))?;
                    }
                }
                if shared == 2 {
                    self.dtype(In(*count), DType::I32)?;
                    self.size(In(*count), 1, || "a scalar global_step".into())?;
                }
                self.dtype(In(n_in - 1), DType::F32)?;
                self.size(In(n_in - 1), 1, || "a scalar learning rate".into())
            }
            Kernel::IncrementStep => {
                self.args(0, 1)?;
                self.dtype(Out(0), DType::I32)?;
                self.size(Out(0), 1, || "a scalar step".into())
            }
            // array ops (issue 22)
            Kernel::OneHot { .. }
            | Kernel::Transpose { .. }
            | Kernel::Pad { .. }
            | Kernel::Gather { .. }
            | Kernel::GatherGrad { .. }
            | Kernel::Tile { .. }
            | Kernel::TileGrad { .. } => self.array(k),
        }
    }

    /// An optimizer update with `grads` gradients (one per tower when fused):
    /// in: the gradients, then Adam's i32 global_step; out: the variable and its slots.
    /// A tower product's weights: one per pair, at least one pair.
    fn tower_weights(&self, ks: &[usize], weights: &[f32]) -> Result<(), PlanError> {
        self.param(!ks.is_empty() && ks.len() == weights.len(), || {
            format!("{} k's for {} weights (one pair per replica, at least one)", ks.len(), weights.len())
        })
    }

    /// A tower product's operand pairs (inputs `2p`, `2p + 1`): `[m, k_p]` and `[k_p, n]`.
    fn tower_pairs(&self, m: usize, n: usize, ks: &[usize]) -> Result<(), PlanError> {
        for (p, k) in ks.iter().enumerate() {
            self.size(Io::In(2 * p), self.count(m.checked_mul(*k), "m*k")?, || format!("pair {p}: m*k = {m}*{k}"))?;
            self.size(Io::In(2 * p + 1), self.count(k.checked_mul(n), "k*n")?, || format!("pair {p}: k*n = {k}*{n}"))?;
        }
        Ok(())
    }

    fn apply(&self, k: &Kernel, grads: usize) -> Result<(), PlanError> {
        // (slots, inputs after the gradient: Adam's global_step and the learning rate).
        let (slots, shared) = towers_kernels::optim::update_arity(k).unwrap_or((3, 2));
        let step = shared - 1;
        // Inputs: the gradient(s), Adam's global_step, the learning rate.
        self.args(grads + step + 1, slots)?;
        let len = self.outs[0].elems;
        for i in 0..grads {
            self.dtype(Io::In(i), DType::F32)?;
            self.size(Io::In(i), len, || "the variable's length".into())?;
        }
        for i in 0..slots {
            self.dtype(Io::Out(i), DType::F32)?;
            self.size(Io::Out(i), len, || "the variable's length".into())?;
        }
        if step == 1 {
            self.dtype(Io::In(grads), DType::I32)?;
            self.size(Io::In(grads), 1, || "a scalar global_step".into())?;
        }
        self.dtype(Io::In(grads + step), DType::F32)?;
        self.size(Io::In(grads + step), 1, || "a scalar learning rate".into())?;
        Ok(())
    }

    /// Lengths of a convolution's x, filter and y, with its workspace checked.
    fn conv(&self, g: &ConvGeom, workspace_len: usize, ws: Option<&Operand>) -> Result<ConvLens, PlanError> {
        let oh = self.window(g.h, g.kh, g.stride_h, g.padding)?;
        let ow = self.window(g.w, g.kw, g.stride_w, g.padding)?;
        let x = self.prod(&[g.n, g.h, g.w, g.c_in], "n*h*w*c_in")?;
        let filter = self.prod(&[g.kh, g.kw, g.c_in, g.c_out], "kh*kw*c_in*c_out")?;
        let y = self.prod(&[g.n, oh, ow, g.c_out], "n*out_h*out_w*c_out")?;
        self.prod(&[g.n, oh, ow, g.kh, g.kw, g.c_in.max(1)], "the column matrix")?;
        // Every product above is in range, so the kernel's own arithmetic is too.
        let expected = g.workspace_len();
        let got = ws.map_or(0, |w| w.elems);
        let f32_ws = ws.is_none_or(|w| w.dtype == DType::F32);
        if workspace_len != expected || got != expected || !f32_ws || (expected == 0 && ws.is_some()) {
            return Err(PlanError::Workspace {
                at: self.at.to_string().into(),
                kernel: self.kernel.into(),
                expected,
                got: match ws {
                    Some(w) => {
                        format!("'{}' ({}, {} elements; workspace_len={workspace_len})", w.name, w.ty(), w.elems).into()
                    }
                    None => format!("none (workspace_len={workspace_len})").into(),
                },
            });
        }
        Ok(ConvLens { x, filter, y })
    }

    /// Lengths of a pool's x and y.
    fn pool(&self, g: &PoolGeom) -> Result<(usize, usize), PlanError> {
        let oh = self.window(g.h, g.kh, g.stride_h, g.padding)?;
        let ow = self.window(g.w, g.kw, g.stride_w, g.padding)?;
        Ok((self.prod(&[g.n, g.h, g.w, g.c], "n*h*w*c")?, self.prod(&[g.n, oh, ow, g.c], "n*out_h*out_w*c")?))
    }

    /// Output size along one axis (TF's rules, as `towers_kernels::window`), checked.
    fn window(&self, input: usize, k: usize, stride: usize, padding: Padding) -> Result<usize, PlanError> {
        self.param(k >= 1 && stride >= 1, || format!("window {k} with stride {stride}: both must be at least 1"))?;
        let out = match padding {
            Padding::Same => input.div_ceil(stride),
            Padding::Valid if input < k => 0,
            Padding::Valid => (input - k + 1).div_ceil(stride),
        };
        // The kernels' padding arithmetic: (out - 1) * stride + k.
        self.count(out.saturating_sub(1).checked_mul(stride).and_then(|v| v.checked_add(k)), "the window's extent")?;
        Ok(out)
    }
}

struct ConvLens {
    x: usize,
    filter: usize,
    y: usize,
}

/// NumPy broadcasting of two shapes, or None when they do not broadcast.
fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| if i < rank - s.len() { 1 } else { s[i - (rank - s.len())] };
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}
