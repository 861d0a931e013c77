//! Optimizer updates in place on the variable and its slots, with TF1's
//! exact formulas (`ApplyGradientDescent`, `ApplyMomentum`, `ApplyAdam`,
//! `ApplyRMSProp`, `ApplyAdagrad`);
//! the tower reduction fused into an update ([`mean_apply`]); the global
//! step's increment. All buffers have the variable's length.
//!
//! SIMD: the updates are bodies generic over the vector width
//! (`body.rs`), run on the process's [`crate::simd`] path; every product
//! and sum rounded on its own (no FMA), `sqrt` and `/` exact, lanes
//! independent elements: **bit-identical on every path** (AVX-512, AVX2,
//! NEON, scalar) and to the plain loops they replaced. [`mean_apply`]'s
//! tower reduction is [`weighted_sum`] (`misc`), likewise identical.

mod body;
pub mod desc;
#[cfg(test)]
mod tests_rmsprop_adagrad;

use crate::kernel::Kernel;
use crate::misc::weighted_sum;
use crate::KernelError;

/// `w -= lr * g`.
pub fn apply_gradient_descent(w: &mut [f32], g: &[f32], lr: f32) {
    debug_assert_eq!(w.len(), g.len());
    crate::simd::dispatch(body::Sgd { w, g, lr })
}

/// `accum = accum * momentum + g`; then `w -= lr * accum`, or with Nesterov
/// `w -= lr * (g + momentum * accum)` (using the updated `accum`).
pub fn apply_momentum(w: &mut [f32], accum: &mut [f32], g: &[f32], lr: f32, momentum: f32, use_nesterov: bool) {
    debug_assert!(w.len() == g.len() && accum.len() == g.len());
    crate::simd::dispatch(body::Momentum { w, a: accum, g, lr, momentum, nesterov: use_nesterov })
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
    crate::simd::dispatch(body::Adam {
        w,
        m,
        v,
        g,
        lr_t,
        one_minus_beta1: 1.0 - beta1,
        one_minus_beta2: 1.0 - beta2,
        epsilon,
    })
}

/// TF1's `ApplyRMSProp` (not centered): `ms += (g² - ms)·(1 - decay)`;
/// `mom = mom·momentum + g·lr / sqrt(ms + epsilon)`; `w -= mom`.
#[allow(clippy::too_many_arguments)]
pub fn apply_rmsprop(
    w: &mut [f32],
    ms: &mut [f32],
    mom: &mut [f32],
    g: &[f32],
    lr: f32,
    decay: f32,
    momentum: f32,
    epsilon: f32,
) {
    debug_assert!(w.len() == g.len() && ms.len() == g.len() && mom.len() == g.len());
    crate::simd::dispatch(body::RmsProp { w, ms, mom, g, k: [lr, 1.0 - decay, momentum, epsilon] })
}

/// TF1's `ApplyAdagrad`: `accum += g²`; `w -= g·lr / sqrt(accum)`.
pub fn apply_adagrad(w: &mut [f32], accum: &mut [f32], g: &[f32], lr: f32) {
    debug_assert!(w.len() == g.len() && accum.len() == g.len());
    crate::simd::dispatch(body::Adagrad { w, a: accum, g, lr })
}

/// The operand counts of an optimizer update kernel: (buffers written in
/// place: the variable and its slots; inputs after the gradient: Adam's
/// global_step and the learning rate). `None` for a kernel that is not an
/// update. The one list the verifier, the multi-tensor merge and the
/// fused kernels read.
pub fn update_arity(apply: &Kernel) -> Option<(usize, usize)> {
    match apply {
        Kernel::ApplyGradientDescent { .. } => Some((1, 1)),
        Kernel::ApplyMomentum { .. } => Some((2, 1)),
        Kernel::ApplyAdam { .. } => Some((3, 2)),
        Kernel::ApplyRmsProp { .. } => Some((3, 1)),
        Kernel::ApplyAdagrad { .. } => Some((2, 1)),
        _ => None,
    }
}

/// Adam's 1-based step from the `global_step` variable read before this
/// step's increment: `t = global_step + 1` (an empty or negative step reads as 0).
pub fn adam_step(global_step: &[i32]) -> u64 {
    global_step.first().copied().unwrap_or(0).max(0) as u64 + 1
}

/// How many buffers an optimizer update writes (the variable and its
/// slots); an error for a kernel that is not one, named as the `op` fusing it.
pub fn update_slots(apply: &Kernel, op: &'static str) -> Result<usize, KernelError> {
    update_arity(apply).map(|(slots, _)| slots).ok_or(KernelError::CannotFuse { op, into: apply.name() })
}

