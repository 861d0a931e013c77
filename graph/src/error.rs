//! The graph crate's errors: every user mistake names the node and its scope
//! and says how to fix it. The TF1 phrases users search for are kept as
//! substrings ("already exists, disallowed", "does not exist, or was not
//! created with get_variable").

use thiserror::Error;

use crate::types::{DType, Shape};

#[derive(Debug, Error, Clone, PartialEq)]
pub enum GraphError {
    #[error(
        "Variable {name} already exists, disallowed. Did you mean to set reuse=Yes or reuse=Auto in the variable scope? (scope '{scope}' has reuse={reuse})"
    )]
    VariableExists { name: String, scope: String, reuse: String },

    #[error(
        "Variable {name} does not exist, or was not created with get_variable(). Did you mean to set reuse=Auto (or reuse=No) in the variable scope? (scope '{scope}' has reuse=Yes){hint}"
    )]
    VariableMissing { name: String, scope: String, hint: String },

    #[error("Trying to share variable {name}, but specified shape {requested} and found shape {found}.")]
    VariableShapeMismatch { name: String, requested: Shape, found: Shape },

    #[error("Trying to share variable {name}, but specified dtype {requested} and found dtype {found}.")]
    VariableDtypeMismatch { name: String, requested: DType, found: DType },

    #[error("{op} '{node}' (in scope '{scope}'): {detail}")]
    Shape { node: String, scope: String, op: String, detail: String },

    #[error("{op} '{node}' (in scope '{scope}') expects {expected} inputs, got {got}")]
    Arity { node: String, scope: String, op: String, expected: String, got: usize },

    #[error("Malformed device specification '{spec}': {reason}")]
    DeviceParse { spec: String, reason: String },

    #[error("device '{spec}' must name one device, with a type and an index (for example /gpu:0 or /cpu:0)")]
    IncompleteDevice { spec: String },

    #[error("a node named '{name}' already exists; node names must be unique")]
    DuplicateName { name: String },

    #[error("no node named '{name}'{hint}")]
    UnknownNode { name: String, hint: String },

    #[error("adding the edge {from} -> {to} would create a cycle: {path}")]
    Cycle { from: String, to: String, path: String },

    #[error("invalid input slot: '{node}' has {outputs} outputs, but output {slot} was requested")]
    BadSlot { node: String, slot: usize, outputs: usize },

    #[error("graph verification failed after {after}: {detail}")]
    Verify { after: String, detail: String },

    #[error("invalid scope name '{name}': {reason}")]
    BadScopeName { name: String, reason: String },

    /// A tensor or control input whose node this graph does not hold.
    #[error("an input refers to node #{index}, which this graph does not hold: a tensor of another GraphBuilder or Graph? (TF: 'Tensor must be from the same graph'); build every op of a model with one builder")]
    ForeignNode { index: usize },

    /// A tensor made by another graph or builder (TF: "Tensor must be from
    /// the same graph").
    #[error("node '{node}': an input (output {slot} of node #{index}) was made by another GraphBuilder or Graph (TF: 'Tensor must be from the same graph'); build every op of a model with one builder, or look the tensor up in this graph by name")]
    ForeignTensor { node: String, index: usize, slot: usize },

    #[error("invalid node name {name:?}: {reason}")]
    BadNodeName { name: String, reason: String },

    /// A layer option out of range or an input a layer cannot take, naming
    /// the layer (its variable-scope path) and the option.
    #[error("layer '{layer}': {option} {detail}")]
    LayerOption { layer: String, option: String, detail: String },

    #[error("malformed serialized graph: {0}")]
    Deserialize(String),
}

pub type Result<T, E = GraphError> = std::result::Result<T, E>;

/// A device string's error, as the graph's variant with the same message.
impl From<towers_vocab::DeviceError> for GraphError {
    fn from(e: towers_vocab::DeviceError) -> GraphError {
        match e {
            towers_vocab::DeviceError::Parse { spec, reason } => GraphError::DeviceParse { spec, reason },
            towers_vocab::DeviceError::Incomplete { spec } => GraphError::IncompleteDevice { spec },
        }
    }
}
