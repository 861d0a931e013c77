//! Running a program's threads: one thread per device (`threads` assigns
//! each step to its device's thread and checks that the plan cannot
//! deadlock).
//!
//! Thread 0 (the host, `cpu:0`, when present) runs on the calling thread;
//! every other thread is a long-lived worker created at load and parked
//! between steps. A single-device plan therefore never spawns. Across
//! threads, `Record(e)` stamps event `e` with the current step number
//! (release) and a `Wait(e)` is passed once the stamp reaches it (acquire),
//! so the event table needs no reset between steps. A step is complete when
//! every thread finished; `run` returns only then.
//!
//! The scheduler is three files, by concept:
//! - this one: the [`Runner`] (spawning the workers, starting a step and
//!   waiting for it, the worker loop between steps, shutdown), step
//!   failures, profiles and traces;
//! - [`lanes`]: one thread's step program, its streams as lanes run as
//!   their events allow, and split launches;
//! - [`shared`]: the state the threads share and how they wake each
//!   other: the start signal, the event stamps, one bell per thread,
//!   spinning before sleeping, and the host's wait for a free core.
//!
//! These files only moved code apart: the spin, sleep and wake logic is
//! the one measured in the notes below and in [`lanes`] and [`shared`].
//! The small [`Shared`] methods the lanes call per item are `#[inline]`,
//! so that they stay inlined into the lanes' loop now that it lives in
//! another module (and so possibly another codegen unit).
//!
//! If a launch fails, its thread skips its remaining launches and copies
//! but still records its events, so the other threads finish and the error
//! is reported. A schedule that waits on an event never recorded in the
//! step deadlocks; codegen only emits waits on events it records.
//!
//! Profiling (off by default) adds the wall time of every launch, copy and
//! wait to a counter preallocated per step item, so it allocates nothing
//! either; [`Runner::profile`] reads the totals. Tracing (off by default)
//! stores each item's start and end, in nanoseconds since the runner was
//! created, into two more counters preallocated per item, and the step's
//! own start and end in the runner: a traced step allocates nothing, and
//! [`Runner::trace`] reads the last traced step's timeline. Elided copies
//! (see `super::prepare`) keep their place as items that do nothing, so
//! profiles and traces show them.

mod lanes;
mod shared;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::comm::CommError;
use crate::cpu::prepare::Exec;
use crate::trace::{Trace, TraceEvent};
use lanes::{run_thread, since, Clocks, Span, Work};
use shared::{Shared, Start, Watch};

/// The first failure of a step, by node.
#[derive(Debug)]
pub enum Failure {
    /// A launch failed: (node, message).
    Kernel(String, String),
    /// A collective failed: (node, error).
    Collective(String, CommError),
}

/// What one stream item is, for profiles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemLabel {
    /// "gemm", "weighted_sum", ... for launches; "copy"; "wait".
    pub kind: &'static str,
    pub node: String,
    /// Its index in its plan stream.
    pub step: usize,
}

/// Total time spent in one stream item over the profiled steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileEntry {
    pub stream: usize,
    pub kind: &'static str,
    pub node: String,
    pub nanos: u64,
}

/// The label of item `x`, step `step` of its plan stream.
fn label(x: &Exec, step: usize) -> ItemLabel {
    let (kind, node) = match x {
        Exec::Launch(l) => (l.kernel.name(), l.node.clone()),
        Exec::AllReduce(a) => (
            match a.kind {
                super::prepare::Collective::AllReduce => "all_reduce",
                super::prepare::Collective::Reduce(_) => "reduce",
                super::prepare::Collective::Broadcast(_) => "broadcast",
            },
            a.node.clone(),
        ),
        Exec::Wait(e) => ("wait", format!("event {e}")),
        Exec::Record(e) => ("record", format!("event {e}")),
        Exec::Copy(node) => ("copy", node.clone()),
        Exec::Transfer(t) => ("copy", t.node.clone()),
    };
    ItemLabel { kind, node, step }
}

/// The threads of one program.
pub struct Runner {
    first: Work,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    gen: u64,
    /// Per thread: (plan stream, label) and the counters of each item.
    labels: Vec<Vec<(usize, ItemLabel)>>,
    clocks: Vec<Arc<Clocks>>,
    /// The last traced step: (gen, start, end), nanoseconds since the epoch.
    traced: Option<(u64, u64, u64)>,
    /// The core the caller is pinned to during a step (see [`host_core`]).
    host_core: Option<usize>,
}

