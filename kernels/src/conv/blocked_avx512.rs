//! Register-blocked direct convolution for moderate channel counts
//! ([`super::Algorithm::Blocked`]: stride 1, `12 <= c_in <= 16`, `c_out <= 32`),
//! AVX-512 only; layouts as the parent module (NHWC, HWIO).
//!
//! All three kernels reduce to two loops over one image at a time:
//! - [`valid_image`], a VALID stride-1 correlation of an image `[h, w, ci]`
//!   with a packed filter into `[h-kh+1, w-kw+1, co]`, `co <= 32` as `NV`
//!   (1 or 2) vectors of [`LANES`] output channels. A register block is `R
//!   <= MAX_R` output pixels of one row times all `NV` vectors (24 channels:
//!   20 accumulators for 10 pixels); per tap `(ky, kx, c)` the `NV` filter
//!   vectors are loaded once and each pixel adds `x[pixel + tap] * w[tap]`
//!   (a broadcast from memory and a fused multiply-add per vector). The
//!   forward pass runs it on `x` (SAME: on a zero-padded copy of the image
//!   in the workspace); the input gradient runs it on `dy` zero-padded by
//!   `kh-1, kw-1` around (in the workspace) with the filter flipped and
//!   transposed (`co` and `ci` swapped): `dx = corr(pad(dy), flip(W)^T)`.
//! - [`filter_group`], the filter gradient: for one image and one `(ky, kx)`,
//!   up to [`MAX_G`] input channels times `NV` vectors of output channels
//!   stay in registers (24 accumulators at `c_in = 12, c_out = 24`) while
//!   every output pixel adds `x[pixel + tap] * dy[pixel, :]`; the image's sums
//!   are then added to a running total (as in [`super::direct`]: short f32
//!   sums, an order that depends only on the inputs).
//!
//! Each output sums its taps in `(ky, kx, c)` order with fused
//! multiply-adds: equal to im2col + GEMM up to reassociation. Lanes past the
//! channel count compute garbage (zero-padded filters) that is never
//! stored; loads of `dy` past its channels are masked.
//!
//! Invariants the callers keep (checked by [`super::ConvGeom::blocked_fits`]):
//! the packed filters fit in `MAX_PACKED` vectors on the stack, and a padded
//! image (`[oh+kh-1, ow+kw-1, c_in]` forward / filter gradient when padded,
//! `[h+kh-1, w+kw-1, c_out]` input gradient) fits in the workspace. Callers
//! must have checked AVX-512F and FMA ([`super::direct::available`]).

use std::arch::x86_64::*;

use super::direct::{Aligned, LANES, MAX_PACKED, V};
use super::direct_avx512::Epilogue;
use super::ConvGeom;

/// Most output pixels per register block in [`valid_image`].
pub(super) const MAX_R: usize = 12;
/// Narrowest border segment [`valid_image`] runs as blocks of its own.
const MIN_BORDER: usize = 4;
/// Most input channels per register group in the filter gradient.
pub(super) const MAX_G: usize = 12;

/// Calls `$f::<NV, N>($args)` for the run-time `$n` in `1..=12`.
macro_rules! dispatch12 {
    ($n:expr, $nv:literal, $f:ident $args:tt) => {
        match $n {
            1 => $f::<$nv, 1> $args,
            2 => $f::<$nv, 2> $args,
            3 => $f::<$nv, 3> $args,
            4 => $f::<$nv, 4> $args,
            5 => $f::<$nv, 5> $args,
            6 => $f::<$nv, 6> $args,
            7 => $f::<$nv, 7> $args,
            8 => $f::<$nv, 8> $args,
            9 => $f::<$nv, 9> $args,
            10 => $f::<$nv, 10> $args,
            11 => $f::<$nv, 11> $args,
            _ => $f::<$nv, 12> $args,
        }
    };
}

/// Runs the `R = $n` pixel block (`1..=12`) of `NV = $nv` vectors: pixel
/// strides 12 and 24 as constants (no address arithmetic in the inner
/// loop).
macro_rules! run_block {
    ($n:expr, $nv:literal, $pixel:expr, $args:tt) => {
        match ($n, $pixel) {
            (n, 12) => dispatch12!(n, $nv, block12 $args),
            (n, 24) => dispatch12!(n, $nv, block24 $args),
            (n, _) => dispatch12!(n, $nv, block $args),
        }
    };
}

