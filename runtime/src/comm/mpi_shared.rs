//! [`SharedWindow`]: [`super::MpiComm`]'s all-reduce when every rank runs on
//! one host, through an MPI-3 shared-memory window (`MPI_Win_allocate_shared`
//! over the node communicator of `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`).
//!
//! Every rank maps every other rank's segment of the window, so a bucket is
//! reduced with plain loads and stores, reduce-scatter then all-gather, and
//! the only synchronization per bucket is two barriers over the node
//! (each framed by `MPI_Win_sync`, MPI's memory model for shared windows).
//! A barrier is an arrival counter per rank in a small window of its own
//! (one cache line each): a rank publishes its count (release) and polls
//! the others' (acquire) until each reached it or the communicator's
//! timeout passed; then it names the ranks that never arrived and ends the
//! job (`MPI_Abort`), as the arrival check of [`super::MpiComm`] does. No
//! rank waits forever, even for a rank stopped inside a collective. For a bucket of `n` floats over `W` ranks, with chunk
//! `q` the `q`-th of `W` near-equal, 64-byte-aligned slices:
//! 1. each rank `r` stores its values of every chunk `q != r` into its own
//!    segment (its chunk `r` stays in its own buffer);
//! 2. barrier;
//! 3. rank `r` adds chunk `r` over all ranks **in rank order**
//!    (`v0 + v1 + ... + v(W-1)`, reading the others' segments and its own
//!    buffer), writes the sum into its buffer and into its segment's chunk
//!    `r` (a slot step 1 left free);
//! 4. barrier;
//! 5. rank `r` copies every other chunk's sum from its owner's segment.
//!
//! Invariants:
//! - **Rank-order sums, identical bits on every rank**: each element is
//!   added by exactly one rank in rank order and copied to the others, so
//!   the result equals the gather-and-add path of [`super::MpiComm`] (and
//!   `MPI_Allreduce` for two ranks, where `a + b == b + a`) bit for bit.
//! - **No race between consecutive collectives**: the window holds two
//!   halves used alternately. Collective `k + 2` writes the half collective
//!   `k` read in step 5 only after passing collective `k + 1`'s barriers,
//!   which every rank reaches after finishing collective `k`.
//! - **No allocation once warm**: the window grows (a collective free and
//!   re-allocation, every rank at the same call because the lengths were
//!   checked equal first) only when a larger bucket than any before comes;
//!   a plan's buckets are fixed, so only the first step allocates.
//! - Callers hold [`super::MpiComm`]'s mutex and have completed the arrival
//!   exchange; a rank that stops or dies after it (inside the collective)
//!   is caught by the barriers' deadline (a rank that dies is also the
//!   launcher's to report).
//! - Every rank passes the barriers the same number of times (collectives
//!   run in the same order on every rank), so the counters never differ by
//!   more than one barrier.

use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives;

/// Floats per cache line: chunk and segment bounds are multiples of it, so
/// no two ranks write the same line.
const LINE: usize = 16;

/// Every rank's segment of a window: its address and size in bytes, by rank.
type Segments = Vec<(*mut u8, usize)>;

/// A new shared-memory window over `node` with `bytes` bytes in this rank's
/// segment (collective; sizes may differ between ranks), locked for
/// passive access: the window and every rank's segment (address, bytes).
fn allocate_window(node: &SimpleCommunicator, bytes: usize) -> Result<(ffi::MPI_Win, Segments), String> {
    let mut base: *mut c_void = ptr::null_mut();
    // SAFETY: reading an MPI constant.
    let mut win: ffi::MPI_Win = unsafe { ffi::RSMPI_WIN_NULL };
    // SAFETY: plain MPI-3 calls with valid out-pointers; the caller frees
    // the window (unlock, free) when it is done with the segments.
    unsafe {
        let rc = ffi::MPI_Win_allocate_shared(
            bytes as ffi::MPI_Aint,
            1,
            ffi::RSMPI_INFO_NULL,
            node.as_raw(),
            &mut base as *mut *mut c_void as *mut c_void,
            &mut win,
        );
        if rc != 0 {
            return Err(format!("MPI_Win_allocate_shared of {bytes} bytes failed (error {rc})"));
        }
        ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as c_int, win);
        let mut segs = Vec::with_capacity(node.size() as usize);
        for r in 0..node.size() {
            let (mut size, mut unit): (ffi::MPI_Aint, c_int) = (0, 0);
            let mut p: *mut c_void = ptr::null_mut();
            ffi::MPI_Win_shared_query(win, r, &mut size, &mut unit, &mut p as *mut *mut c_void as *mut c_void);
            if p.is_null() && size > 0 {
                return Err(format!("MPI_Win_shared_query: rank {r}'s segment of {size} bytes has no address"));
            }
            segs.push((p as *mut u8, size as usize));
        }
        Ok((win, segs))
    }
}

