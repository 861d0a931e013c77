//! The optimizer updates' per-element bodies, written once over
//! [`pulp::Simd`] and run through [`crate::simd::dispatch`] on AVX-512,
//! AVX2 + FMA, NEON or scalar.
//!
//! Each element is updated on its own (lanes are elements), with exactly
//! the operations of TF1's formulas as `mod.rs` writes them, in the same
//! order, each rounded on its own: products and sums are never fused into
//! an FMA, `sqrt` and `/` are the IEEE-exact instructions. The results are
//! therefore **bit-identical on every path**, and to the plain loops these
//! replaced (the references in the tests). The tail shorter than a vector
//! is one masked vector ([`crate::lanes`]).

use pulp::{Simd, WithSimd};

use crate::lanes::{load, store};

/// `w -= lr * g`.
pub(super) struct Sgd<'a> {
    pub w: &'a mut [f32],
    pub g: &'a [f32],
    pub lr: f32,
}

impl WithSimd for Sgd<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, s: S) {
        let Sgd { w, g, lr } = self;
        let lr = s.splat_f32s(lr);
        let n = w.len().min(g.len());
        let mut i = 0;
        while i < n {
            let e = (i + S::F32_LANES).min(n);
            let nw = s.sub_f32s(load(s, &w[i..e]), s.mul_f32s(lr, load(s, &g[i..e])));
            store(s, &mut w[i..e], nw);
            i = e;
        }
    }
}

/// `a = a * momentum + g`; `w -= lr * a`, or with Nesterov
/// `w -= lr * (g + momentum * a)`.
pub(super) struct Momentum<'a> {
    pub w: &'a mut [f32],
    pub a: &'a mut [f32],
    pub g: &'a [f32],
    pub lr: f32,
    pub momentum: f32,
    pub nesterov: bool,
}

impl WithSimd for Momentum<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, s: S) {
        let Momentum { w, a, g, lr, momentum, nesterov } = self;
        let (lr, mo) = (s.splat_f32s(lr), s.splat_f32s(momentum));
        let n = w.len().min(a.len()).min(g.len());
        let mut i = 0;
        while i < n {
            let e = (i + S::F32_LANES).min(n);
            let gv = load(s, &g[i..e]);
            let av = s.add_f32s(s.mul_f32s(load(s, &a[i..e]), mo), gv);
            store(s, &mut a[i..e], av);
            let step = if nesterov { s.mul_f32s(lr, s.add_f32s(gv, s.mul_f32s(mo, av))) } else { s.mul_f32s(lr, av) };
            let nw = s.sub_f32s(load(s, &w[i..e]), step);
            store(s, &mut w[i..e], nw);
            i = e;
        }
    }
}

/// `m += (g - m) * (1 - beta1)`; `v += (g * g - v) * (1 - beta2)`;
/// `w -= lr_t * m / (sqrt(v) + epsilon)`, with `one_minus_beta1/2` and
/// `lr_t` computed by the caller.
pub(super) struct Adam<'a> {
    pub w: &'a mut [f32],
    pub m: &'a mut [f32],
    pub v: &'a mut [f32],
    pub g: &'a [f32],
    pub lr_t: f32,
    pub one_minus_beta1: f32,
    pub one_minus_beta2: f32,
    pub epsilon: f32,
}

impl WithSimd for Adam<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, s: S) {
        let Adam { w, m, v, g, lr_t, one_minus_beta1, one_minus_beta2, epsilon } = self;
        let (lr_t, b1, b2, eps) =
            (s.splat_f32s(lr_t), s.splat_f32s(one_minus_beta1), s.splat_f32s(one_minus_beta2), s.splat_f32s(epsilon));
        let n = w.len().min(m.len()).min(v.len()).min(g.len());
        let mut i = 0;
        while i < n {
            let e = (i + S::F32_LANES).min(n);
            let gv = load(s, &g[i..e]);
            let mv = load(s, &m[i..e]);
            let mv = s.add_f32s(mv, s.mul_f32s(s.sub_f32s(gv, mv), b1));
            store(s, &mut m[i..e], mv);
            let vv = load(s, &v[i..e]);
            let vv = s.add_f32s(vv, s.mul_f32s(s.sub_f32s(s.mul_f32s(gv, gv), vv), b2));
            store(s, &mut v[i..e], vv);
            let step = s.div_f32s(s.mul_f32s(lr_t, mv), s.add_f32s(s.sqrt_f32s(vv), eps));
            let nw = s.sub_f32s(load(s, &w[i..e]), step);
            store(s, &mut w[i..e], nw);
            i = e;
        }
    }
}
