//! Direct convolution (no im2col) for few input channels: the forward pass
//! (with its bias/ReLU epilogue, `direct_fwd.rs`) and the filter gradient
//! (`direct_dw.rs`). Layouts as the parent module (NHWC, HWIO). One body,
//! generic over [`pulp::Simd`], for every path (AVX-512, AVX2, NEON,
//! scalar), entered through [`crate::simd::dispatch`].
//!
//! Why: with `c_in = 1` (the seed convnet's first layer, 28x28x1 -> 5x5x12)
//! the im2col matrix is `[rows, 25]` and the GEMM has `N = 12, K = 25`: the
//! copy dominates and the GEMM's panels are tiny (measured 15 GFLOP/s
//! forward, 13 GFLOP/s filter gradient at batch 256, one thread).
//!
//! Method: output channels are the vector lanes (`L = S::F32_LANES`). The
//! filter is packed once per call into `[c_out blocks][K taps]` vectors of
//! `L` floats (zero-padded; on the stack, no allocation), `K = kh * kw *
//! c_in` in `(ky, kx, ci)` order, as the filter's own row order.
//! - forward: a few output pixels of one row are register-blocked; per
//!   tap, one filter vector is loaded and each pixel adds `x[tap] * w[tap]`
//!   (a broadcast and a fused multiply-add) to its accumulator. With unit
//!   steps (stride 1, one input channel) and `kw` 3 or 5, a filter row's
//!   `kw` vectors stay in registers and each input value is broadcast once
//!   for the pixels it meets. Pixels whose window leaves the input (SAME
//!   padding) take a checked path that skips the padded taps, one pixel at a
//!   time.
//! - filter gradient: for one image at a time, a group of taps keeps one
//!   accumulator each in registers while every output pixel of the image
//!   adds `x[pixel, tap] * dy[pixel, :]`; the image's sums are then added to
//!   the running total. Common small filters run whole filter rows per group
//!   so that tap offsets are constants. Summing per image first keeps the
//!   f32 sums short (576 terms for a 24x24 output, not 147456) and the order
//!   fixed: the result depends only on the inputs.
//!
//! ## Invariants
//! - Each output sums its taps in `(ky, kx, ci)` order with fused
//!   multiply-adds (forward), each filter-gradient entry its pixels in row
//!   order per image, then the images in order: equal to the im2col path up
//!   to reassociation, and **the same bits on every SIMD path** (the width
//!   and the register blocking, chosen per path, only decide which outputs
//!   share a register; the padded taps skipped depend on the pixel only).
//!   Tests compare every available path bit for bit.
//! - Lanes past `c_out` in a block compute garbage that is never stored.
//! - The geometry check [`fits`] counts 16-lane vectors: a function of the
//!   geometry only (see `vec.rs`).

use super::vec::{MAX_LANES, MAX_PACKED};
use super::ConvGeom;

/// Output pixels per register block in the forward pass (general steps).
pub(super) const FWD_PIXELS: usize = 8;

/// True when the direct kernels handle `p`: the packed filter fits.
pub(crate) fn fits(p: &ConvGeom) -> bool {
    p.c_out.div_ceil(MAX_LANES) * p.k() <= MAX_PACKED
}

/// `y = conv(x, filter)` without workspace, on `path`, each output vector
/// through the bias (and ReLU when `relu`) when `bias` is given. Requires
/// [`fits`]; `bias` has `c_out` floats.
pub(crate) fn conv2d_on(
    path: crate::simd::SimdPath,
    p: &ConvGeom,
    x: &[f32],
    filter: &[f32],
    bias: Option<(&[f32], bool)>,
    y: &mut [f32],
) {
    debug_assert!(fits(p));
    let epi = bias.map(|(b, relu)| super::vec::Epilogue::new(b, relu));
    crate::simd::dispatch_on(path, super::direct_fwd::Forward { p, x, filter, y, epi: epi.as_ref() })
}

/// `dfilter = x^T (windows) * dy` without workspace, on `path`. Requires [`fits`].
pub(crate) fn conv2d_backprop_filter_on(
    path: crate::simd::SimdPath,
    p: &ConvGeom,
    x: &[f32],
    dy: &[f32],
    dfilter: &mut [f32],
) {
    debug_assert!(fits(p));
    crate::simd::dispatch_on(path, super::direct_dw::FilterGrad { p, x, dy, dfilter })
}

