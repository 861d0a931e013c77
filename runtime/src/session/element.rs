//! The host element types a [`Session`](super::Session) feeds, fetches and
//! stores: [`Element`], implemented for `f32` and `i32` only.
//!
//! Invariants:
//! - The trait is sealed: the backend seam carries exactly these two host
//!   types ([`HostSlice`], [`HostSliceMut`]), so no other type can be
//!   passed where a tensor's values go.
//! - `i32` stands for i32 and bool tensors (bools are 4-byte 0/1 values in
//!   every plan): asking for [`DType::I32`] also accepts a bool tensor,
//!   never the other way round, and never f32 for i32.
//! - Only the session's thin public methods are generic; each hands its
//!   slice to one non-generic body as a [`HostSlice`] or [`HostSliceMut`]
//!   (dtypes dispatched at run time, so the generics cost two tiny copies
//!   of each wrapper, not two copies of the session).

use towers_vocab::DType;

use crate::backend::{HostSlice, HostSliceMut};
use crate::variables::HostVec;

mod sealed {
    /// Keeps [`super::Element`] to the types the backend seam carries.
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for i32 {}
}

/// A host element type of tensor values: `f32`, or `i32` for i32 and bool
/// tensors (bools as 0/1). The session's feed, fetch and variable methods
/// are generic over it; the type is usually inferred from the slice passed,
/// and named where a method returns a vector:
///
/// ```
/// # use towers_runtime::Session;
/// # fn f(s: &mut Session, images: &[f32], labels: &[i32]) -> Result<(), towers_runtime::RuntimeError> {
/// s.feed("train", "images", images)?; // f32
/// s.feed("train", "labels", labels)?; // i32
/// s.run("train")?;
/// let loss = s.fetch::<f32>("train", "loss")?;
/// let step = s.variable::<i32>("global_step")?;
/// # let _ = (loss, step); Ok(()) }
/// ```
pub trait Element: sealed::Sealed + Copy + Default + Send + Sync + 'static {
    /// The dtype asked for: [`DType::F32`] or [`DType::I32`] (which a bool
    /// tensor also satisfies).
    const DTYPE: DType;

    /// `data` as the backend seam's host slice.
    fn host(data: &[Self]) -> HostSlice<'_>;

    /// `data` as the backend seam's mutable host slice.
    fn host_mut(data: &mut [Self]) -> HostSliceMut<'_>;

    /// The slice a backend lent, when it holds this type.
    fn of_host_mut(s: HostSliceMut<'_>) -> Option<&mut [Self]>;

    /// The values of a host vector, when it holds this type.
    fn of_vec(v: &HostVec) -> Option<&[Self]>;

    /// The values of a host vector, mutably, when it holds this type.
    fn of_vec_mut(v: &mut HostVec) -> Option<&mut [Self]>;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;

    fn host(data: &[f32]) -> HostSlice<'_> {
        HostSlice::F32(data)
    }

    fn host_mut(data: &mut [f32]) -> HostSliceMut<'_> {
        HostSliceMut::F32(data)
    }

    fn of_host_mut(s: HostSliceMut<'_>) -> Option<&mut [f32]> {
        match s {
            HostSliceMut::F32(x) => Some(x),
            HostSliceMut::I32(_) => None,
        }
    }

    fn of_vec(v: &HostVec) -> Option<&[f32]> {
        match v {
            HostVec::F32(x) => Some(x),
            HostVec::I32(_) => None,
        }
    }

    fn of_vec_mut(v: &mut HostVec) -> Option<&mut [f32]> {
        match v {
            HostVec::F32(x) => Some(x),
            HostVec::I32(_) => None,
        }
    }
}

impl Element for i32 {
    const DTYPE: DType = DType::I32;

    fn host(data: &[i32]) -> HostSlice<'_> {
        HostSlice::I32(data)
    }

    fn host_mut(data: &mut [i32]) -> HostSliceMut<'_> {
        HostSliceMut::I32(data)
    }

    fn of_host_mut(s: HostSliceMut<'_>) -> Option<&mut [i32]> {
        match s {
            HostSliceMut::I32(x) => Some(x),
            HostSliceMut::F32(_) => None,
        }
    }

    fn of_vec(v: &HostVec) -> Option<&[i32]> {
        match v {
            HostVec::I32(x) => Some(x),
            HostVec::F32(_) => None,
        }
    }

    fn of_vec_mut(v: &mut HostVec) -> Option<&mut [i32]> {
        match v {
            HostVec::I32(x) => Some(x),
            HostVec::F32(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each type maps onto its own variant both ways and refuses the other.
    #[test]
    fn each_type_takes_its_own_variant_only() {
        let mut f = vec![1.5f32, -2.0];
        let mut i = vec![3i32, 0];
        assert_eq!(f32::DTYPE, DType::F32);
        assert_eq!(i32::DTYPE, DType::I32);
        assert!(matches!(f32::host(&f), HostSlice::F32(x) if x == [1.5, -2.0]));
        assert!(matches!(i32::host(&i), HostSlice::I32(x) if x == [3, 0]));
        assert_eq!(f32::of_host_mut(f32::host_mut(&mut f)).map(|x| x.len()), Some(2));
        assert!(i32::of_host_mut(f32::host_mut(&mut f)).is_none());
        assert!(f32::of_host_mut(i32::host_mut(&mut i)).is_none());
        let mut vf = HostVec::F32(vec![4.0]);
        let mut vi = HostVec::I32(vec![7]);
        assert_eq!(f32::of_vec(&vf), Some(&[4.0f32][..]));
        assert_eq!(i32::of_vec(&vi), Some(&[7][..]));
        assert!(i32::of_vec(&vf).is_none() && f32::of_vec(&vi).is_none());
        if let Some(x) = i32::of_vec_mut(&mut vi) {
            x[0] = 9;
        }
        assert!(matches!(vi, HostVec::I32(ref x) if x == &[9]));
        assert!(f32::of_vec_mut(&mut vi).is_none() && i32::of_vec_mut(&mut vf).is_none());
    }
}