/// Memory lent to the CPU backend for an arena holding gradient buckets
/// ([`super::super::Comm::shared_memory`]): one segment per rank of one
/// window, each rank's arena in its own segment.
struct Lent {
    win: ffi::MPI_Win,
    segs: Segments,
}

impl Drop for Lent {
    fn drop(&mut self) {
        // SAFETY: a window `lend` allocated and locked; every rank frees its
        // lent windows when its communicator drops, in the same order.
        unsafe {
            ffi::MPI_Win_unlock_all(self.win);
            ffi::MPI_Win_free(&mut self.win);
        }
    }
}

/// A shared-memory window over the ranks of one host. See the module docs.
pub(super) struct SharedWindow {
    /// Arenas lent to the backend (freed before the node communicator).
    lent: Vec<Lent>,
    /// The barrier's window: one cache line per rank, its arrival count
    /// first (freed before the node communicator too).
    arrivals: Lent,
    node: SimpleCommunicator,
    /// This rank in `node` (the same as in the world: the split keeps order).
    rank: usize,
    win: ffi::MPI_Win,
    /// Every rank's segment (`2 * cap` floats), by rank.
    segs: Vec<*mut f32>,
    /// Floats per half of a segment; 0 before the first collective.
    cap: usize,
    /// The half the next collective uses.
    half: usize,
    /// Barriers this rank passed (its arrival count).
    passed: u64,
    /// How long a barrier waits for the other ranks.
    timeout: Duration,
}

/// Who reports a barrier's timeout: called with the ranks that never
/// arrived and how long this rank waited, before the job is aborted.
pub(super) type OnTimeout<'a> = &'a dyn Fn(&[usize], Duration);

