//! Helpers shared by the unit tests: a tiny deterministic generator and
//! tolerance checks. Test-only.

/// A 64-bit LCG (Knuth's MMIX constants); plenty for test data.
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Self {
        Lcg(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }
    /// Uniform in [-1, 1).
    pub fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
    /// Uniform integer in [0, n).
    #[allow(dead_code)]
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next() + 1.0) * 0.5 * n as f32) as usize).min(n - 1)
    }
}

/// Asserts `|a - b| <= tol * (1 + |b|)` elementwise.
pub fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: length mismatch");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x - y).abs() <= tol * (1.0 + y.abs()) || (x.is_nan() && y.is_nan());
        assert!(ok, "{what}: index {i}: got {x}, want {y} (tol {tol})");
    }
}

/// Central finite difference of a scalar function `f` at `x` along every
/// coordinate, in f64: `(f(x + h e_i) - f(x - h e_i)) / 2h`.
pub fn numeric_grad(x: &[f32], h: f64, mut f: impl FnMut(&[f32]) -> f64) -> Vec<f32> {
    let mut xp = x.to_vec();
    (0..x.len())
        .map(|i| {
            let orig = xp[i];
            // The step actually taken is what f32 can represent.
            let (hi, lo) = ((orig as f64 + h) as f32, (orig as f64 - h) as f32);
            xp[i] = hi;
            let fp = f(&xp);
            xp[i] = lo;
            let fm = f(&xp);
            xp[i] = orig;
            ((fp - fm) / (hi as f64 - lo as f64)) as f32
        })
        .collect()
}