/// The core (index among the allowed ones) the caller runs a step on: the
/// one after the workers' when it runs a device's streams too or when the
/// workers leave a core free, else the last worker's (the host alone works
/// mostly while the towers wait). Pinned to the only tower's core, one
/// tower on two cores lost 1.1 ms of a 2.6 ms step: the host's spinning
/// before it sleeps and its half of every split launch took the tower's
/// core while the other stayed idle.
/// A plan of one thread is never pinned.
fn host_core(workers: usize, host_joined: bool, cores: Option<usize>) -> Option<usize> {
    if host_joined || (workers > 0 && cores.is_some_and(|n| workers < n)) {
        Some(workers)
    } else {
        workers.checked_sub(1)
    }
}

impl Runner {
    /// Spawn one worker per thread after the first. Each item carries the
    /// index of the plan stream it came from and of its step there (for
    /// profiles and traces).
    /// Fails (with the OS's reason) only if a worker thread cannot be spawned;
    /// the workers already started are stopped again.
    ///
    /// `host_joined`: thread 0 runs a device's streams besides the host's
    /// (`threads::thread_plans`); it then never waits for a core, and the
    /// caller is pinned to a core of its own rather than the last worker's.
    pub fn new(
        threads: Vec<Vec<(usize, usize, Exec)>>,
        num_events: usize,
        program: &str,
        host_joined: bool,
        bridge: Option<Arc<crate::mixed::Bridge>>,
    ) -> Result<Runner, String> {
        let shared = Arc::new(Shared {
            start: Mutex::new(Start { gen: 0, shutdown: false }),
            start_cv: Condvar::new(),
            board: crate::cpu::offers::Board::new(),
            helpers: threads.len() > 1,
            remaining: AtomicUsize::new(0),
            done: Mutex::new(()),
            spin: std::thread::available_parallelism().is_ok_and(|n| threads.len() <= n.get()),
            gen_now: AtomicU64::new(0),
            done_cv: Condvar::new(),
            events: (0..num_events).map(|_| AtomicU64::new(0)).collect(),
            step_base: AtomicU64::new(0),
            bells: (0..threads.len()).map(|_| (Mutex::new(Watch::default()), Condvar::new())).collect(),
            awake: AtomicUsize::new(0),
            host_joined,
            // Without a known count, assume the workers have cores to spare.
            // With collectives across processes, never: a host waiting for a
            // core held by a worker inside an all-reduce could wait for the
            // other rank's host, which waits the same way.
            cores: if threads.iter().flatten().any(|(_, _, x)| matches!(x, Exec::AllReduce(_))) {
                usize::MAX
            } else {
                std::thread::available_parallelism().map_or(usize::MAX, |n| n.get())
            },
            waiters: {
                let mut w: Vec<Vec<usize>> = vec![Vec::new(); num_events];
                for (t, items) in threads.iter().enumerate() {
                    for (_, _, x) in items {
                        if let Exec::Wait(e) = x {
                            if let Some(list) = w.get_mut(*e).filter(|l| !l.contains(&t)) {
                                list.push(t);
                            }
                        }
                    }
                }
                w
            },
            error: Mutex::new(None),
            profiling: AtomicBool::new(false),
            tracing: AtomicBool::new(false),
            epoch: Instant::now(),
            bridge,
        });
        // A record of a bridged event in another host part rings this
        // program's threads asleep on it.
        if let Some(b) = &shared.bridge {
            let weak = Arc::downgrade(&shared);
            b.add_ringer(Arc::new(move |e| {
                if let Some(sh) = weak.upgrade() {
                    sh.ring(e);
                }
            }));
        }
        let labels: Vec<Vec<(usize, ItemLabel)>> =
            threads.iter().map(|t| t.iter().map(|(si, k, x)| (*si, label(x, *k))).collect()).collect();
        let clocks: Vec<Arc<Clocks>> = threads
            .iter()
            .map(|s| {
                Arc::new(Clocks {
                    times: s.iter().map(|_| AtomicU64::new(0)).collect(),
                    spans: s.iter().map(|_| Span::default()).collect(),
                })
            })
            .collect();
        let mut works: Vec<Work> = threads
            .into_iter()
            .enumerate()
            .map(|(t, items)| Work::new(items.into_iter().map(|(si, _, x)| (si, x)).collect(), t))
            .collect();
        let first = if works.is_empty() { Work::new(Vec::new(), 0) } else { works.remove(0) };
        let cores = std::thread::available_parallelism().ok().map(|n| n.get());
        let host_core = host_core(works.len(), host_joined, cores);
        let mut runner = Runner { first, shared, workers: Vec::new(), gen: 0, labels, clocks, traced: None, host_core };
        for (k, mut execs) in works.into_iter().enumerate() {
            let sh = Arc::clone(&runner.shared);
            let t = Arc::clone(&runner.clocks[k + 1]);
            let handle = std::thread::Builder::new()
                .name(format!("towers-{program}-thread{}", k + 1))
                .spawn(move || {
                    crate::cpu::affinity::pin_worker(k);
                    worker(&mut execs, &t, &sh)
                })
                .map_err(|e| format!("cannot start the worker thread of device thread {}: {e}", k + 1))?;
            runner.workers.push(handle);
        }
        Ok(runner)
    }

