//! One thread's step program: its device's streams as lanes, run for one
//! step as their events allow ([`run_thread`]), with large launches split
//! in two parts that an idle thread may take ([`split_run`]).
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::shared::{Shared, MAX_LANES};
use super::Failure;
use crate::cpu::exec::dispatch;
use crate::cpu::prepare::Exec;

/// When one item started and ended in the last traced step, in
/// nanoseconds since [`Shared::epoch`].
#[derive(Default)]
pub(super) struct Span {
    pub(super) start: AtomicU64,
    pub(super) end: AtomicU64,
}

/// Nanoseconds from `epoch` to `t`, saturating.
#[inline]
pub(super) fn since(epoch: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

/// One stream's items on a thread, in stream order, with each item's index
/// in the thread's item list (where its clocks are).
struct Lane {
    execs: Vec<Exec>,
    clock: Vec<usize>,
}

/// One thread's work: its streams as lanes, and a cursor per lane
/// (allocated once, reset every step).
pub(super) struct Work {
    lanes: Vec<Lane>,
    pos: Vec<usize>,
    /// This thread's index (its bell).
    me: usize,
}

impl Work {
    /// Group a thread's items (plan stream, step, item) into lanes, in the
    /// order the streams first appear.
    pub(super) fn new(items: Vec<(usize, Exec)>, me: usize) -> Work {
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
    matches!(x, Exec::Launch(_) | Exec::AllReduce(_) | Exec::Transfer(_))
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
            if let Err(e) = unsafe { crate::cpu::collective::all_reduce(a) } {
                *failed = true;
                let mut slot = sh.error.lock().unwrap_or_else(|p| p.into_inner());
                if slot.is_none() {
                    *slot = Some(Failure::Collective(a.node.clone(), e));
                }
            }
        }
        _ if *failed => {}
        // SAFETY: the two views never overlap (checked at load) and the
        // bridge's flags order them against the other part (super::mem).
        Exec::Transfer(t) => unsafe { t.to.f32_mut().copy_from_slice(t.from.f32()) },
        Exec::Launch(l) => {
            let step = sh.step_base.load(Ordering::Relaxed).wrapping_add(gen - 1);
            // SAFETY: the schedule's events order every cross-stream access (super::mem).
            let r = match crate::cpu::exec::splittable(l) {
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
pub(super) fn run_thread(work: &mut Work, clocks: &Clocks, gen: u64, sh: &Shared) {
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
                watch = match sh.poll() {
                    Some(t) => cv.wait_timeout(watch, t).unwrap_or_else(|p| p.into_inner()).0,
                    None => cv.wait(watch).unwrap_or_else(|p| p.into_inner()),
                };
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
unsafe fn split_run(
    l: &crate::cpu::prepare::Launch,
    n: usize,
    mid: usize,
    cost: usize,
    sh: &Shared,
) -> Result<(), String> {
    let Some(slot) = sh.board.post(l, mid, n, cost) else {
        return crate::cpu::exec::dispatch_range(l, 0, mid).and_then(|()| crate::cpu::exec::dispatch_range(l, mid, n));
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
    let mine = crate::cpu::exec::dispatch_range(l, 0, mid);
    let theirs = sh.board.settle(slot, |ready| sh.spin_until(ready));
    mine.and(theirs)
}

/// One thread's counters, one entry per item: profiled totals and the last traced span.
pub(super) struct Clocks {
    pub(super) times: Vec<AtomicU64>,
    pub(super) spans: Vec<Span>,
}
