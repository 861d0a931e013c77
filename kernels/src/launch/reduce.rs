//! Reductions: sums over axes (`towers_reduce_f32`), the bias and
//! activation gradients (one or two stages), softmax rows, cross-entropies,
//! batch-norm statistics, argmax, comparisons and casts. Reductions run one
//! block per output (grid `grid_rows`), elementwise tails `grid_1d`.

use super::entries::*;
use super::{i64a, Arg, Cx, LaunchError};
use crate::cuda::{grid_1d, grid_rows, Dims4, BLOCK};
use crate::{DType, Kernel};

/// Row blocks of the two-stage activation and bias gradient: enough to
/// fill a large GPU twice over (132 multiprocessors), from the shapes alone.
pub const BIAS_GRAD_PARTS: usize = 264;

/// Bits of the padded (rank-4) axes that `towers_reduce_f32` sums: those of
/// `x_shape` where the right-aligned `out_shape` has extent 1 and `x` not,
/// or that `out_shape` lacks.
pub(super) fn reduced_bits_to(x_shape: &[usize], out_shape: &[usize]) -> i32 {
    let (rx, ro) = (x_shape.len(), out_shape.len());
    let mut bits = 0;
    for (i, &d) in x_shape.iter().enumerate() {
        let o = (i + ro).checked_sub(rx).map(|j| out_shape[j]).unwrap_or(1);
        if o == 1 && d != 1 {
            bits |= 1 << (4 - rx + i);
        }
    }
    bits
}

/// The launches of an activation gradient with its per-channel sum over
/// `[rows, c]`, operands `[dy, y, dx, db]`. Tall tensors of at most 1024
/// channels take the two-stage kernels (coalesced row blocks into partial
/// sums in a scratch area only this launch uses, then one sum per
/// channel); others the one-block-per-channel kernel. The choice and every
/// order in it depend on the shapes only.
fn bias_grad(cx: &mut Cx<'_>, code: i32, rows: usize, c: usize, [dy, y, dx, db]: [Arg; 4]) {
    let block = if c == 0 || c > 1024 {
        0
    } else if c <= BLOCK as usize {
        (BLOCK as usize / c) * c
    } else {
        c
    };
    if block == 0 || rows < 4 * BIAS_GRAD_PARTS {
        let args = vec![Arg::I32(code), i64a(rows), i64a(c), dy, y, dx, db];
        cx.launch(UNARY_GRAD_BIAS_GRAD, grid_rows(c), args);
        return;
    }
    let rpb = rows.div_ceil(BIAS_GRAD_PARTS);
    let parts = rows.div_ceil(rpb);
    let s = cx.scratch(parts * c);
    let args = vec![Arg::I32(code), i64a(rows), i64a(c), i64a(rpb), dy, y, dx, Arg::Scratch(s)];
    cx.launch_block(UNARY_GRAD_BIAS_PARTIAL, parts as u32, block as u32, args);
    cx.launch(SUM_PARTIALS, grid_1d(c), vec![i64a(parts), i64a(c), Arg::Scratch(s), db]);
}

/// The column sums of `[rows, c]` at `x` into `y` (BiasAddGrad's launch).
fn column_sums(cx: &mut Cx<'_>, rows: usize, c: usize, x: Arg, y: Arg) {
    let args =
        vec![i64a(c), x, y, Arg::Dims4(Dims4 { d: [1, 1, rows as i64, c as i64] }), Arg::I32(0b0100), Arg::F32(1.0)];
    cx.launch(REDUCE, grid_rows(c), args);
}

