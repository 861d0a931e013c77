//! TF ops a port reaches for that are compositions of ops the builder
//! already has: `tf.squared_difference`, `tf.argmin`,
//! `tf.reduce_logsumexp`, `tf.split` by a number of parts, and softmax over
//! any axis. Each is built under a name scope of TF's op name, so the dot
//! and the placement report show one group; its gradient is the gradient
//! of the composition (autodiff sees only existing ops), and its kernels
//! are those of the parts (both backends have them).
//!
//! Invariants: the compositions compute what TF's ops compute on every
//! input, the edge cases included (ties, infinities, NaN), as each doc
//! comment states; an argument TF refuses is refused here at build time,
//! naming the node, in TF's words.

use crate::axis::{axis_error, AxisIndex};
use crate::builder::GraphBuilder;
use crate::error::{GraphError, Result};
use crate::tensor::Tensor;

impl GraphBuilder {
    /// TF's `tf.squared_difference(a, b)`: `(a - b)^2` elementwise, with
    /// `sub`'s broadcasting.
    pub fn squared_difference(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.name_scope("SquaredDifference", |b_| {
            let d = b_.sub(a, b)?;
            b_.square(d)
        })
    }

    /// TF's `tf.argmin(x, axis)` (i32): the index of the smallest element
    /// along `axis`, the first one among ties, as `argmax` of `-x`
    /// (negation is exact, so ties stay ties). `axis` may be negative.
    pub fn argmin(&mut self, x: Tensor, axis: impl AxisIndex) -> Result<Tensor> {
        let axis = self.axis_of("ArgMin", "ArgMin", x, axis)?;
        self.name_scope("ArgMin", |b| {
            let n = b.neg(x)?;
            b.argmax(n, axis)
        })
    }

    /// TF's `tf.reduce_logsumexp(x, axes, keep_dims)`: `log(sum(exp(x)))`
    /// over `axes`, computed as TF does, stably: with `m` the maximum over
    /// the axes (0 where it is not finite, so a row of `-inf` gives `-inf`
    /// and not NaN, as TF's `is_finite` guard), `log(sum(exp(x - m))) + m`,
    /// `m` through `stop_gradient` (the result does not depend on it). The
    /// gradient is then softmax's: `dy * exp(x - result)`.
    pub fn reduce_logsumexp<A: AxisIndex>(&mut self, x: Tensor, axes: &[A], keep_dims: bool) -> Result<Tensor> {
        let axes = self.axes_of("ReduceLogSumExp", "ReduceLogSumExp", x, axes)?;
        self.name_scope("ReduceLogSumExp", |b| {
            let raw_max = b.reduce_max(x, &axes, true)?;
            // m - m is 0 exactly when m is finite (inf - inf and NaN are NaN).
            let diff = b.sub(raw_max, raw_max)?;
            let zero = b.zeros_like(raw_max)?;
            let finite = b.equal(diff, zero)?;
            let guarded = b.where_(finite, raw_max, zero)?;
            let m = b.stop_gradient(guarded)?;
            let shifted = b.sub(x, m)?;
            let e = b.exp(shifted)?;
            let s = b.reduce_sum(e, &axes, keep_dims)?;
            let l = b.log(s)?;
            // m reduced as the result is (max over its size-1 axes: itself).
            let m_out = if keep_dims { m } else { b.reduce_max(m, &axes, false)? };
            b.add(l, m_out)
        })
    }

    /// TF's `tf.split(x, num, axis)` with a number of parts: `num` equal
    /// parts along `axis` (may be negative), which must be known and
    /// divisible by `num`, as TF requires.
    pub fn split_n(&mut self, x: Tensor, num: usize, axis: impl AxisIndex) -> Result<Vec<Tensor>> {
        let axis = self.axis_of("split", "Split", x, axis)?;
        let dim = self.graph.tensor_type(x)?.shape.dim(axis);
        let bad = |b: &Self, detail: String| {
            axis_error(Self::join(&b.name_scope, "split"), b.name_scope.clone(), "Split", detail)
        };
        let size = match dim {
            _ if num == 0 => return Err(bad(self, "num_split must be at least 1".into())),
            Some(d) if d % num == 0 => d / num,
            Some(d) => {
                return Err(bad(
                    self,
                    format!(
                        "Number of ways to split should evenly divide the split dimension, but got split_dim {axis} (size = {d}) and num_split {num}"
                    ),
                ))
            }
            None => {
                return Err(bad(
                    self,
                    format!(
                        "the split dimension {axis} is unknown (the batch?): split along a known dimension, or give the sizes"
                    ),
                ))
            }
        };
        self.split(x, axis, &vec![size; num])
    }

