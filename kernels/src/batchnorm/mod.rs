//! Batch normalization over the last (channel) axis: `x` is NHWC
//! `[n, h, w, C]` or `[n, C]`, viewed as `[rows, C]`; statistics are per
//! channel over all `rows = len / C` rows.
//!
//! Conventions, as TF's `FusedBatchNorm` (v1/v2):
//! - training normalizes with the **biased** batch variance
//!   `var = mean((x - mean)^2)` and saves `mean` and
//!   `inv_std = 1 / sqrt(var + epsilon)` for the backward pass;
//! - the batch variance it outputs (for the moving variance) is the
//!   **unbiased** `var * rows / (rows - 1)` (unchanged when `rows == 1`);
//! - moving averages ([`assign_moving_average`]):
//!   `moving = moving * decay + batch * (1 - decay)`.
//!
//! Sums are accumulated in blocks of [`BLOCK`] rows into a partial buffer
//! and then into the total, which keeps f32 rounding error small without
//! any allocation (the partial buffer is an output slice not yet written).
//!
//! SIMD: plain loops, compiled once for the crate's baseline target, so
//! they run the same instructions whatever [`crate::simd`] path the process
//! selected: **bit-identical on every path**. Not rewritten over `pulp`:
//! no seed model or benchmark uses batch norm, so no measurement would show
//! a gain to pay for the change.

pub mod desc;

/// Rows summed into a partial before it is added to the running total.
pub const BLOCK: usize = 256;

/// Per-channel `total[c] = sum_r f(r, c)`, summed blockwise via `partial`.
fn blocked_sum(rows: usize, total: &mut [f32], partial: &mut [f32], mut f: impl FnMut(usize, &mut [f32])) {
    total.fill(0.0);
    let mut r0 = 0;
    while r0 < rows {
        let r1 = (r0 + BLOCK).min(rows);
        partial.fill(0.0);
        for r in r0..r1 {
            f(r, partial);
        }
        for (t, p) in total.iter_mut().zip(partial.iter()) {
            *t += *p;
        }
        r0 = r1;
    }
}

/// Training forward (`Kernel::BatchNormTrain`). `x, y: [rows, C]`;
/// `gamma, beta, mean, var, inv_std: [C]`. Writes
/// `y = gamma * (x - mean) * inv_std + beta` with `inv_std` from the biased
/// batch variance, the batch `mean`, `inv_std`, and the **unbiased** batch
/// `var` (for the moving-average update).
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_train(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    epsilon: f32,
    y: &mut [f32],
    mean: &mut [f32],
    var: &mut [f32],
    inv_std: &mut [f32],
) {
    let c = gamma.len();
    debug_assert!(beta.len() == c && mean.len() == c && var.len() == c && inv_std.len() == c);
    debug_assert_eq!(x.len(), y.len());
    debug_assert_eq!(x.len() % c.max(1), 0);
    if c == 0 {
        return;
    }
    let rows = x.len() / c;
    let inv_n = 1.0 / rows.max(1) as f32;
    blocked_sum(rows, mean, inv_std, |r, p| {
        for (a, v) in p.iter_mut().zip(&x[r * c..(r + 1) * c]) {
            *a += *v;
        }
    });
    mean.iter_mut().for_each(|m| *m *= inv_n);
    let m: &[f32] = mean;
    blocked_sum(rows, var, inv_std, |r, p| {
        for ((a, v), mu) in p.iter_mut().zip(&x[r * c..(r + 1) * c]).zip(m) {
            let d = *v - *mu;
            *a += d * d;
        }
    });
    var.iter_mut().for_each(|v| *v *= inv_n);
    for (s, v) in inv_std.iter_mut().zip(var.iter()) {
        *s = 1.0 / (*v + epsilon).sqrt();
    }
    normalize(x, gamma, beta, mean, inv_std, y);
    if rows > 1 {
        let unbias = rows as f32 / (rows - 1) as f32;
        var.iter_mut().for_each(|v| *v *= unbias);
    }
}

