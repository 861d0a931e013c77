//! The reduce family's descriptor (sums, maxima and minima over axes, argmax, comparisons,
//! casts), and the reduce `.cu`'s shared launches (the activation and bias
//! gradients in one or two stages, column sums) that other families call:
//! operands, CUDA launches and plan text and CPU dispatch, in one place (see
//! [`crate::family`]). Reductions run one block per output (grid
//! `grid_rows`), elementwise tails `grid_1d`.

use crate::family::prelude::*;
use crate::reduce;

entries! { "reduce";
    UNARY_GRAD_BIAS_GRAD = "towers_unary_grad_bias_grad_f32";
    UNARY_GRAD_BIAS_PARTIAL = "towers_unary_grad_bias_partial_f32";
    SUM_PARTIALS = "towers_sum_partials_f32";
    REDUCE = "towers_reduce_f32";
    REDUCE_EXTREME = "towers_reduce_extreme_f32";
    L2_LOSS = "towers_l2_loss_f32";
    ARGMAX = "towers_argmax_f32";
    EQUAL_F32 = "towers_equal_f32";
    EQUAL_I32 = "towers_equal_i32";
    COMPARE_F32 = "towers_compare_f32";
    COMPARE_I32 = "towers_compare_i32";
    SELECT = "towers_select_f32";
    CAST_F32_I32 = "towers_cast_f32_i32";
    CAST_I32_F32 = "towers_cast_i32_f32";
    CAST_F32_BOOL = "towers_cast_f32_bool";
    CAST_I32_BOOL = "towers_cast_i32_bool";
    COPY_U32 = "towers_copy_u32";
}

/// The reduce family.
pub(crate) static DESC: Desc = Desc {
    name: "reduce",
    cuda: Some(CudaFile { path: "reduce/reduce.cu", text: include_str!("reduce.cu") }),
    entries: ENTRIES,
    declare,
    lower,
    text,
    run,
    backend_workspace: no_workspace,
};

