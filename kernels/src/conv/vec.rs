//! What the generic convolution kernels share: packed-filter storage sized
//! for the widest vector, unaligned and partial loads and stores of one
//! [`pulp::Simd`] vector, the register budget of each width, and the
//! bias/ReLU epilogue.
//!
//! Invariants:
//! - A packed buffer holds [`MAX_PACKED`] vectors of the *widest* path
//!   ([`MAX_LANES`] floats each). The geometry checks (`direct::fits`,
//!   `ConvGeom::blocked_fits`) count vectors of [`MAX_LANES`] lanes, so they
//!   are a function of the geometry only; a narrower path needs at most as
//!   many floats (`ceil(c / L) * L <= ceil(c / 16) * 16` for `L` in 1, 4, 8,
//!   16), so whatever fits for AVX-512 fits for every path.
//! - Lanes are output channels (or, for the column-row input gradient,
//!   columns): a kernel's lanes never mix, so the width changes which
//!   outputs share a register, never the order in which one output is summed.
//! - The epilogue adds the bias, then ReLU as `v < 0 ? 0 : v` by a compare
//!   and a select (not a `max`, whose NaN and signed-zero rules differ
//!   between x86 and NEON): the same bits on every path, and the same as
//!   `bias_add` then `unary(Relu)` for every sum (a NaN stays NaN, as TF's
//!   `Relu`).

use pulp::Simd;

/// The widest path's f32 lanes (AVX-512).
pub(crate) const MAX_LANES: usize = 16;
/// A packed buffer's capacity in vectors of [`MAX_LANES`] floats (16 KiB).
pub(crate) const MAX_PACKED: usize = 256;

/// A packed filter (or bias, or running gradient total): vector `i` of a
/// path with `L` lanes at floats `i * L..(i + 1) * L`; 64-byte aligned, so
/// every AVX-512 vector lies in one cache line.
#[repr(align(64))]
pub(super) struct Packed(pub(super) [f32; MAX_PACKED * MAX_LANES]);

impl Packed {
    pub(super) fn zeroed() -> Packed {
        Packed([0.0; MAX_PACKED * MAX_LANES])
    }
}

/// Vector registers of the path with `lanes` f32 lanes: 32 on AVX-512 and
/// NEON, 16 on AVX2 (and, for scalar, the 16 x86 XMM registers). The
/// kernels size their register blocks to leave one or two spare.
pub(super) const fn registers(lanes: usize) -> usize {
    match lanes {
        16 | 4 => 32,
        _ => 16,
    }
}

/// True on the paths with 32 vector registers.
#[inline(always)]
pub(super) fn wide<S: Simd>() -> bool {
    registers(S::F32_LANES) >= 32
}

/// One vector from `p` (no alignment needed).
///
/// # Safety
/// `p..p + S::F32_LANES` is readable.
#[inline(always)]
pub(super) unsafe fn load<S: Simd>(p: *const f32) -> S::f32s {
    p.cast::<S::f32s>().read_unaligned()
}

/// Writes one vector to `p` (no alignment needed).
///
/// # Safety
/// `p..p + S::F32_LANES` is writable.
#[inline(always)]
pub(super) unsafe fn store<S: Simd>(p: *mut f32, v: S::f32s) {
    p.cast::<S::f32s>().write_unaligned(v)
}

/// Writes lanes `0..nb` of `v` to `p..p + nb` (all of them when `nb >= L`).
///
/// # Safety
/// `p..p + min(nb, L)` is writable.
#[inline(always)]
pub(super) unsafe fn store_first<S: Simd>(simd: S, p: *mut f32, v: S::f32s, nb: usize) {
    if nb >= S::F32_LANES {
        store::<S>(p, v)
    } else {
        add_lanes_or_store::<S, false>(simd, p, 0, nb, v)
    }
}

/// Lanes `0..nb` from `p..p + nb`, the rest zero (all when `nb >= L`).
///
/// # Safety
/// `p..p + min(nb, L)` is readable.
#[inline(always)]
pub(super) unsafe fn load_first<S: Simd>(simd: S, p: *const f32, nb: usize) -> S::f32s {
    let _ = simd;
    if nb >= S::F32_LANES {
        return load::<S>(p);
    }
    #[cfg(target_arch = "x86_64")]
    if S::F32_LANES == 16 {
        // SAFETY: of the types `simd::dispatch_on` runs (V4, V3, Neon,
        // Scalar) only V4 has 16 lanes, so AVX-512F is enabled wherever
        // this body runs with 16 lanes (inlined into pulp's `vectorize`);
        // the mask reads `p..p + nb` only.
        use std::arch::x86_64::*;
        let v = _mm512_maskz_loadu_ps(mask16(0, nb), p);
        return core::mem::transmute_copy::<__m512, S::f32s>(&v);
    }
    let mut lanes = [0.0f32; MAX_LANES];
    core::ptr::copy_nonoverlapping(p, lanes.as_mut_ptr(), nb);
    load::<S>(lanes.as_ptr())
}