/// `y = gamma * (x - mean) * inv_std + beta` as `y = x * scale + shift`.
fn normalize(x: &[f32], gamma: &[f32], beta: &[f32], mean: &[f32], inv_std: &[f32], y: &mut [f32]) {
    let c = gamma.len();
    for (yr, xr) in y.chunks_exact_mut(c).zip(x.chunks_exact(c)) {
        for j in 0..c {
            let s = gamma[j] * inv_std[j];
            yr[j] = (xr[j] - mean[j]) * s + beta[j];
        }
    }
}

/// Inference forward with the moving statistics (`Kernel::BatchNormInfer`):
/// `y = gamma * (x - moving_mean) / sqrt(moving_var + epsilon) + beta`; the
/// statistics outputs are the moving ones: `mean = moving_mean`,
/// `inv_std = 1 / sqrt(moving_var + epsilon)`, `var = moving_var`.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_infer(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    moving_mean: &[f32],
    moving_var: &[f32],
    epsilon: f32,
    y: &mut [f32],
    mean: &mut [f32],
    inv_std: &mut [f32],
    var: &mut [f32],
) {
    let c = gamma.len();
    debug_assert!(beta.len() == c && moving_mean.len() == c && moving_var.len() == c);
    debug_assert!(mean.len() == c && inv_std.len() == c && var.len() == c);
    debug_assert_eq!(x.len(), y.len());
    mean.copy_from_slice(moving_mean);
    var.copy_from_slice(moving_var);
    for (s, v) in inv_std.iter_mut().zip(moving_var) {
        *s = 1.0 / (*v + epsilon).sqrt();
    }
    if c == 0 {
        return;
    }
    for (yr, xr) in y.chunks_exact_mut(c).zip(x.chunks_exact(c)) {
        for j in 0..c {
            let s = gamma[j] / (moving_var[j] + epsilon).sqrt();
            yr[j] = (xr[j] - moving_mean[j]) * s + beta[j];
        }
    }
}

/// Backward from the saved statistics. With `xhat = (x - mean) * inv_std`
/// and `n = rows`:
/// `dbeta = sum dy`, `dgamma = sum dy * xhat`,
/// `dx = gamma * inv_std * (dy - dbeta / n - xhat * dgamma / n)`.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_grad(
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    inv_std: &[f32],
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    let c = gamma.len();
    debug_assert!(mean.len() == c && inv_std.len() == c && dgamma.len() == c && dbeta.len() == c);
    debug_assert!(dy.len() == x.len() && dx.len() == x.len());
    if c == 0 || x.is_empty() {
        dgamma.fill(0.0);
        dbeta.fill(0.0);
        return;
    }
    let rows = x.len() / c;
    let (partial, _) = dx.split_at_mut(c);
    blocked_sum(rows, dbeta, partial, |r, p| {
        for (a, g) in p.iter_mut().zip(&dy[r * c..(r + 1) * c]) {
            *a += *g;
        }
    });
    blocked_sum(rows, dgamma, partial, |r, p| {
        for j in 0..c {
            p[j] += dy[r * c + j] * (x[r * c + j] - mean[j]) * inv_std[j];
        }
    });
    let inv_n = 1.0 / rows as f32;
    for ((dr, gr), xr) in dx.chunks_exact_mut(c).zip(dy.chunks_exact(c)).zip(x.chunks_exact(c)) {
        for j in 0..c {
            let xhat = (xr[j] - mean[j]) * inv_std[j];
            dr[j] = gamma[j] * inv_std[j] * (gr[j] - dbeta[j] * inv_n - xhat * dgamma[j] * inv_n);
        }
    }
}

