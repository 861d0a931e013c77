//! The builder methods of the array ops of issue 22, with TF1's names and
//! arguments: `one_hot`, `transpose`, `stack`, `unstack`, `expand_dims`, `squeeze`,
//! `pad`, `gather`, `tile`.
//!
//! Invariants: negative axes are resolved here, against the input's rank
//! (always known at build time), as TF resolves them, so the ops store
//! plain axes; `squeeze` with no axes resolves to the size-1 dimensions known
//! at build time; an argument TF rejects is a [`GraphError::Shape`] naming
//! the node that would have been built, in TF's words.

use crate::axis::AxisIndex;
use crate::builder::GraphBuilder;
use crate::error::{GraphError, Result};
use crate::graph::Tensor;
use crate::op::Op;
use crate::types::F32;

/// `tf.pad`'s `mode`. Only `Constant` is implemented; the others are refused
/// with an error naming the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PadMode {
    /// Pad with `constant_values` (TF's default).
    Constant,
    /// `MirrorPad` REFLECT: not supported.
    Reflect,
    /// `MirrorPad` SYMMETRIC: not supported.
    Symmetric,
}

impl GraphBuilder {
    /// The error of the node `name` would have been, in the current name scope.
    fn array_error(&self, name: &str, op: &str, detail: String) -> GraphError {
        let scope = self.current_name_scope().to_string();
        let node = if scope.is_empty() { name.to_string() } else { format!("{scope}/{name}") };
        GraphError::Shape { node, scope, op: op.into(), detail }
    }

    fn rank_of(&self, x: Tensor) -> Result<usize> {
        Ok(self.graph().tensor_type(x)?.shape.rank())
    }

    /// TF `tf.one_hot(indices, depth, on_value, off_value)` with axis -1:
    /// i32 `indices` of shape S give f32 `S + [depth]`. An index outside
    /// `[0, depth)` gives a row of `off_value`, as in TF. No gradient flows
    /// to the indices. Example: `b.one_hot(labels, 10, 1.0, 0.0)`.
    pub fn one_hot(&mut self, indices: Tensor, depth: usize, on_value: f32, off_value: f32) -> Result<Tensor> {
        let op = Op::OneHot { depth, on_value: F32(on_value), off_value: F32(off_value) };
        self.op1("one_hot", op, &[indices])
    }

    /// TF `tf.transpose(x, perm)`: output axis k is input axis `perm[k]`; an
    /// empty `perm` means TF's default, the axes reversed.
    pub fn transpose(&mut self, x: Tensor, perm: &[usize]) -> Result<Tensor> {
        let perm = if perm.is_empty() { (0..self.rank_of(x)?).rev().collect() } else { perm.to_vec() };
        self.op1("transpose", Op::Transpose { perm }, &[x])
    }

    /// TF `tf.expand_dims(x, axis)`: a size-1 axis inserted at `axis`, which
    /// may be negative (`-1` appends), in `[-rank-1, rank]`. A view of x.
    pub fn expand_dims(&mut self, x: Tensor, axis: impl AxisIndex) -> Result<Tensor> {
        let (axis, r) = (axis.as_i64(), self.rank_of(x)?);
        if axis < -(r as i64) - 1 || axis > r as i64 {
            let detail = format!("Tried to expand dim index {axis} for tensor with {r} dimensions.");
            return Err(self.array_error("ExpandDims", "ExpandDims", detail));
        }
        let axis = if axis < 0 { (axis + r as i64 + 1) as usize } else { axis as usize };
        self.op1("ExpandDims", Op::ExpandDims { axis }, &[x])
    }

    /// TF `tf.squeeze(x, axis)`: the size-1 axes `axes` removed (negative
    /// allowed); empty `axes` removes every dimension known to be 1 at build
    /// time (an unknown dimension, such as the batch, stays). Squeezing a
    /// dimension that is not 1 is TF's error. A view of x.
    pub fn squeeze(&mut self, x: Tensor, axes: &[i64]) -> Result<Tensor> {
        let shape = self.graph().tensor_type(x)?.shape.clone();
        let mut resolved = Vec::with_capacity(axes.len());
        for &a in axes {
            let r = shape.rank() as i64;
            if a < -r || a >= r {
                let detail = format!("Tried to squeeze dim index {a} for tensor with {r} dimensions.");
                return Err(self.array_error("Squeeze", "Squeeze", detail));
            }
            resolved.push(if a < 0 { (a + r) as usize } else { a as usize });
        }
        if axes.is_empty() {
            resolved = (0..shape.rank()).filter(|&i| shape.0[i] == Some(1)).collect();
        }
        resolved.sort_unstable();
        resolved.dedup();
        self.op1("Squeeze", Op::Squeeze { axes: resolved }, &[x])
    }

