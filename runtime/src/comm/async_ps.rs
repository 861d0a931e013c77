//! The asynchronous parameter-server exchange (`--ps-async`): point-to-point
//! MPI between co-located workers and owners, with no rank waiting for
//! another's step.
//!
//! Protocol (every rank is a worker; each owning rank holds one shard):
//! - **Push.** After its step a worker sends each remote shard's gradient to
//!   the shard's owner (`MPI_Isend`, tag `GRAD_TAG`), tagged with the
//!   shard's version its values came from; its own shard's gradient it
//!   applies at once. Each remote owner has a ring of [`DEPTH`] send buffers:
//!   a worker whose oldest send to that owner has not completed waits for it
//!   (while serving its own messages, so two waiting ranks cannot deadlock).
//!   Each values message also says how many of that worker's gradients the
//!   owner applied: a worker with [`MAX_AHEAD`] gradients not yet applied by
//!   an owner waits for it, so a worker far ahead (or an owner that hangs)
//!   stops the worker, not memory, and a silent owner ends in a timeout.
//! - **Apply.** An owner receives gradients as they arrive (`MPI_Iprobe` +
//!   `MPI_Recv`) and applies each one, in arrival order, with the apply
//!   program (the optimizer's own kernels on its variables and slots). The
//!   shard's version is the number of gradients applied to it; a gradient's
//!   staleness is the version at its apply minus the version it was computed
//!   from ([`Staleness`]).
//! - **Pull.** After applying, the owner sends the shard's new values, with
//!   their version, to every other worker (tag `VALUES_TAG`), one buffer per
//!   worker: while a worker's previous values are still in flight the newest
//!   values wait and go when that send completes (older values are never
//!   queued). A worker writes received values into its session's variables.
//! - **End.** After its last step a worker sends "done" to every remote
//!   owner behind its gradients (same tag and destination: MPI does not let
//!   it overtake them). An owner that has every other worker's "done" has
//!   applied every gradient; it then sends "final" behind its last values.
//!   [`AsyncPs::finish`] returns once every "done" and "final" arrived and
//!   every send completed; the caller then runs one synchronous broadcast
//!   of each shard ([`super::ValueExchange`]) so every rank holds the same
//!   values.
//!
//! Invariants: every buffer is allocated in [`AsyncPs::new`]; a step
//! allocates nothing. Messages travel on a duplicate of `MPI_COMM_WORLD`,
//! so they never match the collectives of the [`super::MpiComm`]. A wait
//! that sees no message and no completed send for the timeout is a
//! [`CommError::Timeout`] naming the ranks it waited for.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};

use super::{CommError, Staleness};
use crate::error::RuntimeError;
use crate::session::Session;

/// Gradient send buffers per remote owner (a worker waits for its oldest send to complete).
pub const DEPTH: usize = 2;
/// Gradients a worker may have pushed to an owner that the owner has not
/// applied yet; a worker further ahead waits (serving its own messages).
pub const MAX_AHEAD: u64 = 4;
/// Header words (bit patterns in f32 slots): kind, version low, version high, and
/// the worker step (a gradient) or that worker's gradients applied so far (values).
const HDR: usize = 4;
const GRAD_TAG: i32 = 0x7a51;
const VALUES_TAG: i32 = 0x7a52;
const KIND_GRAD: u32 = 1;
const KIND_DONE: u32 = 2;
const KIND_VALUES: u32 = 3;
const KIND_FINAL: u32 = 4;
/// One owner's shard: its variables (name, element count), in message order.
#[derive(Debug, Clone)]
pub struct AsyncShard {
    pub owner: usize,
    pub vars: Vec<(String, usize)>,
}

impl AsyncShard {
    fn len(&self) -> usize {
        self.vars.iter().map(|v| v.1).sum()
    }
}

/// The names the exchange reads and writes in the session.
#[derive(Debug, Clone)]
pub struct AsyncPrograms {
    /// The worker's program (forward and backward), whose fetch
    /// `grad_prefix + variable` is that variable's gradient.
    pub worker: String,
    /// This rank's apply program (None when it owns nothing), whose feed
    /// `grad_prefix + variable` takes that variable's gradient.
    pub apply: Option<String>,
    pub grad_prefix: String,
}

/// A message buffer and its send request.
struct Slot {
    buf: Vec<f32>,
    req: ffi::MPI_Request,
    busy: bool,
}

impl Slot {
    fn new(len: usize) -> Slot {
        Slot { buf: vec![0.0; HDR + len], req: unsafe { ffi::RSMPI_REQUEST_NULL }, busy: false }
    }

