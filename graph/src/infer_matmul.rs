//! Shape inference of the batched matrix product (`Op::BatchMatMul`, TF's
//! `BatchMatMulV2`), with TF's error texts.
//!
//! Invariants:
//! - both operands are f32 of rank >= 2; the last two axes are the matrix
//!   (`[m, k]`, or `[k, m]` with `transpose_a`; `[k, n]`, or `[n, k]` with
//!   `transpose_b`), the axes before them the batch;
//! - the inner dimensions agree (unknown matches anything), else TF's
//!   kernel message "In[0] mismatch In[1] shape: ..." naming both shapes;
//! - the batch dimensions are equal (same rank, dimension by dimension),
//!   or one operand's batch is empty or all ones (it is shared by every
//!   product). The output's batch is the two batches broadcast (NumPy
//!   rules), so `[B,T,D]·[D,E]` is `[B,T,E]` and `[1,1,T,D]·[B,D,E]` is
//!   `[1,B,T,E]`, as TF. What TF would broadcast further (`[B,1,..]` against
//!   `[1,H,..]`, or `[H,B,..]` against `[B,..]`) is refused with the
//!   fix (tile the operand): the kernel walks one stride per operand, and a
//!   mixed broadcast needs one per axis. Batches that cannot broadcast at
//!   all get TF's "must have compatible batch dimensions".
//!
//! [`batch_of`] is the rule `codegen` and `autodiff` read the same
//! decision from: which operand (if any) is shared.

use crate::infer::{arity, broadcast_shapes, detail, merge_dim, want_float, R};
use crate::types::{DType, Shape, TensorType};

/// How the two operands' batches combine (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPlan {
    /// The output's batch dimensions (the broadcast of the two).
    pub batch: Shape,
    /// `a` is one matrix read by every product (no batch, or only ones).
    pub shared_a: bool,
    /// `b` is one matrix read by every product.
    pub shared_b: bool,
}

/// The batch dimensions of `s` (all but the last two; rank >= 2).
fn batch_dims(s: &Shape) -> Shape {
    Shape(s.0[..s.rank().saturating_sub(2)].to_vec())
}

/// Whether every batch dimension is a known 1 (an empty batch included).
fn ones(s: &Shape) -> bool {
    s.0.iter().all(|d| *d == Some(1))
}

/// How the batches of `a` and `b` (full shapes, rank >= 2) combine, or the
/// reason they do not (the text of the inference error).
pub fn batch_of(a: &Shape, b: &Shape) -> Result<BatchPlan, String> {
    let (ba, bb) = (batch_dims(a), batch_dims(b));
    let Some(batch) = broadcast_shapes(&ba, &bb) else {
        return Err(format!(
            "In[0] and In[1] must have compatible batch dimensions: {ba} vs. {bb} (shapes {a} and {b})"
        ));
    };
    let equal = ba.rank() == bb.rank() && ba.0.iter().zip(&bb.0).all(|(x, y)| merge_dim(*x, *y).is_ok());
    let (shared_a, shared_b) = (ones(&ba), ones(&bb));
    // A side of ones is shared even where the batches also merge as equal
    // (`[1,T,D]` against `[?,D,E]`: the `?` becomes the towers' rows).
    if shared_a || shared_b || equal {
        return Ok(BatchPlan { batch, shared_a, shared_b });
    }
    Err(format!(
        "batch dimensions {ba} and {bb} (shapes {a} and {b}) broadcast against each other in more than one way; \
         a batched matmul takes equal batch dimensions, or one operand of rank 2 (or with size-1 batch dimensions) \
         shared by every product: tile the operand to the other's batch dimensions first (tile)"
    ))
}

