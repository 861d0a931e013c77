//! The TensorFlow protobuf messages TensorBoard reads, as hand-written
//! `prost` structs: only the fields towers writes, with TF's field numbers
//! (from `tensorflow/core/util/event.proto`, `framework/summary.proto`,
//! `framework/graph.proto`, `node_def.proto`, `attr_value.proto`,
//! `tensor_shape.proto`, `versions.proto`). Fields left out are simply absent
//! on the wire, which protobuf readers accept; no build-time `protoc`.

use std::collections::HashMap;

/// `tensorflow.Event`: one record of an event file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(oneof = "What", tags = "3, 4, 5")]
    pub what: Option<What>,
}

/// The `what` oneof of `tensorflow.Event`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum What {
    /// `"brain.Event:2"` in the first record of a file.
    #[prost(string, tag = "3")]
    FileVersion(String),
    /// A serialized [`GraphDef`].
    #[prost(bytes, tag = "4")]
    GraphDef(Vec<u8>),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with a `simple_value` (a scalar).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// `tensorflow.GraphDef`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphDef {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeDef>,
    #[prost(message, optional, tag = "4")]
    pub versions: Option<VersionDef>,
}

/// `tensorflow.NodeDef`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeDef {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub op: String,
    /// `node`, `node:slot` (slot > 0) or `^node` (a control input).
    #[prost(string, repeated, tag = "3")]
    pub input: Vec<String>,
    /// A TF device string, e.g. `/device:GPU:0`.
    #[prost(string, tag = "4")]
    pub device: String,
    #[prost(map = "string, message", tag = "5")]
    pub attr: HashMap<String, AttrValue>,
}

/// `tensorflow.AttrValue`: the variants towers writes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttrValue {
    #[prost(oneof = "AttrKind", tags = "1, 2, 3")]
    pub value: Option<AttrKind>,
}

/// The `value` oneof of `tensorflow.AttrValue`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum AttrKind {
    #[prost(message, tag = "1")]
    List(AttrList),
    #[prost(bytes, tag = "2")]
    S(Vec<u8>),
    #[prost(int64, tag = "3")]
    I(i64),
}

/// `tensorflow.AttrValue.ListValue`: shapes only.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttrList {
    #[prost(message, repeated, tag = "7")]
    pub shape: Vec<TensorShapeProto>,
}

/// `tensorflow.TensorShapeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "2")]
    pub dim: Vec<Dim>,
}

/// `tensorflow.TensorShapeProto.Dim`: `size` -1 for an unknown dimension.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dim {
    #[prost(int64, tag = "1")]
    pub size: i64,
}

/// `tensorflow.VersionDef`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionDef {
    #[prost(int32, tag = "1")]
    pub producer: i32,
}
