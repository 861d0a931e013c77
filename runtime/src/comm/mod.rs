//! # The communicator seam: collectives across ranks
//!
//! A [`Comm`] is one rank of a group of ranks (processes, or threads standing
//! in for them) that run the same program on their own share of the batch.
//! The plan says *what* is reduced (`Step::AllReduce` over a group of
//! buffers, a gradient bucket); the communicator says *how*: in process
//! ([`LocalComm`], here), over MPI between CPU processes (`MpiComm`, behind
//! the cargo feature `mpi`). Between GPUs the CUDA backend reduces device
//! buffers through NCCL (`cuda::nccl`, feature `nccl`), whose communicator
//! is set up over a `Comm` ([`nccl_id`]).
//!
//! Invariants every implementation keeps and every caller relies on:
//! - **Collective order.** Every rank issues the same collectives, with
//!   buffer groups of the same lengths, in the same order. A rank issues one
//!   collective at a time (a plan orders its collective steps by one stream
//!   or by events); a [`LocalComm`] refuses a second concurrent call.
//! - **Deterministic sums.** [`Comm::all_reduce_sum`] and
//!   [`Comm::reduce_to`] add the ranks' values in rank order (rank 0 +
//!   rank 1 + ...), whatever order the ranks arrive in, so every rank (the
//!   root of a reduce) gets bit-identical results and a run is
//!   reproducible. (NCCL does not promise this across ring/tree choices; its
//!   implementation must say so where it cannot.)
//! - **No allocation per call once warm**: the training step calls
//!   `all_reduce_sum` on its hot path (runtime/tests/no_alloc.rs).
//! - **Errors, not hangs.** A rank that never arrives, or a group whose
//!   lengths disagree, is a [`CommError`] naming the rank and the collective;
//!   a waiting rank gives up after the group's timeout.
//!
//! [`ValueExchange`] (`exchange`) broadcasts each owner's variables between
//! steps (`--variables ps` across processes). The synchronous training step
//! now does this inside the plan (`Step::Broadcast`); the exchange stays
//! for code that updates variables outside a plan, and for its byte
//! counts.
//!
//! World size 1 (one process, the default of every `Session`) is a valid
//! group whose collectives return at once, leaving buffers unchanged.

#[cfg(feature = "mpi")]
pub mod async_ps;
pub mod exchange;
mod local;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "mpi")]
mod mpi_shared;
pub mod nccl_id;
pub mod staleness;

use std::time::Duration;

use thiserror::Error;

#[cfg(feature = "mpi")]
pub use self::async_ps::{AsyncPrograms, AsyncPs, AsyncShard};
#[cfg(feature = "mpi")]
pub use self::mpi::{MpiComm, MpiReduce};
pub use exchange::ValueExchange;
pub use local::LocalComm;
pub use staleness::Staleness;

/// One rank of a communicator group. See the module docs for the contract.
pub trait Comm: Send + Sync {
    /// This rank, `0..world_size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn world_size(&self) -> usize;
    /// Replace every buffer of `group`, in place, by its elementwise sum over
    /// all ranks (added in rank order). Every rank passes the same number of
    /// buffers with the same lengths.
    fn all_reduce_sum(&self, group: &mut [&mut [f32]]) -> Result<(), CommError>;
    /// [`Comm::all_reduce_sum`] delivered to rank `root` alone: on `root`
    /// every buffer of `group` is replaced by its sum over all ranks, added
    /// in rank order, bit-identical to what `all_reduce_sum` gives it; the
    /// other ranks only send theirs (their buffers are left as they were).
    /// The same length check, arrival check and timeout as the others; a
    /// `root` outside the group is [`CommError::BadRoot`]. For the plan's
    /// `Step::Reduce` (`--variables ps`: a gradient bucket to its owner), on
    /// the step's hot path: no allocation once warm.
    fn reduce_to(&self, root: usize, group: &mut [&mut [f32]]) -> Result<(), CommError>;
    /// Overwrite every buffer of `group` with rank `root`'s values.
    fn broadcast(&self, root: usize, group: &mut [&mut [f32]]) -> Result<(), CommError>;
    /// Gather every rank's `send` onto rank `root`: its `recv` gets the
    /// ranks' buffers back to back in rank order, so its length must be the
    /// sum of theirs (lengths may differ between ranks); on the other ranks
    /// `recv` is untouched (pass an empty slice). Every rank learns every
    /// length first, so a wrong `recv` is the same
    /// [`CommError::Mismatch`] on every rank. For the rare, large transfers
    /// of a sharded checkpoint (`--variables ps` across processes: each
    /// owner's optimizer slots to rank 0), not a step's hot path: it may
    /// allocate.
    fn gather_to(&self, root: usize, send: &[f32], recv: &mut [f32]) -> Result<(), CommError>;
    /// Return only once every rank has called `barrier`.
    fn barrier(&self) -> Result<(), CommError>;
    /// A short description for reports, e.g. "in-process, rank 0 of 2".
    fn describe(&self) -> String;
    /// The training step this rank is about to run (named in timeout
    /// reports). The default ignores it.
    fn note_step(&self, _step: u64) {}
    /// `bytes` bytes that the other ranks of this host can address too (an
    /// MPI shared-memory window), for a device arena that holds gradient
    /// buckets: a bucket there is summed in place, with no copy into the
    /// communicator (DDP's gradient-as-bucket-view, across processes).
    /// Collective: every rank calls it in the same order (sizes may differ).
    /// The memory lives as long as the communicator. `None` (the default)
    /// where the communicator has none.
    fn shared_memory(&self, _bytes: usize) -> Option<SharedMemory> {
        None
    }
    /// End the group after a failure on this rank, so the other ranks stop
    /// instead of waiting for it: an MPI job is aborted (this process
    /// included: the call does not return), in-process ranks see this rank
    /// gone. The default does nothing (world size 1).
    fn abort(&self, _code: i32) {}
}

/// Memory lent by [`Comm::shared_memory`].
#[derive(Debug, Clone, Copy)]
pub struct SharedMemory {
    pub ptr: *mut u8,
    pub bytes: usize,
}

/// What went wrong in a collective; each variant names the rank reporting it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CommError {
    #[error("{op} on rank {rank}: the ranks' buffer groups differ (this rank has lengths {mine:?}, rank {other} has {theirs:?}); every rank must reduce the same buckets in the same order")]
    Mismatch { op: &'static str, rank: usize, mine: Vec<usize>, other: usize, theirs: Vec<usize> },

    #[error("{op} on rank {rank}: waited {waited:?} for rank(s) {missing:?}, which never arrived (did a rank fail or skip a collective?)")]
    Timeout { op: &'static str, rank: usize, waited: Duration, missing: Vec<usize> },

    #[error("{op} on rank {rank}: root {root} is not a rank of a group of {world}")]
    BadRoot { op: &'static str, rank: usize, root: usize, world: usize },

    #[error("{op} on rank {rank}: another collective of this rank is still running; a rank's collectives must be ordered (one collective stream, or events)")]
    Concurrent { op: &'static str, rank: usize },

    #[error("{op} on rank {rank}: rank {peer} left the group")]
    PeerGone { op: &'static str, rank: usize, peer: usize },

    #[error("{op} on rank {rank}: {detail}")]
    Transport { op: &'static str, rank: usize, detail: String },
}
