//! Losses and sums over whole buffers: `l2_loss`, `add_n`, `weighted_sum`
//! (the cross-tower gradient reduction).
//!
//! `add_n` and `weighted_sum` walk the output in blocks of [`BLOCK`]
//! elements that stay in L1: each input is read once and the output written
//! once (one pass over memory). Their inner loop is one body generic over
//! the vector width (`Scaled`), run on the process's [`crate::simd`] path:
//! per element `((x0 * w0) + x1 * w1) + ...`, each product and sum rounded
//! on its own, inputs in order, so the results are **bit-identical on every
//! path**. `l2_loss` stays a plain loop (f64 accumulators in a fixed order
//! of 4; not hot).

pub mod desc;

/// Output elements per block in `add_n` / `weighted_sum` (16 KiB).
pub const BLOCK: usize = 4096;

/// `sum(x^2) / 2`, accumulated in f64.
pub fn l2_loss(x: &[f32]) -> f32 {
    let mut acc = [0.0f64; 4];
    let chunks = x.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..4 {
            acc[i] += (c[i] * c[i]) as f64;
        }
    }
    let s: f64 = acc.iter().sum::<f64>() + rest.iter().map(|v| (v * v) as f64).sum::<f64>();
    (s * 0.5) as f32
}

/// `out = sum_i inputs[i]`; every input has `out.len()` elements. With no
/// inputs `out` is zeroed.
pub fn add_n(inputs: &[&[f32]], out: &mut [f32]) {
    debug_assert!(inputs.iter().all(|x| x.len() == out.len()));
    blocked(inputs, out, |_| 1.0);
}

/// `out = sum_i weights[i] * inputs[i]` in one pass (the cross-tower
/// gradient reduction, e.g. weights `1 / towers`).
pub fn weighted_sum(inputs: &[&[f32]], weights: &[f32], out: &mut [f32]) {
    debug_assert_eq!(inputs.len(), weights.len());
    debug_assert!(inputs.iter().all(|x| x.len() == out.len()));
    blocked(inputs, out, |i| weights[i]);
}

fn blocked(inputs: &[&[f32]], out: &mut [f32], w: impl Fn(usize) -> f32) {
    let Some((first, rest)) = inputs.split_first() else {
        out.fill(0.0);
        return;
    };
    let mut start = 0;
    for ob in out.chunks_mut(BLOCK) {
        let end = start + ob.len();
        crate::simd::dispatch(Scaled { x: &first[start..end], w: w(0), out: ob, add: false });
        for (i, x) in rest.iter().enumerate() {
            crate::simd::dispatch(Scaled { x: &x[start..end], w: w(i + 1), out: ob, add: true });
        }
        start = end;
    }
}

/// `out = x * w`, or `out += x * w` when `add` (the product rounded, then
/// the sum: never an FMA), generic over the vector width.
struct Scaled<'a> {
    x: &'a [f32],
    w: f32,
    out: &'a mut [f32],
    add: bool,
}

impl pulp::WithSimd for Scaled<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, s: S) {
        let Scaled { x, w, out, add } = self;
        let w = s.splat_f32s(w);
        let n = x.len().min(out.len());
        let (oh, ot) = S::as_mut_simd_f32s(&mut out[..n]);
        let (xh, xt) = S::as_simd_f32s(&x[..n]);
        if add {
            for (o, x) in oh.iter_mut().zip(xh) {
                *o = s.add_f32s(*o, s.mul_f32s(*x, w));
            }
        } else {
            for (o, x) in oh.iter_mut().zip(xh) {
                *o = s.mul_f32s(*x, w);
            }
        }
        if !ot.is_empty() {
            let p = s.mul_f32s(s.partial_load_f32s(xt), w);
            let v = if add { s.add_f32s(s.partial_load_f32s(ot), p) } else { p };
            s.partial_store_f32s(ot, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_close, Lcg};

    #[test]
    fn l2_loss_value() {
        assert_eq!(l2_loss(&[1.0, 2.0, 3.0, -4.0, 0.5]), (1.0 + 4.0 + 9.0 + 16.0 + 0.25) / 2.0);
    }

    /// `weighted_sum` and `add_n` on every path this CPU has equal the
    /// plain loop `((x0 * w0) + x1 * w1) + ...` bit for bit, at lengths
    /// around the vector widths and the block.
    #[test]
    fn every_path_matches_the_plain_loop_bit_for_bit() {
        use crate::simd::{dispatch_on, SimdPath};
        let mut r = Lcg::new(93);
        for n in [0usize, 1, 5, 8, 16, 17, 31, BLOCK + 9] {
            let xs: Vec<Vec<f32>> = (0..3).map(|_| r.vec(n)).collect();
            let w = [0.3f32, -1.7, 0.11];
            let want: Vec<f32> = (0..n).map(|i| xs[0][i] * w[0] + xs[1][i] * w[1] + xs[2][i] * w[2]).collect();
            for path in SimdPath::available() {
                let mut out = vec![f32::NAN; n];
                for (k, x) in xs.iter().enumerate() {
                    dispatch_on(path, Scaled { x, w: w[k], out: &mut out, add: k > 0 });
                }
                let same = out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{path} n={n}");
            }
            let refs: Vec<&[f32]> = xs.iter().map(|v| v.as_slice()).collect();
            let mut out = vec![f32::NAN; n];
            weighted_sum(&refs, &w, &mut out);
            assert!(out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "weighted_sum n={n}");
        }
    }

    #[test]
    fn sums() {
        let mut r = Lcg::new(92);
        let n = BLOCK * 2 + 37;
        let xs: Vec<Vec<f32>> = (0..3).map(|_| r.vec(n)).collect();
        let refs: Vec<&[f32]> = xs.iter().map(|v| v.as_slice()).collect();
        let w = [0.5, -1.0, 0.25];
        let mut out = vec![f32::NAN; n];
        weighted_sum(&refs, &w, &mut out);
        let want: Vec<f32> = (0..n).map(|i| xs[0][i] * 0.5 - xs[1][i] + xs[2][i] * 0.25).collect();
        assert_close(&out, &want, 1e-6, "weighted_sum");
        add_n(&refs, &mut out);
        let want: Vec<f32> = (0..n).map(|i| xs[0][i] + xs[1][i] + xs[2][i]).collect();
        assert_close(&out, &want, 1e-6, "add_n");
        add_n(&[], &mut out);
        assert!(out.iter().all(|v| *v == 0.0));
    }
}
