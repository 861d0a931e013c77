//! The AVX-512 form of [`super::direct`]: the same loops, taps and
//! summation order, written with intrinsics (one `__m512` per vector of
//! [`LANES`] output channels) so that the register blocking is what the
//! code says. The portable body left the accumulators in memory and called
//! `fmaf` per lane (24 ms for the seed's first convolution, 4x slower than
//! im2col); this one keeps them in registers.
//!
//! Fused multiply-adds in the same order as the portable body's `mul_add`:
//! both forms give the same bits. Callers must have checked AVX-512F and FMA.

use std::arch::x86_64::*;

use super::direct::{clip, dispatch_group, fits, pack, Aligned, Geo, FWD_PIXELS, LANES, MAX_GROUP, MAX_PACKED, V};
use super::ConvGeom;

/// The lanes `0..nb` of a vector.
#[inline(always)]
fn mask(nb: usize) -> __mmask16 {
    ((1u32 << nb) - 1) as __mmask16
}

/// What the forward pass does to each output vector before storing it: add
/// the bias (packed per block of [`LANES`] channels, zero-padded), then
/// ReLU when `relu`. The sum and the maximum round exactly as `bias_add`
/// then `unary(Relu)` do (`max(v, 0)` gives +0 for -0 and NaN, as `v > 0 ?
/// v : 0`): the same bits as the separate kernels.
pub(super) struct Epilogue {
    pub bias: [V; MAX_PACKED],
    pub relu: bool,
}

impl Epilogue {
    /// The epilogue of `bias` (`c_out` floats).
    pub(super) fn new(bias: &[f32], relu: bool) -> Epilogue {
        let mut packed = [[0.0; LANES]; MAX_PACKED];
        for (v, b) in packed.iter_mut().zip(bias.chunks(LANES)) {
            v[..b.len()].copy_from_slice(b);
        }
        Epilogue { bias: packed, relu }
    }

    #[inline(always)]
    pub(super) unsafe fn apply(e: Option<&Epilogue>, blk: usize, a: __m512) -> __m512 {
        match e {
            None => a,
            Some(e) => {
                let v = _mm512_add_ps(a, _mm512_loadu_ps(e.bias[blk].as_ptr()));
                if e.relu {
                    _mm512_max_ps(v, _mm512_setzero_ps())
                } else {
                    v
                }
            }
        }
    }
}

/// `y = conv(x, filter)`; see [`super::direct`].
///
/// # Safety
/// The CPU supports AVX-512F and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn conv2d(p: &ConvGeom, x: &[f32], filter: &[f32], y: &mut [f32]) {
    conv2d_then(p, x, filter, y, None)
}

/// [`conv2d`], each output vector through `epi` before it is stored.
///
/// # Safety
/// As [`conv2d`]; `epi`'s bias has at least `c_out` channels.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn conv2d_then(p: &ConvGeom, x: &[f32], filter: &[f32], y: &mut [f32], epi: Option<&Epilogue>) {
    debug_assert!(fits(p));
    let g = Geo::new(p);
    let co = p.c_out;
    if g.oh * g.ow == 0 || co == 0 {
        return;
    }
    let mut wp = Aligned([[0.0; LANES]; MAX_PACKED]);
    let wp = &mut wp.0;
    pack(p, &g, filter, wp);
    let img = p.h * p.w * p.c_in;
    for b in 0..p.n {
        let xb = &x[b * img..(b + 1) * img];
        for oy in 0..g.oh {
            let yr = &mut y[(b * g.oh + oy) * g.ow * co..(b * g.oh + oy + 1) * g.ow * co];
            let iy0 = g.iy0(p, oy);
            let row_inside = iy0 >= 0 && iy0 as usize + p.kh <= p.h;
            let (lo, hi) = if row_inside { (g.ox_lo, g.ox_hi) } else { (0, 0) };
            for ox in (0..lo).chain(hi..g.ow) {
                forward_clipped(p, &g, wp, xb, iy0, ox, yr, epi);
            }
            let mut ox = lo;
            if p.stride_w * p.c_in == 1 {
                // Unit step between neighbouring pixels' taps: the pixel
                // offsets are constants, so a wider block costs no registers
                // for addresses.
                let unit = match p.kw {
                    3 => forward_unit::<UNIT_PIXELS, 3>,
                    5 => forward_unit::<UNIT_PIXELS, 5>,
                    _ => forward_block::<UNIT_PIXELS, true>,
                };
                while ox + UNIT_PIXELS <= hi {
                    unit(p, &g, wp, xb, iy0 as usize, ox, yr, epi);
                    ox += UNIT_PIXELS;
                }
            }
            while ox + FWD_PIXELS <= hi {
                forward_block::<FWD_PIXELS, false>(p, &g, wp, xb, iy0 as usize, ox, yr, epi);
                ox += FWD_PIXELS;
            }
            while ox < hi {
                forward_block::<1, false>(p, &g, wp, xb, iy0 as usize, ox, yr, epi);
                ox += 1;
            }
        }
    }
}

