//! The pooling kernels' bodies, written once over [`pulp::Simd`] and run
//! through [`crate::simd::dispatch`] on AVX-512, AVX2 + FMA, NEON or scalar.
//!
//! Layout: a window's cells are NHWC rows of `c` contiguous channels, so
//! each cell is one vector per block of `S::F32_LANES` channels (the last
//! block masked: [`crate::lanes`]). Vector lanes are independent channels:
//! no value depends on the lane count, and every path gives the same bits.
//! Per output element, the operations and their order are those of the
//! plain loops they replace (the references in `tests.rs`):
//! - max: `acc = v > acc ? v : acc` over the window's cells in row-major
//!   order, from `-inf` (a NaN input never replaces the running value);
//! - max gradient: the first cell (row-major) with `x == y` gets `dy`, every
//!   other cell `+0.0`; disjoint windows store, overlapping ones add to a
//!   zero-filled `dx` (`dx + (hit ? dy : +0.0)`);
//! - avg: `(((0 + v0) + v1) + ...) * (1 / count)`; its gradient
//!   `dx + dy * (1 / count)`, a product and a sum, never fused.

use pulp::{Simd, WithSimd};

use super::PoolGeom;
use crate::lanes::{load, max_keep, store};
use crate::window::window;

/// The windows of `p`, one call of `f(o, (ylo, yhi), (xlo, xhi), b)` per
/// output pixel, where `o` is the pixel's first float in `y` and `b` the
/// image. A macro, not a closure, so that the body stays inside the
/// caller's `#[target_feature]` context on every path.
macro_rules! each_window {
    ($p:expr, |$o:ident, $ys:ident, $xs:ident, $b:ident| $body:block) => {{
        let p: &PoolGeom = $p;
        let (oh, pt) = p.out_h();
        let (ow, pl) = p.out_w();
        for $b in 0..p.n {
            for oy in 0..oh {
                let $ys = window(oy, p.stride_h, pt, p.kh, p.h);
                for ox in 0..ow {
                    let $xs = window(ox, p.stride_w, pl, p.kw, p.w);
                    let $o = ((($b * oh + oy) * ow + ox) * p.c);
                    $body
                }
            }
        }
    }};
}

/// `y = max_pool(x)`, see [`super::max_pool`].
pub(super) struct MaxPool<'a> {
    pub p: &'a PoolGeom,
    pub x: &'a [f32],
    pub y: &'a mut [f32],
}

impl WithSimd for MaxPool<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, s: S) {
        let MaxPool { p, x, y } = self;
        let c = p.c;
        each_window!(p, |o, ys, xs, b| {
            let mut c0 = 0;
            while c0 < c {
                let nb = (c - c0).min(S::F32_LANES);
                let mut acc = s.splat_f32s(f32::NEG_INFINITY);
                for iy in ys.0..ys.1 {
                    for ix in xs.0..xs.1 {
                        let i = ((b * p.h + iy) * p.w + ix) * c + c0;
                        acc = max_keep(s, load(s, &x[i..i + nb]), acc);
                    }
                }
                store(s, &mut y[o + c0..o + c0 + nb], acc);
                c0 += nb;
            }
        });
    }
}

/// The max-pool gradient's routing, see [`super::max_pool_grad`]. `dx` must
/// be zero wherever no window reaches, and everywhere unless `disjoint`.
/// `relu`: route `y > 0 ? dy : +0.0` instead of `dy` (the gradient of a
/// ReLU whose output is `x`, at the routed cell, whose value is `y`).
pub(super) struct MaxPoolGrad<'a> {
    pub p: &'a PoolGeom,
    pub x: &'a [f32],
    pub y: &'a [f32],
    pub dy: &'a [f32],
    pub dx: &'a mut [f32],
    pub disjoint: bool,
    pub relu: bool,
}

impl WithSimd for MaxPoolGrad<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, s: S) {
        let MaxPoolGrad { p, x, y, dy, dx, disjoint, relu } = self;
        let c = p.c;
        let zero = s.splat_f32s(0.0);
        each_window!(p, |o, ys, xs, b| {
            let mut c0 = 0;
            while c0 < c {
                let nb = (c - c0).min(S::F32_LANES);
                let ym = load(s, &y[o + c0..o + c0 + nb]);
                let mut g = load(s, &dy[o + c0..o + c0 + nb]);
                if relu {
                    g = s.select_f32s(s.greater_than_f32s(ym, zero), g, zero);
                }
                // Set while the channel's gradient is not routed yet (the
                // lanes past `nb` are never stored).
                let mut open = s.equal_f32s(zero, zero);
                for iy in ys.0..ys.1 {
                    for ix in xs.0..xs.1 {
                        let i = ((b * p.h + iy) * p.w + ix) * c + c0;
                        let hit = s.and_m32s(open, s.equal_f32s(load(s, &x[i..i + nb]), ym));
                        let routed = s.select_f32s(hit, g, zero);
                        let d = &mut dx[i..i + nb];
                        if disjoint {
                            store(s, d, routed);
                        } else {
                            let sum = s.add_f32s(load(s, d), routed);
                            store(s, d, sum);
                        }
                        open = s.and_m32s(open, s.not_m32s(hit));
                    }
                }
                c0 += nb;
            }
        });
    }
}

/// `y = avg_pool(x)`, see [`super::avg_pool`].
pub(super) struct AvgPool<'a> {
    pub p: &'a PoolGeom,
    pub x: &'a [f32],
    pub y: &'a mut [f32],
}

impl WithSimd for AvgPool<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, s: S) {
        let AvgPool { p, x, y } = self;
        let c = p.c;
        each_window!(p, |o, ys, xs, b| {
            let inv = s.splat_f32s(1.0 / ((ys.1 - ys.0) * (xs.1 - xs.0)).max(1) as f32);
            let mut c0 = 0;
            while c0 < c {
                let nb = (c - c0).min(S::F32_LANES);
                let mut acc = s.splat_f32s(0.0);
                for iy in ys.0..ys.1 {
                    for ix in xs.0..xs.1 {
                        let i = ((b * p.h + iy) * p.w + ix) * c + c0;
                        acc = s.add_f32s(acc, load(s, &x[i..i + nb]));
                    }
                }
                store(s, &mut y[o + c0..o + c0 + nb], s.mul_f32s(acc, inv));
                c0 += nb;
            }
        });
    }
}

/// `dx += avg_pool_grad(dy)` on a zero-filled `dx`, see [`super::avg_pool_grad`].
pub(super) struct AvgPoolGrad<'a> {
    pub p: &'a PoolGeom,
    pub dy: &'a [f32],
    pub dx: &'a mut [f32],
}

impl WithSimd for AvgPoolGrad<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, s: S) {
        let AvgPoolGrad { p, dy, dx } = self;
        let c = p.c;
        each_window!(p, |o, ys, xs, b| {
            let inv = s.splat_f32s(1.0 / ((ys.1 - ys.0) * (xs.1 - xs.0)).max(1) as f32);
            let mut c0 = 0;
            while c0 < c {
                let nb = (c - c0).min(S::F32_LANES);
                let g = s.mul_f32s(load(s, &dy[o + c0..o + c0 + nb]), inv);
                for iy in ys.0..ys.1 {
                    for ix in xs.0..xs.1 {
                        let i = ((b * p.h + iy) * p.w + ix) * c + c0;
                        let d = &mut dx[i..i + nb];
                        let sum = s.add_f32s(load(s, d), g);
                        store(s, d, sum);
                    }
                }
                c0 += nb;
            }
        });
    }
}
