//! # The backend seam: what executes a plan
//!
//! A [`Backend`] loads plans as programs, runs them, and moves data between
//! its own memory and the host's **by copying**: a feed is copied in, a fetch
//! or a variable is copied out into a host slice the caller owns. The one
//! exception is a feed written in place ([`Backend::with_feed_buffer`]): the
//! backend lends host memory that *becomes* the feed (the CPU backend its
//! arena, the CUDA backend a pinned staging buffer), for the length of one
//! call of a closure and no longer. So the CPU backend (host arenas,
//! `cpu/`) and a CUDA backend (device arenas) implement the same trait and
//! [`crate::Session`] never sees which one runs.
//!
//! Division of labour with the session (keep it when adding a backend):
//! - the **session** owns names and user errors: programs by name, feeds and
//!   fetches looked up in the plan, dtype and length checks, variable
//!   declarations and their initial values (seeded by session seed and
//!   variable name), checkpoints, the communicator;
//! - the **backend** owns memory and execution: it receives each variable
//!   once ([`Backend::create_variable`], the declaration of the first plan
//!   that names it, with its initial values), holds its storage from then
//!   on, shares it by name between programs, and executes every step of a
//!   loaded plan, `Step::AllReduce` through the [`Comm`] given at load.
//!
//! Invariants a backend keeps:
//! - `load` does everything that allocates (arenas, constants, kernels,
//!   threads or streams); `run` allocates nothing on the host (the no-alloc
//!   test holds the CPU backend to it);
//! - `run` returns only when the step is complete, so reads and writes
//!   between runs never race with the program;
//! - every variable a loaded plan names was created before `load` (the
//!   session guarantees it), and variable storage never moves or resizes;
//! - data crosses the seam as [`HostSlice`]/[`HostSliceMut`]: f32, or i32
//!   for i32 and bool tensors (bools are 4-byte 0/1 values in every plan);
//!   lengths are checked by the session and again by the backend;
//! - memory lent by [`Backend::with_feed_buffer`] is initialized (never
//!   fresh allocations handed out unwritten), lent only between runs and
//!   only for the closure's call, and what the closure leaves there is the
//!   feed the next `run` reads, exactly as if it had been passed to
//!   `write_buffer`; lending allocates nothing (staging is made at `load`).

use std::sync::Arc;

use thiserror::Error;
use towers_codegen::{BufRef, Plan, VariableDecl};

use crate::comm::{Comm, CommError};
use crate::trace::Trace;

/// A loaded program, as numbered by the backend that loaded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProgramId(pub usize);

/// Host data going into a backend: the kernels' typed slice (f32, or i32
/// for i32 and bool tensors), one type for kernels and the backend seam.
pub use towers_kernels::dtype::Slice as HostSlice;
/// Host memory a backend copies into.
pub use towers_kernels::dtype::SliceMut as HostSliceMut;

/// Time spent in one item of a program while profiling was on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profiled {
    /// `gpu:0/compute`.
    pub stream: String,
    /// The kernel name (`gemm`, `weighted_sum`, ...), `copy`, `wait` or `all_reduce`.
    pub kernel: &'static str,
    pub node: String,
    pub nanos: u64,
}

/// What a backend reports; the session adds the program's name.
#[derive(Debug, Error)]
pub enum BackendError {
    /// The plan cannot be executed as written.
    #[error("{0}")]
    BadPlan(String),
    /// A launch failed while running.
    #[error("node '{node}': {detail}")]
    Kernel { node: String, detail: String },
    /// A collective step failed while running.
    #[error("node '{node}': {source}")]
    Collective { node: String, source: CommError },
    /// A buffer or variable the backend does not hold, or of another dtype or length.
    #[error("{0}")]
    Access(String),
    /// The backend's device or driver failed (out of memory, a lost device, ...).
    #[error("{0}")]
    Device(String),
    /// The backend does not offer what was asked (e.g. tracing on CUDA).
    #[error("{0}")]
    Unsupported(String),
}

/// An executor of plans; see the module docs.
pub trait Backend: Send {
    /// "cpu", "cuda", "cpu+cuda" (a mixed session).
    fn name(&self) -> &'static str;

    /// How this backend serves a plan's devices, for the device map and the
    /// load-time device check (by default, from [`Backend::name`]).
    fn kind(&self) -> crate::devices::BackendKind {
        crate::devices::BackendKind::of_name(self.name())
    }

