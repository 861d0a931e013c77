//! The builder methods of top-k selection, with TF1's names and arguments:
//! `top_k` (`tf.nn.top_k(input, k, sorted=True)`) and `in_top_k`
//! (`tf.nn.in_top_k(predictions, targets, k)`, the precision@k of
//! `cifar10_eval.py`).
//!
//! Invariants: both select along the last axis, so with the examples on
//! axis 0 every row is independent and N towers compute one device's
//! values; the checks TF makes (`k` at most the columns, ranks, dtypes,
//! matching batch sizes) are made where the node is built (shape
//! inference, `crate::infer_topk`), a [`crate::GraphError::Shape`] naming
//! the node in TF's words.

use crate::builder::GraphBuilder;
use crate::error::Result;
use crate::graph::Tensor;
use crate::op::Op;

impl GraphBuilder {
    /// TF `tf.nn.top_k(x, k)` (`sorted=True`): the `k` largest entries of
    /// each row of `x` (`[..., C]`, f32) along the last axis, as
    /// `(values f32 [..., k], indices i32 [..., k])`, sorted descending;
    /// equal values come by lower index first (TF's order), a NaN above
    /// every number. `k` must be in `[1, C]` ("input must have at least k
    /// columns"). The gradient to `x` scatters the values' gradient to the
    /// indices (TF's `_TopKGrad`); the indices have none.
    ///
    /// ```ignore
    /// let (scores, ids) = b.top_k(logits, 5)?; // the 5 best classes per example
    /// ```
    pub fn top_k(&mut self, x: Tensor, k: usize) -> Result<(Tensor, Tensor)> {
        let id = self.op("TopKV2", Op::TopK { k }, &[x])?;
        Ok((self.tensor(id, 0), self.tensor(id, 1)))
    }

    /// TF `tf.nn.in_top_k(predictions, targets, k)`: bool `[N]`, true where
    /// the target class is among the `k` largest predictions of its row
    /// (`predictions` f32 `[N, C]`, `targets` i32 `[N]`). As TF's kernel:
    /// classes tied with the target at the top-k boundary all count as in
    /// (true iff fewer than `k` predictions are strictly larger); a target
    /// outside `[0, C)` or a row holding NaN or ±inf gives false. Not
    /// differentiable (no gradient flows through it, as `argmax`).
    ///
    /// ```ignore
    /// let top1 = b.in_top_k(logits, labels, 1)?; // cifar10_eval.py's top_k_op
    /// let hits = b.cast(top1, DType::F32)?;
    /// let precision = b.reduce_mean_all(hits)?;
    /// ```
    pub fn in_top_k(&mut self, predictions: Tensor, targets: Tensor, k: usize) -> Result<Tensor> {
        self.op1("InTopK", Op::InTopK { k }, &[predictions, targets])
    }
}
