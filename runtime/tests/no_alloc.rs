//! A training step allocates nothing: counted by a global allocator.

mod common;

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

#[test]
fn run_allocates_nothing() {
    let mut s = towers_runtime::Session::new(1);
    s.load("train", common::mlp_plan()).unwrap();
    s.load("two", common::two_device_plan()).unwrap();
    s.feed_f32("train", "x", &[1.0, 2.0, 3.0, 4.0]).unwrap();
    s.feed_i32("train", "labels", &[0, 1]).unwrap();
    s.feed_f32("two", "x", &[1.0; 6]).unwrap();
    // Warm up (thread-locals of the GEMM, first wake of the workers).
    s.run("train").unwrap();
    s.run("two").unwrap();
    let before = ALLOCS.load(Ordering::SeqCst);
    for _ in 0..20 {
        s.run("train").unwrap();
        s.run("two").unwrap();
    }
    let after = ALLOCS.load(Ordering::SeqCst);
    assert_eq!(after - before, 0, "run allocated {} times", after - before);
}
