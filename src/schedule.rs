//! Learning-rate schedules, computed on the host from the global step and
//! written into the plan's `learning_rate` variable before each step (the
//! optimizer updates read it as an input): a schedule never recompiles
//! anything, and a resumed run recomputes the rate from its global step.
//!
//! With `step` the 0-based global step of the update (the first update is
//! step 0) and `base` the base rate:
//! - `constant`: `base`;
//! - `step` decay: `base * rate^floor(step / every)` (TF's
//!   `exponential_decay(staircase=True)`);
//! - `exponential` decay: `base * rate^(step / every)` (TF's
//!   `exponential_decay`, not staircase: a little smaller every step);
//! - `cosine`: `min + (base - min) * (1 + cos(pi * t / total)) / 2` with `t`
//!   the step after warmup capped at `total` (TF's `cosine_decay` with alpha =
//!   min / base);
//! - linear warmup over the first `warmup` steps, for any of them:
//!   `base * (step + 1) / warmup`, then the schedule from its own start.
//!
//! `--scale-lr` applies the linear scaling rule (Goyal et al. 2017, "Accurate,
//! Large Minibatch SGD"): `base = lr * global_batch / 256`, 256 being the
//! paper's reference batch, so a run that multiplies its batch with towers
//! keeps the per-example step size.

/// The shape of the schedule after warmup.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decay {
    Constant,
    /// Multiply by `rate` every `every` steps.
    Step {
        every: usize,
        rate: f32,
    },
    /// Multiply by `rate` over every `every` steps, continuously.
    Exponential {
        every: usize,
        rate: f32,
    },
    /// Cosine from the base rate down to `min` over `total` steps.
    Cosine {
        total: usize,
        min: f32,
    },
}

/// A learning-rate schedule (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    pub base: f32,
    pub decay: Decay,
    pub warmup: usize,
}

/// The reference batch of the linear scaling rule.
pub const SCALE_REFERENCE_BATCH: usize = 256;

impl Schedule {
    /// A constant rate.
    pub fn constant(lr: f32) -> Schedule {
        Schedule { base: lr, decay: Decay::Constant, warmup: 0 }
    }

    /// The base rate scaled by the linear scaling rule for `global_batch`.
    pub fn scaled_base(lr: f32, global_batch: usize) -> f32 {
        lr * global_batch as f32 / SCALE_REFERENCE_BATCH as f32
    }

    /// The learning rate of the update at 0-based global step `step`.
    pub fn at(&self, step: usize) -> f32 {
        if step < self.warmup {
            return self.base * (step + 1) as f32 / self.warmup as f32;
        }
        let t = step - self.warmup;
        match self.decay {
            Decay::Constant => self.base,
            Decay::Step { every, rate } => self.base * rate.powi((t / every.max(1)) as i32),
            Decay::Exponential { every, rate } => {
                (self.base as f64 * (rate as f64).powf(t as f64 / every.max(1) as f64)) as f32
            }
            Decay::Cosine { total, min } => {
                let p = t.min(total) as f64 / total.max(1) as f64;
                let c = 0.5 * (1.0 + (std::f64::consts::PI * p).cos());
                (min as f64 + (self.base - min) as f64 * c) as f32
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() <= 1e-7 * b.abs().max(1.0)
    }

    #[test]
    fn warmup_then_staircase_decay() {
        // base 0.1, warmup 4: 0.025, 0.05, 0.075, 0.1; then x0.5 every 10 steps.
        let s = Schedule { base: 0.1, decay: Decay::Step { every: 10, rate: 0.5 }, warmup: 4 };
        let got: Vec<f32> = [0, 1, 2, 3, 4, 13, 14, 23, 24].iter().map(|&k| s.at(k)).collect();
        let want = [0.025, 0.05, 0.075, 0.1, 0.1, 0.1, 0.05, 0.05, 0.025];
        for (g, w) in got.iter().zip(want) {
            assert!(close(*g, w), "{got:?} vs {want:?}");
        }
    }

    /// TF's `exponential_decay(0.1, step, 10, 0.5)`: 0.1 · 0.5^(step/10).
    #[test]
    fn exponential_decay_is_continuous() {
        let s = Schedule { base: 0.1, decay: Decay::Exponential { every: 10, rate: 0.5 }, warmup: 0 };
        for (k, want) in [(0usize, 0.1f64), (5, 0.1 * 0.5f64.sqrt()), (10, 0.05), (25, 0.1 * 0.5f64.powf(2.5))] {
            assert!(close(s.at(k), want as f32), "step {k}: {} vs {want}", s.at(k));
        }
    }

    #[test]
    fn cosine_runs_from_base_to_min_and_stays() {
        let s = Schedule { base: 0.2, decay: Decay::Cosine { total: 100, min: 0.02 }, warmup: 0 };
        assert!(close(s.at(0), 0.2));
        // Halfway: min + (base - min) / 2 = 0.11.
        assert!(close(s.at(50), 0.11), "{}", s.at(50));
        assert!(close(s.at(100), 0.02));
        assert!(close(s.at(1000), 0.02));
    }

    #[test]
    fn constant_and_the_linear_scaling_rule() {
        assert_eq!(Schedule::constant(0.05).at(12345), 0.05);
        // Goyal et al.: 0.1 at batch 256; batch 1024 (e.g. 4 towers of 256) gives 0.4.
        assert!(close(Schedule::scaled_base(0.1, 1024), 0.4));
        assert!(close(Schedule::scaled_base(0.1, 32), 0.0125));
    }
}