/// Output pixels per register block when neighbouring pixels' windows are
/// one element apart (stride 1, one input channel).
const UNIT_PIXELS: usize = 12;

/// Output pixels `ox..ox+R` of one row, all windows inside the input;
/// `UNIT`: `stride_w * c_in == 1`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn forward_block<const R: usize, const UNIT: bool>(
    p: &ConvGeom,
    g: &Geo,
    wp: &[V; MAX_PACKED],
    xb: &[f32],
    iy0: usize,
    ox: usize,
    yr: &mut [f32],
    epi: Option<&Epilogue>,
) {
    let (ci, co, k) = (p.c_in, p.c_out, g.k);
    let step = if UNIT { 1 } else { p.stride_w * ci };
    let base = (iy0 * p.w + g.ix0(p, ox) as usize) * ci;
    // Every read lies in `xs`: the last pixel's last tap is its end.
    let xs = &xb[base..base + (R - 1) * step + g.off[k - 1] + 1];
    let off = &g.off[..k];
    for blk in 0..g.blocks {
        let w = &wp[blk * k..(blk + 1) * k];
        let mut acc = [_mm512_setzero_ps(); R];
        for (wt, &o) in w.iter().zip(off) {
            let wv = _mm512_loadu_ps(wt.as_ptr());
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: `r * step + o <= (R - 1) * step + off[k - 1] < xs.len()`
                // (tap offsets increase with t).
                let xv = *xs.get_unchecked(r * step + o);
                *a = _mm512_fmadd_ps(_mm512_set1_ps(xv), wv, *a);
            }
        }
        let (c0, nb) = (blk * LANES, (co - blk * LANES).min(LANES));
        for (r, a) in acc.iter().enumerate() {
            let d = (ox + r) * co + c0;
            let dst = &mut yr[d..d + nb];
            // SAFETY: the mask writes the `nb` lanes of `dst` only.
            _mm512_mask_storeu_ps(dst.as_mut_ptr(), mask(nb), Epilogue::apply(epi, blk, *a));
        }
    }
}

/// [`forward_block`] for `UNIT` steps and `kw == KW`: per filter row the
/// `KW` filter vectors stay in registers and each input value of the row is
/// broadcast once for the up to `KW` pixels it meets (`R + KW - 1` loads
/// per `R * KW` fused multiply-adds, against `R + 1` per `R`; the compiler
/// merges the repeated loads of a row, which a run-time tap offset hides). Each pixel
/// sums its taps in the same order (`ky`, then `kx`): the same bits.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn forward_unit<const R: usize, const KW: usize>(
    p: &ConvGeom,
    g: &Geo,
    wp: &[V; MAX_PACKED],
    xb: &[f32],
    iy0: usize,
    ox: usize,
    yr: &mut [f32],
    epi: Option<&Epilogue>,
) {
    debug_assert!(p.c_in == 1 && p.stride_w == 1 && p.kw == KW);
    let (co, k) = (p.c_out, g.k);
    let base = iy0 * p.w + g.ix0(p, ox) as usize;
    // Every read lies in `xs`: the last pixel's last tap is its end.
    let xs = &xb[base..base + (p.kh - 1) * p.w + R + KW - 1];
    for blk in 0..g.blocks {
        let w = &wp[blk * k..(blk + 1) * k];
        let mut acc = [_mm512_setzero_ps(); R];
        for ky in 0..p.kh {
            let mut wv = [_mm512_setzero_ps(); KW];
            for (kx, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(w[ky * KW + kx].as_ptr());
            }
            let xr = &xs[ky * p.w..ky * p.w + R + KW - 1];
            for (r, a) in acc.iter_mut().enumerate() {
                for (kx, wk) in wv.iter().enumerate() {
                    // SAFETY: `r + kx < R + KW - 1 = xr.len()`; the loads of
                    // one `ky` repeat across pixels and are merged.
                    let bx = _mm512_set1_ps(*xr.get_unchecked(r + kx));
                    *a = _mm512_fmadd_ps(bx, *wk, *a);
                }
            }
        }
        let (c0, nb) = (blk * LANES, (co - blk * LANES).min(LANES));
        for (r, a) in acc.iter().enumerate() {
            let d = (ox + r) * co + c0;
            let dst = &mut yr[d..d + nb];
            // SAFETY: the mask writes the `nb` lanes of `dst` only.
            _mm512_mask_storeu_ps(dst.as_mut_ptr(), mask(nb), Epilogue::apply(epi, blk, *a));
        }
    }
}

