//! GEMMs and convolutions: `gemm`, `gemm_bias_act`, the tower products,
//! and the four convolutions as im2col/col2im chunks around GEMMs (the
//! workspace holds one chunk of the column matrix, exactly as the CPU twin
//! chunks them).

use super::entries::*;
use super::{i64a, Arg, Counts, Cx, Gemm, LaunchError, LaunchOp, Lowering, Operand, Which};
use crate::cuda::{grid_1d, ConvArgs, PoolArgs};
use crate::{ConvGeom, Kernel};

/// The most bytes a convolution's column buffer takes (its chunks are
/// sized to fit), unless one row of the column matrix alone is larger.
pub const MAX_WORKSPACE_BYTES: usize = 256 << 20;

/// The f32 a convolution of `geom` stages in its workspace: the whole column
/// matrix up to [`MAX_WORKSPACE_BYTES`] (at least one row); 0 for a
/// pointwise convolution, which needs none.
pub fn conv_workspace_floats(geom: &ConvGeom) -> usize {
    let pointwise = geom.kh == 1 && geom.kw == 1 && geom.stride_h == 1 && geom.stride_w == 1;
    if pointwise || geom.rows() == 0 {
        return 0;
    }
    (geom.rows() * geom.k()).min((MAX_WORKSPACE_BYTES / 4).max(geom.k()))
}

fn at(which: Which, offset: usize) -> Operand {
    Operand { which, offset }
}

#[allow(clippy::too_many_arguments)]
fn gemm(
    m: usize,
    n: usize,
    k: usize,
    (trans_a, trans_b): (bool, bool),
    a: Operand,
    b: Operand,
    c: Operand,
    beta: f32,
) -> Gemm {
    Gemm { m, n, k, trans_a, trans_b, a, b, c, alpha: 1.0, beta }
}

/// A tower product's GEMMs into `c`: one per pair (inputs `2p`, `2p+1`),
/// alpha = the pair's weight, the first writing (beta 0), the others adding.
fn tower_gemms(
    cx: &mut Cx<'_>,
    m: usize,
    n: usize,
    ks: &[usize],
    weights: &[f32],
    t: (bool, bool),
    c: Operand,
) -> Result<(), LaunchError> {
    for (p, (&k, &alpha)) in ks.iter().zip(weights).enumerate() {
        let (a, b) = (cx.operand(Which::In(2 * p), 0)?, cx.operand(Which::In(2 * p + 1), 0)?);
        let beta = if p == 0 { 0.0 } else { 1.0 };
        cx.gemm(Gemm { alpha, ..gemm(m, n, k, t, a, b, c, beta) });
    }
    Ok(())
}

/// Rename the operands of a lowering (the fused update reading the scratch
/// as its gradient).
fn remap(low: &mut Lowering, f: impl Fn(Which) -> Which) {
    for op in &mut low.ops {
        match op {
            LaunchOp::Gemm(g) => {
                for o in [&mut g.a, &mut g.b, &mut g.c] {
                    o.which = f(o.which);
                }
            }
            LaunchOp::Launch(l) => {
                for a in &mut l.args {
                    match a {
                        Arg::Operand(o) => o.which = f(o.which),
                        Arg::Operands(v) => v.iter_mut().for_each(|w| *w = f(*w)),
                        _ => {}
                    }
                }
            }
        }
    }
}