    /// Turn per-item timing on or off (totals restart when turned on).
    pub fn set_profiling(&mut self, on: bool) {
        if on {
            for t in &self.clocks {
                for c in t.times.iter() {
                    c.store(0, Ordering::Relaxed);
                }
            }
        }
        self.shared.profiling.store(on, Ordering::Relaxed);
    }

    /// Turn tracing on or off (the last traced step stays readable).
    pub fn set_tracing(&mut self, on: bool) {
        self.shared.tracing.store(on, Ordering::Relaxed);
    }

    /// The timeline of the last step run while tracing was on, records
    /// left out (they take no time); None before any.
    pub fn trace(&self) -> Option<Trace> {
        let (gen, start, end) = self.traced?;
        let mut items = Vec::new();
        for (labels, clocks) in self.labels.iter().zip(&self.clocks) {
            for ((s, l), span) in labels.iter().zip(clocks.spans.iter()) {
                if l.kind == "record" {
                    continue;
                }
                let (a, b) = (span.start.load(Ordering::Relaxed), span.end.load(Ordering::Relaxed));
                items.push(TraceEvent {
                    stream: *s,
                    index: l.step,
                    kind: l.kind,
                    node: l.node.clone(),
                    start_ns: a.saturating_sub(start),
                    dur_ns: b.saturating_sub(a),
                });
            }
        }
        let step = self.shared.step_base.load(Ordering::Relaxed).wrapping_add(gen - 1);
        Some(Trace { step, start_ns: start, dur_ns: end.saturating_sub(start), events: items })
    }

    /// Time spent per stream item since profiling was turned on.
    pub fn profile(&self) -> Vec<ProfileEntry> {
        let mut v = Vec::new();
        for (labels, clocks) in self.labels.iter().zip(&self.clocks) {
            for ((s, l), t) in labels.iter().zip(clocks.times.iter()) {
                if l.kind != "record" {
                    v.push(ProfileEntry {
                        stream: *s,
                        kind: l.kind,
                        node: l.node.clone(),
                        nanos: t.load(Ordering::Relaxed),
                    });
                }
            }
        }
        v
    }