/// Publish `passed` as this rank's arrival count in `arrivals` and wait
/// until every rank's count reached it (see the module docs); past
/// `timeout`, report the missing ranks through `on_timeout` and end the job.
fn barrier(
    node: &SimpleCommunicator,
    arrivals: &Lent,
    me: usize,
    passed: u64,
    timeout: Duration,
    on_timeout: OnTimeout<'_>,
) {
    let slot = |r: usize| {
        // SAFETY: every rank's segment of the arrivals window holds at least
        // one 64-byte line (allocated in `for_world`), aligned for a u64;
        // the counters are only ever accessed atomically.
        unsafe { &*(arrivals.segs[r].0 as *const AtomicU64) }
    };
    // SAFETY: the window is allocated and locked.
    unsafe { ffi::MPI_Win_sync(arrivals.win) };
    slot(me).store(passed, Ordering::Release);
    let started = Instant::now();
    loop {
        let behind = (0..arrivals.segs.len()).filter(|&r| slot(r).load(Ordering::Acquire) < passed);
        if behind.clone().next().is_none() {
            break;
        }
        let waited = started.elapsed();
        if waited >= timeout {
            let missing: Vec<usize> = behind.collect();
            on_timeout(&missing, waited);
            node.abort(super::mpi::TIMEOUT_EXIT_CODE);
        }
        // As the arrival check: spin, yielding, for 50 ms, then sleep 1 ms.
        if waited < Duration::from_millis(50) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    // SAFETY: as above.
    unsafe { ffi::MPI_Win_sync(arrivals.win) };
}

impl SharedWindow {
    /// The window's node communicator, when every rank of `world` runs on
    /// this host (collective over `world`); `None` when the job spans hosts.
    /// Its barriers wait `timeout` at most for a rank (see the module docs).
    pub(super) fn for_world(world: &SimpleCommunicator, timeout: Duration) -> Option<SharedWindow> {
        let node = world.split_shared(world.rank());
        if node.size() != world.size() {
            return None;
        }
        let rank = node.rank() as usize;
        let (win, segs) = allocate_window(&node, 64).ok()?;
        // SAFETY: this rank's segment holds 64 bytes, aligned for a u64;
        // each rank zeroes its own counter before the barrier below, and
        // no counter is read before it.
        unsafe { (*(segs[rank].0 as *const AtomicU64)).store(0, Ordering::Release) };
        // SAFETY: the window is allocated and locked.
        unsafe { ffi::MPI_Win_sync(win) };
        node.barrier();
        let arrivals = Lent { win, segs };
        // SAFETY: reading an MPI constant (a static of the library).
        let win = unsafe { ffi::RSMPI_WIN_NULL };
        Some(SharedWindow {
            lent: Vec::new(),
            node,
            rank,
            win,
            segs: Vec::new(),
            cap: 0,
            half: 0,
            arrivals,
            passed: 0,
            timeout,
        })
    }

    /// `bytes` bytes of a new window's segment of this rank, which every
    /// rank of the host can address (collective over the node; sizes may
    /// differ between ranks).
    pub(super) fn lend(&mut self, bytes: usize) -> Result<super::SharedMemory, String> {
        let size = bytes.max(1).div_ceil(64) * 64;
        let (win, segs) = allocate_window(&self.node, size)?;
        let ptr = segs[self.rank].0;
        self.lent.push(Lent { win, segs });
        Ok(super::SharedMemory { ptr, bytes: size })
    }

    /// The lent arena holding `ptr` on this rank, and the byte offset of
    /// `ptr` in it.
    pub(super) fn locate(&self, ptr: *const f32) -> Option<(usize, usize)> {
        let p = ptr as usize;
        self.lent.iter().enumerate().find_map(|(a, l)| {
            let (base, size) = l.segs[self.rank];
            let base = base as usize;
            (p >= base && p < base + size).then(|| (a, p - base))
        })
    }

    /// Sum the `n` f32 at byte `offset` of lent arena `arena` over all
    /// ranks, in place on every rank: every rank's bucket lies at the same
    /// offset of its own segment (the caller checked), so each rank adds its
    /// chunk over all ranks' buckets where they lie, in rank order, into its
    /// own bucket; then copies the other chunks' sums from their owners; a
    /// barrier before, between and after (a rank's next step may write its
    /// bucket again only once every rank has copied from it).
    pub(super) fn all_reduce_lent(
        &mut self,
        arena: usize,
        offset: usize,
        n: usize,
        on_timeout: OnTimeout<'_>,
    ) -> Result<(), String> {
        let l = self.lent.get(arena).ok_or_else(|| format!("no lent arena {arena}"))?;
        if l.segs.iter().any(|&(_, size)| offset + 4 * n > size) || !offset.is_multiple_of(4) {
            return Err(format!("a bucket of {n} floats at byte {offset} does not fit every rank's arena"));
        }
        let world = l.segs.len();
        let me = self.rank;
        let win = l.win;
        // SAFETY: each rank's bucket is `n` f32 at `offset` of its segment
        // (checked above); the three phases below touch disjoint ranges as
        // the doc says, separated by barriers with `MPI_Win_sync`.
        let bucket = |r: usize| unsafe { (l.segs[r].0.add(offset)) as *mut f32 };
        let (node, arrivals, timeout) = (&self.node, &self.arrivals, self.timeout);
        let passed = &mut self.passed;
        let mut fence = || {
            // SAFETY: the lent window is allocated and locked.
            unsafe { ffi::MPI_Win_sync(win) };
            *passed += 1;
            barrier(node, arrivals, me, *passed, timeout, on_timeout);
            // SAFETY: as above.
            unsafe { ffi::MPI_Win_sync(win) };
        };
        let chunk = |q: usize| {
            let per = n.div_ceil(world).div_ceil(LINE) * LINE;
            (q * per).min(n)..((q + 1) * per).min(n)
        };
        fence();
        let c = chunk(me);
        // SAFETY: see above; only this rank writes its chunk `me`, which no
        // other rank reads in this phase. Raw pointers: this rank's own
        // bucket is both an addend and the destination (element by element).
        // Element by element, every addend read before the element is
        // written: this rank's own bucket is an addend too (rank 2 and up
        // would otherwise add (v0 + v1) where its own value was).
        unsafe {
            let (s, a, b) = (bucket(me).add(c.start), bucket(0).add(c.start), bucket(1).add(c.start));
            for i in 0..c.len() {
                let mut acc = *a.add(i) + *b.add(i);
                for r in 2..world {
                    acc += *bucket(r).add(c.start + i);
                }
                *s.add(i) = acc;
            }
        }
        fence();
        for q in (0..world).filter(|&q| q != me) {
            let c = chunk(q);
            // SAFETY: rank q's chunk q holds its sum (written before the
            // barrier); this rank writes only its own chunk q.
            unsafe { std::ptr::copy_nonoverlapping(bucket(q).add(c.start), bucket(me).add(c.start), c.len()) };
        }
        fence();
        Ok(())
    }

    /// Free the current window, if any (collective over the node).
    fn free(&mut self) {
        if self.cap > 0 {
            // SAFETY: `win` is a window this value allocated and locked; every
            // rank frees it at the same collective (see `reserve`) or at drop.
            unsafe {
                ffi::MPI_Win_unlock_all(self.win);
                ffi::MPI_Win_free(&mut self.win);
            }
            self.cap = 0;
            self.segs.clear();
        }
    }

    /// Make each half of every segment hold at least `n` floats (collective:
    /// every rank calls it with the same `n`).
    fn reserve(&mut self, n: usize) -> Result<(), String> {
        if n <= self.cap {
            return Ok(());
        }
        self.free();
        let cap = n.div_ceil(LINE) * LINE;
        let bytes = 2 * cap * std::mem::size_of::<f32>();
        let (win, segs) = allocate_window(&self.node, bytes)?;
        (self.win, self.cap) = (win, cap);
        self.segs = segs.iter().map(|&(p, _)| p as *mut f32).collect();
        if let Some((r, &(_, size))) = segs.iter().enumerate().find(|(_, s)| s.1 < bytes) {
            self.free();
            return Err(format!("MPI_Win_shared_query: rank {r}'s segment has {size} bytes, {bytes} needed"));
        }
        Ok(())
    }

    /// The range of chunk `q` of a bucket of `n` floats.
    fn chunk(&self, q: usize, n: usize) -> std::ops::Range<usize> {
        let world = self.segs.len();
        let per = n.div_ceil(world).div_ceil(LINE) * LINE;
        (q * per).min(n)..((q + 1) * per).min(n)
    }

    /// Rank `r`'s half in use, as a slice of `len` floats from `at`.
    ///
    /// # Safety
    /// The caller must only read ranges that rank `r` finished writing
    /// before the last barrier, and only write ranges of its own segment
    /// that no rank reads before the next barrier (the protocol in the
    /// module docs).
    #[allow(clippy::mut_from_ref)]
    unsafe fn seg(&self, r: usize, at: usize, len: usize) -> &mut [f32] {
        std::slice::from_raw_parts_mut(self.segs[r].add(self.half * self.cap + at), len)
    }

    /// `MPI_Win_sync`, barrier, `MPI_Win_sync`: every rank's stores before
    /// it are visible to every rank's loads after it.
    fn fence(&mut self, on_timeout: OnTimeout<'_>) {
        // SAFETY: the window is allocated and locked (`reserve`).
        unsafe { ffi::MPI_Win_sync(self.win) };
        self.passed += 1;
        barrier(&self.node, &self.arrivals, self.rank, self.passed, self.timeout, on_timeout);
        // SAFETY: as above.
        unsafe { ffi::MPI_Win_sync(self.win) };
    }

    /// Replace `buf` by its sum over all ranks, in rank order (see the
    /// module docs). Every rank calls it with the same length.
    pub(super) fn all_reduce_sum(&mut self, buf: &mut [f32], on_timeout: OnTimeout<'_>) -> Result<(), String> {
        let n = buf.len();
        self.reserve(n)?;
        let (me, world) = (self.rank, self.segs.len());
        // SAFETY (every `seg` below): the steps follow the module docs'
        // protocol: step 1 writes only this rank's segment outside chunk
        // `me`; step 3 reads the others' step-1 data after the barrier and
        // writes this rank's chunk `me`; step 5 reads the others' step-3
        // sums after the second barrier. The other half is untouched.
        for q in (0..world).filter(|&q| q != me) {
            let c = self.chunk(q, n);
            unsafe { self.seg(me, c.start, c.len()) }.copy_from_slice(&buf[c]);
        }
        self.fence(on_timeout);
        let c = self.chunk(me, n);
        let value = |r: usize| -> &[f32] {
            if r == me {
                &buf[c.clone()]
            } else {
                unsafe { self.seg(r, c.start, c.len()) }
            }
        };
        let sum = unsafe { self.seg(me, c.start, c.len()) };
        for ((s, a), b) in sum.iter_mut().zip(value(0)).zip(value(1)) {
            *s = *a + *b;
        }
        for r in 2..world {
            for (s, v) in sum.iter_mut().zip(value(r)) {
                *s += *v;
            }
        }
        buf[c.clone()].copy_from_slice(sum);
        self.fence(on_timeout);
        for q in (0..world).filter(|&q| q != me) {
            let c = self.chunk(q, n);
            buf[c.clone()].copy_from_slice(unsafe { self.seg(q, c.start, c.len()) });
        }
        self.half ^= 1;
        Ok(())
    }
}

impl Drop for SharedWindow {
    fn drop(&mut self) {
        self.free();
    }
}
