//! The launch rule of the array kernels of issue 22: arity, dtypes (indices
//! i32, data f32; a transpose moves any 4-byte element) and element counts
//! from the parameters, which must agree with themselves (a permutation,
//! a window inside the padded shape, one multiple per axis, rank <= 4 where
//! the kernels pad shapes to rank 4). Counts use checked arithmetic.

use towers_vocab::DType;

use super::super::dims;
use super::{Check, Io};
use crate::verify::PlanError;
use towers_kernels::Kernel;

impl Check<'_, '_> {
    fn rank4(&self, shape: &[usize]) -> Result<(), PlanError> {
        self.param(shape.len() <= 4, || format!("shape {} has rank above 4, the kernels' limit", dims(shape)))
    }

    /// Lengths of params `[outer, limit, inner]` and of the gathered `[outer, count, inner]`.
    fn gathered(&self, outer: usize, limit: usize, inner: usize, count: usize) -> Result<(usize, usize), PlanError> {
        let params = self.prod(&[outer, limit, inner], "outer*limit*inner")?;
        Ok((params, self.prod(&[outer, count, inner], "outer*count*inner")?))
    }

    pub(super) fn array(&self, k: &Kernel) -> Result<(), PlanError> {
        use Io::{In, Out};
        match k {
            Kernel::OneHot { depth, .. } => {
                self.args(1, 1)?;
                self.dtype(In(0), DType::I32)?;
                self.dtype(Out(0), DType::F32)?;
                let n = self.count(self.ins[0].elems.checked_mul(*depth), "indices*depth")?;
                self.size(Out(0), n, || format!("the indices' count times depth {depth}"))
            }
            Kernel::Transpose { shape, perm } => {
                self.args(1, 1)?;
                self.same_dtype()?;
                self.rank4(shape)?;
                let ok = perm.len() == shape.len() && (0..shape.len()).all(|a| perm.contains(&a));
                self.param(ok, || format!("perm {} is not a permutation of the axes of {}", dims(perm), dims(shape)))?;
                let n = self.prod(shape, "shape")?;
                self.sizes(&[In(0), Out(0)], n, "the shape's element count")
            }
            Kernel::Pad { shape, before, out_shape, .. } => {
                self.args(1, 1)?;
                self.all_f32()?;
                self.rank4(shape)?;
                let inside = before.len() == shape.len()
                    && out_shape.len() == shape.len()
                    && (0..shape.len()).all(|d| before[d].checked_add(shape[d]).is_some_and(|e| e <= out_shape[d]));
                self.param(inside, || {
                    format!("{} at {} is not inside {}", dims(shape), dims(before), dims(out_shape))
                })?;
                self.size(In(0), self.prod(shape, "shape")?, || format!("shape {}", dims(shape)))?;
                self.size(Out(0), self.prod(out_shape, "out_shape")?, || format!("out_shape {}", dims(out_shape)))
            }
            Kernel::Gather { outer, limit, inner, count } | Kernel::GatherGrad { outer, limit, inner, count } => {
                self.args(2, 1)?;
                let (params, gathered) = self.gathered(*outer, *limit, *inner, *count)?;
                let (x, y) = if matches!(k, Kernel::Gather { .. }) { (params, gathered) } else { (gathered, params) };
                self.dtype(In(0), DType::F32)?;
                self.dtype(In(1), DType::I32)?;
                self.dtype(Out(0), DType::F32)?;
                self.size(In(0), x, || "the parameters' shapes".into())?;
                self.size(In(1), *count, || "count indices".into())?;
                self.size(Out(0), y, || "the parameters' shapes".into())
            }
            Kernel::Tile { shape, multiples } | Kernel::TileGrad { shape, multiples } => {
                self.args(1, 1)?;
                self.all_f32()?;
                self.rank4(shape)?;
                self.param(multiples.len() == shape.len(), || {
                    format!("{} multiples for shape {}", multiples.len(), dims(shape))
                })?;
                let mut tiled = Vec::with_capacity(shape.len());
                for (d, m) in shape.iter().zip(multiples) {
                    tiled.push(self.count(d.checked_mul(*m), "the tiled shape")?);
                }
                let (small, big) = (self.prod(shape, "shape")?, self.prod(&tiled, "the tiled shape")?);
                let (x, y) = if matches!(k, Kernel::Tile { .. }) { (small, big) } else { (big, small) };
                self.size(In(0), x, || "the parameters' shapes".into())?;
                self.size(Out(0), y, || "the parameters' shapes".into())
            }
            other => self.param(false, || format!("{} is not an array kernel", other.name())),
        }
    }
}