    /// Whether the send completed (a slot that sends nothing is free).
    fn test(&mut self) -> bool {
        if self.busy {
            let mut flag = 0;
            // SAFETY: `req` is the active request of this slot's last send.
            unsafe { ffi::MPI_Test(&mut self.req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            self.busy = flag == 0;
            if !self.busy {
                return true;
            }
        }
        !self.busy
    }
}

fn header(buf: &mut [f32], kind: u32, version: u64, step: u64) {
    buf[0] = f32::from_bits(kind);
    buf[1] = f32::from_bits(version as u32);
    buf[2] = f32::from_bits((version >> 32) as u32);
    buf[3] = f32::from_bits(step as u32);
}

fn read_header(buf: &[f32]) -> (u32, u64) {
    (buf[0].to_bits(), buf[1].to_bits() as u64 | (buf[2].to_bits() as u64) << 32)
}

/// This rank's end of the asynchronous exchange (see the module docs).
pub struct AsyncPs {
    comm: SimpleCommunicator,
    rank: usize,
    world: usize,
    timeout: Duration,
    programs: AsyncPrograms,
    shards: Vec<AsyncShard>,
    /// Index into `shards` of this rank's own shard.
    mine: Option<usize>,
    /// Per shard: the gradient send ring (empty for this rank's own shard).
    rings: Vec<Vec<Slot>>,
    /// Per shard: the next ring slot to use.
    next: Vec<usize>,
    /// Per shard: its variables' gradient fetch (and feed) names.
    grad_names: Vec<Vec<String>>,
    /// Per shard: its received values (a worker's copy).
    values_in: Vec<Vec<f32>>,
    /// A header-only message ("final") from a rank that owns nothing.
    hdr_in: [f32; HDR],
    /// Per shard: the version of the values this rank holds.
    seen: Vec<u64>,
    /// Per shard: gradients this worker pushed, and how many of them its owner applied.
    pushed: Vec<u64>,
    acked: Vec<u64>,
    /// This rank's own shard: gradients applied per worker.
    applied_from: Vec<u64>,
    /// This rank's own shard: a received gradient, and its values to each rank.
    grad_in: Vec<f32>,
    values_out: Vec<Slot>,
    /// Per rank: its newest values are still to be sent to it.
    dirty: Vec<bool>,
    done_from: Vec<bool>,
    final_from: Vec<bool>,
    final_sent: bool,
    stats: Staleness,
    last_progress: Instant,
}

impl AsyncPs {
    /// The exchange of `shards` (every owner's variables; the same on every
    /// rank) on MPI's world, which must be the session's communicator.
    /// Collective (it duplicates the world communicator): every rank calls it.
    pub fn new(
        sess: &Session,
        shards: Vec<AsyncShard>,
        programs: AsyncPrograms,
        timeout: Duration,
    ) -> Result<AsyncPs, RuntimeError> {
        let comm = sess.comm();
        let (rank, world) = (comm.rank(), comm.world_size());
        let err = |detail: String| RuntimeError::Collective {
            program: programs.worker.clone(),
            node: "ps_async".into(),
            source: Box::new(CommError::Transport { op: "ps-async setup", rank, detail }),
        };
        if !mpi::environment::is_initialized() || world < 2 {
            return Err(err("the asynchronous parameter servers talk over MPI: run under mpirun -np N (N >= 2) with towers built with --features mpi".into()));
        }
        let mpi_world = SimpleCommunicator::world();
        if mpi_world.size() as usize != world || mpi_world.rank() as usize != rank {
            return Err(err(format!(
                "the session's communicator (rank {rank} of {world}) is not MPI's world (rank {} of {}); the asynchronous exchange needs the MpiComm",
                mpi_world.rank(),
                mpi_world.size()
            )));
        }
        for s in &shards {
            if s.owner >= world {
                return Err(err(format!("shard owner {} is not a rank of a group of {world}", s.owner)));
            }
        }
        let mine = shards.iter().position(|s| s.owner == rank);
        if mine.is_some() != programs.apply.is_some() {
            return Err(err("a rank owns a shard exactly when it has an apply program".into()));
        }
        let rings = shards
            .iter()
            .map(|s| if s.owner == rank { Vec::new() } else { (0..DEPTH).map(|_| Slot::new(s.len())).collect() })
            .collect();
        let values_in = shards.iter().map(|s| vec![0.0; HDR + s.len()]).collect();
        let grad_names = shards
            .iter()
            .map(|s| s.vars.iter().map(|(v, _)| format!("{}{v}", programs.grad_prefix)).collect())
            .collect();
        let own = mine.map_or(0, |i| shards[i].len());
        let n = shards.len();
        Ok(AsyncPs {
            comm: mpi_world.duplicate(),
            rank,
            world,
            timeout,
            programs,
            mine,
            rings,
            next: vec![0; n],
            values_in,
            grad_names,
            hdr_in: [0.0; HDR],
            seen: vec![0; n],
            pushed: vec![0; n],
            acked: vec![0; n],
            applied_from: vec![0; world],
            grad_in: vec![0.0; HDR + own],
            values_out: (0..world).map(|_| Slot::new(own)).collect(),
            dirty: vec![false; world],
            done_from: vec![false; world],
            final_from: vec![false; world],
            final_sent: false,
            stats: Staleness::default(),
            last_progress: Instant::now(),
            shards,
        })
    }

    /// The staleness of the gradients this rank applied so far.
    pub fn staleness(&self) -> Staleness {
        self.stats
    }

    fn fail(&self, op: &'static str, detail: String) -> RuntimeError {
        RuntimeError::Collective {
            program: self.programs.worker.clone(),
            node: "ps_async".into(),
            source: Box::new(CommError::Transport { op, rank: self.rank, detail }),
        }
    }

    /// After a step of the worker program: send each remote shard's
    /// gradient to its owner and apply this rank's own (see the module docs).
    pub fn push(&mut self, sess: &mut Session, step: u64) -> Result<(), RuntimeError> {
        for s in 0..self.shards.len() {
            if Some(s) == self.mine {
                continue;
            }
            let i = self.free_slot(sess, s, true)?;
            self.pushed[s] += 1;
            let slot = &mut self.rings[s][i];
            header(&mut slot.buf, KIND_GRAD, self.seen[s], step);
            let mut at = HDR;
            for ((_, len), fetch) in self.shards[s].vars.iter().zip(&self.grad_names[s]) {
                sess.fetch_into(&self.programs.worker, fetch, &mut slot.buf[at..at + len])?;
                at += len;
            }
            self.send(s, i, at);
        }
        if let Some(m) = self.mine {
            let mut at = HDR;
            for ((_, len), fetch) in self.shards[m].vars.iter().zip(&self.grad_names[m]) {
                sess.fetch_into(&self.programs.worker, fetch, &mut self.grad_in[at..at + len])?;
                at += len;
            }
            header(&mut self.grad_in, KIND_GRAD, self.seen[m], step);
            self.apply_received(sess, self.rank)?;
        }
        self.poll(sess)?;
        Ok(())
    }

    /// Post the send of ring slot `i` of shard `s`: its first `len` words.
    fn send(&mut self, s: usize, i: usize, len: usize) {
        let owner = self.shards[s].owner as i32;
        let comm = self.comm.as_raw();
        let slot = &mut self.rings[s][i];
        // SAFETY: the buffer lives in `self` and is neither moved nor written
        // until `test` sees this request complete; `len` is within it.
        unsafe {
            ffi::MPI_Isend(
                slot.buf.as_ptr() as *const c_void,
                (len * 4) as i32,
                ffi::RSMPI_UINT8_T,
                owner,
                GRAD_TAG,
                comm,
                &mut slot.req,
            );
        }
        slot.busy = true;
        self.next[s] = (i + 1) % DEPTH;
    }

    /// The next slot of shard `s`'s ring, waiting (and serving this rank's
    /// messages) while its previous send is in flight, and for a gradient
    /// (`gradient`) while the owner has [`MAX_AHEAD`] of ours unapplied.
    fn free_slot(&mut self, sess: &mut Session, s: usize, gradient: bool) -> Result<usize, RuntimeError> {
        let i = self.next[s];
        self.last_progress = Instant::now();
        while !self.rings[s][i].test() || (gradient && self.pushed[s] - self.acked[s] >= MAX_AHEAD) {
            if !self.poll(sess)? {
                self.idle(&[self.shards[s].owner])?;
            }
        }
        Ok(i)
    }

    /// Sleep a little; a timeout error (naming `waiting_for`) when nothing
    /// moved for the timeout.
    fn idle(&mut self, waiting_for: &[usize]) -> Result<(), RuntimeError> {
        if self.last_progress.elapsed() >= self.timeout {
            return Err(RuntimeError::Collective {
                program: self.programs.worker.clone(),
                node: "ps_async".into(),
                source: Box::new(CommError::Timeout {
                    op: "ps-async exchange",
                    rank: self.rank,
                    waited: self.timeout,
                    missing: waiting_for.to_vec(),
                }),
            });
        }
        std::thread::sleep(Duration::from_micros(200));
        Ok(())
    }

    /// Serve every message that arrived and every send that completed;
    /// whether anything moved.
    pub fn poll(&mut self, sess: &mut Session) -> Result<bool, RuntimeError> {
        let mut moved = false;
        // Gradients (and "done") for this rank's shard.
        while let Some((src, len)) = self.probe(GRAD_TAG)? {
            if self.mine.is_none() || len > self.grad_in.len() * 4 {
                return Err(self.fail(
                    "ps-async receive",
                    format!("rank {src} sent {len} B of gradients to a rank that owns no such shard"),
                ));
            }
            self.recv(GRAD_TAG, src, len)?;
            match read_header(&self.grad_in).0 {
                KIND_DONE => self.done_from[src] = true,
                KIND_GRAD => self.apply_received(sess, src)?,
                k => {
                    return Err(self.fail("ps-async receive", format!("rank {src} sent a message of unknown kind {k}")))
                }
            }
            moved = true;
        }
        // Values (and "final") from the owners.
        while let Some((src, len)) = self.probe(VALUES_TAG)? {
            let shard = self.shards.iter().position(|s| s.owner == src);
            let room = shard.map_or(HDR, |s| self.values_in[s].len());
            if len > room * 4 {
                return Err(self.fail(
                    "ps-async receive",
                    format!("rank {src} sent {len} B of values where its shard holds {} B", (room - HDR) * 4),
                ));
            }
            self.recv(VALUES_TAG, src, len)?;
            let (kind, version) = read_header(shard.map_or(&self.hdr_in[..], |s| &self.values_in[s]));
            if let (Some(s), KIND_VALUES) = (shard, kind) {
                let acked = self.values_in[s][3].to_bits() as u64;
                self.acked[s] = self.acked[s].max(acked);
            }
            if kind == KIND_FINAL {
                self.final_from[src] = true;
            } else if let Some(s) = shard.filter(|&s| kind == KIND_VALUES && version > self.seen[s]) {
                let mut at = HDR;
                for (name, n) in &self.shards[s].vars {
                    sess.write_variable(name, &self.values_in[s][at..at + n])?;
                    at += n;
                }
                self.seen[s] = version;
            }
            moved = true;
        }
        // Completed sends, and the newest values to whoever waits for them.
        for ring in &mut self.rings {
            for slot in ring.iter_mut().filter(|s| s.busy) {
                moved |= slot.test();
            }
        }
        if let (Some(m), false) = (self.mine, self.final_sent) {
            for w in 0..self.world {
                if self.dirty[w] && self.values_out[w].test() {
                    self.send_values(sess, m, w)?;
                    moved = true;
                }
            }
        }
        for slot in self.values_out.iter_mut().filter(|s| s.busy) {
            moved |= slot.test();
        }
        if moved {
            self.last_progress = Instant::now();
        }
        Ok(moved)
    }

    /// Copy this rank's shard `m` into worker `w`'s buffer and send it.
    fn send_values(&mut self, sess: &mut Session, m: usize, w: usize) -> Result<(), RuntimeError> {
        let slot = &mut self.values_out[w];
        header(&mut slot.buf, KIND_VALUES, self.seen[m], self.applied_from[w]);
        let mut at = HDR;
        for (name, n) in &self.shards[m].vars {
            sess.read_variable_into(name, &mut slot.buf[at..at + n])?;
            at += n;
        }
        post(&self.comm, slot, at, w, VALUES_TAG);
        self.dirty[w] = false;
        Ok(())
    }

    /// Apply the gradient in `grad_in` (from worker `from_rank`) to this rank's shard.
    fn apply_received(&mut self, sess: &mut Session, from_rank: usize) -> Result<(), RuntimeError> {
        let (Some(m), Some(apply)) = (self.mine, &self.programs.apply) else {
            return Err(self.fail("ps-async apply", "this rank owns no shard".into()));
        };
        let (_, from) = read_header(&self.grad_in);
        let mut at = HDR;
        for ((_, n), feed) in self.shards[m].vars.iter().zip(&self.grad_names[m]) {
            sess.feed(apply, feed, &self.grad_in[at..at + n])?;
            at += n;
        }
        sess.run(apply)?;
        let now = self.seen[m];
        self.stats.record(now.saturating_sub(from));
        self.seen[m] = now + 1;
        self.applied_from[from_rank] += 1;
        for w in (0..self.world).filter(|&w| w != self.rank) {
            self.dirty[w] = true;
        }
        Ok(())
    }

    /// A waiting message with `tag` from any rank: (source, bytes).
    fn probe(&self, tag: i32) -> Result<Option<(usize, usize)>, RuntimeError> {
        let mut flag = 0;
        // SAFETY: a plain probe into a local status.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        unsafe { ffi::MPI_Iprobe(ffi::RSMPI_ANY_SOURCE, tag, self.comm.as_raw(), &mut flag, &mut status) };
        if flag == 0 {
            return Ok(None);
        }
        let mut count = 0;
        // SAFETY: `status` was filled by the probe.
        unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
        Ok(Some((status.MPI_SOURCE as usize, count.max(0) as usize)))
    }

    /// Receive the probed message (`len` bytes) from `src` into its buffer.
    fn recv(&mut self, tag: i32, src: usize, len: usize) -> Result<(), RuntimeError> {
        let buf: &mut [f32] = if tag == GRAD_TAG {
            &mut self.grad_in[..]
        } else {
            match self.shards.iter().position(|s| s.owner == src) {
                Some(s) => &mut self.values_in[s][..],
                None => &mut self.hdr_in[..],
            }
        };
        // SAFETY: the probe checked that `len` bytes fit in `buf`.
        let rc = unsafe {
            ffi::MPI_Recv(
                buf.as_mut_ptr() as *mut c_void,
                len as i32,
                ffi::RSMPI_UINT8_T,
                src as i32,
                tag,
                self.comm.as_raw(),
                ffi::RSMPI_STATUS_IGNORE,
            )
        };
        if rc != 0 {
            return Err(self.fail("ps-async receive", format!("MPI_Recv from rank {src} failed with code {rc}")));
        }
        Ok(())
    }

    /// After the last step: say "done" to every owner, serve until every
    /// gradient is applied and every value delivered (see the module docs).
    pub fn finish(&mut self, sess: &mut Session) -> Result<(), RuntimeError> {
        for s in 0..self.shards.len() {
            if Some(s) == self.mine {
                continue;
            }
            let i = self.free_slot(sess, s, false)?;
            header(&mut self.rings[s][i].buf, KIND_DONE, 0, 0);
            self.send(s, i, HDR);
        }
        self.done_from[self.rank] = true;
        self.final_from[self.rank] = true;
        self.last_progress = Instant::now();
        loop {
            let moved = self.poll(sess)?;
            let owner_done = self.mine.is_none() || self.done_from.iter().all(|&d| d);
            if owner_done && !self.final_sent && self.values_out.iter_mut().all(|s| s.test()) {
                // Every gradient applied: no values follow the "final".
                for w in (0..self.world).filter(|&w| w != self.rank) {
                    let slot = &mut self.values_out[w];
                    header(&mut slot.buf, KIND_FINAL, 0, 0);
                    post(&self.comm, slot, HDR, w, VALUES_TAG);
                }
                self.final_sent = true;
                continue;
            }
            let sends_done = self.rings.iter_mut().all(|r| r.iter_mut().all(|s| s.test()))
                && self.values_out.iter_mut().all(|s| s.test());
            if self.final_sent && sends_done && self.final_from.iter().all(|&f| f) {
                return Ok(());
            }
            if !moved {
                let mut waiting: Vec<usize> = (0..self.world).filter(|&r| !self.final_from[r]).collect();
                if self.mine.is_some() {
                    waiting.extend((0..self.world).filter(|&r| !self.done_from[r]));
                }
                waiting.sort_unstable();
                waiting.dedup();
                self.idle(&waiting)?;
            }
        }
    }
}

/// Post `slot`'s first `words` words to rank `to` with `tag`.
fn post(comm: &SimpleCommunicator, slot: &mut Slot, words: usize, to: usize, tag: i32) {
    // SAFETY: as in `AsyncPs::send`: the buffer is untouched until the request completes.
    unsafe {
        ffi::MPI_Isend(
            slot.buf.as_ptr() as *const c_void,
            (words * 4) as i32,
            ffi::RSMPI_UINT8_T,
            to as i32,
            tag,
            comm.as_raw(),
            &mut slot.req,
        );
    }
    slot.busy = true;
}

impl Drop for AsyncPs {
    fn drop(&mut self) {
        // A send still in flight (an error ended the run) is cancelled, so
        // MPI never reads a buffer after it is freed.
        let slots = self.rings.iter_mut().flatten().chain(self.values_out.iter_mut());
        for slot in slots.filter(|s| s.busy) {
            // SAFETY: `req` is this slot's active request.
            unsafe {
                ffi::MPI_Cancel(&mut slot.req);
                ffi::MPI_Request_free(&mut slot.req);
            }
        }
    }
}
