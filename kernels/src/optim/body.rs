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

// optimizers of issue 22

/// TF1's `ApplyRMSProp` (training_ops.cc), per element:
/// `ms += (g * g - ms) * one_minus_decay`;
/// `mom = mom * momentum + (g * lr) / sqrt(ms + epsilon)`; `w -= mom`.
pub(super) struct RmsProp<'a> {
    pub w: &'a mut [f32],
    pub ms: &'a mut [f32],
    pub mom: &'a mut [f32],
    pub g: &'a [f32],
    /// `[lr, 1 - decay, momentum, epsilon]`.
    pub k: [f32; 4],
}

impl WithSimd for RmsProp<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, s: S) {
        let RmsProp { w, ms, mom, g, k } = self;
        let k = k.map(|v| s.splat_f32s(v));
        let n = w.len().min(ms.len()).min(mom.len()).min(g.len());
        let (wh, wt) = S::as_mut_simd_f32s(&mut w[..n]);
        let (sh, st) = S::as_mut_simd_f32s(&mut ms[..n]);
        let (mh, mt) = S::as_mut_simd_f32s(&mut mom[..n]);
        let (gh, gt) = S::as_simd_f32s(&g[..n]);
        for (((w, ms), mom), g) in wh.iter_mut().zip(sh.iter_mut()).zip(mh.iter_mut()).zip(gh) {
            (*w, *ms, *mom) = rmsprop_step(s, *w, *ms, *mom, *g, k);
        }
        if !wt.is_empty() {
            let (w, ms) = (s.partial_load_f32s(wt), s.partial_load_f32s(st));
            let (mom, g) = (s.partial_load_f32s(mt), s.partial_load_f32s(gt));
            let (nw, nms, nmom) = rmsprop_step(s, w, ms, mom, g, k);
            s.partial_store_f32s(wt, nw);
            s.partial_store_f32s(st, nms);
            s.partial_store_f32s(mt, nmom);
        }
    }
}

/// One vector of [`RmsProp`] (a function, always inlined, as `adam_step`).
#[inline(always)]
fn rmsprop_step<S: Simd>(
    s: S,
    w: S::f32s,
    ms: S::f32s,
    mom: S::f32s,
    g: S::f32s,
    k: [S::f32s; 4],
) -> (S::f32s, S::f32s, S::f32s) {
    let [lr, omd, mo, eps] = k;
    let ms = s.add_f32s(ms, s.mul_f32s(s.sub_f32s(s.mul_f32s(g, g), ms), omd));
    let mom = s.add_f32s(s.mul_f32s(mom, mo), s.div_f32s(s.mul_f32s(g, lr), s.sqrt_f32s(s.add_f32s(ms, eps))));
    (s.sub_f32s(w, mom), ms, mom)
}

/// TF1's `ApplyAdagrad` (training_ops.cc), per element:
/// `accum += g * g`; `w -= (g * lr) / sqrt(accum)` (TF multiplies by
/// `accum.rsqrt()`; one correctly rounded division is the same value up
/// to one rounding, and exact on every SIMD path).
pub(super) struct Adagrad<'a> {
    pub w: &'a mut [f32],
    pub a: &'a mut [f32],
    pub g: &'a [f32],
    pub lr: f32,
}

impl WithSimd for Adagrad<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, s: S) {
        let Adagrad { w, a, g, lr } = self;
        let lr = s.splat_f32s(lr);
        let n = w.len().min(a.len()).min(g.len());
        let (wh, wt) = S::as_mut_simd_f32s(&mut w[..n]);
        let (ah, at) = S::as_mut_simd_f32s(&mut a[..n]);
        let (gh, gt) = S::as_simd_f32s(&g[..n]);
        for ((w, a), g) in wh.iter_mut().zip(ah.iter_mut()).zip(gh) {
            (*w, *a) = adagrad_step(s, *w, *a, *g, lr);
        }
        if !wt.is_empty() {
            let (w, a, g) = (s.partial_load_f32s(wt), s.partial_load_f32s(at), s.partial_load_f32s(gt));
            let (nw, na) = adagrad_step(s, w, a, g, lr);
            s.partial_store_f32s(wt, nw);
            s.partial_store_f32s(at, na);
        }
    }
}

/// One vector of [`Adagrad`].
#[inline(always)]
fn adagrad_step<S: Simd>(s: S, w: S::f32s, a: S::f32s, g: S::f32s, lr: S::f32s) -> (S::f32s, S::f32s) {
    let a = s.add_f32s(a, s.mul_f32s(g, g));
    (s.sub_f32s(w, s.div_f32s(s.mul_f32s(g, lr), s.sqrt_f32s(a))), a)
}
