//! Register-blocked direct convolution for moderate channel counts
//! ([`super::Algorithm::Blocked`]: stride 1, `12 <= c_in <= 16`, `c_out <=
//! 32`), one body generic over [`pulp::Simd`] for every path; layouts as the
//! parent module (NHWC, HWIO).
//!
//! All three kernels reduce to two loops over one image at a time:
//! - [`valid_image`], a VALID stride-1 correlation of an image `[h, w, ci]`
//!   with a packed filter into `[h-kh+1, w-kw+1, co]`, the `co` channels as
//!   vectors of `L = S::F32_LANES` lanes, taken [`MAX_NV`] vectors at a time.
//!   A register block is `R` output pixels of one row times `NV` vectors
//!   (`R` per path from its register count: 12 pixels times 2 vectors on
//!   AVX-512, 4 times 3 on AVX2 at the seed's 24 channels); per tap `(ky,
//!   kx, c)` the `NV` filter vectors are loaded once and each pixel adds
//!   `x[pixel + tap] * w[tap]` (a broadcast and a fused multiply-add per
//!   vector). The forward pass runs it on `x` (SAME: on a zero-padded copy
//!   of the image in the workspace); the input gradient of non-VALID
//!   geometries runs it on `dy` zero-padded by `kh-1, kw-1` around (in the
//!   workspace) with the filter flipped and transposed (`co` and `ci`
//!   swapped): `dx = corr(pad(dy), flip(W)^T)`. VALID input gradients take
//!   the column-row kernel (`blocked_dx.rs`).
//! - the filter gradient (`blocked_dw.rs`).
//!
//! ## Invariants
//! - Each output sums its taps in `(ky, kx, c)` order with fused
//!   multiply-adds, over the filter rows that meet the image's non-zero part
//!   for its output row and the filter columns that meet it for its
//!   *segment* of the row (interior, or a border run apart): both a function
//!   of the geometry, not of the block, so **every path gives the same
//!   bits** (tested); equal to im2col + GEMM up to reassociation.
//! - Lanes past the channel count compute garbage (zero-padded filters)
//!   that is never stored.
//! - The callers keep (checked by [`super::ConvGeom::blocked_fits`]): the
//!   packed filters fit in `MAX_PACKED` vectors of 16 lanes, and a padded
//!   image (`[oh+kh-1, ow+kw-1, c_in]` forward / filter gradient when padded,
//!   `[h+kh-1, w+kw-1, c_out]` input gradient) fits in the workspace.

use pulp::{Simd, WithSimd};

use super::vec::{self, Epilogue, Packed};
use super::ConvGeom;

/// Most output pixels per register block in [`valid_image`], and the
/// pixels per block whose filter columns are chosen together.
pub(super) const MAX_R: usize = 12;
/// Most channel vectors per register block.
pub(super) const MAX_NV: usize = 4;
/// Narrowest border segment [`valid_image`] runs as blocks of its own.
const MIN_BORDER: usize = 4;

/// Most rows (pixels, or input channels of the filter gradient) per register
/// block with `nv` vectors each on the path `S`: the accumulators, `nv`
/// filter (or `dy`) vectors, a broadcast and one spare fit the path's
/// registers (AVX2 at 3 vectors: 3 rows, 13 of 16; AVX-512 at 2: 12 rows).
#[inline(always)]
pub(super) fn max_rows<S: Simd>(nv: usize) -> usize {
    ((vec::registers(S::F32_LANES) - nv - 2) / nv).clamp(1, MAX_R)
}

/// Calls `$f::<NV, N>$args` for the run-time `($nv, $n)`, `NV` in
/// `1..=MAX_NV`, `N` in `1..=12`.
macro_rules! dispatch_nv_n {
    ($nv:expr, $n:expr, $f:ident, $args:tt) => {
        dispatch_nv_n!(@nv $nv, $n, $f, $args; 1 2 3 4)
    };
    (@nv $nv:expr, $n:expr, $f:ident, $args:tt; $($v:literal)*) => {
        match $nv {
            $($v => dispatch_nv_n!(@n $v, $n, $f, $args; 1 2 3 4 5 6 7 8 9 10 11),)*
            _ => unreachable!("dispatch_nv_n: NV in 1..=MAX_NV"),
        }
    };
    (@n $v:literal, $n:expr, $f:ident, $args:tt; $($r:literal)*) => {
        match $n {
            $($r => $f::<$v, $r> $args,)*
            _ => $f::<$v, 12> $args,
        }
    };
}
pub(super) use dispatch_nv_n;