    /// Run one step; Err is the step's first failure.
    pub fn step(&mut self) -> Result<(), Failure> {
        self.gen += 1;
        let gen = self.gen;
        let sh = &*self.shared;
        let tracing = sh.tracing.load(Ordering::Relaxed);
        let started = Instant::now();
        if !self.workers.is_empty() {
            sh.remaining.store(self.workers.len(), Ordering::Release);
            let mut s = sh.start.lock().unwrap_or_else(|p| p.into_inner());
            s.gen = gen;
            sh.gen_now.store(gen, Ordering::Release);
            sh.start_cv.notify_all();
        }
        let pin = self.host_core.map(crate::cpu::affinity::HostPin::new);
        // A plan without streams (nothing to run) has no thread and no clocks.
        if let Some(clocks) = self.clocks.first() {
            run_thread(&mut self.first, clocks, gen, sh);
        }
        // Wait for the workers, helping with their split launches meanwhile.
        let done = || sh.remaining.load(Ordering::Acquire) == 0;
        while !self.workers.is_empty() && !done() {
            if sh.board.help() || sh.spin_until(|| done() || sh.board.has_open()) {
                continue;
            }
            let mut d = sh.done.lock().unwrap_or_else(|p| p.into_inner());
            while !done() && !sh.board.has_open() {
                d = sh.done_cv.wait(d).unwrap_or_else(|p| p.into_inner());
            }
        }
        drop(pin);
        if tracing {
            self.traced = Some((gen, since(sh.epoch, started), since(sh.epoch, Instant::now())));
        }
        match sh.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Steps run so far (counting from the step a resume set).
    pub fn steps_run(&self) -> u64 {
        self.shared.step_base.load(Ordering::Relaxed).wrapping_add(self.gen)
    }

    /// Make the next run step `step` (0-based) for step-dependent kernels,
    /// as if `step` runs had gone before (a resumed run). The event
    /// generations keep counting on their own, so this is safe between runs.
    pub fn set_step(&mut self, step: u64) {
        self.shared.step_base.store(step.wrapping_sub(self.gen), Ordering::Relaxed);
    }
}

fn worker(execs: &mut Work, clocks: &Clocks, sh: &Shared) {
    let mut seen = 0;
    loop {
        sh.spin_until(|| sh.gen_now.load(Ordering::Acquire) != seen || sh.board.has_open());
        let gen = {
            let mut s = sh.start.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if s.shutdown {
                    return;
                }
                if s.gen != seen {
                    break s.gen;
                }
                // Idle: help with an open offer of part of a launch.
                if sh.board.has_open() {
                    drop(s);
                    sh.board.help();
                    sh.spin_until(|| sh.gen_now.load(Ordering::Acquire) != seen || sh.board.has_open());
                    s = sh.start.lock().unwrap_or_else(|p| p.into_inner());
                    continue;
                }
                s = sh.start_cv.wait(s).unwrap_or_else(|p| p.into_inner());
            }
        };
        seen = gen;
        run_thread(execs, clocks, gen, sh);
        if sh.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _d = sh.done.lock().unwrap_or_else(|p| p.into_inner());
            sh.done_cv.notify_all();
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        {
            let mut s = self.shared.start.lock().unwrap_or_else(|p| p.into_inner());
            s.shutdown = true;
            self.shared.start_cv.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread runs its lanes as their events allow, not in the order its
    /// items are listed: the host lists a wait for the worker's event before
    /// the record the worker waits for. One fixed order would deadlock; the
    /// lanes finish, step after step.
    #[test]
    fn lanes_run_as_their_events_allow() {
        let host = vec![(0, 0, Exec::Wait(1)), (1, 0, Exec::Record(0))];
        let worker = vec![(2, 0, Exec::Wait(0)), (2, 1, Exec::Record(1))];
        let mut runner = Runner::new(vec![host, worker], 2, "lanes", false, None).expect("starts");
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            for _ in 0..3 {
                tx.send(runner.step().is_ok()).expect("send");
            }
        });
        for step in 0..3 {
            let ok = rx.recv_timeout(std::time::Duration::from_secs(10));
            assert_eq!(ok, Ok(true), "step {step} did not finish");
        }
        t.join().expect("the stepping thread");
    }

    /// The caller takes a free core when the workers leave one, shares the
    /// last worker's when they take them all, and a one-thread plan stays
    /// unpinned.
    #[test]
    fn the_caller_takes_a_free_core_when_there_is_one() {
        // One tower on two cores: the other core, not the tower's.
        assert_eq!(host_core(1, false, Some(2)), Some(1));
        // Two towers on two cores, the host apart: the last tower's core.
        assert_eq!(host_core(2, false, Some(2)), Some(1));
        // The host joined a device's thread: the core after the workers'.
        assert_eq!(host_core(1, true, Some(2)), Some(1));
        // Four towers on eight cores: a core of its own.
        assert_eq!(host_core(4, false, Some(8)), Some(4));
        // The count unknown: share the last worker's, as before.
        assert_eq!(host_core(1, false, None), Some(0));
        assert_eq!(host_core(0, false, Some(2)), None);
    }

    /// A plan without streams (a verified plan may have none) runs as nothing.
    #[test]
    fn a_plan_without_threads_steps() {
        let mut runner = Runner::new(Vec::new(), 0, "empty", false, None).expect("starts");
        assert!(runner.step().is_ok());
        assert_eq!(runner.steps_run(), 1);
    }
}
