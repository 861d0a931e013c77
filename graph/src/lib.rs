//! towers-graph: the IR and the TF1-style builder.
//!
//! Depends on `towers_vocab` (not on the kernels): the element type, the op
//! tables, padding, fused expressions, devices, stream kinds and
//! initializers are the vocabulary's, re-exported here at their old paths
//! (`towers_graph::DType`, `towers_graph::UnaryOp`, `towers_graph::Device`, ...).
//!
//! - [`types`]: shapes (with an unknown batch dimension), tensor types;
//! - [`device`]: TF device strings (re-exported from the vocabulary);
//! - [`op`]: the closed op enum;
//! - [`infer`]: shape inference, one rule per op ([`infer_matmul`]: the batched product's);
//! - [`graph`]: nodes, typed edges, collections, serde;
//! - [`program`]: the program record a graph carries for lowering (fetches,
//!   train op, stream schedule), by node name;
//! - [`axis`]: axis arguments as TF takes them (negative from the end);
//! - [`builder`] and [`layers`]: name/variable/device scopes, `get_variable`, layers;
//! - [`text`], [`dot`]: readable and Graphviz forms; [`verify`]: the invariants.

pub mod axis;
pub mod builder;
mod builder_array;
mod builder_compose;
pub mod builder_math;
mod builder_ops;
mod builder_topk;
pub mod device;
pub mod dot;
pub mod dot_collapsed;
pub mod error;
pub mod graph;
pub mod infer;
mod infer_array;
mod infer_layout;
pub mod infer_matmul;
mod infer_topk;
pub mod layers;
pub mod op;
pub mod program;
pub mod seeds;
pub mod suggest;
mod tensor;
pub mod text;
pub mod types;
pub mod verify;

pub use axis::AxisIndex;
pub use builder::{check_node_name, GraphBuilder, Reuse, VariableOptions};
pub use builder_array::PadMode;
pub use device::{ps_task_name, Device, DeviceError, DeviceKind, DeviceSpec, PS_JOB};
pub use error::GraphError;
pub use graph::{keys, Edge, Graph, NewNode, Node, NodeId, Tensor};
pub use op::{
    BinaryOp, Comparison, ConstValue, Distribution, FanMode, FusedExpr, FusedStep, Initializer, Op, Optimizer, Padding,
    UnaryOp,
};
pub use program::{Program, PsSharding, Schedule, ScheduleItem, ScheduledStream, StreamKind, TensorRef};
pub use towers_vocab::{is_learning_rate, learning_rate_name, optimizer_step_name, GLOBAL_STEP, LEARNING_RATE};
pub use types::{DType, Shape, TensorType, F32};