/// Lower `kernel` if it is a reduction; `false` otherwise.
pub(super) fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<bool, LaunchError> {
    match kernel {
        Kernel::UnaryGradBiasGrad { channels, act } => {
            let rows = cx.i(0)? / (*channels).max(1);
            let ops = [cx.inp(0)?, cx.inp(1)?, cx.out(0)?, cx.out(1)?];
            bias_grad(cx, act.code(), rows, *channels, ops);
        }
        Kernel::MaxPoolGradActBiasGrad { geom, act } => {
            // The pool gradient into dx, then the activation and bias
            // gradients in place on it (dy = dx).
            let dx = cx.o(0)?;
            let args = vec![Arg::Pool(geom.into()), cx.inp(0)?, cx.inp(1)?, cx.inp(2)?, cx.out(0)?];
            cx.launch(MAX_POOL_GRAD, grid_1d(dx), args);
            let ops = [cx.out(0)?, cx.inp(3)?, cx.out(0)?, cx.out(1)?];
            bias_grad(cx, act.code(), dx / geom.c.max(1), geom.c, ops);
        }
        Kernel::BiasAddGrad { channels } => {
            let rows = cx.i(0)? / (*channels).max(1);
            let (x, y) = (cx.inp(0)?, cx.out(0)?);
            column_sums(cx, rows, *channels, x, y);
        }
        Kernel::SumTo { x_shape, out_shape } => {
            let y = cx.o(0)?;
            let bits = reduced_bits_to(x_shape, out_shape);
            let args = vec![i64a(y), cx.inp(0)?, cx.out(0)?, cx.d4(x_shape, 1)?, Arg::I32(bits), Arg::F32(1.0)];
            cx.launch(REDUCE, grid_rows(y), args);
        }
        Kernel::ReduceSum { shape, axes } | Kernel::ReduceMean { shape, axes } => {
            let y = cx.o(0)?;
            let d = cx.d4(shape, 1)?;
            let bits = axes.iter().fold(0, |b, &ax| b | 1 << (4 - shape.len() + ax));
            let count: usize = axes.iter().map(|&ax| shape[ax]).product();
            let scale = if matches!(kernel, Kernel::ReduceMean { .. }) { 1.0 / count.max(1) as f32 } else { 1.0 };
            let args = vec![i64a(y), cx.inp(0)?, cx.out(0)?, d, Arg::I32(bits), Arg::F32(scale)];
            cx.launch(REDUCE, grid_rows(y), args);
        }
        Kernel::Softmax { classes }
        | Kernel::LogSoftmax { classes }
        | Kernel::SoftmaxGrad { classes }
        | Kernel::LogSoftmaxGrad { classes } => {
            let rows = cx.o(0)? / (*classes).max(1);
            let mut args = vec![i64a(rows), Arg::I32(*classes as i32)];
            for k in 0..cx.counts.ins.len() {
                args.push(cx.inp(k)?);
            }
            args.push(cx.out(0)?);
            let entry = match kernel {
                Kernel::Softmax { .. } => SOFTMAX,
                Kernel::LogSoftmax { .. } => LOG_SOFTMAX,
                Kernel::SoftmaxGrad { .. } => SOFTMAX_GRAD,
                _ => LOG_SOFTMAX_GRAD,
            };
            cx.launch(entry, grid_rows(rows), args);
        }
        Kernel::SparseSoftmaxXent { classes } | Kernel::SoftmaxXent { classes } => {
            let rows = cx.i(0)? / (*classes).max(1);
            let mut args = vec![i64a(rows), Arg::I32(*classes as i32), cx.inp(0)?, cx.inp(1)?, cx.out(0)?, cx.out(1)?];
            let entry = if matches!(kernel, Kernel::SparseSoftmaxXent { .. }) {
                args.push(Arg::Null); // no scale
                SPARSE_SOFTMAX_XENT
            } else {
                SOFTMAX_XENT
            };
            cx.launch(entry, grid_rows(rows), args);
        }
        Kernel::SparseSoftmaxXentMeanGrad { classes } => {
            // The scaled cross-entropy, then the loss's mean and the bias
            // gradient as the reduce family's kernels.
            let (rows, c) = (cx.i(0)? / (*classes).max(1), *classes);
            let args = vec![i64a(rows), Arg::I32(c as i32), cx.inp(0)?, cx.inp(1)?, cx.out(0)?, cx.out(2)?, cx.inp(2)?];
            cx.launch(SPARSE_SOFTMAX_XENT, grid_rows(rows), args);
            let scale = 1.0 / rows.max(1) as f32;
            let args = vec![i64a(1), cx.out(0)?, cx.out(1)?, cx.d4(&[rows], 1)?, Arg::I32(0b1000), Arg::F32(scale)];
            cx.launch(REDUCE, grid_rows(1), args);
            let (x, y) = (cx.out(2)?, cx.out(3)?);
            column_sums(cx, rows, c, x, y);
        }
        Kernel::L2Loss => {
            let args = vec![i64a(cx.i(0)?), cx.inp(0)?, cx.out(0)?];
            cx.launch(L2_LOSS, 1, args);
        }
        Kernel::ArgMax { shape, axis } => {
            let n = |s: &[usize]| s.iter().product::<usize>();
            let (outer, len, inner) = (n(&shape[..*axis]), shape[*axis], n(&shape[axis + 1..]));
            let args = vec![i64a(outer), i64a(len), i64a(inner), cx.inp(0)?, cx.out(0)?];
            cx.launch(ARGMAX, grid_1d(outer * inner), args);
        }
        Kernel::Equal { dtype } => {
            let y = cx.o(0)?;
            let entry = if *dtype == DType::F32 { EQUAL_F32 } else { EQUAL_I32 };
            cx.launch(entry, grid_1d(y), vec![i64a(y), cx.inp(0)?, cx.inp(1)?, cx.out(0)?]);
        }
        Kernel::Cast { from, to } => {
            let y = cx.o(0)?;
            let entry = match (from, to) {
                (DType::F32, DType::I32) => CAST_F32_I32,
                (DType::I32 | DType::Bool, DType::F32) => CAST_I32_F32,
                (DType::F32, DType::Bool) => CAST_F32_BOOL,
                (_, DType::Bool) => CAST_I32_BOOL,
                _ => COPY_U32,
            };
            cx.launch(entry, grid_1d(y), vec![i64a(y), cx.inp(0)?, cx.out(0)?]);
        }
        Kernel::BatchNormTrain { channels, epsilon } => {
            let (x, c) = (cx.i(0)?, *channels);
            let rows = x / c.max(1);
            let args = vec![i64a(rows), i64a(c), Arg::F32(*epsilon), cx.inp(0)?, cx.out(1)?, cx.out(2)?, cx.out(3)?];
            cx.launch(BATCH_NORM_STATS, grid_rows(c), args);
            let args = vec![i64a(x), i64a(c), cx.inp(0)?, cx.inp(1)?, cx.inp(2)?, cx.out(1)?, cx.out(2)?, cx.out(0)?];
            cx.launch(BATCH_NORM_APPLY, grid_1d(x), args);
        }
        Kernel::BatchNormInfer { channels, epsilon } => {
            let x = cx.i(0)?;
            let mut args = vec![i64a(x), i64a(*channels), Arg::F32(*epsilon)];
            for k in 0..5 {
                args.push(cx.inp(k)?);
            }
            for k in 0..4 {
                args.push(cx.out(k)?);
            }
            cx.launch(BATCH_NORM_INFER, grid_1d(x), args);
        }
        Kernel::BatchNormGrad { channels } => {
            let (x, c) = (cx.i(1)?, *channels);
            let rows = x / c.max(1);
            let (dy, xp, mean, inv_std) = (cx.inp(0)?, cx.inp(1)?, cx.inp(3)?, cx.inp(4)?);
            let (dx, dgamma, dbeta) = (cx.out(0)?, cx.out(1)?, cx.out(2)?);
            let args = vec![
                i64a(rows),
                i64a(c),
                dy.clone(),
                xp.clone(),
                mean.clone(),
                inv_std.clone(),
                dgamma.clone(),
                dbeta.clone(),
            ];
            cx.launch(BATCH_NORM_GRAD_REDUCE, grid_rows(c), args);
            let args = vec![i64a(x), i64a(c), dy, xp, cx.inp(2)?, mean, inv_std, dgamma, dbeta, dx];
            cx.launch(BATCH_NORM_GRAD_DX, grid_1d(x), args);
        }
        _ => return Ok(false),
    }
    Ok(true)
}
