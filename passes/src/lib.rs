//! towers-passes: every transformation of a [`Graph`].
//!
//! A pass is one file, one type implementing [`Pass`]; the [`PassManager`]
//! runs a list of them over a graph and a [`CompileState`] (the facts passes
//! hand on to each other: the loss, the gradients, the towers, the schedule),
//! times each pass, runs the verifier after each one in debug builds, and can
//! dump the graph (text and dot) after a named pass into a caller-chosen
//! folder. Passes refer to nodes by name ([`TensorRef`]), never by index held
//! across passes.

pub mod autodiff;
pub mod bind_batch;
pub mod grad_mean;
pub mod manager;
pub mod manual;
pub mod optimizer;
pub mod options;
pub mod pipeline;
pub mod place;
pub mod prune;
pub mod replicate;
pub mod schedule;
pub mod simplify;
pub mod split;
pub mod state;

pub use autodiff::{gradients, Autodiff, GradientResult};
pub use bind_batch::BindBatch;
pub use grad_mean::GradMean;
pub use manager::{Pass, PassManager, PassTiming};
pub use manual::average_gradients;
pub use optimizer::{apply_gradients, ApplyOptimizer, ApplyResult};
pub use options::{BnUpdates, CompileOptions, SplitPolicy, VarPlacement};
pub use pipeline::{Pipeline, PipelineOutput};
pub use place::Place;
pub use prune::Prune;
pub use replicate::Replicate;
pub use schedule::ScheduleStreams;
pub use simplify::Simplify;
pub use split::SplitBatch;
pub use state::{
    CompileState, Diagnostic, PassError, Program, Replica, Schedule, ScheduleItem, ScheduledStream, StreamKind,
    TensorRef,
};
