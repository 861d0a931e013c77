//! Page-locked host memory as a [`HostMemory`]: what a mixed session's host
//! device (`cpu:*` arenas and variables) and the bridge's event flags are
//! allocated from when a CUDA part takes part ([`CudaBackend::pinned_host`]).
//!
//! Each block is one `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`
//! (pinned for every context of the process, so each logical GPU's context
//! copies it by DMA) and `CU_MEMHOSTALLOC_DEVICEMAP` (mapped into the
//! device address space, so a stream's memory operations can write and
//! wait on a flag in it: [`device_address`]).
//!
//! Invariants: a block is zeroed before it is handed out, page-aligned
//! (so 4-byte aligned), and freed exactly once, by its owner's drop, with
//! the context it was allocated in bound to the dropping thread; an
//! allocation failure is an error naming the size, never a panic.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{result as drv, sys, CudaContext};

use super::driver::derr;
use super::CudaBackend;
use crate::host_memory::{HostBlock, HostMemory};

/// The flags of every pinned block; see the module docs.
pub(crate) const PINNED_FLAGS: u32 = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;

/// An allocator of page-locked host memory through one CUDA context; see
/// the module docs.
pub struct PinnedHost {
    ctx: Arc<CudaContext>,
}

/// One pinned allocation, freed on drop.
struct PinnedAlloc {
    ptr: *mut c_void,
    ctx: Arc<CudaContext>,
}

// SAFETY: the allocation is plain host memory whose users synchronize
// access (see `HostBlock`); the context handle is thread-safe.
unsafe impl Send for PinnedAlloc {}
unsafe impl Sync for PinnedAlloc {}

impl Drop for PinnedAlloc {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by `PinnedHost::alloc`, freed once; the users of
        // the block (copies, stream memory operations) completed before the
        // block was dropped (the part synchronizes every step).
        let _ = unsafe { drv::free_host(self.ptr) };
    }
}

impl PinnedHost {
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> PinnedHost {
        PinnedHost { ctx: Arc::clone(ctx) }
    }
}

impl HostMemory for PinnedHost {
    fn alloc(&self, bytes: usize) -> Result<HostBlock, String> {
        self.ctx.bind_to_thread().map_err(|e| derr("cuCtxSetCurrent", e))?;
        let n = bytes.max(4).div_ceil(4) * 4;
        // SAFETY: a plain page-locked allocation in the bound context.
        let ptr = unsafe { drv::malloc_host(n, PINNED_FLAGS) }
            .map_err(|e| derr(&format!("cuMemHostAlloc of {n} bytes of pinned host memory"), e))?;
        let Some(nn) = NonNull::new(ptr as *mut u8) else {
            return Err(format!("cuMemHostAlloc of {n} bytes returned a null pointer"));
        };
        let owner = PinnedAlloc { ptr, ctx: Arc::clone(&self.ctx) };
        // SAFETY: `n` writable bytes at `ptr`, owned by `owner` alone.
        unsafe { std::ptr::write_bytes(nn.as_ptr(), 0, n) };
        // SAFETY: page-aligned, zeroed, `n >= bytes` bytes, valid and
        // unmoved until `owner` (moved into the block) is dropped.
        Ok(unsafe { HostBlock::from_raw(nn, n, Box::new(owner)) })
    }

    fn pinned(&self) -> bool {
        true
    }
}

/// The device address of host address `host` in memory from
/// [`PinnedHost`] (mapped with `CU_MEMHOSTALLOC_DEVICEMAP`), as seen by the
/// context bound to the calling thread; an error when the memory is not
/// mapped pinned memory (e.g. pageable).
pub(crate) fn device_address(host: usize) -> Result<sys::CUdeviceptr, String> {
    super::libs::driver_exports(&["cuMemHostGetDevicePointer_v2"], "mapping a bridged event's flag")?;
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: the driver only looks the address up; flags must be 0.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host as *mut c_void, 0) }
        .result()
        .map_err(|e| derr(&format!("cuMemHostGetDevicePointer of host address {host:#x}"), e))?;
    Ok(dptr)
}

impl CudaBackend {
    /// Page-locked host memory for a mixed session's host device and
    /// bridge, allocated through this backend's context (see the module
    /// docs of `pinned`).
    pub fn pinned_host(&self) -> Arc<dyn HostMemory> {
        Arc::new(PinnedHost::new(&self.ctx))
    }
}
