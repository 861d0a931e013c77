//! The AVX-512 intrinsics form of the column-row input gradient
//! (`blocked_dx.rs`), kept because the generic form measured 30% slower on
//! AVX-512 (seed's conv_2, batch 256, one thread, quiet machine, probe
//! 266-271 GFLOP/s: 708-734 us here against 921-930 us generic). Same
//! algorithm, same pixel order (blocks end at phase boundaries, as the
//! generic form's), same fused multiply-adds: the same bits as the generic
//! form on the other paths (tested in `paths_tests.rs`).
//!
//! For every `dy` pixel the kernel computes its row of the column-matrix
//! gradient, `dcol[pixel, :] = dy[pixel, :] * W^T` (`K = kh * kw * c_in`
//! floats, row index `(ky * kw + kx) * c_in + c` as the filter's), in
//! registers and adds it straight into `dx`, which VALID keeps inside the
//! image: filter row `ky`'s `kw * c_in` floats are contiguous in `dx` at
//! `((oy + ky) * w + ox) * c_in`. The lanes run over the flat `K` (at the
//! seed's `3x3x12` 108 floats in 7 vectors, 96% of the lanes used, no
//! padding taps) instead of over `c_in` (12 of 16 lanes, ~17% of the taps on
//! padding in the correlation over a zero-padded `dy`).
//!
//! A register block is `R <= MAX_R` consecutive pixels of one image times up
//! to [`MAX_NC`] vectors of the column row (21 accumulators at `R = 3`); per
//! output channel `o` the `NC` filter vectors are loaded once and each
//! pixel adds `dy[pixel, o] * W^T[o, :]`. Each vector is then added into
//! `dx` by one masked load-add-store per filter row it meets ([`Seg`]).
//! `dx` is zeroed image by image first. Each `dx` float sums its
//! contributions pixel by pixel (each a chain of `c_out` fused
//! multiply-adds): equal to im2col + GEMM + col2im up to reassociation.
//!
//! Invariants the caller keeps ([`fits`]): VALID at stride 1 (every window
//! inside the image), the transposed filter (`c_out * ceil(K / 16)` vectors)
//! fits in `MAX_PACKED`, the segments in [`MAX_SEGS`]. Callers must have
//! checked AVX-512F and FMA.

use std::arch::x86_64::*;

use super::vec::MAX_PACKED;
use super::ConvGeom;

/// Output channels per vector (one AVX-512 register of f32).
const LANES: usize = 16;
type V = [f32; LANES];

/// 64-byte aligned storage: packed vectors each within one cache line.
#[repr(align(64))]
struct Aligned<T>(T);

/// Most pixels per register block.
const MAX_R: usize = 3;
/// Most column-row vectors per register block.
const MAX_NC: usize = 7;
/// Most segments (vector pieces within one filter row) of a column row.
const MAX_SEGS: usize = 64;

/// One piece of a column-row vector: lanes `mask` of vector `v` go to
/// `dx[base + off + lane]` for the pixel's `base`.
#[derive(Clone, Copy, Default)]
struct Seg {
    v: usize,
    off: usize,
    mask: __mmask16,
}

/// Vectors of one column row.
fn nvec(p: &ConvGeom) -> usize {
    p.k().div_ceil(LANES)
}

/// Calls `block::<R, NC>` for the run-time `nc` in `1..=7`.
macro_rules! dispatch_nc {
    ($nc:expr, $r:literal, $args:expr) => {{
        let (a, a2, b, c, d, e, f, g, h) = $args;
        match $nc {
            1 => block::<$r, 1>(a, a2, b, c, d, e, f, g, h),
            2 => block::<$r, 2>(a, a2, b, c, d, e, f, g, h),
            3 => block::<$r, 3>(a, a2, b, c, d, e, f, g, h),
            4 => block::<$r, 4>(a, a2, b, c, d, e, f, g, h),
            5 => block::<$r, 5>(a, a2, b, c, d, e, f, g, h),
            6 => block::<$r, 6>(a, a2, b, c, d, e, f, g, h),
            _ => block::<$r, 7>(a, a2, b, c, d, e, f, g, h),
        }
    }};
}

/// True when this kernel takes `p` (a blocked geometry; see the module docs).
pub(super) fn fits(p: &ConvGeom) -> bool {
    let ((oh, _), (ow, _)) = (p.out_h(), p.out_w());
    p.stride_h == 1
        && p.stride_w == 1
        && oh + p.kh - 1 == p.h
        && ow + p.kw - 1 == p.w
        && p.c_out * nvec(p) <= MAX_PACKED
        && nvec(p) + p.kh <= MAX_SEGS
}

