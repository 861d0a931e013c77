//! towers: a computation-graph compiler for synchronous data-parallel training.
//!
//! Users write graph-building Rust with TF1 scopes (name scopes, variable
//! scopes whose variables are created once and reused, device scopes); the
//! compiler differentiates the loss, replicates the forward and backward
//! subgraph once per tower, splits the batch, averages the gradients
//! (weighted by each tower's share, so N towers compute exactly the
//! single-device update), applies the optimizer where the variables live,
//! places everything, and lowers it to a `Plan` of launches, copies and
//! events that the runtime executes (the CPU backend runs it for real).
//!
//! Crates: [`graph`] (IR and builder), [`passes`] (autodiff, optimizer, tower
//! passes, placement, schedule), [`codegen`] (the `Plan`), [`kernels`] (CPU
//! kernels), [`runtime`] (sessions, the CPU backend, checkpoints).

pub mod compiler;
pub mod config;
pub mod cost;
pub mod cuda_emit;
pub mod data;
pub mod guards;
pub mod logdir;
pub mod models;
pub mod outputs;
pub mod plot;
pub mod report;
pub mod resume;
pub mod saver;
pub mod schedule;
pub mod trace;
pub mod train;
pub mod trainer;
pub mod watch;

pub use towers_codegen as codegen;
pub use towers_graph as graph;
pub use towers_kernels as kernels;
pub use towers_passes as passes;
pub use towers_runtime as runtime;

/// Everything a model-building program needs.
pub mod prelude {
    pub use crate::compiler::{compile_eval, compile_manual, compile_train, CompileError, CompileOptions, Compiled};
    pub use crate::report::placement_report;
    pub use towers_graph::dot::to_dot;
    pub use towers_graph::layers::{
        self, Activation, BatchNormOptions, Conv2dOptions, DenseOptions, DropoutOptions, LayerDefaults, Naming,
        Normalizer, Pool2dOptions, Regularizer,
    };
    pub use towers_graph::{
        keys, AxisIndex, BinaryOp, DType, Device, Distribution, FanMode, Graph, GraphBuilder, GraphError, Initializer,
        Op, Optimizer, PadMode, Padding, Reuse, Shape, Tensor, UnaryOp, F32,
    };
    pub use towers_passes::{
        apply_gradients, average_gradients, gradients, BnUpdates, ProcessGroup, PsStrategy, SplitPolicy, VarPlacement,
    };
    pub use towers_runtime::{RuntimeError, Session};
}
