//! Direct convolution (no im2col) for few input channels: the forward pass
//! and the filter gradient. Layouts as the parent module (NHWC, HWIO).
//!
//! Why: with `c_in = 1` (the seed convnet's first layer, 28x28x1 -> 5x5x12)
//! the im2col matrix is `[rows, 25]` and the GEMM has `N = 12, K = 25`: the
//! copy dominates and the GEMM's panels are tiny (measured 15 GFLOP/s
//! forward, 13 GFLOP/s filter gradient at batch 256, one thread).
//!
//! Method: output channels are the vector lanes. The filter is packed once
//! per call into `[c_out blocks][K taps]` vectors of [`LANES`] floats
//! (zero-padded; on the stack, no allocation), `K = kh * kw * c_in` in
//! `(ky, kx, ci)` order, as the filter's own row order.
//! - forward: [`FWD_PIXELS`] output pixels of one row are register-blocked;
//!   per tap, one filter vector is loaded and each pixel adds
//!   `x[tap] * w[tap]` (a broadcast and a fused multiply-add) to its
//!   accumulator. Pixels whose window leaves the input (SAME padding) take a
//!   checked path that skips the padded taps, one pixel at a time: about 5x
//!   slower per pixel, so a SAME 5x5 layer on 28x28 (27% border pixels)
//!   takes 2.9 ms forward against 1.0 ms VALID (im2col: 8.6 ms).
//! - filter gradient: for one image at a time, a group of up to
//!   [`MAX_GROUP`] taps keeps one accumulator each in registers while every
//!   output pixel of the image adds `x[pixel, tap] * dy[pixel, :]`; the
//!   image's sums are then added to the running total. (The AVX-512 form
//!   specializes common small filters, all taps in one group, so that tap
//!   offsets are constants; see `direct_avx512.rs`.) Summing per image
//!   first keeps the f32 sums short (576 terms for a 24x24 output, not
//!   147456) and the order fixed: the result depends only on the inputs.
//!
//! Both sum each output over the taps in `(ky, kx, ci)` order with fused
//! multiply-adds: equal to the im2col path up to reassociation. Lanes past
//! `c_out` in a block compute garbage that is never stored.
//!
//! Two forms: the AVX-512 one in `direct_avx512.rs` (intrinsics; what the
//! measurements are of), used where [`available`], and this file's plain
//! Rust over `[f32; LANES]` arrays. `mul_add` and `_mm512_fmadd_ps` round
//! alike and both sum in the same order: the same bits (tested). The plain
//! body is slow (LLVM kept its accumulators in memory and, on the baseline
//! target, `mul_add` is a libm call: 24 ms for the seed's first layer, 4x
//! slower than im2col), so it is the reference, and on CPUs without AVX-512
//! the kernels take im2col instead ([`available`]).

use super::ConvGeom;

/// Output channels per vector (one AVX-512 register of f32).
pub(crate) const LANES: usize = 16;
/// The packed filter's capacity in vectors: `ceil(c_out / LANES) * K` must
/// fit (16 KiB of stack).
pub(crate) const MAX_PACKED: usize = 256;
/// Output pixels per register block in the forward pass.
pub(super) const FWD_PIXELS: usize = 8;
/// Most taps per register group in the filter gradient (one accumulator
/// each, plus the `dy` vector: 29 of the 32 AVX-512 registers).
pub(super) const MAX_GROUP: usize = 28;

/// Calls `$f::<G>($args)` for the run-time group size `$g` in `1..=MAX_GROUP`.
macro_rules! dispatch_group {
    ($g:expr, $f:ident $args:tt) => {
        dispatch_group!(@ $g, $f $args; 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27)
    };
    (@ $g:expr, $f:ident $args:tt; $($n:literal)*) => {
        match $g {
            $($n => $f::<$n> $args,)*
            _ => $f::<MAX_GROUP> $args,
        }
    };
}
pub(super) use dispatch_group;

pub(super) type V = [f32; LANES];

/// 64-byte aligned storage: packed vectors each within one cache line (an
/// unaligned vector load splits across two).
#[repr(align(64))]
pub(super) struct Aligned<T>(pub(super) T);

