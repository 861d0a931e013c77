//! Data movement along an axis for shapes of rank <= 4: `concat`, `split`,
//! `slice` and `slice_grad`, all as strided copies of contiguous runs.
//!
//! Along `axis`, a shape is viewed as `[outer, shape[axis], inner]`; each
//! input of a concat contributes a run of `shape[axis] * inner` elements per
//! outer index.

pub mod desc;
use crate::shape::{numel, pad4};
use crate::KernelError;

fn outer_inner(shape: &[usize], axis: usize) -> (usize, usize) {
    (shape[..axis].iter().product(), shape[axis + 1..].iter().product())
}

fn check_axis(op: &'static str, rank: usize, axis: usize) -> Result<(), KernelError> {
    if axis >= rank {
        return Err(KernelError::BadAxis { op, axis, rank });
    }
    if rank > 4 {
        return Err(KernelError::RankTooLarge { op, rank, max: 4 });
    }
    Ok(())
}

/// Concatenates `inputs` (with shapes `shapes`, equal except along `axis`)
/// along `axis` into `out`. Errors: bad axis or mismatched shapes.
pub fn concat(inputs: &[&[f32]], shapes: &[&[usize]], axis: usize, out: &mut [f32]) -> Result<(), KernelError> {
    debug_assert_eq!(inputs.len(), shapes.len());
    let Some(first) = shapes.first() else {
        return Ok(());
    };
    check_axis("concat", first.len(), axis)?;
    for s in shapes {
        let same =
            s.len() == first.len() && s.iter().zip(first.iter()).enumerate().all(|(i, (a, b))| i == axis || a == b);
        if !same {
            return Err(KernelError::IncompatibleShapes { op: "concat", a: first.to_vec(), b: s.to_vec() });
        }
    }
    let (outer, inner) = outer_inner(first, axis);
    let total: usize = shapes.iter().map(|s| s[axis] * inner).sum();
    debug_assert_eq!(out.len(), outer * total);
    let mut off = 0;
    for (x, s) in inputs.iter().zip(shapes) {
        let run = s[axis] * inner;
        debug_assert_eq!(x.len(), outer * run);
        for o in 0..outer {
            out[o * total + off..o * total + off + run].copy_from_slice(&x[o * run..(o + 1) * run]);
        }
        off += run;
    }
    Ok(())
}

/// Splits `x: shape` along `axis` into pieces of `sizes[i]` (summing to
/// `shape[axis]`), written to `outs[i]`. Errors: bad axis or sizes.
pub fn split(
    x: &[f32],
    shape: &[usize],
    axis: usize,
    sizes: &[usize],
    outs: &mut [&mut [f32]],
) -> Result<(), KernelError> {
    check_axis("split", shape.len(), axis)?;
    if sizes.iter().sum::<usize>() != shape[axis] || sizes.len() != outs.len() {
        return Err(KernelError::IncompatibleShapes { op: "split", a: shape.to_vec(), b: sizes.to_vec() });
    }
    let (outer, inner) = outer_inner(shape, axis);
    let total = shape[axis] * inner;
    debug_assert_eq!(x.len(), outer * total);
    let mut off = 0;
    for (y, s) in outs.iter_mut().zip(sizes) {
        let run = s * inner;
        debug_assert_eq!(y.len(), outer * run);
        for o in 0..outer {
            y[o * run..(o + 1) * run].copy_from_slice(&x[o * total + off..o * total + off + run]);
        }
        off += run;
    }
    Ok(())
}

/// Padded (shape, begin, size) of a slice window.
type Window4 = ([usize; 4], [usize; 4], [usize; 4]);

/// Validates a slice window and returns padded (shape, begin, size).
fn window4(op: &'static str, shape: &[usize], begin: &[usize], size: &[usize]) -> Result<Window4, KernelError> {
    let s = pad4(op, shape)?;
    if begin.len() != shape.len()
        || size.len() != shape.len()
        || (0..shape.len()).any(|i| begin[i] + size[i] > shape[i])
    {
        return Err(KernelError::IncompatibleShapes {
            op,
            a: shape.to_vec(),
            b: begin.iter().chain(size).cloned().collect(),
        });
    }
    let off = 4 - shape.len();
    let (mut b, mut z) = ([0; 4], [1; 4]);
    b[off..].copy_from_slice(begin);
    z[off..].copy_from_slice(size);
    Ok((s, b, z))
}