/// One output pixel whose window may leave the input: padded taps are skipped.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn forward_clipped(
    p: &ConvGeom,
    g: &Geo,
    wp: &[V; MAX_PACKED],
    xb: &[f32],
    iy0: isize,
    ox: usize,
    yr: &mut [f32],
    epi: Option<&Epilogue>,
) {
    let (ci, co, k) = (p.c_in, p.c_out, g.k);
    let ix0 = g.ix0(p, ox);
    let (ky_lo, ky_hi, kx_lo, kx_hi) = clip(p, iy0, ix0);
    for blk in 0..g.blocks {
        let mut acc = _mm512_setzero_ps();
        for ky in ky_lo..ky_hi {
            let iy = (iy0 + ky as isize) as usize;
            for kx in kx_lo..kx_hi {
                let ix = (ix0 + kx as isize) as usize;
                let src = &xb[(iy * p.w + ix) * ci..][..ci];
                let t0 = blk * k + (ky * p.kw + kx) * ci;
                for (c, &xv) in src.iter().enumerate() {
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(xv), _mm512_loadu_ps(wp[t0 + c].as_ptr()), acc);
                }
            }
        }
        let (c0, nb) = (blk * LANES, (co - blk * LANES).min(LANES));
        let d = ox * co + c0;
        let dst = &mut yr[d..d + nb];
        // SAFETY: the mask writes the `nb` lanes of `dst` only.
        _mm512_mask_storeu_ps(dst.as_mut_ptr(), mask(nb), Epilogue::apply(epi, blk, acc));
    }
}

/// `dfilter = x^T (windows) * dy`; see [`super::direct`].
///
/// # Safety
/// The CPU supports AVX-512F and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn conv2d_backprop_filter(p: &ConvGeom, x: &[f32], dy: &[f32], dfilter: &mut [f32]) {
    debug_assert!(fits(p));
    let g = Geo::new(p);
    let (co, k) = (p.c_out, g.k);
    // The running total over images, packed as the forward filter.
    let mut total = Aligned([[0.0f32; LANES]; MAX_PACKED]);
    let total = &mut total.0;
    if g.oh * g.ow > 0 && co > 0 {
        let group = (1..=MAX_GROUP.min(k)).rev().find(|d| k % d == 0).unwrap_or(1);
        let img = p.h * p.w * p.c_in;
        let pix = g.oh * g.ow;
        for b in 0..p.n {
            let xb = &x[b * img..(b + 1) * img];
            let dyb = &dy[b * pix * co..(b + 1) * pix * co];
            for blk in 0..g.blocks {
                let mut t0 = 0;
                while t0 < k {
                    let tot = &mut total[blk * k + t0..blk * k + t0 + group];
                    // Common small filters with all taps in one group: the
                    // offsets are compile-time multiples of the row length,
                    // so none lives in a register (1.9x faster at 5x5x1).
                    match (group == k, p.kh, p.kw * p.c_in) {
                        (true, 2, 2) => filter_rows::<2, 2>(p, &g, xb, dyb, blk, tot),
                        (true, 3, 3) => filter_rows::<3, 3>(p, &g, xb, dyb, blk, tot),
                        (true, 3, 6) => filter_rows::<3, 6>(p, &g, xb, dyb, blk, tot),
                        (true, 3, 9) => filter_rows::<3, 9>(p, &g, xb, dyb, blk, tot),
                        (true, 5, 5) => filter_rows::<5, 5>(p, &g, xb, dyb, blk, tot),
                        _ => dispatch_group!(group, filter_group(p, &g, xb, dyb, blk, t0, tot)),
                    }
                    t0 += group;
                }
            }
        }
    }
    for blk in 0..g.blocks {
        let (c0, nb) = (blk * LANES, (co - blk * LANES).min(LANES));
        for t in 0..k {
            dfilter[t * co + c0..t * co + c0 + nb].copy_from_slice(&total[blk * k + t][..nb]);
        }
    }
}

