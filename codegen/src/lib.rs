//! # towers-codegen: lowering a placed, scheduled graph to a [`Plan`]
//!
//! [`lower`] turns a [`towers_graph::Graph`] whose nodes all have a device
//! and fully known shapes, plus the [`towers_passes::Schedule`] in its
//! [`towers_passes::CompileState`], into a [`Plan`]: per device an arena of
//! buffers with byte offsets, the variables (kept by the backend by name,
//! outside the arenas), constants, feeds, fetches, and per stream its steps
//! (kernel launches with every parameter computed, copies, event records and
//! waits). The plan is the contract both backends execute; it is plain data
//! (serde), deterministic, and readable through [`Plan::to_text`].
//!
//! - [`plan`]: the data types; the closed kernel enum [`Kernel`] and its
//!   parameter blocks are the kernel ABI of `towers_kernels`, re-exported here;
//! - [`lower`](mod@lower): the lowering; `select`: one op to its kernel;
//! - [`text`]: the text form; [`error`]: [`CodegenError`].

pub mod error;
pub mod lower;
pub mod plan;
mod select;
pub mod text;

pub use error::CodegenError;
pub use lower::lower;
pub use plan::{
    BufRef, Buffer, BufferKind, ConstantDecl, DevicePlan, LowerOptions, Mode, Plan, Step, StreamPlan, VariableDecl,
};
pub use towers_kernels::{BinaryOp, ConvGeom, Kernel, PoolGeom, UnaryOp};
