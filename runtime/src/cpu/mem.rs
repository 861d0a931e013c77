//! The one module with `unsafe` memory access: shared arenas and the raw
//! views the executor works through.
//!
//! Invariant (what makes this data-race free): the plan's arenas and the
//! variable store are shared by the threads of one program, and
//! - a buffer is written by one stream between two of its events, and read
//!   by another stream only after that stream waited on an event recorded
//!   after the write (the schedule guarantees this; the event table's
//!   release/acquire atomics and mutex make the writes visible);
//! - between runs no worker touches memory: `Backend::run` takes `&mut
//!   self` and returns only after every stream finished, so feeds, fetches,
//!   variable reads/writes and checkpoints (all copies, through the
//!   backend) never race with kernels;
//! - within one launch, an output never overlaps an input, and the buffers
//!   of one all-reduce never overlap each other (checked at load by
//!   [`Slot::overlaps`]), so a `&mut` view never aliases another view. The
//!   one exception, also checked at load: a kernel that works in place
//!   (`Kernel::in_place_ok`) may have output 0 be exactly input 0
//!   ([`Slot::same`]); it then runs its in-place form, which takes only the
//!   `&mut` view.
//!
//! Regions are allocated once and never resized, so raw pointers into them
//! stay valid as long as the `Arc<Region>` they came from is held.

use std::cell::UnsafeCell;

use crate::backend::{HostSlice, HostSliceMut};

/// A fixed-size, 4-byte-element memory region shared across threads: its
/// own allocation, or memory the communicator lends (shared with the other
/// ranks of this host, [`crate::comm::SharedMemory`]).
pub struct Region {
    base: *mut u32,
    len: usize,
    /// The allocation behind `base`, when the region owns it.
    _owned: Option<Box<[UnsafeCell<u32>]>>,
    /// The communicator lending the memory, kept alive with the region.
    _lender: Option<std::sync::Arc<dyn crate::comm::Comm>>,
    /// The block of a [`crate::host_memory::HostMemory`] (pinned memory of
    /// a mixed session's host part) behind `base`.
    _block: Option<crate::host_memory::HostBlock>,
}

// SAFETY: access goes through `Slot`s whose use follows the module invariant.
unsafe impl Sync for Region {}
unsafe impl Send for Region {}

impl Region {
    /// A zeroed region of `len` 4-byte elements.
    pub fn new(len: usize) -> Region {
        let data: Box<[UnsafeCell<u32>]> = (0..len).map(|_| UnsafeCell::new(0)).collect();
        let base = UnsafeCell::raw_get(data.as_ptr());
        Region { base, len, _owned: Some(data), _lender: None, _block: None }
    }
    /// A zeroed region of `len` 4-byte elements from `memory` (the pinned
    /// allocator of a mixed session's host part, or pageable memory).
    pub fn new_in(memory: &dyn crate::host_memory::HostMemory, len: usize) -> Result<Region, String> {
        let block = memory.alloc(len * 4)?;
        if block.bytes() < len * 4 || !(block.ptr() as usize).is_multiple_of(4) {
            return Err(format!("the host allocator gave {} bytes for {} asked", block.bytes(), len * 4));
        }
        Ok(Region { base: block.ptr() as *mut u32, len, _owned: None, _lender: None, _block: Some(block) })
    }
    /// The zeroed memory `lent` by `comm` (at least `len` elements), kept
    /// alive by holding `comm`.
    pub fn lent(
        lent: crate::comm::SharedMemory,
        len: usize,
        comm: std::sync::Arc<dyn crate::comm::Comm>,
    ) -> Option<Region> {
        if lent.bytes < len * 4 || lent.ptr.is_null() || !(lent.ptr as usize).is_multiple_of(4) {
            return None;
        }
        let base = lent.ptr as *mut u32;
        // SAFETY: the lender guarantees `bytes` writable bytes at `ptr` for
        // as long as it lives, used by this region alone on this rank.
        unsafe { std::ptr::write_bytes(base, 0, len) };
        Some(Region { base, len, _owned: None, _lender: Some(comm), _block: None })
    }
    /// A view of elements `offset..offset + len`, or None when out of range.
    pub fn slot(&self, offset: usize, len: usize) -> Option<Slot> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: offset + len is within the allocation.
        Some(Slot { ptr: unsafe { self.base.add(offset) }, len })
    }
    /// The whole region.
    pub fn all(&self) -> Slot {
        self.slot(0, self.len).unwrap_or(Slot { ptr: std::ptr::NonNull::dangling().as_ptr(), len: 0 })
    }
}

