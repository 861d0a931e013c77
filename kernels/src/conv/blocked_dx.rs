//! The blocked input gradient by column rows ([`super::Algorithm::Blocked`],
//! VALID geometries only), generic over [`pulp::Simd`]; layouts as the
//! parent module.
//!
//! For every `dy` pixel the kernel computes its row of the column-matrix
//! gradient, `dcol[pixel, :] = dy[pixel, :] * W^T` (`K = kh * kw * c_in`
//! floats, row index `(ky * kw + kx) * c_in + c` as the filter's), in
//! registers and adds it straight into `dx`, which VALID keeps inside the
//! image: filter row `ky`'s `kw * c_in` floats are contiguous in `dx` at
//! `((oy + ky) * w + ox) * c_in`. The lanes run over the flat `K` (at the
//! seed's `3x3x12` 108 floats in 7 AVX-512 vectors or 14 AVX2 ones, no
//! padding taps) instead of over `c_in` (12 of 16 lanes, ~17% of the taps on
//! padding in the correlation over a zero-padded `dy`).
//!
//! A register block is `R` pixels of one image times up to `NC` vectors of
//! the column row (3 times 7 on the 32-register paths, 3 times 3 on AVX2);
//! per output channel `o` the `NC` filter vectors are loaded once and each
//! pixel adds `dy[pixel, o] * W^T[o, :]`. Each vector is then added into
//! `dx` once per filter row it meets ([`Seg`]): whole vectors by a load, an
//! add and a store; pieces by a select between the sum and the loaded value
//! (the vector lies in `dx`), or lane by lane at the image's ends.
//!
//! ## Invariants
//! - `dx` is zeroed image by image first; each `dx` float then receives its
//!   pixels' contributions (each a chain of `c_out` fused multiply-adds over
//!   `o` in order) in one fixed pixel order: phase by phase (`oy % kh`, `ox
//!   % kw`), row-major within a phase. A block never spans two phases, and
//!   pixels of one phase have disjoint windows, so within a block no float
//!   is added twice: the order, and so the bits, do not depend on `R`,
//!   `NC` or the width (tested across paths). Equal to im2col + GEMM +
//!   col2im up to reassociation.
//! - The caller keeps ([`fits`]): VALID at stride 1 (every window inside
//!   the image), the transposed filter fits the packed buffer, the segments
//!   fit [`MAX_SEGS`] (at most `K + kh` for any width).

use pulp::{Simd, WithSimd};

use super::vec::{self, Packed, MAX_LANES, MAX_PACKED};
use super::ConvGeom;

/// Most pixels per register block.
const MAX_R: usize = 3;
/// Most column-row vectors per register block (32-register paths).
const MAX_NC: usize = 7;
/// Most segments (vector pieces within one filter row) of a column row.
const MAX_SEGS: usize = 1024;

/// One piece of a column-row vector: lanes `a..b` of vector `v` go to
/// `dx[base + off + lane]` for the pixel's `base`.
#[derive(Clone, Copy, Default)]
struct Seg {
    v: usize,
    off: usize,
    a: usize,
    b: usize,
}

/// True when this kernel takes `p` (a blocked geometry; see the module docs).
pub(super) fn fits(p: &ConvGeom) -> bool {
    let ((oh, _), (ow, _)) = (p.out_h(), p.out_w());
    p.stride_h == 1
        && p.stride_w == 1
        && oh + p.kh - 1 == p.h
        && ow + p.kw - 1 == p.w
        && p.c_out * p.k().div_ceil(MAX_LANES) <= MAX_PACKED
        && p.k() + p.kh <= MAX_SEGS
}

/// `dx = conv2d_backprop_input(dy, filter)` (overwritten), as a
/// [`WithSimd`] op. Requires [`fits`]; the slices as the geometry.
pub(super) struct InputGrad<'a> {
    pub(super) p: &'a ConvGeom,
    pub(super) dy: &'a [f32],
    pub(super) filter: &'a [f32],
    pub(super) dx: &'a mut [f32],
}

