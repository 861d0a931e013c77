//! The bias kernels' bodies, written once over [`pulp::Simd`] and run
//! through [`crate::simd::dispatch`] (see `bias.rs` for which kernels use
//! them and why).
//!
//! Lanes are independent elements (the add) or independent columns of a
//! tile of partial sums (the gradient): every path computes each float with
//! the same operations in the same order, so the bits are the same on every
//! path and equal to the plain loops they replaced.

use pulp::{Simd, WithSimd};

use crate::lanes::{load, store};

/// `y[i] = x[i] + pat[i % pat.len()]`, or in place (`x: None`,
/// `y[i] += ...`); `pat` holds whole rows of the bias.
pub(super) struct AddPattern<'a> {
    pub x: Option<&'a [f32]>,
    pub pat: &'a [f32],
    pub y: &'a mut [f32],
}

impl WithSimd for AddPattern<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, s: S) {
        let AddPattern { x, pat, y } = self;
        let n = x.map_or(y.len(), |x| x.len().min(y.len()));
        let mut r = 0;
        while r < n {
            let re = (r + pat.len()).min(n);
            let yc = &mut y[r..re];
            let pc = &pat[..re - r];
            let (ph, pt) = S::as_simd_f32s(pc);
            match x {
                Some(x) => {
                    let (xh, xt) = S::as_simd_f32s(&x[r..re]);
                    let (yh, yt) = S::as_mut_simd_f32s(yc);
                    for ((o, v), b) in yh.iter_mut().zip(xh).zip(ph) {
                        *o = s.add_f32s(*v, *b);
                    }
                    if !yt.is_empty() {
                        let v = s.add_f32s(s.partial_load_f32s(xt), s.partial_load_f32s(pt));
                        s.partial_store_f32s(yt, v);
                    }
                }
                None => {
                    let (yh, yt) = S::as_mut_simd_f32s(yc);
                    for (o, b) in yh.iter_mut().zip(ph) {
                        *o = s.add_f32s(*o, *b);
                    }
                    if !yt.is_empty() {
                        let v = s.add_f32s(s.partial_load_f32s(yt), s.partial_load_f32s(pt));
                        s.partial_store_f32s(yt, v);
                    }
                }
            }
            r = re;
        }
    }
}

/// `acc[j] += t[j]` for every whole tile `t` of `acc.len()` floats of
/// `dy`, in order, then `acc[j] += rest[j]` for the shorter last one: the
/// tiled column sums of `bias_add_grad`, tile by tile as the plain loop.
/// With `relu_y`, each `dy` is first masked to `relu_y > 0 ? dy : +0.0`
/// (`relu_y` as long as `dy`): the ReLU-masked sums of the fused pool
/// gradient (`pool/fused.rs`).
pub(crate) struct TileSums<'a> {
    pub dy: &'a [f32],
    pub relu_y: Option<&'a [f32]>,
    pub acc: &'a mut [f32],
}

impl WithSimd for TileSums<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, s: S) {
        let TileSums { dy, relu_y, acc } = self;
        let w = acc.len();
        if w == 0 {
            return;
        }
        if let Some(y) = relu_y {
            return match w.div_ceil(S::F32_LANES) {
                1..=4 => tile_sums::<S, 4, true>(s, dy, y, acc),
                5..=8 => tile_sums::<S, 8, true>(s, dy, y, acc),
                9..=12 => tile_sums::<S, 12, true>(s, dy, y, acc),
                _ => tile_sums_in_memory::<S, true>(s, dy, y, acc),
            };
        }
        // The tile's accumulators in registers, up to 12 vectors (a 96-float
        // tile on AVX2 and wider); narrower vectors work through memory.
        match w.div_ceil(S::F32_LANES) {
            1..=4 => tile_sums::<S, 4, false>(s, dy, dy, acc),
            5..=8 => tile_sums::<S, 8, false>(s, dy, dy, acc),
            9..=12 => tile_sums::<S, 12, false>(s, dy, dy, acc),
            _ => tile_sums_in_memory::<S, false>(s, dy, dy, acc),
        }
    }
}

/// `dy[range]`, masked to `y > 0 ? dy : +0.0` when `RELU`.
#[inline(always)]
fn term<S: Simd, const RELU: bool>(s: S, dy: &[f32], y: &[f32], lo: usize, hi: usize) -> S::f32s {
    let g = load(s, &dy[lo..hi]);
    if RELU {
        let zero = s.splat_f32s(0.0);
        s.select_f32s(s.greater_than_f32s(load(s, &y[lo..hi]), zero), g, zero)
    } else {
        g
    }
}

/// [`TileSums`] with the tile held in at most `NV` vectors (`acc.len()`
/// floats, the last vector possibly partial; the vectors past the tile stay
/// unused). A short last tile adds `+0.0` in the lanes past its end; that
/// never changes a column's final sum (its fold into `db` starts from
/// `+0.0`, so a `-0.0` partial and a `+0.0` one give the same result).
#[inline(always)]
fn tile_sums<S: Simd, const NV: usize, const RELU: bool>(s: S, dy: &[f32], y: &[f32], acc: &mut [f32]) {
    let (w, l) = (acc.len(), S::F32_LANES);
    let nv = w.div_ceil(l);
    let mut v = [s.splat_f32s(0.0); NV];
    for (k, a) in v.iter_mut().enumerate().take(nv) {
        *a = load(s, &acc[k * l..((k + 1) * l).min(w)]);
    }
    let full = dy.len() / w * w;
    let mut t = 0;
    while t < full {
        for (k, a) in v.iter_mut().enumerate().take(nv) {
            *a = s.add_f32s(*a, term::<S, RELU>(s, dy, y, t + k * l, t + ((k + 1) * l).min(w)));
        }
        t += w;
    }
    for (k, a) in v.iter_mut().enumerate().take(nv) {
        let (lo, hi) = (full + (k * l).min(dy.len() - full), full + ((k + 1) * l).min(dy.len() - full));
        if lo < hi {
            *a = s.add_f32s(*a, term::<S, RELU>(s, dy, y, lo, hi));
        }
        store(s, &mut acc[k * l..((k + 1) * l).min(w)], *a);
    }
}

/// [`tile_sums`] with the accumulators in `acc` itself (tiles too wide for
/// the registers): the same sums in the same order.
#[inline(always)]
fn tile_sums_in_memory<S: Simd, const RELU: bool>(s: S, dy: &[f32], y: &[f32], acc: &mut [f32]) {
    let w = acc.len();
    let zero = s.splat_f32s(0.0);
    let mut t = 0;
    while t < dy.len() {
        let n = w.min(dy.len() - t);
        let (ah, at) = S::as_mut_simd_f32s(&mut acc[..n]);
        let (gh, gt) = S::as_simd_f32s(&dy[t..t + n]);
        if RELU {
            let (yh, _) = S::as_simd_f32s(&y[t..t + n]);
            for ((a, g), v) in ah.iter_mut().zip(gh).zip(yh) {
                *a = s.add_f32s(*a, s.select_f32s(s.greater_than_f32s(*v, zero), *g, zero));
            }
        } else {
            for (a, g) in ah.iter_mut().zip(gh) {
                *a = s.add_f32s(*a, *g);
            }
        }
        if !at.is_empty() {
            let lo = t + n - gt.len();
            let sum = s.add_f32s(s.partial_load_f32s(at), term::<S, RELU>(s, dy, y, lo, t + n));
            s.partial_store_f32s(at, sum);
        }
        t += n;
    }
}
