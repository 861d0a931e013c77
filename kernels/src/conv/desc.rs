//! The convolution family's descriptor: operands, CUDA lowering (im2col
//! / col2im chunks around cuBLAS GEMMs; the workspace holds one chunk of
//! the column matrix, exactly as the CPU twin chunks them) and plan text and CPU dispatch,
//! in one place (see [`crate::family`]).

use crate::conv;
use crate::elementwise::desc::BIAS_ACT_IN_PLACE;
use crate::family::prelude::*;
use crate::pool::desc::MAX_POOL;
use crate::pool::desc::{pool_lens, pool_params};

entries! { "conv";
    IM2COL = "towers_im2col_f32";
    COL2IM = "towers_col2im_f32";
}

/// The conv family.
pub(crate) static DESC: Desc = Desc {
    name: "conv",
    cuda: Some(CudaFile { path: "conv/conv.cu", text: include_str!("conv.cu") }),
    entries: ENTRIES,
    declare,
    lower,
    text,
    run,
    backend_workspace,
};

fn declare(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    match k {
        Kernel::Conv2D { geom, workspace_len } => {
            let c = conv_sig(b, geom, *workspace_len)?;
            b.input("x", F32, Len::Exact(c.x), "n*h*w*c_in");
            b.input("filter", F32, Len::Exact(c.filter), "kh*kw*c_in*c_out");
            b.output("y", F32, Len::Exact(c.y), "n*out_h*out_w*c_out");
        }
        Kernel::Conv2DBiasAct { geom, workspace_len, act, pool } => {
            let c = conv_sig(b, geom, *workspace_len)?;
            b.param("act", act.name());
            b.input("x", F32, Len::Exact(c.x), "n*h*w*c_in");
            b.input("filter", F32, Len::Exact(c.filter), "kh*kw*c_in*c_out");
            b.input("bias", F32, Len::Exact(geom.c_out), "c_out (the bias)");
            b.output("y", F32, Len::Exact(c.y), "n*out_h*out_w*c_out");
            if let Some(pg) = pool {
                let (px, py) = pool_lens(pg)?;
                ensure(px == c.y && pg.n == geom.n && pg.c == geom.c_out, || {
                    "the pool's input must be the convolution's output".into()
                })?;
                pool_params(b, pg, true);
                b.output("pooled", F32, Len::Exact(py), "the pool's n*out_h*out_w*c");
            }
        }
        Kernel::Conv2DBackpropInput { geom, workspace_len } => {
            let c = conv_sig(b, geom, *workspace_len)?;
            b.input("dy", F32, Len::Exact(c.y), "n*out_h*out_w*c_out");
            b.input("filter", F32, Len::Exact(c.filter), "kh*kw*c_in*c_out");
            b.output("dx", F32, Len::Exact(c.x), "n*h*w*c_in");
        }
        Kernel::Conv2DBackpropFilter { geom, workspace_len } => {
            let c = conv_sig(b, geom, *workspace_len)?;
            b.input("x", F32, Len::Exact(c.x), "n*h*w*c_in");
            b.input("dy", F32, Len::Exact(c.y), "n*out_h*out_w*c_out");
            b.output("dfilter", F32, Len::Exact(c.filter), "kh*kw*c_in*c_out");
        }
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    match kernel {
        Kernel::Conv2D { geom, .. }
        | Kernel::Conv2DBiasAct { geom, .. }
        | Kernel::Conv2DBackpropInput { geom, .. }
        | Kernel::Conv2DBackpropFilter { geom, .. } => conv(kernel, geom, cx)?,
        _ => return Err(Foreign::of(kernel, DESC.name).into()),
    }
    Ok(())
}

/// The CPU body of one of this family's kernels on a launch's operands.
///
/// # Safety
/// As [`Io`].
unsafe fn run(k: &Kernel, io: &dyn Io, _lists: &mut Lists<'_>, _step: u64) -> Result<(), CpuError> {
    let i = |n: usize| io.f32(n);
    let o = |n: usize| io.out_f32(n);
    match k {
        Kernel::Conv2D { geom, .. } => conv::conv2d(geom, i(0), i(1), o(0), io.ws()),
        Kernel::Conv2DBiasAct { geom, act, pool: None, .. } => {
            conv::conv2d_bias_act(geom, i(0), i(1), i(2), *act, o(0), io.ws())
        }
        Kernel::Conv2DBiasAct { geom, act, pool: Some(pool), .. } => {
            conv::conv2d_bias_act_max_pool(geom, i(0), i(1), i(2), *act, pool, o(0), o(1), io.ws())
        }
        Kernel::Conv2DBackpropInput { geom, .. } => conv::conv2d_backprop_input(geom, i(0), i(1), o(0), io.ws()),
        Kernel::Conv2DBackpropFilter { geom, .. } => conv::conv2d_backprop_filter(geom, i(0), i(1), o(0), io.ws()),
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn text(k: &Kernel) -> Result<String, Foreign> {
    Ok(match k {
        Kernel::Conv2DBiasAct { geom, act, pool: None, .. } => format!("{} {}", conv_text(geom), act.name()),
        Kernel::Conv2DBiasAct { geom, act, pool: Some(p), .. } => {
            format!("{} {} +max_pool {}", conv_text(geom), act.name(), pool_text(p))
        }
        Kernel::Conv2D { geom, .. }
        | Kernel::Conv2DBackpropInput { geom, .. }
        | Kernel::Conv2DBackpropFilter { geom, .. } => conv_text(geom),
        _ => return Err(Foreign::of(k, DESC.name)),
    })
}

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

/// Lengths of a convolution's x, filter and y.
struct ConvLens {
    x: usize,
    filter: usize,
    y: usize,
}

/// A convolution's lengths, its parameters and its workspace, checked
/// against `workspace_len`.
fn conv_sig(b: &mut Builder, g: &ConvGeom, workspace_len: usize) -> Result<ConvLens, ParamError> {
    let oh = window(g.h, g.kh, g.stride_h, g.padding)?;
    let ow = window(g.w, g.kw, g.stride_w, g.padding)?;
    let x = prod(&[g.n, g.h, g.w, g.c_in], "n*h*w*c_in")?;
    let filter = prod(&[g.kh, g.kw, g.c_in, g.c_out], "kh*kw*c_in*c_out")?;
    let y = prod(&[g.n, oh, ow, g.c_out], "n*out_h*out_w*c_out")?;
    prod(&[g.n, oh, ow, g.kh, g.kw, g.c_in.max(1)], "the column matrix")?;
    // Every product above is in range, so the kernel's own arithmetic is too.
    let expected = g.workspace_len();
    ensure(workspace_len == expected, || {
        format!("workspace_len {workspace_len} is not the geometry's workspace of {expected} f32 elements")
    })?;
    for (n, v) in [("n", g.n), ("h", g.h), ("w", g.w), ("c_in", g.c_in), ("kh", g.kh), ("kw", g.kw)] {
        b.param(n, v);
    }
    for (n, v) in [("c_out", g.c_out), ("stride_h", g.stride_h), ("stride_w", g.stride_w)] {
        b.param(n, v);
    }
    b.param("padding", padding(g.padding));
    b.param("workspace_len", workspace_len);
    b.workspace(expected);
    Ok(ConvLens { x, filter, y })
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
        cx.gemm(sgemm(m, n, kk, t, a0, a1, y, 0.0));
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
                    cx.gemm(sgemm(r, co, k, (false, false), ws, a1, at(Which::Out(0), r0 * co), 0.0));
                }
                Kernel::Conv2DBackpropInput { .. } => {
                    cx.gemm(sgemm(r, k, co, (false, true), at(Which::In(0), r0 * co), a1, ws, 0.0));
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
                    cx.gemm(sgemm(k, co, r, (true, false), ws, at(Which::In(1), r0 * co), y, beta));
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

/// A convolution stages its column matrix on CUDA ([`conv_workspace_floats`];
/// the backend's stream buffer is at least this large, shared by the
/// stream's convolutions).
fn backend_workspace(k: &Kernel) -> Option<usize> {
    match k {
        Kernel::Conv2D { geom, .. }
        | Kernel::Conv2DBiasAct { geom, .. }
        | Kernel::Conv2DBackpropInput { geom, .. }
        | Kernel::Conv2DBackpropFilter { geom, .. } => Some(conv_workspace_floats(geom)),
        _ => None,
    }
}
