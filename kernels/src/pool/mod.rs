//! 2-D max and average pooling, NHWC, with TF's SAME/VALID rules
//! ([`crate::window`]).
//!
//! Layouts: `x`/`dx`: `[n, h, w, c]`; `y`/`dy`: `[n, out_h, out_w, c]`.
//! Invariants kept from TF:
//! - max pooling ignores padding (padded cells are never candidates);
//! - average pooling divides by the number of *non-padded* cells in the
//!   window (TF's `avg_pool` with SAME padding), and its gradient spreads
//!   `dy / count` evenly over those same cells;
//! - the max-pool gradient routes each `dy` to the *first* maximal input of
//!   its window in row-major window order (ties: first), as TF's CPU kernel.
//!
//! Every output window holds at least one input cell for valid geometry
//! (SAME windows start inside the input; VALID windows are fully inside).

#[cfg(target_arch = "x86_64")]
mod avx512;
mod fused;

pub use fused::max_pool_grad_act_bias_grad;

use serde::{Deserialize, Serialize};

use crate::window::{out_and_pad, window, Padding};

/// The geometry of one pooling op: the kernel's whole parameter block
/// (`Kernel::MaxPool { geom }`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolGeom {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride_h: usize,
    pub stride_w: usize,
    pub padding: Padding,
}

impl PoolGeom {
    /// `(out_h, pad_top)`.
    pub fn out_h(&self) -> (usize, usize) {
        out_and_pad(self.h, self.kh, self.stride_h, self.padding)
    }
    /// `(out_w, pad_left)`.
    pub fn out_w(&self) -> (usize, usize) {
        out_and_pad(self.w, self.kw, self.stride_w, self.padding)
    }
    /// `n * h * w * c`.
    pub fn x_len(&self) -> usize {
        self.n * self.h * self.w * self.c
    }
    /// `n * out_h * out_w * c`.
    pub fn y_len(&self) -> usize {
        self.n * self.out_h().0 * self.out_w().0 * self.c
    }

    /// Calls `f(b, oy, ox, (y_lo, y_hi), (x_lo, x_hi))` for every output pixel.
    fn for_each_window(&self, mut f: impl FnMut(usize, usize, usize, (usize, usize), (usize, usize))) {
        let (oh, pt) = self.out_h();
        let (ow, pl) = self.out_w();
        for b in 0..self.n {
            for oy in 0..oh {
                let (ylo, yhi, _) = window(oy, self.stride_h, pt, self.kh, self.h);
                for ox in 0..ow {
                    let (xlo, xhi, _) = window(ox, self.stride_w, pl, self.kw, self.w);
                    f(b, oy, ox, (ylo, yhi), (xlo, xhi));
                }
            }
        }
    }
}

/// `y = max_pool(x)`; `x: [n,h,w,c]`, `y: [n,out_h,out_w,c]`. AVX-512 form
/// where the CPU has it: 764 -> ~500 us on a [256, 24, 24, 12] input.
pub fn max_pool(p: &PoolGeom, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), p.x_len());
    debug_assert_eq!(y.len(), p.y_len());
    #[cfg(target_arch = "x86_64")]
    if crate::simd::active() == crate::simd::SimdPath::Avx512 {
        // SAFETY: the AVX-512 path is selected only where the CPU has it.
        return unsafe { avx512::max_pool(p, x, y) };
    }
    max_pool_portable(p, x, y)
}

/// [`max_pool`] without SIMD intrinsics (the same bits).
fn max_pool_portable(p: &PoolGeom, x: &[f32], y: &mut [f32]) {
    let (oh, ow, c) = (p.out_h().0, p.out_w().0, p.c);
    p.for_each_window(|b, oy, ox, (ylo, yhi), (xlo, xhi)| {
        let out = &mut y[((b * oh + oy) * ow + ox) * c..][..c];
        out.fill(f32::NEG_INFINITY);
        for iy in ylo..yhi {
            for ix in xlo..xhi {
                let src = &x[((b * p.h + iy) * p.w + ix) * c..][..c];
                for (o, v) in out.iter_mut().zip(src) {
                    *o = if *v > *o { *v } else { *o };
                }
            }
        }
    });
}

/// `y = avg_pool(x)`, dividing by the count of non-padded cells.
pub fn avg_pool(p: &PoolGeom, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), p.x_len());
    debug_assert_eq!(y.len(), p.y_len());
    let (oh, ow, c) = (p.out_h().0, p.out_w().0, p.c);
    p.for_each_window(|b, oy, ox, (ylo, yhi), (xlo, xhi)| {
        let out = &mut y[((b * oh + oy) * ow + ox) * c..][..c];
        out.fill(0.0);
        for iy in ylo..yhi {
            for ix in xlo..xhi {
                let src = &x[((b * p.h + iy) * p.w + ix) * c..][..c];
                for (o, v) in out.iter_mut().zip(src) {
                    *o += *v;
                }
            }
        }
        let inv = 1.0 / ((yhi - ylo) * (xhi - xlo)).max(1) as f32;
        out.iter_mut().for_each(|o| *o *= inv);
    });
}

