//! Splitting one launch between threads: the board of open offers.
//!
//! A thread that runs a splittable launch (`exec::splittable`: a large
//! update, or a folded weight gradient's product) posts its upper part on
//! the board and runs the lower part itself. Any idle thread takes an open
//! offer (the one of most work first): a worker that finished its step, a
//! thread whose lanes all wait, or a thread that posted an offer of its own
//! and is waiting for it. When the poster is done with its part, it helps
//! with the open offer of most work (its own, taken back, or another
//! launch's larger one) until its own is finished. Several launches on
//! several threads (variables on different devices) can be split at once:
//! with two towers, one thread takes the other's larger part while the
//! other finishes both parts of the smaller. (Taking one's own part back
//! first measured 1.46-1.49x one device with greedy placement, the two
//! weight gradients' products on two threads, against 1.6x and more.)
//!
//! Invariants:
//! - a part runs exactly once, by one thread, through
//!   `exec::dispatch_range` over the same two ranges whoever runs them, so
//!   the bits never depend on the split;
//! - the poster does not return before its offer is finished (or taken
//!   back), so the launch it points to outlives every part;
//! - running a part never waits for anything, so helping cannot deadlock.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use super::prepare::Launch;

/// Offers open at once; a launch that finds the board full runs both parts.
const SLOTS: usize = 8;

/// One part of a split launch: elements (or rows) `[lo, hi)`.
#[derive(Clone, Copy)]
struct Job {
    launch: *const Launch,
    lo: usize,
    hi: usize,
}

// SAFETY: the launch outlives the job (module invariants).
unsafe impl Send for Job {}

struct Offer {
    job: Job,
    /// An estimate of the part's work, to take the largest first.
    cost: usize,
    claimed: bool,
    finished: bool,
    result: Result<(), String>,
}

/// The open offers of one program (see the module docs).
pub struct Board {
    slots: Mutex<[Option<Offer>; SLOTS]>,
    /// Rung when an offer is posted or finished (its poster may be waiting).
    cv: Condvar,
    /// Offers posted and not yet claimed, readable by spinning threads.
    open: AtomicUsize,
    /// Parts finished so far (spinning posters watch it change).
    finished: AtomicU64,
}

fn run(job: Job) -> Result<(), String> {
    // SAFETY: the poster keeps the launch alive and touches only other
    // elements until the part is finished (module invariants).
    unsafe { super::exec::dispatch_range(&*job.launch, job.lo, job.hi) }
}

impl Board {
    pub fn new() -> Board {
        Board {
            slots: Mutex::new(std::array::from_fn(|_| None)),
            cv: Condvar::new(),
            open: AtomicUsize::new(0),
            finished: AtomicU64::new(0),
        }
    }

    /// Whether an offer waits for a thread.
    pub fn has_open(&self) -> bool {
        self.open.load(Ordering::Acquire) > 0
    }

    /// Post range `[lo, hi)` of `launch` (work `cost`); its slot, or None
    /// when the board is full.
    pub fn post(&self, launch: &Launch, lo: usize, hi: usize, cost: usize) -> Option<usize> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let i = slots.iter().position(Option::is_none)?;
        let job = Job { launch, lo, hi };
        slots[i] = Some(Offer { job, cost, claimed: false, finished: false, result: Ok(()) });
        self.open.fetch_add(1, Ordering::AcqRel);
        self.cv.notify_all();
        Some(i)
    }

    /// Claim the open offer of most work and run it; whether there was one.
    pub fn help(&self) -> bool {
        let (i, job) = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let best = slots
                .iter_mut()
                .enumerate()
                .filter_map(|(i, s)| s.as_mut().filter(|o| !o.claimed).map(|o| (i, o)))
                .max_by_key(|(i, o)| (o.cost, std::cmp::Reverse(*i)));
            let Some((i, offer)) = best else { return false };
            offer.claimed = true;
            self.open.fetch_sub(1, Ordering::AcqRel);
            (i, offer.job)
        };
        let r = run(job);
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = slots[i].as_mut() {
            (o.finished, o.result) = (true, r);
        }
        self.finished.fetch_add(1, Ordering::AcqRel);
        self.cv.notify_all();
        true
    }

    /// The poster's side once its own part is done: help with the open
    /// offer of most work (its own, taken back, or a larger one of another
    /// launch) until its own offer is finished; that offer's result.
    /// `spin(ready)` spins a while until `ready` holds (see
    /// `sched::Shared::spin_until`).
    pub fn settle(&self, i: usize, spin: impl Fn(&dyn Fn() -> bool) -> bool) -> Result<(), String> {
        loop {
            {
                let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
                let Some(o) = slots[i].as_mut() else { return Err("a split launch lost its offer".into()) };
                if o.finished {
                    let r = std::mem::replace(&mut o.result, Ok(()));
                    slots[i] = None;
                    return r;
                }
            }
            if self.help() {
                continue;
            }
            // Wait for a part to finish or an offer to come, spinning first.
            let seen = self.finished.load(Ordering::Acquire);
            if spin(&|| self.finished.load(Ordering::Acquire) != seen || self.has_open()) {
                continue;
            }
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            while slots[i].as_ref().is_some_and(|o| !o.finished) && !self.has_open() {
                slots = self.cv.wait(slots).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty board has nothing to help with; settling a slot never posted is an error, not a hang.
    #[test]
    fn an_empty_board() {
        let b = Board::new();
        assert!(!b.has_open());
        assert!(!b.help());
        assert!(b.settle(0, |_| false).is_err());
    }
}
