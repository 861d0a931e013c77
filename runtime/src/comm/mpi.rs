//! [`MpiComm`]: one MPI process as one rank (Open MPI through the `mpi`
//! crate, rsmpi), behind the cargo feature `mpi` so that a machine without
//! an MPI library still builds and runs everything else.
//!
//! How each collective keeps the [`Comm`] contract:
//! - **Deterministic sums in rank order**, on one of two paths
//!   ([`MpiReduce`]):
//!   - *shared memory* (the default when every rank runs on this host):
//!     an MPI-3 shared-memory window, reduce-scatter then all-gather with
//!     plain loads and stores and two node barriers per bucket
//!     ([`mpi_shared`](super::mpi_shared)); each element is added by one
//!     rank in rank order. A bucket that lies in memory this communicator
//!     lent ([`Comm::shared_memory`]: the CPU backend puts each arena holding
//!     buckets there), at the same offset on every rank, is summed where it
//!     lies, with no copy into the window;
//!   - *library* (ranks on several hosts, or asked for): two ranks use
//!     `MPI_Allreduce` (whatever algorithm Open MPI picks, every element is
//!     `v0 + v1`, which is `v1 + v0` bit for bit); more ranks all-gather the
//!     bucket (`MPI_Allgather`, one call per bucket, the group packed into
//!     one contiguous message) and every rank adds the copies in rank order
//!     itself, since `MPI_Allreduce` promises no order of addition.
//!
//!   Both give bit-identical results on every rank, run after run, and the
//!   same bits as each other.
//! - **Errors, not hangs, on a mismatch.** Before each collective the ranks
//!   exchange their group's total length (8 bytes to and from every other
//!   rank, non-blocking); if the lengths differ, every rank returns the same
//!   [`CommError::Mismatch`] instead of posting mismatched messages.
//! - **No rank waits forever.** That exchange is also the arrival check: a
//!   rank polls it until every other rank's length arrived or the timeout
//!   passed ([`MpiComm::init_with_timeout`], default
//!   [`super::local::DEFAULT_TIMEOUT`]). On a timeout it prints which rank(s)
//!   never arrived, at which step ([`Comm::note_step`]) and in which
//!   collective, and ends the whole job with `MPI_Abort`, so the launcher
//!   stops every rank, the hung one included. The shared-memory path's
//!   barriers inside the reduce have the same deadline and the same end
//!   ([`mpi_shared`](super::mpi_shared)), so a rank stopped in the middle
//!   of a collective is caught too (tests/mpi_faults.rs). The data of
//!   `reduce_to` and `broadcast` (the parameter servers' every step) moves
//!   as non-blocking point-to-point messages waited on with the same
//!   deadline. The library path's `MPI_Allreduce`/`MPI_Allgather` and
//!   `gather_to` (`MPI_Gatherv`, at checkpoints) after a completed arrival
//!   check still block inside Open MPI. (A rank that dies is seen by
//!   the launcher itself: `mpirun` then ends the others.) MPI cannot take
//!   back a posted message, so returning an error with the exchange still
//!   pending would leave MPI writing into freed memory; aborting is the only
//!   safe end. Checkpoints are written atomically (rename), so none is ever
//!   left half-written.
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

use std::os::raw::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use mpi::Threading;

use super::mpi_shared::SharedWindow;
use super::{Comm, CommError};

/// How [`MpiComm`] all-reduces a bucket (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpiReduce {
    /// Shared memory when every rank runs on this host, else the library.
    Auto,
    /// Always the MPI library's collectives (`MPI_Allreduce` / `MPI_Allgather`).
    Library,
}

/// The MPI state the mutex guards. Fields drop in order: the communicator
/// first, then the universe, whose drop finalizes MPI.
struct Inner {
    /// The shared-memory path, when chosen (freed before the world).
    shared: Option<SharedWindow>,
    world: SimpleCommunicator,
    _universe: Universe,
    /// Every rank's total group length (one per rank).
    /// Every rank's (group length, lent arena + 1 or 0, offset in it).
    lens: Vec<[u64; 3]>,
    /// The arrival exchange's requests: (peer, is a receive, done, handle).
    reqs: Vec<(usize, bool, bool, ffi::MPI_Request)>,
    /// Collectives issued so far (names the one that timed out).
    issued: u64,
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
    timeout: Duration,
    /// The training step in progress ([`Comm::note_step`]), for the timeout message.
    step: AtomicU64,
}

