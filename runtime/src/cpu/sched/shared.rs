//! What the threads of one program share, and how they wake each other:
//! the start signal of a step, the event stamps (`Record` stores the step
//! number with release, a `Wait` passes once it reads it with acquire), one
//! bell (lock and condvar) per thread that only the records of the events
//! it sleeps on ring, spinning before sleeping, and the host's wait for a
//! free core.
//!
//! A thread with nothing to run spins for up to [`SPIN`] (watching the
//! events its lanes wait for, the next step's start or a help offer)
//! before it sleeps, when the program has no more threads than cores: a
//! wake-up from a sleep took 30-70 us on the 2-vCPU benchmark host, longer
//! than many of the waits it ends (a tower waiting for the host's record at
//! a step's start, the helper of a split update). With more threads than
//! cores a spinning thread would hold a core another thread needs, so they
//! sleep at once.
//!
//! When the devices would take every core, the host's streams usually join
//! the last device's thread (`threads::thread_plans`), which the caller
//! runs. Where they cannot (plans with collectives across processes) and
//! the workers take every core, the host has no core of its own: it then
//! runs a launch only while a worker rests (asleep or done), so its updates
//! do not slow the towers down by sharing their cores; without this,
//! variables on the host measured 1.34-1.43x instead of 1.36-1.51x. Plans
//! with collectives across processes leave the host free (a host waiting
//! for a core held by a worker inside an all-reduce could wait, in a cycle,
//! for the other rank's host).
//!
//! Lock order: a worker never holds its own bell while it takes the host's
//! (bell 0), see `lanes::run_thread`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use super::Failure;

/// How long a thread with nothing to run spins before it sleeps (see the module docs).
const SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// The start signal (an idle worker also wakes on it for a help offer).
pub(super) struct Start {
    pub(super) gen: u64,
    pub(super) shutdown: bool,
}

/// State shared by the caller and the workers of one program.
pub(super) struct Shared {
    pub(super) start: Mutex<Start>,
    pub(super) start_cv: Condvar,
    /// Parts of split launches open to any idle thread.
    pub(super) board: crate::cpu::offers::Board,
    /// Whether the program has worker threads (that may help).
    pub(super) helpers: bool,
    /// Workers still running this step; the last one to finish takes
    /// `done` and rings `done_cv`.
    pub(super) remaining: AtomicUsize,
    pub(super) done: Mutex<()>,
    pub(super) done_cv: Condvar,
    /// Whether idle threads spin before they sleep (no more threads than cores).
    pub(super) spin: bool,
    /// The last step started (`Start::gen`), readable without the lock.
    pub(super) gen_now: AtomicU64,
    pub(super) events: Vec<AtomicU64>,
    /// Added to the 0-based run number to give the step that step-dependent
    /// kernels (dropout) see: 0 unless a resumed run set the counter
    /// (`Runner::set_step`). Written only between runs; the start signal's
    /// mutex orders it before the workers read it.
    pub(super) step_base: AtomicU64,
    /// One lock and condvar per thread (its bell), rung by a record of an
    /// event that thread waits on, so a record wakes only its waiters.
    pub(super) bells: Vec<(Mutex<Watch>, Condvar)>,
    /// Per event, the threads that wait on it.
    pub(super) waiters: Vec<Vec<usize>>,
    /// Worker threads running their step right now (not asleep, not done).
    pub(super) awake: AtomicUsize,
    /// Whether thread 0 also runs a device's streams (then it never waits for a core).
    pub(super) host_joined: bool,
    /// Cores this process may use; when the workers take them all, the host
    /// (which then has no core of its own) runs a launch only while one of
    /// them is free (see `run_thread`).
    pub(super) cores: usize,
    /// The first failure of the step.
    pub(super) error: Mutex<Option<Failure>>,
    /// Whether streams time their items.
    pub(super) profiling: AtomicBool,
    /// Whether streams record when each item starts and ends.
    pub(super) tracing: AtomicBool,
    /// The origin of traced times.
    pub(super) epoch: Instant,
    /// In a part of a mixed session: the flags of the events crossing
    /// parts, which `record` sets and `recorded` reads instead of `events`.
    pub(super) bridge: Option<std::sync::Arc<crate::mixed::Bridge>>,
}

impl Shared {
    /// A worker stops running (asleep or done): tell a host waiting for a core.
    #[inline]
    pub(super) fn worker_rests(&self) {
        self.awake.fetch_sub(1, Ordering::AcqRel);
        let (lock, cv) = &self.bells[0];
        let watch = lock.lock().unwrap_or_else(|p| p.into_inner());
        if watch.core {
            cv.notify_all();
        }
    }

    /// The host waits until a core is free: every core was running a worker.
    #[inline]
    pub(super) fn host_waits_for_a_core(&self) {
        if self.awake.load(Ordering::Acquire) < self.cores {
            return;
        }
        let (lock, cv) = &self.bells[0];
        let mut watch = lock.lock().unwrap_or_else(|p| p.into_inner());
        watch.core = true;
        while self.awake.load(Ordering::Acquire) >= self.cores {
            watch = cv.wait(watch).unwrap_or_else(|p| p.into_inner());
        }
        watch.core = false;
    }

    /// Spin until `ready` holds or [`SPIN`] passed (at once when this
    /// program's threads may not spin); whether it holds.
    pub(super) fn spin_until(&self, ready: impl Fn() -> bool) -> bool {
        if ready() {
            return true;
        }
        if !self.spin {
            return false;
        }
        let t = Instant::now();
        loop {
            for _ in 0..64 {
                std::hint::spin_loop();
                if ready() {
                    return true;
                }
            }
            if t.elapsed() >= SPIN {
                return ready();
            }
        }
    }

    #[inline]
    pub(super) fn recorded(&self, e: usize, gen: u64) -> bool {
        match &self.bridge {
            Some(b) if b.is_bridged(e) => b.recorded(e),
            _ => self.events[e].load(Ordering::Acquire) >= gen,
        }
    }

    /// Stamp event `e` and ring the bell of every thread asleep on it (a
    /// bridged event: set its flag, which rings every host part).
    #[inline]
    pub(super) fn record(&self, e: usize, gen: u64) {
        match &self.bridge {
            Some(b) if b.is_bridged(e) => b.record(e),
            _ => {
                self.events[e].store(gen, Ordering::Release);
                self.ring(e);
            }
        }
    }

    /// Whether a sleeping thread must look at the events again on its own:
    /// a GPU part's write of a bridged flag rings nobody.
    pub(super) fn poll(&self) -> Option<std::time::Duration> {
        self.bridge.as_ref().map(|b| b.poll_interval())
    }

    /// Ring the bell of every thread asleep on event `e`.
    pub(super) fn ring(&self, e: usize) {
        for &t in &self.waiters[e] {
            let (lock, cv) = &self.bells[t];
            let watch = lock.lock().unwrap_or_else(|p| p.into_inner());
            if watch.events[..watch.n].contains(&e) {
                cv.notify_all();
            }
        }
    }
}

/// The events a sleeping thread waits for (one per lane at most), and, for
/// the host, whether it waits for a free core.
#[derive(Default)]
pub(super) struct Watch {
    pub(super) events: [usize; MAX_LANES],
    pub(super) n: usize,
    pub(super) core: bool,
}

/// Streams per device (compute, copy, collective) with room to spare.
pub(super) const MAX_LANES: usize = 8;
