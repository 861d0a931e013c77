//! The state passes hand on to each other, and the crate's error type.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use towers_graph::{Device, Graph, GraphError, Tensor};

/// A tensor by name: survives passes that add and remove nodes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TensorRef {
    pub node: String,
    pub slot: usize,
}

impl TensorRef {
    pub fn new(node: impl Into<String>, slot: usize) -> TensorRef {
        TensorRef { node: node.into(), slot }
    }
    pub fn of(g: &Graph, t: Tensor) -> TensorRef {
        TensorRef { node: g.node(t.node).name.clone(), slot: t.slot }
    }
    /// Resolve in `g`; an error names the missing node.
    pub fn resolve(&self, g: &Graph) -> Result<Tensor, PassError> {
        Ok(Tensor::new(g.find(&self.node)?, self.slot))
    }
}

impl std::fmt::Display for TensorRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.node, self.slot)
    }
}

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
    /// Variables to train, by name, in creation order.
    pub var_list: Vec<String>,
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
    /// The global batch size bound to the placeholders' unknown dimension.
    pub batch_size: Option<usize>,
    /// The node that runs one training step (`train_op`).
    pub train_op: Option<String>,
    /// Tensors a program fetches, by user-facing name (e.g. "loss").
    pub fetches: BTreeMap<String, TensorRef>,
    /// Warnings collected along the way.
    pub diagnostics: Vec<Diagnostic>,
    /// Set by `schedule`: what runs on which stream, in order, with events.
    pub schedule: Option<Schedule>,
    /// Set by `bind_batch`: the placeholders whose dimension 0 is the global batch
    /// (the ones `split` divides across replicas), in creation order.
    pub batch_inputs: Vec<String>,
    /// Set by `replicate`: one entry per replica (tower × micro-batch), in
    /// replica order; `tower_grads`, `tower_losses`, `tower_batches` and
    /// `tower_weights` are indexed by replica (with one micro-batch per tower,
    /// replica = tower).
    pub replicas: Vec<Replica>,
}

/// One copy of the forward and backward subgraph: tower `tower`, micro-batch `micro`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    pub tower: usize,
    pub micro: usize,
    /// The name prefix of its nodes, with a trailing slash (`tower_1/`, `tower_1/micro_0/`).
    pub prefix: String,
}

/// The kind of a stream (TF's stream group: compute, copies, collectives).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum StreamKind {
    Compute,
    Copy,
    Collective,
}

impl StreamKind {
    pub fn name(self) -> &'static str {
        match self {
            StreamKind::Compute => "compute",
            StreamKind::Copy => "copy",
            StreamKind::Collective => "collective",
        }
    }
}

/// One step of a stream's program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScheduleItem {
    /// Run this node's work.
    Run(String),
    /// Record event `n` (after the items before it on this stream).
    Record(usize),
    /// Wait for event `n` before the items after it.
    Wait(usize),
}

/// The ordered work of one stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledStream {
    pub device: Device,
    pub kind: StreamKind,
    pub items: Vec<ScheduleItem>,
}

impl ScheduledStream {
    /// `gpu:0/compute`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.device, self.kind.name())
    }
}

/// Streams in a deterministic order (by device, then kind); events are
/// numbered `0..num_events` in the order they are recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub streams: Vec<ScheduledStream>,
    pub num_events: usize,
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
        "No gradients provided for any variable: the loss '{loss}' does not depend on any of the variables [{vars}]. Check that the loss is computed from the model's variables and that no StopGradient cuts every path."
    )]
    NoGradients { loss: String, vars: String },

    #[error("No gradient defined for operation '{node}' (op type: {op}); wrap its input in stop_gradient if no gradient should flow through it")]
    NoGradientDefined { node: String, op: String },

    #[error("the loss '{loss}' must be a scalar f32, but it is {ty}; reduce it with reduce_mean first")]
    LossNotScalar { loss: String, ty: String },

    #[error("No variables to optimize.")]
    NoVariables,

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
