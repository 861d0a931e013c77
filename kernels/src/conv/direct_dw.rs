//! The direct filter gradient ([`super::direct`]), generic over the vector
//! width. Each filter-gradient entry sums, per image, its pixels in row
//! order with fused multiply-adds (padded taps skipped), then adds the
//! image's sum to the running total, images in order: the tap grouping
//! chosen per path decides only which entries share the registers, so
//! every path gives the same bits.
//!
//! Register groups per path: up to `28` taps (one accumulator each, plus the
//! `dy` vector and a broadcast) on the 32-register paths, `14` on AVX2.
//! Filters whose rows are 2, 3, 5, 6 or 9 taps long (`kw * c_in`) run whole
//! filter rows per group, so that the interior taps' offsets are constants
//! (1.9x faster at 5x5x1 than offsets in registers, measured on AVX-512).

use pulp::{Simd, WithSimd};

use super::direct::Geo;
use super::vec::{self, Packed};
use super::ConvGeom;

/// Most taps per register group on the 32-register paths.
const MAX_GROUP: usize = 28;

/// `dfilter = x^T (windows) * dy`, as a [`WithSimd`] op.
pub(super) struct FilterGrad<'a> {
    pub(super) p: &'a ConvGeom,
    pub(super) x: &'a [f32],
    pub(super) dy: &'a [f32],
    pub(super) dfilter: &'a mut [f32],
}

impl WithSimd for FilterGrad<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        filter_grad(simd, self.p, self.x, self.dy, self.dfilter)
    }
}

/// Calls `$f::<S, G>($args)` for the run-time group size `$g` in `1..=MAX_GROUP`.
macro_rules! dispatch_group {
    ($g:expr, $f:ident $args:tt) => {
        dispatch_group!(@ $g, $f $args; 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27)
    };
    (@ $g:expr, $f:ident $args:tt; $($n:literal)*) => {
        match $g {
            $($n => $f::<S, $n> $args,)*
            _ => $f::<S, MAX_GROUP> $args,
        }
    };
}

/// Calls `filter_rows::<S, KY, J>($args)` for run-time `(ky, j)`, `j` in
/// [`ROW_TAPS`], `ky` in `1..=5`.
macro_rules! dispatch_rows {
    ($ky:expr, $j:expr, $args:tt) => {
        dispatch_rows!(@ $ky, $j, $args; (1 2) (2 2) (3 2) (4 2) (5 2) (1 3) (2 3) (3 3) (4 3) (5 3)
            (1 5) (2 5) (3 5) (4 5) (5 5) (1 6) (2 6) (3 6) (4 6) (1 9) (2 9) (3 9))
    };
    (@ $ky:expr, $j:expr, $args:tt; $(($a:literal $b:literal))*) => {
        match ($ky, $j) {
            $(($a, $b) => filter_rows::<S, $a, $b> $args,)*
            _ => unreachable!("dispatch_rows: rows_per_group keeps (ky, j) in the table"),
        }
    };
}

/// Filter-row lengths (`kw * c_in`) with a whole-row form.
const ROW_TAPS: [usize; 5] = [2, 3, 5, 6, 9];

/// Filter rows per register group of the whole-row form on a path with
/// `gmax` taps per group, or `None` when `p` has no whole-row form. Keeps
/// `(rows, j)` within [`dispatch_rows`]'s table.
fn rows_per_group(p: &ConvGeom, gmax: usize) -> Option<usize> {
    let j = p.kw * p.c_in;
    if !ROW_TAPS.contains(&j) {
        return None;
    }
    let max_rows = match j {
        2..=5 => 5,
        6 => 4,
        _ => 3,
    };
    Some((gmax / j).clamp(1, max_rows).min(p.kh))
}

