//! The operand table, part 1: the one exhaustive match over [`Kernel`]
//! ([`Kernel::declare`]) with the dense kernels (GEMM, elementwise, bias,
//! convolution, pooling) inline, and the [`Builder`] every arm fills. The
//! other families are in `table_more.rs`.

use std::borrow::Cow;

use super::{DTypeRule, Len, OperandSig, ParamError, Ref, Role, Run, Signature};
use crate::conv::ConvGeom;
use crate::dtype::DType;
use crate::elementwise::FusedExpr;
use crate::pool::PoolGeom;
use crate::window::Padding;
use crate::Kernel;

pub(super) const F32: DTypeRule = DTypeRule::Is(DType::F32);
pub(super) const I32: DTypeRule = DTypeRule::Is(DType::I32);
pub(super) const IN0: Ref = Ref::input(0);

/// A signature under construction.
pub(crate) struct Builder {
    kernel: &'static str,
    inputs: Vec<Run>,
    outputs: Vec<Run>,
    workspace: Option<OperandSig>,
    params: Vec<(&'static str, String)>,
}

/// One operand.
pub(super) fn op(
    name: &'static str,
    role: Role,
    dtype: DTypeRule,
    len: Len,
    why: impl Into<Cow<'static, str>>,
) -> OperandSig {
    OperandSig { name, index: None, role, dtype, len, why: why.into() }
}

impl Builder {
    pub(super) fn new(kernel: &'static str) -> Builder {
        Builder { kernel, inputs: Vec::new(), outputs: Vec::new(), workspace: None, params: Vec::new() }
    }

    /// An input read once.
    pub(super) fn input(&mut self, name: &'static str, dtype: DTypeRule, len: Len, why: impl Into<Cow<'static, str>>) {
        self.inputs.push(Run { ops: vec![op(name, Role::Read, dtype, len, why)], times: 1 });
    }

    /// An output written once.
    pub(super) fn output(&mut self, name: &'static str, dtype: DTypeRule, len: Len, why: impl Into<Cow<'static, str>>) {
        self.outputs.push(Run { ops: vec![op(name, Role::Write, dtype, len, why)], times: 1 });
    }

    /// An output read and written in place.
    pub(super) fn update(&mut self, name: &'static str, dtype: DTypeRule, len: Len, why: impl Into<Cow<'static, str>>) {
        self.outputs.push(Run { ops: vec![op(name, Role::Update, dtype, len, why)], times: 1 });
    }

    /// A block of inputs repeated `times` times.
    pub(super) fn inputs(&mut self, ops: Vec<OperandSig>, times: usize) {
        self.inputs.push(Run { ops, times });
    }

    /// A block of outputs repeated `times` times.
    pub(super) fn outputs(&mut self, ops: Vec<OperandSig>, times: usize) {
        self.outputs.push(Run { ops, times });
    }

    /// The f32 workspace of `n` elements (none when 0).
    pub(super) fn workspace(&mut self, n: usize) {
        if n > 0 {
            self.workspace = Some(op("workspace", Role::Workspace, F32, Len::Exact(n), "the geometry's workspace_len"));
        }
    }

    /// A scalar parameter, for display.
    pub(super) fn param(&mut self, name: &'static str, value: impl ToString) {
        self.params.push((name, value.to_string()));
    }

