//! # towers-codegen: lowering a placed, scheduled graph to a [`Plan`]
//!
//! [`lower`] takes data, not the passes' side state: a
//! [`towers_graph::Graph`] whose nodes all have a device and fully known
//! shapes, and whose program record ([`towers_graph::Program`]: fetches and
//! the stream [`towers_graph::Schedule`], filled in by the pass pipeline in
//! `towers-passes`) says what to run. This crate does not depend on the
//! passes; anything that builds such a graph (the pipeline, or a test by
//! hand) can lower it. The result is a [`Plan`]: per device an arena of
//! buffers with byte offsets, the variables (kept by the backend by name,
//! outside the arenas), constants, feeds, fetches, and per stream its steps
//! (kernel launches with every parameter computed, copies, event records and
//! waits). The plan is the contract both backends execute; it is plain data
//! (serde), deterministic, and readable through [`Plan::to_text`].
//!
//! - [`plan`]: the data types; the closed kernel enum [`Kernel`] and its
//!   parameter blocks are the kernel ABI of `towers_kernels`, re-exported here;
//! - [`lower`](mod@lower): the lowering; `select`: one op to its kernel;
//!   `multi_apply`: consecutive optimizer updates as one multi-tensor launch;
//! - [`arena`]: per-device buffer declaration and offset assignment,
//!   sharing bytes by liveness; [`liveness`]: happens-before between steps
//!   and buffers' live ranges (used by the arena and the verifier);
//! - [`text`]: the text form; [`verify`](mod@verify): the plan verifier and
//!   [`PlanError`], run at the end of [`lower`] and by backends on every plan they load;
//! - [`CodegenError`], in [`error`].
//!
//! Feature `lower` (default) holds the lowering and its fusions, the only
//! part that reads graphs; without it the crate is the plan alone (types,
//! verifier, text, liveness, arena) over `towers_vocab`, which is how the
//! runtime takes it: `towers_runtime` does not depend on `towers_graph`.

pub mod arena;
pub mod error;
#[cfg(feature = "lower")]
pub mod fusion;
pub mod liveness;
#[cfg(feature = "lower")]
pub mod lower;
#[cfg(feature = "lower")]
mod multi_apply;
pub mod plan;
#[cfg(feature = "lower")]
mod select;
pub mod text;
pub mod verify;

pub use error::CodegenError;
#[cfg(feature = "lower")]
pub use lower::lower;
pub use plan::{
    BufRef, Buffer, BufferKind, ConstantDecl, DevicePlan, LowerOptions, Mode, Plan, Step, StreamPlan, UnreadFeed,
    VariableDecl,
};
pub use towers_kernels::{BinaryOp, ConvGeom, Kernel, PoolGeom, UnaryOp};
pub use verify::{verify, PlanError};