/// The lanes `0..nb` of a vector.
#[inline(always)]
fn mask(nb: usize) -> __mmask16 {
    ((1u32 << nb) - 1) as __mmask16
}

/// The padded image `valid_image` reads for the forward pass and the filter
/// gradient: `(hp, wp, padded)`, `padded` false when `x` itself is it (VALID).
fn padded_input(p: &ConvGeom) -> (usize, usize, bool) {
    let ((oh, pt), (ow, pl)) = (p.out_h(), p.out_w());
    let (hp, wp) = (oh + p.kh - 1, ow + p.kw - 1);
    (hp, wp, pt > 0 || pl > 0 || hp != p.h || wp != p.w)
}

/// Workspace floats the blocked kernels need for `p` (stride 1).
pub(super) fn workspace_need(p: &ConvGeom) -> usize {
    let (hp, wp, padded) = padded_input(p);
    let fwd = if padded { hp * wp * p.c_in } else { 0 };
    fwd.max((p.h + p.kh - 1) * (p.w + p.kw - 1) * p.c_out)
}

/// Copies image `src: [h, w, c]` into the interior of `dst: [hp, wp, c]` at
/// row `top`, column `left`; the border (zeroed by the caller) is untouched.
#[allow(clippy::too_many_arguments)]
fn pad_into(src: &[f32], h: usize, w: usize, c: usize, dst: &mut [f32], wp: usize, top: usize, left: usize) {
    for r in 0..h {
        let d = ((top + r) * wp + left) * c;
        dst[d..d + w * c].copy_from_slice(&src[r * w * c..(r + 1) * w * c]);
    }
}

/// Image `xb` of the input as the kernels read it: itself, or (when
/// `padded`, see [`padded_input`]) its copy into the zeroed border of `ws`
/// at offset `(top, left)`.
fn image<'a>(
    p: &ConvGeom,
    xb: &'a [f32],
    ws: &'a mut [f32],
    (hp, wp, padded): (usize, usize, bool),
    (top, left): (usize, usize),
) -> &'a [f32] {
    if !padded {
        return xb;
    }
    pad_into(xb, p.h, p.w, p.c_in, ws, wp, top, left);
    &ws[..hp * wp * p.c_in]
}

/// `y = conv(x, filter)`, each output vector through `epi` before it is
/// stored.
///
/// # Safety
/// The CPU supports AVX-512F and FMA; `p.blocked_fits()`; `epi`'s bias has
/// at least `c_out` channels; `ws` as [`workspace_need`].
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn conv2d(
    p: &ConvGeom,
    x: &[f32],
    filter: &[f32],
    y: &mut [f32],
    ws: &mut [f32],
    epi: Option<&Epilogue>,
) {
    let ((oh, pt), (ow, pl)) = (p.out_h(), p.out_w());
    let (ci, co, k) = (p.c_in, p.c_out, p.k());
    let nv = co.div_ceil(LANES);
    // Tap t's vector v at wpk[t * nv + v], zero-padded.
    let mut wpk = Aligned([[0.0f32; LANES]; MAX_PACKED]);
    let wpk = &mut wpk.0;
    for t in 0..k {
        for v in 0..nv {
            let (c0, nb) = (v * LANES, (co - v * LANES).min(LANES));
            wpk[t * nv + v][..nb].copy_from_slice(&filter[t * co + c0..t * co + c0 + nb]);
        }
    }
    let (hp, wp, padded) = padded_input(p);
    let (img, yimg) = (p.h * p.w * ci, oh * ow * co);
    let inner = if padded {
        Inner { top: pt, bottom: (pt + p.h).min(hp), left: pl, right: (pl + p.w).min(wp) }
    } else {
        Inner { top: 0, bottom: hp, left: 0, right: wp }
    };
    if padded {
        ws[..hp * wp * ci].fill(0.0);
    }
    for b in 0..p.n {
        let xb = &x[b * img..(b + 1) * img];
        let xi = image(p, xb, ws, (hp, wp, padded), (pt, pl));
        let yb = &mut y[b * yimg..(b + 1) * yimg];
        if nv == 1 {
            valid_image::<1>(xi, (hp, wp, ci), inner, (p.kh, p.kw), wpk, co, yb, epi);
        } else {
            valid_image::<2>(xi, (hp, wp, ci), inner, (p.kh, p.kw), wpk, co, yb, epi);
        }
    }
}