    pub(super) fn finish(self) -> Result<Signature, ParamError> {
        let total = |runs: &[Run], what: &str| {
            runs.iter()
                .try_fold(0usize, |a, r| r.ops.len().checked_mul(r.times).and_then(|n| a.checked_add(n)))
                .ok_or_else(|| ParamError { reason: format!("the number of {what} overflows") })
        };
        let (n_in, n_out) = (total(&self.inputs, "inputs")?, total(&self.outputs, "outputs")?);
        Ok(Signature {
            kernel: self.kernel,
            inputs: self.inputs,
            outputs: self.outputs,
            workspace: self.workspace,
            params: self.params,
            n_in,
            n_out,
        })
    }
}

/// `Err(reason)` unless `ok`.
pub(super) fn ensure(ok: bool, reason: impl FnOnce() -> String) -> Result<(), ParamError> {
    if ok {
        Ok(())
    } else {
        Err(ParamError { reason: reason() })
    }
}

/// A count computed from the parameters, or an error naming it when it overflows.
pub(super) fn count(v: Option<usize>, what: &str) -> Result<usize, ParamError> {
    v.ok_or_else(|| ParamError { reason: format!("{what} overflows") })
}

pub(super) fn prod(d: &[usize], what: &str) -> Result<usize, ParamError> {
    count(d.iter().try_fold(1usize, |a, &x| a.checked_mul(x)), what)
}

/// `[2,3]`.
pub fn dims(d: &[usize]) -> String {
    let v: Vec<String> = d.iter().map(|x| x.to_string()).collect();
    format!("[{}]", v.join(","))
}

/// NumPy broadcasting of two shapes, or None when they do not broadcast.
pub(super) fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
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

/// A positive per-row count (classes, channels).
pub(super) fn positive(n: usize, what: &str) -> Result<(), ParamError> {
    ensure(n >= 1, || format!("{what} is 0"))
}

/// `m*k = 2*4` with its product.
fn mn(a: usize, b: usize, an: &str, bn: &str, pre: &str) -> Result<(usize, String), ParamError> {
    Ok((count(a.checked_mul(b), &format!("{an}*{bn}"))?, format!("{pre}{an}*{bn} = {a}*{b}")))
}

impl Kernel {
    /// Declare this kernel's operands and parameters into `b`.
    pub(super) fn declare(&self, b: &mut Builder) -> Result<(), ParamError> {
        match self {
            Kernel::MatMul { m, n, k, trans_a, trans_b } => {
                gemm_params(b, *m, *n, *trans_a, *trans_b);
                b.param("k", k);
                let ((mk, w1), (kn, w2), (mn_, w3)) =
                    (mn(*m, *k, "m", "k", "")?, mn(*k, *n, "k", "n", "")?, mn(*m, *n, "m", "n", "")?);
                b.input("a", F32, Len::Exact(mk), w1);
                b.input("b", F32, Len::Exact(kn), w2);
                b.output("c", F32, Len::Exact(mn_), w3);
            }
            Kernel::TowerMatMul { m, n, ks, trans_a, trans_b, weights } => {
                tower_pairs(b, *m, *n, ks, weights, *trans_a, *trans_b)?;
                let (len, why) = mn(*m, *n, "m", "n", "")?;
                b.output("c", F32, Len::Exact(len), why);
            }
            Kernel::TowerMatMulApply { m, n, ks, trans_a, trans_b, weights, apply } => {
                tower_pairs(b, *m, *n, ks, weights, *trans_a, *trans_b)?;
                let slots = match **apply {
                    Kernel::ApplyGradientDescent {} => &["var"][..],
                    Kernel::ApplyMomentum { momentum, nesterov: false } => {
                        b.param("momentum", momentum);
                        &["var", "accum"][..]
                    }
                    _ => {
                        return Err(ParamError {
                            reason: format!(
                                "{} cannot take a tower product (plain SGD or non-Nesterov momentum only)",
                                apply.name()
                            ),
                        })
                    }
                };
                b.param("apply", apply.name());
                b.input("lr", F32, Len::Exact(1), "a scalar learning rate");
                let (len, why) = mn(*m, *n, "m", "n", "")?;
                for s in slots {
                    b.update(s, F32, Len::Exact(len), why.clone());
                }
            }
            Kernel::MatMulBiasAct { m, n, k, trans_a, trans_b, act } => {
                gemm_params(b, *m, *n, *trans_a, *trans_b);
                b.param("k", k);
                b.param("act", act.map_or("none", |a| a.name()));
                let ((mk, w1), (kn, w2), (mn_, w3)) =
                    (mn(*m, *k, "m", "k", "")?, mn(*k, *n, "k", "n", "")?, mn(*m, *n, "m", "n", "")?);
                b.input("a", F32, Len::Exact(mk), w1);
                b.input("b", F32, Len::Exact(kn), w2);
                b.input("bias", F32, Len::Exact(*n), format!("n = {n} (the bias)"));
                b.output("y", F32, Len::Exact(mn_), w3);
            }
            Kernel::Binary { op, a_shape, b_shape, out_shape } => {
                b.param("op", op.name());
                ensure(broadcast(a_shape, b_shape).as_deref() == Some(out_shape.as_slice()), || {
                    format!("{} and {} do not broadcast to {}", dims(a_shape), dims(b_shape), dims(out_shape))
                })?;
                b.input("a", F32, Len::Exact(prod(a_shape, "a_shape")?), format!("a_shape {}", dims(a_shape)));
                b.input("b", F32, Len::Exact(prod(b_shape, "b_shape")?), format!("b_shape {}", dims(b_shape)));
                let out = prod(out_shape, "out_shape")?;
                b.output("c", F32, Len::Exact(out), format!("out_shape {}", dims(out_shape)));
            }
            Kernel::Fused { expr, in_shapes, out_shape } => fused(b, expr, in_shapes, out_shape)?,
            Kernel::AddN { n } => {
                positive(*n, "n")?;
                b.param("n", n);
                b.inputs(vec![op("x", Role::Read, F32, Len::Like(Ref::output(0)), "")], *n);
                b.output("sum", F32, Len::Any, "");
            }
            Kernel::WeightedSum { weights } => {
                ensure(!weights.is_empty(), || "no weights".into())?;
                b.param("weights", format!("{weights:?}"));
                b.inputs(vec![op("x", Role::Read, F32, Len::Like(Ref::output(0)), "")], weights.len());
                b.output("sum", F32, Len::Any, "");
            }
            Kernel::BiasAdd { channels } | Kernel::BiasAddAct { channels, .. } => {
                positive(*channels, "channels")?;
                b.param("channels", channels);
                if let Kernel::BiasAddAct { act, .. } = self {
                    b.param("act", act.name());
                }
                b.input("x", F32, Len::Multiple(*channels), "channels");
                b.input("bias", F32, Len::Exact(*channels), "channels");
                b.output("y", F32, Len::Like(IN0), "");
            }
            Kernel::UnaryGradBiasGrad { channels, act } => {
                positive(*channels, "channels")?;
                b.param("channels", channels);
                b.param("act", act.name());
                b.input("dy", F32, Len::Multiple(*channels), "channels");
                b.input("y", F32, Len::Like(IN0), "");
                b.output("dx", F32, Len::Like(IN0), "");
                b.output("db", F32, Len::Exact(*channels), "channels");
            }
            Kernel::BiasAddGrad { channels } => {
                positive(*channels, "channels")?;
                b.param("channels", channels);
                b.input("dy", F32, Len::Multiple(*channels), "channels");
                b.output("db", F32, Len::Exact(*channels), "channels");
            }
            Kernel::Unary { op } => {
                b.param("op", op.name());
                b.input("x", F32, Len::Any, "");
                b.output("y", F32, Len::Like(IN0), "");
            }
            Kernel::UnaryGrad { op } => {
                b.param("op", op.name());
                b.input("dy", F32, Len::Any, "");
                b.input("y", F32, Len::Like(IN0), "");
                b.output("dx", F32, Len::Like(IN0), "");
            }
            Kernel::Conv2D { geom, workspace_len } => {
                let c = conv(b, geom, *workspace_len)?;
                b.input("x", F32, Len::Exact(c.x), "n*h*w*c_in");
                b.input("filter", F32, Len::Exact(c.filter), "kh*kw*c_in*c_out");
                b.output("y", F32, Len::Exact(c.y), "n*out_h*out_w*c_out");
            }
            Kernel::Conv2DBiasAct { geom, workspace_len, act, pool } => {
                let c = conv(b, geom, *workspace_len)?;
                b.param("act", act.name());
                b.input("x", F32, Len::Exact(c.x), "n*h*w*c_in");
                b.input("filter", F32, Len::Exact(c.filter), "kh*kw*c_in*c_out");
                b.input("bias", F32, Len::Exact(geom.c_out), "c_out (the bias)");
                b.output("y", F32, Len::Exact(c.y), "n*out_h*out_w*c_out");
                if let Some(pg) = pool {
                    let (px, py) = pool_lens(pg)?;
                    ensure(px == c.y && pg.n == geom.n && pg.c == geom.c_out, || {
                        "the pool's input must be the convolution's output".into()
                    })?;
                    pool_params(b, pg, true);
                    b.output("pooled", F32, Len::Exact(py), "the pool's n*out_h*out_w*c");
                }
            }
            Kernel::Conv2DBackpropInput { geom, workspace_len } => {
                let c = conv(b, geom, *workspace_len)?;
                b.input("dy", F32, Len::Exact(c.y), "n*out_h*out_w*c_out");
                b.input("filter", F32, Len::Exact(c.filter), "kh*kw*c_in*c_out");
                b.output("dx", F32, Len::Exact(c.x), "n*h*w*c_in");
            }
            Kernel::Conv2DBackpropFilter { geom, workspace_len } => {
                let c = conv(b, geom, *workspace_len)?;
                b.input("x", F32, Len::Exact(c.x), "n*h*w*c_in");
                b.input("dy", F32, Len::Exact(c.y), "n*out_h*out_w*c_out");
                b.output("dfilter", F32, Len::Exact(c.filter), "kh*kw*c_in*c_out");
            }
            Kernel::MaxPool { geom } | Kernel::AvgPool { geom } => {
                let (x, y) = pool_lens(geom)?;
                pool_params(b, geom, false);
                b.input("x", F32, Len::Exact(x), "n*h*w*c");
                b.output("y", F32, Len::Exact(y), "n*out_h*out_w*c");
            }
            Kernel::MaxPoolGrad { geom } => {
                let (x, y) = pool_lens(geom)?;
                pool_params(b, geom, false);
                b.input("x", F32, Len::Exact(x), "n*h*w*c");
                b.input("y", F32, Len::Exact(y), "n*out_h*out_w*c");
                b.input("dy", F32, Len::Exact(y), "n*out_h*out_w*c");
                b.output("dx", F32, Len::Exact(x), "n*h*w*c");
            }
            Kernel::MaxPoolGradActBiasGrad { geom, act } => {
                let (x, y) = pool_lens(geom)?;
                pool_params(b, geom, false);
                b.param("act", act.name());
                b.input("x", F32, Len::Exact(x), "n*h*w*c");
                b.input("y", F32, Len::Exact(y), "n*out_h*out_w*c");
                b.input("dy", F32, Len::Exact(y), "n*out_h*out_w*c");
                b.input("act_y", F32, Len::Exact(x), "n*h*w*c");
                b.output("dx", F32, Len::Exact(x), "n*h*w*c");
                b.output("db", F32, Len::Exact(geom.c), "c (the bias gradient)");
            }
            Kernel::AvgPoolGrad { geom } => {
                let (x, y) = pool_lens(geom)?;
                pool_params(b, geom, false);
                b.input("dy", F32, Len::Exact(y), "n*out_h*out_w*c");
                b.output("dx", F32, Len::Exact(x), "n*h*w*c");
            }
            Kernel::Concat { .. }
            | Kernel::Split { .. }
            | Kernel::Slice { .. }
            | Kernel::SliceGrad { .. }
            | Kernel::BroadcastTo { .. }
            | Kernel::SumTo { .. } => super::table_more::layout(self, b)?,
            Kernel::Softmax { .. }
            | Kernel::LogSoftmax { .. }
            | Kernel::SoftmaxGrad { .. }
            | Kernel::LogSoftmaxGrad { .. }
            | Kernel::SparseSoftmaxXentMeanGrad { .. }
            | Kernel::SparseSoftmaxXent { .. }
            | Kernel::SoftmaxXent { .. } => super::table_more::softmax(self, b)?,
            Kernel::L2Loss
            | Kernel::ReduceSum { .. }
            | Kernel::ReduceMean { .. }
            | Kernel::ArgMax { .. }
            | Kernel::Equal { .. }
            | Kernel::Cast { .. }
            | Kernel::Dropout { .. }
            | Kernel::Fill { .. } => super::table_more::reduce(self, b)?,
            Kernel::BatchNormTrain { .. } | Kernel::BatchNormInfer { .. } | Kernel::BatchNormGrad { .. } => {
                super::table_more::batchnorm(self, b)?
            }
            Kernel::AssignMovingAverage { .. }
            | Kernel::ApplyGradientDescent { .. }
            | Kernel::ApplyMomentum { .. }
            | Kernel::ApplyAdam { .. }
            | Kernel::ApplyRmsProp { .. }
            | Kernel::ApplyAdagrad { .. }
            | Kernel::MeanApply { .. }
            | Kernel::MultiApply { .. }
            | Kernel::IncrementStep => super::table_more::optim(self, b)?,
            Kernel::OneHot { .. }
            | Kernel::Transpose { .. }
            | Kernel::Pad { .. }
            | Kernel::Gather { .. }
            | Kernel::GatherGrad { .. }
            | Kernel::Tile { .. }
            | Kernel::TileGrad { .. } => super::table_more::array(self, b)?,
        }
        Ok(())
    }
}

fn gemm_params(b: &mut Builder, m: usize, n: usize, trans_a: bool, trans_b: bool) {
    b.param("m", m);
    b.param("n", n);
    b.param("trans_a", trans_a);
    b.param("trans_b", trans_b);
}

/// A tower product's parameters and operand pairs: `a_p: [m, k_p]`, `b_p: [k_p, n]`.
fn tower_pairs(
    b: &mut Builder,
    m: usize,
    n: usize,
    ks: &[usize],
    weights: &[f32],
    trans_a: bool,
    trans_b: bool,
) -> Result<(), ParamError> {
    ensure(!ks.is_empty() && ks.len() == weights.len(), || {
        format!("{} k's for {} weights (one pair per replica, at least one)", ks.len(), weights.len())
    })?;
    gemm_params(b, m, n, trans_a, trans_b);
    b.param("ks", dims(ks));
    b.param("weights", format!("{weights:?}"));
    for (p, &k) in ks.iter().enumerate() {
        let (mk, w1) = mn(m, k, "m", "k", &format!("pair {p}: "))?;
        let (kn, w2) = mn(k, n, "k", "n", &format!("pair {p}: "))?;
        let pair = [op("a", Role::Read, F32, Len::Exact(mk), w1), op("b", Role::Read, F32, Len::Exact(kn), w2)];
        b.inputs(pair.into_iter().map(|o| OperandSig { index: Some(p), ..o }).collect(), 1);
    }
    Ok(())
}

fn fused(b: &mut Builder, expr: &FusedExpr, in_shapes: &[Vec<usize>], out_shape: &[usize]) -> Result<(), ParamError> {
    // A plan read from JSON carries the expression unchecked.
    let checked = FusedExpr::new(expr.steps().to_vec());
    ensure(checked.as_ref() == Ok(expr), || match &checked {
        Err(e) => e.to_string(),
        Ok(_) => "the expression's input count does not match its steps".into(),
    })?;
    ensure(in_shapes.len() == expr.inputs(), || {
        format!("{} input shapes for an expression of {} inputs", in_shapes.len(), expr.inputs())
    })?;
    let mut out: Option<Vec<usize>> = Some(Vec::new());
    for s in in_shapes {
        out = out.and_then(|o| broadcast(&o, s));
    }
    ensure(out.as_deref() == Some(out_shape), || {
        let ins: Vec<String> = in_shapes.iter().map(|s| dims(s)).collect();
        format!("inputs {} do not broadcast to {}", ins.join(", "), dims(out_shape))
    })?;
    b.param("expr", expr);
    for (i, s) in in_shapes.iter().enumerate() {
        let len = Len::Exact(prod(s, "an input shape")?);
        let x = op("x", Role::Read, F32, len, format!("input shape {}", dims(s)));
        b.inputs(vec![OperandSig { index: Some(i), ..x }], 1);
    }
    let out = prod(out_shape, "out_shape")?;
    b.output("y", F32, Len::Exact(out), format!("out_shape {}", dims(out_shape)));
    Ok(())
}

/// Lengths of a convolution's x, filter and y.
struct ConvLens {
    x: usize,
    filter: usize,
    y: usize,
}

/// A convolution's lengths, its parameters and its workspace, checked
/// against `workspace_len`.
fn conv(b: &mut Builder, g: &ConvGeom, workspace_len: usize) -> Result<ConvLens, ParamError> {
    let oh = window(g.h, g.kh, g.stride_h, g.padding)?;
    let ow = window(g.w, g.kw, g.stride_w, g.padding)?;
    let x = prod(&[g.n, g.h, g.w, g.c_in], "n*h*w*c_in")?;
    let filter = prod(&[g.kh, g.kw, g.c_in, g.c_out], "kh*kw*c_in*c_out")?;
    let y = prod(&[g.n, oh, ow, g.c_out], "n*out_h*out_w*c_out")?;
    prod(&[g.n, oh, ow, g.kh, g.kw, g.c_in.max(1)], "the column matrix")?;
    // Every product above is in range, so the kernel's own arithmetic is too.
    let expected = g.workspace_len();
    ensure(workspace_len == expected, || {
        format!("workspace_len {workspace_len} is not the geometry's workspace of {expected} f32 elements")
    })?;
    for (n, v) in [("n", g.n), ("h", g.h), ("w", g.w), ("c_in", g.c_in), ("kh", g.kh), ("kw", g.kw)] {
        b.param(n, v);
    }
    for (n, v) in [("c_out", g.c_out), ("stride_h", g.stride_h), ("stride_w", g.stride_w)] {
        b.param(n, v);
    }
    b.param("padding", padding(g.padding));
    b.param("workspace_len", workspace_len);
    b.workspace(expected);
    Ok(ConvLens { x, filter, y })
}

fn padding(p: Padding) -> &'static str {
    match p {
        Padding::Same => "same",
        Padding::Valid => "valid",
    }
}