/// `dx = max_pool_grad(x, y, dy)`: each `dy` goes to the first cell of its
/// window (in row-major window order) whose `x` equals the window's maximum
/// `y`, as TF's `MaxPoolGrad` does on ties. `y` must be the forward output of
/// this `x` (the plan guarantees it). `dx` is overwritten.
///
/// Branchless over channels: a window's cells are NHWC rows of `c`
/// contiguous channels, so each cell is one masked, vectorizable pass over a
/// block of channels (a per-channel argmax with branches mispredicted on
/// random data and ran 5x slower).
pub fn max_pool_grad(p: &PoolGeom, x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32]) {
    debug_assert_eq!(x.len(), p.x_len());
    debug_assert_eq!(y.len(), p.y_len());
    debug_assert_eq!(dy.len(), p.y_len());
    debug_assert_eq!(dx.len(), p.x_len());
    // Windows that never overlap (stride >= window, as the usual 2x2 stride
    // 2 pool) own their cells: each cell is written once, never read back
    // and added to. When they also cover the input exactly, no cell is left
    // for a zero fill either. With the AVX-512 form (`avx512.rs`): 1722 ->
    // ~740 us on a [256, 24, 24, 12] input, 2x2 stride 2 (portable: ~1300).
    if max_pool_grad_fast(p, x, y, dy, dx, false) {
        return;
    }
    let disjoint = p.stride_h >= p.kh && p.stride_w >= p.kw;
    if !tiles(p) {
        dx.fill(0.0);
    }
    max_pool_grad_portable(p, x, y, dy, dx, disjoint)
}

/// Whether the windows cover the input exactly, each cell in one window.
fn tiles(p: &PoolGeom) -> bool {
    p.stride_h == p.kh
        && p.stride_w == p.kw
        && p.out_h() == (p.h / p.kh, 0)
        && p.out_w() == (p.w / p.kw, 0)
        && p.h.is_multiple_of(p.kh)
        && p.w.is_multiple_of(p.kw)
}

/// [`max_pool_grad`] by the AVX-512 form for disjoint windows, routing
/// `y > 0 ? dy : 0` when `relu` (see `avx512.rs`); false (nothing done)
/// where that form does not apply.
pub(crate) fn max_pool_grad_fast(p: &PoolGeom, x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32], relu: bool) -> bool {
    let disjoint = p.stride_h >= p.kh && p.stride_w >= p.kw;
    #[cfg(target_arch = "x86_64")]
    if disjoint && crate::simd::active() == crate::simd::SimdPath::Avx512 {
        if !tiles(p) {
            dx.fill(0.0);
        }
        // SAFETY: AVX-512 is selected only where the CPU has it; windows are disjoint and `dx` is
        // zero wherever they do not reach.
        unsafe { avx512::max_pool_grad_disjoint(p, x, y, dy, dx, relu) };
        return true;
    }
    let _ = (p, x, y, dy, dx, relu, disjoint);
    false
}

/// [`max_pool_grad`] after its zero fill, without SIMD intrinsics (the same bits).
fn max_pool_grad_portable(p: &PoolGeom, x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32], disjoint: bool) {
    const BLOCK: usize = 16;
    let (oh, ow, c) = (p.out_h().0, p.out_w().0, p.c);
    p.for_each_window(|b, oy, ox, (ylo, yhi), (xlo, xhi)| {
        let o = ((b * oh + oy) * ow + ox) * c;
        let (ym, g) = (&y[o..o + c], &dy[o..o + c]);
        let mut c0 = 0;
        while c0 < c {
            let n = (c - c0).min(BLOCK);
            let (ym, g) = (&ym[c0..c0 + n], &g[c0..c0 + n]);
            // All bits set while the channel's gradient is not routed yet.
            let mut open = [u32::MAX; BLOCK];
            let open = &mut open[..n];
            for iy in ylo..yhi {
                for ix in xlo..xhi {
                    let i = ((b * p.h + iy) * p.w + ix) * c + c0;
                    let (xr, dr) = (&x[i..i + n], &mut dx[i..i + n]);
                    if disjoint {
                        for ((((d, xv), m), gv), op) in dr.iter_mut().zip(xr).zip(ym).zip(g).zip(open.iter_mut()) {
                            let hit = u32::from(*xv == *m).wrapping_neg() & *op;
                            *d = f32::from_bits(gv.to_bits() & hit);
                            *op &= !hit;
                        }
                    } else {
                        for ((((d, xv), m), gv), op) in dr.iter_mut().zip(xr).zip(ym).zip(g).zip(open.iter_mut()) {
                            let hit = u32::from(*xv == *m).wrapping_neg() & *op;
                            *d += f32::from_bits(gv.to_bits() & hit);
                            *op &= !hit;
                        }
                    }
                }
            }
            c0 += n;
        }
    });
}

