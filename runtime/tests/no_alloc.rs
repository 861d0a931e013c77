//! A training step allocates nothing: counted by a global allocator.

mod common;

use towers_runtime::Session;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static A: Counting = Counting;

/// The count is global (every thread of the process): one test function
/// runs every case in turn, so that neither a concurrent test nor the test
/// harness reporting a finished one can allocate inside a measured window.
#[test]
fn steps_allocate_nothing() {
    run_allocates_nothing();
    feeds_allocate_nothing();
    a_step_with_all_reduces_across_two_ranks_allocates_nothing();
    a_traced_step_allocates_nothing();
    a_mixed_step_allocates_nothing();
}

/// A mixed session (host part and device part, copies and bridged events
/// between them, the device part driven by its own thread) allocates
/// nothing per step either.
fn a_mixed_step_allocates_nothing() {
    let backend = towers_runtime::mixed::MixedBackend::cpu_pair().unwrap();
    let mut s = Session::with_backend(1, Box::new(backend));
    s.load("two", common::two_device_plan()).unwrap();
    s.feed("two", "x", &[1.0; 6]).unwrap();
    s.run("two").unwrap();
    let before = ALLOCS.load(Ordering::SeqCst);
    for _ in 0..20 {
        s.feed("two", "x", &[2.0; 6]).unwrap();
        s.run("two").unwrap();
    }
    let after = ALLOCS.load(Ordering::SeqCst);
    assert_eq!(after - before, 0, "a mixed step allocated {} times", after - before);
}

/// A session with the one-device "train" and the two-device "two" programs, fed.
fn fed_session() -> towers_runtime::Session {
    let mut s = towers_runtime::Session::new(1);
    s.load("train", common::mlp_plan()).unwrap();
    s.load("two", common::two_device_plan()).unwrap();
    s.feed("train", "x", &[1.0, 2.0, 3.0, 4.0]).unwrap();
    s.feed("train", "labels", &[0, 1]).unwrap();
    s.feed("train", "g", &[1.0, 2.0, 3.0, 4.0]).unwrap();
    s.feed("two", "x", &[1.0; 6]).unwrap();
    s
}

fn run_allocates_nothing() {
    let mut s = fed_session();
    // Warm up (thread-locals of the GEMM, first wake of the workers).
    s.run("train").unwrap();
    s.run("two").unwrap();
    let before = ALLOCS.load(Ordering::SeqCst);
    let mut loss = [0f32];
    for k in 0..20 {
        // What the training loop does around each step: the schedule's
        // learning rate in, the step, the loss out.
        s.write_variable("learning_rate", &[0.5 / (k + 1) as f32]).unwrap();
        s.run("train").unwrap();
        s.fetch_into("train", "loss", &mut loss).unwrap();
        s.run("two").unwrap();
    }
    let after = ALLOCS.load(Ordering::SeqCst);
    assert_eq!(after - before, 0, "run allocated {} times", after - before);
}

/// Feeding, by copy or in place, allocates nothing: on the CPU backend
/// (which lends its arena) and on a backend that lends no memory (the
/// session's scratch, made at that feed's first in-place write, before the
/// measured steps).
fn feeds_allocate_nothing() {
    let fallback = Session::with_backend(1, Box::new(common::CopyingFeeds(towers_runtime::CpuBackend::new(), None)));
    for (backend, mut s) in [("cpu", Session::new(1)), ("copying", fallback)] {
        s.load("train", common::mlp_plan()).unwrap();
        s.load("two", common::two_device_plan()).unwrap();
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let step = |s: &mut Session, k: usize| {
            // The gather a training loop does, straight into the feeds.
            s.feed_with("train", "x", |b| {
                for (i, v) in b.iter_mut().enumerate() {
                    *v = x[i] * (k % 3) as f32;
                }
            })
            .unwrap();
            s.feed_with("train", "labels", |b| b.copy_from_slice(&[(k % 2) as i32, 1])).unwrap();
            s.feed("train", "g", &x).unwrap();
            s.feed_with("two", "x", |b| b.fill(k as f32 - 1.5)).unwrap();
            s.run("train").unwrap();
            s.run("two").unwrap();
        };
        step(&mut s, 0);
        step(&mut s, 1);
        let before = ALLOCS.load(Ordering::SeqCst);
        for k in 0..20 {
            step(&mut s, k);
        }
        let after = ALLOCS.load(Ordering::SeqCst);
        assert_eq!(after - before, 0, "{backend}: fed steps allocated {} times", after - before);
        // The feeds were real: out = -relu(x) of the last one (19 - 1.5).
        assert_eq!(s.fetch::<f32>("two", "out").unwrap(), [-17.5; 6], "{backend}");
    }
}

fn a_step_with_all_reduces_across_two_ranks_allocates_nothing() {
    use std::sync::{Arc, Barrier};
    use towers_runtime::{Comm, LocalComm};
    // Both ranks warm up, meet, run 20 steps each, meet again: the count is
    // read by rank 0 at the two meetings, so only the steps fall between.
    let meet = Arc::new(Barrier::new(2));
    let handles: Vec<_> = LocalComm::group(2)
        .into_iter()
        .map(|comm| {
            let meet = Arc::clone(&meet);
            std::thread::spawn(move || {
                let rank = comm.rank();
                let mut s = towers_runtime::Session::new(1).with_comm(Arc::new(comm));
                s.load("two", common::two_device_plan_with_all_reduce()).unwrap();
                s.feed("two", "x", &[1.0; 6]).unwrap();
                s.run("two").unwrap();
                s.run("two").unwrap();
                meet.wait();
                let before = ALLOCS.load(Ordering::SeqCst);
                for _ in 0..20 {
                    s.run("two").unwrap();
                }
                meet.wait();
                let after = ALLOCS.load(Ordering::SeqCst);
                (rank, after - before)
            })
        })
        .collect();
    for h in handles {
        let (rank, n) = h.join().unwrap();
        assert_eq!(n, 0, "rank {rank}: the steps allocated {n} times");
    }
}

fn a_traced_step_allocates_nothing() {
    let mut s = fed_session();
    s.set_tracing("train", true).unwrap();
    s.set_tracing("two", true).unwrap();
    s.set_profiling("two", true).unwrap();
    s.run("train").unwrap();
    s.run("two").unwrap();
    let before = ALLOCS.load(Ordering::SeqCst);
    for _ in 0..20 {
        s.run("train").unwrap();
        s.run("two").unwrap();
    }
    let after = ALLOCS.load(Ordering::SeqCst);
    assert_eq!(after - before, 0, "traced runs allocated {} times", after - before);
    // The last run's timeline is there (reading it allocates, after the steps).
    // Both programs train, so they count one session step (TF1's
    // global_step): 42 runs, the last of them step 41.
    let t = s.trace("two").unwrap();
    assert_eq!(t.step, 41);
    assert_eq!(t.events.len(), 4, "{t:?}");
}