    /// TF `tf.stack(xs, axis)` (`Pack`): the tensors, of one shape, stacked
    /// along a new axis `axis` in `[-rank-1, rank]`. Built as an
    /// `ExpandDims` of each (a view) and one concat, so its gradient is
    /// unstack: a slice of the incoming gradient per input.
    pub fn stack(&mut self, xs: &[Tensor], axis: impl AxisIndex) -> Result<Tensor> {
        let axis = axis.as_i64();
        let Some(&first) = xs.first() else {
            return Err(self.array_error("stack", "Pack", "stack needs at least one tensor".into()));
        };
        let r = self.rank_of(first)?;
        if axis < -(r as i64) - 1 || axis > r as i64 {
            let lo = -(r as i64) - 1;
            let detail = format!("axis = {axis} not in [{lo}, {}]", r + 1);
            return Err(self.array_error("stack", "Pack", detail));
        }
        let resolved = if axis < 0 { (axis + r as i64 + 1) as usize } else { axis as usize };
        let first_ty = self.graph().tensor_type(first)?.clone();
        let mut parts = Vec::with_capacity(xs.len());
        for (i, &x) in xs.iter().enumerate() {
            let ty = self.graph().tensor_type(x)?.clone();
            if ty.dtype != first_ty.dtype || !ty.shape.compatible(&first_ty.shape) {
                let detail = format!(
                    "Shapes of all inputs must match: values[0].shape = {} != values[{i}].shape = {}",
                    first_ty.shape, ty.shape
                );
                return Err(self.array_error("stack", "Pack", detail));
            }
            parts.push(self.op1("stack/ExpandDims", Op::ExpandDims { axis: resolved }, &[x])?);
        }
        self.op1("stack", Op::Concat { axis: resolved }, &parts)
    }

    /// TF `tf.unstack(x, axis)` (`Unpack`): the slices of `x` along `axis`
    /// (known size, negative allowed), each without that axis, in order.
    /// Built as a `split` into size-1 parts and a `Squeeze` of each (views),
    /// so its gradient is a stack.
    pub fn unstack(&mut self, x: Tensor, axis: impl AxisIndex) -> Result<Vec<Tensor>> {
        let axis = self.axis_of("unstack", "Unpack", x, axis)?;
        let shape = self.graph().tensor_type(x)?.shape.clone();
        let Some(n) = shape.dim(axis) else {
            let detail = format!("Cannot infer num from shape {shape}: axis {axis} must have a known size");
            return Err(self.array_error("unstack", "Unpack", detail));
        };
        self.name_scope("unstack", |b| {
            let parts = b.split(x, axis, &vec![1; n])?;
            parts.into_iter().map(|p| b.op1("Squeeze", Op::Squeeze { axes: vec![axis] }, &[p])).collect()
        })
    }

    /// TF `tf.pad(x, paddings, constant_values=...)`, mode CONSTANT:
    /// `paddings[i] = [before, after]` for each axis i of x (f32). Example:
    /// `b.pad(x, &[[0, 0], [2, 2], [2, 2], [0, 0]], 0.0)`.
    pub fn pad<P: AsRef<[i64]>>(&mut self, x: Tensor, paddings: &[P], constant_values: f32) -> Result<Tensor> {
        self.pad_mode(x, paddings, PadMode::Constant, constant_values)
    }

    /// [`GraphBuilder::pad`] with TF's `mode`; REFLECT and SYMMETRIC are
    /// refused with an error naming the node (use CONSTANT).
    pub fn pad_mode<P: AsRef<[i64]>>(
        &mut self,
        x: Tensor,
        paddings: &[P],
        mode: PadMode,
        constant_values: f32,
    ) -> Result<Tensor> {
        if mode != PadMode::Constant {
            let detail = format!("mode {mode:?} is not supported; only Constant (tf.pad's default, CONSTANT) is");
            return Err(self.array_error("Pad", "MirrorPad", detail));
        }
        let mut rows = Vec::with_capacity(paddings.len());
        for p in paddings {
            let p = p.as_ref();
            if p.len() != 2 {
                let all: Vec<&[i64]> = paddings.iter().map(|p| p.as_ref()).collect();
                let detail = format!("paddings must be a matrix with 2 columns: {all:?}");
                return Err(self.array_error("Pad", "PadV2", detail));
            }
            if p[0] < 0 || p[1] < 0 {
                let detail = format!("Paddings must be non-negative: {} {}", p[0], p[1]);
                return Err(self.array_error("Pad", "PadV2", detail));
            }
            rows.push([p[0] as usize, p[1] as usize]);
        }
        self.op1("Pad", Op::Pad { paddings: rows, constant_value: F32(constant_values) }, &[x])
    }

