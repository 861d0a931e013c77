//! Shape and dtype inference of the array ops of issue 22 (`OneHot`,
//! `Transpose`, `ExpandDims`, `Squeeze`, `Pad`, `Gather`, `GatherGrad`,
//! `Tile`, `TileGrad`), with TF's error texts where TF has one.
//!
//! Invariants (as [`crate::infer`]): unknown dimensions propagate; a known
//! dimension that breaks a rule is an error naming the shapes; indices are
//! i32; the data ops other than `Transpose` (which moves any 4-byte element,
//! as the layout kernels) take f32.

use crate::infer::{arity, detail, known_elements, merge_dim, want_float, InferError, R};
use crate::op::Op;
use crate::types::{DType, Shape, TensorType};

fn want_indices(t: &TensorType) -> Result<(), InferError> {
    if t.dtype != DType::I32 {
        return detail(format!("indices must be i32, got {t}; cast them with tf.cast(indices, tf.int32)"));
    }
    Ok(())
}

/// The output types of the array op `op` applied to inputs of the given types.
pub(crate) fn infer(op: &Op, inputs: &[TensorType]) -> R {
    match op {
        Op::OneHot { depth, .. } => {
            arity(inputs, 1)?;
            want_indices(&inputs[0])?;
            let mut dims = inputs[0].shape.0.clone();
            dims.push(Some(*depth));
            known_elements(dims.iter().flatten().copied(), &format!("one_hot of depth {depth}"))?;
            Ok(vec![TensorType::new(DType::F32, Shape(dims))])
        }
        Op::Transpose { perm } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            let r = x.shape.rank();
            if perm.len() != r {
                return detail(format!(
                    "transpose expects a vector of size {r}. But input(1) is a vector of size {} (perm {perm:?} for {})",
                    perm.len(),
                    x.shape
                ));
            }
            if let Some(missing) = (0..r).find(|a| !perm.contains(a)) {
                return detail(format!(
                    "perm must be a permutation of 0..{r}: {missing} is missing from {perm:?} (for {})",
                    x.shape
                ));
            }
            let dims = perm.iter().map(|&a| x.shape.0[a]).collect();
            Ok(vec![TensorType { dtype: x.dtype, shape: Shape(dims) }])
        }
        Op::ExpandDims { axis } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            if *axis > x.shape.rank() {
                return detail(format!(
                    "Tried to expand dim index {axis} for tensor with {} dimensions.",
                    x.shape.rank()
                ));
            }
            let mut dims = x.shape.0.clone();
            dims.insert(*axis, Some(1));
            Ok(vec![TensorType { dtype: x.dtype, shape: Shape(dims) }])
        }
        Op::Squeeze { axes } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            let r = x.shape.rank();
            if axes.windows(2).any(|w| w[0] >= w[1]) {
                return detail(format!("squeeze axes {axes:?} must be sorted and distinct"));
            }
            for &a in axes {
                match x.shape.0.get(a) {
                    None => return detail(format!("Tried to squeeze dim index {a} for tensor with {r} dimensions.")),
                    Some(Some(d)) if *d != 1 => {
                        return detail(format!("Can not squeeze dim[{a}], expected a dimension of 1, got {d}"))
                    }
                    _ => {}
                }
            }
            let dims = x.shape.0.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, d)| *d).collect();
            Ok(vec![TensorType { dtype: x.dtype, shape: Shape(dims) }])
        }
        Op::Pad { paddings, .. } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            want_float(x, "the input of pad")?;
            if paddings.len() != x.shape.rank() {
                return detail(format!(
                    "The first dimension of paddings must be the rank of inputs[{},2] {}",
                    paddings.len(),
                    x.shape
                ));
            }
            let mut dims = Vec::with_capacity(paddings.len());
            for (d, [b, a]) in x.shape.0.iter().zip(paddings) {
                dims.push(match d {
                    Some(d) => Some(
                        d.checked_add(*b)
                            .and_then(|v| v.checked_add(*a))
                            .map_or_else(|| detail(format!("padding {paddings:?} overflows")), Ok)?,
                    ),
                    None => None,
                });
            }
            Ok(vec![TensorType::new(DType::F32, Shape(dims))])
        }
        Op::Gather { axis } => {
            arity(inputs, 2)?;
            let (p, i) = (&inputs[0], &inputs[1]);
            want_float(p, "params")?;
            want_indices(i)?;
            let r = p.shape.rank();
            if *axis >= r {
                return detail(format!("Expected axis in the range [-{r}, {r}), but got {axis} (params {})", p.shape));
            }
            let mut dims = p.shape.0[..*axis].to_vec();
            dims.extend_from_slice(&i.shape.0);
            dims.extend_from_slice(&p.shape.0[axis + 1..]);
            Ok(vec![TensorType::new(DType::F32, Shape(dims))])
        }
        Op::GatherGrad { axis } => {
            arity(inputs, 3)?;
            let (p, i, dy) = (&inputs[0], &inputs[1], &inputs[2]);
            let forward = infer(&Op::Gather { axis: *axis }, &inputs[..2])?;
            if !forward[0].shape.compatible(&dy.shape) {
                return detail(format!(
                    "gradient {} does not match the gather's output {}",
                    dy.shape, forward[0].shape
                ));
            }
            want_indices(i)?;
            Ok(vec![p.clone()])
        }
        Op::Tile { multiples } | Op::TileGrad { multiples } => {
            let tiled = |x: &TensorType| -> Result<Shape, InferError> {
                if multiples.len() != x.shape.rank() {
                    return detail(format!(
                        "Expected multiples argument to be a vector of length {} but got length {}",
                        x.shape.rank(),
                        multiples.len()
                    ));
                }
                let mut dims = Vec::with_capacity(multiples.len());
                for (d, m) in x.shape.0.iter().zip(multiples) {
                    dims.push(d.map(|d| d.saturating_mul(*m)));
                }
                known_elements(dims.iter().flatten().copied(), &format!("tile by {multiples:?}"))?;
                Ok(Shape(dims))
            };
            if let Op::Tile { .. } = op {
                arity(inputs, 1)?;
                want_float(&inputs[0], "the input of tile")?;
                return Ok(vec![TensorType::new(DType::F32, tiled(&inputs[0])?)]);
            }
            arity(inputs, 2)?;
            let (x, dy) = (&inputs[0], &inputs[1]);
            let t = tiled(x)?;
            if dy.shape.rank() != t.rank() || t.0.iter().zip(&dy.shape.0).any(|(a, b)| merge_dim(*a, *b).is_err()) {
                return detail(format!("gradient {} does not match the tile's output {t}", dy.shape));
            }
            Ok(vec![x.clone()])
        }
        _ => detail(format!("{} is not an array op of issue 22", op.type_name())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::F32;

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
    fn shapes_of_each_op() {
        let x = t(DType::F32, &[None, Some(3), Some(1)]);
        let ix = t(DType::I32, &[None]);
        let one = |op: Op, ins: &[TensorType]| infer(&op, ins).unwrap()[0].clone();
        let oh = one(Op::OneHot { depth: 5, on_value: F32(1.0), off_value: F32(0.0) }, &[ix.clone()]);
        assert_eq!(oh, t(DType::F32, &[None, Some(5)]));
        assert_eq!(one(Op::Transpose { perm: vec![2, 0, 1] }, &[x.clone()]), t(DType::F32, &[Some(1), None, Some(3)]));
        assert_eq!(one(Op::ExpandDims { axis: 3 }, &[x.clone()]).shape.0, vec![None, Some(3), Some(1), Some(1)]);
        assert_eq!(one(Op::Squeeze { axes: vec![2] }, &[x.clone()]).shape.0, vec![None, Some(3)]);
        let pad = Op::Pad { paddings: vec![[0, 0], [1, 2], [0, 0]], constant_value: F32(0.0) };
        assert_eq!(one(pad, &[x.clone()]).shape.0, vec![None, Some(6), Some(1)]);
        let p = t(DType::F32, &[Some(10), Some(4)]);
        let i2 = t(DType::I32, &[Some(2), Some(3)]);
        assert_eq!(one(Op::Gather { axis: 0 }, &[p.clone(), i2.clone()]).shape.0, vec![Some(2), Some(3), Some(4)]);
        assert_eq!(one(Op::Gather { axis: 1 }, &[p.clone(), i2]).shape.0, vec![Some(10), Some(2), Some(3)]);
        assert_eq!(one(Op::Tile { multiples: vec![1, 2, 3] }, &[x.clone()]).shape.0, vec![None, Some(6), Some(3)]);
        let dy = t(DType::F32, &[Some(4), Some(6), Some(3)]);
        assert_eq!(one(Op::TileGrad { multiples: vec![1, 2, 3] }, &[x.clone(), dy]), x);
    }

    #[test]
    fn errors_speak_tf() {
        let x = t(DType::F32, &[Some(2), Some(3)]);
        let e = err(Op::Transpose { perm: vec![0, 0] }, &[x.clone()]);
        assert!(e.contains("perm must be a permutation") && e.contains("1 is missing"), "{e}");
        let e = err(Op::Transpose { perm: vec![0, 1, 2] }, &[x.clone()]);
        assert!(e.starts_with("transpose expects a vector of size 2. But input(1) is a vector of size 3"), "{e}");
        let e = err(Op::Tile { multiples: vec![2] }, &[x.clone()]);
        assert_eq!(e, "Expected multiples argument to be a vector of length 2 but got length 1");
        let e = err(Op::Squeeze { axes: vec![1] }, &[x.clone()]);
        assert_eq!(e, "Can not squeeze dim[1], expected a dimension of 1, got 3");
        let e = err(Op::ExpandDims { axis: 3 }, &[x.clone()]);
        assert_eq!(e, "Tried to expand dim index 3 for tensor with 2 dimensions.");
        let e = err(Op::Pad { paddings: vec![[1, 1]], constant_value: F32(0.0) }, &[x.clone()]);
        assert!(e.starts_with("The first dimension of paddings must be the rank of inputs[1,2]"), "{e}");
        let e = err(Op::Gather { axis: 0 }, &[x.clone(), x.clone()]);
        assert!(e.starts_with("indices must be i32"), "{e}");
        let e = err(Op::Gather { axis: 2 }, &[x.clone(), t(DType::I32, &[Some(1)])]);
        assert!(e.starts_with("Expected axis in the range [-2, 2), but got 2"), "{e}");
        let e = err(Op::OneHot { depth: 3, on_value: F32(1.0), off_value: F32(0.0) }, &[x]);
        assert!(e.starts_with("indices must be i32"), "{e}");
    }
}