    /// Create the storage of a variable the first time a plan declares it,
    /// holding `init` (the session's initial or restored values).
    fn create_variable(&mut self, decl: &VariableDecl, init: HostSlice<'_>) -> Result<(), BackendError>;

    /// Prepare `plan` to run as program `name`; collectives go through `comm`.
    fn load(&mut self, name: &str, plan: &Plan, comm: Arc<dyn Comm>) -> Result<ProgramId, BackendError>;

    /// Run one step of a loaded program; returns when the step is complete.
    fn run(&mut self, program: ProgramId) -> Result<(), BackendError>;

    /// Copy host data into a buffer of a program (a feed).
    fn write_buffer(&mut self, program: ProgramId, buf: &BufRef, data: HostSlice<'_>) -> Result<(), BackendError>;

    /// Lend `fill` host memory for the feed buffer `buf` of a program (a
    /// buffer of kind `Feed`), typed by the buffer's dtype and of its
    /// length, to write the next feed in place: what `fill` leaves there is
    /// what the next `run` reads, as if passed to [`Backend::write_buffer`].
    /// The memory is initialized but holds unspecified values (this
    /// backend's last feed of the buffer, or zeros): `fill` must write every
    /// element. `fill` is called once, or not at all on an error.
    ///
    /// Returns `Ok(false)` without calling `fill` where the backend has no
    /// memory to lend (the default): the session then fills a scratch
    /// vector of its own, kept per feed, and hands it to `write_buffer`.
    /// The CPU backend lends the arena itself, the CUDA backend a pinned
    /// staging buffer made at load. Allocates nothing.
    fn with_feed_buffer(
        &mut self,
        _program: ProgramId,
        _buf: &BufRef,
        _fill: &mut dyn FnMut(HostSliceMut<'_>),
    ) -> Result<bool, BackendError> {
        Ok(false)
    }

    /// Copy a buffer of a program (a fetch or any tensor) to the host.
    fn read_buffer(&self, program: ProgramId, buf: &BufRef, out: HostSliceMut<'_>) -> Result<(), BackendError>;

    /// Overwrite a variable's value.
    fn write_variable(&mut self, name: &str, data: HostSlice<'_>) -> Result<(), BackendError>;

    /// Copy a variable's value to the host.
    fn read_variable(&self, name: &str, out: HostSliceMut<'_>) -> Result<(), BackendError>;

    /// Turn per-item timing of a program on (totals restart) or off.
    fn set_profiling(&mut self, program: ProgramId, on: bool);

    /// Time spent per item of a program while profiling was on.
    fn profile(&self, program: ProgramId) -> Vec<Profiled>;

    /// Record, in every run of a program from now on (`on`) or no more,
    /// when each launch, copy, wait and collective starts and ends, into
    /// storage reserved at load: a traced run allocates nothing either.
    /// [`BackendError::Unsupported`] where the backend cannot.
    fn set_tracing(&mut self, program: ProgramId, on: bool) -> Result<(), BackendError>;

    /// The timeline of the program's last run while tracing was on.
    fn trace(&self, program: ProgramId) -> Result<Trace, BackendError>;

    /// Steps a program has run.
    fn steps_run(&self, program: ProgramId) -> u64;

    /// Make the program's next run step `step` (0-based) for the kernels
    /// that depend on the step (dropout draws its mask from it), as if
    /// `step` runs had gone before: a resumed run continues the random
    /// streams exactly. `steps_run` then counts from `step`.
    fn set_step(&mut self, program: ProgramId, step: u64);

    /// How this backend runs the plans' GPU devices, for the CLI, e.g. "gpu:0
    /// runs as a CPU device: no CUDA driver found"; `gpus` is non-empty
    /// except for a backend other than "cpu" (where CPU devices are not
    /// trivially CPU devices).
    fn device_note(&self, gpus: &[String]) -> String;
    /// How this backend runs one program's steps, where there is something
    /// to say (the CUDA backend: whether its steps replay a CUDA graph).
    fn program_note(&self, _program: ProgramId) -> Option<String> {
        None
    }
    /// Bytes this backend can still allocate for a program's buffers and new
    /// variables (host memory for the CPU backend), or `None` when it cannot
    /// tell. `Session::load` refuses a plan that needs more, before allocating.
    fn memory_available(&self) -> Option<u64> {
        None
    }
}
