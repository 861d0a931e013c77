//! Pooling, layout (concat, split, slice) and the array ops of issue 22
//! (one_hot, transpose, pad, gather, tile and their gradients): one
//! grid-stride launch each (one per part for concat and split), shapes
//! padded to rank 4 as `Dims4`. A gather index outside its range is not
//! checked on the GPU: gather writes 0 for it and gather_grad drops its row
//! (TF's GPU behaviour; the CPU backend fails with TF's error instead).

use super::entries::*;
use super::{i64a, Arg, Cx, LaunchError};
use crate::cuda::{grid_1d, Dims4, PoolArgs};
use crate::Kernel;

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

/// Lower `kernel` if it is a pool, layout or array kernel; `false` otherwise.
pub(super) fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<bool, LaunchError> {
    match kernel {
        Kernel::MaxPool { geom } | Kernel::AvgPool { geom } => {
            let y = cx.o(0)?;
            let entry = if matches!(kernel, Kernel::MaxPool { .. }) { MAX_POOL } else { AVG_POOL };
            cx.launch(entry, grid_1d(y), vec![Arg::Pool(PoolArgs::from(geom)), cx.inp(0)?, cx.out(0)?]);
        }
        Kernel::MaxPoolGrad { geom } => {
            let dx = cx.o(0)?;
            let args = vec![Arg::Pool(geom.into()), cx.inp(0)?, cx.inp(1)?, cx.inp(2)?, cx.out(0)?];
            cx.launch(MAX_POOL_GRAD, grid_1d(dx), args);
        }
        Kernel::AvgPoolGrad { geom } => {
            let dx = cx.o(0)?;
            cx.launch(AVG_POOL_GRAD, grid_1d(dx), vec![Arg::Pool(geom.into()), cx.inp(0)?, cx.out(0)?]);
        }
        Kernel::Concat { axis, shapes } => {
            cx.o(0)?;
            let first = shapes.first().ok_or(LaunchError::NoInputs { kernel: cx.name })?;
            let (outer, inner) = (numel(&first[..*axis]), numel(&first[axis + 1..]));
            let total: usize = shapes.iter().map(|s| s[*axis]).sum::<usize>() * inner;
            let mut off = 0;
            for (k, s) in shapes.iter().enumerate() {
                let run = s[*axis] * inner;
                let args = vec![i64a(outer), i64a(run), i64a(total), i64a(off), cx.inp(k)?, cx.out(0)?];
                cx.launch(CONCAT_PART, grid_1d(outer * run), args);
                off += run;
            }
        }
        Kernel::Split { axis, shape, sizes } => {
            let (outer, inner) = (numel(&shape[..*axis]), numel(&shape[axis + 1..]));
            let total = shape[*axis] * inner;
            let mut off = 0;
            for (k, s) in sizes.iter().enumerate() {
                let run = s * inner;
                let args = vec![i64a(outer), i64a(run), i64a(total), i64a(off), cx.inp(0)?, cx.out(k)?];
                cx.launch(SPLIT_PART, grid_1d(outer * run), args);
                off += run;
            }
        }
        Kernel::Slice { shape, begin, size } | Kernel::SliceGrad { shape, begin, size } => {
            let y = cx.o(0)?;
            let args = vec![i64a(y), cx.inp(0)?, cx.out(0)?, cx.d4(shape, 1)?, cx.d4(begin, 0)?, cx.d4(size, 1)?];
            let entry = if matches!(kernel, Kernel::Slice { .. }) { SLICE } else { SLICE_GRAD };
            cx.launch(entry, grid_1d(y), args);
        }
        Kernel::OneHot { .. }
        | Kernel::Transpose { .. }
        | Kernel::Pad { .. }
        | Kernel::Gather { .. }
        | Kernel::GatherGrad { .. }
        | Kernel::Tile { .. }
        | Kernel::TileGrad { .. } => issue22(kernel, cx)?,
        _ => return Ok(false),
    }
    Ok(true)
}

fn issue22(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    let y = cx.o(0)?;
    let mut a = vec![i64a(y)];
    let entry = match kernel {
        Kernel::OneHot { depth, on, off } => {
            a.extend([i64a(*depth), Arg::F32(*on), Arg::F32(*off), cx.inp(0)?, cx.out(0)?]);
            ONE_HOT
        }
        Kernel::Transpose { shape, perm } => {
            let s = cx.dims(shape, 1)?;
            let st = [s.d[1] * s.d[2] * s.d[3], s.d[2] * s.d[3], s.d[3], 1];
            let off = 4 - shape.len();
            let (mut od, mut src) = (Dims4 { d: [1; 4] }, Dims4 { d: [0; 4] });
            for k in 0..4 {
                let p = if k < off { Some(k) } else { perm.get(k - off).map(|p| off + p) };
                let from = p.ok_or(LaunchError::Rank { kernel: cx.name, rank: perm.len() })?.min(3);
                od.d[k] = s.d[from];
                src.d[k] = st[from];
            }
            a.extend([cx.inp(0)?, cx.out(0)?, Arg::Dims4(od), Arg::Dims4(src)]);
            TRANSPOSE
        }
        Kernel::Pad { shape, before, out_shape, value } => {
            a.extend([cx.inp(0)?, cx.out(0)?, cx.d4(out_shape, 1)?, cx.d4(before, 0)?, cx.d4(shape, 1)?]);
            a.push(Arg::F32(*value));
            PAD
        }
        Kernel::Gather { limit, inner, count, .. } | Kernel::GatherGrad { limit, inner, count, .. } => {
            a.extend([i64a(*limit), i64a(*inner), i64a(*count), cx.inp(0)?, cx.inp(1)?, cx.out(0)?]);
            if matches!(kernel, Kernel::Gather { .. }) {
                GATHER
            } else {
                GATHER_GRAD
            }
        }
        Kernel::Tile { shape, multiples } => {
            let tiled: Vec<usize> = shape.iter().zip(multiples).map(|(d, m)| d * m).collect();
            a.extend([cx.inp(0)?, cx.out(0)?, cx.d4(&tiled, 1)?, cx.d4(shape, 1)?]);
            TILE
        }
        Kernel::TileGrad { shape, multiples } => {
            a.extend([cx.inp(0)?, cx.out(0)?, cx.d4(shape, 1)?, cx.d4(multiples, 1)?]);
            TILE_GRAD
        }
        other => return Err(LaunchError::CannotFuse { kernel: cx.name, inner: other.name() }),
    };
    cx.launch(entry, grid_1d(y), a);
    Ok(())
}