/// Run the update `apply` on `outs` (the variable, then its slots, each as
/// long as `g`) with gradient `g`: the one dispatch of an update that the
/// fused kernels ([`mean_apply`], multi-tensor updates) share. `step` is
/// Adam's 1-based step; the others ignore it. `outs` holds at least
/// [`update_slots`] buffers.
pub fn update(
    apply: &Kernel,
    outs: &mut [&mut [f32]],
    g: &[f32],
    lr: f32,
    step: u64,
    op: &'static str,
) -> Result<(), KernelError> {
    match (apply, outs) {
        (Kernel::ApplyGradientDescent {}, [w, ..]) => apply_gradient_descent(w, g, lr),
        (Kernel::ApplyMomentum { momentum, nesterov }, [w, a, ..]) => apply_momentum(w, a, g, lr, *momentum, *nesterov),
        (Kernel::ApplyAdam { beta1, beta2, epsilon }, [w, m, v, ..]) => {
            apply_adam(w, m, v, g, lr, *beta1, *beta2, *epsilon, step)
        }
        (Kernel::ApplyRmsProp { decay, momentum, epsilon }, [w, ms, mom, ..]) => {
            apply_rmsprop(w, ms, mom, g, lr, *decay, *momentum, *epsilon)
        }
        (Kernel::ApplyAdagrad {}, [w, a, ..]) => apply_adagrad(w, a, g, lr),
        _ => return Err(KernelError::CannotFuse { op, into: apply.name() }),
    }
    Ok(())
}

/// `step += 1` (wrapping) on the i32 scalar step variable (`Kernel::IncrementStep`).
pub fn increment_step(step: &mut [i32]) {
    if let Some(s) = step.first_mut() {
        *s = s.wrapping_add(1);
    }
}

/// Elements per block of [`mean_apply`]: the reduced gradient of one block
/// lives in a stack buffer (16 KiB, in L1), never in memory.
pub const MEAN_BLOCK: usize = 4096;

/// `Kernel::MeanApply`: the tower reduction fused into the optimizer update
/// that is its only consumer. Per block of [`MEAN_BLOCK`] elements, the
/// towers' weighted gradient `Σ weights[i]·grads[i]` is formed in scratch on
/// the stack, then `apply` (any update of [`update_arity`]) updates that block of `outs` (the variable, then its slots)
/// in place. One pass over memory, no allocation. `step` is Adam's 1-based
/// step ([`adam_step`]); the other updates ignore it.
pub fn mean_apply(
    grads: &[&[f32]],
    weights: &[f32],
    apply: &Kernel,
    step: u64,
    lr: f32,
    outs: &mut [&mut [f32]],
) -> Result<(), KernelError> {
    debug_assert_eq!(grads.len(), weights.len());
    let slots = update_slots(apply, "mean_apply")?;
    if outs.len() < slots {
        return Err(KernelError::CannotFuse { op: "mean_apply", into: apply.name() });
    }
    let len = outs[0].len();
    let mut scratch = [0f32; MEAN_BLOCK];
    let mut start = 0;
    while start < len {
        let end = (start + MEAN_BLOCK).min(len);
        let g = &mut scratch[..end - start];
        weighted_sum_range(grads, weights, start, end, g);
        // This block of the variable and of each slot.
        let mut block: [&mut [f32]; 3] = [&mut [], &mut [], &mut []];
        for (b, o) in block.iter_mut().zip(outs.iter_mut()) {
            *b = &mut o[start..end];
        }
        update(apply, &mut block[..slots], g, lr, step, "mean_apply")?;
        start = end;
    }
    Ok(())
}

/// `out = Σ weights[i]·grads[i][start..end]`, through a fixed-size array of
/// sub-slices on the stack (no allocation; towers beyond
/// [`MAX_TOWERS_ON_STACK`] go in rounds).
fn weighted_sum_range(grads: &[&[f32]], weights: &[f32], start: usize, end: usize, out: &mut [f32]) {
    let mut parts: [&[f32]; MAX_TOWERS_ON_STACK] = [&[]; MAX_TOWERS_ON_STACK];
    let mut first = true;
    for (gs, ws) in grads.chunks(MAX_TOWERS_ON_STACK).zip(weights.chunks(MAX_TOWERS_ON_STACK)) {
        for (p, g) in parts.iter_mut().zip(gs) {
            *p = &g[start..end];
        }
        if first {
            weighted_sum(&parts[..gs.len()], ws, out);
            first = false;
        } else {
            // Later rounds (more towers than fit on the stack) accumulate.
            for (g, w) in parts[..gs.len()].iter().zip(ws) {
                for (o, v) in out.iter_mut().zip(g.iter()) {
                    *o += *w * *v;
                }
            }
        }
    }
    if grads.is_empty() {
        out.fill(0.0);
    }
}