/// Adds one image's `sum_pixels x[pixel, t] * dy[pixel, block]` for taps
/// `t0..t0+G` to `total[0..G]`.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn filter_group<const G: usize>(
    p: &ConvGeom,
    g: &Geo,
    xb: &[f32],
    dyb: &[f32],
    blk: usize,
    t0: usize,
    total: &mut [V],
) {
    let (ci, co) = (p.c_in, p.c_out);
    let c0 = blk * LANES;
    let m = mask((co - c0).min(LANES));
    let mut off = [0usize; G];
    off.copy_from_slice(&g.off[t0..t0 + G]);
    // Tap t0 + j as (ky, kx, c), for the clipped path.
    let mut tap = [(0usize, 0usize, 0usize); G];
    for (j, tp) in tap.iter_mut().enumerate() {
        let t = t0 + j;
        *tp = (t / (p.kw * ci), (t / ci) % p.kw, t % ci);
    }
    let mut acc = [_mm512_setzero_ps(); G];
    let dvec = |ox: usize, dyr: &[f32]| {
        let d = &dyr[ox * co + c0..ox * co + c0 + (co - c0).min(LANES)];
        // SAFETY: the mask reads the lanes of `d` only.
        unsafe { _mm512_maskz_loadu_ps(m, d.as_ptr()) }
    };
    let clipped = |acc: &mut [__m512; G], iy0: isize, ix0: isize, dv: __m512| {
        for (a, &(ky, kx, c)) in acc.iter_mut().zip(&tap) {
            let (iy, ix) = (iy0 + ky as isize, ix0 + kx as isize);
            if iy >= 0 && ix >= 0 && (iy as usize) < p.h && (ix as usize) < p.w {
                let xv = xb[(iy as usize * p.w + ix as usize) * ci + c];
                *a = _mm512_fmadd_ps(_mm512_set1_ps(xv), dv, *a);
            }
        }
    };
    for oy in 0..g.oh {
        let iy0 = g.iy0(p, oy);
        let row_inside = iy0 >= 0 && iy0 as usize + p.kh <= p.h;
        let dyr = &dyb[oy * g.ow * co..(oy + 1) * g.ow * co];
        let (lo, hi) = if row_inside { (g.ox_lo, g.ox_hi) } else { (g.ow, g.ow) };
        // Pixels in row order; the interior run keeps a local copy of the
        // accumulators whose address never escapes, so they stay in registers.
        for ox in 0..lo {
            clipped(&mut acc, iy0, g.ix0(p, ox), dvec(ox, dyr));
        }
        if lo < hi {
            let base = (iy0 as usize * p.w + g.ix0(p, lo) as usize) * ci;
            let step = p.stride_w * ci;
            let xs = &xb[base..base + (hi - 1 - lo) * step + off[G - 1] + 1];
            let mut regs = acc;
            for ox in lo..hi {
                let dv = dvec(ox, dyr);
                let px = (ox - lo) * step;
                for (a, &o) in regs.iter_mut().zip(&off) {
                    // SAFETY: tap offsets increase with t, so
                    // `px + o <= (hi-1-lo) * step + off[G - 1] < xs.len()`.
                    let xv = *xs.get_unchecked(px + o);
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(xv), dv, *a);
                }
            }
            acc = regs;
        }
        for ox in hi.max(lo)..g.ow {
            clipped(&mut acc, iy0, g.ix0(p, ox), dvec(ox, dyr));
        }
    }
    for (t, a) in total.iter_mut().zip(&acc) {
        _mm512_storeu_ps(t.as_mut_ptr(), _mm512_add_ps(_mm512_loadu_ps(t.as_ptr()), *a));
    }
}

