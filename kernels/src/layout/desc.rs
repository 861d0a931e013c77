//! The layout family's descriptor (concat, split, slice and its
//! gradient): operands, CUDA launches (one grid-stride launch each, one per
//! part for concat and split) and plan text and CPU dispatch, in one place (see
//! [`crate::family`]). Layout kernels move any 4-byte element.

use crate::family::prelude::*;
use crate::layout;

entries! { "layout";
    CONCAT_PART = "towers_concat_part_f32";
    SPLIT_PART = "towers_split_part_f32";
    SLICE = "towers_slice_f32";
    SLICE_GRAD = "towers_slice_grad_f32";
}

/// The layout family.
pub(crate) static DESC: Desc = Desc {
    name: "layout",
    cuda: Some(CudaFile { path: "layout/layout.cu", text: include_str!("layout.cu") }),
    entries: ENTRIES,
    declare,
    lower,
    text,
    run,
    backend_workspace: no_workspace,
};

fn declare(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    // Layout kernels move any 4-byte element: every operand has input 0's dtype.
    const LIKE: DTypeRule = DTypeRule::Like(IN0);
    match k {
        Kernel::Concat { axis, shapes } => {
            ensure(!shapes.is_empty(), || "no shapes".into())?;
            let rank = shapes[0].len();
            ensure(*axis < rank, || format!("axis {axis} is out of range for rank {rank}"))?;
            b.param("axis", axis);
            let mut total = 0usize;
            for (i, s) in shapes.iter().enumerate() {
                let same =
                    s.len() == rank && s.iter().zip(&shapes[0]).enumerate().all(|(d, (a, b))| d == *axis || a == b);
                ensure(same, || format!("shape {} does not match {} outside axis {axis}", dims(s), dims(&shapes[0])))?;
                total = count(total.checked_add(s[*axis]), "the concatenated axis")?;
                let dt = if i == 0 { DTypeRule::Any } else { LIKE };
                let x = op("x", Role::Read, dt, Len::Exact(prod(s, "a shape")?), format!("shape {}", dims(s)));
                b.inputs(vec![OperandSig { index: Some(i), ..x }], 1);
            }
            let mut out = shapes[0].clone();
            out[*axis] = total;
            b.output("y", LIKE, Len::Exact(prod(&out, "the output shape")?), format!("shape {}", dims(&out)));
        }
        Kernel::Split { axis, shape, sizes } => {
            ensure(!sizes.is_empty(), || "no sizes".into())?;
            ensure(*axis < shape.len(), || format!("axis {axis} is out of range for {}", dims(shape)))?;
            let sum = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
            ensure(sum == Some(shape[*axis]), || {
                format!("sizes {} do not add up to dimension {axis} of {}", dims(sizes), dims(shape))
            })?;
            b.param("axis", axis);
            b.param("shape", dims(shape));
            b.param("sizes", dims(sizes));
            b.input("x", DTypeRule::Any, Len::Exact(prod(shape, "shape")?), format!("shape {}", dims(shape)));
            for (i, &s) in sizes.iter().enumerate() {
                let mut part = shape.clone();
                part[*axis] = s;
                let y =
                    op("y", Role::Write, LIKE, Len::Exact(prod(&part, "a part")?), format!("shape {}", dims(&part)));
                b.outputs(vec![OperandSig { index: Some(i), ..y }], 1);
            }
        }
        Kernel::Slice { shape, begin, size } | Kernel::SliceGrad { shape, begin, size } => {
            let inside = begin.len() == shape.len()
                && size.len() == shape.len()
                && (0..shape.len()).all(|d| begin[d].checked_add(size[d]).is_some_and(|e| e <= shape[d]));
            ensure(inside, || {
                format!("window begin={} size={} is not inside {}", dims(begin), dims(size), dims(shape))
            })?;
            b.param("shape", dims(shape));
            b.param("begin", dims(begin));
            b.param("size", dims(size));
            let (whole, window) = (prod(shape, "shape")?, prod(size, "size")?);
            let slice = matches!(k, Kernel::Slice { .. });
            let (x, y) = if slice { (whole, window) } else { (window, whole) };
            b.input(if slice { "x" } else { "dy" }, DTypeRule::Any, Len::Exact(x), "the parameters' shapes");
            b.output(if slice { "y" } else { "dx" }, LIKE, Len::Exact(y), "the parameters' shapes");
        }
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    match kernel {
        Kernel::Concat { axis, shapes } => {
            cx.o(0)?;
            let first = shapes.first().ok_or(LaunchError::NoInputs { kernel: cx.name })?;
            let (outer, inner) = (numel(&first[..*axis]), numel(&first[axis + 1..]));
            let total: usize = shapes.iter().map(|s| s[*axis]).sum::<usize>() * inner;
            let mut off = 0;
            for (k, s) in shapes.iter().enumerate() {
                let run = s[*axis] * inner;
                let args = vec![i64a(outer), i64a(run), i64a(total), i64a(off), cx.inp(k)?, cx.out(0)?];
                cx.launch(CONCAT_PART, grid_1d(outer * run), args);
                off += run;
            }
        }
        Kernel::Split { axis, shape, sizes } => {
            let (outer, inner) = (numel(&shape[..*axis]), numel(&shape[axis + 1..]));
            let total = shape[*axis] * inner;
            let mut off = 0;
            for (k, s) in sizes.iter().enumerate() {
                let run = s * inner;
                let args = vec![i64a(outer), i64a(run), i64a(total), i64a(off), cx.inp(0)?, cx.out(k)?];
                cx.launch(SPLIT_PART, grid_1d(outer * run), args);
                off += run;
            }
        }
        Kernel::Slice { shape, begin, size } | Kernel::SliceGrad { shape, begin, size } => {
            let y = cx.o(0)?;
            let args = vec![i64a(y), cx.inp(0)?, cx.out(0)?, cx.d4(shape, 1)?, cx.d4(begin, 0)?, cx.d4(size, 1)?];
            let entry = if matches!(kernel, Kernel::Slice { .. }) { SLICE } else { SLICE_GRAD };
            cx.launch(entry, grid_1d(y), args);
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
        Kernel::Concat { axis, shapes: s } => {
            let out = o(0);
            lists.f32s.with((0..io.counts().0).map(|k| io.f32(k)), |xs| {
                lists.dims.with(s.iter().map(|d| d.as_slice()), |ss| layout::concat(xs, ss, *axis, out))
            })?;
        }
        Kernel::Split { axis, shape, sizes } => {
            let x = i(0);
            lists
                .muts
                .with((0..io.counts().1).map(|j| io.out_f32(j)), |ys| layout::split(x, shape, *axis, sizes, ys))?;
        }
        Kernel::Slice { shape, begin, size } => layout::slice(i(0), shape, begin, size, o(0))?,
        Kernel::SliceGrad { shape, begin, size } => layout::slice_grad(i(0), shape, begin, size, o(0))?,
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn text(k: &Kernel) -> Result<String, Foreign> {
    Ok(match k {
        Kernel::Concat { axis, shapes } => {
            format!("axis={axis} {}", shapes.iter().map(|s| dims(s)).collect::<Vec<_>>().join("+"))
        }
        Kernel::Split { axis, shape, sizes } => format!("axis={axis} {} sizes={}", dims(shape), list(sizes)),
        Kernel::Slice { shape, begin, size } | Kernel::SliceGrad { shape, begin, size } => {
            format!("{} begin={} size={}", dims(shape), dims(begin), dims(size))
        }
        _ => return Err(Foreign::of(k, DESC.name)),
    })
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}
