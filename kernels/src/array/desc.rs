//! The array family's descriptor (issue 22: one_hot, transpose, pad,
//! gather, tile and their gradients): operands, CUDA launches, plan text
//! and CPU dispatch, in one place (see [`crate::family`]). Indices are i32, data f32
//! (a transpose moves any 4-byte element), rank <= 4 where the kernels pad
//! shapes to rank 4. A gather index outside its range is not checked on
//! the GPU: gather writes 0 for it and gather_grad drops its row (TF's GPU
//! behaviour; the CPU backend fails with TF's error instead).

use crate::array;
use crate::family::prelude::*;

entries! { "array";
    ONE_HOT = "towers_one_hot_f32";
    TRANSPOSE = "towers_transpose_f32";
    PAD = "towers_pad_f32";
    GATHER = "towers_gather_f32";
    GATHER_GRAD = "towers_gather_grad_f32";
    TILE = "towers_tile_f32";
    TILE_GRAD = "towers_tile_grad_f32";
}

/// The array family.
pub(crate) static DESC: Desc = Desc {
    name: "array",
    cuda: Some(CudaFile { path: "array/array.cu", text: include_str!("array.cu") }),
    entries: ENTRIES,
    declare,
    lower,
    text,
    run,
    backend_workspace: no_workspace,
};

