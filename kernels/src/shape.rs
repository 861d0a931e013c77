//! Small fixed-rank shape helpers used by the broadcasting and reduction
//! kernels. Shapes are `&[usize]` of rank `<= MAX_RANK`, row-major, and are
//! right-aligned (NumPy) when padded to rank 4 with leading 1s.

use crate::KernelError;

/// Largest rank the shape-generic kernels accept.
pub const MAX_RANK: usize = 4;

/// Number of elements of `shape` (1 for a scalar `[]`).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// `shape` left-padded with 1s to rank 4.
pub(crate) fn pad4(op: &'static str, shape: &[usize]) -> Result<[usize; 4], KernelError> {
    if shape.len() > MAX_RANK {
        return Err(KernelError::RankTooLarge { op, rank: shape.len(), max: MAX_RANK });
    }
    let mut d = [1; 4];
    d[4 - shape.len()..].copy_from_slice(shape);
    Ok(d)
}

/// Row-major strides of a rank-4 shape, with 0 on size-1 axes (so a
/// broadcast read repeats the element).
pub(crate) fn bstrides(d: &[usize; 4]) -> [usize; 4] {
    let mut s = [0; 4];
    let mut acc = 1;
    for i in (0..4).rev() {
        s[i] = if d[i] == 1 { 0 } else { acc };
        acc *= d[i];
    }
    s
}

/// The NumPy broadcast of two shapes, as a rank-4 padded shape, plus the
/// result's true rank (`max(a.len(), b.len())`).
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<([usize; 4], usize), KernelError> {
    let (pa, pb) = (pad4(op, a)?, pad4(op, b)?);
    let mut out = [1; 4];
    for i in 0..4 {
        out[i] = match (pa[i], pb[i]) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(KernelError::IncompatibleShapes { op, a: a.to_vec(), b: b.to_vec() }),
        };
    }
    Ok((out, a.len().max(b.len())))
}

/// Merges adjacent axes of `dims` that share the same flag; returns the
/// merged dims and flags (padded with leading `(1, false)`) so loops see at
/// most 4 alternating runs. Size-1 axes take their neighbour's flag.
pub(crate) fn merge_runs(dims: [usize; 4], flags: [bool; 4]) -> ([usize; 4], [bool; 4]) {
    let mut md: Vec4 = Vec4::default();
    for i in 0..4 {
        if dims[i] == 1 {
            continue;
        }
        md.push(dims[i], flags[i]);
    }
    let mut d = [1; 4];
    let mut f = [false; 4];
    let off = 4 - md.len;
    d[off..].copy_from_slice(&md.d[..md.len]);
    f[off..].copy_from_slice(&md.f[..md.len]);
    (d, f)
}

#[derive(Default)]
struct Vec4 {
    d: [usize; 4],
    f: [bool; 4],
    len: usize,
}

impl Vec4 {
    fn push(&mut self, d: usize, f: bool) {
        if self.len > 0 && self.f[self.len - 1] == f {
            self.d[self.len - 1] *= d;
        } else {
            self.d[self.len] = d;
            self.f[self.len] = f;
            self.len += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_rules() {
        assert_eq!(broadcast_shapes("t", &[2, 3], &[3]).unwrap(), ([1, 1, 2, 3], 2));
        assert_eq!(broadcast_shapes("t", &[4, 1, 3], &[2, 1]).unwrap(), ([1, 4, 2, 3], 3));
        assert_eq!(broadcast_shapes("t", &[], &[5]).unwrap(), ([1, 1, 1, 5], 1));
        assert!(broadcast_shapes("t", &[2, 3], &[2]).is_err());
        assert!(broadcast_shapes("t", &[1, 1, 1, 1, 1], &[2]).is_err());
    }

    #[test]
    fn merging() {
        assert_eq!(merge_runs([2, 3, 4, 5], [true, true, false, false]), ([1, 1, 6, 20], [false, false, true, false]));
        assert_eq!(merge_runs([2, 1, 4, 5], [false, true, true, false]), ([1, 2, 4, 5], [false, false, true, false]));
    }
}
