//! Binary arithmetic with NumPy broadcasting, `broadcast_to` and
//! `sum_to_shape`, for shapes of rank <= 4.
//!
//! Fast paths (checked in this order): equal shapes; `b` scalar; `a` scalar;
//! one operand a trailing block of the output (a bias row `[C]` against
//! `[N, C]`, or `[H, W, C]` against `[N, H, W, C]`); otherwise a general
//! 4-deep strided loop whose innermost axis is contiguous or broadcast.

use crate::reduce::sum_flags;
use crate::shape::{broadcast_shapes, bstrides, numel, pad4};
use crate::KernelError;

/// Re-export: the op enum is vocabulary (`towers_vocab::BinaryOp`, one
/// table in `vocab/src/binary.rs`).
pub use towers_vocab::BinaryOp;

/// Expands the vocabulary's table into the CPU kernels: [`binary`] and
/// [`binary_same_shape`] expand each `f` into its own loop. The table's
/// other fields are the vocabulary's.
macro_rules! binary_kernels {
    ($( $(#[$doc:meta])* $v:ident { name: $name:literal, tf: $tf:literal, code: $code:literal, sym: $sym:literal,
        f: $f:expr, cuda: $cuda:literal $(,)? } )*) => {
        /// `out[i] = op(a[i], b[i])` over equal-length slices (a fused
        /// kernel's step on operands already gathered to the output's shape).
        pub fn binary_same_shape(op: BinaryOp, a: &[f32], b: &[f32], out: &mut [f32]) {
            debug_assert!(a.len() == out.len() && b.len() == out.len());
            match op {
                $(BinaryOp::$v => {
                    let f = $f;
                    for ((o, x), y) in out.iter_mut().zip(a).zip(b) { *o = f(*x, *y); }
                })*
            }
        }

        /// `out = op(a, b)` per element over the broadcast loops of [`run`].
        fn dispatch(op: BinaryOp, a: &[f32], pa: &[usize; 4], b: &[f32], pb: &[usize; 4], od: &[usize; 4], out: &mut [f32]) {
            match op {
                $(BinaryOp::$v => run(a, pa, b, pb, od, out, $f),)*
            }
        }
    };
}

towers_vocab::binary_table!(binary_kernels);

/// `out = a (op) b` with broadcasting. `out` has the broadcast shape of
/// `a_shape` and `b_shape` (see [`crate::shape::broadcast_shapes`]).
///
/// Errors: incompatible shapes, or a rank above 4.
pub fn binary(
    op: BinaryOp,
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let (od, _) = broadcast_shapes("binary", a_shape, b_shape)?;
    let (pa, pb) = (pad4("binary", a_shape)?, pad4("binary", b_shape)?);
    debug_assert_eq!(a.len(), numel(a_shape));
    debug_assert_eq!(b.len(), numel(b_shape));
    debug_assert_eq!(out.len(), od.iter().product::<usize>());
    dispatch(op, a, &pa, b, &pb, &od, out);
    Ok(())
}

/// True when `p` is 1s followed by exactly `od`'s trailing dims.
fn is_trailing(p: &[usize; 4], od: &[usize; 4]) -> bool {
    let j = p.iter().position(|&d| d != 1).unwrap_or(4);
    p[j..] == od[j..]
}

