//! [`MpiComm`]: one MPI process as one rank (Open MPI through the `mpi`
//! crate, rsmpi), behind the cargo feature `mpi` so that a machine without
//! an MPI library still builds and runs everything else.
//!
//! How each collective keeps the [`Comm`] contract:
//! - **Deterministic sums in rank order.** `MPI_Allreduce` does not promise
//!   an order of addition (it depends on the algorithm Open MPI picks for the
//!   message size and the number of ranks), so the bucket is all-gathered
//!   (`MPI_Allgather`, one call per bucket, the group packed into one
//!   contiguous message) and every rank adds the ranks' copies in rank order
//!   itself: bit-identical results on every rank, run after run. The price is
//!   `world_size` copies of the bucket in scratch memory and `world_size - 1`
//!   bucket sizes received per rank; a ring reduce-scatter in rank order
//!   would need less, and can replace this behind the same trait.
//! - **Errors, not hangs, on a mismatch.** Before each collective the ranks
//!   all-gather their group's total length (8 bytes each); if the lengths
//!   differ, every rank returns the same [`CommError::Mismatch`] instead of
//!   posting mismatched messages.
//! - **No allocation once warm.** The packing and gather buffers live in the
//!   communicator and only grow.
//! - **One collective at a time.** MPI is initialized with
//!   `MPI_THREAD_MULTIPLE` where the library provides it (else
//!   `MPI_THREAD_SERIALIZED`), and every call goes through one mutex, so
//!   the device threads of the CPU backend may call from any thread. The
//!   order of collectives must still be the same on every rank (the
//!   module contract).
//!
//! Run under a launcher (`mpirun -np 4 BIN`): each process is one rank.
//! Without one, `MPI_Init` makes a singleton: world size 1, and every
//! collective returns at once with the buffers unchanged.

use std::sync::Mutex;

use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use mpi::Threading;

use super::{Comm, CommError};

/// The MPI state the mutex guards. Fields drop in order: the communicator
/// first, then the universe, whose drop finalizes MPI.
struct Inner {
    world: SimpleCommunicator,
    _universe: Universe,
    /// Every rank's total group length (one per rank).
    lens: Vec<u64>,
    /// This rank's group, packed.
    send: Vec<f32>,
    /// Every rank's packed group, rank after rank.
    recv: Vec<f32>,
}

// SAFETY: MPI was initialized with at least MPI_THREAD_SERIALIZED, which
// allows MPI calls from any thread as long as no two run at once; every use
// of `Inner` (and so of the communicator and the universe) happens under the
// `Mutex` of `MpiComm`, which serializes them.
unsafe impl Send for Inner {}

/// One MPI process as one rank of `MPI_COMM_WORLD`. See the module docs.
pub struct MpiComm {
    inner: Mutex<Inner>,
    rank: usize,
    world: usize,
    threading: Threading,
}

impl MpiComm {
    /// Initialize MPI (once per process) and take `MPI_COMM_WORLD`. An
    /// error when MPI was already initialized in this process or when the
    /// library cannot serve calls from several threads.
    pub fn init() -> Result<MpiComm, CommError> {
        let transport = |detail: String| CommError::Transport { op: "MPI_Init", rank: 0, detail };
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple).ok_or_else(|| {
            transport("MPI is already initialized in this process; create one MpiComm per process and share it".into())
        })?;
        if threading < Threading::Serialized {
            return Err(transport(format!(
                "the MPI library provides thread level {threading:?}; towers needs MPI_THREAD_SERIALIZED or better"
            )));
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let inner = Inner { world, _universe: universe, lens: Vec::new(), send: Vec::new(), recv: Vec::new() };
        Ok(MpiComm { inner: Mutex::new(inner), rank, world: size, threading })
    }

    /// The thread level MPI granted.
    pub fn threading(&self) -> Threading {
        self.threading
    }

    fn lock(&self, op: &'static str) -> Result<std::sync::MutexGuard<'_, Inner>, CommError> {
        self.inner.lock().map_err(|_| CommError::Transport {
            op,
            rank: self.rank,
            detail: "an earlier collective panicked on this rank".into(),
        })
    }

    /// All-gather every rank's group length; a mismatch is the same error on every rank.
    fn check_lengths(&self, inner: &mut Inner, op: &'static str, group: &[&mut [f32]]) -> Result<(), CommError> {
        let mine: u64 = group.iter().map(|b| b.len() as u64).sum();
        inner.lens.resize(self.world, 0);
        let Inner { world, lens, .. } = inner;
        world.all_gather_into(&mine, &mut lens[..]);
        if let Some(other) = lens.iter().position(|&l| l != mine) {
            return Err(CommError::Mismatch {
                op,
                rank: self.rank,
                mine: vec![mine as usize],
                other,
                theirs: vec![lens[other] as usize],
            });
        }
        Ok(())
    }

    /// Pack `group` into `inner.send`.
    fn pack(inner: &mut Inner, group: &[&mut [f32]]) {
        inner.send.clear();
        for b in group {
            inner.send.extend_from_slice(b);
        }
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&self, group: &mut [&mut [f32]]) -> Result<(), CommError> {
        if self.world == 1 {
            return Ok(());
        }
        let op = "all_reduce_sum";
        let mut guard = self.lock(op)?;
        let inner = &mut *guard;
        self.check_lengths(inner, op, group)?;
        Self::pack(inner, group);
        let n = inner.send.len();
        inner.recv.resize(n * self.world, 0.0);
        let Inner { world, send, recv, .. } = inner;
        world.all_gather_into(&send[..], &mut recv[..]);
        // Rank order: rank 0's values, plus rank 1's, plus ...
        let mut at = 0;
        for b in group.iter_mut() {
            for (i, x) in b.iter_mut().enumerate() {
                let mut s = recv[at + i];
                for r in 1..self.world {
                    s += recv[r * n + at + i];
                }
                *x = s;
            }
            at += b.len();
        }
        Ok(())
    }

    fn broadcast(&self, root: usize, group: &mut [&mut [f32]]) -> Result<(), CommError> {
        let op = "broadcast";
        if root >= self.world {
            return Err(CommError::BadRoot { op, rank: self.rank, root, world: self.world });
        }
        if self.world == 1 {
            return Ok(());
        }
        let mut guard = self.lock(op)?;
        let inner = &mut *guard;
        self.check_lengths(inner, op, group)?;
        Self::pack(inner, group);
        let Inner { world, send, .. } = inner;
        world.process_at_rank(root as i32).broadcast_into(&mut send[..]);
        let mut at = 0;
        for b in group.iter_mut() {
            let len = b.len();
            b.copy_from_slice(&send[at..at + len]);
            at += len;
        }
        Ok(())
    }

    fn barrier(&self) -> Result<(), CommError> {
        if self.world > 1 {
            self.lock("barrier")?.world.barrier();
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("MPI, rank {} of {}", self.rank, self.world)
    }
}
