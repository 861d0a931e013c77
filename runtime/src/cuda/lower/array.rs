//! The CUDA launches of the array kernels of issue 22 (`kernels/src/array/array.cu`),
//! with the argument lists `towers_kernels::cuda::KERNELS` documents: one
//! grid-stride launch each, shapes padded to rank 4 as `Dims4`.
//!
//! An index outside its range is not checked here: gather writes 0 for it
//! and gather_grad drops its row (TF's GPU behaviour; the CPU backend fails
//! with TF's error instead).

use towers_kernels::cuda::{grid_1d, Dims4, BLOCK};
use towers_kernels::Kernel;

use super::super::args::ArgPack;
use super::{Dev, KLaunch, Modules, Op};

fn d4(v: &[usize], fill: i64, kernel: &str) -> Result<Dims4, String> {
    Dims4::padded(v, fill).ok_or_else(|| format!("{kernel}: rank {} is above 4, the CUDA kernels' limit", v.len()))
}

/// Build the launch of one array kernel.
pub(super) fn lower(
    kernel: &Kernel,
    ins: &[Dev],
    outs: &[Dev],
    mods: &mut Modules,
    ops: &mut Vec<Op>,
) -> Result<(), String> {
    let name = kernel.name();
    let i = |k: usize| ins.get(k).copied().ok_or_else(|| format!("{name}: missing input {k}"));
    let y = outs.first().copied().ok_or_else(|| format!("{name}: missing output 0"))?;
    let mut a = ArgPack::new();
    a.i64(y.len);
    let entry = match kernel {
        Kernel::OneHot { depth, on, off } => {
            a.i64(*depth).f32(*on).f32(*off).ptr(i(0)?.ptr).ptr(y.ptr);
            "towers_one_hot_f32"
        }
        Kernel::Transpose { shape, perm } => {
            let s = d4(shape, 1, name)?;
            let st = [s.d[1] * s.d[2] * s.d[3], s.d[2] * s.d[3], s.d[3], 1];
            let off = 4 - shape.len();
            let (mut od, mut src) = (Dims4 { d: [1; 4] }, Dims4 { d: [0; 4] });
            for k in 0..4 {
                let from = if k < off { k } else { off + perm.get(k - off).copied().ok_or("perm too short")? };
                od.d[k] = s.d[from.min(3)];
                src.d[k] = st[from.min(3)];
            }
            a.ptr(i(0)?.ptr).ptr(y.ptr).push(od).push(src);
            "towers_transpose_f32"
        }
        Kernel::Pad { shape, before, out_shape, value } => {
            a.ptr(i(0)?.ptr).ptr(y.ptr).push(d4(out_shape, 1, name)?).push(d4(before, 0, name)?);
            a.push(d4(shape, 1, name)?).f32(*value);
            "towers_pad_f32"
        }
        Kernel::Gather { limit, inner, count, .. } | Kernel::GatherGrad { limit, inner, count, .. } => {
            a.i64(*limit).i64(*inner).i64(*count).ptr(i(0)?.ptr).ptr(i(1)?.ptr).ptr(y.ptr);
            if matches!(kernel, Kernel::Gather { .. }) {
                "towers_gather_f32"
            } else {
                "towers_gather_grad_f32"
            }
        }
        Kernel::Tile { shape, multiples } => {
            let tiled: Vec<usize> = shape.iter().zip(multiples).map(|(d, m)| d * m).collect();
            a.ptr(i(0)?.ptr).ptr(y.ptr).push(d4(&tiled, 1, name)?).push(d4(shape, 1, name)?);
            "towers_tile_f32"
        }
        Kernel::TileGrad { shape, multiples } => {
            a.ptr(i(0)?.ptr).ptr(y.ptr).push(d4(shape, 1, name)?).push(d4(multiples, 1, name)?);
            "towers_tile_grad_f32"
        }
        other => return Err(format!("{} is not an array kernel", other.name())),
    };
    let f = mods.function("array", entry)?;
    a.finish();
    ops.push(Op::Kernel(KLaunch { f, grid: grid_1d(y.len), block: BLOCK, args: a }));
    Ok(())
}
