//! The builder's math ops of issue 22 (`tf.maximum`, `tf.minimum`,
//! `tf.square`, `tf.pow`, `tf.nn.leaky_relu`, `tf.nn.relu6`,
//! `tf.nn.softplus`), each named as TF names it.
//!
//! Invariants: every method adds only ops of the kernels' tables
//! (`Op::Binary`, `Op::Unary`), so shape inference (broadcasting as every
//! binary op), gradients, fusion and both backends need nothing of their
//! own here. Two are compositions, as TF1 built them or as their gradient
//! asks:
//! - `square(x)` is `Mul(x, x)` named `Square` (a unary table op must have
//!   its gradient from its output, and `x²` loses x's sign); its gradient
//!   `dy·x + x·dy = 2·x·dy` is bit for bit TF's `dy·(2·x)` (doubling is exact);
//! - `leaky_relu(x, alpha)` is `maximum(alpha·x, x)` in a `LeakyRelu` scope,
//!   exactly TF 1.4–1.12's `tf.nn.leaky_relu`, and `minimum(alpha·x, x)`
//!   for `alpha > 1`, so every alpha gives the `LeakyRelu` op's value
//!   (`x > 0 ? x : alpha·x`, TF ≥ 1.13) and its gradient (`alpha·dy` at 0);
//! - `local_response_normalization` is TF's `LRN` written out from ops that
//!   have gradients and CUDA twins (square, pad, slices, `AddN`, `Pow`,
//!   `Div`); see its docs.

use crate::axis::AxisIndex;
use crate::builder::GraphBuilder;
use crate::error::GraphError;
use crate::graph::Tensor;
use crate::op::{BinaryOp, Op, UnaryOp};
use crate::types::DType;

type Result<T> = std::result::Result<T, GraphError>;

impl GraphBuilder {
    /// Any broadcasting binary op, named by its TF type name (`Maximum`, `Pow`, ...).
    pub fn binary(&mut self, op: BinaryOp, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.op1(op.tf_name(), Op::Binary(op), &[a, b])
    }

