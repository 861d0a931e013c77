//! The model file (`towers train --graph model.json`): a [`Model`] as JSON.
//!
//! ```json
//! { "format": "towers-model", "version": 1,
//!   "loss": "loss", "images": "images", "labels": "labels",
//!   "predictions": "predictions", "accuracy": "accuracy",
//!   "graph": { "seed": 0, "nodes": [ ... ], "collections": { ... } } }
//! ```
//! `graph` is the graph's serde form ([`towers_graph::graph::SerialGraph`]):
//! nodes in creation order, inputs by name. `accuracy` may be absent.
//!
//! Loading is a parser of user input (fuzzed in `tests/fuzz.rs`): every
//! problem is a [`ModelFileError`] naming the file, never a panic:
//! bad JSON (with its line and column), another format or version, an
//! unknown op or field, an input defined after its reader (a dangling
//! edge or a cycle), shapes that do not infer, and every check of
//! [`Model::check`] (the graph verifier, names and kinds of the parts).
//! Saving writes atomically (a reader never sees half a file), and
//! `to_json` of the same model is the same text byte for byte.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use towers_graph::graph::SerialGraph;
use towers_graph::{Graph, GraphError};

use super::model::{Model, ModelError};

/// The `format` field of every model file.
pub const FORMAT: &str = "towers-model";
/// The version this towers writes and reads.
pub const VERSION: u64 = 1;

/// A model file that cannot be written or read.
#[derive(Debug, Error)]
pub enum ModelFileError {
    #[error("{file}: cannot {what}: {source}")]
    Io { file: PathBuf, what: &'static str, source: std::io::Error },
    /// Not JSON, or JSON of another shape.
    #[error("{file}:{line}:{column}: {message}")]
    Json { file: PathBuf, line: usize, column: usize, message: String },
    /// Not a model file, or one of another version.
    #[error("{file}: {message}")]
    Format { file: PathBuf, message: String },
    /// The graph does not rebuild (a dangling edge, a cycle, shapes that do not infer).
    #[error("{file}: {source}")]
    Graph { file: PathBuf, source: Box<GraphError> },
    /// The graph rebuilt, but the model's names or kinds do not fit ([`Model::check`]).
    #[error("{file}: {source}")]
    Model { file: PathBuf, source: Box<ModelError> },
}

#[derive(Serialize)]
struct FileOut<'a> {
    format: &'static str,
    version: u64,
    loss: &'a str,
    images: &'a str,
    labels: &'a str,
    predictions: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    accuracy: Option<&'a str>,
    graph: SerialGraph,
}

#[derive(Deserialize)]
struct Header {
    format: Option<serde_json::Value>,
    version: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileIn {
    #[allow(dead_code)]
    format: String,
    #[allow(dead_code)]
    version: u64,
    loss: String,
    images: String,
    labels: String,
    predictions: String,
    #[serde(default)]
    accuracy: Option<String>,
    graph: SerialGraph,
}

/// serde_json's message without its "at line L column C" and without the
/// long list of every variant an unknown one could have been.
fn short(e: &serde_json::Error) -> String {
    let mut m = e.to_string();
    if let Some(i) = m.rfind(" at line ") {
        m.truncate(i);
    }
    if let (Some(i), true) = (m.find(", expected one of"), m.starts_with("unknown variant")) {
        m.truncate(i);
        m.push_str(": not an op (or field value) this towers knows; was the file written by a newer towers?");
    }
    m
}

impl Model {
    /// The model file's text (see the module docs); deterministic.
    pub fn to_json(&self) -> Result<String, GraphError> {
        let f = FileOut {
            format: FORMAT,
            version: VERSION,
            loss: &self.loss,
            images: &self.images,
            labels: &self.labels,
            predictions: &self.predictions,
            accuracy: self.accuracy.as_deref(),
            graph: self.graph.to_serial()?,
        };
        serde_json::to_string_pretty(&f).map_err(|e| GraphError::Deserialize(e.to_string()))
    }

    /// Write the model file atomically; the model is checked first, so a
    /// file written here loads.
    pub fn save_json(&self, path: &Path) -> Result<(), ModelFileError> {
        let file = path.to_path_buf();
        self.check().map_err(|e| ModelFileError::Model { file: file.clone(), source: Box::new(e) })?;
        let text = self.to_json().map_err(|e| ModelFileError::Graph { file: file.clone(), source: Box::new(e) })?;
        crate::outputs::write_atomic(path, text.as_bytes()).map_err(|source| ModelFileError::Io {
            file,
            what: "write",
            source,
        })
    }

    /// Read and check a model file.
    pub fn load_json(path: &Path) -> Result<Model, ModelFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelFileError::Io {
            file: path.to_path_buf(),
            what: "read",
            source,
        })?;
        Model::from_json(&text, path)
    }

    /// Parse and check a model file's text; `file` names it in the errors.
    pub fn from_json(text: &str, file: &Path) -> Result<Model, ModelFileError> {
        let file = file.to_path_buf();
        let json = |e: serde_json::Error| ModelFileError::Json {
            file: file.clone(),
            line: e.line(),
            column: e.column(),
            message: short(&e),
        };
        let format = |message: String| ModelFileError::Format { file: file.clone(), message };
        let h: Header = serde_json::from_str(text).map_err(json)?;
        match &h.format {
            Some(serde_json::Value::String(f)) if f == FORMAT => {}
            Some(other) => {
                return Err(format(format!(
                    "\"format\" is {other}, not \"{FORMAT}\": not a towers model file (write one with Model::save_json)"
                )))
            }
            None => {
                return Err(format(format!(
                    "no \"format\": \"{FORMAT}\" field: not a towers model file (write one with Model::save_json)"
                )))
            }
        }
        match &h.version {
            Some(v) if v.as_u64() == Some(VERSION) => {}
            Some(v) => {
                return Err(format(format!(
                    "\"version\" is {v}, but this towers reads version {VERSION}: save the model again with this towers"
                )))
            }
            None => return Err(format(format!("no \"version\" field (this towers reads version {VERSION})"))),
        }
        let f: FileIn = serde_json::from_str(text).map_err(json)?;
        for n in &f.graph.nodes {
            // A file from a converter or a hand edit bypassed the builder's check.
            if let Err(towers_graph::GraphError::BadNodeName { reason, .. }) = towers_graph::check_node_name(&n.name) {
                return Err(format(format!("node {:?}: invalid node name: {reason}; rename it in the model", n.name)));
            }
        }
        let graph = Graph::from_serial(&f.graph)
            .map_err(|e| ModelFileError::Graph { file: file.clone(), source: Box::new(e) })?;
        let m = Model {
            graph,
            loss: f.loss,
            images: f.images,
            labels: f.labels,
            predictions: f.predictions,
            accuracy: f.accuracy,
            builtin: false,
        };
        m.check().map_err(|e| ModelFileError::Model { file, source: Box::new(e) })?;
        Ok(m)
    }
}
