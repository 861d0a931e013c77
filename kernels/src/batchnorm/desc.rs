//! The batch-norm family's descriptor (train, infer and gradient,
//! channels last, `[rows, channels]`): operands, CUDA launches, plan text
//! and CPU dispatch, in one place (see [`crate::family`]).

use crate::batchnorm;
use crate::family::prelude::*;

entries! { "batchnorm";
    BATCH_NORM_STATS = "towers_batch_norm_stats_f32";
    BATCH_NORM_APPLY = "towers_batch_norm_apply_f32";
    BATCH_NORM_INFER = "towers_batch_norm_infer_f32";
    BATCH_NORM_GRAD_REDUCE = "towers_batch_norm_grad_reduce_f32";
    BATCH_NORM_GRAD_DX = "towers_batch_norm_grad_dx_f32";
}

/// The batchnorm family.
pub(crate) static DESC: Desc = Desc {
    name: "batchnorm",
    cuda: Some(CudaFile { path: "batchnorm/batchnorm.cu", text: include_str!("batchnorm.cu") }),
    entries: ENTRIES,
    declare,
    lower,
    text,
    run,
    backend_workspace: no_workspace,
};

fn declare(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    let (Kernel::BatchNormTrain { channels, .. }
    | Kernel::BatchNormInfer { channels, .. }
    | Kernel::BatchNormGrad { channels }) = k
    else {
        return Err(Foreign::of(k, DESC.name).into());
    };
    positive(*channels, "channels")?;
    b.param("channels", channels);
    let c = Len::Exact(*channels);
    let (ins, outs): (&[&'static str], &[&'static str]) = match k {
        Kernel::BatchNormTrain { epsilon, .. } => {
            b.param("epsilon", epsilon);
            b.input("x", F32, Len::Multiple(*channels), "channels");
            (&["gamma", "beta"], &["batch_mean", "batch_inv_std", "batch_var"])
        }
        Kernel::BatchNormInfer { epsilon, .. } => {
            b.param("epsilon", epsilon);
            b.input("x", F32, Len::Multiple(*channels), "channels");
            (&["gamma", "beta", "moving_mean", "moving_var"], &["mean", "inv_std", "var"])
        }
        _ => {
            b.input("dy", F32, Len::Multiple(*channels), "channels");
            b.input("x", F32, Len::Like(IN0), "");
            (&["gamma", "batch_mean", "batch_inv_std"], &["dgamma", "dbeta"])
        }
    };
    for name in ins {
        b.input(name, F32, c, "channels");
    }
    b.output(if matches!(k, Kernel::BatchNormGrad { .. }) { "dx" } else { "y" }, F32, Len::Like(IN0), "");
    for name in outs {
        b.output(name, F32, c, "channels");
    }
    Ok(())
}

fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    match kernel {
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
        Kernel::BatchNormTrain { epsilon, .. } => {
            batchnorm::batch_norm_train(i(0), i(1), i(2), *epsilon, o(0), o(1), o(3), o(2))
        }
        Kernel::BatchNormInfer { epsilon, .. } => {
            batchnorm::batch_norm_infer(i(0), i(1), i(2), i(3), i(4), *epsilon, o(0), o(1), o(2), o(3))
        }
        Kernel::BatchNormGrad { .. } => batchnorm::batch_norm_grad(i(0), i(1), i(2), i(3), i(4), o(0), o(1), o(2)),
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn text(k: &Kernel) -> Result<String, Foreign> {
    Ok(match k {
        Kernel::BatchNormTrain { channels, epsilon } | Kernel::BatchNormInfer { channels, epsilon } => {
            format!("c={channels} eps={epsilon}")
        }
        Kernel::BatchNormGrad { channels } => format!("c={channels}"),
        _ => return Err(Foreign::of(k, DESC.name)),
    })
}