impl WithSimd for InputGrad<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let InputGrad { p, dy, filter, dx } = self;
        let l = S::F32_LANES;
        let ((oh, _), (ow, _)) = (p.out_h(), p.out_w());
        let (ci, co, k) = (p.c_in, p.c_out, p.k());
        let nv = k.div_ceil(l);
        // W^T: channel o's vector v at vector o * nv + v, lane i = column v * l + i.
        let mut wt = Packed::zeroed();
        for o in 0..co {
            for j in 0..k {
                wt.0[o * nv * l + j] = filter[j * co + o];
            }
        }
        // The segments in vector order: filter row ky holds columns
        // [ky * row, (ky + 1) * row), at dx offset ky * w * ci.
        let row = p.kw * ci;
        let mut segs = [Seg::default(); MAX_SEGS];
        let mut ns = 0;
        for v in 0..nv {
            let (mut a, end) = (v * l, ((v + 1) * l).min(k));
            while a < end {
                let ky = a / row;
                let b = end.min((ky + 1) * row);
                // Lane i of vector v is column v * l + i, at dx offset
                // ky * w * ci + v * l + i - ky * row (>= 0: w * ci >= row).
                segs[ns] = Seg { v, off: ky * (p.w * ci - row) + v * l, a: a - v * l, b: b - v * l };
                ns += 1;
                a = b;
            }
        }
        let (dimg, ximg) = (oh * ow * co, p.h * p.w * ci);
        let (rmax, ncmax) = if vec::wide::<S>() { (MAX_R, MAX_NC) } else { (3, 3) };
        for b in 0..p.n {
            let dxb = &mut dx[b * ximg..(b + 1) * ximg];
            dxb.fill(0.0);
            let dyb = &dy[b * dimg..(b + 1) * dimg];
            // The pixels phase by phase (oy % kh, ox % kw): pixels of one
            // phase have disjoint windows, so a block's adds never reload
            // what the block before just stored (a partly overlapping reload
            // would wait for the store: measured 1.5x slower in consecutive
            // order), and a block never adds twice to one float.
            for py in 0..p.kh.min(oh) {
                for px in 0..p.kw.min(ow) {
                    let (gh, gw) = ((oh - py).div_ceil(p.kh), (ow - px).div_ceil(p.kw));
                    let mut i = 0;
                    while i < gh * gw {
                        let n = rmax.min(gh * gw - i);
                        let mut bases = [0usize; MAX_R];
                        let mut dys = [0usize; MAX_R];
                        for r in 0..n {
                            let (oy, ox) = (py + ((i + r) / gw) * p.kh, px + ((i + r) % gw) * p.kw);
                            bases[r] = (oy * p.w + ox) * ci;
                            dys[r] = (oy * ow + ox) * co;
                        }
                        let (mut v0, mut s0) = (0, 0);
                        while v0 < nv {
                            let nc = ncmax.min(nv - v0);
                            let mut s1 = s0;
                            while s1 < ns && segs[s1].v < v0 + nc {
                                s1 += 1;
                            }
                            let blk = Block {
                                dy: dyb,
                                dys: &dys,
                                co,
                                wt: &wt.0[v0 * l..],
                                nv,
                                dx: &mut *dxb,
                                bases: &bases,
                                segs: &segs[s0..s1],
                                v0,
                            };
                            dispatch_r_nc(simd, n, nc, blk);
                            v0 += nc;
                            s0 = s1;
                        }
                        i += n;
                    }
                }
            }
        }
    }
}

/// Calls `block::<R, NC>` for the run-time `(n, nc)`, `n` in `1..=MAX_R`,
/// `nc` in `1..=MAX_NC`.
#[inline(always)]
fn dispatch_r_nc(simd: impl Simd, n: usize, nc: usize, blk: Block<'_>) {
    macro_rules! nc {
        ($r:literal) => {
            match nc {
                1 => block::<$r, 1>(simd, blk),
                2 => block::<$r, 2>(simd, blk),
                3 => block::<$r, 3>(simd, blk),
                4 => block::<$r, 4>(simd, blk),
                5 => block::<$r, 5>(simd, blk),
                6 => block::<$r, 6>(simd, blk),
                _ => block::<$r, 7>(simd, blk),
            }
        };
    }
    match n {
        1 => nc!(1),
        2 => nc!(2),
        _ => nc!(3),
    }
}

