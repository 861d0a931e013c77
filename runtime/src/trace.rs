//! A step's timeline, backend-neutral: when each launch, copy, wait and
//! collective of a program's last traced run started and how long it took,
//! by plan stream. `Session::set_tracing` turns recording on,
//! `Session::trace` reads it; the `towers` crate writes it as a Chrome
//! trace (`towers train --trace FILE`).
//!
//! Invariants a reader may rely on:
//! - `TraceEvent::stream` indexes the `Plan::streams` of the traced
//!   program; a stream's events come in the order of its steps, and never
//!   overlap one another (a stream runs its steps one at a time);
//! - times are nanoseconds: an event's `start_ns` counts from its step's
//!   start, a step's `start_ns` from the moment the program was loaded, so
//!   traces of several steps of one program line up on one clock;
//! - event records take no time and are left out; a copy the backend elides
//!   (the CPU backend's copies between host arenas) is still an event, of
//!   about zero duration, at its place in its stream.

/// One launch, copy, wait or collective of a traced step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    /// Index of its stream in the plan, and of its step in that stream.
    pub stream: usize,
    pub index: usize,
    /// The kernel's name (`gemm`, `weighted_sum`, ...), `copy`, `wait` or `all_reduce`.
    pub kind: &'static str,
    /// The plan step's node (`event N` for a wait).
    pub node: String,
    /// Nanoseconds from the step's start.
    pub start_ns: u64,
    pub dur_ns: u64,
}

/// The timeline of one run of a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The step's number (0-based, counting a resumed run's earlier steps).
    pub step: u64,
    /// Nanoseconds from the program's load to the step's start.
    pub start_ns: u64,
    /// The step's wall time, in nanoseconds.
    pub dur_ns: u64,
    pub events: Vec<TraceEvent>,
}
