//! The state passes hand on to each other, and the crate's error type.
//!
//! [`CompileState`] holds only what passes tell each other (the loss, the
//! gradients, the towers and replicas, the batch, diagnostics). What
//! lowering needs (fetches, train op, schedule) is the graph's program
//! record ([`towers_graph::Program`], `g.program()`), so that it travels with
//! the graph into dumps, serde and codegen; its types are re-exported here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use towers_graph::{Device, GraphError};

pub use towers_graph::program::{Program, Schedule, ScheduleItem, ScheduledStream, StreamKind, TensorRef};

/// A warning a pass reports without failing (e.g. a variable with no gradient).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    pub pass: String,
    pub message: String,
}

/// Facts handed from pass to pass.
#[derive(Debug, Clone, Default)]
pub struct CompileState {
    /// The scalar loss of the model (before replication: the single tower's).
    pub loss: Option<TensorRef>,
    /// Variables to train, by name: the trainable variables in creation
    /// order, or the user's `CompileOptions::var_list` in its order (`prune`
    /// then drops those the loss does not reach).
    pub var_list: Vec<String>,
    /// The user's `CompileOptions::var_list` as given (empty: every
    /// trainable variable). Kept apart from `var_list` so that a list whose
    /// every variable `prune` removed is an error, never "all of them".
    pub requested_vars: Vec<String>,
    /// Gradient of the loss per variable (after `grad_mean`: the reduced one).
    pub grads: BTreeMap<String, TensorRef>,
    /// Per tower (index = tower), per variable: that tower's gradient (set by `replicate`).
    pub tower_grads: Vec<BTreeMap<String, TensorRef>>,
    /// Per tower: that tower's loss (set by `replicate`).
    pub tower_losses: Vec<TensorRef>,
    /// The devices of the towers (empty = one device, no replication).
    pub towers: Vec<Device>,
    /// Each tower's share of the global batch (sums to 1).
    pub tower_weights: Vec<f64>,
    /// Each tower's number of examples per step.
    pub tower_batches: Vec<usize>,
    /// The batch size bound to the placeholders' unknown dimension: the
    /// global batch, or with several processes this process's rows of it.
    pub batch_size: Option<usize>,
    /// With several processes: the global batch over all of them (the
    /// replicas' weights are shares of it). `None` for one process.
    pub global_batch: Option<usize>,
    /// Set by `all_reduce` with several processes: the gradient buckets, in
    /// the order their all-reduces start.
    pub buckets: Vec<Bucket>,
    /// Warnings collected along the way.
    pub diagnostics: Vec<Diagnostic>,
    /// Set by `bind_batch`: the placeholders whose dimension 0 is the global batch
    /// (the ones `split` divides across replicas), in creation order.
    pub batch_inputs: Vec<String>,
    /// Set by `replicate`: one entry per replica (tower × micro-batch), in
    /// replica order; `tower_grads`, `tower_losses`, `tower_batches` and
    /// `tower_weights` are indexed by replica (with one micro-batch per tower,
    /// replica = tower).
    pub replicas: Vec<Replica>,
    /// Set by `ps_exchange` (`--variables ps` across processes): each
    /// owning rank and the variables it broadcasts after every step.
    pub ps_groups: Vec<crate::ps_exchange::PsGroup>,
}

/// One all-reduce of several tensors of one device (DDP's gradient bucket).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// The `AllReduce` node.
    pub node: String,
    pub device: Device,
    /// The reduced tensors' nodes (`TowerMean`s), in the order the backward pass finishes them.
    pub members: Vec<String>,
    /// Their total size.
    pub bytes: usize,
    /// The rank its sums go to (`--variables ps`: a reduce to the owner of
    /// every member's variable); `None`: every rank (an all-reduce).
    #[serde(default)]
    pub root: Option<usize>,
}

/// One copy of the forward and backward subgraph: tower `tower`, micro-batch `micro`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    pub tower: usize,
    pub micro: usize,
    /// The name prefix of its nodes, with a trailing slash (`tower_1/`, `tower_1/micro_0/`).
    pub prefix: String,
}

impl CompileState {
    pub fn warn(&mut self, pass: &str, message: impl Into<String>) {
        self.diagnostics.push(Diagnostic { pass: pass.to_string(), message: message.into() });
    }
}

/// Errors of the passes; each names the node or variable and says how to fix it.
#[derive(Debug, Error)]
pub enum PassError {
    #[error(transparent)]
    Graph(#[from] GraphError),

    #[error(
        "No gradients provided for any variable: the loss '{loss}' does not depend on any of the variables [{vars}]. Check that the loss is computed from the model's variables and that no StopGradient cuts every path.{cut}"
    )]
    NoGradients {
        loss: String,
        vars: String,
        /// Empty, or a sentence naming the non-differentiable nodes
        /// (`in_top_k`, `argmax`, a cast, a comparison) where the paths from
        /// the variables to the loss stop.
        cut: String,
    },

    #[error("No gradient defined for operation '{node}' (op type: {op}); wrap its input in stop_gradient if no gradient should flow through it")]
    NoGradientDefined { node: String, op: String },

    #[error("the loss '{loss}' must be a scalar f32, but it is {ty}; reduce it with reduce_mean first")]
    LossNotScalar { loss: String, ty: String },

    #[error("No variables to optimize.")]
    NoVariables,

    /// TF1's "No variables to optimize.", naming the loss: nothing it
    /// depends on is a trainable variable (a placeholder or constant given
    /// as the loss, or a model whose variables are all non-trainable).
    #[error("No variables to optimize: the loss '{loss}' depends on no trainable variable; give the loss of the model (a reduce_mean over its per-example losses), or make its variables trainable")]
    LossReachesNoVariable { loss: String },

    #[error("pass '{pass}' needs {what}, which no earlier pass provided; run it after {after}")]
    MissingState { pass: String, what: String, after: String },

    #[error("invalid compiler options: {0}")]
    Options(String),

    #[error("cannot split a global batch of {batch} examples across {towers} towers{detail}")]
    BadSplit { batch: usize, towers: usize, detail: String },

    #[error("towers have different variable sets: {detail}. Every tower must compute a gradient for the same variables; build all towers from the same model function with reuse")]
    TowerGradientMismatch { detail: String },

    #[error("placement failed for '{node}': {reason}")]
    Placement { node: String, reason: String },

    #[error("could not write the dump of pass '{pass}' to {path}: {source}")]
    Dump { pass: String, path: String, source: std::io::Error },
}
