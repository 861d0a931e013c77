//! # Mixed sessions: one plan, each device served by the backend of its kind
//!
//! A [`MixedBackend`] is a [`crate::Backend`] made of parts ([`Part`]): the
//! plan's `cpu:*` devices are served by a CPU backend (host threads, its
//! memory pinned when a GPU copies it) and its `gpu:*` devices by a CUDA
//! backend (one context per logical GPU), or, to test the same path
//! without a GPU, by a second CPU backend ([`MixedBackend::cpu_pair`]).
//! The placement the compiler reports is then the placement that runs:
//! variables on `/cpu:0` live in host memory and are updated by the CPU
//! kernels, gradients come down and fresh weights go up every step.
//!
//! - [`split`](split::split) divides a plan: devices by kind, streams by
//!   device, events recorded in one part and waited in another bridged,
//!   the other parts' buffers each part's copies name;
//! - [`Part`] is the seam a backend implements to serve its share:
//!   reserve its arenas, lend its memory, load its streams;
//! - [`Bridge`]: the bridged events' flags (set once per step, cleared
//!   between steps), in host memory a GPU stream can write and wait on;
//! - `drive`: every part runs its share of a step at once, part 0 on the
//!   caller's thread, the others on driver threads made with the backend.
//!
//! Invariants, on top of [`crate::backend`]'s:
//! - only copies cross parts, and each is a real copy run by the part of
//!   the stream it sits on (a launch or a collective naming another
//!   part's memory is refused at load);
//! - a variable lives in the part of its device's kind, and reads and
//!   writes of it, of feeds and of fetches go to the part holding them;
//! - the whole plan's order is checked deadlock-free at load, each part's
//!   share taking the bridged events as satisfied;
//! - `run` clears the bridge, runs every part, and returns when all are
//!   done, so between runs nothing executes and no flag is set.

mod backend;
mod bridge;
mod drive;
mod part;
pub mod split;

pub use backend::MixedBackend;
pub use bridge::{Bridge, Ringer};
pub use part::{check_served, Lent, Memory, Part, PartPlan, Reservation};
