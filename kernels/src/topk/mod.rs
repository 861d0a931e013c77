//! Top-k selection along the last axis of `[rows, cols]` (TF's `TopKV2`,
//! `InTopK` and `_TopKGrad`): `top_k`, `in_top_k`, `top_k_grad`. Each row is
//! independent, so a tower holding some rows computes exactly one device's
//! values for them.
//!
//! The order `top_k` sorts by is total, so the CPU and the CUDA twin pick
//! the same elements in the same order whatever their algorithm:
//! - larger values first; equal values (`-0 == +0`) by lower column first
//!   (TF's stable order: `top_k([1, 3, 3], 2)` is values `[3, 3]`, indices
//!   `[1, 2]`);
//! - a NaN ranks above every number (`+inf` included), NaNs by column. TF
//!   leaves NaN's place unspecified (its comparator is not a strict order
//!   with NaN); this is our definition.
//!
//! `in_top_k` follows TF's kernel (`in_topk_op.h`) exactly: row `r` is
//! true iff its target is in `[0, cols)`, every prediction of the row is
//! finite, and fewer than `k` predictions are strictly larger than the
//! target's: ties that straddle the top-k boundary all count as in it.

use std::cmp::Ordering;

use crate::error::KernelError;

/// How `(va, column a)` and `(vb, column b)` of one row compare in the
/// order of the module docs: `Less` when `a` comes first.
pub fn rank_order(va: f32, a: usize, vb: f32, b: usize) -> Ordering {
    let by_value = match (va.is_nan(), vb.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        // Neither is NaN: partial_cmp is total here; -0 and +0 compare equal.
        (false, false) => vb.partial_cmp(&va).unwrap_or(Ordering::Equal),
    };
    by_value.then(a.cmp(&b))
}

/// `values[r, j]`, `indices[r, j]`: the `j`-th of row `r`'s `k` first
/// columns of `x` (`[rows, cols]`) in [`rank_order`] (`1 <= k <= cols`,
/// which the signature checks).
///
/// Each row is scanned once, in column order, keeping the best `k` so far
/// sorted in the outputs themselves (an insertion, so nothing is
/// allocated): O(cols·k) at worst per row. A total order makes the result
/// the first `k` of a full sort, whatever the algorithm.
pub fn top_k(x: &[f32], cols: usize, k: usize, values: &mut [f32], indices: &mut [i32]) {
    if k == 0 || cols == 0 {
        return;
    }
    debug_assert!(k <= cols && values.len() == x.len() / cols * k && indices.len() == values.len());
    for ((row, vals), ix) in x.chunks_exact(cols).zip(values.chunks_exact_mut(k)).zip(indices.chunks_exact_mut(k)) {
        let mut kept = 0;
        for (c, &v) in row.iter().enumerate() {
            if kept == k {
                if rank_order(v, c, vals[k - 1], ix[k - 1] as usize) != Ordering::Less {
                    continue;
                }
                kept -= 1;
            }
            // Later columns never precede an equal earlier one: stable.
            let mut j = kept;
            while j > 0 && rank_order(v, c, vals[j - 1], ix[j - 1] as usize) == Ordering::Less {
                vals[j] = vals[j - 1];
                ix[j] = ix[j - 1];
                j -= 1;
            }
            vals[j] = v;
            ix[j] = c as i32;
            kept += 1;
        }
    }
}

/// `out[r]` (bool as i32 0/1): whether `targets[r]` is in row `r`'s top `k`
/// of `predictions` (`[rows, cols]`), TF's `InTopK` (see the module docs).
pub fn in_top_k(predictions: &[f32], targets: &[i32], cols: usize, k: usize, out: &mut [i32]) {
    debug_assert_eq!(predictions.len(), targets.len() * cols);
    for (r, (o, &t)) in out.iter_mut().zip(targets).enumerate() {
        let row = &predictions[r * cols..(r + 1) * cols];
        *o = in_top_k_row(row, t, k) as i32;
    }
}

fn in_top_k_row(row: &[f32], target: i32, k: usize) -> bool {
    let Some(&p) = usize::try_from(target).ok().and_then(|t| row.get(t)) else {
        return false;
    };
    if !p.is_finite() {
        return false;
    }
    let mut larger = 0usize;
    for &v in row {
        if !v.is_finite() {
            return false;
        }
        larger += (v > p) as usize;
    }
    larger < k
}

