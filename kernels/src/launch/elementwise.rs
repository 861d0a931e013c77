//! Elementwise launches: unary and binary ops (codes from the op tables),
//! the bias adds, the generated fused kernels, sums of several inputs and
//! broadcasts. One grid-stride launch each, block `BLOCK`, grid `grid_1d(n)`.

use super::entries::*;
use super::{i64a, Arg, Cx, Entry, LaunchError, Which};
use crate::cuda::grid_1d;
use crate::Kernel;

/// `s` right-aligned against rank `rank` (padded with 1 on the left).
fn pad_to(s: &[usize], rank: usize) -> Vec<usize> {
    let mut v = vec![1; rank.saturating_sub(s.len())];
    v.extend_from_slice(s);
    v
}

/// Lower `kernel` if it is elementwise; `false` otherwise.
pub(super) fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<bool, LaunchError> {
    match kernel {
        Kernel::Binary { op, a_shape, b_shape, out_shape } => {
            let y = cx.o(0)?;
            let r = out_shape.len();
            let args = vec![
                Arg::I32(op.code()),
                i64a(y),
                cx.inp(0)?,
                cx.inp(1)?,
                cx.out(0)?,
                cx.d4(out_shape, 1)?,
                cx.strides(&pad_to(a_shape, r))?,
                cx.strides(&pad_to(b_shape, r))?,
            ];
            cx.launch(BINARY, grid_1d(y), args);
        }
        Kernel::Fused { expr, in_shapes, out_shape } => {
            // The generated kernel of this expression (its own module).
            let g = crate::cuda::fused_source(expr);
            let y = cx.o(0)?;
            let mut args = vec![i64a(y), cx.d4(out_shape, 1)?];
            for (k, s) in in_shapes.iter().enumerate() {
                args.push(cx.inp(k)?);
                args.push(cx.strides(s)?);
            }
            args.push(cx.out(0)?);
            cx.launch(Entry { family: g.source.family, name: g.entry }, grid_1d(y), args);
        }
        Kernel::AddN { .. } | Kernel::WeightedSum { .. } => {
            let y = cx.o(0)?;
            let n = cx.counts.ins.len();
            let mut args = vec![i64a(y), Arg::I32(n as i32), Arg::Operands((0..n).map(Which::In).collect())];
            let entry = if let Kernel::WeightedSum { weights } = kernel {
                args.push(Arg::F32s(weights.clone()));
                WEIGHTED_SUM
            } else {
                ADD_N
            };
            args.push(cx.out(0)?);
            cx.launch(entry, grid_1d(y), args);
        }
        Kernel::BiasAdd { channels } => {
            let y = cx.o(0)?;
            let args = vec![i64a(y), i64a(*channels), cx.inp(0)?, cx.inp(1)?, cx.out(0)?];
            cx.launch(BIAS_ADD, grid_1d(y), args);
        }
        Kernel::BiasAddAct { channels, act } => {
            let y = cx.o(0)?;
            let args = vec![Arg::I32(act.code()), i64a(y), i64a(*channels), cx.inp(0)?, cx.inp(1)?, cx.out(0)?];
            cx.launch(BIAS_ADD_ACT, grid_1d(y), args);
        }
        Kernel::Unary { op } => {
            let y = cx.o(0)?;
            let args = vec![Arg::I32(op.code()), i64a(y), cx.inp(0)?, cx.out(0)?];
            cx.launch(UNARY, grid_1d(y), args);
        }
        Kernel::UnaryGrad { op } => {
            let dx = cx.o(0)?;
            let args = vec![Arg::I32(op.code()), i64a(dx), cx.inp(0)?, cx.inp(1)?, cx.out(0)?];
            cx.launch(UNARY_GRAD, grid_1d(dx), args);
        }
        Kernel::BroadcastTo { x_shape, out_shape } => {
            let y = cx.o(0)?;
            let xs = pad_to(x_shape, out_shape.len());
            let args = vec![i64a(y), cx.inp(0)?, cx.out(0)?, cx.d4(out_shape, 1)?, cx.strides(&xs)?];
            cx.launch(BROADCAST_TO, grid_1d(y), args);
        }
        Kernel::Fill { value } => {
            let y = cx.o(0)?;
            cx.launch(FILL, grid_1d(y), vec![i64a(y), Arg::F32(*value), cx.out(0)?]);
        }
        _ => return Ok(false),
    }
    Ok(true)
}
