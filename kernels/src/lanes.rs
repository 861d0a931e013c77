//! One vector's worth of floats in and out of a slice, for the kernels
//! written once over [`pulp::Simd`] (see [`crate::simd`]).
//!
//! [`load`] and [`store`] take a slice of `1..=S::F32_LANES` floats: a
//! whole vector is a plain unaligned load or store, a shorter slice a masked
//! one that reads or writes only the slice's lanes (the lanes past it read
//! as 0.0 and are never written). Nothing here rounds: values go in and out
//! bit for bit on every path.

use pulp::Simd;

/// The floats of `v` (`v.len() <= S::F32_LANES`) in the first lanes of a
/// vector, the other lanes 0.0.
#[inline(always)]
pub(crate) fn load<S: Simd>(s: S, v: &[f32]) -> S::f32s {
    if v.len() == S::F32_LANES {
        S::as_simd_f32s(v).0[0]
    } else {
        s.partial_load_f32s(v)
    }
}

/// Writes the first `v.len()` lanes of `x` into `v` (`v.len() <= S::F32_LANES`).
#[inline(always)]
pub(crate) fn store<S: Simd>(s: S, v: &mut [f32], x: S::f32s) {
    if v.len() == S::F32_LANES {
        S::as_mut_simd_f32s(v).0[0] = x;
    } else {
        s.partial_store_f32s(v, x)
    }
}

/// `(a > b) ? a : b` per lane, the comparison and select spelled out (no
/// `max` instruction, whose NaN and signed-zero rules differ between
/// instruction sets): a NaN in `a` keeps `b`, `max(+0, -0)` keeps `b`.
#[inline(always)]
pub(crate) fn max_keep<S: Simd>(s: S, a: S::f32s, b: S::f32s) -> S::f32s {
    s.select_f32s(s.greater_than_f32s(a, b), a, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{dispatch_on, SimdPath};

    /// Every length up to a vector round-trips, and a short store leaves
    /// the floats after the slice alone.
    #[test]
    fn partial_loads_and_stores_touch_only_their_lanes() {
        struct RoundTrip;
        impl pulp::WithSimd for RoundTrip {
            type Output = ();
            #[inline(always)]
            fn with_simd<S: Simd>(self, s: S) {
                let src: Vec<f32> = (0..S::F32_LANES).map(|i| i as f32 + 0.5).collect();
                for n in 1..=S::F32_LANES {
                    let mut dst = vec![-7.0f32; S::F32_LANES + 1];
                    store(s, &mut dst[..n], load(s, &src[..n]));
                    assert_eq!(&dst[..n], &src[..n], "{n} of {}", S::F32_LANES);
                    assert!(dst[n..].iter().all(|v| *v == -7.0), "{n} of {}", S::F32_LANES);
                }
                let m = max_keep(s, s.splat_f32s(f32::NAN), s.splat_f32s(1.0));
                let mut out = vec![0.0; S::F32_LANES];
                store(s, &mut out, m);
                assert!(out.iter().all(|v| *v == 1.0));
            }
        }
        for p in SimdPath::available() {
            dispatch_on(p, RoundTrip);
        }
    }
}