/// The padded image `valid_image` reads for the forward pass and the filter
/// gradient: `(hp, wp, padded)`, `padded` false when `x` itself is it (VALID).
pub(super) fn padded_input(p: &ConvGeom) -> (usize, usize, bool) {
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
pub(super) fn image<'a>(
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

/// `y = conv(x, filter)` through `epi`, as a [`WithSimd`] op. Requires
/// `p.blocked_fits()`; `ws` as [`workspace_need`].
pub(super) struct Forward<'a> {
    pub(super) p: &'a ConvGeom,
    pub(super) x: &'a [f32],
    pub(super) filter: &'a [f32],
    pub(super) y: &'a mut [f32],
    pub(super) ws: &'a mut [f32],
    pub(super) epi: Option<&'a Epilogue>,
}

impl WithSimd for Forward<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Forward { p, x, filter, y, ws, epi } = self;
        let l = S::F32_LANES;
        let ((oh, pt), (ow, pl)) = (p.out_h(), p.out_w());
        let (ci, co, k) = (p.c_in, p.c_out, p.k());
        let nvt = co.div_ceil(l);
        // Tap t's vector v at vector t * nvt + v, zero-padded.
        let mut wpk = Packed::zeroed();
        for t in 0..k {
            for v in 0..nvt {
                let (c0, nb) = (v * l, (co - v * l).min(l));
                let d = (t * nvt + v) * l;
                wpk.0[d..d + nb].copy_from_slice(&filter[t * co + c0..t * co + c0 + nb]);
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
            valid_image(simd, xi, (hp, wp, ci), inner, (p.kh, p.kw), &wpk.0, co, yb, epi);
        }
    }
}

/// The padded correlation form of the input gradient (non-VALID
/// geometries; `dx` overwritten), as a [`WithSimd`] op. Requires
/// `p.blocked_fits()`; `ws` as [`workspace_need`].
pub(super) struct InputGradPadded<'a> {
    pub(super) p: &'a ConvGeom,
    pub(super) dy: &'a [f32],
    pub(super) filter: &'a [f32],
    pub(super) dx: &'a mut [f32],
    pub(super) ws: &'a mut [f32],
}

