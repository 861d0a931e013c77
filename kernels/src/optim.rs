//! Optimizer updates in place on the variable and its slots, with TF1's
//! exact formulas (`ApplyGradientDescent`, `ApplyMomentum`, `ApplyAdam`).
//! All buffers have the variable's length.

/// `w -= lr * g`.
pub fn apply_gradient_descent(w: &mut [f32], g: &[f32], lr: f32) {
    debug_assert_eq!(w.len(), g.len());
    for (w, g) in w.iter_mut().zip(g) {
        *w -= lr * *g;
    }
}

/// `accum = accum * momentum + g`; then `w -= lr * accum`, or with Nesterov
/// `w -= lr * (g + momentum * accum)` (using the updated `accum`).
pub fn apply_momentum(w: &mut [f32], accum: &mut [f32], g: &[f32], lr: f32, momentum: f32, use_nesterov: bool) {
    debug_assert!(w.len() == g.len() && accum.len() == g.len());
    for ((w, a), g) in w.iter_mut().zip(accum.iter_mut()).zip(g) {
        *a = *a * momentum + *g;
        *w -= if use_nesterov { lr * (*g + momentum * *a) } else { lr * *a };
    }
}

/// Adam at 1-based step `step`:
/// `lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)`,
/// `m = beta1 * m + (1 - beta1) * g`, `v = beta2 * v + (1 - beta2) * g^2`,
/// `w -= lr_t * m / (sqrt(v) + epsilon)`. The powers are computed in f64.
#[allow(clippy::too_many_arguments)]
pub fn apply_adam(
    w: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    lr: f32,
    beta1: f32,
    beta2: f32,
    epsilon: f32,
    step: u64,
) {
    debug_assert!(w.len() == g.len() && m.len() == g.len() && v.len() == g.len());
    let t = step.min(i32::MAX as u64) as i32;
    let b1t = (beta1 as f64).powi(t);
    let b2t = (beta2 as f64).powi(t);
    let lr_t = (lr as f64 * (1.0 - b2t).sqrt() / (1.0 - b1t)) as f32;
    for (((w, m), v), g) in w.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
        *m += (*g - *m) * (1.0 - beta1);
        *v += (*g * *g - *v) * (1.0 - beta2);
        *w -= lr_t * *m / (v.sqrt() + epsilon);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradient_descent() {
        let mut w = [1.0, 2.0];
        apply_gradient_descent(&mut w, &[0.5, -1.0], 0.1);
        assert_eq!(w, [0.95, 2.1]);
    }

    #[test]
    fn momentum_plain_and_nesterov() {
        let (mut w, mut a) = ([1.0f32], [0.5f32]);
        apply_momentum(&mut w, &mut a, &[2.0], 0.1, 0.9, false);
        // accum = 0.45 + 2 = 2.45; w = 1 - 0.245
        assert!((a[0] - 2.45).abs() < 1e-6 && (w[0] - 0.755).abs() < 1e-6);
        let (mut w, mut a) = ([1.0f32], [0.5f32]);
        apply_momentum(&mut w, &mut a, &[2.0], 0.1, 0.9, true);
        // w = 1 - 0.1 * (2 + 0.9 * 2.45) = 1 - 0.4205
        assert!((w[0] - 0.5795).abs() < 1e-6);
    }

    /// Two steps against a plain f64 transcription of TF's ApplyAdam.
    #[test]
    fn adam_matches_tf_formula() {
        let (lr, b1, b2, eps) = (0.01f64, 0.9f64, 0.999f64, 1e-8f64);
        let (mut w, mut m, mut v) = ([0.5f32, -0.3], [0.0f32; 2], [0.0f32; 2]);
        let (mut rw, mut rm, mut rv) = ([0.5f64, -0.3], [0.0f64; 2], [0.0f64; 2]);
        for (t, g) in [[0.2f32, -0.7], [0.1, 0.4]].iter().enumerate() {
            let t = t as i32 + 1;
            apply_adam(&mut w, &mut m, &mut v, g, lr as f32, b1 as f32, b2 as f32, eps as f32, t as u64);
            let lr_t = lr * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
            for i in 0..2 {
                let gi = g[i] as f64;
                rm[i] = b1 * rm[i] + (1.0 - b1) * gi;
                rv[i] = b2 * rv[i] + (1.0 - b2) * gi * gi;
                rw[i] -= lr_t * rm[i] / (rv[i].sqrt() + eps);
            }
        }
        for i in 0..2 {
            assert!((w[i] as f64 - rw[i]).abs() < 1e-6, "{} vs {}", w[i], rw[i]);
        }
    }
}