/// The exit code of a job ended by a collective's timeout.
pub const TIMEOUT_EXIT_CODE: i32 = 124;

/// The tag of the arrival exchange's messages.
const ARRIVAL_TAG: i32 = 0x7077;
/// The tag of `reduce_to`'s and `broadcast`'s data messages.
const DATA_TAG: i32 = 0x7078;

impl MpiComm {
    /// Initialize MPI (once per process) and take `MPI_COMM_WORLD`. An
    /// error when MPI was already initialized in this process or when the
    /// library cannot serve calls from several threads.
    pub fn init() -> Result<MpiComm, CommError> {
        MpiComm::init_with_timeout(super::local::DEFAULT_TIMEOUT)
    }

    /// As [`MpiComm::init`], ending the job when a collective waits longer
    /// than `timeout` for another rank (see the module docs).
    pub fn init_with_timeout(timeout: Duration) -> Result<MpiComm, CommError> {
        MpiComm::init_with(timeout, MpiReduce::Auto)
    }

    /// As [`MpiComm::init_with_timeout`], reducing buckets on the path
    /// `reduce` picks. Collective: every rank must pass the same `reduce`.
    pub fn init_with(timeout: Duration, reduce: MpiReduce) -> Result<MpiComm, CommError> {
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
        let shared = match reduce {
            MpiReduce::Auto if size > 1 => SharedWindow::for_world(&world, timeout),
            _ => None,
        };
        let inner = Inner {
            shared,
            world,
            _universe: universe,
            lens: vec![[0; 3]; size],
            reqs: Vec::with_capacity(2 * size),
            issued: 0,
            send: Vec::new(),
            recv: Vec::new(),
        };
        Ok(MpiComm { inner: Mutex::new(inner), rank, world: size, threading, timeout, step: AtomicU64::new(0) })
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

    /// Exchange every rank's group length (the arrival check, see the module
    /// docs); a mismatch is the same error on every rank, a rank that does
    /// not arrive within the timeout ends the job.
    fn check_lengths(&self, inner: &mut Inner, op: &'static str, group: &[&mut [f32]]) -> Result<(), CommError> {
        let mine: u64 = group.iter().map(|b| b.len() as u64).sum();
        // Where a single buffer lies in lent shared memory: (arena + 1, offset).
        let lent = match (&inner.shared, group) {
            (Some(s), [b]) => s.locate(b.as_ptr()).map_or([0, 0], |(a, o)| [a as u64 + 1, o as u64]),
            _ => [0, 0],
        };
        self.arrive(inner, op, [mine, lent[0], lent[1]]);
        if let Some(other) = inner.lens.iter().position(|l| l[0] != mine) {
            return Err(CommError::Mismatch {
                op,
                rank: self.rank,
                mine: vec![mine as usize],
                other,
                theirs: vec![inner.lens[other][0] as usize],
            });
        }
        Ok(())
    }

    /// The arrival exchange: every rank's `entry` into `inner.lens`, waiting
    /// at most the timeout (then the job is aborted, see the module docs).
    fn arrive(&self, inner: &mut Inner, op: &'static str, entry: [u64; 3]) {
        inner.issued += 1;
        inner.lens.resize(self.world, [0; 3]);
        inner.lens[self.rank] = entry;
        inner.reqs.clear();
        let comm = inner.world.as_raw();
        let dt = u64::equivalent_datatype().as_raw();
        for peer in (0..self.world).filter(|&p| p != self.rank) {
            // SAFETY: `lens` is not resized or read until every request
            // completed (below) or the job is aborted; each receive writes
            // only element `peer`, the sends read only element `rank`.
            unsafe {
                let base = inner.lens.as_mut_ptr();
                let mut recv: ffi::MPI_Request = ffi::RSMPI_REQUEST_NULL;
                ffi::MPI_Irecv(base.add(peer) as *mut c_void, 3, dt, peer as i32, ARRIVAL_TAG, comm, &mut recv);
                inner.reqs.push((peer, true, false, recv));
                let mut send: ffi::MPI_Request = ffi::RSMPI_REQUEST_NULL;
                ffi::MPI_Isend(base.add(self.rank) as *const c_void, 3, dt, peer as i32, ARRIVAL_TAG, comm, &mut send);
                inner.reqs.push((peer, false, false, send));
            }
        }
        self.wait_all(inner, op);
    }

    /// Wait for every request in `inner.reqs`, at most the timeout (then
    /// the job is aborted naming the peers whose messages are still pending,
    /// see the module docs).
    fn wait_all(&self, inner: &mut Inner, op: &'static str) {
        let deadline = Instant::now() + self.timeout;
        let started = Instant::now();
        loop {
            let mut all = true;
            for (_, _, done, req) in inner.reqs.iter_mut().filter(|r| !r.2) {
                let mut flag = 0;
                // SAFETY: `req` is an active request this loop posted.
                unsafe { ffi::MPI_Test(req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                *done = flag != 0;
                all &= *done;
            }
            if all {
                break;
            }
            if Instant::now() >= deadline {
                let mut missing: Vec<usize> = inner.reqs.iter().filter(|r| !r.2).map(|r| r.0).collect();
                missing.dedup();
                let e = CommError::Timeout { op, rank: self.rank, waited: self.timeout, missing };
                self.report_timeout(&e, inner.issued);
                inner.world.abort(TIMEOUT_EXIT_CODE);
            }
            // The ranks of a step arrive within milliseconds of each other:
            // poll, yielding the core to this process's compute threads, for
            // up to 50 ms, then sleep 1 ms between polls (a rank far behind).
            if started.elapsed() < Duration::from_millis(50) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// The data phase of `reduce_to` and `broadcast`: post each message of
    /// `posts` (peer, receive or send, first f32, count) as non-blocking
    /// point-to-point and wait for all of them with the arrival check's
    /// deadline, so a rank stopped between the arrival check and the data
    /// ends the job instead of hanging it (a blocking `MPI_Gather` or
    /// `MPI_Bcast` there waited forever). Messages of one pair of ranks are
    /// matched in the order posted (MPI's non-overtaking rule), and every
    /// rank issues the collectives in the same order.
    ///
    /// # Safety
    /// Every pointer is valid for its count (receives: for writes) until
    /// this returns, and no two receives overlap.
    unsafe fn exchange_data(
        &self,
        inner: &mut Inner,
        op: &'static str,
        posts: impl Iterator<Item = (usize, bool, *mut f32, usize)>,
    ) -> Result<(), CommError> {
        inner.reqs.clear();
        let comm = inner.world.as_raw();
        let dt = f32::equivalent_datatype().as_raw();
        for (peer, recv, ptr, len) in posts {
            let count = i32::try_from(len).map_err(|_| CommError::Transport {
                op,
                rank: self.rank,
                detail: format!("{len} values in one message exceed MPI's count; use smaller buckets (--bucket-mb)"),
            })?;
            let mut req: ffi::MPI_Request = ffi::RSMPI_REQUEST_NULL;
            // SAFETY: the caller's contract (valid, non-overlapping buffers
            // until every request completed, below, or the job is aborted).
            unsafe {
                if recv {
                    ffi::MPI_Irecv(ptr as *mut c_void, count, dt, peer as i32, DATA_TAG, comm, &mut req);
                } else {
                    ffi::MPI_Isend(ptr as *const c_void, count, dt, peer as i32, DATA_TAG, comm, &mut req);
                }
            }
            inner.reqs.push((peer, recv, false, req));
        }
        self.wait_all(inner, op);
        Ok(())
    }

    /// Print a collective's timeout `e` (the job is aborted next): which
    /// rank, at which step and collective.
    fn report_timeout(&self, e: &CommError, issued: u64) {
        eprintln!(
            "error: rank {} of {}, step {}, collective {issued} of this run: {e}; ending every rank (MPI_Abort)",
            self.rank,
            self.world,
            self.step.load(Ordering::Relaxed),
        );
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
        // One buffer (a bucket the plan laid out contiguously) is sent as
        // it is; several are packed into one message first.
        let single = group.len() == 1;
        if !single {
            Self::pack(inner, group);
        }
        let n: usize = group.iter().map(|b| b.len()).sum();
        if let Some(shared) = inner.shared.as_mut() {
            let transport = |detail| CommError::Transport { op, rank: self.rank, detail };
            let issued = inner.issued;
            let on_timeout = |missing: &[usize], waited: Duration| {
                let e = CommError::Timeout { op, rank: self.rank, waited, missing: missing.to_vec() };
                self.report_timeout(&e, issued);
            };
            let here = inner.lens[self.rank];
            if single && here[1] > 0 && inner.lens.iter().all(|l| l[1..] == here[1..]) {
                // Every rank's bucket sits at the same place of a lent arena:
                // summed where it lies, no copy in.
                shared.all_reduce_lent(here[1] as usize - 1, here[2] as usize, n, &on_timeout).map_err(transport)?;
                return Ok(());
            }
            if single {
                shared.all_reduce_sum(&mut group[0][..], &on_timeout).map_err(transport)?;
            } else {
                shared.all_reduce_sum(&mut inner.send[..], &on_timeout).map_err(transport)?;
                let mut at = 0;
                for b in group.iter_mut() {
                    b.copy_from_slice(&inner.send[at..at + b.len()]);
                    at += b.len();
                }
            }
            return Ok(());
        }
        // Two ranks: IEEE addition is commutative, so whatever algorithm
        // MPI_Allreduce picks, every element is v0 + v1 (= v1 + v0) bit for
        // bit on both ranks, the rank-order sum, with half the traffic of a
        // gather. More ranks: gather every rank's copy, then add in rank order.
        let copies = if self.world == 2 { 1 } else { self.world };
        inner.recv.resize(n * copies, 0.0);
        let Inner { world, send, recv, .. } = inner;
        let mine: &[f32] = if single { &group[0][..] } else { &send[..] };
        if copies == 1 {
            world.all_reduce_into(mine, &mut recv[..], SystemOperation::sum());
        } else {
            world.all_gather_into(mine, &mut recv[..]);
        }
        // recv[..n] is the sum (two ranks) or rank 0's copy; later copies are
        // added slice by slice, so the adds vectorize in the same association.
        let mut at = 0;
        for b in group.iter_mut() {
            let len = b.len();
            b.copy_from_slice(&recv[at..at + len]);
            for r in 1..copies {
                let theirs = &recv[r * n + at..r * n + at + len];
                for (x, y) in b.iter_mut().zip(theirs) {
                    *x += *y;
                }
            }
            at += len;
        }
        Ok(())
    }

    fn reduce_to(&self, root: usize, group: &mut [&mut [f32]]) -> Result<(), CommError> {
        let op = "reduce";
        if root >= self.world {
            return Err(CommError::BadRoot { op, rank: self.rank, root, world: self.world });
        }
        if self.world == 1 {
            return Ok(());
        }
        let mut guard = self.lock(op)?;
        let inner = &mut *guard;
        self.check_lengths(inner, op, group)?;
        let single = group.len() == 1;
        if !single {
            Self::pack(inner, group);
        }
        let n: usize = group.iter().map(|b| b.len()).sum();
        // Gather every rank's copy onto the root (MPI_Reduce does not
        // promise an order of additions), then add them there in rank order,
        // as `all_reduce_sum` does: ((v0 + v1) + v2) + ...
        let mine: *mut f32 = if single { group[0].as_mut_ptr() } else { inner.send.as_mut_ptr() };
        if self.rank != root {
            // SAFETY: `mine` (the single buffer or the packed copy) holds
            // `n` values and outlives the wait.
            unsafe { self.exchange_data(inner, op, std::iter::once((root, false, mine, n)))? };
            return Ok(());
        }
        inner.recv.resize(n * self.world, 0.0);
        let base = inner.recv.as_mut_ptr();
        let world = self.world;
        // SAFETY (`base.add`): `recv` holds `world * n` values.
        let posts = (0..world).filter(|&r| r != root).map(|r| (r, true, unsafe { base.add(r * n) }, n));
        // SAFETY: each receive writes its own `n` values of `recv`, which is
        // not resized before the wait ends.
        unsafe { self.exchange_data(inner, op, posts)? };
        // The root's own copy, in its place.
        // SAFETY: `mine` holds `n` values; `recv` is another allocation.
        unsafe { std::ptr::copy_nonoverlapping(mine, inner.recv.as_mut_ptr().add(root * n), n) };
        let recv = &inner.recv;
        let mut off = 0;
        for b in group.iter_mut() {
            let len = b.len();
            b.copy_from_slice(&recv[off..off + len]);
            for r in 1..self.world {
                for (x, y) in b.iter_mut().zip(&recv[r * n + off..r * n + off + len]) {
                    *x += *y;
                }
            }
            off += len;
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
        let (ptr, n) = (inner.send.as_mut_ptr(), inner.send.len());
        let (rank, world) = (self.rank, self.world);
        let posts = (0..world).filter(|&r| r != rank && (rank == root || r == root)).map(|r| (r, rank != root, ptr, n));
        // SAFETY: `send` holds `n` values and is not touched before the wait
        // ends; the root only reads it, a receiver has one receive into it.
        unsafe { self.exchange_data(inner, op, posts)? };
        let send = &inner.send;
        let mut at = 0;
        for b in group.iter_mut() {
            let len = b.len();
            b.copy_from_slice(&send[at..at + len]);
            at += len;
        }
        Ok(())
    }

    fn gather_to(&self, root: usize, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        let op = "gather";
        if root >= self.world {
            return Err(CommError::BadRoot { op, rank: self.rank, root, world: self.world });
        }
        if self.world == 1 {
            if recv.len() != send.len() {
                return Err(CommError::Mismatch {
                    op,
                    rank: 0,
                    mine: vec![recv.len()],
                    other: 0,
                    theirs: vec![send.len()],
                });
            }
            recv.copy_from_slice(send);
            return Ok(());
        }
        let mut guard = self.lock(op)?;
        let inner = &mut *guard;
        // Every rank's length, and the root's recv length: the same check on every rank.
        let want = if self.rank == root { recv.len() as u64 } else { 0 };
        self.arrive(inner, op, [send.len() as u64, want, 0]);
        let counts: Vec<i32> = inner.lens.iter().map(|l| l[0] as i32).collect();
        let total: u64 = inner.lens.iter().map(|l| l[0]).sum();
        if inner.lens[root][1] != total || total > i32::MAX as u64 {
            return Err(CommError::Mismatch {
                op,
                rank: self.rank,
                mine: vec![total as usize],
                other: root,
                theirs: vec![inner.lens[root][1] as usize],
            });
        }
        let at = inner.world.process_at_rank(root as i32);
        if self.rank == root {
            let displs: Vec<i32> = counts.iter().scan(0, |a, &c| Some(std::mem::replace(a, *a + c))).collect();
            let mut part = mpi::datatype::PartitionMut::new(recv, counts, displs);
            at.gather_varcount_into_root(send, &mut part);
        } else {
            at.gather_varcount_into(send);
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
        let path = match self.inner.lock() {
            Ok(inner) if inner.shared.is_some() => ", shared memory",
            _ => "",
        };
        format!("MPI, rank {} of {}{path}", self.rank, self.world)
    }

    fn shared_memory(&self, bytes: usize) -> Option<super::SharedMemory> {
        if self.world == 1 {
            return None;
        }
        let mut inner = self.inner.lock().ok()?;
        inner.shared.as_mut()?.lend(bytes).ok()
    }

    fn note_step(&self, step: u64) {
        self.step.store(step, Ordering::Relaxed);
    }

    fn abort(&self, code: i32) {
        if self.world > 1 {
            // Ends every process of the job, this one included.
            if let Ok(inner) = self.inner.lock() {
                inner.world.abort(code);
            }
        }
    }
}