/// The geometry in the form the loops use.
pub(super) struct Geo {
    pub(super) oh: usize,
    pub(super) ow: usize,
    pub(super) pt: usize,
    pub(super) pl: usize,
    pub(super) k: usize,
    /// Offset of tap `t` in `x` from the window's top-left cell, for windows inside the input.
    pub(super) off: [usize; MAX_PACKED],
    /// Output columns `[ox_lo, ox_hi)` whose window lies inside the input's width.
    pub(super) ox_lo: usize,
    pub(super) ox_hi: usize,
}

impl Geo {
    #[inline(always)]
    pub(super) fn new(p: &ConvGeom) -> Geo {
        let (oh, pt) = p.out_h();
        let (ow, pl) = p.out_w();
        let k = p.k();
        let mut off = [0; MAX_PACKED];
        for ky in 0..p.kh {
            for kx in 0..p.kw {
                for c in 0..p.c_in {
                    off[(ky * p.kw + kx) * p.c_in + c] = (ky * p.w + kx) * p.c_in + c;
                }
            }
        }
        let (ox_lo, ox_hi) = inside(ow, p.stride_w, pl, p.kw, p.w);
        Geo { oh, ow, pt, pl, k, off, ox_lo, ox_hi }
    }

    /// First input row of output row `oy`'s window (may be negative).
    #[inline(always)]
    pub(super) fn iy0(&self, p: &ConvGeom, oy: usize) -> isize {
        (oy * p.stride_h) as isize - self.pt as isize
    }

    /// First input column of output column `ox`'s window (may be negative).
    #[inline(always)]
    pub(super) fn ix0(&self, p: &ConvGeom, ox: usize) -> isize {
        (ox * p.stride_w) as isize - self.pl as isize
    }
}

/// The output positions `[lo, hi)` whose window `[o*s - pad, o*s - pad + k)`
/// lies inside `[0, input)`; empty (`lo == hi`) when there are none.
pub(super) fn inside(out: usize, stride: usize, pad: usize, k: usize, input: usize) -> (usize, usize) {
    let lo = pad.div_ceil(stride).min(out);
    // o*s - pad + k <= input  <=>  o <= (input + pad - k) / s
    let hi = if input + pad >= k { ((input + pad - k) / stride + 1).min(out) } else { 0 };
    (lo, hi.max(lo))
}

/// The in-range taps' `(ky, kx)` bounds of a window starting at `(iy0, ix0)`.
#[inline(always)]
pub(super) fn clip(p: &ConvGeom, iy0: isize, ix0: isize) -> (usize, usize, usize, usize) {
    let ky_lo = (-iy0).max(0) as usize;
    let ky_hi = ((p.h as isize - iy0).max(0) as usize).min(p.kh);
    let kx_lo = (-ix0).max(0) as usize;
    let kx_hi = ((p.w as isize - ix0).max(0) as usize).min(p.kw);
    (ky_lo, ky_hi.max(ky_lo), kx_lo, kx_hi.max(kx_lo))
}

