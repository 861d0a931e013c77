//! [`NcclComm`]: the CUDA backend's cross-process all-reduce over NCCL
//! (cargo feature `nccl`, cudarc's `nccl` module, dynamic loading).
//!
//! - **Setup.** Collective over an existing [`Comm`] (MPI under a launcher):
//!   rank 0 makes the NCCL unique id, every rank receives it
//!   ([`crate::comm::nccl_id::exchange_id`]) and joins with
//!   `ncclCommInitRank(world, id, rank)` on the backend's GPU (its context
//!   bound to the calling thread). [`NcclComm::from_id`] takes an id passed
//!   otherwise (a file: [`crate::comm::nccl_id::write_id_file`]).
//! - **The library.** NVIDIA's PyPI wheel (`pip install nvidia-nccl-cu13`)
//!   installs `nvidia/nccl/lib/libnccl.so.2`, a name cudarc does not try
//!   (it tries `libnccl.so`, `libnccl.so.13`, ...): link it once, `ln -s
//!   libnccl.so.2 libnccl.so`, and put the folder on `LD_LIBRARY_PATH`.
//!   The library is probed before any call ([`CudaLibrary::Nccl`]); where
//!   it is missing, setup is the typed error naming it, never a panic.
//! - **The collective.** One `ncclAllReduce(sum, f32)` per bucket, in place
//!   on the bucket's device buffer, enqueued on the plan's collective stream
//!   (the plan's events order it after the gradients and before the
//!   update). Two ranks: every element is `v0 + v1`, which is `v1 + v0` bit
//!   for bit, so both ranks hold the same sum as `MpiComm`'s. More ranks:
//!   NCCL's ring or tree gives the same bits on every rank (each element is
//!   reduced once and the result copied), but not the rank-order
//!   association of `MpiComm`: runs are reproducible for a fixed topology
//!   and NCCL version (`NCCL_ALGO` pins the algorithm), not equal to the
//!   CPU backend's sums bit for bit.
//! - **Limits.** NCCL refuses two ranks on one GPU, so one machine with one
//!   GPU runs world size 1 only (the all-reduce of one rank copies nothing).

use cudarc::nccl::{result, sys};

use super::libs::{check, CudaLibrary, CudaUnavailable};
use crate::comm::nccl_id::{exchange_id, NcclIdError, ID_BYTES};
use crate::comm::Comm;

/// Why an NCCL communicator could not be set up or used.
#[derive(Debug, thiserror::Error)]
pub enum NcclFailure {
    #[error(transparent)]
    Unavailable(#[from] CudaUnavailable),
    #[error(transparent)]
    Id(#[from] NcclIdError),
    #[error("{call} failed with NCCL result {code} on rank {rank} of {world}")]
    Call { call: &'static str, code: i64, rank: usize, world: usize },
}

/// A new NCCL unique id (`ncclGetUniqueId`, rank 0's part of the setup;
/// it needs the library, not a GPU).
pub fn unique_id() -> Result<[u8; ID_BYTES], NcclFailure> {
    check(&[CudaLibrary::Nccl])?;
    let id = result::get_uniqueid().map_err(|e| NcclFailure::Call {
        call: "ncclGetUniqueId",
        code: e.0 as i64,
        rank: 0,
        world: 0,
    })?;
    Ok(std::array::from_fn(|i| id.internal[i] as u8))
}

/// One rank of an NCCL communicator on this process's GPU.
pub struct NcclComm {
    comm: sys::ncclComm_t,
    rank: usize,
    world: usize,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls
// on it do not overlap; the backend uses it from one thread at a time.
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// Join rank `comm.rank()` of `comm.world_size()` on the GPU whose
    /// context is bound to this thread, the id made by rank 0 and passed
    /// over `comm`. Collective over `comm`.
    pub fn over(comm: &dyn Comm) -> Result<NcclComm, NcclFailure> {
        let present = check(&[CudaLibrary::Nccl]);
        let id = exchange_id(comm, || unique_id().map_err(|e| e.to_string()))?;
        present?;
        NcclComm::from_id(&id, comm.rank(), comm.world_size())
    }

    /// Join rank `rank` of `world` with an id passed by other means.
    pub fn from_id(id: &[u8; ID_BYTES], rank: usize, world: usize) -> Result<NcclComm, NcclFailure> {
        check(&[CudaLibrary::Nccl])?;
        let unique = sys::ncclUniqueId { internal: std::array::from_fn(|i| id[i] as std::ffi::c_char) };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out-pointer; the library is present.
        unsafe { result::comm_init_rank(&mut comm, world as i32, unique, rank as i32) }
            .map_err(|e| NcclFailure::Call { call: "ncclCommInitRank", code: e.0 as i64, rank, world })?;
        Ok(NcclComm { comm, rank, world })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// Enqueue the in-place sum over all ranks of the `count` f32 at `ptr`
    /// on `stream`.
    ///
    /// # Safety
    /// `ptr` is a device allocation of at least `count` f32 in this
    /// communicator's context, and `stream` a live stream of that context.
    pub(crate) unsafe fn all_reduce_in_place(
        &self,
        ptr: u64,
        count: usize,
        stream: *mut std::ffi::c_void,
    ) -> Result<(), String> {
        result::all_reduce(
            ptr as *const std::ffi::c_void,
            ptr as *mut std::ffi::c_void,
            count,
            sys::ncclDataType_t::ncclFloat32,
            sys::ncclRedOp_t::ncclSum,
            self.comm,
            stream as _,
        )
        .map(|_| ())
        .map_err(|e| {
            format!("ncclAllReduce failed with NCCL result {} on rank {} of {}", e.0 as i64, self.rank, self.world)
        })
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: a communicator this value created; nothing uses it after.
        unsafe {
            let _ = result::comm_destroy(self.comm);
        }
    }
}
