//! Where the host's memory comes from: ordinary (pageable) allocations, or
//! page-locked memory a GPU's copy engines can read and write directly
//! (the CUDA backend's pinned allocator, `cuMemHostAlloc`). The CPU
//! backend allocates its arenas and variables through a [`HostMemory`], so
//! the host device of a mixed session (`cpu:*` on the host, `gpu:*` on
//! CUDA contexts) lives in pinned memory, and the bridge's event flags too.
//!
//! Invariant: a [`HostBlock`] is zeroed, 4-byte aligned, at least as long
//! as asked, and stays valid and unmoved until it is dropped.

use std::any::Any;
use std::ptr::NonNull;

/// One allocation of host memory; see the module docs.
pub struct HostBlock {
    ptr: NonNull<u8>,
    bytes: usize,
    /// What keeps the memory alive (a boxed slice, a pinned allocation).
    _owner: Box<dyn Any + Send + Sync>,
}

// SAFETY: the block is plain memory; its users synchronize access.
unsafe impl Send for HostBlock {}
unsafe impl Sync for HostBlock {}

impl HostBlock {
    /// A block of `bytes` bytes at `ptr`, kept alive by `owner`.
    ///
    /// # Safety
    /// `ptr` must be 4-byte aligned and point to `bytes` zeroed, writable
    /// bytes that stay valid and unmoved while `owner` lives, used by
    /// nothing else.
    pub unsafe fn from_raw(ptr: NonNull<u8>, bytes: usize, owner: Box<dyn Any + Send + Sync>) -> HostBlock {
        HostBlock { ptr, bytes, _owner: owner }
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// An allocator of host memory; see the module docs.
pub trait HostMemory: Send + Sync {
    /// A zeroed block of at least `bytes` bytes (4-byte aligned).
    fn alloc(&self, bytes: usize) -> Result<HostBlock, String>;
    /// Whether its blocks are page-locked (a GPU copies them directly).
    fn pinned(&self) -> bool;
}

/// Ordinary host memory (the CPU backend's default).
#[derive(Debug, Default, Clone, Copy)]
pub struct Pageable;

impl HostMemory for Pageable {
    fn alloc(&self, bytes: usize) -> Result<HostBlock, String> {
        let cells: Box<[std::cell::UnsafeCell<u32>]> =
            (0..bytes.div_ceil(4)).map(|_| std::cell::UnsafeCell::new(0)).collect();
        let ptr =
            NonNull::new(std::cell::UnsafeCell::raw_get(cells.as_ptr()) as *mut u8).unwrap_or(NonNull::dangling());
        let bytes = cells.len() * 4;
        // SAFETY: the boxed slice is zeroed, aligned for u32, owned by the
        // block and never moved (a box's contents stay put).
        Ok(unsafe { HostBlock::from_raw(ptr, bytes, Box::new(SendCells(cells))) })
    }
    fn pinned(&self) -> bool {
        false
    }
}

/// The cells behind a pageable block (only ever accessed through its pointer).
struct SendCells(#[allow(dead_code)] Box<[std::cell::UnsafeCell<u32>]>);
// SAFETY: the cells are accessed only through the block's pointer, whose
// users synchronize (see `cpu::mem`).
unsafe impl Send for SendCells {}
unsafe impl Sync for SendCells {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pageable_blocks_are_zeroed_aligned_and_long_enough() {
        let b = Pageable.alloc(10).expect("alloc");
        assert!(b.bytes() >= 10);
        assert_eq!(b.ptr() as usize % 4, 0);
        // SAFETY: the block is ours and at least 10 bytes long.
        let s = unsafe { std::slice::from_raw_parts(b.ptr(), 10) };
        assert!(s.iter().all(|&x| x == 0));
        assert!(!Pageable.pinned());
    }
}