/// True when the direct kernels handle `p`: the packed filter fits.
pub(crate) fn fits(p: &ConvGeom) -> bool {
    p.c_out.div_ceil(LANES) * p.k() <= MAX_PACKED
}

/// True when the fast (AVX-512) form runs on this CPU. Without it the
/// convolution kernels take im2col for direct geometries too (their
/// workspace is im2col-sized either way): the portable body is slower than
/// im2col.
pub(crate) fn available() -> bool {
    // The selected path (`TOWERS_SIMD`), which is only ever AVX-512 where the
    // CPU has AVX-512F (and with it FMA).
    crate::simd::active() == crate::simd::SimdPath::Avx512
}

/// `y = conv(x, filter)` without workspace. Requires [`fits`]; fast only
/// where [`available`].
pub(crate) fn conv2d(p: &ConvGeom, x: &[f32], filter: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: `available` detected AVX-512F and FMA on this CPU.
        return unsafe { super::direct_avx512::conv2d(p, x, filter, y) };
    }
    forward(p, x, filter, y)
}

/// `y = act(conv(x, filter) + bias)` with the bias, and ReLU when `relu`,
/// applied to each output vector in registers before it is stored (other
/// activations: the caller runs them after, on the block). Requires
/// [`fits`] and [`available`]; `false` (nothing done) where not available.
pub(crate) fn conv2d_bias_relu(
    p: &ConvGeom,
    x: &[f32],
    filter: &[f32],
    bias: &[f32],
    relu: bool,
    y: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if available() {
        let epi = super::direct_avx512::Epilogue::new(bias, relu);
        // SAFETY: `available` detected AVX-512F and FMA on this CPU; the
        // bias has c_out channels (the kernel's contract).
        unsafe { super::direct_avx512::conv2d_then(p, x, filter, y, Some(&epi)) };
        return true;
    }
    let _ = (p, x, filter, bias, relu, y);
    false
}

/// `dfilter = x^T (windows) * dy` without workspace. Requires [`fits`];
/// fast only where [`available`].
pub(crate) fn conv2d_backprop_filter(p: &ConvGeom, x: &[f32], dy: &[f32], dfilter: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: `available` detected AVX-512F and FMA on this CPU.
        return unsafe { super::direct_avx512::conv2d_backprop_filter(p, x, dy, dfilter) };
    }
    filter_grad(p, x, dy, dfilter)
}

/// `acc[l] += a * w[l]`, fused.
#[inline(always)]
fn fma(acc: &mut V, a: f32, w: &V) {
    for l in 0..LANES {
        acc[l] = a.mul_add(w[l], acc[l]);
    }
}

