//! Losses and sums over whole buffers: `l2_loss`, `add_n`, `weighted_sum`
//! (the cross-tower gradient reduction), `copy`.
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

/// `dx = x * dy` for the scalar upstream gradient `dy` of [`l2_loss`].
pub fn l2_loss_grad(x: &[f32], dy: f32, dx: &mut [f32]) {
    debug_assert_eq!(x.len(), dx.len());
    for (o, v) in dx.iter_mut().zip(x) {
        *o = *v * dy;
    }
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

/// `dst = src`.
pub fn copy(src: &[f32], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len());
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_close, numeric_grad, Lcg};

    #[test]
    fn l2_loss_and_grad() {
        assert_eq!(l2_loss(&[1.0, 2.0, 3.0, -4.0, 0.5]), (1.0 + 4.0 + 9.0 + 16.0 + 0.25) / 2.0);
        let mut r = Lcg::new(91);
        let x = r.vec(9);
        let mut dx = vec![0.0; 9];
        l2_loss_grad(&x, 0.7, &mut dx);
        // d/dx (0.7 * sum(x^2)/2) = 0.7 x
        let want = numeric_grad(&x, 1e-3, |x| 0.7 * l2_loss(x) as f64);
        assert_close(&dx, &want, 2e-3, "l2 grad");
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
        let mut c = vec![0.0; n];
        copy(&xs[1], &mut c);
        assert_eq!(c, xs[1]);
    }
}