#[inline(always)]
fn run<F: Fn(f32, f32) -> f32 + Copy>(
    a: &[f32],
    pa: &[usize; 4],
    b: &[f32],
    pb: &[usize; 4],
    od: &[usize; 4],
    out: &mut [f32],
    f: F,
) {
    let (n, na, nb) = (out.len(), a.len(), b.len());
    if n == 0 {
        return;
    }
    if pa == od && pb == od {
        for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
            *o = f(*x, *y);
        }
    } else if nb == 1 && pa == od {
        let y = b[0];
        for (o, x) in out.iter_mut().zip(a) {
            *o = f(*x, y);
        }
    } else if na == 1 && pb == od {
        let x = a[0];
        for (o, y) in out.iter_mut().zip(b) {
            *o = f(x, *y);
        }
    } else if pa == od && is_trailing(pb, od) {
        for (orow, arow) in out.chunks_exact_mut(nb).zip(a.chunks_exact(nb)) {
            for ((o, x), y) in orow.iter_mut().zip(arow).zip(b) {
                *o = f(*x, *y);
            }
        }
    } else if pb == od && is_trailing(pa, od) {
        for (orow, brow) in out.chunks_exact_mut(na).zip(b.chunks_exact(na)) {
            for ((o, x), y) in orow.iter_mut().zip(a).zip(brow) {
                *o = f(*x, *y);
            }
        }
    } else {
        let (sa, sb) = (bstrides(pa), bstrides(pb));
        let d3 = od[3];
        let mut oi = 0;
        for i0 in 0..od[0] {
            for i1 in 0..od[1] {
                for i2 in 0..od[2] {
                    let ab = i0 * sa[0] + i1 * sa[1] + i2 * sa[2];
                    let bb = i0 * sb[0] + i1 * sb[1] + i2 * sb[2];
                    let o = &mut out[oi..oi + d3];
                    match (sa[3] != 0, sb[3] != 0) {
                        (true, true) => {
                            for ((o, x), y) in o.iter_mut().zip(&a[ab..ab + d3]).zip(&b[bb..bb + d3]) {
                                *o = f(*x, *y);
                            }
                        }
                        (true, false) => {
                            let y = b[bb];
                            for (o, x) in o.iter_mut().zip(&a[ab..ab + d3]) {
                                *o = f(*x, y);
                            }
                        }
                        (false, true) => {
                            let x = a[ab];
                            for (o, y) in o.iter_mut().zip(&b[bb..bb + d3]) {
                                *o = f(x, *y);
                            }
                        }
                        (false, false) => o.fill(f(a[ab], b[bb])),
                    }
                    oi += d3;
                }
            }
        }
    }
}

/// Checks that `small` broadcasts to exactly `big`; returns both padded.
fn check_to(op: &'static str, small: &[usize], big: &[usize]) -> Result<([usize; 4], [usize; 4]), KernelError> {
    let (bd, _) = broadcast_shapes(op, small, big)?;
    let pbig = pad4(op, big)?;
    if bd != pbig || small.len() > big.len() {
        return Err(KernelError::IncompatibleShapes { op, a: small.to_vec(), b: big.to_vec() });
    }
    Ok((pad4(op, small)?, pbig))
}

/// `out = broadcast_to(x, out_shape)`: repeats `x` along its size-1 (or
/// missing leading) axes. Errors if `x_shape` does not broadcast to `out_shape`.
pub fn broadcast_to(x: &[f32], x_shape: &[usize], out: &mut [f32], out_shape: &[usize]) -> Result<(), KernelError> {
    let (px, po) = check_to("broadcast_to", x_shape, out_shape)?;
    debug_assert_eq!(x.len(), numel(x_shape));
    debug_assert_eq!(out.len(), numel(out_shape));
    // A binary op with a zero-size-free "a" of ones would cost a read; use
    // the general loop with `b` ignored instead.
    run(x, &px, x, &px, &po, out, |v, _| v);
    Ok(())
}