/// Calls `f(src_offset, dst_offset, run)` for each contiguous innermost run.
fn for_runs(s: [usize; 4], b: [usize; 4], z: [usize; 4], mut f: impl FnMut(usize, usize, usize)) {
    let mut d = 0;
    for i0 in 0..z[0] {
        for i1 in 0..z[1] {
            for i2 in 0..z[2] {
                let src = (((b[0] + i0) * s[1] + b[1] + i1) * s[2] + b[2] + i2) * s[3] + b[3];
                f(src, d, z[3]);
                d += z[3];
            }
        }
    }
}

/// `out = x[begin .. begin + size]` (TF `Slice`); `out` has shape `size`.
pub fn slice(x: &[f32], shape: &[usize], begin: &[usize], size: &[usize], out: &mut [f32]) -> Result<(), KernelError> {
    let (s, b, z) = window4("slice", shape, begin, size)?;
    debug_assert_eq!(x.len(), numel(shape));
    debug_assert_eq!(out.len(), numel(size));
    for_runs(s, b, z, |src, dst, run| out[dst..dst + run].copy_from_slice(&x[src..src + run]));
    Ok(())
}

/// Gradient of [`slice`]: `dx` (shape `shape`) is zero except the window,
/// which receives `dy` (shape `size`).
pub fn slice_grad(
    dy: &[f32],
    shape: &[usize],
    begin: &[usize],
    size: &[usize],
    dx: &mut [f32],
) -> Result<(), KernelError> {
    let (s, b, z) = window4("slice_grad", shape, begin, size)?;
    debug_assert_eq!(dx.len(), numel(shape));
    debug_assert_eq!(dy.len(), numel(size));
    dx.fill(0.0);
    for_runs(s, b, z, |src, dst, run| dx[src..src + run].copy_from_slice(&dy[dst..dst + run]));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iota(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32).collect()
    }

    #[test]
    fn concat_split_roundtrip() {
        // [2, 2] ++ [2, 3] along axis 1.
        let a = iota(4);
        let b: Vec<f32> = iota(6).iter().map(|v| v + 10.0).collect();
        let mut out = vec![0.0; 10];
        concat(&[&a, &b], &[&[2, 2], &[2, 3]], 1, &mut out).unwrap();
        assert_eq!(out, vec![0.0, 1.0, 10.0, 11.0, 12.0, 2.0, 3.0, 13.0, 14.0, 15.0]);
        let (mut p, mut q) = (vec![0.0; 4], vec![0.0; 6]);
        split(&out, &[2, 5], 1, &[2, 3], &mut [&mut p, &mut q]).unwrap();
        assert_eq!((p, q), (a.clone(), b.clone()));
        // Axis 0 is plain appending.
        let mut out = vec![0.0; 8];
        concat(&[&a, &a], &[&[2, 2], &[2, 2]], 0, &mut out).unwrap();
        assert_eq!(out, [a.clone(), a.clone()].concat());
        assert!(concat(&[&a, &b], &[&[2, 2], &[3, 2]], 1, &mut out).is_err());
        assert!(split(&out, &[2, 4], 1, &[1, 2], &mut [&mut [0.0; 2], &mut [0.0; 4]]).is_err());
    }

    #[test]
    fn slice_and_grad() {
        let shape = [2, 3, 4];
        let x = iota(24);
        let (begin, size) = ([1, 1, 1], [1, 2, 2]);
        let mut out = vec![0.0; 4];
        slice(&x, &shape, &begin, &size, &mut out).unwrap();
        // x[1, 1..3, 1..3] = 12 + 4*j + k
        assert_eq!(out, vec![17.0, 18.0, 21.0, 22.0]);
        let mut dx = vec![f32::NAN; 24];
        slice_grad(&out, &shape, &begin, &size, &mut dx).unwrap();
        for (i, v) in dx.iter().enumerate() {
            let want = if [17, 18, 21, 22].contains(&i) { i as f32 } else { 0.0 };
            assert_eq!(*v, want);
        }
        assert!(slice(&x, &shape, &[1, 2, 0], &[1, 2, 1], &mut out).is_err());
    }
}