/// A raw view of `len` 4-byte elements inside a [`Region`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    ptr: *mut u32,
    len: usize,
}

// SAFETY: see the module invariant.
unsafe impl Send for Slot {}
unsafe impl Sync for Slot {}

impl Slot {
    /// A view of `len` 4-byte elements at `addr`: memory another part of a
    /// mixed session lent ([`crate::mixed::Lent`]).
    ///
    /// # Safety
    /// `addr` is 4-byte aligned and `len` elements there stay valid while
    /// the slot is used; accesses follow the module invariant, with the
    /// bridge's flags as the events ordering them across parts.
    pub unsafe fn foreign(addr: usize, len: usize) -> Slot {
        Slot { ptr: addr as *mut u32, len }
    }
    /// The address of the first element (what a part lends).
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }
    pub fn len(&self) -> usize {
        self.len
    }
    /// The view of elements `[lo, hi)` of this one (clamped to it).
    pub fn range(&self, lo: usize, hi: usize) -> Slot {
        let hi = hi.min(self.len);
        let lo = lo.min(hi);
        // In bounds: lo <= len, so the pointer stays inside (or one past) the view.
        Slot { ptr: self.ptr.wrapping_add(lo), len: hi - lo }
    }
    /// Whether two views are the same elements.
    pub fn same(&self, o: &Slot) -> bool {
        self.ptr == o.ptr && self.len == o.len
    }
    /// Whether two views share any element.
    pub fn overlaps(&self, o: &Slot) -> bool {
        let (a, b) = (self.ptr as usize, o.ptr as usize);
        self.len > 0 && o.len > 0 && a < b + o.len * 4 && b < a + self.len * 4
    }
    /// # Safety
    /// No other thread writes this slot meanwhile (module invariant).
    pub unsafe fn f32<'a>(self) -> &'a [f32] {
        std::slice::from_raw_parts(self.ptr as *const f32, self.len)
    }
    /// # Safety
    /// No other view of this slot is used meanwhile (module invariant).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn f32_mut<'a>(self) -> &'a mut [f32] {
        std::slice::from_raw_parts_mut(self.ptr as *mut f32, self.len)
    }
    /// # Safety
    /// As [`Slot::f32`].
    pub unsafe fn i32<'a>(self) -> &'a [i32] {
        std::slice::from_raw_parts(self.ptr as *const i32, self.len)
    }
    /// # Safety
    /// As [`Slot::f32_mut`].
    pub unsafe fn i32_mut<'a>(self) -> &'a mut [i32] {
        std::slice::from_raw_parts_mut(self.ptr as *mut i32, self.len)
    }
    /// Copy host data in (same length; f32, or i32 for i32 and bool).
    ///
    /// # Safety
    /// As [`Slot::f32_mut`].
    pub unsafe fn write(self, data: HostSlice<'_>) {
        match data {
            HostSlice::F32(d) => self.f32_mut().copy_from_slice(d),
            HostSlice::I32(d) => self.i32_mut().copy_from_slice(d),
        }
    }
    /// Copy the contents out (same length).
    ///
    /// # Safety
    /// As [`Slot::f32`].
    pub unsafe fn read(self, out: HostSliceMut<'_>) {
        match out {
            HostSliceMut::F32(o) => o.copy_from_slice(self.f32()),
            HostSliceMut::I32(o) => o.copy_from_slice(self.i32()),
        }
    }
}

/// The reusable lists of slices (moved to `towers_kernels::cpu`, where
/// the families' CPU dispatch fills them).
pub use towers_kernels::cpu::{MutSliceList, SliceList};