/// `dx = conv2d_backprop_input(dy, filter)` (overwritten).
///
/// # Safety
/// As [`conv2d`].
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn conv2d_backprop_input(p: &ConvGeom, dy: &[f32], filter: &[f32], dx: &mut [f32], ws: &mut [f32]) {
    if super::blocked_dx_avx512::fits(p) {
        return super::blocked_dx_avx512::conv2d_backprop_input(p, dy, filter, dx);
    }
    let ((oh, pt), (ow, pl)) = (p.out_h(), p.out_w());
    let (ci, co, kh, kw) = (p.c_in, p.c_out, p.kh, p.kw);
    // Flipped and transposed: tap (ky', kx', c) with c over c_out holds the
    // vector over c_in of W[kh-1-ky', kw-1-kx', :, c].
    let mut wpk = Aligned([[0.0f32; LANES]; MAX_PACKED]);
    let wpk = &mut wpk.0;
    for ky in 0..kh {
        for kx in 0..kw {
            let src = ((kh - 1 - ky) * kw + (kw - 1 - kx)) * ci;
            for c in 0..co {
                let v = &mut wpk[(ky * kw + kx) * co + c];
                for (i, l) in v[..ci].iter_mut().enumerate() {
                    *l = filter[(src + i) * co + c];
                }
            }
        }
    }
    // dy padded to [h+kh-1, w+kw-1, co]: output row oy at row oy + kh-1-pt.
    let (hq, wq) = (p.h + kh - 1, p.w + kw - 1);
    let (top, left) = (kh - 1 - pt, kw - 1 - pl);
    let inner = Inner { top, bottom: top + oh, left, right: left + ow };
    let dyp = &mut ws[..hq * wq * co];
    dyp.fill(0.0);
    let (dimg, ximg) = (oh * ow * co, p.h * p.w * ci);
    for b in 0..p.n {
        pad_into(&dy[b * dimg..(b + 1) * dimg], oh, ow, co, dyp, wq, top, left);
        let dxb = &mut dx[b * ximg..(b + 1) * ximg];
        valid_image::<1>(dyp, (hq, wq, co), inner, (kh, kw), wpk, ci, dxb, None);
    }
}

/// `dfilter = x^T (windows) * dy` (overwritten).
///
/// # Safety
/// As [`conv2d`].
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn conv2d_backprop_filter(p: &ConvGeom, x: &[f32], dy: &[f32], dfilter: &mut [f32], ws: &mut [f32]) {
    let ((oh, pt), (ow, pl)) = (p.out_h(), p.out_w());
    let (ci, co, k) = (p.c_in, p.c_out, p.k());
    let nv = co.div_ceil(LANES);
    // The running total over images: tap t's vector v at total[t * nv + v].
    let mut total = Aligned([[0.0f32; LANES]; MAX_PACKED]);
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
        for ky in 0..p.kh {
            for kx in 0..p.kw {
                let mut c0 = 0;
                while c0 < ci {
                    let g = MAX_G.min(ci - c0);
                    let t0 = (ky * p.kw + kx) * ci + c0;
                    let off = (ky * wp + kx) * ci + c0;
                    let tot = &mut total[t0 * nv..(t0 + g) * nv];
                    if nv == 1 {
                        dispatch12!(g, 1, filter_group(xi, wp, ci, off, dyb, oh, ow, co, tot));
                    } else {
                        dispatch12!(g, 2, filter_group(xi, wp, ci, off, dyb, oh, ow, co, tot));
                    }
                    c0 += g;
                }
            }
        }
    }
    for t in 0..k {
        for v in 0..nv {
            let (c0, nb) = (v * LANES, (co - v * LANES).min(LANES));
            dfilter[t * co + c0..t * co + c0 + nb].copy_from_slice(&total[t * nv + v][..nb]);
        }
    }
}

/// The part of a padded image that may be non-zero: rows `top..bottom`,
/// columns `left..right`; [`valid_image`] skips the taps outside it.
#[derive(Clone, Copy)]
struct Inner {
    top: usize,
    bottom: usize,
    left: usize,
    right: usize,
}

