//! The crate's one error type: every variant names the node it is about.

use thiserror::Error;

/// Why a graph could not be lowered to a plan.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CodegenError {
    #[error("node '{node}' has no device: run the placement pass before codegen")]
    Unplaced { node: String },

    #[error("node '{node}' output {slot} has shape {shape}, which is not fully known: batch not bound: run the compiler with a batch size")]
    UnknownShape { node: String, slot: usize, shape: String },

    #[error("the graph has no schedule: run the schedule pass before codegen")]
    NoSchedule,

    #[error("node '{node}' is needed (by '{by}') but is missing from the schedule: run the schedule pass after the last pass that adds nodes")]
    NotScheduled { node: String, by: String },

    #[error("node '{node}' appears in the schedule but not in the graph")]
    UnknownNode { node: String },

    #[error("node '{node}' is scheduled twice (streams {first} and {second})")]
    ScheduledTwice { node: String, first: String, second: String },

    #[error("node '{node}' ({op}) is scheduled on stream {stream} but placed on {device}")]
    WrongStream { node: String, op: String, stream: String, device: String },

    #[error("node '{node}' ({op}) reads '{input}' from {from}, a different device, without a Copy node: run placement's copy insertion")]
    CrossDevice { node: String, op: String, input: String, from: String },

    #[error("node '{node}' ({op}) cannot be lowered: {reason}")]
    Unsupported { node: String, op: String, reason: String },

    #[error("fetch '{fetch}' refers to {tensor}, which does not exist")]
    BadFetch { fetch: String, tensor: String },

    #[error("event {event} is waited on but never recorded (the schedule has {num_events} events)")]
    BadEvent { event: usize, num_events: usize },

    #[error("codegen produced a plan that fails verification (a compiler bug): {0}")]
    InvalidPlan(Box<crate::verify::PlanError>),
}

impl From<crate::verify::PlanError> for CodegenError {
    fn from(e: crate::verify::PlanError) -> CodegenError {
        CodegenError::InvalidPlan(Box::new(e))
    }
}