/// `moving = moving * decay + value * (1 - decay)`, in place on the
/// variable (`Kernel::AssignMovingAverage`, TF's `AssignMovingAvg`).
pub fn assign_moving_average(moving: &mut [f32], value: &[f32], decay: f32) {
    debug_assert_eq!(moving.len(), value.len());
    for (m, v) in moving.iter_mut().zip(value) {
        *m = *m * decay + *v * (1.0 - decay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_close, numeric_grad, Lcg};

    #[test]
    fn train_forward_statistics() {
        let mut r = Lcg::new(81);
        let (rows, c) = (600, 3); // more than one BLOCK
        let x: Vec<f32> = r.vec(rows * c).iter().enumerate().map(|(i, v)| v * (1 + i % c) as f32 + 5.0).collect();
        let gamma = [1.5, -0.5, 2.0];
        let beta = [0.1, 0.2, -0.3];
        let (mut y, mut mean, mut var, mut inv) = (vec![0.0; rows * c], [0.0; 3], [0.0; 3], [0.0; 3]);
        batch_norm_train(&x, &gamma, &beta, 1e-3, &mut y, &mut mean, &mut var, &mut inv);
        for j in 0..c {
            let col: Vec<f64> = (0..rows).map(|i| x[i * c + j] as f64).collect();
            let m = col.iter().sum::<f64>() / rows as f64;
            let v = col.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / rows as f64;
            let unbiased = v * rows as f64 / (rows - 1) as f64;
            assert!((mean[j] as f64 - m).abs() < 1e-5, "mean");
            assert!((var[j] as f64 - unbiased).abs() < 1e-4 * v, "var");
            assert!((inv[j] as f64 - 1.0 / (v + 1e-3).sqrt()).abs() < 1e-5, "inv_std");
            for i in 0..rows {
                let want = gamma[j] as f64 * (col[i] - m) / (v + 1e-3).sqrt() + beta[j] as f64;
                assert!((y[i * c + j] as f64 - want).abs() < 1e-4, "y");
            }
        }
        // Inference with the (biased) batch statistics reproduces the
        // training output, and passes the statistics through.
        let biased: Vec<f32> = var.iter().map(|v| v * (rows - 1) as f32 / rows as f32).collect();
        let mut y2 = vec![0.0; rows * c];
        let (mut m2, mut s2, mut v2) = ([0.0; 3], [0.0; 3], [0.0; 3]);
        batch_norm_infer(&x, &gamma, &beta, &mean, &biased, 1e-3, &mut y2, &mut m2, &mut s2, &mut v2);
        assert_close(&y2, &y, 1e-4, "infer");
        assert_eq!((m2, &v2[..]), (mean, &biased[..]));
        assert_close(&s2, &inv, 1e-5, "infer inv_std");
    }

    /// L = sum(y * g), y = BN_train(x; gamma, beta). The backward kernel must
    /// give dL/dx (through the batch mean and variance), dL/dgamma and
    /// dL/dbeta; all three are checked against central differences.
    #[test]
    fn grads_match_finite_differences() {
        let mut r = Lcg::new(82);
        let (rows, c) = (7, 3);
        let x = r.vec(rows * c);
        let gamma = r.vec(c);
        let beta = r.vec(c);
        let g = r.vec(rows * c);
        let eps = 1e-3;
        let loss = |x: &[f32], gamma: &[f32], beta: &[f32]| -> f64 {
            let (mut y, mut m, mut v, mut s) = (vec![0.0; rows * c], vec![0.0; c], vec![0.0; c], vec![0.0; c]);
            batch_norm_train(x, gamma, beta, eps, &mut y, &mut m, &mut v, &mut s);
            y.iter().zip(&g).map(|(a, b)| *a as f64 * *b as f64).sum()
        };
        let (mut y, mut m, mut v, mut s) = (vec![0.0; rows * c], vec![0.0; c], vec![0.0; c], vec![0.0; c]);
        batch_norm_train(&x, &gamma, &beta, eps, &mut y, &mut m, &mut v, &mut s);
        let (mut dx, mut dg, mut db) = (vec![0.0; rows * c], vec![0.0; c], vec![0.0; c]);
        batch_norm_grad(&g, &x, &gamma, &m, &s, &mut dx, &mut dg, &mut db);
        assert_close(&dx, &numeric_grad(&x, 1e-3, |x| loss(x, &gamma, &beta)), 5e-3, "dx");
        assert_close(&dg, &numeric_grad(&gamma, 1e-3, |gm| loss(&x, gm, &beta)), 5e-3, "dgamma");
        assert_close(&db, &numeric_grad(&beta, 1e-3, |bt| loss(&x, &gamma, bt)), 5e-3, "dbeta");
    }

    #[test]
    fn moving_average() {
        let mut mm = [1.0f32, 2.0];
        assign_moving_average(&mut mm, &[3.0, 4.0], 0.9);
        assert!((mm[0] - (0.9 + 0.3)).abs() < 1e-6 && (mm[1] - (1.8 + 0.4)).abs() < 1e-6);
    }
}
