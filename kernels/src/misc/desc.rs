//! The misc family's descriptor (sums of several inputs, the tower
//! reduction, the L2 loss, fills): operands, CUDA launches and plan text and CPU dispatch,
//! in one place (see [`crate::family`]).

use crate::family::prelude::*;
use crate::init;
use crate::misc;
use crate::reduce::desc::L2_LOSS;

entries! { "misc";
    ADD_N = "towers_add_n_f32";
    WEIGHTED_SUM = "towers_weighted_sum_f32";
    FILL = "towers_fill_f32";
}

/// The misc family.
pub(crate) static DESC: Desc = Desc {
    name: "misc",
    cuda: Some(CudaFile { path: "misc/misc.cu", text: include_str!("misc.cu") }),
    entries: ENTRIES,
    declare,
    lower,
    text,
    run,
    backend_workspace: no_workspace,
};

fn declare(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    match k {
        Kernel::AddN { n } => {
            positive(*n, "n")?;
            b.param("n", n);
            b.inputs(vec![op("x", Role::Read, F32, Len::Like(Ref::output(0)), "")], *n);
            b.output("sum", F32, Len::Any, "");
        }
        Kernel::WeightedSum { weights } => {
            ensure(!weights.is_empty(), || "no weights".into())?;
            b.param("weights", format!("{weights:?}"));
            b.inputs(vec![op("x", Role::Read, F32, Len::Like(Ref::output(0)), "")], weights.len());
            b.output("sum", F32, Len::Any, "");
        }
        Kernel::L2Loss => {
            b.input("x", F32, Len::Any, "");
            b.output("y", F32, Len::Exact(1), "a scalar");
        }
        Kernel::Fill { value } => {
            b.param("value", value);
            b.output("y", F32, Len::Any, "");
        }
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    match kernel {
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
        Kernel::Fill { value } => {
            let y = cx.o(0)?;
            cx.launch(FILL, grid_1d(y), vec![i64a(y), Arg::F32(*value), cx.out(0)?]);
        }
        Kernel::L2Loss => {
            let args = vec![i64a(cx.i(0)?), cx.inp(0)?, cx.out(0)?];
            cx.launch(L2_LOSS, 1, args);
        }
        _ => return Err(Foreign::of(kernel, DESC.name).into()),
    }
    Ok(())
}

/// The CPU body of one of this family's kernels on a launch's operands.
///
/// # Safety
/// As [`Io`].
unsafe fn run(k: &Kernel, io: &dyn Io, lists: &mut Lists<'_>, _step: u64) -> Result<(), CpuError> {
    let i = |n: usize| io.f32(n);
    let o = |n: usize| io.out_f32(n);
    match k {
        Kernel::AddN { .. } => lists.f32s.with((0..io.counts().0).map(|k| io.f32(k)), |xs| misc::add_n(xs, o(0))),
        Kernel::WeightedSum { weights } => {
            lists.f32s.with((0..io.counts().0).map(|k| io.f32(k)), |xs| misc::weighted_sum(xs, weights, o(0)))
        }
        Kernel::L2Loss => o(0)[0] = misc::l2_loss(i(0)),
        Kernel::Fill { value } => init::fill(o(0), *value),
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn text(k: &Kernel) -> Result<String, Foreign> {
    Ok(match k {
        Kernel::AddN { n } => format!("n={n}"),
        Kernel::L2Loss => String::new(),
        Kernel::Fill { value } => format!("value={value}"),
        Kernel::WeightedSum { weights } => format!("w={}", list(weights)),
        _ => return Err(Foreign::of(k, DESC.name)),
    })
}
