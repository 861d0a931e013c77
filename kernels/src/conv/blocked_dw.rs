//! The blocked filter gradient ([`super::Algorithm::Blocked`]), generic
//! over [`pulp::Simd`]. For one image and one filter tap `(ky, kx)`, up to
//! `G` input channels times `NV` vectors of output channels stay in
//! registers (`G` per path from its register count: 12 channels times 2
//! vectors on AVX-512, 4 times 3 on AVX2 at the seed's 12 -> 24) while
//! every output pixel adds `x[pixel + tap] * dy[pixel, :]`; the image's sums
//! are then added to a running total (as in [`super::direct`]: short f32
//! sums, an order that depends only on the inputs).
//!
//! Invariant: each entry sums every output pixel of an image in row order
//! (padded zeros included) with fused multiply-adds, then the images in
//! order; the grouping only decides which entries share the registers, so
//! every path gives the same bits (tested).

use pulp::{Simd, WithSimd};

use super::blocked::{dispatch_nv_n, image, max_rows, padded_input, MAX_NV};
use super::vec::{self, Packed};
use super::ConvGeom;

/// `dfilter = x^T (windows) * dy` (overwritten), as a [`WithSimd`] op.
/// Requires `p.blocked_fits()`; `ws` as `blocked::workspace_need`.
pub(super) struct FilterGrad<'a> {
    pub(super) p: &'a ConvGeom,
    pub(super) x: &'a [f32],
    pub(super) dy: &'a [f32],
    pub(super) dfilter: &'a mut [f32],
    pub(super) ws: &'a mut [f32],
}

impl WithSimd for FilterGrad<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let FilterGrad { p, x, dy, dfilter, ws } = self;
        let l = S::F32_LANES;
        let ((oh, pt), (ow, pl)) = (p.out_h(), p.out_w());
        let (ci, co, k) = (p.c_in, p.c_out, p.k());
        let nvt = co.div_ceil(l);
        // The running total over images: tap t's vector v at vector t * nvt + v.
        let mut total = Packed::zeroed();
        let total = &mut total.0;
        let (hp, wp, padded) = padded_input(p);
        let (img, dimg) = (p.h * p.w * ci, oh * ow * co);
        if padded {
            ws[..hp * wp * ci].fill(0.0);
        }
        for b in 0..p.n {
            let xb = &x[b * img..(b + 1) * img];
            let xi = image(p, xb, ws, (hp, wp, padded), (pt, pl));
            let dyb = &dy[b * dimg..(b + 1) * dimg];
            assert!(xi.len() >= hp * wp * ci && dyb.len() >= oh * ow * co && k * nvt * l <= total.len());
            let mut v0 = 0;
            while v0 < nvt {
                let nv = MAX_NV.min(nvt - v0);
                let gmax = max_rows::<S>(nv);
                for ky in 0..p.kh {
                    for kx in 0..p.kw {
                        let mut c0 = 0;
                        while c0 < ci {
                            let g = gmax.min(ci - c0);
                            let t0 = (ky * p.kw + kx) * ci + c0;
                            let grp = Group {
                                // SAFETY: with `G <= ci - c0` channels from
                                // `c0` of tap (ky, kx), every window lies in
                                // the padded image `xi` (VALID on it).
                                x: unsafe { xi.as_ptr().add((ky * wp + kx) * ci + c0) },
                                row: wp * ci,
                                pixel: ci,
                                dy: dyb,
                                oh,
                                ow,
                                co,
                                c0: v0 * l,
                                // SAFETY: vectors (t0 + i) * nvt + v0 + v for
                                // i < G, v < NV lie in `total` (asserted above).
                                tot: unsafe { total.as_mut_ptr().add((t0 * nvt + v0) * l) },
                                tot_stride: nvt * l,
                            };
                            dispatch_nv_n!(nv, g, group, (simd, grp));
                            c0 += g;
                        }
                    }
                }
                v0 += nv;
            }
        }
        for t in 0..k {
            for v in 0..nvt {
                let (c0, nb) = (v * l, (co - v * l).min(l));
                let s = (t * nvt + v) * l;
                dfilter[t * co + c0..t * co + c0 + nb].copy_from_slice(&total[s..s + nb]);
            }
        }
    }
}

/// One register group: adds one image's `sum_pixels x[pixel, g] *
/// dy[pixel, c0 + ...]` for `G` input channels (`x` points at the first
/// channel of the tap for pixel 0; `row`, `pixel`: the padded image's row
/// length and pixel step in floats) and `NV` vectors of output channels
/// from `c0` to `tot` (vector `(g, v)` at `tot + g * tot_stride + v * L`).
///
/// Safety (kept by the caller): every `x[oy * row + ox * pixel + g]` for
/// `oy < oh, ox < ow, g < G` and the `tot` vectors are in bounds; `dy` is
/// `[oh, ow, co]`.
struct Group<'a> {
    x: *const f32,
    row: usize,
    pixel: usize,
    dy: &'a [f32],
    oh: usize,
    ow: usize,
    co: usize,
    c0: usize,
    tot: *mut f32,
    tot_stride: usize,
}

/// Runs `grp` as its own function with the path's features.
#[inline(always)]
fn group<const NV: usize, const G: usize>(simd: impl Simd, grp: Group<'_>) {
    struct Op<'a, const NV: usize, const G: usize>(Group<'a>);
    impl<const NV: usize, const G: usize> WithSimd for Op<'_, NV, G> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            group_body::<S, NV, G>(simd, self.0)
        }
    }
    simd.vectorize(Op::<NV, G>(grp))
}

#[inline(always)]
fn group_body<S: Simd, const NV: usize, const G: usize>(simd: S, b: Group<'_>) {
    let l = S::F32_LANES;
    let dy = b.dy;
    debug_assert!(dy.len() >= b.oh * b.ow * b.co && b.c0 < b.co);
    let mut acc = [[simd.splat_f32s(0.0); NV]; G];
    for oy in 0..b.oh {
        for ox in 0..b.ow {
            let d = (oy * b.ow + ox) * b.co + b.c0;
            let mut dv = [simd.splat_f32s(0.0); NV];
            for (v, dvv) in dv.iter_mut().enumerate() {
                let dd = d + v * l;
                // A full vector where it lies in `dy` (lanes past the
                // channels read the next pixel's: garbage never stored),
                // else the floats left, zero-padded.
                *dvv = if dd + l <= dy.len() {
                    // SAFETY: `dd..dd + l` lies in `dy`.
                    unsafe { vec::load::<S>(dy.as_ptr().add(dd)) }
                } else if dd < dy.len() {
                    // SAFETY: `dd..dy.len()` lies in `dy`.
                    unsafe { vec::load_first(simd, dy.as_ptr().add(dd), dy.len() - dd) }
                } else {
                    simd.splat_f32s(0.0)
                };
            }
            // SAFETY: see `Group`.
            let xp = unsafe { b.x.add(oy * b.row + ox * b.pixel) };
            for (g, a) in acc.iter_mut().enumerate() {
                // SAFETY: see `Group`.
                let xv = simd.splat_f32s(unsafe { *xp.add(g) });
                for v in 0..NV {
                    a[v] = simd.mul_add_f32s(xv, dv[v], a[v]);
                }
            }
        }
    }
    for (g, a) in acc.iter().enumerate() {
        for (v, av) in a.iter().enumerate() {
            // SAFETY: see `Group`.
            unsafe {
                let t = b.tot.add(g * b.tot_stride + v * l);
                vec::store::<S>(t, simd.add_f32s(vec::load::<S>(t), *av));
            }
        }
    }
}
