//! # towers-runtime: executing a [`towers_codegen::Plan`]
//!
//! The CPU backend: a [`Session`] owns the variable store (host memory by
//! variable name, shared by every loaded program) and runs loaded plans.
//! `/gpu:i` devices run as CPU devices; [`cuda::probe`] reports whether a
//! CUDA driver exists, without panicking. All devices of the CPU backend share
//! host memory, so the plan's copies are elided at load (a copy's consumers
//! read its source after the copy's event; see `prepare::copy_aliases` for why
//! that is sound): the events, and so the cross-device ordering, stay.
//!
//! - [`session`]: load, feed, run, fetch, variables, [`Session::backend_note`];
//! - `sched`, `threads`: one thread per device (the host on the caller), events;
//! - `mem`: the only `unsafe` memory access and its invariant;
//! - `prepare`, `exec`: load-time resolution and kernel dispatch;
//! - [`checkpoint`]: atomic safetensors save and checked restore;
//! - [`error`]: [`RuntimeError`].

mod affinity;
pub mod checkpoint;
pub mod cuda;
pub mod error;
mod exec;
mod mem;
mod prepare;
mod sched;
pub mod session;
mod store;
mod threads;

pub use cuda::{probe, CudaStatus};
pub use error::RuntimeError;
pub use session::{Profiled, Session};