/// `dx = avg_pool_grad(dy)`: each `dy` is spread as `dy / count` over the
/// non-padded cells of its window. `dx` is overwritten.
pub fn avg_pool_grad(p: &PoolGeom, dy: &[f32], dx: &mut [f32]) {
    debug_assert_eq!(dy.len(), p.y_len());
    debug_assert_eq!(dx.len(), p.x_len());
    dx.fill(0.0);
    let (oh, ow, c) = (p.out_h().0, p.out_w().0, p.c);
    p.for_each_window(|b, oy, ox, (ylo, yhi), (xlo, xhi)| {
        let g = &dy[((b * oh + oy) * ow + ox) * c..][..c];
        let inv = 1.0 / ((yhi - ylo) * (xhi - xlo)).max(1) as f32;
        for iy in ylo..yhi {
            for ix in xlo..xhi {
                let d = &mut dx[((b * p.h + iy) * p.w + ix) * c..][..c];
                for (o, v) in d.iter_mut().zip(g) {
                    *o += *v * inv;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_close, numeric_grad, Lcg};

    /// Reference from the definition with explicit padded coordinates.
    fn naive(p: &PoolGeom, x: &[f32], max: bool) -> Vec<f32> {
        let (oh, pt) = p.out_h();
        let (ow, pl) = p.out_w();
        let mut y = Vec::new();
        for b in 0..p.n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for ch in 0..p.c {
                        let (mut m, mut s, mut cnt) = (f32::NEG_INFINITY, 0.0f64, 0);
                        for ky in 0..p.kh {
                            for kx in 0..p.kw {
                                let iy = (oy * p.stride_h + ky) as isize - pt as isize;
                                let ix = (ox * p.stride_w + kx) as isize - pl as isize;
                                if iy < 0 || ix < 0 || iy >= p.h as isize || ix >= p.w as isize {
                                    continue;
                                }
                                let v = x[((b * p.h + iy as usize) * p.w + ix as usize) * p.c + ch];
                                m = m.max(v);
                                s += v as f64;
                                cnt += 1;
                            }
                        }
                        y.push(if max { m } else { (s / cnt as f64) as f32 });
                    }
                }
            }
        }
        y
    }

    fn cases() -> Vec<PoolGeom> {
        let mut v = Vec::new();
        for padding in [Padding::Same, Padding::Valid] {
            for &(n, h, w, c, kh, kw, sh, sw) in &[
                (2, 6, 6, 3, 2, 2, 2, 2),
                (1, 7, 5, 2, 3, 3, 2, 2),
                (2, 5, 7, 1, 3, 2, 1, 1),
                (1, 9, 9, 2, 3, 3, 3, 2),
            ] {
                v.push(PoolGeom { n, h, w, c, kh, kw, stride_h: sh, stride_w: sw, padding });
            }
        }
        v
    }

    #[test]
    fn forward_matches_reference() {
        let mut r = Lcg::new(21);
        for p in cases() {
            let x = r.vec(p.x_len());
            let mut y = vec![f32::NAN; p.y_len()];
            max_pool(&p, &x, &mut y);
            assert_close(&y, &naive(&p, &x, true), 0.0, "max");
            avg_pool(&p, &x, &mut y);
            assert_close(&y, &naive(&p, &x, false), 1e-6, "avg");
        }
    }

    /// With `L = sum(pool(x) * g)`, `dL/dx` is the pool gradient with `dy = g`.
    /// Random inputs have distinct values, so max pooling is differentiable
    /// there and finite differences (step smaller than the value gaps) agree.
    #[test]
    fn grads_match_finite_differences() {
        let mut r = Lcg::new(22);
        for p in cases() {
            let x = r.vec(p.x_len());
            let g = r.vec(p.y_len());
            for max in [true, false] {
                let loss = |x: &[f32]| -> f64 {
                    let mut y = vec![0.0; p.y_len()];
                    if max {
                        max_pool(&p, x, &mut y)
                    } else {
                        avg_pool(&p, x, &mut y)
                    }
                    y.iter().zip(&g).map(|(a, b)| *a as f64 * *b as f64).sum()
                };
                let mut y = vec![0.0; p.y_len()];
                max_pool(&p, &x, &mut y);
                let mut dx = vec![f32::NAN; p.x_len()];
                if max {
                    max_pool_grad(&p, &x, &y, &g, &mut dx)
                } else {
                    avg_pool_grad(&p, &g, &mut dx)
                }
                assert_close(&dx, &numeric_grad(&x, 1e-4, loss), 2e-3, if max { "max grad" } else { "avg grad" });
            }
        }
    }

    /// The disjoint-window paths (tiling, and stride > window leaving cells
    /// uncovered) against the general rule on the same data: the routed
    /// gradient is the same, and uncovered cells are zero.
    #[test]
    fn max_grad_disjoint_windows() {
        let mut r = Lcg::new(23);
        for &(h, w, k, s, padding) in &[
            (6, 8, 2, 2, Padding::Valid),
            (7, 9, 2, 2, Padding::Valid),
            (7, 9, 2, 2, Padding::Same),
            (9, 9, 2, 3, Padding::Valid),
            (9, 8, 3, 3, Padding::Same),
        ] {
            let p = PoolGeom { n: 2, h, w, c: 19, kh: k, kw: k, stride_h: s, stride_w: s, padding };
            let x = r.vec(p.x_len());
            let g = r.vec(p.y_len());
            let mut y = vec![0.0; p.y_len()];
            max_pool(&p, &x, &mut y);
            let mut dx = vec![f32::NAN; p.x_len()];
            max_pool_grad(&p, &x, &y, &g, &mut dx);
            // Reference: each window's first maximal cell gets its dy.
            let (oh, pt) = p.out_h();
            let (ow, pl) = p.out_w();
            let mut want = vec![0.0f32; p.x_len()];
            for b in 0..p.n {
                for oy in 0..oh {
                    for ox in 0..ow {
                        for ch in 0..p.c {
                            let o = ((b * oh + oy) * ow + ox) * p.c + ch;
                            let mut done = false;
                            for ky in 0..k {
                                for kx in 0..k {
                                    let iy = (oy * s + ky) as isize - pt as isize;
                                    let ix = (ox * s + kx) as isize - pl as isize;
                                    if done || iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                        continue;
                                    }
                                    let i = ((b * h + iy as usize) * w + ix as usize) * p.c + ch;
                                    if x[i] == y[o] {
                                        want[i] += g[o];
                                        done = true;
                                    }
                                }
                            }
                        }
                    }
                }
            }
            assert_eq!(dx, want, "{p:?}");
        }
    }

    /// The dispatched kernels (AVX-512 where the CPU has it) and the
    /// portable bodies agree bit for bit, ties and many channels included.
    #[test]
    fn simd_and_portable_agree() {
        let mut r = Lcg::new(24);
        let mut geoms = cases();
        geoms.push(PoolGeom {
            n: 2,
            h: 8,
            w: 6,
            c: 37,
            kh: 2,
            kw: 2,
            stride_h: 2,
            stride_w: 2,
            padding: Padding::Valid,
        });
        geoms.push(PoolGeom {
            n: 1,
            h: 7,
            w: 7,
            c: 12,
            kh: 3,
            kw: 3,
            stride_h: 3,
            stride_w: 3,
            padding: Padding::Same,
        });
        for p in geoms {
            // Coarse values: ties inside windows happen.
            let x: Vec<f32> = r.vec(p.x_len()).iter().map(|v| (v * 3.0).round()).collect();
            let g = r.vec(p.y_len());
            let (mut y0, mut y1) = (vec![f32::NAN; p.y_len()], vec![f32::NAN; p.y_len()]);
            max_pool_portable(&p, &x, &mut y0);
            max_pool(&p, &x, &mut y1);
            let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y0), bits(&y1), "max_pool {p:?}");
            let disjoint = p.stride_h >= p.kh && p.stride_w >= p.kw;
            let mut d0 = vec![0.0; p.x_len()];
            max_pool_grad_portable(&p, &x, &y0, &g, &mut d0, disjoint);
            let mut d1 = vec![f32::NAN; p.x_len()];
            max_pool_grad(&p, &x, &y0, &g, &mut d1);
            assert_eq!(bits(&d0), bits(&d1), "max_pool_grad {p:?}");
        }
    }

    #[test]
    fn max_grad_ties_go_to_first() {
        // One 2x2 window of equal values: TF sends everything to (0, 0).
        let p = PoolGeom { n: 1, h: 2, w: 2, c: 1, kh: 2, kw: 2, stride_h: 2, stride_w: 2, padding: Padding::Valid };
        let mut dx = vec![0.0; 4];
        max_pool_grad(&p, &[1.0; 4], &[1.0], &[3.0], &mut dx);
        assert_eq!(dx, vec![3.0, 0.0, 0.0, 0.0]);
    }
}