/// Packs `filter [K, c_out]` into vectors of `lanes` floats, block `blk`'s
/// tap `t` at vector `blk * K + t` of `wp` (zeroed by the caller: the last
/// block's lanes past `c_out` stay zero).
#[inline(always)]
pub(super) fn pack(p: &ConvGeom, lanes: usize, filter: &[f32], wp: &mut [f32]) {
    let (co, k) = (p.c_out, p.k());
    for blk in 0..co.div_ceil(lanes) {
        let (c0, nb) = (blk * lanes, (co - blk * lanes).min(lanes));
        for t in 0..k {
            let d = (blk * k + t) * lanes;
            wp[d..d + nb].copy_from_slice(&filter[t * co + c0..t * co + c0 + nb]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::{conv2d as conv2d_any, conv2d_backprop_filter as filter_any, Algorithm};
    use crate::simd::active;
    use crate::testutil::{assert_close, Lcg};
    use crate::window::Padding;

    /// Random geometries the direct kernels handle (whether or not the
    /// dispatcher picks them): SAME and VALID, strides 1-3, odd sizes,
    /// filters wider than the input, 1-4 input channels and 1-40 output
    /// channels (one, two and three vector blocks with tails).
    fn geometries(r: &mut Lcg, count: usize) -> Vec<ConvGeom> {
        let mut v = Vec::new();
        while v.len() < count {
            let p = ConvGeom {
                n: 1 + r.below(3),
                h: 1 + r.below(13),
                w: 1 + r.below(13),
                c_in: 1 + r.below(4),
                kh: 1 + r.below(6),
                kw: 1 + r.below(6),
                c_out: 1 + r.below(40),
                stride_h: 1 + r.below(3),
                stride_w: 1 + r.below(3),
                padding: if r.below(2) == 0 { Padding::Same } else { Padding::Valid },
            };
            if fits(&p) && !p.is_pointwise() {
                v.push(p);
            }
        }
        v
    }

    /// The im2col + GEMM path on the same geometry: the reference the
    /// direct kernels must match up to reassociation.
    fn im2col_forward(p: &ConvGeom, x: &[f32], f: &[f32]) -> Vec<f32> {
        let mut y = vec![f32::NAN; p.y_len()];
        let mut ws = vec![f32::NAN; p.workspace_len()];
        super::super::cpu::im2col_conv2d(p, x, f, &mut y, &mut ws);
        y
    }

    fn im2col_filter(p: &ConvGeom, x: &[f32], dy: &[f32]) -> Vec<f32> {
        let mut df = vec![f32::NAN; p.filter_len()];
        let mut ws = vec![f32::NAN; p.workspace_len()];
        super::super::cpu::im2col_conv2d_backprop_filter(p, x, dy, &mut df, &mut ws);
        df
    }

    #[test]
    fn direct_matches_im2col_on_random_geometries() {
        let mut r = Lcg::new(71);
        for p in geometries(&mut r, 200) {
            let x = r.vec(p.x_len());
            let f = r.vec(p.filter_len());
            let dy = r.vec(p.y_len());
            let mut y = vec![f32::NAN; p.y_len()];
            conv2d_on(active(), &p, &x, &f, None, &mut y);
            assert_close(&y, &im2col_forward(&p, &x, &f), 1e-5, &format!("forward {p:?}"));
            let mut df = vec![f32::NAN; p.filter_len()];
            conv2d_backprop_filter_on(active(), &p, &x, &dy, &mut df);
            assert_close(&df, &im2col_filter(&p, &x, &dy), 1e-4, &format!("filter grad {p:?}"));
        }
    }

    /// The seed convnet's first layer at a batch where per-image sums matter.
    #[test]
    fn seed_first_layer_matches_im2col() {
        let p = ConvGeom {
            n: 9,
            h: 28,
            w: 28,
            c_in: 1,
            kh: 5,
            kw: 5,
            c_out: 12,
            stride_h: 1,
            stride_w: 1,
            padding: Padding::Valid,
        };
        assert_eq!(p.algorithm(), Algorithm::Direct);
        let mut r = Lcg::new(72);
        let (x, f, dy) = (r.vec(p.x_len()), r.vec(p.filter_len()), r.vec(p.y_len()));
        let mut y = vec![f32::NAN; p.y_len()];
        conv2d_any(&p, &x, &f, &mut y, &mut vec![f32::NAN; p.workspace_len()]);
        assert_close(&y, &im2col_forward(&p, &x, &f), 1e-5, "forward");
        let mut df = vec![f32::NAN; p.filter_len()];
        filter_any(&p, &x, &dy, &mut df, &mut vec![f32::NAN; p.workspace_len()]);
        assert_close(&df, &im2col_filter(&p, &x, &dy), 1e-4, "filter grad");
    }

    #[test]
    fn inside_range() {
        // 28 wide, k 5, VALID: every window is inside.
        assert_eq!(inside(24, 1, 0, 5, 28), (0, 24));
        // SAME, pad 2: columns 2..26 are inside.
        assert_eq!(inside(28, 1, 2, 5, 28), (2, 26));
        // Filter wider than the input: none.
        let (lo, hi) = inside(3, 1, 2, 6, 3);
        assert_eq!(lo, hi);
        // Stride 2, pad 1, k 3, input 7 (out 4): o*2-1 >= 0 -> o >= 1; o*2-1+3 <= 7 -> o <= 2.
        assert_eq!(inside(4, 2, 1, 3, 7), (1, 3));
    }
}