#[inline(always)]
fn filter_grad<S: Simd>(simd: S, p: &ConvGeom, x: &[f32], dy: &[f32], dfilter: &mut [f32]) {
    let l = S::F32_LANES;
    let g = Geo::new(p);
    let (co, k) = (p.c_out, g.k);
    let blocks = co.div_ceil(l);
    // The running total over images, packed as the forward filter.
    let mut total = Packed::zeroed();
    let total = &mut total.0;
    if g.oh * g.ow > 0 && co > 0 {
        let gmax = if vec::wide::<S>() { MAX_GROUP } else { 14 };
        let rows = rows_per_group(p, gmax);
        let group = (1..=gmax.min(k)).rev().find(|d| k % d == 0).unwrap_or(1);
        let img = p.h * p.w * p.c_in;
        let pix = g.oh * g.ow;
        for b in 0..p.n {
            let xb = &x[b * img..(b + 1) * img];
            let dyb = &dy[b * pix * co..(b + 1) * pix * co];
            for blk in 0..blocks {
                match rows {
                    Some(kyg) => {
                        let j = p.kw * p.c_in;
                        let mut ky0 = 0;
                        while ky0 < p.kh {
                            let n = kyg.min(p.kh - ky0);
                            let t0 = blk * k + ky0 * j;
                            let tot = &mut total[t0 * l..(t0 + n * j) * l];
                            dispatch_rows!(n, j, (simd, p, &g, xb, dyb, blk, ky0, tot));
                            ky0 += n;
                        }
                    }
                    None => {
                        let mut t0 = 0;
                        while t0 < k {
                            let t = blk * k + t0;
                            let tot = &mut total[t * l..(t + group) * l];
                            dispatch_group!(group, filter_group(simd, p, &g, xb, dyb, blk, t0, tot));
                            t0 += group;
                        }
                    }
                }
            }
        }
    }
    for blk in 0..blocks {
        let (c0, nb) = (blk * l, (co - blk * l).min(l));
        for t in 0..k {
            let s = (blk * k + t) * l;
            dfilter[t * co + c0..t * co + c0 + nb].copy_from_slice(&total[s..s + nb]);
        }
    }
}

/// `dy[d..]`'s vector: a full load where it lies in `dyb` (lanes past the
/// block's channels read the next pixel's: garbage that is never stored),
/// else the `dyb.len() - d` floats left, zero-padded.
#[inline(always)]
fn dvec<S: Simd>(simd: S, dyb: &[f32], d: usize) -> S::f32s {
    debug_assert!(d < dyb.len());
    if d + S::F32_LANES <= dyb.len() {
        // SAFETY: `d..d + L` lies in `dyb`.
        unsafe { vec::load::<S>(dyb.as_ptr().add(d)) }
    } else {
        // SAFETY: `d..dyb.len()` lies in `dyb`.
        unsafe { vec::load_first(simd, dyb.as_ptr().add(d), dyb.len() - d) }
    }
}

/// `total[i] += acc[i]`, vector `i` of `total` at floats `i * L..`.
#[inline(always)]
fn add_into<S: Simd>(simd: S, total: &mut [f32], acc: &[S::f32s]) {
    let l = S::F32_LANES;
    debug_assert!(total.len() >= acc.len() * l);
    for (i, a) in acc.iter().enumerate() {
        // SAFETY: vector i lies in `total` (asserted above).
        unsafe {
            let t = total.as_mut_ptr().add(i * l);
            vec::store::<S>(t, simd.add_f32s(vec::load::<S>(t), *a));
        }
    }
}

/// Adds one image's `sum_pixels x[pixel, t] * dy[pixel, block]` for taps
/// `t0..t0+G` to `total` (`G` vectors).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn filter_group<S: Simd, const G: usize>(
    simd: S,
    p: &ConvGeom,
    g: &Geo,
    xb: &[f32],
    dyb: &[f32],
    blk: usize,
    t0: usize,
    total: &mut [f32],
) {
    let (ci, co) = (p.c_in, p.c_out);
    let c0 = blk * S::F32_LANES;
    let mut off = [0usize; G];
    off.copy_from_slice(&g.off[t0..t0 + G]);
    // Tap t0 + j as (ky, kx, c), for the clipped path.
    let mut tap = [(0usize, 0usize, 0usize); G];
    for (j, tp) in tap.iter_mut().enumerate() {
        let t = t0 + j;
        *tp = (t / (p.kw * ci), (t / ci) % p.kw, t % ci);
    }
    let mut acc = [simd.splat_f32s(0.0); G];
    let clipped = |acc: &mut [S::f32s; G], iy0: isize, ix0: isize, dv: S::f32s| {
        for (a, &(ky, kx, c)) in acc.iter_mut().zip(&tap) {
            let (iy, ix) = (iy0 + ky as isize, ix0 + kx as isize);
            if iy >= 0 && ix >= 0 && (iy as usize) < p.h && (ix as usize) < p.w {
                let xv = xb[(iy as usize * p.w + ix as usize) * ci + c];
                *a = simd.mul_add_f32s(simd.splat_f32s(xv), dv, *a);
            }
        }
    };
    for oy in 0..g.oh {
        let iy0 = g.iy0(p, oy);
        let row_inside = iy0 >= 0 && iy0 as usize + p.kh <= p.h;
        let d0 = oy * g.ow * co + c0;
        let (lo, hi) = if row_inside { (g.ox_lo, g.ox_hi) } else { (g.ow, g.ow) };
        // Pixels in row order; the interior run keeps a local copy of the
        // accumulators whose address never escapes, so they stay in registers.
        for ox in 0..lo {
            clipped(&mut acc, iy0, g.ix0(p, ox), dvec(simd, dyb, d0 + ox * co));
        }
        if lo < hi {
            let base = (iy0 as usize * p.w + g.ix0(p, lo) as usize) * ci;
            let step = p.stride_w * ci;
            let xs = &xb[base..base + (hi - 1 - lo) * step + off[G - 1] + 1];
            let mut regs = acc;
            for ox in lo..hi {
                let dv = dvec(simd, dyb, d0 + ox * co);
                let px = (ox - lo) * step;
                for (a, &o) in regs.iter_mut().zip(&off) {
                    // SAFETY: tap offsets increase with t, so
                    // `px + o <= (hi-1-lo) * step + off[G - 1] < xs.len()`.
                    let xv = unsafe { *xs.get_unchecked(px + o) };
                    *a = simd.mul_add_f32s(simd.splat_f32s(xv), dv, *a);
                }
            }
            acc = regs;
        }
        for ox in hi.max(lo)..g.ow {
            clipped(&mut acc, iy0, g.ix0(p, ox), dvec(simd, dyb, d0 + ox * co));
        }
    }
    add_into(simd, total, &acc);
}

