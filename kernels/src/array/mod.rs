//! Array ops of issue 22 (TF1 names): `one_hot`, `transpose`, `pad`,
//! `gather` and its gradient (an unsorted segment sum), `tile` and its
//! gradient. CPU bodies here, the CUDA twins in `array.cu`.
//!
//! Invariants:
//! - every body is a plain loop over its output (or, for the gradients of
//!   gather and tile, over the incoming gradient in row-major order) and
//!   allocates nothing;
//! - `transpose`, `pad`, `tile` and `tile_grad` take shapes of rank <= 4
//!   (padded with leading 1s, as the layout family), and fail with
//!   [`KernelError::RankTooLarge`] above;
//! - indices are i32. `gather` and `gather_grad` fail with
//!   [`KernelError::IndexOutOfRange`] on an index outside `[0, limit)`
//!   (TF's CPU error, "indices[3] = 12 is not in [0, 10)"), before writing
//!   anything; `one_hot` gives an all-`off` row for such an index, as TF;
//! - the gradients sum each output element's contributions in increasing
//!   order of the incoming gradient's index, the order the CUDA twins use,
//!   so both give the same bits (no atomics).

pub mod desc;
use crate::shape::{numel, pad4};
use crate::KernelError;

/// `out[i, d] = on if indices[i] == d else off`, `out: [indices.len(), depth]`
/// (TF `one_hot` with axis -1). An index outside `[0, depth)` gives a row of `off`.
pub fn one_hot(indices: &[i32], depth: usize, on: f32, off: f32, out: &mut [f32]) {
    debug_assert_eq!(out.len(), indices.len() * depth);
    for (row, &k) in out.chunks_exact_mut(depth.max(1)).zip(indices) {
        row.fill(off);
        if k >= 0 && (k as usize) < depth {
            row[k as usize] = on;
        }
    }
}

/// Row-major strides of a rank-4 shape.
fn strides4(d: &[usize; 4]) -> [usize; 4] {
    [d[1] * d[2] * d[3], d[2] * d[3], d[3], 1]
}

/// Calls `f(out_index, coords)` for every element of the rank-4 shape `d`, in row-major order.
fn each4(d: [usize; 4], mut f: impl FnMut(usize, [usize; 4])) {
    let mut i = 0;
    for a in 0..d[0] {
        for b in 0..d[1] {
            for c in 0..d[2] {
                for e in 0..d[3] {
                    f(i, [a, b, c, e]);
                    i += 1;
                }
            }
        }
    }
}

/// Validates `perm` for `shape` and pads both to rank 4.
fn perm4(shape: &[usize], perm: &[usize]) -> Result<([usize; 4], [usize; 4]), KernelError> {
    let s = pad4("transpose", shape)?;
    let r = shape.len();
    let mut seen = [false; 4];
    if perm.len() != r {
        return Err(KernelError::IncompatibleShapes { op: "transpose", a: shape.to_vec(), b: perm.to_vec() });
    }
    let off = 4 - r;
    let mut p = [0, 1, 2, 3];
    for (k, &a) in perm.iter().enumerate() {
        if a >= r || seen[a] {
            return Err(KernelError::BadAxis { op: "transpose", axis: a, rank: r });
        }
        seen[a] = true;
        p[off + k] = off + a;
    }
    Ok((s, p))
}

/// `y = transpose(x, perm)`: output axis k is input axis `perm[k]` (TF `transpose`).
pub fn transpose(x: &[f32], shape: &[usize], perm: &[usize], y: &mut [f32]) -> Result<(), KernelError> {
    let (s, p) = perm4(shape, perm)?;
    debug_assert_eq!(x.len(), numel(shape));
    debug_assert_eq!(y.len(), x.len());
    let st = strides4(&s);
    let od = [s[p[0]], s[p[1]], s[p[2]], s[p[3]]];
    let src = [st[p[0]], st[p[1]], st[p[2]], st[p[3]]];
    each4(od, |i, c| y[i] = x[c[0] * src[0] + c[1] * src[1] + c[2] * src[2] + c[3] * src[3]]);
    Ok(())
}

/// The padded rank-4 (shape, before, out shape) of a pad, checked.
fn pad_geom(
    op: &'static str,
    shape: &[usize],
    before: &[usize],
    out_shape: &[usize],
) -> Result<([usize; 4], [usize; 4], [usize; 4]), KernelError> {
    let (s, o) = (pad4(op, shape)?, pad4(op, out_shape)?);
    let fits = before.len() == shape.len()
        && out_shape.len() == shape.len()
        && (0..shape.len()).all(|i| before[i].checked_add(shape[i]).is_some_and(|e| e <= out_shape[i]));
    if !fits {
        return Err(KernelError::IncompatibleShapes { op, a: shape.to_vec(), b: out_shape.to_vec() });
    }
    let mut b = [0; 4];
    b[4 - before.len()..].copy_from_slice(before);
    Ok((s, b, o))
}

