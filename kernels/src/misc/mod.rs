//! Losses and sums over whole buffers: `l2_loss`, `add_n`, `weighted_sum`
//! (the cross-tower gradient reduction).
//!
//! `add_n` and `weighted_sum` walk the output in blocks of [`BLOCK`]
//! elements that stay in L1: each input is read once and the output written
//! once (one pass over memory), with simple vectorizable inner loops.

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

#[inline(always)]
fn blocked(inputs: &[&[f32]], out: &mut [f32], w: impl Fn(usize) -> f32) {
    let Some((first, rest)) = inputs.split_first() else {
        out.fill(0.0);
        return;
    };
    let mut start = 0;
    for ob in out.chunks_mut(BLOCK) {
        let end = start + ob.len();
        let w0 = w(0);
        for (o, v) in ob.iter_mut().zip(&first[start..end]) {
            *o = *v * w0;
        }
        for (i, x) in rest.iter().enumerate() {
            let wi = w(i + 1);
            for (o, v) in ob.iter_mut().zip(&x[start..end]) {
                *o += *v * wi;
            }
        }
        start = end;
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