    /// `max(a, b)` elementwise with broadcasting (TF's `tf.maximum`). The
    /// gradient goes to `a` where `a >= b`, else to `b`, as TF's `_MaximumGrad`.
    pub fn maximum(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Maximum, a, b)
    }

    /// `min(a, b)` elementwise with broadcasting (TF's `tf.minimum`). The
    /// gradient goes to `a` where `a <= b`, else to `b`, as TF's `_MinimumGrad`.
    pub fn minimum(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Minimum, a, b)
    }

    /// `x ^ y` elementwise with broadcasting (TF's `tf.pow`). Gradients as
    /// TF's `_PowGrad`: `dx = dy·y·x^(y-1)`, `dy = dz·z·log(x)` where `x > 0`, else 0.
    pub fn pow(&mut self, x: Tensor, y: Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Pow, x, y)
    }

    /// `e^x` (TF's `tf.exp`); `dx = dy·y`.
    pub fn exp(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Exp, x)
    }
    /// `ln x` (TF's `tf.log`); `dx = dy / x`.
    pub fn log(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Log, x)
    }
    /// `√x` (TF's `tf.sqrt`); `dx = dy / (2y)`.
    pub fn sqrt(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt, x)
    }
    /// `1/√x` (TF's `tf.rsqrt`); `dx = -dy·y³/2`.
    pub fn rsqrt(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Rsqrt, x)
    }
    /// `1/x` (TF's `tf.reciprocal`); `dx = -dy·y²`.
    pub fn reciprocal(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Reciprocal, x)
    }

    /// `x` clipped to `[lo, hi]` (TF's `tf.clip_by_value`): `minimum(maximum(x,
    /// lo), hi)` in a `clip_by_value` name scope; the gradient passes where
    /// `lo <= x <= hi`. `lo > hi` or a NaN bound is an error naming the node.
    pub fn clip_by_value(&mut self, x: Tensor, lo: f32, hi: f32) -> Result<Tensor> {
        if lo.is_nan() || hi.is_nan() || lo > hi {
            return Err(GraphError::LayerOption {
                layer: Self::join(&self.name_scope, "clip_by_value"),
                option: "clip_value_min/clip_value_max".into(),
                detail: format!("must satisfy min <= max, got [{lo}, {hi}]"),
            });
        }
        self.name_scope("clip_by_value", |b| {
            let lo = b.scalar(lo)?;
            let hi = b.scalar(hi)?;
            let up = b.op1("Maximum", Op::Binary(BinaryOp::Maximum), &[x, lo])?;
            b.op1("Minimum", Op::Binary(BinaryOp::Minimum), &[up, hi])
        })
    }

    /// A tensor of `x`'s shape (and an unknown batch's rows) filled with
    /// `value`, reading nothing of `x` but its shape: no gradient flows to
    /// `x` (TF's `tf.zeros_like`/`tf.ones_like`/`tf.fill`).
    pub fn fill_like(&mut self, x: Tensor, value: f32) -> Result<Tensor> {
        self.name_scope("fill_like", |b| {
            let v = b.scalar(value)?;
            let shape_only = b.op1("StopGradient", Op::StopGradient, &[x])?;
            b.op1("BroadcastLike", Op::BroadcastLike, &[v, shape_only])
        })
    }
    /// `fill_like(x, 0)` (TF's `tf.zeros_like`).
    pub fn zeros_like(&mut self, x: Tensor) -> Result<Tensor> {
        self.fill_like(x, 0.0)
    }
    /// `fill_like(x, 1)` (TF's `tf.ones_like`).
    pub fn ones_like(&mut self, x: Tensor) -> Result<Tensor> {
        self.fill_like(x, 1.0)
    }

    /// `x / sqrt(max(sum(x², axis), epsilon))` (TF's `tf.nn.l2_normalize`,
    /// epsilon 1e-12), in an `l2_normalize` name scope; `axis` may be negative.
    pub fn l2_normalize(&mut self, x: Tensor, axis: impl AxisIndex) -> Result<Tensor> {
        self.name_scope("l2_normalize", |b| {
            let sq = b.square(x)?;
            let sum = b.reduce_sum(sq, &[axis], true)?;
            let eps = b.scalar(1e-12)?;
            let m = b.maximum(sum, eps)?;
            let inv = b.rsqrt(m)?;
            b.mul(x, inv)
        })
    }

    /// The mean and variance of `x` over `axes` (TF's `tf.nn.moments`): the
    /// variance is the mean of `(x - stop_gradient(mean))²`, as TF's, in a
    /// `moments` name scope; `axes` may be negative.
    pub fn moments<A: AxisIndex>(&mut self, x: Tensor, axes: &[A], keep_dims: bool) -> Result<(Tensor, Tensor)> {
        let axes = &self.axes_of("moments", "Mean", x, axes)?[..];
        self.name_scope("moments", |b| {
            let mean = b.reduce_mean(x, axes, true)?;
            let fixed = b.stop_gradient(mean)?;
            let d = b.sub(x, fixed)?;
            let sq = b.square(d)?;
            let variance = b.reduce_mean(sq, axes, keep_dims)?;
            let mean = if keep_dims {
                mean
            } else {
                let squeezed: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
                b.squeeze(mean, &squeezed)?
            };
            Ok((mean, variance))
        })
    }

    /// `x²` (TF's `tf.square`), as `Mul(x, x)` named `Square`.
    ///
    /// ```
    /// # use towers_graph::{GraphBuilder, DType};
    /// let mut b = GraphBuilder::new();
    /// let x = b.placeholder("x", DType::F32, [2, 3]).unwrap();
    /// let y = b.square(x).unwrap();
    /// assert_eq!(b.graph().node(y.node).name, "Square");
    /// ```
    pub fn square(&mut self, x: Tensor) -> Result<Tensor> {
        self.op1("Square", Op::Binary(BinaryOp::Mul), &[x, x])
    }

    /// `x` where `x > 0`, else `alpha·x` (TF's `tf.nn.leaky_relu`; TF's
    /// default alpha is 0.2, see [`GraphBuilder::leaky_relu_default`]).
    /// Built as `maximum(alpha·x, x)` (`minimum` for `alpha > 1`) in a
    /// `LeakyRelu` name scope; see the module docs.
    pub fn leaky_relu(&mut self, x: Tensor, alpha: f32) -> Result<Tensor> {
        // A NaN or infinite slope would make every negative input NaN or
        // infinite (as clip_by_value and dropout refuse such parameters).
        if !alpha.is_finite() {
            return Err(GraphError::LayerOption {
                layer: Self::join(&self.name_scope, "LeakyRelu"),
                option: "alpha".into(),
                detail: format!("must be finite, got {alpha}"),
            });
        }
        self.name_scope("LeakyRelu", |b| {
            let a = b.constant("alpha", DType::F32, &[], &[alpha])?;
            let ax = b.op1("mul", Op::Binary(BinaryOp::Mul), &[a, x])?;
            let op = if alpha > 1.0 { BinaryOp::Minimum } else { BinaryOp::Maximum };
            b.binary(op, ax, x)
        })
    }

    /// [`GraphBuilder::leaky_relu`] with TF's default `alpha = 0.2`.
    pub fn leaky_relu_default(&mut self, x: Tensor) -> Result<Tensor> {
        self.leaky_relu(x, 0.2)
    }

    /// `|x|` (TF's `tf.abs`), f32. Gradient `dy * sign(x)`, 0 at 0, as TF
    /// (autodiff's `BinaryOp::AbsGrad` from x: the unary table's gradients
    /// see only y).
    pub fn abs(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Abs, x)
    }

    /// `min(max(x, 0), 6)` (TF's `tf.nn.relu6`); gradient 0 at both kinks, as TF.
    pub fn relu6(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Relu6, x)
    }

    /// `log(1 + exp(x))` (TF's `tf.nn.softplus`), stable on both tails.
    pub fn softplus(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Softplus, x)
    }

    /// `floor(x)` (TF's `tf.floor`); zero gradient.
    pub fn floor(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Floor, x)
    }

    /// `ceil(x)` (TF's `tf.ceil`); zero gradient.
    pub fn ceil(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Ceil, x)
    }

    /// The nearest integer, halves to even (TF's `tf.round`); zero gradient.
    pub fn round(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Round, x)
    }

    /// `-1`, `0` or `1` (TF's `tf.sign`); zero gradient.
    pub fn sign(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Sign, x)
    }

    /// `log(1 + x)`, accurate near 0 (TF's `tf.log1p`).
    pub fn log1p(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Log1p, x)
    }

    /// `exp(x) - 1`, accurate near 0 (TF's `tf.expm1`).
    pub fn expm1(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Expm1, x)
    }

    /// TF's `tf.nn.sigmoid_cross_entropy_with_logits(labels=z, logits=x)`:
    /// the per-element loss `softplus(x) - x·z` of an independent sigmoid
    /// per element (multi-label), shaped as `logits`; `labels` are f32 in
    /// [0, 1] of the same shape. TF writes `max(x, 0) - x·z + log(1 +
    /// exp(-|x|))`, the same value, since softplus is computed that way:
    /// stable for any |x|. The gradient is `sigmoid(x) - z`.
    pub fn sigmoid_cross_entropy_with_logits(&mut self, logits: Tensor, labels: Tensor) -> Result<Tensor> {
        let (xs, zs) =
            (self.graph().tensor_type(logits)?.shape.clone(), self.graph().tensor_type(labels)?.shape.clone());
        if xs.rank() != zs.rank() || !xs.compatible(&zs) {
            let scope = self.current_name_scope().to_string();
            let node = if scope.is_empty() { "logistic_loss".to_string() } else { format!("{scope}/logistic_loss") };
            return Err(GraphError::Shape {
                node,
                scope,
                op: "SigmoidCrossEntropyWithLogits".into(),
                detail: format!("logits {xs} and labels {zs} must have the same shape"),
            });
        }
        self.name_scope("logistic_loss", |b| {
            let sp = b.softplus(logits)?;
            let xz = b.mul(logits, labels)?;
            b.sub(sp, xz)
        })
    }

    /// Local response normalization across channels (TF's
    /// `tf.nn.local_response_normalization`, alias `tf.nn.lrn`; TF's
    /// defaults are `depth_radius = 5, bias = 1, alpha = 1, beta = 0.5`) of an
    /// NHWC tensor with a known channel count:
    ///
    /// `sqr_sum[n,h,w,c] = Σ x[n,h,w,c']²` over `|c' - c| <= depth_radius`
    /// (within `[0, C)`), `y = x / (bias + alpha·sqr_sum)^beta`.
    ///
    /// Built in an `LRN` name scope from ops with gradients and CUDA twins:
    /// `x²` padded by `depth_radius` zero channels on each side, the
    /// `2·depth_radius + 1` shifted channel windows summed by one `AddN`
    /// (in window order, so the sum's rounding is the same on every path),
    /// then `Pow` and `Div`. The gradient is autodiff's of those ops, the
    /// same function as TF's fused `LRNGrad` up to rounding. Errors: a
    /// rank other than 4 (TF's "input must be 4-dimensional"), an unknown
    /// channel count, a non-finite parameter.
    #[doc(alias = "lrn")]
    pub fn local_response_normalization(
        &mut self,
        x: Tensor,
        depth_radius: usize,
        bias: f32,
        alpha: f32,
        beta: f32,
    ) -> Result<Tensor> {
        let shape = self.graph().tensor_type(x)?.shape.clone();
        let scope = self.current_name_scope().to_string();
        let node = if scope.is_empty() { "LRN".to_string() } else { format!("{scope}/LRN") };
        let err =
            |detail: String| GraphError::Shape { node: node.clone(), scope: scope.clone(), op: "LRN".into(), detail };
        if shape.rank() != 4 {
            return Err(err(format!("input must be 4-dimensional, got shape {shape}")));
        }
        let Some(c) = shape.dim(3) else {
            return Err(err("needs a known channel count (the last dimension)".into()));
        };
        if ![bias, alpha, beta].iter().all(|v| v.is_finite()) {
            return Err(err(format!("bias, alpha and beta must be finite, got {bias}, {alpha}, {beta}")));
        }
        self.name_scope("LRN", |b| {
            let sq = b.square(x)?;
            let r = depth_radius as i64;
            let padded = b.pad(sq, &[[0, 0], [0, 0], [0, 0], [r, r]], 0.0)?;
            let windows = (0..=2 * depth_radius)
                .map(|k| b.slice(padded, &[0, 0, 0, k], &[-1, -1, -1, c as i64]))
                .collect::<Result<Vec<_>>>()?;
            let sum = if windows.len() == 1 { windows[0] } else { b.add_n(&windows)? };
            let alpha = b.constant("alpha", DType::F32, &[], &[alpha])?;
            let bias = b.constant("bias", DType::F32, &[], &[bias])?;
            let beta = b.constant("beta", DType::F32, &[], &[beta])?;
            let scaled = b.mul(alpha, sum)?;
            let base = b.add(bias, scaled)?;
            let denom = b.pow(base, beta)?;
            b.div(x, denom)
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, GraphBuilder, Op};

    #[test]
    fn ops_are_named_as_tf_names_them() {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, [2, 3]).unwrap();
        let row = b.placeholder("row", DType::F32, [3]).unwrap();
        let names: Vec<(String, &str)> = [
            b.maximum(x, row).unwrap(),
            b.minimum(x, row).unwrap(),
            b.pow(x, row).unwrap(),
            b.square(x).unwrap(),
            b.relu6(x).unwrap(),
            b.softplus(x).unwrap(),
            b.leaky_relu_default(x).unwrap(),
        ]
        .iter()
        .map(|t| {
            let n = b.graph().node(t.node);
            (n.name.clone(), n.op.type_name())
        })
        .collect();
        let want = [
            ("Maximum", "Maximum"),
            ("Minimum", "Minimum"),
            ("Pow", "Pow"),
            ("Square", "Mul"),
            ("Relu6", "Relu6"),
            ("Softplus", "Softplus"),
            ("LeakyRelu/Maximum", "Maximum"),
        ];
        for ((n, t), (wn, wt)) in names.iter().zip(want) {
            assert_eq!((n.as_str(), *t), (wn, wt));
        }
        // Broadcast shapes, as every binary op.
        let m = b.graph().get("Maximum").unwrap();
        assert_eq!(b.graph().tensor_type(crate::Tensor::new(m, 0)).unwrap().shape.to_string(), "[2,3]");
    }

    /// Shapes that do not broadcast are the binary ops' error, naming the node.
    #[test]
    fn incompatible_shapes_are_an_error_naming_the_node() {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, [2, 3]).unwrap();
        let y = b.placeholder("y", DType::F32, [4]).unwrap();
        let e = b.pow(x, y).unwrap_err().to_string();
        assert!(e.contains("Pow") && e.contains("cannot be broadcast"), "{e}");
    }

    /// `sigmoid_cross_entropy_with_logits`: TF's value on both tails and
    /// at 0, and a shape mismatch named.
    #[test]
    fn sigmoid_cross_entropy_is_tfs_and_checks_shapes() {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, [None, Some(3)]).unwrap();
        let z = b.placeholder("z", DType::F32, [None, Some(3)]).unwrap();
        let l = b.sigmoid_cross_entropy_with_logits(x, z).unwrap();
        assert_eq!(b.graph().node(l.node).name, "logistic_loss/sub");
        assert_eq!(b.graph().tensor_type(l).unwrap().shape.to_string(), "[?,3]");
        let bad = b.placeholder("bad", DType::F32, [None, Some(4)]).unwrap();
        let e = b.sigmoid_cross_entropy_with_logits(x, bad).unwrap_err().to_string();
        assert!(e.contains("must have the same shape"), "{e}");
        // The value: softplus(x) - x z, against TF's formula in f64.
        let softplus = crate::UnaryOp::Softplus;
        for (x, z) in [(-100.0f32, 1.0f32), (100.0, 0.0), (0.0, 0.5), (2.5, 1.0), (-3.0, 0.0)] {
            let ours = softplus.apply(x) - x * z;
            let (xd, zd) = (x as f64, z as f64);
            let tf = xd.max(0.0) - xd * zd + (-xd.abs()).exp().ln_1p();
            assert!((ours as f64 - tf).abs() <= 1e-6 * tf.abs().max(1.0), "x {x} z {z}: {ours} vs {tf}");
        }
    }

    /// alpha > 1 switches the composition to `minimum`, so the value is
    /// still `x > 0 ? x : alpha·x`.
    #[test]
    fn leaky_relu_above_one_uses_minimum() {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, [2]).unwrap();
        let y = b.leaky_relu(x, 3.0).unwrap();
        assert_eq!(b.graph().node(y.node).op, Op::Binary(crate::BinaryOp::Minimum));
    }
}