/// The gradient of [`top_k`] (TF's `_TopKGrad`): `dx` (`[rows, cols]`) is
/// zero except `dx[r, indices[r, j]] += dvalues[r, j]`, added in increasing
/// `j` from 0.0 (the indices of one row are distinct when they come from
/// `top_k`; a repeated one sums, as TF's `scatter_nd`). An index outside
/// `[0, cols)` is an error.
pub fn top_k_grad(dvalues: &[f32], indices: &[i32], cols: usize, k: usize, dx: &mut [f32]) -> Result<(), KernelError> {
    if let Some(position) = indices.iter().position(|&c| c < 0 || c as usize >= cols) {
        return Err(KernelError::IndexOutOfRange { op: "top_k_grad", position, index: indices[position], limit: cols });
    }
    dx.fill(0.0);
    if k == 0 || cols == 0 {
        return Ok(());
    }
    for ((d, ix), row) in dvalues.chunks_exact(k).zip(indices.chunks_exact(k)).zip(dx.chunks_exact_mut(cols)) {
        for (&g, &c) in d.iter().zip(ix) {
            row[c as usize] += g;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

/// The top-k family's descriptor: operands, CUDA launches, plan text and
/// CPU dispatch, in one place (see [`crate::family`]). `top_k` runs one
/// block per row (`grid_rows`), `in_top_k` one thread per row and
/// `top_k_grad` one thread per element of dx (`grid_1d`).
pub mod desc {
    use crate::family::prelude::*;
    use crate::topk;

    entries! { "topk";
        TOP_K = "towers_top_k_f32";
        IN_TOP_K = "towers_in_top_k_f32";
        TOP_K_GRAD = "towers_top_k_grad_f32";
    }

    /// The top-k family.
    pub(crate) static DESC: Desc = Desc {
        name: "topk",
        cuda: Some(CudaFile { path: "topk/topk.cu", text: include_str!("topk.cu") }),
        entries: ENTRIES,
        declare,
        lower,
        text,
        run,
        backend_workspace: no_workspace,
    };

    fn declare(kernel: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
        match kernel {
            Kernel::TopK { rows, cols, k } | Kernel::TopKGrad { rows, cols, k } => {
                ensure(*k >= 1 && k <= cols && *cols <= i32::MAX as usize, || {
                    format!("k = {k} is not in [1, cols = {cols}] (cols at most 2^31 - 1)")
                })?;
                b.param("rows", rows);
                b.param("cols", cols);
                b.param("k", k);
                let (all, top) = (prod(&[*rows, *cols], "rows*cols")?, prod(&[*rows, *k], "rows*k")?);
                if matches!(kernel, Kernel::TopK { .. }) {
                    b.input("x", F32, Len::Exact(all), "rows*cols");
                    b.output("values", F32, Len::Exact(top), "rows*k");
                    b.output("indices", I32, Len::Exact(top), "rows*k");
                } else {
                    b.input("dvalues", F32, Len::Exact(top), "rows*k");
                    b.input("indices", I32, Len::Exact(top), "rows*k");
                    b.output("dx", F32, Len::Exact(all), "rows*cols");
                }
            }
            Kernel::InTopK { rows, cols, k } => {
                ensure(*cols >= 1 && *cols <= i32::MAX as usize, || format!("cols = {cols} is not in [1, 2^31 - 1]"))?;
                b.param("rows", rows);
                b.param("cols", cols);
                b.param("k", k);
                b.input("predictions", F32, Len::Exact(prod(&[*rows, *cols], "rows*cols")?), "rows*cols");
                b.input("targets", I32, Len::Exact(*rows), "one per row");
                b.output("in_top_k", DTypeRule::Is(DType::Bool), Len::Exact(*rows), "one per row");
            }
            _ => return Err(Foreign::of(kernel, DESC.name).into()),
        }
        Ok(())
    }

    fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
        match kernel {
            Kernel::TopK { rows, cols, k } => {
                let args = vec![i64a(*rows), i64a(*cols), i64a(*k), cx.inp(0)?, cx.out(0)?, cx.out(1)?];
                cx.launch(TOP_K, grid_rows(*rows), args);
            }
            Kernel::InTopK { rows, cols, k } => {
                // k above the columns is "every finite target": clamp it so
                // it fits the kernel's i64 whatever usize it was.
                let k = (*k).min(*cols + 1);
                let args = vec![i64a(*rows), i64a(*cols), i64a(k), cx.inp(0)?, cx.inp(1)?, cx.out(0)?];
                cx.launch(IN_TOP_K, grid_1d(*rows), args);
            }
            Kernel::TopKGrad { rows, cols, k } => {
                let args = vec![i64a(*rows), i64a(*cols), i64a(*k), cx.inp(0)?, cx.inp(1)?, cx.out(0)?];
                cx.launch(TOP_K_GRAD, grid_1d(rows * cols), args);
            }
            _ => return Err(Foreign::of(kernel, DESC.name).into()),
        }
        Ok(())
    }

    /// The CPU body of one of this family's kernels on a launch's operands.
    ///
    /// # Safety
    /// As [`Io`].
    unsafe fn run(kernel: &Kernel, io: &dyn Io, _lists: &mut Lists<'_>, _step: u64) -> Result<(), CpuError> {
        match kernel {
            Kernel::TopK { cols, k, .. } => topk::top_k(io.f32(0), *cols, *k, io.out_f32(0), io.out_i32(1)),
            Kernel::InTopK { cols, k, .. } => topk::in_top_k(io.f32(0), io.i32(1), *cols, *k, io.out_i32(0)),
            Kernel::TopKGrad { cols, k, .. } => topk::top_k_grad(io.f32(0), io.i32(1), *cols, *k, io.out_f32(0))?,
            _ => return Err(Foreign::of(kernel, DESC.name).into()),
        }
        Ok(())
    }

    fn text(kernel: &Kernel) -> Result<String, Foreign> {
        Ok(match kernel {
            Kernel::TopK { rows, cols, k } | Kernel::InTopK { rows, cols, k } | Kernel::TopKGrad { rows, cols, k } => {
                format!("[{rows},{cols}] k={k}")
            }
            _ => return Err(Foreign::of(kernel, DESC.name)),
        })
    }
}
