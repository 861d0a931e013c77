//! The pooling family's descriptor (max and average pools, their
//! gradients, and the max pool's gradient fused with the activation and
//! bias gradients): operands, CUDA launches and plan text and CPU dispatch, in one place
//! (see [`crate::family`]). One grid-stride launch each.

use crate::family::prelude::*;
use crate::pool;
use crate::reduce::desc::bias_grad;

entries! { "pool";
    MAX_POOL = "towers_max_pool_f32";
    AVG_POOL = "towers_avg_pool_f32";
    MAX_POOL_GRAD = "towers_max_pool_grad_f32";
    AVG_POOL_GRAD = "towers_avg_pool_grad_f32";
}

/// The pool family.
pub(crate) static DESC: Desc = Desc {
    name: "pool",
    cuda: Some(CudaFile { path: "pool/pool.cu", text: include_str!("pool.cu") }),
    entries: ENTRIES,
    declare,
    lower,
    text,
    run,
    backend_workspace: no_workspace,
};

fn declare(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    match k {
        Kernel::MaxPool { geom } | Kernel::AvgPool { geom } => {
            let (x, y) = pool_lens(geom)?;
            pool_params(b, geom, false);
            b.input("x", F32, Len::Exact(x), "n*h*w*c");
            b.output("y", F32, Len::Exact(y), "n*out_h*out_w*c");
        }
        Kernel::MaxPoolGrad { geom } => {
            let (x, y) = pool_lens(geom)?;
            pool_params(b, geom, false);
            b.input("x", F32, Len::Exact(x), "n*h*w*c");
            b.input("y", F32, Len::Exact(y), "n*out_h*out_w*c");
            b.input("dy", F32, Len::Exact(y), "n*out_h*out_w*c");
            b.output("dx", F32, Len::Exact(x), "n*h*w*c");
        }
        Kernel::MaxPoolGradActBiasGrad { geom, act } => {
            let (x, y) = pool_lens(geom)?;
            pool_params(b, geom, false);
            b.param("act", act.name());
            b.input("x", F32, Len::Exact(x), "n*h*w*c");
            b.input("y", F32, Len::Exact(y), "n*out_h*out_w*c");
            b.input("dy", F32, Len::Exact(y), "n*out_h*out_w*c");
            b.input("act_y", F32, Len::Exact(x), "n*h*w*c");
            b.output("dx", F32, Len::Exact(x), "n*h*w*c");
            b.output("db", F32, Len::Exact(geom.c), "c (the bias gradient)");
        }
        Kernel::AvgPoolGrad { geom } => {
            let (x, y) = pool_lens(geom)?;
            pool_params(b, geom, false);
            b.input("dy", F32, Len::Exact(y), "n*out_h*out_w*c");
            b.output("dx", F32, Len::Exact(x), "n*h*w*c");
        }
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    match kernel {
        Kernel::MaxPoolGradActBiasGrad { geom, act } => {
            // The pool gradient into dx, then the activation and bias
            // gradients in place on it (dy = dx).
            let dx = cx.o(0)?;
            let args = vec![Arg::Pool(geom.into()), cx.inp(0)?, cx.inp(1)?, cx.inp(2)?, cx.out(0)?];
            cx.launch(MAX_POOL_GRAD, grid_1d(dx), args);
            let ops = [cx.out(0)?, cx.inp(3)?, cx.out(0)?, cx.out(1)?];
            bias_grad(cx, act.code(), dx / geom.c.max(1), geom.c, ops);
        }
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
        Kernel::MaxPool { geom } => pool::max_pool(geom, i(0), o(0)),
        Kernel::MaxPoolGrad { geom } => pool::max_pool_grad(geom, i(0), i(1), i(2), o(0)),
        Kernel::MaxPoolGradActBiasGrad { geom, act } => {
            pool::max_pool_grad_act_bias_grad(geom, i(0), i(1), i(2), *act, i(3), o(0), o(1))
        }
        Kernel::AvgPool { geom } => pool::avg_pool(geom, i(0), o(0)),
        Kernel::AvgPoolGrad { geom } => pool::avg_pool_grad(geom, i(0), o(0)),
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn text(k: &Kernel) -> Result<String, Foreign> {
    Ok(match k {
        Kernel::MaxPoolGradActBiasGrad { geom, act } => format!("{} {}", pool_text(geom), act.name()),
        Kernel::MaxPool { geom }
        | Kernel::MaxPoolGrad { geom }
        | Kernel::AvgPool { geom }
        | Kernel::AvgPoolGrad { geom } => pool_text(geom),
        _ => return Err(Foreign::of(k, DESC.name)),
    })
}

pub(crate) fn pool_params(b: &mut Builder, g: &PoolGeom, fused: bool) {
    const PLAIN: [&str; 9] = ["n", "h", "w", "c", "kh", "kw", "stride_h", "stride_w", "padding"];
    const FUSED: [&str; 9] = [
        "pool_n",
        "pool_h",
        "pool_w",
        "pool_c",
        "pool_kh",
        "pool_kw",
        "pool_stride_h",
        "pool_stride_w",
        "pool_padding",
    ];
    let names = if fused { &FUSED } else { &PLAIN };
    for (n, v) in names.iter().zip([g.n, g.h, g.w, g.c, g.kh, g.kw, g.stride_h, g.stride_w]) {
        b.param(n, v);
    }
    b.param(names[8], padding(g.padding));
}

/// Lengths of a pool's x and y.
pub(crate) fn pool_lens(g: &PoolGeom) -> Result<(usize, usize), ParamError> {
    let oh = window(g.h, g.kh, g.stride_h, g.padding)?;
    let ow = window(g.w, g.kw, g.stride_w, g.padding)?;
    Ok((prod(&[g.n, g.h, g.w, g.c], "n*h*w*c")?, prod(&[g.n, oh, ow, g.c], "n*out_h*out_w*c")?))
}
