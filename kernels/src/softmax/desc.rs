//! The softmax family's descriptor (softmax, log-softmax, their gradients
//! and the cross entropies, on rows of `classes`): operands, CUDA launches
//! and plan text and CPU dispatch, in one place (see [`crate::family`]). One block per row.

use crate::family::prelude::*;
use crate::reduce::desc::column_sums;
use crate::reduce::desc::REDUCE;
use crate::softmax;

entries! { "softmax";
    SOFTMAX = "towers_softmax_f32";
    LOG_SOFTMAX = "towers_log_softmax_f32";
    SOFTMAX_GRAD = "towers_softmax_grad_f32";
    LOG_SOFTMAX_GRAD = "towers_log_softmax_grad_f32";
    SPARSE_SOFTMAX_XENT = "towers_sparse_softmax_xent_f32";
    SOFTMAX_XENT = "towers_softmax_xent_f32";
}

/// The softmax family.
pub(crate) static DESC: Desc = Desc {
    name: "softmax",
    cuda: Some(CudaFile { path: "softmax/softmax.cu", text: include_str!("softmax.cu") }),
    entries: ENTRIES,
    declare,
    lower,
    text,
    run,
    backend_workspace: no_workspace,
};

fn declare(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    match k {
        Kernel::Softmax { classes } | Kernel::LogSoftmax { classes } => {
            positive(*classes, "classes")?;
            b.param("classes", classes);
            b.input("x", F32, Len::Multiple(*classes), "classes");
            b.output("y", F32, Len::Like(IN0), "");
        }
        Kernel::SoftmaxGrad { classes } | Kernel::LogSoftmaxGrad { classes } => {
            positive(*classes, "classes")?;
            b.param("classes", classes);
            b.input("dy", F32, Len::Multiple(*classes), "classes");
            b.input("y", F32, Len::Like(IN0), "");
            b.output("dx", F32, Len::Like(IN0), "");
        }
        Kernel::SparseSoftmaxXentMeanGrad { classes } => {
            positive(*classes, "classes")?;
            let rows = Len::Rows { of: IN0, per_row: *classes };
            b.param("classes", classes);
            b.input("logits", F32, Len::Multiple(*classes), "classes");
            b.input("labels", I32, rows, "one label per row");
            b.input("scale", F32, Len::Exact(1), "a scalar scale");
            b.output("loss", F32, rows, "one loss per row");
            b.output("mean", F32, Len::Exact(1), "the loss's mean");
            b.output("dlogits", F32, Len::Like(IN0), "the logits' length");
            b.output("db", F32, Len::Exact(*classes), "classes (the bias gradient)");
        }
        Kernel::SparseSoftmaxXent { classes } | Kernel::SoftmaxXent { classes } => {
            positive(*classes, "classes")?;
            let sparse = matches!(k, Kernel::SparseSoftmaxXent { .. });
            let rows = Len::Rows { of: IN0, per_row: *classes };
            b.param("classes", classes);
            b.input("logits", F32, Len::Multiple(*classes), "classes");
            if sparse {
                b.input("labels", I32, rows, "one label per row");
            } else {
                b.input("labels", F32, Len::Like(IN0), "one distribution per row");
            }
            b.output("loss", F32, rows, "one loss per row");
            b.output("backprop", F32, Len::Like(IN0), "the logits' length");
        }
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    match kernel {
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
    let ii = |n: usize| io.i32(n);
    let o = |n: usize| io.out_f32(n);
    match k {
        Kernel::Softmax { classes } => softmax::softmax(i(0), *classes, o(0)),
        Kernel::LogSoftmax { classes } => softmax::log_softmax(i(0), *classes, o(0)),
        Kernel::SoftmaxGrad { classes } => softmax::softmax_grad(i(0), i(1), *classes, o(0)),
        Kernel::LogSoftmaxGrad { classes } => softmax::log_softmax_grad(i(0), i(1), *classes, o(0)),
        Kernel::SparseSoftmaxXent { classes } => {
            softmax::sparse_softmax_cross_entropy(i(0), ii(1), *classes, o(0), o(1))?
        }
        Kernel::SparseSoftmaxXentMeanGrad { classes } => {
            softmax::sparse_softmax_xent_mean_grad(i(0), ii(1), *classes, i(2)[0], o(0), o(1), o(2), o(3))?
        }
        Kernel::SoftmaxXent { classes } => softmax::softmax_cross_entropy(i(0), i(1), *classes, o(0), o(1)),
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn text(k: &Kernel) -> Result<String, Foreign> {
    Ok(match k {
        Kernel::Softmax { classes }
        | Kernel::LogSoftmax { classes }
        | Kernel::SoftmaxGrad { classes }
        | Kernel::LogSoftmaxGrad { classes }
        | Kernel::SparseSoftmaxXent { classes }
        | Kernel::SparseSoftmaxXentMeanGrad { classes }
        | Kernel::SoftmaxXent { classes } => format!("classes={classes}"),
        _ => return Err(Foreign::of(k, DESC.name)),
    })
}