/// `out = sum_to_shape(x, out_shape)`: sums `x: x_shape` over the axes along
/// which `out_shape` was broadcast, the adjoint of [`broadcast_to`] (the
/// gradient of a broadcasting op with respect to its smaller operand).
/// `out_shape` must broadcast to `x_shape`; `out` is overwritten.
pub fn sum_to_shape(x: &[f32], x_shape: &[usize], out: &mut [f32], out_shape: &[usize]) -> Result<(), KernelError> {
    let (po, px) = check_to("sum_to_shape", out_shape, x_shape)?;
    debug_assert_eq!(x.len(), numel(x_shape));
    debug_assert_eq!(out.len(), numel(out_shape));
    let mut flags = [false; 4];
    for i in 0..4 {
        flags[i] = po[i] == 1 && px[i] != 1;
    }
    sum_flags(x, px, flags, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Codes are distinct and name their op back; `apply` is what the
    /// broadcast kernel computes per element.
    #[test]
    fn binary_codes_are_distinct_and_name_their_op() {
        let mut codes: Vec<i32> = BinaryOp::ALL.iter().map(|o| o.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), BinaryOp::ALL.len());
        for &op in BinaryOp::ALL {
            assert_eq!(BinaryOp::from_code(op.code()), Some(op), "{op:?}");
            let mut out = [0.0f32; 1];
            binary(op, &[3.0], &[1], &[4.0], &[1], &mut out).unwrap();
            assert_eq!(out[0], op.apply(3.0, 4.0), "{op:?}");
        }
        assert_eq!(BinaryOp::from_code(BinaryOp::ALL.len() as i32 + 7), None);
    }
    use crate::testutil::{assert_close, Lcg};

    /// The math ops of issue 22, value by value, against their definitions
    /// (TF's conventions: maximum/minimum ignore one NaN as IEEE maxNum,
    /// pow of a negative base with a fractional exponent is NaN, 0^0 = 1).
    #[test]
    fn maximum_minimum_pow_and_gradient_helpers() {
        let x = [-2.0f32, 0.0, 3.0, f32::NAN, 2.0];
        let y = [1.0f32, 0.0, -1.0, 4.0, 0.5];
        let run = |op| {
            let mut out = [0.0f32; 5];
            binary(op, &x, &[5], &y, &[5], &mut out).unwrap();
            out
        };
        assert_eq!(run(BinaryOp::Maximum), [1.0, 0.0, 3.0, 4.0, 2.0]);
        assert_eq!(run(BinaryOp::Minimum), [-2.0, 0.0, -1.0, 4.0, 0.5]);
        let p = run(BinaryOp::Pow);
        assert_eq!([p[0], p[1], p[2]], [-2.0, 1.0, 1.0 / 3.0]);
        assert!(p[3].is_nan());
        assert!((p[4] - 2f32.sqrt()).abs() < 1e-6);
        assert!(BinaryOp::Pow.apply(-8.0, 1.0 / 3.0).is_nan());
        assert_eq!(run(BinaryOp::GreaterEqualMask), [0.0, 1.0, 1.0, 0.0, 1.0]);
        // PowGradY(x, z) = z*ln(x) where x > 0, else 0.
        let g = run(BinaryOp::PowGradY);
        assert_eq!([g[0], g[1]], [0.0, 0.0]);
        assert!((g[2] - -3f32.ln()).abs() < 1e-6 && (g[4] - 0.5 * 2f32.ln()).abs() < 1e-6);
        // The CUDA switch has one case per row, by code.
        let sw = BinaryOp::cuda_switch();
        for &op in BinaryOp::ALL {
            assert!(sw.contains(&format!("case {}: return ", op.code())), "{op:?}");
        }
    }

    /// The fused kernels' equal-shape step is the broadcast kernel's values.
    #[test]
    fn same_shape_step_matches_binary() {
        let mut r = Lcg::new(33);
        let (a, b) = (r.vec(37), r.vec(37));
        let b: Vec<f32> = b.iter().map(|v| v + 2.0).collect();
        for &op in BinaryOp::ALL {
            let (mut want, mut got) = (vec![0.0; 37], vec![0.0; 37]);
            binary(op, &a, &[37], &b, &[37], &mut want).unwrap();
            binary_same_shape(op, &a, &b, &mut got);
            assert_eq!(
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{op:?}"
            );
        }
    }

    /// Plain multi-index reference: out[i] = f(a[idx_a(i)], b[idx_b(i)]).
    fn naive(op: BinaryOp, a: &[f32], sa: &[usize], b: &[f32], sb: &[usize]) -> Vec<f32> {
        let (od, _) = broadcast_shapes("t", sa, sb).unwrap();
        let (pa, pb) = (pad4("t", sa).unwrap(), pad4("t", sb).unwrap());
        let idx = |p: &[usize; 4], i: [usize; 4]| {
            let mut k = 0;
            for d in 0..4 {
                k = k * p[d] + if p[d] == 1 { 0 } else { i[d] };
            }
            k
        };
        let mut out = Vec::new();
        for i0 in 0..od[0] {
            for i1 in 0..od[1] {
                for i2 in 0..od[2] {
                    for i3 in 0..od[3] {
                        let i = [i0, i1, i2, i3];
                        let (x, y) = (a[idx(&pa, i)], b[idx(&pb, i)]);
                        out.push(op.apply(x, y));
                    }
                }
            }
        }
        out
    }

    const CASES: &[(&[usize], &[usize])] = &[
        (&[3, 4], &[3, 4]),
        (&[3, 4], &[]),
        (&[], &[2, 5]),
        (&[2, 3, 4], &[4]),
        (&[4], &[2, 3, 4]),
        (&[2, 3, 4, 5], &[3, 1, 5]),
        (&[2, 1, 4], &[3, 1]),
        (&[5, 1], &[1, 6]),
        (&[2, 3, 1, 5], &[2, 1, 4, 1]),
        (&[1], &[3, 2]),
        (&[3, 1], &[3, 7]),
    ];

    #[test]
    fn binary_matches_reference() {
        let mut r = Lcg::new(31);
        for &(sa, sb) in CASES {
            let a = r.vec(numel(sa));
            // Keep divisors away from zero.
            let b: Vec<f32> = r.vec(numel(sb)).iter().map(|v| v + 2.0).collect();
            for &op in BinaryOp::ALL {
                let want = naive(op, &a, sa, &b, sb);
                let mut out = vec![f32::NAN; want.len()];
                binary(op, &a, sa, &b, sb, &mut out).unwrap();
                assert_close(&out, &want, 1e-6, &format!("{op:?} {sa:?} {sb:?}"));
            }
        }
    }

    #[test]
    fn errors_are_reported() {
        let mut out = vec![0.0; 6];
        assert!(matches!(
            binary(BinaryOp::Add, &[0.0; 6], &[2, 3], &[0.0; 2], &[2], &mut out),
            Err(KernelError::IncompatibleShapes { .. })
        ));
        assert!(sum_to_shape(&[0.0; 6], &[2, 3], &mut out[..2], &[2]).is_err());
        assert!(broadcast_to(&[0.0; 6], &[2, 3], &mut out, &[3]).is_err());
    }

    /// broadcast_to is the Add with a zero tensor; sum_to_shape is its adjoint:
    /// <broadcast_to(u), v> == <u, sum_to_shape(v)> for all u, v.
    #[test]
    fn broadcast_and_sum_to_shape_are_adjoint() {
        let mut r = Lcg::new(32);
        for &(small, big) in &[
            (&[4][..], &[2, 3, 4][..]),
            (&[3, 1, 5], &[2, 3, 4, 5]),
            (&[], &[3, 2]),
            (&[2, 1], &[2, 6]),
            (&[1, 3, 1], &[2, 3, 4]),
            (&[2, 3], &[2, 3]),
        ] {
            let u = r.vec(numel(small));
            let v = r.vec(numel(big));
            let mut bu = vec![f32::NAN; numel(big)];
            broadcast_to(&u, small, &mut bu, big).unwrap();
            let want = naive(BinaryOp::Add, &u, small, &vec![0.0; numel(big)], big);
            assert_close(&bu, &want, 0.0, "broadcast_to");
            let mut sv = vec![f32::NAN; numel(small)];
            sum_to_shape(&v, big, &mut sv, small).unwrap();
            let lhs: f64 = bu.iter().zip(&v).map(|(a, b)| *a as f64 * *b as f64).sum();
            let rhs: f64 = u.iter().zip(&sv).map(|(a, b)| *a as f64 * *b as f64).sum();
            assert!((lhs - rhs).abs() < 1e-4 * (1.0 + lhs.abs()), "{small:?}->{big:?}: {lhs} vs {rhs}");
        }
    }
}