    /// TF's `tf.split(x, sizes, axis)` with at most one size `-1`: that
    /// part takes what the others leave (the dimension must then be known).
    pub fn split_sizes(&mut self, x: Tensor, sizes: &[i64], axis: impl AxisIndex) -> Result<Vec<Tensor>> {
        let axis = self.axis_of("split", "SplitV", x, axis)?;
        let (node, scope) = (Self::join(&self.name_scope, "split"), self.name_scope.clone());
        let bad = |detail: String| -> GraphError { axis_error(node.clone(), scope.clone(), "SplitV", detail) };
        let unknown = sizes.iter().filter(|&&s| s == -1).count();
        if unknown > 1 || sizes.iter().any(|&s| s < -1) {
            return Err(bad(format!("sizes {sizes:?}: at most one size may be -1 (the rest), and none below it")));
        }
        let known: i64 = sizes.iter().filter(|&&s| s >= 0).sum();
        let fixed: Vec<usize> = if unknown == 0 {
            sizes.iter().map(|&s| s as usize).collect()
        } else {
            let Some(d) = self.graph.tensor_type(x)?.shape.dim(axis) else {
                return Err(bad(format!(
                    "a size of -1 needs the split dimension {axis} known, and it is not (the batch?)"
                )));
            };
            if known > d as i64 {
                return Err(bad(format!(
                    "the sizes {sizes:?} take {known} of the split dimension {axis}, which has {d}"
                )));
            }
            sizes.iter().map(|&s| if s == -1 { (d as i64 - known) as usize } else { s as usize }).collect()
        };
        self.split(x, axis, &fixed)
    }

    /// GELU as BERT's TF1 `modeling.py` writes it (and TF's
    /// `tf.nn.gelu(x, approximate=True)`): `0.5·x·(1 + tanh(√(2/π)·(x +
    /// 0.044715·x³)))`, composed in a `Gelu` scope; gradient by autodiff.
    pub fn gelu_tanh(&mut self, x: Tensor) -> Result<Tensor> {
        self.name_scope("Gelu", |b| {
            let x2 = b.square(x)?;
            let x3 = b.mul(x2, x)?;
            let c = b.scalar(0.044715)?;
            let cx3 = b.mul(x3, c)?;
            let inner = b.add(x, cx3)?;
            let k = b.scalar((2.0f64 / std::f64::consts::PI).sqrt() as f32)?;
            let scaled = b.mul(inner, k)?;
            let t = b.tanh(scaled)?;
            let one = b.scalar(1.0)?;
            let onep = b.add(t, one)?;
            let half = b.scalar(0.5)?;
            let hx = b.mul(x, half)?;
            b.mul(hx, onep)
        })
    }

    /// TF's `tf.nn.softmax(x, axis)`: over any axis (may be negative); the
    /// last is [`GraphBuilder::softmax`] itself, another is moved last,
    /// normalized and moved back (the shape must have a known rank).
    pub fn softmax_axis(&mut self, x: Tensor, axis: impl AxisIndex) -> Result<Tensor> {
        self.over_axis("Softmax", x, axis, |b, t| b.softmax(t))
    }

    /// TF's `tf.nn.log_softmax(x, axis)`, as [`GraphBuilder::softmax_axis`].
    pub fn log_softmax_axis(&mut self, x: Tensor, axis: impl AxisIndex) -> Result<Tensor> {
        self.over_axis("LogSoftmax", x, axis, |b, t| b.log_softmax(t))
    }

    /// `f` over the last axis, applied to `axis` by two transposes.
    fn over_axis(
        &mut self,
        name: &str,
        x: Tensor,
        axis: impl AxisIndex,
        f: impl FnOnce(&mut GraphBuilder, Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let axis = self.axis_of(name, name, x, axis)?;
        let rank = self.graph.tensor_type(x)?.shape.rank();
        if axis + 1 == rank {
            return f(self, x);
        }
        // Move `axis` last; the inverse permutation puts it back.
        let mut perm: Vec<usize> = (0..rank).filter(|&i| i != axis).collect();
        perm.push(axis);
        let mut inverse = vec![0; rank];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i;
        }
        self.name_scope(name, |b| {
            let t = b.transpose(x, &perm)?;
            let y = f(b, t)?;
            b.transpose(y, &inverse)
        })
    }
}