/// The output type of `BatchMatMul { transpose_a, transpose_b }` on `inputs`.
pub(crate) fn infer(transpose_a: bool, transpose_b: bool, inputs: &[TensorType]) -> R {
    arity(inputs, 2)?;
    let (a, b) = (&inputs[0], &inputs[1]);
    want_float(a, "a")?;
    want_float(b, "b")?;
    let (ra, rb) = (a.shape.rank(), b.shape.rank());
    if ra < 2 || rb < 2 {
        return detail(format!(
            "In[0] and In[1] must have rank >= 2 (a matrix or a batch of matrices), got shapes {} and {}",
            a.shape, b.shape
        ));
    }
    let last2 = |s: &Shape, t: bool| {
        let (r, c) = (s.0[s.rank() - 2], s.0[s.rank() - 1]);
        if t {
            (c, r)
        } else {
            (r, c)
        }
    };
    let (m, ka) = last2(&a.shape, transpose_a);
    let (kb, n) = last2(&b.shape, transpose_b);
    if merge_dim(ka, kb).is_err() {
        let d = |d: Option<usize>| d.map_or("?".to_string(), |d| d.to_string());
        return detail(format!(
            "In[0] mismatch In[1] shape: {} vs. {}: {} {} {transpose_a} {transpose_b} (the inner dimensions of \
             op(a) [.., m, k] and op(b) [.., k, n] must be equal; transpose_a/transpose_b swap the last two axes)",
            d(ka),
            d(kb),
            a.shape,
            b.shape
        ));
    }
    let plan = batch_of(&a.shape, &b.shape).map_err(crate::infer::InferError::Detail)?;
    let mut dims = plan.batch.0;
    dims.extend([m, n]);
    Ok(vec![TensorType::new(DType::F32, Shape(dims))])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[usize]) -> Shape {
        Shape::known(d)
    }

    #[test]
    fn equal_batches_broadcast_operands_and_refusals() {
        let p = batch_of(&s(&[4, 3, 2]), &s(&[4, 2, 5])).unwrap();
        assert_eq!((p.batch, p.shared_a, p.shared_b), (s(&[4]), false, false));
        let p = batch_of(&s(&[4, 3, 2]), &s(&[2, 5])).unwrap();
        assert_eq!((p.batch, p.shared_a, p.shared_b), (s(&[4]), false, true));
        let p = batch_of(&s(&[1, 1, 3, 2]), &s(&[4, 2, 5])).unwrap();
        assert_eq!((p.batch, p.shared_a, p.shared_b), (s(&[1, 4]), true, false));
        let p = batch_of(&s(&[1, 3, 2]), &s(&[1, 2, 5])).unwrap();
        assert_eq!((p.batch, p.shared_a, p.shared_b), (s(&[1]), true, true));
        let p = batch_of(&Shape(vec![None, Some(3), Some(2)]), &s(&[1, 2, 5])).unwrap();
        assert_eq!((p.batch, p.shared_a, p.shared_b), (Shape(vec![None]), false, true));
        let e = batch_of(&s(&[4, 3, 2]), &s(&[5, 2, 5])).unwrap_err();
        assert!(e.contains("must have compatible batch dimensions: [4] vs. [5]"), "{e}");
        let e = batch_of(&s(&[4, 1, 3, 2]), &s(&[1, 6, 2, 5])).unwrap_err();
        assert!(e.contains("tile the operand"), "{e}");
        let e = batch_of(&s(&[6, 4, 3, 2]), &s(&[4, 2, 5])).unwrap_err();
        assert!(e.contains("tile the operand"), "{e}");
    }

    #[test]
    fn unknown_batch_rows_match_known_ones() {
        let a = Shape(vec![None, Some(3), Some(2)]);
        let p = batch_of(&a, &Shape(vec![None, Some(2), Some(5)])).unwrap();
        assert_eq!((p.shared_a, p.shared_b), (false, false));
        let p = batch_of(&a, &s(&[2, 5])).unwrap();
        assert_eq!((p.batch, p.shared_a, p.shared_b), (Shape(vec![None]), false, true));
    }
}