fn declare(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    let rank4 = |shape: &[usize]| {
        ensure(shape.len() <= 4, || format!("shape {} has rank above 4, the kernels' limit", dims(shape)))
    };
    match k {
        Kernel::OneHot { depth, on, off } => {
            b.param("depth", depth);
            b.param("on", on);
            b.param("off", off);
            b.input("indices", I32, Len::Any, "");
            let why = format!("the indices' count times depth {depth}");
            b.output("y", F32, Len::Times { of: IN0, factor: *depth }, why);
        }
        Kernel::Transpose { shape, perm } => {
            rank4(shape)?;
            let ok = perm.len() == shape.len() && (0..shape.len()).all(|a| perm.contains(&a));
            ensure(ok, || format!("perm {} is not a permutation of the axes of {}", dims(perm), dims(shape)))?;
            b.param("shape", dims(shape));
            b.param("perm", dims(perm));
            let n = Len::Exact(prod(shape, "shape")?);
            b.input("x", DTypeRule::Any, n, "the shape's element count");
            b.output("y", DTypeRule::Like(IN0), n, "the shape's element count");
        }
        Kernel::Pad { shape, before, out_shape, value } => {
            rank4(shape)?;
            let inside = before.len() == shape.len()
                && out_shape.len() == shape.len()
                && (0..shape.len()).all(|d| before[d].checked_add(shape[d]).is_some_and(|e| e <= out_shape[d]));
            ensure(inside, || format!("{} at {} is not inside {}", dims(shape), dims(before), dims(out_shape)))?;
            b.param("shape", dims(shape));
            b.param("before", dims(before));
            b.param("out_shape", dims(out_shape));
            b.param("value", value);
            b.input("x", F32, Len::Exact(prod(shape, "shape")?), format!("shape {}", dims(shape)));
            let out = prod(out_shape, "out_shape")?;
            b.output("y", F32, Len::Exact(out), format!("out_shape {}", dims(out_shape)));
        }
        Kernel::Gather { outer, limit, inner, count } | Kernel::GatherGrad { outer, limit, inner, count } => {
            let params = prod(&[*outer, *limit, *inner], "outer*limit*inner")?;
            let gathered = prod(&[*outer, *count, *inner], "outer*count*inner")?;
            for (n, v) in [("outer", outer), ("limit", limit), ("inner", inner), ("count", count)] {
                b.param(n, v);
            }
            let gather = matches!(k, Kernel::Gather { .. });
            let (x, y) = if gather { (params, gathered) } else { (gathered, params) };
            b.input(if gather { "params" } else { "dy" }, F32, Len::Exact(x), "the parameters' shapes");
            b.input("indices", I32, Len::Exact(*count), "count indices");
            b.output(if gather { "y" } else { "dparams" }, F32, Len::Exact(y), "the parameters' shapes");
        }
        Kernel::Tile { shape, multiples } | Kernel::TileGrad { shape, multiples } => {
            rank4(shape)?;
            ensure(multiples.len() == shape.len(), || {
                format!("{} multiples for shape {}", multiples.len(), dims(shape))
            })?;
            let mut tiled = Vec::with_capacity(shape.len());
            for (d, m) in shape.iter().zip(multiples) {
                tiled.push(count(d.checked_mul(*m), "the tiled shape")?);
            }
            b.param("shape", dims(shape));
            b.param("multiples", dims(multiples));
            let (small, big) = (prod(shape, "shape")?, prod(&tiled, "the tiled shape")?);
            let tile = matches!(k, Kernel::Tile { .. });
            let (x, y) = if tile { (small, big) } else { (big, small) };
            b.input(if tile { "x" } else { "dy" }, F32, Len::Exact(x), "the parameters' shapes");
            b.output(if tile { "y" } else { "dx" }, F32, Len::Exact(y), "the parameters' shapes");
        }
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    let y = cx.o(0)?;
    let mut a = vec![i64a(y)];
    let entry = match kernel {
        Kernel::OneHot { depth, on, off } => {
            a.extend([i64a(*depth), Arg::F32(*on), Arg::F32(*off), cx.inp(0)?, cx.out(0)?]);
            ONE_HOT
        }
        Kernel::Transpose { shape, perm } => {
            let s = cx.dims(shape, 1)?;
            let st = [s.d[1] * s.d[2] * s.d[3], s.d[2] * s.d[3], s.d[3], 1];
            let off = 4 - shape.len();
            let (mut od, mut src) = (Dims4 { d: [1; 4] }, Dims4 { d: [0; 4] });
            for k in 0..4 {
                let p = if k < off { Some(k) } else { perm.get(k - off).map(|p| off + p) };
                let from = p.ok_or(LaunchError::Rank { kernel: cx.name, rank: perm.len() })?.min(3);
                od.d[k] = s.d[from];
                src.d[k] = st[from];
            }
            a.extend([cx.inp(0)?, cx.out(0)?, Arg::Dims4(od), Arg::Dims4(src)]);
            TRANSPOSE
        }
        Kernel::Pad { shape, before, out_shape, value } => {
            a.extend([cx.inp(0)?, cx.out(0)?, cx.d4(out_shape, 1)?, cx.d4(before, 0)?, cx.d4(shape, 1)?]);
            a.push(Arg::F32(*value));
            PAD
        }
        Kernel::Gather { limit, inner, count, .. } | Kernel::GatherGrad { limit, inner, count, .. } => {
            a.extend([i64a(*limit), i64a(*inner), i64a(*count), cx.inp(0)?, cx.inp(1)?, cx.out(0)?]);
            if matches!(kernel, Kernel::Gather { .. }) {
                GATHER
            } else {
                GATHER_GRAD
            }
        }
        Kernel::Tile { shape, multiples } => {
            let tiled: Vec<usize> = shape.iter().zip(multiples).map(|(d, m)| d * m).collect();
            a.extend([cx.inp(0)?, cx.out(0)?, cx.d4(&tiled, 1)?, cx.d4(shape, 1)?]);
            TILE
        }
        Kernel::TileGrad { shape, multiples } => {
            a.extend([cx.inp(0)?, cx.out(0)?, cx.d4(shape, 1)?, cx.d4(multiples, 1)?]);
            TILE_GRAD
        }
        other => return Err(Foreign::of(other, DESC.name).into()),
    };
    cx.launch(entry, grid_1d(y), a);
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
        Kernel::OneHot { depth, on, off } => array::one_hot(ii(0), *depth, *on, *off, o(0)),
        Kernel::Transpose { shape, perm } => array::transpose(i(0), shape, perm, o(0))?,
        Kernel::Pad { shape, before, out_shape, value } => array::pad(i(0), shape, before, out_shape, *value, o(0))?,
        Kernel::Gather { outer, limit, inner, .. } => array::gather(i(0), ii(1), *outer, *limit, *inner, o(0))?,
        Kernel::GatherGrad { outer, limit, inner, .. } => {
            array::gather_grad(i(0), ii(1), *outer, *limit, *inner, o(0))?
        }
        Kernel::Tile { shape, multiples } => array::tile(i(0), shape, multiples, o(0))?,
        Kernel::TileGrad { shape, multiples } => array::tile_grad(i(0), shape, multiples, o(0))?,
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn text(k: &Kernel) -> Result<String, Foreign> {
    Ok(match k {
        Kernel::OneHot { depth, on, off } => format!("depth={depth} on={on} off={off}"),
        Kernel::Transpose { shape, perm } => format!("{} perm={}", dims(shape), list(perm)),
        Kernel::Pad { shape, before, out_shape, value } => {
            format!("{} -> {} before={} value={value}", dims(shape), dims(out_shape), dims(before))
        }
        Kernel::Gather { outer, limit, inner, count } | Kernel::GatherGrad { outer, limit, inner, count } => {
            format!("outer={outer} limit={limit} inner={inner} count={count}")
        }
        Kernel::Tile { shape, multiples } | Kernel::TileGrad { shape, multiples } => {
            format!("{} multiples={}", dims(shape), list(multiples))
        }
        _ => return Err(Foreign::of(k, DESC.name)),
    })
}