/// The geometry in the form the loops use.
pub(super) struct Geo {
    pub(super) oh: usize,
    pub(super) ow: usize,
    pub(super) pt: usize,
    pub(super) pl: usize,
    pub(super) k: usize,
    pub(super) blocks: usize,
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
        Geo { oh, ow, pt, pl, k, blocks: p.c_out.div_ceil(LANES), off, ox_lo, ox_hi }
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

/// Packs `filter [K, c_out]` into `wp[block * K + t]`, zero-padding the last block.
#[inline(always)]
pub(super) fn pack(p: &ConvGeom, g: &Geo, filter: &[f32], wp: &mut [V; MAX_PACKED]) {
    let co = p.c_out;
    for blk in 0..g.blocks {
        let (c0, nb) = (blk * LANES, (co - blk * LANES).min(LANES));
        for t in 0..g.k {
            let w = &mut wp[blk * g.k + t];
            w[..nb].copy_from_slice(&filter[t * co + c0..t * co + c0 + nb]);
            w[nb..].fill(0.0);
        }
    }
}

#[inline(always)]
fn forward(p: &ConvGeom, x: &[f32], filter: &[f32], y: &mut [f32]) {
    debug_assert!(fits(p));
    let g = Geo::new(p);
    let co = p.c_out;
    if g.oh * g.ow == 0 || co == 0 {
        return;
    }
    let mut wp = [[0.0; LANES]; MAX_PACKED];
    pack(p, &g, filter, &mut wp);
    let img = p.h * p.w * p.c_in;
    for b in 0..p.n {
        let xb = &x[b * img..(b + 1) * img];
        for oy in 0..g.oh {
            let yr = &mut y[(b * g.oh + oy) * g.ow * co..(b * g.oh + oy + 1) * g.ow * co];
            let iy0 = g.iy0(p, oy);
            let row_inside = iy0 >= 0 && iy0 as usize + p.kh <= p.h;
            let (lo, hi) = if row_inside { (g.ox_lo, g.ox_hi) } else { (0, 0) };
            for ox in (0..lo).chain(hi..g.ow) {
                forward_clipped(p, &g, &wp, xb, iy0, ox, yr);
            }
            let mut ox = lo;
            while ox + FWD_PIXELS <= hi {
                forward_block::<FWD_PIXELS>(p, &g, &wp, xb, iy0 as usize, ox, yr);
                ox += FWD_PIXELS;
            }
            while ox < hi {
                forward_block::<1>(p, &g, &wp, xb, iy0 as usize, ox, yr);
                ox += 1;
            }
        }
    }
}

/// Output pixels `ox..ox+R` of one row, all windows inside the input.
#[inline(always)]
fn forward_block<const R: usize>(
    p: &ConvGeom,
    g: &Geo,
    wp: &[V; MAX_PACKED],
    xb: &[f32],
    iy0: usize,
    ox: usize,
    yr: &mut [f32],
) {
    let (ci, co, k) = (p.c_in, p.c_out, g.k);
    let step = p.stride_w * ci;
    let base = (iy0 * p.w + g.ix0(p, ox) as usize) * ci;
    // Every read lies in `xs`: the last pixel's last tap is its end.
    let xs = &xb[base..base + (R - 1) * step + g.off[k - 1] + 1];
    let off = &g.off[..k];
    for blk in 0..g.blocks {
        let w = &wp[blk * k..(blk + 1) * k];
        let mut acc = [[0.0f32; LANES]; R];
        for (wt, &o) in w.iter().zip(off) {
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: `r * step + o <= (R - 1) * step + off[k - 1] < xs.len()`
                // (tap offsets increase with t).
                let xv = unsafe { *xs.get_unchecked(r * step + o) };
                fma(a, xv, wt);
            }
        }
        let (c0, nb) = (blk * LANES, (co - blk * LANES).min(LANES));
        for (r, a) in acc.iter().enumerate() {
            let d = (ox + r) * co + c0;
            yr[d..d + nb].copy_from_slice(&a[..nb]);
        }
    }
}

/// One output pixel whose window may leave the input: padded taps are skipped.
#[inline(always)]
fn forward_clipped(p: &ConvGeom, g: &Geo, wp: &[V; MAX_PACKED], xb: &[f32], iy0: isize, ox: usize, yr: &mut [f32]) {
    let (ci, co, k) = (p.c_in, p.c_out, g.k);
    let ix0 = g.ix0(p, ox);
    let (ky_lo, ky_hi, kx_lo, kx_hi) = clip(p, iy0, ix0);
    for blk in 0..g.blocks {
        let mut acc = [0.0f32; LANES];
        for ky in ky_lo..ky_hi {
            let iy = (iy0 + ky as isize) as usize;
            for kx in kx_lo..kx_hi {
                let ix = (ix0 + kx as isize) as usize;
                let src = &xb[(iy * p.w + ix) * ci..][..ci];
                let t0 = blk * k + (ky * p.kw + kx) * ci;
                for (c, &xv) in src.iter().enumerate() {
                    fma(&mut acc, xv, &wp[t0 + c]);
                }
            }
        }
        let (c0, nb) = (blk * LANES, (co - blk * LANES).min(LANES));
        let d = ox * co + c0;
        yr[d..d + nb].copy_from_slice(&acc[..nb]);
    }
}

