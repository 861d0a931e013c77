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
//! A thread runs its device's streams as lanes, each in stream order, as
//! their events allow ([`run_thread`]): ready bookkeeping first (records,
//! elided copies, passed waits), then one launch of the first lane that has
//! one next; it sleeps only when every lane waits for another thread, and a
//! record wakes only a thread asleep on that event (one bell per thread).
//! Any such order keeps the plan's happens-before, which is all the
//! verifier relies on for buffers that share bytes, so the bits are those
//! of any other order. Measured against one fixed merged order per thread
//! (MLP 784-256-256-10, two towers, 2 cores, interleaved runs): variables
//! on a tower device, round-robin and greedy 1.37-1.52x one device instead
//! of 1.14-1.42x.
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
//! If a launch fails, its thread skips its remaining launches and copies
//! but still records its events, so the other threads finish and the error
//! is reported. A schedule that waits on an event never recorded in the
//! step deadlocks; codegen only emits waits on events it records.
//!
//! A large update or folded tower product (`exec::splittable`) is run as
//! two parts ([`split_run`]): the upper part is posted on the board of
//! offers (`super::offers`) for an idle thread (a worker whose device
//! finished its step, as the towers' devices have when the last gradient's
//! update runs, a thread whose lanes all wait, the caller waiting for the
//! workers, or a poster waiting for its own offer), the lower part runs
//! here. Each element is computed once by the same body over the same two
//! parts, so the bits never depend on the split. Measured on the MLP
//! 784-256-256-10 at two towers, variables on the host: 1.31 ms a step
//! against 1.47-1.55 ms unsplit. Variables on a tower's device gained most
//! from the help of a waiting thread: its update's offer was otherwise open
//! while the only other thread (the caller, with the host's lanes) waited
//! for the step's last event, and the update ran whole (1.55-1.57x one
//! device instead of 1.65-1.67x).
//!
//! A collective step (`Exec::AllReduce`) runs on its stream's thread like a
//! launch, and blocks until every rank of the communicator reached it;
//! collectives live on one stream, so every rank runs them in one order. It
//! runs even after a failed launch (skipping it would leave the other ranks
//! waiting); a failed collective is reported like a failed launch.
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
//! Profiling (off by default) adds the wall time of every launch, copy and
//! wait to a counter preallocated per step item, so it allocates nothing
//! either; [`Runner::profile`] reads the totals. Tracing (off by default)
//! stores each item's start and end, in nanoseconds since the runner was
//! created, into two more counters preallocated per item, and the step's
//! own start and end in the runner: a traced step allocates nothing, and
//! [`Runner::trace`] reads the last traced step's timeline. Elided copies
//! (see `super::prepare`) keep their place as items that do nothing, so
//! profiles and traces show them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::exec::dispatch;
use super::prepare::Exec;
use crate::comm::CommError;
use crate::trace::{Trace, TraceEvent};

/// How long a thread with nothing to run spins before it sleeps (see the module docs).
const SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// The start signal (an idle worker also wakes on it for a help offer).
struct Start {
    gen: u64,
    shutdown: bool,
}

/// State shared by the caller and the workers of one program.
pub struct Shared {
    start: Mutex<Start>,
    start_cv: Condvar,
    /// Parts of split launches open to any idle thread.
    board: super::offers::Board,
    /// Whether the program has worker threads (that may help).
    helpers: bool,
    /// Workers still running this step; the last one to finish takes
    /// `done` and rings `done_cv`.
    remaining: AtomicUsize,
    done: Mutex<()>,
    done_cv: Condvar,
    /// Whether idle threads spin before they sleep (no more threads than cores).
    spin: bool,
    /// The last step started (`Start::gen`), readable without the lock.
    gen_now: AtomicU64,
    events: Vec<AtomicU64>,
    /// Added to the 0-based run number to give the step that step-dependent
    /// kernels (dropout) see: 0 unless a resumed run set the counter
    /// (`Runner::set_step`). Written only between runs; the start signal's
    /// mutex orders it before the workers read it.
    step_base: AtomicU64,
    /// One lock and condvar per thread (its bell), rung by a record of an
    /// event that thread waits on, so a record wakes only its waiters.
    bells: Vec<(Mutex<Watch>, Condvar)>,
    /// Per event, the threads that wait on it.
    waiters: Vec<Vec<usize>>,
    /// Worker threads running their step right now (not asleep, not done).
    awake: AtomicUsize,
    /// Whether thread 0 also runs a device's streams (then it never waits for a core).
    host_joined: bool,
    /// Cores this process may use; when the workers take them all, the host
    /// (which then has no core of its own) runs a launch only while one of
    /// them is free (see `run_thread`).
    cores: usize,
    /// The first failure of the step.
    error: Mutex<Option<Failure>>,
    /// Whether streams time their items.
    profiling: AtomicBool,
    /// Whether streams record when each item starts and ends.
    tracing: AtomicBool,
    /// The origin of traced times.
    epoch: Instant,
}