impl WithSimd for InputGradPadded<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let InputGradPadded { p, dy, filter, dx, ws } = self;
        let l = S::F32_LANES;
        let ((oh, pt), (ow, pl)) = (p.out_h(), p.out_w());
        let (ci, co, kh, kw) = (p.c_in, p.c_out, p.kh, p.kw);
        let nvt = ci.div_ceil(l);
        // Flipped and transposed: tap (ky', kx', c) with c over c_out holds
        // the vectors over c_in of W[kh-1-ky', kw-1-kx', :, c].
        let mut wpk = Packed::zeroed();
        for ky in 0..kh {
            for kx in 0..kw {
                let src = ((kh - 1 - ky) * kw + (kw - 1 - kx)) * ci;
                for c in 0..co {
                    let d = ((ky * kw + kx) * co + c) * nvt * l;
                    for (i, v) in wpk.0[d..d + ci].iter_mut().enumerate() {
                        *v = filter[(src + i) * co + c];
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
            valid_image(simd, dyp, (hq, wq, co), inner, (kh, kw), &wpk.0, ci, dxb, None);
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
/// with the packed filter `wpk` (tap `(ky, kx, c)`'s vector `v` at vector
/// `((ky * kw + kx) * ci + c) * ceil(co / L) + v`) into `yi: [h-kh+1,
/// w-kw+1, co]`. Taps that read only zeros are skipped: each output row
/// takes the filter rows that meet `inner`, each segment of the row (see
/// the module's invariants) the filter columns that meet it for one of its
/// pixels.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn valid_image<S: Simd>(
    simd: S,
    xi: &[f32],
    (h, w, ci): (usize, usize, usize),
    inner: Inner,
    (kh, kw): (usize, usize),
    wpk: &[f32],
    co: usize,
    yi: &mut [f32],
    epi: Option<&Epilogue>,
) {
    let l = S::F32_LANES;
    let (oh, ow) = (h + 1 - kh, w + 1 - kw);
    let nvt = co.div_ceil(l);
    assert!(xi.len() >= h * w * ci && yi.len() >= oh * ow * co && kh * kw * ci * nvt * l <= wpk.len());
    debug_assert!(inner.top <= inner.bottom && inner.bottom <= h && inner.left <= inner.right && inner.right <= w);
    // Columns [lo, hi): every filter column meets `inner`; the borders
    // either side take fewer, and run apart when at least `MIN_BORDER`
    // wide (narrower blocks keep too few sums in flight to hide the
    // fused multiply-add latency: measured slower than computing their
    // zero taps within the wider block).
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
            // The filter columns that meet `inner` for some pixel of the segment.
            let kx_lo = inner.left.saturating_sub(s1 - 1).min(kw);
            let kx_hi = inner.right.saturating_sub(s0).clamp(kx_lo, kw);
            let nky = if kx_lo < kx_hi { ky_hi - ky_lo } else { 0 };
            let mut v0 = 0;
            while v0 < nvt {
                let nv = MAX_NV.min(nvt - v0);
                let rmax = max_rows::<S>(nv);
                let r = (s1 - s0).div_ceil((s1 - s0).div_ceil(rmax));
                let mut ox = s0;
                while ox < s1 {
                    let n = r.min(s1 - ox);
                    // SAFETY (of the pointers below and of the block):
                    // pixels `ox..ox+n` of row `oy` and their windows lie in
                    // `xi` and `yi` (VALID), the filter in `wpk` (asserted
                    // above); channels `v0 * l..` below `co`.
                    let blk = Block {
                        x: unsafe { xi.as_ptr().add(((oy + ky_lo) * w + ox + kx_lo) * ci) },
                        w: unsafe { wpk.as_ptr().add(((ky_lo * kw + kx_lo) * ci * nvt + v0) * l) },
                        taps: (nky, (kx_hi - kx_lo) * ci),
                        strides: (w * ci, ci, kw * ci * nvt * l, nvt * l),
                        y: unsafe { yi.as_mut_ptr().add((oy * ow + ox) * co + v0 * l) },
                        co,
                        c0: v0 * l,
                        epi,
                    };
                    match ci {
                        12 => dispatch_nv_n!(nv, n, run12, (simd, blk)),
                        24 => dispatch_nv_n!(nv, n, run24, (simd, blk)),
                        _ => dispatch_nv_n!(nv, n, run0, (simd, blk)),
                    }
                    ox += n;
                }
                v0 += nv;
            }
        }
    }
}

/// One register block of [`valid_image`]: `R` output pixels times `NV`
/// vectors of output channels from `c0`, over `nky` filter rows of `j`
/// taps each. `strides = (row, pixel, filter_row, tap)`: the input's row
/// length and pixel step in floats, the packed filter's row length and
/// tap step in floats. `y` points at channel `c0` of the first pixel,
/// pixels `co` floats apart.
///
/// Safety (kept by [`valid_image`]): every `x[ky * row + r * pixel + jj]`
/// (`ky < nky, r < R, jj < j`), the filter vectors at `w + ky * filter_row +
/// jj * tap + v * L` (`v < NV`) and the outputs `y[r * co + 0..min(NV * L,
/// co - c0)]` are in bounds.
struct Block<'a> {
    x: *const f32,
    w: *const f32,
    taps: (usize, usize),
    strides: (usize, usize, usize, usize),
    y: *mut f32,
    co: usize,
    c0: usize,
    epi: Option<&'a Epilogue>,
}

/// Runs `blk` as its own function with the path's features (pulp's
/// `vectorize`): the accumulators get the whole register file.
#[inline(always)]
fn run<const NV: usize, const R: usize, const PIXEL: usize>(simd: impl Simd, blk: Block<'_>) {
    struct Op<'a, const NV: usize, const R: usize, const PIXEL: usize>(Block<'a>);
    impl<const NV: usize, const R: usize, const PIXEL: usize> WithSimd for Op<'_, NV, R, PIXEL> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            block_body::<S, NV, R, PIXEL>(simd, self.0)
        }
    }
    simd.vectorize(Op::<NV, R, PIXEL>(blk))
}