/// Lower `kernel` if it is a GEMM or a convolution; `false` otherwise.
pub(super) fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<bool, LaunchError> {
    match kernel {
        Kernel::MatMul { m, n, k, trans_a, trans_b } | Kernel::MatMulBiasAct { m, n, k, trans_a, trans_b, .. } => {
            let (a, b, c) = (cx.operand(Which::In(0), 0)?, cx.operand(Which::In(1), 0)?, cx.operand(Which::Out(0), 0)?);
            cx.gemm(gemm(*m, *n, *k, (*trans_a, *trans_b), a, b, c, 0.0));
            if let Kernel::MatMulBiasAct { act, .. } = kernel {
                // The fused bias (and activation), in place on the product.
                let y = cx.o(0)?;
                let code = act.map_or(-1, |act| act.code());
                let args = vec![Arg::I32(code), i64a(y), i64a(*n), cx.inp(2)?, cx.out(0)?];
                cx.launch(BIAS_ACT_IN_PLACE, grid_1d(y), args);
            }
        }
        Kernel::TowerMatMul { m, n, ks, trans_a, trans_b, weights } => {
            let c = cx.operand(Which::Out(0), 0)?;
            tower_gemms(cx, *m, *n, ks, weights, (*trans_a, *trans_b), c)?;
        }
        Kernel::TowerMatMulApply { m, n, ks, trans_a, trans_b, weights, apply } => {
            // The product into the launch's own scratch (the workspace, m*n
            // floats), then the update exactly as its own launch lowers,
            // reading the scratch as its gradient.
            let have = cx.ws()?;
            if have < m * n {
                return Err(LaunchError::Workspace { kernel: cx.name, have, need: m * n });
            }
            if !matches!(**apply, Kernel::ApplyGradientDescent {} | Kernel::ApplyMomentum { nesterov: false, .. }) {
                return Err(LaunchError::CannotFuse { kernel: cx.name, inner: apply.name() });
            }
            let c = cx.operand(Which::Workspace, 0)?;
            tower_gemms(cx, *m, *n, ks, weights, (*trans_a, *trans_b), c)?;
            let lr = 2 * ks.len();
            let ins = [m * n, cx.i(lr)?];
            let mut low = super::lower(apply, Counts { ins: &ins, outs: cx.counts.outs, workspace: None })?;
            remap(&mut low, |w| match w {
                Which::In(0) => Which::Workspace,
                Which::In(_) => Which::In(lr),
                other => other,
            });
            cx.low.ops.extend(low.ops);
        }
        Kernel::Conv2D { geom, .. }
        | Kernel::Conv2DBiasAct { geom, .. }
        | Kernel::Conv2DBackpropInput { geom, .. }
        | Kernel::Conv2DBackpropFilter { geom, .. } => conv(kernel, geom, cx)?,
        _ => return Ok(false),
    }
    Ok(true)
}

fn conv(kernel: &Kernel, geom: &ConvGeom, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    let g = ConvArgs::from(geom);
    let (rows, k, co) = (geom.rows(), geom.k(), geom.c_out);
    let (a0, a1, y) = (cx.operand(Which::In(0), 0)?, cx.operand(Which::In(1), 0)?, cx.operand(Which::Out(0), 0)?);
    let forward = matches!(kernel, Kernel::Conv2D { .. } | Kernel::Conv2DBiasAct { .. });
    let need = conv_workspace_floats(geom);
    if need == 0 {
        // x viewed as [rows, c_in] already is the column matrix.
        let (m, n, kk, t) = match kernel {
            _ if forward => (rows, co, k, (false, false)),
            Kernel::Conv2DBackpropInput { .. } => (rows, k, co, (false, true)),
            _ => (k, co, rows, (true, false)),
        };
        cx.gemm(gemm(m, n, kk, t, a0, a1, y, 0.0));
    } else {
        let have = cx.ws()?;
        if have < need {
            return Err(LaunchError::Workspace { kernel: cx.name, have, need });
        }
        let ws = cx.operand(Which::Workspace, 0)?;
        let chunk = need / k.max(1);
        let mut r0 = 0;
        while r0 < rows {
            let r = chunk.min(rows - r0);
            let im2col = |x: Operand| vec![Arg::Conv(g), i64a(r0), i64a(r), Arg::Operand(x), Arg::Operand(ws)];
            match kernel {
                _ if forward => {
                    cx.launch(IM2COL, grid_1d(r * k), im2col(a0));
                    cx.gemm(gemm(r, co, k, (false, false), ws, a1, at(Which::Out(0), r0 * co), 0.0));
                }
                Kernel::Conv2DBackpropInput { .. } => {
                    cx.gemm(gemm(r, k, co, (false, true), at(Which::In(0), r0 * co), a1, ws, 0.0));
                    let args = vec![
                        Arg::Conv(g),
                        i64a(r0),
                        i64a(r),
                        Arg::I32((r0 > 0) as i32),
                        Arg::Operand(ws),
                        Arg::Operand(y),
                    ];
                    cx.launch(COL2IM, grid_1d(geom.x_len()), args);
                }
                _ => {
                    cx.launch(IM2COL, grid_1d(r * k), im2col(a0));
                    let beta = if r0 > 0 { 1.0 } else { 0.0 };
                    cx.gemm(gemm(k, co, r, (true, false), ws, at(Which::In(1), r0 * co), y, beta));
                }
            }
            r0 += r;
        }
    }
    if let Kernel::Conv2DBiasAct { act, pool, .. } = kernel {
        // The bias and activation: one launch over the whole output once
        // its last GEMM wrote it, in place; then the fused max pool.
        let n = cx.o(0)?;
        let args = vec![Arg::I32(act.code()), i64a(n), i64a(co), cx.inp(2)?, cx.out(0)?];
        cx.launch(BIAS_ACT_IN_PLACE, grid_1d(n), args);
        if let Some(pg) = pool {
            let args = vec![Arg::Pool(PoolArgs::from(pg)), cx.out(0)?, cx.out(1)?];
            cx.launch(MAX_POOL, grid_1d(pg.y_len()), args);
        }
    }
    Ok(())
}