fn declare(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    match k {
        Kernel::ReduceSum { shape, axes }
        | Kernel::ReduceMean { shape, axes }
        | Kernel::ReduceMax { shape, axes }
        | Kernel::ReduceMin { shape, axes } => {
            let mut kept = shape.clone();
            for (i, &a) in axes.iter().enumerate() {
                ensure(a < shape.len() && !axes[..i].contains(&a), || {
                    format!("axes {} are not distinct axes of {}", dims(axes), dims(shape))
                })?;
                kept[a] = 1;
            }
            b.param("shape", dims(shape));
            b.param("axes", dims(axes));
            b.input("x", F32, Len::Exact(prod(shape, "shape")?), format!("shape {}", dims(shape)));
            let y = prod(&kept, "the kept shape")?;
            b.output("y", F32, Len::Exact(y), format!("shape {} reduced", dims(shape)));
        }
        Kernel::ArgMax { shape, axis } => {
            ensure(*axis < shape.len() && shape[*axis] >= 1 && shape[*axis] <= i32::MAX as usize, || {
                format!("axis {axis} is not a non-empty axis of {}", dims(shape))
            })?;
            let mut kept = shape.clone();
            kept[*axis] = 1;
            b.param("shape", dims(shape));
            b.param("axis", axis);
            b.input("x", F32, Len::Exact(prod(shape, "shape")?), format!("shape {}", dims(shape)));
            let y = prod(&kept, "the kept shape")?;
            b.output("indices", I32, Len::Exact(y), format!("shape {} reduced", dims(shape)));
        }
        Kernel::Equal { dtype } => {
            b.param("dtype", dtype);
            b.input("a", DTypeRule::Is(*dtype), Len::Any, "");
            b.input("b", DTypeRule::Is(*dtype), Len::Like(IN0), "");
            b.output("equal", DTypeRule::Is(DType::Bool), Len::Like(IN0), "");
        }
        Kernel::Compare { cmp, dtype } => {
            ensure(matches!(dtype, DType::F32 | DType::I32), || format!("compare takes f32 or i32, not {dtype}"))?;
            b.param("cmp", cmp.name());
            b.param("dtype", dtype);
            b.input("a", DTypeRule::Is(*dtype), Len::Any, "");
            b.input("b", DTypeRule::Is(*dtype), Len::Like(IN0), "");
            b.output("out", DTypeRule::Is(DType::Bool), Len::Like(IN0), "");
        }
        Kernel::Select { inner } => {
            ensure(*inner >= 1, || "inner must be at least 1".to_string())?;
            b.param("inner", inner);
            b.input("x", F32, Len::Any, "");
            b.input("y", F32, Len::Like(IN0), "x's shape");
            b.input(
                "cond",
                DTypeRule::Is(DType::Bool),
                Len::Rows { of: IN0, per_row: *inner },
                "one per inner elements of x",
            );
            b.output("out", F32, Len::Like(IN0), "");
        }
        Kernel::Cast { from, to } => {
            b.param("from", from);
            b.param("to", to);
            b.input("x", DTypeRule::Is(*from), Len::Any, "");
            b.output("y", DTypeRule::Is(*to), Len::Like(IN0), "");
        }
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    match kernel {
        Kernel::ReduceSum { shape, axes } | Kernel::ReduceMean { shape, axes } => {
            let y = cx.o(0)?;
            let d = cx.d4(shape, 1)?;
            let bits = axes.iter().fold(0, |b, &ax| b | 1 << (4 - shape.len() + ax));
            let count: usize = axes.iter().map(|&ax| shape[ax]).product();
            let scale = if matches!(kernel, Kernel::ReduceMean { .. }) { 1.0 / count.max(1) as f32 } else { 1.0 };
            let args = vec![i64a(y), cx.inp(0)?, cx.out(0)?, d, Arg::I32(bits), Arg::F32(scale)];
            cx.launch(REDUCE, grid_rows(y), args);
        }
        Kernel::ReduceMax { shape, axes } | Kernel::ReduceMin { shape, axes } => {
            let y = cx.o(0)?;
            let d = cx.d4(shape, 1)?;
            let bits = axes.iter().fold(0, |b, &ax| b | 1 << (4 - shape.len() + ax));
            let is_min = matches!(kernel, Kernel::ReduceMin { .. });
            let args = vec![i64a(y), cx.inp(0)?, cx.out(0)?, d, Arg::I32(bits), Arg::I32(is_min as i32)];
            cx.launch(REDUCE_EXTREME, grid_rows(y), args);
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
        Kernel::Compare { cmp, dtype } => {
            let y = cx.o(0)?;
            let entry = if *dtype == DType::F32 { COMPARE_F32 } else { COMPARE_I32 };
            let args = vec![Arg::I32(cmp.code()), i64a(y), cx.inp(0)?, cx.inp(1)?, cx.out(0)?];
            cx.launch(entry, grid_1d(y), args);
        }
        Kernel::Select { inner } => {
            let y = cx.o(0)?;
            let args = vec![i64a(y), i64a(*inner), cx.inp(2)?, cx.inp(0)?, cx.inp(1)?, cx.out(0)?];
            cx.launch(SELECT, grid_1d(y), args);
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
        Kernel::ReduceSum { shape, axes } => reduce::reduce_sum(i(0), shape, axes, o(0))?,
        Kernel::ReduceMean { shape, axes } => reduce::reduce_mean(i(0), shape, axes, o(0))?,
        Kernel::ReduceMax { shape, axes } => reduce::reduce_extreme(i(0), shape, axes, false, o(0))?,
        Kernel::ReduceMin { shape, axes } => reduce::reduce_extreme(i(0), shape, axes, true, o(0))?,
        Kernel::ArgMax { shape, axis } => reduce::argmax(i(0), shape, *axis, io.out_i32(0))?,
        Kernel::Equal { .. } => reduce::equal(view(io, 0), view(io, 1), io.out_i32(0)),
        Kernel::Compare { cmp, .. } => reduce::compare(*cmp, view(io, 0), view(io, 1), io.out_i32(0)),
        Kernel::Select { inner } => reduce::select(io.i32(2), i(0), i(1), *inner, o(0)),
        Kernel::Cast { to, .. } => reduce::cast(view(io, 0), *to, view_mut(io, 0)),
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn text(k: &Kernel) -> Result<String, Foreign> {
    Ok(match k {
        Kernel::ReduceSum { shape, axes }
        | Kernel::ReduceMean { shape, axes }
        | Kernel::ReduceMax { shape, axes }
        | Kernel::ReduceMin { shape, axes } => {
            format!("{} axes={}", dims(shape), list(axes))
        }
        Kernel::ArgMax { shape, axis } => format!("{} axis={axis}", dims(shape)),
        Kernel::Equal { dtype } => dtype.to_string(),
        Kernel::Compare { cmp, dtype } => format!("{} {dtype}", cmp.name()),
        Kernel::Select { inner } => format!("inner={inner}"),
        Kernel::Cast { from, to } => format!("{from} -> {to}"),
        _ => return Err(Foreign::of(k, DESC.name)),
    })
}

/// Row blocks of the two-stage activation and bias gradient: enough to
/// fill a large GPU twice over (132 multiprocessors), from the shapes alone.
pub const BIAS_GRAD_PARTS: usize = 264;

/// Bits of the padded (rank-4) axes that `towers_reduce_f32` sums: those of
/// `x_shape` where the right-aligned `out_shape` has extent 1 and `x` not,
/// or that `out_shape` lacks.
pub(crate) fn reduced_bits_to(x_shape: &[usize], out_shape: &[usize]) -> i32 {
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
pub(crate) fn bias_grad(cx: &mut Cx<'_>, code: i32, rows: usize, c: usize, [dy, y, dx, db]: [Arg; 4]) {
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
pub(crate) fn column_sums(cx: &mut Cx<'_>, rows: usize, c: usize, x: Arg, y: Arg) {
    let args =
        vec![i64a(c), x, y, Arg::Dims4(Dims4 { d: [1, 1, rows as i64, c as i64] }), Arg::I32(0b0100), Arg::F32(1.0)];
    cx.launch(REDUCE, grid_rows(c), args);
}