/// [`run`] with the pixel step 12, 24, or taken from the block (0).
#[inline(always)]
fn run12<const NV: usize, const R: usize>(simd: impl Simd, blk: Block<'_>) {
    run::<NV, R, 12>(simd, blk)
}
#[inline(always)]
fn run24<const NV: usize, const R: usize>(simd: impl Simd, blk: Block<'_>) {
    run::<NV, R, 24>(simd, blk)
}
#[inline(always)]
fn run0<const NV: usize, const R: usize>(simd: impl Simd, blk: Block<'_>) {
    run::<NV, R, 0>(simd, blk)
}

#[inline(always)]
fn block_body<S: Simd, const NV: usize, const R: usize, const PIXEL: usize>(simd: S, b: Block<'_>) {
    let l = S::F32_LANES;
    let (nky, j) = b.taps;
    let (row, pixel, filter_row, tap) = b.strides;
    let pixel = if PIXEL == 0 { pixel } else { PIXEL };
    let mut acc = [[simd.splat_f32s(0.0); NV]; R];
    // SAFETY: see `Block`.
    unsafe {
        for ky in 0..nky {
            let xr = b.x.add(ky * row);
            let mut wt = b.w.add(ky * filter_row);
            for jj in 0..j {
                let mut wv = [simd.splat_f32s(0.0); NV];
                for (v, wvv) in wv.iter_mut().enumerate() {
                    *wvv = vec::load::<S>(wt.add(v * l));
                }
                wt = wt.add(tap);
                for (r, a) in acc.iter_mut().enumerate() {
                    let xv = simd.splat_f32s(*xr.add(r * pixel + jj));
                    for v in 0..NV {
                        a[v] = simd.mul_add_f32s(xv, wv[v], a[v]);
                    }
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (v, av) in a.iter().enumerate() {
                let c = b.c0 + v * l;
                if c < b.co {
                    let out = Epilogue::apply(simd, b.epi, c, *av);
                    vec::store_first(simd, b.y.add(r * b.co + v * l), out, b.co - c);
                }
            }
        }
    }
}

/// `y = conv(x, filter)` on `path`, each output vector through the bias
/// (and ReLU when `relu`) when `bias` is given. Requires
/// `p.blocked_fits()`; `ws` as [`workspace_need`].
pub(super) fn conv2d_on(
    path: crate::simd::SimdPath,
    p: &ConvGeom,
    x: &[f32],
    filter: &[f32],
    bias: Option<(&[f32], bool)>,
    y: &mut [f32],
    ws: &mut [f32],
) {
    let epi = bias.map(|(b, relu)| Epilogue::new(b, relu));
    crate::simd::dispatch_on(path, Forward { p, x, filter, y, ws, epi: epi.as_ref() })
}

/// `dx = conv2d_backprop_input(dy, filter)` (overwritten) on `path`: by
/// column rows where VALID (`blocked_dx.rs`), else by the padded
/// correlation. Requires `p.blocked_fits()`; `ws` as [`workspace_need`].
pub(super) fn conv2d_backprop_input_on(
    path: crate::simd::SimdPath,
    p: &ConvGeom,
    dy: &[f32],
    filter: &[f32],
    dx: &mut [f32],
    ws: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if path == crate::simd::SimdPath::Avx512 && path.supported() && super::blocked_dx_avx512::fits(p) {
        // SAFETY: `supported` detected AVX-512F (and with it FMA); `fits` checked.
        return unsafe { super::blocked_dx_avx512::conv2d_backprop_input(p, dy, filter, dx) };
    }
    if super::blocked_dx::fits(p) {
        crate::simd::dispatch_on(path, super::blocked_dx::InputGrad { p, dy, filter, dx })
    } else {
        crate::simd::dispatch_on(path, InputGradPadded { p, dy, filter, dx, ws })
    }
}

/// `dfilter = x^T (windows) * dy` (overwritten) on `path`. Requires
/// `p.blocked_fits()`; `ws` as [`workspace_need`].
pub(super) fn conv2d_backprop_filter_on(
    path: crate::simd::SimdPath,
    p: &ConvGeom,
    x: &[f32],
    dy: &[f32],
    dfilter: &mut [f32],
    ws: &mut [f32],
) {
    crate::simd::dispatch_on(path, super::blocked_dw::FilterGrad { p, x, dy, dfilter, ws })
}