/// The AVX-512 mask of lanes `a..b` (`a <= b <= 16`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn mask16(a: usize, b: usize) -> u16 {
    (((1u32 << b) - 1) & !((1u32 << a) - 1)) as u16
}

/// `p[i] += v[i]` (`ADD`) or `p[i] = v[i]` for the lanes `i` in `a..b`,
/// the floats of `p` outside them untouched: by masked AVX-512 loads and
/// stores (one instruction each, measured faster than pulp's masked stores,
/// which jump to a table of stubs), elsewhere lane by lane through the
/// stack.
///
/// # Safety
/// `p + a..p + b` is readable and writable; `a <= b <= L`.
#[inline(always)]
pub(super) unsafe fn add_lanes_or_store<S: Simd, const ADD: bool>(
    simd: S,
    p: *mut f32,
    a: usize,
    b: usize,
    v: S::f32s,
) {
    let _ = simd;
    debug_assert!(a <= b && b <= S::F32_LANES);
    #[cfg(target_arch = "x86_64")]
    if S::F32_LANES == 16 {
        // SAFETY: as in `load_first` (S = V4, AVX-512F enabled); the mask
        // reads and writes `p + a..p + b` only.
        use std::arch::x86_64::*;
        let m = mask16(a, b);
        let mut x = core::mem::transmute_copy::<S::f32s, __m512>(&v);
        if ADD {
            x = _mm512_add_ps(_mm512_maskz_loadu_ps(m, p), x);
        }
        _mm512_mask_storeu_ps(p, m, x);
        return;
    }
    let mut lanes = [0.0f32; MAX_LANES];
    store::<S>(lanes.as_mut_ptr(), v);
    for (i, l) in lanes.iter().enumerate().take(b).skip(a) {
        if ADD {
            *p.add(i) += *l;
        } else {
            *p.add(i) = *l;
        }
    }
}

/// `0, 1, 2, ...` as floats: lane numbers, for masks made by comparison.
const IOTA: [f32; MAX_LANES] = [0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.];

/// The mask of lanes `a..b`.
#[inline(always)]
pub(super) fn lanes_between<S: Simd>(simd: S, a: usize, b: usize) -> S::m32s {
    // SAFETY: IOTA has MAX_LANES >= S::F32_LANES floats.
    let iota = unsafe { load::<S>(IOTA.as_ptr()) };
    let ge = simd.greater_than_or_equal_f32s(iota, simd.splat_f32s(a as f32));
    let lt = simd.less_than_f32s(iota, simd.splat_f32s(b as f32));
    simd.and_m32s(ge, lt)
}

/// What the forward kernels do to each output vector before storing it:
/// add the bias (zero-padded to whole vectors), then ReLU when `relu` (see
/// the module's invariants for the bits).
pub(super) struct Epilogue {
    bias: Packed,
    relu: bool,
}

impl Epilogue {
    /// The epilogue of `bias` (`c_out <= MAX_PACKED * MAX_LANES - MAX_LANES` floats).
    pub(super) fn new(bias: &[f32], relu: bool) -> Epilogue {
        let mut packed = Packed::zeroed();
        let n = bias.len().min(packed.0.len() - MAX_LANES);
        packed.0[..n].copy_from_slice(&bias[..n]);
        Epilogue { bias: packed, relu }
    }

    /// `a` (output channels `c0..c0 + L`) through the epilogue, if any.
    #[inline(always)]
    pub(super) fn apply<S: Simd>(simd: S, e: Option<&Epilogue>, c0: usize, a: S::f32s) -> S::f32s {
        match e {
            None => a,
            Some(e) => {
                debug_assert!(c0 + S::F32_LANES <= e.bias.0.len());
                // SAFETY: callers pass `c0 < c_out`, and the bias buffer
                // extends MAX_LANES floats past any `c_out` it holds.
                let b = unsafe { load::<S>(e.bias.0.as_ptr().add(c0)) };
                let v = simd.add_f32s(a, b);
                if e.relu {
                    let zero = simd.splat_f32s(0.0);
                    simd.select_f32s(simd.less_than_f32s(v, zero), zero, v)
                } else {
                    v
                }
            }
        }
    }
}
