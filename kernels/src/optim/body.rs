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
//! is one masked vector (pulp's partial loads and stores).

use pulp::{Simd, WithSimd};

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
        let ((wh, wt), (gh, gt)) = (S::as_mut_simd_f32s(&mut w[..n]), S::as_simd_f32s(&g[..n]));
        for (w, g) in wh.iter_mut().zip(gh) {
            *w = s.sub_f32s(*w, s.mul_f32s(lr, *g));
        }
        if !wt.is_empty() {
            let v = s.sub_f32s(s.partial_load_f32s(wt), s.mul_f32s(lr, s.partial_load_f32s(gt)));
            s.partial_store_f32s(wt, v);
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
        let (wh, wt) = S::as_mut_simd_f32s(&mut w[..n]);
        let (ah, at) = S::as_mut_simd_f32s(&mut a[..n]);
        let (gh, gt) = S::as_simd_f32s(&g[..n]);
        for ((w, a), g) in wh.iter_mut().zip(ah.iter_mut()).zip(gh) {
            (*w, *a) = momentum_step(s, *w, *a, *g, lr, mo, nesterov);
        }
        if !wt.is_empty() {
            let (w, a, g) = (s.partial_load_f32s(wt), s.partial_load_f32s(at), s.partial_load_f32s(gt));
            let (nw, na) = momentum_step(s, w, a, g, lr, mo, nesterov);
            s.partial_store_f32s(wt, nw);
            s.partial_store_f32s(at, na);
        }
    }
}

/// `(w, a)` from `(w, a, g)`: one vector of [`Momentum`]. A function, not
/// a closure, so that it is always inlined into the path's
/// `#[target_feature]` context.
#[inline(always)]
fn momentum_step<S: Simd>(
    s: S,
    w: S::f32s,
    a: S::f32s,
    g: S::f32s,
    lr: S::f32s,
    mo: S::f32s,
    nesterov: bool,
) -> (S::f32s, S::f32s) {
    let a = s.add_f32s(s.mul_f32s(a, mo), g);
    let step = if nesterov { s.mul_f32s(lr, s.add_f32s(g, s.mul_f32s(mo, a))) } else { s.mul_f32s(lr, a) };
    (s.sub_f32s(w, step), a)
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
        let k = [lr_t, b1, b2, eps];
        let (wh, wt) = S::as_mut_simd_f32s(&mut w[..n]);
        let (mh, mt) = S::as_mut_simd_f32s(&mut m[..n]);
        let (vh, vt) = S::as_mut_simd_f32s(&mut v[..n]);
        let (gh, gt) = S::as_simd_f32s(&g[..n]);
        for (((w, m), v), g) in wh.iter_mut().zip(mh.iter_mut()).zip(vh.iter_mut()).zip(gh) {
            (*w, *m, *v) = adam_step(s, *w, *m, *v, *g, k);
        }
        if !wt.is_empty() {
            let (w, m) = (s.partial_load_f32s(wt), s.partial_load_f32s(mt));
            let (v, g) = (s.partial_load_f32s(vt), s.partial_load_f32s(gt));
            let (nw, nm, nv) = adam_step(s, w, m, v, g, k);
            s.partial_store_f32s(wt, nw);
            s.partial_store_f32s(mt, nm);
            s.partial_store_f32s(vt, nv);
        }
    }
}

/// `(w, m, v)` from `(w, m, v, g)` and `[lr_t, 1 - beta1, 1 - beta2,
/// epsilon]`: one vector of [`Adam`] (a function, not a closure: always
/// inlined into the path's `#[target_feature]` context; a closure that is
/// not made every vector operation a call, 25x slower).
#[inline(always)]
fn adam_step<S: Simd>(
    s: S,
    w: S::f32s,
    m: S::f32s,
    v: S::f32s,
    g: S::f32s,
    k: [S::f32s; 4],
) -> (S::f32s, S::f32s, S::f32s) {
    let [lr_t, b1, b2, eps] = k;
    let m = s.add_f32s(m, s.mul_f32s(s.sub_f32s(g, m), b1));
    let v = s.add_f32s(v, s.mul_f32s(s.sub_f32s(s.mul_f32s(g, g), v), b2));
    let step = s.div_f32s(s.mul_f32s(lr_t, m), s.add_f32s(s.sqrt_f32s(v), eps));
    (s.sub_f32s(w, step), m, v)
}
