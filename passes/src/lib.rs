//! towers-passes: every transformation of a [`Graph`](towers_graph::Graph), and the pipeline
//! that lists them once.
//!
//! A pass is one file, one type implementing [`Pass`]; the [`PassManager`]
//! runs a list of them over a graph and a [`CompileState`], times each pass,
//! runs the verifier after each one in debug builds, and can dump the graph
//! (text and dot) after a named pass into a caller-chosen folder. Passes
//! refer to nodes by name ([`TensorRef`]), never by index held across passes.
//!
//! The seam to codegen is the graph alone:
//! - [`pipeline`] holds the train and eval pass lists, written once
//!   (`prune -> [open_batch] -> autodiff -> bind_batch -> [replicate -> split -> grad_mean]
//!   -> simplify -> [tower_cse] -> [tower_matmul] -> apply -> place ->
//!   {all_reduce} -> schedule`; eval: `prune -> bind_batch
//!   -> simplify -> place -> schedule`), seeded from [`CompileOptions`]; it
//!   returns the placed, scheduled graph. Tests run a prefix of the same
//!   list ([`Pipeline::before`]) instead of spelling it again.
//! - What lowering needs travels *in* the graph: its program record
//!   ([`Program`], `g.program()`: fetches, train op, [`Schedule`]), defined in
//!   `towers-graph` so codegen never imports this crate. Passes write it
//!   (`apply` the train op and loss fetch, `schedule` the streams); it shows
//!   in `--dump-after` text dumps and round-trips through the graph's JSON.
//! - [`CompileState`] holds only what passes hand each other (the loss,
//!   gradients, towers, replicas, batch, diagnostics); codegen never sees it.

pub mod all_reduce;
pub mod autodiff;
pub mod bind_batch;
pub mod clip;
pub mod grad_mean;
pub mod loss_kind;
pub mod manager;
pub mod manual;
pub mod optimizer;
pub mod options;
pub mod pipeline;
pub mod place;
pub mod prune;
pub mod ps;
pub mod ps_exchange;
pub mod replicate;
pub mod schedule;
pub mod simplify;
pub mod split;
pub mod state;
pub mod tower_cse;
pub mod tower_matmul;
pub mod var_list;

pub use all_reduce::AllReduceBuckets;
pub use autodiff::{gradients, Autodiff, GradientResult};
pub use bind_batch::{BindBatch, OpenBatch};
pub use grad_mean::GradMean;
pub use manager::{Pass, PassManager, PassTiming};
pub use manual::average_gradients;
pub use optimizer::{apply_gradients, ApplyOptimizer, ApplyResult};
pub use options::{
    BnUpdates, CompileOptions, ProcessGroup, PsStrategy, SplitPolicy, VarPlacement, DEFAULT_BUCKET_BYTES,
};
pub use pipeline::{Pipeline, PipelineOutput};
pub use place::Place;
pub use prune::Prune;
pub use ps_exchange::{PsExchange, PsGroup};
pub use replicate::Replicate;
pub use schedule::ScheduleStreams;
pub use simplify::Simplify;
pub use split::{ProcessShare, SplitBatch};
pub use state::{
    Bucket, CompileState, Diagnostic, PassError, Program, Replica, Schedule, ScheduleItem, ScheduledStream, StreamKind,
    TensorRef,
};
pub use tower_cse::TowerCse;
pub use tower_matmul::TowerMatMuls;
