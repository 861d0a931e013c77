//! Seeded initializers, deterministic across platforms and thread counts.
//!
//! Every random initializer draws from a `ChaCha8Rng` whose 32-byte seed is
//! `seed.to_le_bytes() ++ fnv1a64(key).to_le_bytes() ++ [0; 16]`, where `key`
//! is a stable string such as the variable's scoped name and FNV-1a 64 uses
//! offset basis `0xcbf29ce484222325` and prime `0x100000001b3` over the
//! key's UTF-8 bytes. Values are drawn sequentially over the flat buffer.
//!
//! Conversions are done here (not by `rand`'s distributions, which may
//! change between versions): uniform `[0, 1)` = `(u32 >> 8) * 2^-24`;
//! normals by Box-Muller from two such uniforms (`u1` mapped to `(0, 1]`),
//! one normal per pair (the cosine branch).

use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::random::u32_to_unit;

/// FNV-1a 64-bit hash of `key`'s bytes ([`towers_vocab::fnv1a64`]).
pub fn fnv1a64(key: &str) -> u64 {
    towers_vocab::fnv1a64(key.as_bytes())
}

fn rng(seed: u64, key: &str) -> ChaCha8Rng {
    let mut s = [0u8; 32];
    s[..8].copy_from_slice(&seed.to_le_bytes());
    s[8..16].copy_from_slice(&fnv1a64(key).to_le_bytes());
    ChaCha8Rng::from_seed(s)
}

