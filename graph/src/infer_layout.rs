//! Shape inference of the layout ops that move or select elements without
//! computing (`Reshape`, `Concat`, `Split`, `Slice`, `SliceGrad`) and of the
//! broadcast pair autodiff uses (`BroadcastLike`, `SumToLike`).
//!
//! Invariants (as [`crate::infer`]): unknown dimensions propagate; a known
//! dimension that breaks a rule is an error naming the shapes; the output
//! dtype is the input's.

use crate::infer::{arity, broadcast_shapes, detail, known_elements, merge_dim, normalize_axes, InferError, R};
use crate::op::Op;
use crate::types::{Shape, TensorType};

pub(crate) fn infer(op: &Op, inputs: &[TensorType]) -> R {
    use Op::*;
    let same = |t: &TensorType| Ok(vec![t.clone()]);
    match op {
        Reshape { shape } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            let minus = shape.iter().filter(|&&d| d == -1).count();
            if minus > 1 || shape.iter().any(|&d| d < -1) {
                return detail(format!("target shape {shape:?} may hold at most one -1 and no other negative size"));
            }
            let known = known_elements(
                shape.iter().filter(|&&d| d >= 0).map(|&d| d as usize),
                &format!("target shape {shape:?}"),
            )?;
            let mut out: Vec<Option<usize>> =
                shape.iter().map(|&d| if d >= 0 { Some(d as usize) } else { None }).collect();
            match x.shape.num_elements() {
                Some(total) => {
                    if minus == 1 {
                        if known == 0 || total % known != 0 {
                            return detail(format!("cannot reshape {} ({total} elements) into {shape:?}", x.shape));
                        }
                        let pos = shape.iter().position(|&d| d == -1).unwrap_or(0);
                        out[pos] = Some(total / known);
                    } else if known != total {
                        return detail(format!("cannot reshape {} ({total} elements) into {shape:?}", x.shape));
                    }
                }
                None => {
                    // Unknown batch: the -1 stays unknown. No divisibility
                    // check: as in TF, some batch size always fits (`[?,6]`
                    // into `[-1,4]` holds for a batch of 2); the check runs
                    // once `reinfer` sees the bound batch.
                    if minus == 0 {
                        return detail(format!(
                            "cannot reshape {} (unknown size) into the fixed shape {shape:?}; use -1 for the batch dimension",
                            x.shape
                        ));
                    }
                }
            }
            Ok(vec![TensorType { dtype: x.dtype, shape: Shape(out) }])
        }
        Concat { axis } => {
            if inputs.is_empty() {
                return Err(InferError::Arity { expected: "at least 1".into(), got: 0 });
            }
            let r = inputs[0].shape.rank();
            normalize_axes(&[*axis], r)?;
            let mut out = inputs[0].shape.clone();
            for t in &inputs[1..] {
                if t.shape.rank() != r || t.dtype != inputs[0].dtype {
                    return detail(format!("cannot concatenate {} and {}", inputs[0], t));
                }
                for i in 0..r {
                    if i == *axis {
                        out.0[i] = match (out.0[i], t.shape.0[i]) {
                            (Some(a), Some(b)) => Some(a + b),
                            _ => None,
                        };
                    } else {
                        out.0[i] = merge_dim(out.0[i], t.shape.0[i]).or_else(|_| {
                            detail(format!("dimension {i} differs: {} vs {}", inputs[0].shape, t.shape))
                        })?;
                    }
                }
            }
            Ok(vec![TensorType { dtype: inputs[0].dtype, shape: out }])
        }
        Split { axis, sizes } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            normalize_axes(&[*axis], x.shape.rank())?;
            let total: usize = sizes.iter().sum();
            if let Some(n) = x.shape.0[*axis] {
                if n != total {
                    return detail(format!(
                        "split sizes {sizes:?} sum to {total}, but dimension {axis} of {} is {n}",
                        x.shape
                    ));
                }
            }
            Ok(sizes.iter().map(|&s| TensorType { dtype: x.dtype, shape: x.shape.with_dim(*axis, Some(s)) }).collect())
        }
        Slice { begin, size } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            if begin.len() != x.shape.rank() || size.len() != x.shape.rank() {
                return detail(format!("begin {begin:?} and size {size:?} must have rank {}", x.shape.rank()));
            }
            let mut out = Vec::new();
            for i in 0..x.shape.rank() {
                let d = x.shape.0[i];
                let o = if size[i] < 0 { d.map(|d| d.saturating_sub(begin[i])) } else { Some(size[i] as usize) };
                if let (Some(d), Some(o)) = (d, o) {
                    if begin[i] + o > d {
                        return detail(format!(
                            "slice [{}..{}] exceeds dimension {i} of {}",
                            begin[i],
                            begin[i] + o,
                            x.shape
                        ));
                    }
                }
                out.push(o);
            }
            Ok(vec![TensorType { dtype: x.dtype, shape: Shape(out) }])
        }
        SliceGrad { .. } | BroadcastLike | SumToLike => {
            arity(inputs, 2)?;
            let (a, b) = (&inputs[0], &inputs[1]);
            match op {
                SliceGrad { .. } => same(&TensorType { dtype: b.dtype, shape: a.shape.clone() }),
                _ => {
                    let (small, big) = if matches!(op, BroadcastLike) { (a, b) } else { (b, a) };
                    if broadcast_shapes(&small.shape, &big.shape).map(|s| s.compatible(&big.shape)) != Some(true) {
                        return detail(format!("{} does not broadcast to {}", small.shape, big.shape));
                    }
                    same(&TensorType { dtype: a.dtype, shape: b.shape.clone() })
                }
            }
        }
        _ => detail(format!("{} is not a layout op", op.type_name())),
    }
}