fn pool_params(b: &mut Builder, g: &PoolGeom, fused: bool) {
    const PLAIN: [&str; 9] = ["n", "h", "w", "c", "kh", "kw", "stride_h", "stride_w", "padding"];
    const FUSED: [&str; 9] = [
        "pool_n",
        "pool_h",
        "pool_w",
        "pool_c",
        "pool_kh",
        "pool_kw",
        "pool_stride_h",
        "pool_stride_w",
        "pool_padding",
    ];
    let names = if fused { &FUSED } else { &PLAIN };
    for (n, v) in names.iter().zip([g.n, g.h, g.w, g.c, g.kh, g.kw, g.stride_h, g.stride_w]) {
        b.param(n, v);
    }
    b.param(names[8], padding(g.padding));
}

/// Lengths of a pool's x and y.
fn pool_lens(g: &PoolGeom) -> Result<(usize, usize), ParamError> {
    let oh = window(g.h, g.kh, g.stride_h, g.padding)?;
    let ow = window(g.w, g.kw, g.stride_w, g.padding)?;
    Ok((prod(&[g.n, g.h, g.w, g.c], "n*h*w*c")?, prod(&[g.n, oh, ow, g.c], "n*out_h*out_w*c")?))
}

/// Output size along one axis (TF's rules, as [`crate::window`]), checked.
fn window(input: usize, k: usize, stride: usize, padding: Padding) -> Result<usize, ParamError> {
    ensure(k >= 1 && stride >= 1, || format!("window {k} with stride {stride}: both must be at least 1"))?;
    let out = match padding {
        Padding::Same => input.div_ceil(stride),
        Padding::Valid if input < k => 0,
        Padding::Valid => (input - k + 1).div_ceil(stride),
    };
    // The kernels' padding arithmetic: (out - 1) * stride + k.
    count(out.saturating_sub(1).checked_mul(stride).and_then(|v| v.checked_add(k)), "the window's extent")?;
    Ok(out)
}