fn normal(r: &mut ChaCha8Rng) -> f32 {
    let u1 = 1.0 - u32_to_unit(r.next_u32()) as f64; // (0, 1]
    let u2 = u32_to_unit(r.next_u32()) as f64;
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// `x[i] = value` (zeros, ones, constant).
pub fn fill(x: &mut [f32], value: f32) {
    x.fill(value);
}

/// Uniform in `[lo, hi)`.
pub fn uniform(x: &mut [f32], lo: f32, hi: f32, seed: u64, key: &str) {
    let mut r = rng(seed, key);
    for v in x.iter_mut() {
        *v = lo + (hi - lo) * u32_to_unit(r.next_u32());
    }
}

/// Normal(mean, stddev) truncated to within 2 stddev: draws outside are
/// redrawn, as TF's `truncated_normal`.
pub fn truncated_normal(x: &mut [f32], mean: f32, stddev: f32, seed: u64, key: &str) {
    let mut r = rng(seed, key);
    for v in x.iter_mut() {
        let z = loop {
            let z = normal(&mut r);
            if z.abs() <= 2.0 {
                break z;
            }
        };
        *v = mean + stddev * z;
    }
}

/// TF's `(fan_in, fan_out)` for a variable shape: `[]` -> (1, 1);
/// `[n]` -> (n, n); `[in, out]` -> (in, out); rank > 2 (conv filters
/// `[kh, kw, in, out]`): receptive = product of all but the last two dims,
/// `(in * receptive, out * receptive)`.
pub fn fans(shape: &[usize]) -> (usize, usize) {
    match shape.len() {
        0 => (1, 1),
        1 => (shape[0], shape[0]),
        2 => (shape[0], shape[1]),
        r => {
            let rf: usize = shape[..r - 2].iter().product();
            (shape[r - 2] * rf, shape[r - 1] * rf)
        }
    }
}

/// Glorot (Xavier) uniform: `U(-limit, limit)`, `limit = sqrt(6 / (fan_in + fan_out))`
/// with fans from [`fans`] of `shape`.
pub fn glorot_uniform(x: &mut [f32], shape: &[usize], seed: u64, key: &str) {
    let (fi, fo) = fans(shape);
    let limit = (6.0 / (fi + fo).max(1) as f64).sqrt() as f32;
    uniform(x, -limit, limit, seed, key);
}

// initializers of issue 22

/// Re-exports: the initializer options are vocabulary (`towers_vocab::init`).
pub use towers_vocab::init::{Distribution, FanMode};

/// The stddev of a standard normal truncated to [-2, 2]: TF's correction
/// `.87962566103423978` in `VarianceScaling.__call__` (init_ops.py).
pub const TRUNCATED_NORMAL_STDDEV: f64 = 0.879_625_661_034_239_8;

/// Normal(mean, stddev), untruncated (TF's `random_normal_initializer`).
pub fn random_normal(x: &mut [f32], mean: f32, stddev: f32, seed: u64, key: &str) {
    let mut r = rng(seed, key);
    for v in x.iter_mut() {
        *v = mean + stddev * normal(&mut r);
    }
}

/// The variance `scale / max(1, fan)` that [`variance_scaling`] draws with,
/// for `shape`'s fans ([`fans`]) and `mode` (TF's `VarianceScaling`).
pub fn variance_scaling_variance(shape: &[usize], scale: f32, mode: FanMode) -> f64 {
    let (fi, fo) = fans(shape);
    let fan = match mode {
        FanMode::FanIn => fi as f64,
        FanMode::FanOut => fo as f64,
        FanMode::FanAvg => (fi + fo) as f64 / 2.0,
    };
    scale as f64 / fan.max(1.0)
}

/// TF's `variance_scaling_initializer(scale, mode, distribution)`: draws
/// with variance `s = scale / max(1, fan)` ([`variance_scaling_variance`]):
/// truncated normal with stddev `sqrt(s) / 0.87962566`, normal with stddev
/// `sqrt(s)`, or uniform in `±sqrt(3 s)`. He (Kaiming) normal is
/// `scale = 2, FanIn, TruncatedNormal`.
pub fn variance_scaling(
    x: &mut [f32],
    shape: &[usize],
    scale: f32,
    mode: FanMode,
    distribution: Distribution,
    seed: u64,
    key: &str,
) {
    let s = variance_scaling_variance(shape, scale, mode);
    match distribution {
        Distribution::TruncatedNormal => {
            truncated_normal(x, 0.0, (s.sqrt() / TRUNCATED_NORMAL_STDDEV) as f32, seed, key)
        }
        Distribution::Normal => random_normal(x, 0.0, s.sqrt() as f32, seed, key),
        Distribution::Uniform => {
            let limit = (3.0 * s).sqrt() as f32;
            uniform(x, -limit, limit, seed, key)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sample mean and standard deviation, in f64.
    fn moments(x: &[f32]) -> (f64, f64) {
        let n = x.len() as f64;
        let m = x.iter().map(|v| *v as f64).sum::<f64>() / n;
        (m, (x.iter().map(|v| (*v as f64 - m).powi(2)).sum::<f64>() / n).sqrt())
    }

    /// Fans of a dense [in, out] and a conv HWIO filter, per mode (TF's
    /// `_compute_fans`: receptive field = kh*kw).
    #[test]
    fn variance_scaling_fans_dense_and_conv() {
        assert_eq!(variance_scaling_variance(&[784, 256], 2.0, FanMode::FanIn), 2.0 / 784.0);
        assert_eq!(variance_scaling_variance(&[784, 256], 1.0, FanMode::FanOut), 1.0 / 256.0);
        assert_eq!(variance_scaling_variance(&[784, 256], 1.0, FanMode::FanAvg), 1.0 / 520.0);
        // [5, 5, 3, 64]: fan_in = 5*5*3 = 75, fan_out = 5*5*64 = 1600.
        assert_eq!(variance_scaling_variance(&[5, 5, 3, 64], 2.0, FanMode::FanIn), 2.0 / 75.0);
        assert_eq!(variance_scaling_variance(&[5, 5, 3, 64], 1.0, FanMode::FanOut), 1.0 / 1600.0);
        assert_eq!(variance_scaling_variance(&[5, 5, 3, 64], 1.0, FanMode::FanAvg), 1.0 / 837.5);
        // A scalar's fans are 1 (never a division by 0).
        assert_eq!(variance_scaling_variance(&[], 2.0, FanMode::FanIn), 2.0);
    }

    /// 60,000 draws per distribution: the sample std is the wanted
    /// sqrt(scale / fan) within 2% (its standard error here is ~0.3%), the
    /// mean 0 within 3% of that std; truncated draws stay within 2 of
    /// their (corrected) stddevs, uniform ones within the limit.
    #[test]
    fn variance_scaling_and_random_normal_moments() {
        let shape = [200usize, 300];
        let want = (2.0f64 / 200.0).sqrt(); // He: scale 2, fan_in 200 -> 0.1
        for dist in [Distribution::TruncatedNormal, Distribution::Normal, Distribution::Uniform] {
            let mut x = vec![0.0; 60_000];
            variance_scaling(&mut x, &shape, 2.0, FanMode::FanIn, dist, 9, "conv1/weights");
            let (m, sd) = moments(&x);
            assert!((sd / want - 1.0).abs() < 0.02, "{dist:?}: sd {sd} vs {want}");
            assert!(m.abs() < 0.03 * want, "{dist:?}: mean {m}");
            let bound = match dist {
                Distribution::TruncatedNormal => 2.0 * want / TRUNCATED_NORMAL_STDDEV,
                Distribution::Uniform => 3f64.sqrt() * want,
                Distribution::Normal => f64::INFINITY,
            };
            assert!(x.iter().all(|v| (*v as f64).abs() <= bound * (1.0 + 1e-6)), "{dist:?}");
        }
        let mut x = vec![0.0; 60_000];
        random_normal(&mut x, 0.5, 0.02, 4, "w");
        let (m, sd) = moments(&x);
        assert!((m - 0.5).abs() < 0.03 * 0.02, "mean {m}");
        assert!((sd / 0.02 - 1.0).abs() < 0.02, "sd {sd}");
        // Untruncated: some draws fall beyond 3 stddev (about 0.27% of them).
        assert!(x.iter().any(|v| (*v - 0.5).abs() > 3.0 * 0.02));
    }

    #[test]
    fn fnv_reference_values() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64("a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64("foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn deterministic_and_keyed() {
        let (mut a, mut b, mut c) = (vec![0.0; 100], vec![0.0; 100], vec![0.0; 100]);
        uniform(&mut a, -1.0, 1.0, 5, "dense/kernel");
        uniform(&mut b, -1.0, 1.0, 5, "dense/kernel");
        uniform(&mut c, -1.0, 1.0, 5, "dense/bias");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
        uniform(&mut c, -1.0, 1.0, 6, "dense/kernel");
        assert_ne!(a, c);
    }

    #[test]
    fn truncated_normal_moments() {
        let mut x = vec![0.0; 50_000];
        truncated_normal(&mut x, 1.0, 0.5, 1, "w");
        assert!(x.iter().all(|v| (*v - 1.0).abs() <= 1.0 + 1e-6));
        let n = x.len() as f64;
        let m = x.iter().map(|v| *v as f64).sum::<f64>() / n;
        let sd = (x.iter().map(|v| (*v as f64 - m).powi(2)).sum::<f64>() / n).sqrt();
        // A standard normal truncated at +-2 has sd 0.8796; times 0.5.
        assert!((m - 1.0).abs() < 0.01, "mean {m}");
        assert!((sd - 0.5 * 0.8796).abs() < 0.01, "sd {sd}");
    }

    #[test]
    fn glorot_limits_and_fans() {
        assert_eq!(fans(&[5, 5, 1, 12]), (25, 300));
        assert_eq!(fans(&[784, 256]), (784, 256));
        let mut x = vec![0.0; 10_000];
        glorot_uniform(&mut x, &[100, 50], 3, "k");
        let limit = (6.0f32 / 150.0).sqrt();
        assert!(x.iter().all(|v| v.abs() <= limit));
        assert!(x.iter().any(|v| v.abs() > 0.95 * limit));
        fill(&mut x, 0.5);
        assert!(x.iter().all(|v| *v == 0.5));
    }
}
