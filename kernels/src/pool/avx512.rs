//! AVX-512 forms of [`super::max_pool`] and of [`super::max_pool_grad`] for
//! disjoint windows: one masked vector per block of up to 16 channels of a
//! window cell. At 12 channels (the seed convnet) the portable loops run a
//! 12-long loop per cell that the baseline target vectorizes 4 wide with a
//! remainder; here a cell is one masked load, compare and store.
//!
//! Same results bit for bit as the portable bodies: `max(v, o)` is
//! `v > o ? v : o` (`vmaxps` with the new value first, NaN keeps the old), and
//! the gradient stores `dy` where the first maximal cell is found and `+0.0`
//! elsewhere. Callers must have checked AVX-512F.

use std::arch::x86_64::*;

use super::PoolGeom;
use crate::window::window;

/// The lanes `0..nb` of a vector.
#[inline(always)]
fn mask(nb: usize) -> __mmask16 {
    ((1u32 << nb) - 1) as __mmask16
}

/// See [`super::max_pool`].
///
/// # Safety
/// The CPU supports AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn max_pool(p: &PoolGeom, x: &[f32], y: &mut [f32]) {
    let (oh, pt) = p.out_h();
    let (ow, pl) = p.out_w();
    let c = p.c;
    for b in 0..p.n {
        for oy in 0..oh {
            let (ylo, yhi, _) = window(oy, p.stride_h, pt, p.kh, p.h);
            for ox in 0..ow {
                let (xlo, xhi, _) = window(ox, p.stride_w, pl, p.kw, p.w);
                let o = ((b * oh + oy) * ow + ox) * c;
                for c0 in (0..c).step_by(16) {
                    let nb = (c - c0).min(16);
                    let m = mask(nb);
                    let mut acc = _mm512_set1_ps(f32::NEG_INFINITY);
                    for iy in ylo..yhi {
                        for ix in xlo..xhi {
                            let i = ((b * p.h + iy) * p.w + ix) * c + c0;
                            let xs = &x[i..i + nb];
                            // SAFETY: the mask reads the lanes of `xs` only.
                            let v = _mm512_maskz_loadu_ps(m, xs.as_ptr());
                            acc = _mm512_max_ps(v, acc);
                        }
                    }
                    let ys = &mut y[o + c0..o + c0 + nb];
                    // SAFETY: the mask writes the lanes of `ys` only.
                    _mm512_mask_storeu_ps(ys.as_mut_ptr(), m, acc);
                }
            }
        }
    }
}

/// See [`super::max_pool_grad`]; windows must be disjoint, and `dx` zero
/// where no window reaches (the caller fills it unless the windows tile it).
/// `relu`: route `y > 0 ? dy : 0` instead of `dy` (the gradient of a ReLU
/// whose output is `x`, at the routed cell, whose value is `y`).
///
/// # Safety
/// The CPU supports AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn max_pool_grad_disjoint(
    p: &PoolGeom,
    x: &[f32],
    y: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    relu: bool,
) {
    let (oh, pt) = p.out_h();
    let (ow, pl) = p.out_w();
    let c = p.c;
    for b in 0..p.n {
        for oy in 0..oh {
            let (ylo, yhi, _) = window(oy, p.stride_h, pt, p.kh, p.h);
            for ox in 0..ow {
                let (xlo, xhi, _) = window(ox, p.stride_w, pl, p.kw, p.w);
                let o = ((b * oh + oy) * ow + ox) * c;
                for c0 in (0..c).step_by(16) {
                    let nb = (c - c0).min(16);
                    let m = mask(nb);
                    let (ys, gs) = (&y[o + c0..o + c0 + nb], &dy[o + c0..o + c0 + nb]);
                    // SAFETY: the mask reads the lanes of `ys` and `gs` only.
                    let (ym, mut g) = (_mm512_maskz_loadu_ps(m, ys.as_ptr()), _mm512_maskz_loadu_ps(m, gs.as_ptr()));
                    if relu {
                        // The ReLU's gradient at the routed cell, whose value
                        // is the window's maximum: dy where it is above 0.
                        g = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_GT_OQ>(ym, _mm512_setzero_ps()), g);
                    }
                    // Set while the channel's gradient is not routed yet.
                    let mut open = m;
                    for iy in ylo..yhi {
                        for ix in xlo..xhi {
                            let i = ((b * p.h + iy) * p.w + ix) * c + c0;
                            let xs = &x[i..i + nb];
                            let ds = &mut dx[i..i + nb];
                            // SAFETY: the masks touch the lanes of `xs` and `ds` only.
                            let v = _mm512_maskz_loadu_ps(m, xs.as_ptr());
                            let hit = _mm512_mask_cmp_ps_mask::<_CMP_EQ_OQ>(open, v, ym);
                            _mm512_mask_storeu_ps(ds.as_mut_ptr(), m, _mm512_maskz_mov_ps(hit, g));
                            open &= !hit;
                        }
                    }
                }
            }
        }
    }
}