/// Towers whose gradient slices one round of [`mean_apply`] holds on the stack.
pub const MAX_TOWERS_ON_STACK: usize = 16;

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

    /// The fused reduction + update equals the two kernels one after the
    /// other, bit for bit, across block boundaries, for all three updates.
    #[test]
    fn mean_apply_is_weighted_sum_then_apply() {
        let n = MEAN_BLOCK * 2 + 3;
        let g0: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.25 - 0.5).collect();
        let g1: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * -0.125 + 0.3).collect();
        let w = [0.75, 0.25];
        let mut g = vec![0.0; n];
        weighted_sum(&[&g0, &g1], &w, &mut g);
        let kernels = [
            (Kernel::ApplyGradientDescent {}, 0.1),
            (Kernel::ApplyMomentum { momentum: 0.9, nesterov: true }, 0.1),
            (Kernel::ApplyAdam { beta1: 0.9, beta2: 0.999, epsilon: 1e-8 }, 0.01),
        ];
        for (k, lr) in kernels {
            let init = |s: f32| (0..n).map(|i| s + (i % 3) as f32 * 0.01).collect::<Vec<f32>>();
            let (mut a, mut b, mut c) = (init(1.0), init(0.1), init(0.2));
            let (mut x, mut y, mut z) = (a.clone(), b.clone(), c.clone());
            match k {
                Kernel::ApplyGradientDescent {} => apply_gradient_descent(&mut x, &g, lr),
                Kernel::ApplyMomentum { momentum, nesterov } => {
                    apply_momentum(&mut x, &mut y, &g, lr, momentum, nesterov)
                }
                Kernel::ApplyAdam { beta1, beta2, epsilon } => {
                    apply_adam(&mut x, &mut y, &mut z, &g, lr, beta1, beta2, epsilon, 3)
                }
                _ => unreachable!(),
            }
            mean_apply(&[&g0, &g1], &w, &k, 3, lr, &mut [&mut a, &mut b, &mut c]).unwrap();
            assert!(a == x && b == y && c == z, "{}", k.name());
        }
        assert!(mean_apply(&[&g0], &[1.0], &Kernel::L2Loss, 1, 0.1, &mut [&mut g]).is_err());
    }

    /// Every path this CPU has gives the plain loops' bits (the bodies
    /// before SIMD, transcribed here), on lengths around every vector
    /// width and empty, with NaN, infinities and zeros in the gradient.
    #[test]
    fn every_path_matches_the_plain_loops_bit_for_bit() {
        use crate::simd::{dispatch_on, SimdPath};
        use crate::testutil::Lcg;
        let mut r = Lcg::new(61);
        for n in [0usize, 1, 3, 4, 7, 8, 15, 16, 17, 33, 100] {
            let mut g = r.vec(n);
            for (i, v) in g.iter_mut().enumerate() {
                match i % 13 {
                    3 => *v = 0.0,
                    7 => *v = f32::NAN,
                    11 => *v = f32::INFINITY,
                    _ => {}
                }
            }
            let w0 = r.vec(n);
            let a0: Vec<f32> = r.vec(n).iter().map(|v| v.abs()).collect();
            let (lr, mo, b1, b2, eps, lr_t) = (0.05f32, 0.9f32, 0.9f32, 0.999f32, 1e-8f32, 0.0123f32);
            // References: the loops before SIMD.
            let mut sgd = w0.clone();
            for (w, g) in sgd.iter_mut().zip(&g) {
                *w -= lr * *g;
            }
            let mut mom = [(w0.clone(), a0.clone()), (w0.clone(), a0.clone())];
            for (k, (w, a)) in mom.iter_mut().enumerate() {
                for ((w, a), g) in w.iter_mut().zip(a.iter_mut()).zip(&g) {
                    *a = *a * mo + *g;
                    *w -= if k == 1 { lr * (*g + mo * *a) } else { lr * *a };
                }
            }
            let (mut aw, mut am, mut av) = (w0.clone(), a0.clone(), a0.clone());
            for (((w, m), v), g) in aw.iter_mut().zip(am.iter_mut()).zip(av.iter_mut()).zip(&g) {
                *m += (*g - *m) * (1.0 - b1);
                *v += (*g * *g - *v) * (1.0 - b2);
                *w -= lr_t * *m / (v.sqrt() + eps);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for path in SimdPath::available() {
                let mut w = w0.clone();
                dispatch_on(path, body::Sgd { w: &mut w, g: &g, lr });
                assert_eq!(bits(&w), bits(&sgd), "sgd {path} n={n}");
                for (k, (ww, wa)) in mom.iter().enumerate() {
                    let (mut w, mut a) = (w0.clone(), a0.clone());
                    dispatch_on(
                        path,
                        body::Momentum { w: &mut w, a: &mut a, g: &g, lr, momentum: mo, nesterov: k == 1 },
                    );
                    assert_eq!((bits(&w), bits(&a)), (bits(ww), bits(wa)), "momentum {k} {path} n={n}");
                }
                let (mut w, mut m, mut v) = (w0.clone(), a0.clone(), a0.clone());
                dispatch_on(
                    path,
                    body::Adam {
                        w: &mut w,
                        m: &mut m,
                        v: &mut v,
                        g: &g,
                        lr_t,
                        one_minus_beta1: 1.0 - b1,
                        one_minus_beta2: 1.0 - b2,
                        epsilon: eps,
                    },
                );
                assert_eq!((bits(&w), bits(&m), bits(&v)), (bits(&aw), bits(&am), bits(&av)), "adam {path} n={n}");
            }
        }
    }

    #[test]
    fn step_counter() {
        let mut s = [41];
        increment_step(&mut s);
        assert_eq!(s, [42]);
        assert_eq!(adam_step(&s), 43);
        assert_eq!(adam_step(&[-3]), 1);
        increment_step(&mut []);
    }
}