/// `y` (shape `out_shape`) = `value` everywhere except the window at
/// `before`, which holds `x` (shape `shape`): TF `pad`, mode CONSTANT.
pub fn pad(
    x: &[f32],
    shape: &[usize],
    before: &[usize],
    out_shape: &[usize],
    value: f32,
    y: &mut [f32],
) -> Result<(), KernelError> {
    let (s, b, o) = pad_geom("pad", shape, before, out_shape)?;
    debug_assert_eq!(x.len(), numel(shape));
    debug_assert_eq!(y.len(), numel(out_shape));
    y.fill(value);
    let yst = strides4(&o);
    each4(s, |i, c| {
        let at = (0..4).map(|k| (c[k] + b[k]) * yst[k]).sum::<usize>();
        y[at] = x[i];
    });
    Ok(())
}

/// Checks every index against `[0, limit)`: TF's error for the first one outside.
fn check_indices(op: &'static str, indices: &[i32], limit: usize) -> Result<(), KernelError> {
    match indices.iter().position(|&k| k < 0 || k as usize >= limit) {
        Some(position) => Err(KernelError::IndexOutOfRange { op, position, index: indices[position], limit }),
        None => Ok(()),
    }
}

/// `out[o, j, i] = params[o, indices[j], i]` with params viewed as
/// `[outer, limit, inner]` and `out` as `[outer, indices.len(), inner]`
/// (TF `gather` along the axis of size `limit`).
pub fn gather(
    params: &[f32],
    indices: &[i32],
    outer: usize,
    limit: usize,
    inner: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_indices("gather", indices, limit)?;
    debug_assert_eq!(params.len(), outer * limit * inner);
    debug_assert_eq!(out.len(), outer * indices.len() * inner);
    let n = indices.len();
    for o in 0..outer {
        for (j, &k) in indices.iter().enumerate() {
            let src = (o * limit + k as usize) * inner;
            let dst = (o * n + j) * inner;
            out[dst..dst + inner].copy_from_slice(&params[src..src + inner]);
        }
    }
    Ok(())
}

/// Gradient of [`gather`]: `dparams` (`[outer, limit, inner]`) is zero
/// except `dparams[o, indices[j], i] += dy[o, j, i]`, summed in increasing
/// `j` (TF's `UnsortedSegmentSum` into zeros; a repeated index sums its rows).
pub fn gather_grad(
    dy: &[f32],
    indices: &[i32],
    outer: usize,
    limit: usize,
    inner: usize,
    dparams: &mut [f32],
) -> Result<(), KernelError> {
    check_indices("gather_grad", indices, limit)?;
    debug_assert_eq!(dy.len(), outer * indices.len() * inner);
    debug_assert_eq!(dparams.len(), outer * limit * inner);
    dparams.fill(0.0);
    let n = indices.len();
    for o in 0..outer {
        for (j, &k) in indices.iter().enumerate() {
            let dst = (o * limit + k as usize) * inner;
            let src = (o * n + j) * inner;
            for (d, s) in dparams[dst..dst + inner].iter_mut().zip(&dy[src..src + inner]) {
                *d += *s;
            }
        }
    }
    Ok(())
}

/// The padded rank-4 (shape, multiples, out shape) of a tile.
fn tile_geom(op: &'static str, shape: &[usize], multiples: &[usize]) -> Result<[[usize; 4]; 3], KernelError> {
    let s = pad4(op, shape)?;
    if multiples.len() != shape.len() {
        return Err(KernelError::IncompatibleShapes { op, a: shape.to_vec(), b: multiples.to_vec() });
    }
    let mut m = [1; 4];
    m[4 - multiples.len()..].copy_from_slice(multiples);
    Ok([s, m, [s[0] * m[0], s[1] * m[1], s[2] * m[2], s[3] * m[3]]])
}

/// `y[c] = x[c mod shape]`, `y`'s shape `shape[i] * multiples[i]` (TF `tile`).
pub fn tile(x: &[f32], shape: &[usize], multiples: &[usize], y: &mut [f32]) -> Result<(), KernelError> {
    let [s, _, o] = tile_geom("tile", shape, multiples)?;
    debug_assert_eq!(x.len(), numel(shape));
    debug_assert_eq!(y.len(), numel(&o));
    let st = strides4(&s);
    each4(o, |i, c| y[i] = x[(0..4).map(|k| (c[k] % s[k]) * st[k]).sum::<usize>()]);
    Ok(())
}

/// Gradient of [`tile`]: `dx[c] = Σ dy` over the copies of element `c`,
/// summed in row-major order of `dy` (`dx` has shape `shape`).
pub fn tile_grad(dy: &[f32], shape: &[usize], multiples: &[usize], dx: &mut [f32]) -> Result<(), KernelError> {
    let [s, _, o] = tile_geom("tile_grad", shape, multiples)?;
    debug_assert_eq!(dx.len(), numel(shape));
    debug_assert_eq!(dy.len(), numel(&o));
    dx.fill(0.0);
    let st = strides4(&s);
    each4(o, |i, c| dx[(0..4).map(|k| (c[k] % s[k]) * st[k]).sum::<usize>()] += dy[i]);
    Ok(())
}

#[cfg(test)]
mod tests;