#[inline(always)]
fn filter_grad(p: &ConvGeom, x: &[f32], dy: &[f32], dfilter: &mut [f32]) {
    debug_assert!(fits(p));
    let g = Geo::new(p);
    let (co, k) = (p.c_out, g.k);
    // The running total over images, packed as the forward filter.
    let mut total = [[0.0f32; LANES]; MAX_PACKED];
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
                    dispatch_group!(group, filter_group(p, &g, xb, dyb, blk, t0, tot));
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
#[inline(always)]
fn filter_group<const G: usize>(
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
    let nb = (co - c0).min(LANES);
    let mut off = [0usize; G];
    off.copy_from_slice(&g.off[t0..t0 + G]);
    // Tap t0 + j as (ky, kx, c), for the clipped path.
    let mut tap = [(0usize, 0usize, 0usize); G];
    for (j, tp) in tap.iter_mut().enumerate() {
        let t = t0 + j;
        *tp = (t / (p.kw * ci), (t / ci) % p.kw, t % ci);
    }
    let mut acc = [[0.0f32; LANES]; G];
    for oy in 0..g.oh {
        let iy0 = g.iy0(p, oy);
        let row_inside = iy0 >= 0 && iy0 as usize + p.kh <= p.h;
        for ox in 0..g.ow {
            let d = (oy * g.ow + ox) * co + c0;
            // A full vector when it lies in `dyb` (lanes past `nb` are unused), else a padded copy.
            let mut dv = [0.0f32; LANES];
            match dyb.get(d..d + LANES) {
                Some(s) => dv.copy_from_slice(s),
                None => dv[..nb].copy_from_slice(&dyb[d..d + nb]),
            }
            let ix0 = g.ix0(p, ox);
            if row_inside && (g.ox_lo..g.ox_hi).contains(&ox) {
                let base = (iy0 as usize * p.w + ix0 as usize) * ci;
                let xs = &xb[base..base + off[G - 1] + 1];
                for (a, &o) in acc.iter_mut().zip(&off) {
                    // SAFETY: tap offsets increase with t, so `o <= off[G - 1] < xs.len()`.
                    let xv = unsafe { *xs.get_unchecked(o) };
                    fma(a, xv, &dv);
                }
            } else {
                for (a, &(ky, kx, c)) in acc.iter_mut().zip(&tap) {
                    let (iy, ix) = (iy0 + ky as isize, ix0 + kx as isize);
                    if iy >= 0 && ix >= 0 && (iy as usize) < p.h && (ix as usize) < p.w {
                        fma(a, xb[(iy as usize * p.w + ix as usize) * ci + c], &dv);
                    }
                }
            }
        }
    }
    for (t, a) in total.iter_mut().zip(&acc) {
        for l in 0..LANES {
            t[l] += a[l];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::{conv2d as conv2d_any, conv2d_backprop_filter as filter_any, Algorithm};
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
        for p in geometries(&mut r, 300) {
            let x = r.vec(p.x_len());
            let f = r.vec(p.filter_len());
            let dy = r.vec(p.y_len());
            let mut y = vec![f32::NAN; p.y_len()];
            conv2d(&p, &x, &f, &mut y);
            assert_close(&y, &im2col_forward(&p, &x, &f), 1e-5, &format!("forward {p:?}"));
            let mut df = vec![f32::NAN; p.filter_len()];
            conv2d_backprop_filter(&p, &x, &dy, &mut df);
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

    /// Every variant the dispatcher may pick gives the same bits, so a
    /// result does not depend on the CPU's features.
    #[test]
    fn variants_agree_bit_for_bit() {
        let mut r = Lcg::new(73);
        for p in geometries(&mut r, 60) {
            let x = r.vec(p.x_len());
            let f = r.vec(p.filter_len());
            let dy = r.vec(p.y_len());
            let (mut y0, mut d0) = (vec![f32::NAN; p.y_len()], vec![f32::NAN; p.filter_len()]);
            forward(&p, &x, &f, &mut y0);
            filter_grad(&p, &x, &dy, &mut d0);
            let (mut y1, mut d1) = (y0.clone(), d0.clone());
            conv2d(&p, &x, &f, &mut y1);
            conv2d_backprop_filter(&p, &x, &dy, &mut d1);
            let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y0), bits(&y1), "forward {p:?}");
            assert_eq!(bits(&d0), bits(&d1), "filter grad {p:?}");
        }
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
