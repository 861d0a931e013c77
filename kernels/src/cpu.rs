//! The CPU dispatch's seam: how a backend hands one launch's operands to
//! a family's `run` (each family's `desc.rs`, reached by
//! [`Kernel::run_cpu`]), which picks the typed views by position and calls
//! the CPU body. The backend keeps its own memory and scheduling (threads,
//! lanes, split ranges); the argument unpacking per kernel is the family's.
//!
//! ## Invariants
//! - The backend checked the launch against [`Kernel::signature`] at load
//!   (arity, dtypes, lengths), so `run` indexes operands without checks.
//! - Nothing here allocates: lists of slices go through the reusable
//!   [`SliceList`]s of [`Lists`], reserved at load.

use thiserror::Error;

use crate::dtype::{DType, Slice, SliceMut};
use crate::family::Foreign;
use crate::{Kernel, KernelError};

/// Why a CPU body failed (its message is the body's own).
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CpuError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Foreign(#[from] Foreign),
}

/// One launch's operands, as the backend holds them.
///
/// # Safety
/// An implementation hands out slices of its buffers with an unbounded
/// lifetime; the caller ([`Kernel::run_cpu`]) uses them only during the call.
/// The backend guarantees for that call that no other thread writes the
/// inputs or touches the outputs, that distinct operands do not overlap
/// except where [`Io::in_place`] says input 0 is output 0, and that every
/// index is in range and of the dtype asked (the load-time signature check).
pub unsafe trait Io {
    /// The number of inputs and outputs.
    fn counts(&self) -> (usize, usize);
    /// The dtype of input `i`.
    fn in_dtype(&self, i: usize) -> DType;
    /// The dtype of output `j`.
    fn out_dtype(&self, j: usize) -> DType;
    /// Whether output 0 is input 0 itself ([`Kernel::in_place_ok`]).
    fn in_place(&self) -> bool;
    /// Input `i` as f32.
    ///
    /// # Safety
    /// As the trait.
    unsafe fn f32<'a>(&self, i: usize) -> &'a [f32];
    /// Input `i` as i32.
    ///
    /// # Safety
    /// As the trait.
    unsafe fn i32<'a>(&self, i: usize) -> &'a [i32];
    /// Output `j` as f32.
    ///
    /// # Safety
    /// As the trait; one live view per output.
    unsafe fn out_f32<'a>(&self, j: usize) -> &'a mut [f32];
    /// Output `j` as i32.
    ///
    /// # Safety
    /// As [`Io::out_f32`].
    unsafe fn out_i32<'a>(&self, j: usize) -> &'a mut [i32];
    /// The workspace (empty without one).
    ///
    /// # Safety
    /// As [`Io::out_f32`].
    unsafe fn ws<'a>(&self) -> &'a mut [f32];
}

/// The typed read view of input `i`.
///
/// # Safety
/// As [`Io`].
pub(crate) unsafe fn view<'a>(io: &dyn Io, i: usize) -> Slice<'a> {
    match io.in_dtype(i) {
        DType::F32 => Slice::F32(io.f32(i)),
        DType::I32 | DType::Bool => Slice::I32(io.i32(i)),
    }
}

/// The typed write view of output `j`.
///
/// # Safety
/// As [`Io::out_f32`].
pub(crate) unsafe fn view_mut<'a>(io: &dyn Io, j: usize) -> SliceMut<'a> {
    match io.out_dtype(j) {
        DType::F32 => SliceMut::F32(io.out_f32(j)),
        DType::I32 | DType::Bool => SliceMut::I32(io.out_i32(j)),
    }
}

/// The reusable lists a launch's `run` builds its slices of slices in
/// (operand lists for sums and fused kernels, shapes for concat, outputs
/// for split and the tower-fused updates).
pub struct Lists<'l> {
    pub f32s: &'l mut SliceList<f32>,
    pub dims: &'l mut SliceList<usize>,
    pub muts: &'l mut MutSliceList<f32>,
}

/// Reusable storage for a list of slices, filled per call without
/// allocating (its capacity is reserved at load).
pub struct SliceList<T: 'static> {
    v: Vec<&'static [T]>,
}

impl<T: 'static> SliceList<T> {
    pub fn with_capacity(n: usize) -> Self {
        SliceList { v: Vec::with_capacity(n) }
    }
    /// Call `f` with the slices of `items`; the list is empty again afterwards.
    pub fn with<'a, R>(&mut self, items: impl Iterator<Item = &'a [T]>, f: impl FnOnce(&[&'a [T]]) -> R) -> R {
        self.v.clear();
        // SAFETY: the 'static references never outlive this call: the list
        // is cleared before returning and only read through `f`'s borrow.
        self.v.extend(items.map(|s| unsafe { std::mem::transmute::<&'a [T], &'static [T]>(s) }));
        let r = f(&self.v[..]);
        self.v.clear();
        r
    }
}

/// As [`SliceList`], for mutable slices.
pub struct MutSliceList<T: 'static> {
    v: Vec<&'static mut [T]>,
}

impl<T: 'static> MutSliceList<T> {
    pub fn with_capacity(n: usize) -> Self {
        MutSliceList { v: Vec::with_capacity(n) }
    }
    pub fn with<'a, R>(
        &mut self,
        items: impl Iterator<Item = &'a mut [T]>,
        f: impl FnOnce(&mut [&'a mut [T]]) -> R,
    ) -> R {
        self.v.clear();
        // SAFETY: as in `SliceList::with`.
        self.v.extend(items.map(|s| unsafe { std::mem::transmute::<&'a mut [T], &'static mut [T]>(s) }));
        // SAFETY: shortening the element lifetime back to 'a for the call.
        let v: &mut [&'a mut [T]] =
            unsafe { std::mem::transmute::<&mut [&'static mut [T]], &mut [&'a mut [T]]>(&mut self.v[..]) };
        let r = f(v);
        self.v.clear();
        r
    }
}

impl Kernel {
    /// Run this kernel's CPU body (its family's `run`) on a launch's
    /// operands. `step` is the program's 0-based run count (dropout's
    /// stream). Allocates nothing on success.
    ///
    /// # Safety
    /// As [`Io`].
    pub unsafe fn run_cpu(&self, io: &dyn Io, lists: &mut Lists<'_>, step: u64) -> Result<(), CpuError> {
        (self.desc().run)(self, io, lists, step)
    }
}