/// [`filter_group`] for all `K = KY * J` taps of a filter with `KY` rows of
/// `J = kw * c_in` taps: the same sums in the same order (the same bits),
/// with the interior taps addressed as `ky * row + j` for constant `ky, j`.
#[inline(never)]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn filter_rows<const KY: usize, const J: usize>(
    p: &ConvGeom,
    g: &Geo,
    xb: &[f32],
    dyb: &[f32],
    blk: usize,
    total: &mut [V],
) {
    let (ci, co) = (p.c_in, p.c_out);
    let row = p.w * ci;
    let c0 = blk * LANES;
    let m = mask((co - c0).min(LANES));
    let mut acc = [[_mm512_setzero_ps(); J]; KY];
    let dvec = |ox: usize, dyr: &[f32]| {
        let d = &dyr[ox * co + c0..ox * co + c0 + (co - c0).min(LANES)];
        // SAFETY: the mask reads the lanes of `d` only.
        unsafe { _mm512_maskz_loadu_ps(m, d.as_ptr()) }
    };
    for oy in 0..g.oh {
        let iy0 = g.iy0(p, oy);
        let row_inside = iy0 >= 0 && iy0 as usize + p.kh <= p.h;
        let dyr = &dyb[oy * g.ow * co..(oy + 1) * g.ow * co];
        let (lo, hi) = if row_inside { (g.ox_lo, g.ox_hi) } else { (g.ow, g.ow) };
        // Pixels in row order; the interior run is a loop of its own so the
        // accumulators stay in registers through it.
        for ox in 0..lo {
            filter_clipped(p, &mut acc, xb, iy0, g.ix0(p, ox), dvec(ox, dyr));
        }
        if lo < hi {
            let base = (iy0 as usize * p.w + g.ix0(p, lo) as usize) * ci;
            let step = p.stride_w * ci;
            let xs = &xb[base..base + (hi - 1 - lo) * step + (KY - 1) * row + J];
            // A local copy whose address never escapes: it lives in registers.
            let mut regs = acc;
            for ox in lo..hi {
                let dv = dvec(ox, dyr);
                let px = (ox - lo) * step;
                for (ky, ar) in regs.iter_mut().enumerate() {
                    for (j, a) in ar.iter_mut().enumerate() {
                        // SAFETY: `px + ky * row + j <= (hi-1-lo) * step + (KY-1) * row + J-1 < xs.len()`.
                        let xv = *xs.get_unchecked(px + ky * row + j);
                        *a = _mm512_fmadd_ps(_mm512_set1_ps(xv), dv, *a);
                    }
                }
            }
            acc = regs;
        }
        for ox in hi.max(lo)..g.ow {
            filter_clipped(p, &mut acc, xb, iy0, g.ix0(p, ox), dvec(ox, dyr));
        }
    }
    for (t, a) in total.iter_mut().zip(acc.iter().flatten()) {
        _mm512_storeu_ps(t.as_mut_ptr(), _mm512_add_ps(_mm512_loadu_ps(t.as_ptr()), *a));
    }
}

/// One output pixel of [`filter_rows`] whose window may leave the input.
#[inline(always)]
unsafe fn filter_clipped<const KY: usize, const J: usize>(
    p: &ConvGeom,
    acc: &mut [[__m512; J]; KY],
    xb: &[f32],
    iy0: isize,
    ix0: isize,
    dv: __m512,
) {
    let ci = p.c_in;
    for (ky, ar) in acc.iter_mut().enumerate() {
        let iy = iy0 + ky as isize;
        if iy < 0 || iy as usize >= p.h {
            continue;
        }
        for (j, a) in ar.iter_mut().enumerate() {
            let ix = ix0 + (j / ci) as isize;
            if ix >= 0 && (ix as usize) < p.w {
                let xv = xb[(iy as usize * p.w + ix as usize) * ci + j % ci];
                *a = _mm512_fmadd_ps(_mm512_set1_ps(xv), dv, *a);
            }
        }
    }
}