/// VALID stride-1 correlation of `xi: [h, w, ci]` (zero outside `inner`)
/// with the packed filter `wpk` (tap `(ky, kx, c)`'s vector `v` at
/// `((ky * kw + kx) * ci + c) * NV + v`) into `yi: [h-kh+1, w-kw+1, co]`,
/// `co <= NV * LANES`. Taps that read only zeros (outside `inner`) are
/// skipped: each output row takes the filter rows that meet `inner`, each
/// block of pixels the filter columns that meet it for one of its pixels.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn valid_image<const NV: usize>(
    xi: &[f32],
    (h, w, ci): (usize, usize, usize),
    inner: Inner,
    (kh, kw): (usize, usize),
    wpk: &[V; MAX_PACKED],
    co: usize,
    yi: &mut [f32],
    epi: Option<&Epilogue>,
) {
    let (oh, ow) = (h + 1 - kh, w + 1 - kw);
    debug_assert!(xi.len() >= h * w * ci && yi.len() >= oh * ow * co);
    debug_assert!(kh * kw * ci * NV <= MAX_PACKED && co <= NV * LANES);
    debug_assert!(inner.top <= inner.bottom && inner.bottom <= h && inner.left <= inner.right && inner.right <= w);
    // Columns [lo, hi): every filter column meets `inner`; the borders
    // either side take fewer, and run apart when at least `MIN_BORDER`
    // wide (narrower blocks keep too few sums in flight to hide the
    // fused multiply-add latency: measured slower than computing their
    // zero taps within the wider block). Blocks of equal width (the last
    // narrower).
    let mut lo = inner.left.min(ow);
    let mut hi = (inner.right + 1).saturating_sub(kw).clamp(lo, ow);
    if lo < MIN_BORDER {
        lo = 0;
    }
    if ow - hi < MIN_BORDER {
        hi = ow;
    }
    let segs = [(0, lo), (lo, hi), (hi, ow)];
    for oy in 0..oh {
        let ky_lo = inner.top.saturating_sub(oy).min(kh);
        let ky_hi = inner.bottom.saturating_sub(oy).clamp(ky_lo, kh);
        for &(s0, s1) in &segs {
            if s0 == s1 {
                continue;
            }
            let r = (s1 - s0).div_ceil((s1 - s0).div_ceil(MAX_R));
            let mut ox = s0;
            while ox < s1 {
                let n = r.min(s1 - ox);
                let kx_lo = inner.left.saturating_sub(ox + n - 1).min(kw);
                let kx_hi = inner.right.saturating_sub(ox).clamp(kx_lo, kw);
                let nky = if kx_lo < kx_hi { ky_hi - ky_lo } else { 0 };
                // SAFETY: pixels `ox..ox+n` of row `oy` and their windows
                // lie in `xi` and `yi` (VALID), the filter in `wpk`
                // (asserted above).
                let xs = xi.as_ptr().add(((oy + ky_lo) * w + ox + kx_lo) * ci);
                let ws = wpk.as_ptr().add((ky_lo * kw + kx_lo) * ci * NV);
                let ys = yi.as_mut_ptr().add((oy * ow + ox) * co);
                let taps = (nky, (kx_hi - kx_lo) * ci);
                let strides = (w * ci, ci, kw * ci * NV);
                if NV == 1 {
                    run_block!(n, 1, ci, (xs, ws, taps, strides, ys, co, epi));
                } else {
                    run_block!(n, 2, ci, (xs, ws, taps, strides, ys, co, epi));
                }
                ox += n;
            }
        }
    }
}

/// `R` output pixels times `NV` vectors of output channels, over `nky`
/// filter rows of `j` taps each: `strides = (row, pixel, filter_row)`, the
/// input's row length and pixel step in floats, the packed filter's row
/// length in vectors; `PIXEL`, when not 0, is `pixel` as a constant.
///
/// # Safety
/// Every `x[ky * row + r * pixel + jj]` (`ky < nky, r < R, jj < j`), the
/// filter vectors `w[ky * filter_row + jj * NV + v]` and the outputs
/// `y[r * co + 0..co]` are in bounds; `co <= NV * LANES`.
#[inline(always)]
unsafe fn block_body<const NV: usize, const R: usize, const PIXEL: usize>(
    x: *const f32,
    w: *const V,
    (nky, j): (usize, usize),
    (row, pixel, filter_row): (usize, usize, usize),
    y: *mut f32,
    co: usize,
    epi: Option<&Epilogue>,
) {
    let pixel = if PIXEL == 0 { pixel } else { PIXEL };
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    for ky in 0..nky {
        let xr = x.add(ky * row);
        let mut wt = w.add(ky * filter_row) as *const f32;
        for jj in 0..j {
            let mut wv = [_mm512_setzero_ps(); NV];
            for (v, wvv) in wv.iter_mut().enumerate() {
                *wvv = _mm512_loadu_ps(wt.add(v * LANES));
            }
            wt = wt.add(NV * LANES);
            for (r, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_set1_ps(*xr.add(r * pixel + jj));
                for v in 0..NV {
                    a[v] = _mm512_fmadd_ps(xv, wv[v], a[v]);
                }
            }
        }
    }
    store(&acc, y, co, epi);
}