/// [`filter_group`] for the `KY * J` taps of filter rows `ky0..ky0+KY`
/// (`J = kw * c_in` taps each): the same sums in the same order (the same
/// bits), with the interior taps addressed as `ky * row + j` for constant
/// `ky, j`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn filter_rows<S: Simd, const KY: usize, const J: usize>(
    simd: S,
    p: &ConvGeom,
    g: &Geo,
    xb: &[f32],
    dyb: &[f32],
    blk: usize,
    ky0: usize,
    total: &mut [f32],
) {
    let (ci, co) = (p.c_in, p.c_out);
    let row = p.w * ci;
    let c0 = blk * S::F32_LANES;
    let mut acc = [[simd.splat_f32s(0.0); J]; KY];
    for oy in 0..g.oh {
        let iy0 = g.iy0(p, oy);
        let row_inside = iy0 >= 0 && iy0 as usize + p.kh <= p.h;
        let d0 = oy * g.ow * co + c0;
        let (lo, hi) = if row_inside { (g.ox_lo, g.ox_hi) } else { (g.ow, g.ow) };
        let iyg = iy0 + ky0 as isize;
        // Pixels in row order; the interior run is a loop of its own so the
        // accumulators stay in registers through it.
        for ox in 0..lo {
            filter_clipped(simd, p, &mut acc, xb, iyg, g.ix0(p, ox), dvec(simd, dyb, d0 + ox * co));
        }
        if lo < hi {
            let base = (iyg as usize * p.w + g.ix0(p, lo) as usize) * ci;
            let step = p.stride_w * ci;
            let xs = &xb[base..base + (hi - 1 - lo) * step + (KY - 1) * row + J];
            // A local copy whose address never escapes: it lives in registers.
            let mut regs = acc;
            for ox in lo..hi {
                let dv = dvec(simd, dyb, d0 + ox * co);
                let px = (ox - lo) * step;
                for (ky, ar) in regs.iter_mut().enumerate() {
                    for (j, a) in ar.iter_mut().enumerate() {
                        // SAFETY: `px + ky * row + j <= (hi-1-lo) * step + (KY-1) * row + J-1 < xs.len()`.
                        let xv = unsafe { *xs.get_unchecked(px + ky * row + j) };
                        *a = simd.mul_add_f32s(simd.splat_f32s(xv), dv, *a);
                    }
                }
            }
            acc = regs;
        }
        for ox in hi.max(lo)..g.ow {
            filter_clipped(simd, p, &mut acc, xb, iyg, g.ix0(p, ox), dvec(simd, dyb, d0 + ox * co));
        }
    }
    add_into(simd, total, acc.as_flattened());
}

/// One output pixel of [`filter_rows`] whose window may leave the input
/// (`iy0`: the input row of the group's first filter row).
#[inline(always)]
fn filter_clipped<S: Simd, const KY: usize, const J: usize>(
    simd: S,
    p: &ConvGeom,
    acc: &mut [[S::f32s; J]; KY],
    xb: &[f32],
    iy0: isize,
    ix0: isize,
    dv: S::f32s,
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
                *a = simd.mul_add_f32s(simd.splat_f32s(xv), dv, *a);
            }
        }
    }
}