/// `dx = conv2d_backprop_input(dy, filter)` (overwritten).
///
/// # Safety
/// The CPU supports AVX-512F and FMA; `fits(p)`; the slices as the geometry.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn conv2d_backprop_input(p: &ConvGeom, dy: &[f32], filter: &[f32], dx: &mut [f32]) {
    let ((oh, _), (ow, _)) = (p.out_h(), p.out_w());
    let (ci, co, k) = (p.c_in, p.c_out, p.k());
    let nv = nvec(p);
    // W^T: channel o's vector v at wt[o * nv + v], lane l = column 16v + l.
    let mut wt = Aligned([[0.0f32; LANES]; MAX_PACKED]);
    let wt = &mut wt.0;
    for o in 0..co {
        for j in 0..k {
            wt[o * nv + j / LANES][j % LANES] = filter[j * co + o];
        }
    }
    // The segments in vector order: filter row ky holds columns
    // [ky * row, (ky + 1) * row), at dx offset ky * w * ci.
    let row = p.kw * ci;
    let mut segs = [Seg::default(); MAX_SEGS];
    let mut ns = 0;
    for v in 0..nv {
        let (mut a, end) = (v * LANES, ((v + 1) * LANES).min(k));
        while a < end {
            let ky = a / row;
            let b = end.min((ky + 1) * row);
            let lanes = (((1u32 << (b - v * LANES)) - 1) & !((1u32 << (a - v * LANES)) - 1)) as __mmask16;
            // Lane l of vector v is column 16v + l, at dx offset
            // ky * w * ci + 16v + l - ky * row (>= 0: w * ci >= row).
            segs[ns] = Seg { v, off: ky * (p.w * ci - row) + v * LANES, mask: lanes };
            ns += 1;
            a = b;
        }
    }
    let (dimg, ximg) = (oh * ow * co, p.h * p.w * ci);
    let mut dys = [0usize; MAX_R];
    for b in 0..p.n {
        let dxb = &mut dx[b * ximg..(b + 1) * ximg];
        dxb.fill(0.0);
        let dyb = &dy[b * dimg..(b + 1) * dimg];
        // The pixels phase by phase (oy % kh, ox % kw): pixels of one
        // phase have disjoint windows, so a block's adds never reload what
        // the block before just stored (a partly overlapping reload would
        // wait for the store: measured 1.5x slower in consecutive order).
        let (mut py, mut px, mut i) = (0, 0, 0);
        let (mut gh, mut gw) = ((oh - py).div_ceil(p.kh), (ow - px).div_ceil(p.kw));
        while py < p.kh.min(oh) {
            let mut bases = [0usize; MAX_R];
            let mut n = 0;
            while n < MAX_R && py < p.kh.min(oh) {
                let (oy, ox) = (py + (i / gw) * p.kh, px + (i % gw) * p.kw);
                bases[n] = (oy * p.w + ox) * ci;
                dys[n] = (oy * ow + ox) * co;
                n += 1;
                i += 1;
                if i == gh * gw {
                    i = 0;
                    px += 1;
                    if px == p.kw.min(ow) {
                        px = 0;
                        py += 1;
                    }
                    if py < p.kh.min(oh) {
                        (gh, gw) = ((oh - py).div_ceil(p.kh), (ow - px).div_ceil(p.kw));
                    }
                    // A block ends with its phase: no float is added twice
                    // within a block, so the order is the generic form's.
                    break;
                }
            }
            let mut v0 = 0;
            let mut s0 = 0;
            while v0 < nv {
                let nc = MAX_NC.min(nv - v0);
                let mut s1 = s0;
                while s1 < ns && segs[s1].v < v0 + nc {
                    s1 += 1;
                }
                // SAFETY: the block's pixels lie in dyb, their windows in dxb
                // (VALID), the vectors in wt (`fits`).
                let args =
                    (dyb.as_ptr(), &dys, co, wt.as_ptr().add(v0), nv, dxb.as_mut_ptr(), &bases, &segs[s0..s1], v0);
                match (n, nc) {
                    (1, _) => dispatch_nc!(nc, 1, args),
                    (2, _) => dispatch_nc!(nc, 2, args),
                    _ => dispatch_nc!(nc, 3, args),
                }
                v0 += nc;
                s0 = s1;
            }
        }
    }
}

/// `R` pixels (`dy` rows at `dy + dys[r]`) times the `NC` column-row vectors
/// from `v0` (`wt` points at vector `v0` of channel 0, `nv` vectors per
/// channel), added into `dx` at `dx + bases[r] + seg.off` for each of
/// `segs` (those of vectors `v0..v0+NC`).
///
/// # Safety
/// Every read of `dy` and `wt` is in bounds, and every segment's unmasked
/// lanes of every pixel lie in `dx`.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn block<const R: usize, const NC: usize>(
    dy: *const f32,
    dys: &[usize; MAX_R],
    co: usize,
    wt: *const V,
    nv: usize,
    dx: *mut f32,
    bases: &[usize; MAX_R],
    segs: &[Seg],
    v0: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); NC]; R];
    for o in 0..co {
        let w = wt.add(o * nv) as *const f32;
        let mut wv = [_mm512_setzero_ps(); NC];
        for (i, x) in wv.iter_mut().enumerate() {
            *x = _mm512_loadu_ps(w.add(i * LANES));
        }
        for (r, a) in acc.iter_mut().enumerate() {
            let d = _mm512_set1_ps(*dy.add(dys[r] + o));
            for i in 0..NC {
                a[i] = _mm512_fmadd_ps(d, wv[i], a[i]);
            }
        }
    }
    let mut s = 0;
    for i in 0..NC {
        while s < segs.len() && segs[s].v == v0 + i {
            let (off, m) = (segs[s].off, segs[s].mask);
            for (r, a) in acc.iter().enumerate() {
                let ptr = dx.add(bases[r] + off);
                let t = _mm512_maskz_loadu_ps(m, ptr);
                _mm512_mask_storeu_ps(ptr, m, _mm512_add_ps(t, a[i]));
            }
            s += 1;
        }
    }
}