/// When one item started and ended in the last traced step, in
/// nanoseconds since [`Shared::epoch`].
#[derive(Default)]
struct Span {
    start: AtomicU64,
    end: AtomicU64,
}

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
        Exec::AllReduce(a) => ("all_reduce", a.node.clone()),
        Exec::Wait(e) => ("wait", format!("event {e}")),
        Exec::Record(e) => ("record", format!("event {e}")),
        Exec::Copy(node) => ("copy", node.clone()),
    };
    ItemLabel { kind, node, step }
}

/// Nanoseconds from `epoch` to `t`, saturating.
fn since(epoch: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

impl Shared {
    /// A worker stops running (asleep or done): tell a host waiting for a core.
    fn worker_rests(&self) {
        self.awake.fetch_sub(1, Ordering::AcqRel);
        let (lock, cv) = &self.bells[0];
        let watch = lock.lock().unwrap_or_else(|p| p.into_inner());
        if watch.core {
            cv.notify_all();
        }
    }

    /// The host waits until a core is free: every core was running a worker.
    fn host_waits_for_a_core(&self) {
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
    fn spin_until(&self, ready: impl Fn() -> bool) -> bool {
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

    fn recorded(&self, e: usize, gen: u64) -> bool {
        self.events[e].load(Ordering::Acquire) >= gen
    }

    /// Stamp event `e` and ring the bell of every thread asleep on it.
    fn record(&self, e: usize, gen: u64) {
        self.events[e].store(gen, Ordering::Release);
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
struct Watch {
    events: [usize; MAX_LANES],
    n: usize,
    core: bool,
}

/// Streams per device (compute, copy, collective) with room to spare.
const MAX_LANES: usize = 8;

/// One stream's items on a thread, in stream order, with each item's index
/// in the thread's item list (where its clocks are).
struct Lane {
    execs: Vec<Exec>,
    clock: Vec<usize>,
}

/// One thread's work: its streams as lanes, and a cursor per lane
/// (allocated once, reset every step).
pub struct Work {
    lanes: Vec<Lane>,
    pos: Vec<usize>,
    /// This thread's index (its bell).
    me: usize,
}

impl Work {
    /// Group a thread's items (plan stream, step, item) into lanes, in the
    /// order the streams first appear.
    fn new(items: Vec<(usize, Exec)>, me: usize) -> Work {
        let mut lanes: Vec<(usize, Lane)> = Vec::new();
        for (k, (si, x)) in items.into_iter().enumerate() {
            let lane = match lanes.iter().position(|(s, _)| *s == si) {
                Some(i) => i,
                None => {
                    lanes.push((si, Lane { execs: Vec::new(), clock: Vec::new() }));
                    lanes.len() - 1
                }
            };
            lanes[lane].1.execs.push(x);
            lanes[lane].1.clock.push(k);
        }
        let pos = vec![0; lanes.len()];
        Work { lanes: lanes.into_iter().map(|(_, l)| l).collect(), pos, me }
    }
}

/// Whether an item is work (a launch or a collective) rather than bookkeeping.
fn is_work(x: &Exec) -> bool {
    matches!(x, Exec::Launch(_) | Exec::AllReduce(_))
}

/// Run one item; `failed` is the thread's failure flag.
fn run_item(x: &mut Exec, failed: &mut bool, gen: u64, sh: &Shared) {
    match x {
        Exec::Record(e) => sh.record(*e, gen),
        // Elided: the destination is the source (module docs of `super`).
        Exec::Copy(_) => {}
        // Taken only once recorded (see `run_thread`).
        Exec::Wait(_) => {}
        // A collective runs even after a failure: skipping it would
        // leave the other ranks waiting for this one until they time out.
        Exec::AllReduce(a) => {
            // SAFETY: as for launches; the group's buffers are written by this stream only.
            if let Err(e) = unsafe { super::collective::all_reduce(a) } {
                *failed = true;
                let mut slot = sh.error.lock().unwrap_or_else(|p| p.into_inner());
                if slot.is_none() {
                    *slot = Some(Failure::Collective(a.node.clone(), e));
                }
            }
        }
        _ if *failed => {}
        Exec::Launch(l) => {
            let step = sh.step_base.load(Ordering::Relaxed).wrapping_add(gen - 1);
            // SAFETY: the schedule's events order every cross-stream access (super::mem).
            let r = match super::exec::splittable(l) {
                Some((n, mid, cost)) if sh.helpers => unsafe { split_run(l, n, mid, cost, sh) },
                _ => unsafe { dispatch(l, step) },
            };
            if let Err(msg) = r {
                *failed = true;
                let mut slot = sh.error.lock().unwrap_or_else(|p| p.into_inner());
                if slot.is_none() {
                    *slot = Some(Failure::Kernel(l.node.clone(), msg));
                }
            }
        }
    }
}

/// Run one thread's lanes for step `gen` (1-based), as their events allow:
/// every ready bookkeeping item (records, elided copies, waits whose event
/// is recorded) on every lane first, then one launch or collective of the
/// first lane that has one next; when every lane waits for an event not yet
/// recorded, sleep until this thread's bell rings. Any order that keeps each
/// stream's order and its waits is one the plan allows (the verifier checks
/// every shared buffer against the streams' happens-before, not against a
/// merged order), so this gives the same bits as any other; and it never
/// waits while a stream of its own could go on. Collectives live on one
/// stream, so every rank runs them in the same order.
fn run_thread(work: &mut Work, clocks: &Clocks, gen: u64, sh: &Shared) {
    let Work { lanes, pos, me } = work;
    let worker = *me != 0;
    if worker {
        sh.awake.fetch_add(1, Ordering::AcqRel);
    }
    pos.iter_mut().for_each(|p| *p = 0);
    let mut failed = false;
    let profiling = sh.profiling.load(Ordering::Relaxed);
    let tracing = sh.tracing.load(Ordering::Relaxed);
    let timed = profiling || tracing;
    // When this thread last began to sleep: charged to the wait it then takes.
    let mut slept: Option<Instant> = None;
    let run = |lane: &mut Lane, k: usize, failed: &mut bool, slept: &mut Option<Instant>| {
        let wait = matches!(lane.execs[k], Exec::Wait(_));
        let t = timed.then(|| if wait { slept.take().unwrap_or_else(Instant::now) } else { Instant::now() });
        run_item(&mut lane.execs[k], failed, gen, sh);
        if let Some(t) = t {
            let (i, end) = (lane.clock[k], Instant::now());
            if profiling {
                clocks.times[i].fetch_add(since(t, end), Ordering::Relaxed);
            }
            if tracing {
                clocks.spans[i].start.store(since(sh.epoch, t), Ordering::Relaxed);
                clocks.spans[i].end.store(since(sh.epoch, end), Ordering::Relaxed);
            }
        }
    };
    loop {
        // Every ready bookkeeping item, until none is (a record may free a wait).
        let mut again = true;
        while again {
            again = false;
            for (lane, p) in lanes.iter_mut().zip(pos.iter_mut()) {
                while let Some(x) = lane.execs.get(*p) {
                    match x {
                        Exec::Wait(e) if !sh.recorded(*e, gen) => break,
                        x if is_work(x) => break,
                        Exec::Record(_) => again = true,
                        _ => {}
                    }
                    run(lane, *p, &mut failed, &mut slept);
                    *p += 1;
                }
            }
        }
        // Then one launch or collective.
        if let Some(li) = (0..lanes.len()).find(|&li| lanes[li].execs.get(pos[li]).is_some_and(is_work)) {
            if !worker && !sh.host_joined {
                sh.host_waits_for_a_core();
            }
            run(&mut lanes[li], pos[li], &mut failed, &mut slept);
            pos[li] += 1;
            continue;
        }
        if lanes.iter().zip(pos.iter()).all(|(l, p)| *p >= l.execs.len()) {
            if worker {
                sh.worker_rests();
            }
            return;
        }
        // Every lane waits for another thread's event: spin a while, then
        // sleep until one comes.
        let blocked = |e: usize| !sh.recorded(e, gen);
        let waiting = |lanes: &[Lane], pos: &[usize]| {
            lanes.iter().zip(pos.iter()).all(|(l, p)| match l.execs.get(*p) {
                Some(Exec::Wait(e)) => blocked(*e),
                Some(_) => false,
                None => true,
            })
        };
        if timed && slept.is_none() {
            slept = Some(Instant::now());
        }
        // A thread waiting in its step helps with an open offer too.
        if sh.spin_until(|| !waiting(lanes, pos) || sh.board.has_open()) {
            sh.board.help();
            continue;
        }
        let (lock, cv) = &sh.bells[*me];
        let mut watch = lock.lock().unwrap_or_else(|p| p.into_inner());
        // Only records of the events at the lanes' heads ring this bell.
        watch.n = 0;
        for (l, p) in lanes.iter().zip(pos.iter()) {
            if let (Some(Exec::Wait(e)), true) = (l.execs.get(*p), watch.n < MAX_LANES) {
                let n = watch.n;
                watch.events[n] = *e;
                watch.n += 1;
            }
        }
        if waiting(lanes, pos) {
            if worker {
                // Lock order: the host's bell is taken without this one held.
                drop(watch);
                sh.worker_rests();
                watch = lock.lock().unwrap_or_else(|p| p.into_inner());
            }
            while waiting(lanes, pos) && !sh.board.has_open() {
                watch = cv.wait(watch).unwrap_or_else(|p| p.into_inner());
            }
            if worker {
                sh.awake.fetch_add(1, Ordering::AcqRel);
            }
        }
        watch.n = 0;
    }
}

/// Run a splittable launch of `n` elements (or rows) as two parts, `[0,
/// mid)` and `[mid, n)` (see `exec::splittable`): the upper part (of work
/// `cost`) is posted on the board of offers (`super::offers`), the lower
/// part runs here, then the offer is settled (taken back, or waited for
/// while helping with others). Every element is computed once, by the same
/// body over the same two parts, so the bits do not depend on who ran them.
/// A launch that finds the board full runs both parts here.
///
/// # Safety
/// As [`dispatch`].
unsafe fn split_run(l: &super::prepare::Launch, n: usize, mid: usize, cost: usize, sh: &Shared) -> Result<(), String> {
    let Some(slot) = sh.board.post(l, mid, n, cost) else {
        return super::exec::dispatch_range(l, 0, mid).and_then(|()| super::exec::dispatch_range(l, mid, n));
    };
    // Wake the idle: workers between steps, threads asleep in their step,
    // and the caller waiting for the workers. (Taking each lock first: a
    // sleeper checks for offers under its lock, then waits.)
    drop(sh.start.lock().unwrap_or_else(|p| p.into_inner()));
    sh.start_cv.notify_all();
    for (lock, cv) in &sh.bells {
        let _watch = lock.lock().unwrap_or_else(|p| p.into_inner());
        cv.notify_all();
    }
    drop(sh.done.lock().unwrap_or_else(|p| p.into_inner()));
    sh.done_cv.notify_all();
    let mine = super::exec::dispatch_range(l, 0, mid);
    let theirs = sh.board.settle(slot, |ready| sh.spin_until(ready));
    mine.and(theirs)
}

/// One thread's counters, one entry per item: profiled totals and the last traced span.
struct Clocks {
    times: Vec<AtomicU64>,
    spans: Vec<Span>,
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
    ) -> Result<Runner, String> {
        let shared = Arc::new(Shared {
            start: Mutex::new(Start { gen: 0, shutdown: false }),
            start_cv: Condvar::new(),
            board: super::offers::Board::new(),
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
        });
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
        let mut runner = Runner { first, shared, workers: Vec::new(), gen: 0, labels, clocks, traced: None };
        for (k, mut execs) in works.into_iter().enumerate() {
            let sh = Arc::clone(&runner.shared);
            let t = Arc::clone(&runner.clocks[k + 1]);
            let handle = std::thread::Builder::new()
                .name(format!("towers-{program}-thread{}", k + 1))
                .spawn(move || {
                    super::affinity::pin_worker(k);
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
        // The caller shares the last worker's core, or has the next core to
        // itself when it runs a device's streams too.
        let workers = self.workers.len();
        let core = if sh.host_joined { Some(workers) } else { workers.checked_sub(1) };
        let pin = core.map(super::affinity::HostPin::new);
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
        let mut runner = Runner::new(vec![host, worker], 2, "lanes", false).expect("starts");
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

    /// A plan without streams (a verified plan may have none) runs as nothing.
    #[test]
    fn a_plan_without_threads_steps() {
        let mut runner = Runner::new(Vec::new(), 0, "empty", false).expect("starts");
        assert!(runner.step().is_ok());
        assert_eq!(runner.steps_run(), 1);
    }
}