    /// TF `tf.gather(params, indices, axis)` (`GatherV2`): slices of f32
    /// `params` along `axis` (negative allowed) picked by i32 `indices`;
    /// the output is `params.shape[..axis] + indices.shape +
    /// params.shape[axis+1..]`. An index outside the axis is a run-time
    /// error on the CPU backend ("indices[3] = 12 is not in [0, 10)"); the
    /// CUDA backend writes zeros for it, as TF's GPU kernel does. The
    /// gradient with respect to `params` is an unsorted segment sum.
    pub fn gather(&mut self, params: Tensor, indices: Tensor, axis: impl AxisIndex) -> Result<Tensor> {
        let axis = self.axis_of("GatherV2", "GatherV2", params, axis)?;
        self.op1("GatherV2", Op::Gather { axis }, &[params, indices])
    }

    /// TF `tf.tile(x, multiples)`: x (f32) repeated `multiples[i]` times along axis i.
    pub fn tile(&mut self, x: Tensor, multiples: &[usize]) -> Result<Tensor> {
        self.op1("Tile", Op::Tile { multiples: multiples.to_vec() }, &[x])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    #[test]
    fn tf_names_axes_and_errors() {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, [None, Some(3), Some(1)]).unwrap();
        let e = b.expand_dims(x, -1).unwrap();
        assert_eq!(b.graph().tensor_type(e).unwrap().shape.0, vec![None, Some(3), Some(1), Some(1)]);
        let s = b.squeeze(x, &[]).unwrap();
        assert_eq!(b.graph().tensor_type(s).unwrap().shape.0, vec![None, Some(3)]);
        let err = b.squeeze(x, &[1]).unwrap_err().to_string();
        assert_eq!(err, "Squeeze 'Squeeze_1' (in scope ''): Can not squeeze dim[1], expected a dimension of 1, got 3");
        let st = b.stack(&[x, x], 1).unwrap();
        assert_eq!(b.graph().tensor_type(st).unwrap().shape.0, vec![None, Some(2), Some(3), Some(1)]);
        assert_eq!(b.graph().node(st.node).name, "stack");
        let t = b.transpose(x, &[]).unwrap();
        assert_eq!(b.graph().tensor_type(t).unwrap().shape.0, vec![Some(1), Some(3), None]);
        let err = b.pad(x, &[vec![0, 0, 1], vec![1, 1], vec![0, 0]], 0.0).unwrap_err().to_string();
        assert!(err.contains("paddings must be a matrix with 2 columns"), "{err}");
        let err = b.pad(x, &[[0, 0], [1, 1]], 0.0).unwrap_err().to_string();
        assert!(err.contains("The first dimension of paddings must be the rank of inputs[2,2]"), "{err}");
        let err = b.pad_mode(x, &[[0, 0], [1, 1], [0, 0]], PadMode::Reflect, 0.0).unwrap_err().to_string();
        assert!(err.contains("MirrorPad 'Pad'") && err.contains("Reflect is not supported"), "{err}");
        let err = b.tile(x, &[1, 2]).unwrap_err().to_string();
        assert!(err.contains("Expected multiples argument to be a vector of length 3 but got length 2"), "{err}");
        let i = b.placeholder("i", DType::I32, [Some(4)]).unwrap();
        let g = b.gather(x, i, -2).unwrap();
        assert_eq!(b.graph().tensor_type(g).unwrap().shape.0, vec![None, Some(4), Some(1)]);
        let err = b.gather(x, i, 3).unwrap_err().to_string();
        assert!(err.contains("Expected axis in the range [-3, 3), but got 3"), "{err}");
        let oh = b.one_hot(i, 5, 1.0, 0.0).unwrap();
        assert_eq!(b.graph().tensor_type(oh).unwrap().shape.0, vec![Some(4), Some(5)]);
    }
}