/// Stores `R` pixels of `NV` vectors through the epilogue.
#[inline(always)]
unsafe fn store<const NV: usize, const R: usize>(
    acc: &[[__m512; NV]; R],
    y: *mut f32,
    co: usize,
    epi: Option<&Epilogue>,
) {
    for (r, a) in acc.iter().enumerate() {
        for (v, av) in a.iter().enumerate() {
            let nb = (co - v * LANES).min(LANES);
            _mm512_mask_storeu_ps(y.add(r * co + v * LANES), mask(nb), Epilogue::apply(epi, v, *av));
        }
    }
}

/// The `block` forms [`run_block`] picks; arguments and safety as [`block_body`].
macro_rules! block_fn {
    ($name:ident, $pixel:literal) => {
        #[inline(never)]
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn $name<const NV: usize, const R: usize>(
            x: *const f32,
            w: *const V,
            taps: (usize, usize),
            strides: (usize, usize, usize),
            y: *mut f32,
            co: usize,
            epi: Option<&Epilogue>,
        ) {
            block_body::<NV, R, $pixel>(x, w, taps, strides, y, co, epi)
        }
    };
}
block_fn!(block, 0);
block_fn!(block12, 12);
block_fn!(block24, 24);

/// Adds one image's `sum_pixels x[pixel + off + g] * dy[pixel, :]` for the
/// `G` input channels `g` of one filter tap to `tot[g * NV + v]`; `xi` is
/// `[oh+kh-1, w, ci]`, `dy` is `[oh, ow, co]`, `co <= NV * LANES`.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn filter_group<const NV: usize, const G: usize>(
    xi: &[f32],
    w: usize,
    ci: usize,
    off: usize,
    dy: &[f32],
    oh: usize,
    ow: usize,
    co: usize,
    tot: &mut [V],
) {
    debug_assert!(tot.len() == G * NV && dy.len() >= oh * ow * co && co <= NV * LANES);
    debug_assert!(xi.len() >= off + ((oh - 1) * w + ow - 1) * ci + G);
    let mut m = [0 as __mmask16; NV];
    for (v, mv) in m.iter_mut().enumerate() {
        *mv = mask((co - v * LANES).min(LANES));
    }
    let mut acc = [[_mm512_setzero_ps(); NV]; G];
    for oy in 0..oh {
        // SAFETY: every read below lies in `xi` and `dy` (asserted above).
        let xr = xi.as_ptr().add(off + oy * w * ci);
        let dr = dy.as_ptr().add(oy * ow * co);
        for ox in 0..ow {
            let (xp, dp) = (xr.add(ox * ci), dr.add(ox * co));
            let mut dv = [_mm512_setzero_ps(); NV];
            for v in 0..NV {
                dv[v] = _mm512_maskz_loadu_ps(m[v], dp.add(v * LANES));
            }
            for (g, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_set1_ps(*xp.add(g));
                for v in 0..NV {
                    a[v] = _mm512_fmadd_ps(xv, dv[v], a[v]);
                }
            }
        }
    }
    for (t, a) in tot.chunks_exact_mut(NV).zip(&acc) {
        for (tv, av) in t.iter_mut().zip(a) {
            _mm512_storeu_ps(tv.as_mut_ptr(), _mm512_add_ps(_mm512_loadu_ps(tv.as_ptr()), *av));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::conv::{conv2d, conv2d_backprop_filter, conv2d_backprop_input, Algorithm, ConvGeom};
    use crate::testutil::{assert_close, Lcg};
    use crate::window::Padding;

    /// The three sums straight from the definition, in f64:
    /// `y[b,oy,ox,o] = sum x[b, oy-pt+ky, ox-pl+kx, c] * W[ky,kx,c,o]` and
    /// its two gradients for `dy` (stride 1).
    fn naive(p: &ConvGeom, x: &[f32], f: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let ((oh, pt), (ow, pl)) = (p.out_h(), p.out_w());
        let (ci, co) = (p.c_in, p.c_out);
        let mut y = vec![0.0f64; p.y_len()];
        let mut dx = vec![0.0f64; p.x_len()];
        let mut df = vec![0.0f64; p.filter_len()];
        for b in 0..p.n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for ky in 0..p.kh {
                        for kx in 0..p.kw {
                            let (iy, ix) = ((oy + ky) as isize - pt as isize, (ox + kx) as isize - pl as isize);
                            if iy < 0 || ix < 0 || iy >= p.h as isize || ix >= p.w as isize {
                                continue;
                            }
                            for c in 0..ci {
                                let xi = ((b * p.h + iy as usize) * p.w + ix as usize) * ci + c;
                                for o in 0..co {
                                    let (yi, fi) =
                                        (((b * oh + oy) * ow + ox) * co + o, ((ky * p.kw + kx) * ci + c) * co + o);
                                    y[yi] += x[xi] as f64 * f[fi] as f64;
                                    dx[xi] += dy[yi] as f64 * f[fi] as f64;
                                    df[fi] += x[xi] as f64 * dy[yi] as f64;
                                }
                            }
                        }
                    }
                }
            }
        }
        let f32s = |v: Vec<f64>| v.into_iter().map(|a| a as f32).collect::<Vec<_>>();
        (f32s(y), f32s(dx), f32s(df))
    }

    /// Random geometries the dispatcher sends to the blocked kernels (on
    /// CPUs with AVX-512): SAME and VALID, filters up to 5x5 (also wider than
    /// the input under SAME), one and two vectors of output channels with tails.
    #[test]
    fn blocked_matches_the_definition_on_random_geometries() {
        let mut r = Lcg::new(91);
        let mut seen = 0;
        while seen < 120 {
            let p = ConvGeom {
                n: 1 + r.below(3),
                h: 1 + r.below(14),
                w: 1 + r.below(14),
                c_in: 12 + r.below(5),
                kh: 1 + r.below(5),
                kw: 1 + r.below(5),
                c_out: 1 + r.below(32),
                stride_h: 1,
                stride_w: 1,
                padding: if r.below(2) == 0 { Padding::Same } else { Padding::Valid },
            };
            if p.algorithm() != Algorithm::Blocked {
                continue;
            }
            seen += 1;
            let (x, f, dy) = (r.vec(p.x_len()), r.vec(p.filter_len()), r.vec(p.y_len()));
            let (want_y, want_dx, want_df) = naive(&p, &x, &f, &dy);
            let mut ws = vec![f32::NAN; p.workspace_len()];
            let mut y = vec![f32::NAN; p.y_len()];
            conv2d(&p, &x, &f, &mut y, &mut ws);
            assert_close(&y, &want_y, 1e-5, &format!("forward {p:?}"));
            let mut dx = vec![f32::NAN; p.x_len()];
            ws.fill(f32::NAN);
            conv2d_backprop_input(&p, &dy, &f, &mut dx, &mut ws);
            assert_close(&dx, &want_dx, 1e-5, &format!("input grad {p:?}"));
            let mut df = vec![f32::NAN; p.filter_len()];
            ws.fill(f32::NAN);
            conv2d_backprop_filter(&p, &x, &dy, &mut df, &mut ws);
            assert_close(&df, &want_df, 1e-4, &format!("filter grad {p:?}"));
        }
    }

    /// The seed convnet's second layer selects the blocked kernels.
    #[test]
    fn seed_second_layer_is_blocked() {
        let p = ConvGeom {
            n: 256,
            h: 12,
            w: 12,
            c_in: 12,
            kh: 3,
            kw: 3,
            c_out: 24,
            stride_h: 1,
            stride_w: 1,
            padding: Padding::Valid,
        };
        assert_eq!(p.algorithm(), Algorithm::Blocked);
        assert!(crate::conv::blocked_dx_avx512::fits(&p));
    }
}
