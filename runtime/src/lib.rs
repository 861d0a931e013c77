//! # towers-runtime: executing a [`towers_codegen::Plan`]
//!
//! Three seams, so that a new backend or a new transport lands without
//! touching the rest:
//!
//! - [`Session`] (backend-neutral): programs by name, feeds and fetches,
//!   variable declarations with their seeded initial values, checkpoints,
//!   typed errors. It holds a `Box<dyn Backend>` and an `Arc<dyn Comm>`, and
//!   never sees which ones: every read is a copy to host memory
//!   ([`Session::fetch`] returns a `Vec`, [`Session::fetch_into`]
//!   fills a caller's slice without allocating); a feed is copied in
//!   ([`Session::feed`]) or written in place ([`Session::feed_with`]:
//!   the CPU backend lends its arena, the CUDA backend a pinned staging
//!   buffer, for one closure call).
//! - [`Backend`] ([`backend`]): load a plan as a named program, run it, copy
//!   buffers and variables to and from host memory; the backend owns the
//!   variables' storage. [`CpuBackend`] ([`cpu`]) runs every device as a CPU
//!   device: one pinned thread per device, copies elided because memory is
//!   shared, zero allocation per run. [`CudaBackend`] ([`cuda`]) runs the
//!   same plans on GPUs (NVRTC cubins, cuBLAS, streams and events);
//!   [`cuda::probe`] and [`cuda::available`] ask, without panicking,
//!   whether it can start. A mixed session ([`mixed::MixedBackend`]) serves
//!   one plan with a backend per device kind: `cpu:*` on a CPU backend (in
//!   pinned memory, [`host_memory`]), `gpu:*` on CUDA (a context per logical
//!   GPU, [`devices`]), real copies and bridged events between them.
//! - [`Comm`] ([`comm`]): rank, world size, all-reduce (sum) of a buffer
//!   group, broadcast, barrier. [`LocalComm`] is world size 1 (every
//!   session's default) or N threads of one process; MPI and NCCL plug in
//!   here. The plan's `Step::AllReduce` runs through the session's `Comm`.
//!
//! Invariants across the seams: `load` allocates, `run` does not; `run`
//! returns only when the step is complete, so reads, writes and
//! checkpoints never race with kernels; variables are shared by name across
//! programs and their dtype and shape never change; a variable's initial
//! value depends only on its name and the graph seed (when set) or the session seed. Outside `cpu/`, `cuda/`,
//! `host_memory` and the bridge's flags (`mixed::Bridge`) the runtime has no `unsafe`: the session, checkpoints and
//! the in-process communicator only ever see host copies.
//!
//! Modules: [`session`] (load, feed, run, fetch, variables,
//! [`Session::backend_note`]), [`checkpoint`] (atomic safetensors save and
//! checked restore), [`error`] ([`RuntimeError`]), [`backend`], [`cpu`],
//! [`comm`], [`cuda`], [`mixed`] (a plan served by parts of their device
//! kind), [`devices`] (which physical device serves each logical one, and
//! the load-time refusals), [`host_memory`] (pageable or pinned host
//! memory), [`trace`] (a traced step's timeline, backend-neutral).

pub mod backend;
pub mod checkpoint;
pub mod comm;
pub mod cpu;
pub mod cuda;
pub mod devices;
pub mod error;
pub mod host_memory;
pub mod memory;
pub mod mixed;
mod replicas;
pub mod session;
pub mod trace;
mod variables;

pub use backend::{Backend, BackendError, HostSlice, HostSliceMut, Profiled, ProgramId};
pub use comm::{Comm, CommError, LocalComm};
#[cfg(feature = "mpi")]
pub use comm::{MpiComm, MpiReduce};
pub use cpu::CpuBackend;
pub use cuda::{probe, CudaBackend, CudaStatus, CudaUnavailable};
pub use error::RuntimeError;
pub use session::{Element, Session};
pub use trace::{Trace, TraceEvent};
pub use variables::HostVec;
