//! The direct forward convolution ([`super::direct`]), generic over the
//! vector width: each output vector sums its taps in `(ky, kx, ci)` order
//! with fused multiply-adds, whatever the path and the register block, so
//! every path gives the same bits.
//!
//! Register blocks per path: [`FWD_PIXELS`] pixels in general; with unit
//! steps `UNIT` pixels (12 on the 32-register paths, 8 on AVX2: 8
//! accumulators, `kw <= 5` filter vectors and one broadcast fit its 16).

use pulp::{Simd, WithSimd};

use super::direct::{clip, pack, Geo, FWD_PIXELS};
use super::vec::{self, Epilogue, Packed};
use super::ConvGeom;

/// `y = conv(x, filter)` through `epi`, as a [`WithSimd`] op.
pub(super) struct Forward<'a> {
    pub(super) p: &'a ConvGeom,
    pub(super) x: &'a [f32],
    pub(super) filter: &'a [f32],
    pub(super) y: &'a mut [f32],
    pub(super) epi: Option<&'a Epilogue>,
}

impl WithSimd for Forward<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        forward(simd, self.p, self.x, self.filter, self.y, self.epi)
    }
}

#[inline(always)]
fn forward<S: Simd>(simd: S, p: &ConvGeom, x: &[f32], filter: &[f32], y: &mut [f32], epi: Option<&Epilogue>) {
    let g = Geo::new(p);
    let co = p.c_out;
    if g.oh * g.ow == 0 || co == 0 || p.n == 0 {
        return;
    }
    let mut wp = Packed::zeroed();
    pack(p, S::F32_LANES, filter, &mut wp.0);
    let wp = &wp.0;
    let img = p.h * p.w * p.c_in;
    let unit = p.stride_w * p.c_in == 1;
    for b in 0..p.n {
        let xb = &x[b * img..(b + 1) * img];
        for oy in 0..g.oh {
            let yr = &mut y[(b * g.oh + oy) * g.ow * co..(b * g.oh + oy + 1) * g.ow * co];
            let iy0 = g.iy0(p, oy);
            let row_inside = iy0 >= 0 && iy0 as usize + p.kh <= p.h;
            let (lo, hi) = if row_inside { (g.ox_lo, g.ox_hi) } else { (0, 0) };
            for ox in (0..lo).chain(hi..g.ow) {
                forward_clipped(simd, p, &g, wp, xb, iy0, ox, yr, epi);
            }
            let mut ox = lo;
            if unit {
                // Unit step between neighbouring pixels' taps: the pixel
                // offsets are constants, so a wider block costs no registers
                // for addresses.
                let r = if vec::wide::<S>() { 12 } else { 8 };
                while ox + r <= hi {
                    let iy = iy0 as usize;
                    match (vec::wide::<S>(), p.kw) {
                        (true, 3) => forward_unit::<S, 12, 3>(simd, p, &g, wp, xb, iy, ox, yr, epi),
                        (true, 5) => forward_unit::<S, 12, 5>(simd, p, &g, wp, xb, iy, ox, yr, epi),
                        (true, _) => forward_block::<S, 12, true>(simd, p, &g, wp, xb, iy, ox, yr, epi),
                        (false, 3) => forward_unit::<S, 8, 3>(simd, p, &g, wp, xb, iy, ox, yr, epi),
                        (false, 5) => forward_unit::<S, 8, 5>(simd, p, &g, wp, xb, iy, ox, yr, epi),
                        (false, _) => forward_block::<S, 8, true>(simd, p, &g, wp, xb, iy, ox, yr, epi),
                    }
                    ox += r;
                }
            }
            while ox + FWD_PIXELS <= hi {
                forward_block::<S, FWD_PIXELS, false>(simd, p, &g, wp, xb, iy0 as usize, ox, yr, epi);
                ox += FWD_PIXELS;
            }
            while ox < hi {
                forward_block::<S, 1, false>(simd, p, &g, wp, xb, iy0 as usize, ox, yr, epi);
                ox += 1;
            }
        }
    }
}

/// Output pixels `ox..ox+R` of one row, all windows inside the input;
/// `UNIT`: `stride_w * c_in == 1`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn forward_block<S: Simd, const R: usize, const UNIT: bool>(
    simd: S,
    p: &ConvGeom,
    g: &Geo,
    wp: &[f32],
    xb: &[f32],
    iy0: usize,
    ox: usize,
    yr: &mut [f32],
    epi: Option<&Epilogue>,
) {
    let l = S::F32_LANES;
    let (ci, co, k) = (p.c_in, p.c_out, g.k);
    let step = if UNIT { 1 } else { p.stride_w * ci };
    let base = (iy0 * p.w + g.ix0(p, ox) as usize) * ci;
    // Every read lies in `xs`: the last pixel's last tap is its end.
    let xs = &xb[base..base + (R - 1) * step + g.off[k - 1] + 1];
    let off = &g.off[..k];
    for blk in 0..co.div_ceil(l) {
        let w = &wp[blk * k * l..(blk + 1) * k * l];
        let mut acc = [simd.splat_f32s(0.0); R];
        for (t, &o) in off.iter().enumerate() {
            // SAFETY: vector t of the block lies in `w` (k vectors of l floats).
            let wv = unsafe { vec::load::<S>(w.as_ptr().add(t * l)) };
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: `r * step + o <= (R - 1) * step + off[k - 1] < xs.len()`
                // (tap offsets increase with t).
                let xv = unsafe { *xs.get_unchecked(r * step + o) };
                *a = simd.mul_add_f32s(simd.splat_f32s(xv), wv, *a);
            }
        }
        let (c0, nb) = (blk * l, (co - blk * l).min(l));
        for (r, a) in acc.iter().enumerate() {
            let d = (ox + r) * co + c0;
            let dst = &mut yr[d..d + nb];
            // SAFETY: writes the `nb` floats of `dst` only.
            unsafe { vec::store_first(simd, dst.as_mut_ptr(), Epilogue::apply(simd, epi, c0, *a), nb) };
        }
    }
}

