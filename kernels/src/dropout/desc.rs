//! The dropout family's descriptor: operands, CUDA launch and plan text and CPU dispatch,
//! in one place (see [`crate::family`]). Element `i` draws its mask from
//! `(seed, step, elem_offset + i)`.

use crate::dropout;
use crate::family::prelude::*;

entries! { "dropout";
    DROPOUT = "towers_dropout_f32";
}

/// The dropout family.
pub(crate) static DESC: Desc = Desc {
    name: "dropout",
    cuda: Some(CudaFile { path: "dropout/dropout.cu", text: include_str!("dropout.cu") }),
    entries: ENTRIES,
    declare,
    lower,
    text,
    run,
    backend_workspace: no_workspace,
};

fn declare(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    match k {
        Kernel::Dropout { keep_prob, seed, elem_offset } => {
            b.param("keep_prob", keep_prob);
            b.param("seed", seed);
            b.param("elem_offset", elem_offset);
            // Element i draws from counter elem_offset + i, which must not overflow.
            let limit = (u64::MAX as usize).saturating_sub(*elem_offset);
            b.input("x", F32, Len::AtMost(limit), format!("elem_offset {elem_offset} plus the length overflows"));
            b.output("y", F32, Len::Like(IN0), "");
            b.output("mask", F32, Len::Like(IN0), "");
        }
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    match kernel {
        Kernel::Dropout { keep_prob, seed, elem_offset } => {
            let y = cx.o(0)?;
            let args = vec![
                i64a(y),
                Arg::F32(*keep_prob),
                Arg::U64(*seed),
                Arg::Step,
                Arg::U64(*elem_offset as u64),
                cx.inp(0)?,
                cx.out(0)?,
                cx.out(1)?,
            ];
            cx.launch(DROPOUT, grid_1d(y), args);
        }
        _ => return Err(Foreign::of(kernel, DESC.name).into()),
    }
    Ok(())
}

/// The CPU body of one of this family's kernels on a launch's operands.
///
/// # Safety
/// As [`Io`].
unsafe fn run(k: &Kernel, io: &dyn Io, _lists: &mut Lists<'_>, step: u64) -> Result<(), CpuError> {
    let i = |n: usize| io.f32(n);
    let o = |n: usize| io.out_f32(n);
    match k {
        Kernel::Dropout { keep_prob, seed, elem_offset } => {
            dropout::dropout(i(0), *keep_prob, *seed, step, *elem_offset, o(0), o(1))
        }
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn text(k: &Kernel) -> Result<String, Foreign> {
    Ok(match k {
        Kernel::Dropout { keep_prob, seed, elem_offset } => {
            format!("keep_prob={keep_prob} seed={seed} offset={elem_offset}")
        }
        _ => return Err(Foreign::of(k, DESC.name)),
    })
}