/// `R` pixels (`dy` rows at `dys[r]`) times the `NC` column-row vectors
/// from `v0` (`wt` starts at vector `v0` of channel 0, `nv` vectors per
/// channel), added into `dx` at `bases[r] + seg.off` for each of `segs`
/// (those of vectors `v0..v0+NC`).
struct Block<'a> {
    dy: &'a [f32],
    dys: &'a [usize; MAX_R],
    co: usize,
    wt: &'a [f32],
    nv: usize,
    dx: &'a mut [f32],
    bases: &'a [usize; MAX_R],
    segs: &'a [Seg],
    v0: usize,
}

/// Runs `blk` as its own function with the path's features.
#[inline(always)]
fn block<const R: usize, const NC: usize>(simd: impl Simd, blk: Block<'_>) {
    struct Op<'a, const R: usize, const NC: usize>(Block<'a>);
    impl<const R: usize, const NC: usize> WithSimd for Op<'_, R, NC> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            block_body::<S, R, NC>(simd, self.0)
        }
    }
    simd.vectorize(Op::<R, NC>(blk))
}

#[inline(always)]
fn block_body<S: Simd, const R: usize, const NC: usize>(simd: S, b: Block<'_>) {
    let l = S::F32_LANES;
    let (dy, dx) = (b.dy, b.dx);
    // Bounds once per block: every read of `dy` and `wt` below is in them.
    assert!(b.co > 0 && b.dys[..R].iter().all(|&d| d + b.co <= dy.len()));
    assert!((b.co - 1) * b.nv * l + NC * l <= b.wt.len());
    let mut acc = [[simd.splat_f32s(0.0); NC]; R];
    for o in 0..b.co {
        let mut wv = [simd.splat_f32s(0.0); NC];
        for (i, x) in wv.iter_mut().enumerate() {
            // SAFETY: asserted above.
            *x = unsafe { vec::load::<S>(b.wt.as_ptr().add((o * b.nv + i) * l)) };
        }
        for (r, a) in acc.iter_mut().enumerate() {
            // SAFETY: asserted above.
            let d = simd.splat_f32s(unsafe { *dy.get_unchecked(b.dys[r] + o) });
            for i in 0..NC {
                a[i] = simd.mul_add_f32s(d, wv[i], a[i]);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        for s in b.segs {
            let i = s.v - b.v0;
            debug_assert!(i < NC);
            // The vector's lane 0 at dx[at]; lanes s.a..s.b lie in dx.
            let at = b.bases[r] + s.off;
            let sum = a[i.min(NC - 1)];
            if s.a == 0 && s.b == l {
                let d = &mut dx[at..at + l];
                // SAFETY: `d` is one vector of `dx`.
                unsafe { vec::store::<S>(d.as_mut_ptr(), simd.add_f32s(vec::load::<S>(d.as_ptr()), sum)) };
            } else if l == 16 || at + l > dx.len() {
                assert!(at + s.b <= dx.len());
                // SAFETY: lanes a..b of the vector at `at` lie in `dx` (asserted).
                unsafe { vec::add_lanes_or_store::<S, true>(simd, dx.as_mut_ptr().add(at), s.a, s.b, sum) };
            } else {
                let d = &mut dx[at..at + l];
                // SAFETY: `d` is one vector of `dx`; lanes outside a..b are
                // stored back unchanged.
                unsafe {
                    let t = vec::load::<S>(d.as_ptr());
                    let m = vec::lanes_between(simd, s.a, s.b);
                    vec::store::<S>(d.as_mut_ptr(), simd.select_f32s(m, simd.add_f32s(t, sum), t));
                }
            }
        }
    }
}
