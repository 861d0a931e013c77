//! Shape and dtype inference of the top-k ops (`TopK`, `TopKGrad`,
//! `InTopK`), with TF's error texts (its kernels' `topk_op.cc` and
//! `in_topk_op.h`).
//!
//! Invariants (as [`crate::infer`]): unknown dimensions propagate, so a
//! batch bound later by `reinfer` checks again; a known dimension that
//! breaks a rule is an error naming the shapes. Selection runs along the
//! last axis; values and predictions are f32, indices and targets i32.

use crate::infer::{arity, detail, merge_dim, want_float, InferError, R};
use crate::op::Op;
use crate::types::{DType, Shape, TensorType};

/// The output types of the top-k op `op` applied to inputs of the given types.
pub(crate) fn infer(op: &Op, inputs: &[TensorType]) -> R {
    match op {
        Op::TopK { k } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            want_float(x, "top_k's input")?;
            let Some(&cols) = x.shape.0.last() else {
                return detail(format!("input must be >= 1-D, got shape {}", x.shape));
            };
            if *k == 0 {
                return detail(
                    "k must be at least 1 (top_k with k = 0 returns empty tensors, which towers does not build)"
                        .to_string(),
                );
            }
            if let Some(c) = cols.filter(|c| c < k) {
                return detail(format!("input must have at least k columns. Had {c}, needed {k}"));
            }
            if cols.is_some_and(|c| c > i32::MAX as usize) {
                return detail(format!("input has {} columns; top_k's i32 indices reach 2^31 - 1", x.shape));
            }
            let mut dims = x.shape.0.clone();
            *dims.last_mut().expect("rank >= 1") = Some(*k);
            let shape = Shape(dims);
            Ok(vec![TensorType::new(DType::F32, shape.clone()), TensorType::new(DType::I32, shape)])
        }
        Op::TopKGrad => {
            arity(inputs, 3)?;
            let (x, dv, ix) = (&inputs[0], &inputs[1], &inputs[2]);
            want_float(dv, "top_k's values gradient")?;
            if ix.dtype != DType::I32 {
                return detail(format!("top_k's indices must be i32, got {ix}"));
            }
            let r = x.shape.rank();
            let fits = r >= 1
                && dv.shape.rank() == r
                && ix.shape.rank() == r
                && (0..r).all(|i| merge_dim(dv.shape.0[i], ix.shape.0[i]).is_ok())
                && (0..r - 1).all(|i| merge_dim(x.shape.0[i], dv.shape.0[i]).is_ok());
            if !fits {
                return detail(format!(
                    "the values' gradient {} and indices {} are not top_k's outputs for an input {}",
                    dv.shape, ix.shape, x.shape
                ));
            }
            Ok(vec![TensorType::new(DType::F32, x.shape.clone())])
        }
        Op::InTopK { .. } => {
            arity(inputs, 2)?;
            let (p, t) = (&inputs[0], &inputs[1]);
            if p.shape.rank() != 2 {
                return detail(format!("predictions must be 2-dimensional, got shape {}", p.shape));
            }
            if t.shape.rank() != 1 {
                return detail(format!("targets must be 1-dimensional, got shape {}", t.shape));
            }
            want_float(p, "predictions")?;
            if t.dtype != DType::I32 {
                return detail(format!(
                    "targets must be i32 class ids, got {t}; cast them with tf.cast(targets, tf.int32)"
                ));
            }
            let n = merge_dim(p.shape.0[0], t.shape.0[0]).map_err(|()| {
                InferError::Detail(format!(
                    "First dimension of predictions {} must match length of targets {}",
                    p.shape.0[0].map_or("?".into(), |d| d.to_string()),
                    t.shape.0[0].map_or("?".into(), |d| d.to_string())
                ))
            })?;
            if p.shape.0[1] == Some(0) {
                return detail(format!("predictions {} have no classes", p.shape));
            }
            Ok(vec![TensorType::new(DType::Bool, Shape(vec![n]))])
        }
        _ => detail(format!("{} is not a top-k op", op.type_name())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dtype: DType, dims: &[Option<usize>]) -> TensorType {
        TensorType::new(dtype, Shape(dims.to_vec()))
    }

    fn err(op: Op, ins: &[TensorType]) -> String {
        match infer(&op, ins) {
            Err(InferError::Detail(d)) => d,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn shapes_follow_tf() {
        let x = t(DType::F32, &[None, Some(4), Some(10)]);
        let out = infer(&Op::TopK { k: 3 }, std::slice::from_ref(&x)).unwrap();
        assert_eq!(out, vec![t(DType::F32, &[None, Some(4), Some(3)]), t(DType::I32, &[None, Some(4), Some(3)])]);
        let g = infer(&Op::TopKGrad, &[x.clone(), out[0].clone(), out[1].clone()]).unwrap();
        assert_eq!(g, vec![x]);
        let p = t(DType::F32, &[None, Some(10)]);
        let out = infer(&Op::InTopK { k: 5 }, &[p, t(DType::I32, &[Some(32)])]).unwrap();
        assert_eq!(out, vec![t(DType::Bool, &[Some(32)])]);
        // An unknown last dimension propagates (checked once bound).
        let out = infer(&Op::TopK { k: 3 }, &[t(DType::F32, &[None])]).unwrap();
        assert_eq!(out[0], t(DType::F32, &[Some(3)]));
    }

    #[test]
    fn errors_speak_tf() {
        let x = t(DType::F32, &[Some(2), Some(5)]);
        assert_eq!(
            err(Op::TopK { k: 6 }, std::slice::from_ref(&x)),
            "input must have at least k columns. Had 5, needed 6"
        );
        assert!(err(Op::TopK { k: 0 }, std::slice::from_ref(&x)).starts_with("k must be at least 1"));
        assert_eq!(err(Op::TopK { k: 1 }, &[t(DType::F32, &[])]), "input must be >= 1-D, got shape []");
        assert!(err(Op::TopK { k: 1 }, &[t(DType::I32, &[Some(3)])]).starts_with("top_k's input must be f32"));
        let ids = t(DType::I32, &[Some(2)]);
        assert_eq!(
            err(Op::InTopK { k: 1 }, &[t(DType::F32, &[Some(2)]), ids.clone()]),
            "predictions must be 2-dimensional, got shape [2]"
        );
        assert_eq!(err(Op::InTopK { k: 1 }, &[x.clone(), x.clone()]), "targets must be 1-dimensional, got shape [2,5]");
        let e = err(Op::InTopK { k: 1 }, &[x.clone(), t(DType::I32, &[Some(3)])]);
        assert_eq!(e, "First dimension of predictions 2 must match length of targets 3");
        let e = err(Op::InTopK { k: 1 }, &[x.clone(), t(DType::F32, &[Some(2)])]);
        assert!(e.starts_with("targets must be i32 class ids"), "{e}");
        let e = err(Op::InTopK { k: 1 }, &[t(DType::I32, &[Some(2), Some(5)]), ids]);
        assert!(e.starts_with("predictions must be f32"), "{e}");
    }
}