/// [`forward_block`] for unit steps and `kw == KW`: per filter row the `KW`
/// filter vectors stay in registers and each input value of the row is
/// broadcast once for the up to `KW` pixels it meets (`R + KW - 1` loads
/// per `R * KW` fused multiply-adds, against `R + 1` per `R`). Each pixel
/// sums its taps in the same order (`ky`, then `kx`): the same bits.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn forward_unit<S: Simd, const R: usize, const KW: usize>(
    simd: S,
    p: &ConvGeom,
    g: &Geo,
    wp: &[f32],
    xb: &[f32],
    iy0: usize,
    ox: usize,
    yr: &mut [f32],
    epi: Option<&Epilogue>,
) {
    debug_assert!(p.c_in == 1 && p.stride_w == 1 && p.kw == KW);
    let l = S::F32_LANES;
    let (co, k) = (p.c_out, g.k);
    let base = iy0 * p.w + g.ix0(p, ox) as usize;
    // Every read lies in `xs`: the last pixel's last tap is its end.
    let xs = &xb[base..base + (p.kh - 1) * p.w + R + KW - 1];
    for blk in 0..co.div_ceil(l) {
        let w = &wp[blk * k * l..(blk + 1) * k * l];
        let mut acc = [simd.splat_f32s(0.0); R];
        for ky in 0..p.kh {
            let mut wv = [simd.splat_f32s(0.0); KW];
            for (kx, v) in wv.iter_mut().enumerate() {
                // SAFETY: tap ky * KW + kx < k: a vector of `w`.
                *v = unsafe { vec::load::<S>(w.as_ptr().add((ky * KW + kx) * l)) };
            }
            let xr = &xs[ky * p.w..ky * p.w + R + KW - 1];
            for (r, a) in acc.iter_mut().enumerate() {
                for (kx, wk) in wv.iter().enumerate() {
                    // SAFETY: `r + kx < R + KW - 1 = xr.len()`.
                    let bx = simd.splat_f32s(unsafe { *xr.get_unchecked(r + kx) });
                    *a = simd.mul_add_f32s(bx, *wk, *a);
                }
            }
        }
        let (c0, nb) = (blk * l, (co - blk * l).min(l));
        for (r, a) in acc.iter().enumerate() {
            let d = (ox + r) * co + c0;
            let dst = &mut yr[d..d + nb];
            // SAFETY: writes the `nb` floats of `dst` only.
            unsafe { vec::store_first(simd, dst.as_mut_ptr(), Epilogue::apply(simd, epi, c0, *a), nb) };
        }
    }
}

/// One output pixel whose window may leave the input: padded taps are skipped.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn forward_clipped<S: Simd>(
    simd: S,
    p: &ConvGeom,
    g: &Geo,
    wp: &[f32],
    xb: &[f32],
    iy0: isize,
    ox: usize,
    yr: &mut [f32],
    epi: Option<&Epilogue>,
) {
    let l = S::F32_LANES;
    let (ci, co, k) = (p.c_in, p.c_out, g.k);
    let ix0 = g.ix0(p, ox);
    let (ky_lo, ky_hi, kx_lo, kx_hi) = clip(p, iy0, ix0);
    for blk in 0..co.div_ceil(l) {
        let mut acc = simd.splat_f32s(0.0);
        for ky in ky_lo..ky_hi {
            let iy = (iy0 + ky as isize) as usize;
            for kx in kx_lo..kx_hi {
                let ix = (ix0 + kx as isize) as usize;
                let src = &xb[(iy * p.w + ix) * ci..][..ci];
                let t0 = blk * k + (ky * p.kw + kx) * ci;
                let w = &wp[t0 * l..(t0 + ci) * l];
                for (c, &xv) in src.iter().enumerate() {
                    // SAFETY: vector c of `w` (ci vectors).
                    let wv = unsafe { vec::load::<S>(w.as_ptr().add(c * l)) };
                    acc = simd.mul_add_f32s(simd.splat_f32s(xv), wv, acc);
                }
            }
        }
        let (c0, nb) = (blk * l, (co - blk * l).min(l));
        let d = ox * co + c0;
        let dst = &mut yr[d..d + nb];
        // SAFETY: writes the `nb` floats of `dst` only.
        unsafe { vec::store_first(simd, dst.as_mut_ptr(), Epilogue::apply(simd, epi, c0, acc), nb) };
    }
}
