//! The program record: what a graph is compiled *for*, owned by the
//! [`Graph`] so that it travels with it from pass to pass, through serde and
//! into lowering.
//!
//! The passes fill it in (`apply` sets the train op, `grad_mean` and `apply`
//! the `"loss"` fetch, `schedule` the streams); codegen reads it and nothing
//! else besides the graph. The feeds need no entry: they are the graph's
//! placeholders.
//!
//! Invariants a reader must keep:
//! - every reference is by node name ([`TensorRef`], `train_op`), never by
//!   [`crate::NodeId`], so it survives passes that add and remove nodes; a
//!   pass that renames or removes a referenced node updates the record;
//! - maps are `BTreeMap`s and streams are sorted, so the record's JSON and
//!   text forms are deterministic.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::device::Device;
use crate::error::Result;
use crate::graph::{Graph, Tensor};

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
    /// Resolve in `g`; an error names the missing node and the closest names.
    pub fn resolve(&self, g: &Graph) -> Result<Tensor> {
        Ok(g.tensor(g.find(&self.node)?, self.slot))
    }
}

impl std::fmt::Display for TensorRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.node, self.slot)
    }
}

/// Re-export: the stream kind is vocabulary (`towers_vocab::StreamKind`),
/// shared with the plan.
pub use towers_vocab::StreamKind;

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

/// What the graph is compiled for: the record lowering reads.
///
/// ```
/// use towers_graph::{program::Program, TensorRef};
/// let mut p = Program::default();
/// assert!(p.is_empty());
/// p.fetches.insert("loss".into(), TensorRef::new("loss/tower_mean", 0));
/// p.train_op = Some("train_op".into());
/// assert!(!p.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Program {
    /// Tensors the program fetches, by user-facing name (`"loss"`, `"predictions"`).
    #[serde(default)]
    pub fetches: BTreeMap<String, TensorRef>,
    /// The node that runs one training step (set by `apply`); none for evaluation.
    #[serde(default)]
    pub train_op: Option<String>,
    /// What runs on which stream, in order, with events (set by `schedule`).
    #[serde(default)]
    pub schedule: Option<Schedule>,
    /// With several processes: this process's rank, so that dumps name its
    /// devices `/job:worker/task:<rank>/device:GPU:j` (set by `all_reduce`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<usize>,
    /// With `--variables ps`: which parameter-server task owns each
    /// variable (set by `place`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ps: Option<PsSharding>,
    /// The graph's placeholders this program does not read (set by
    /// `prune`), sorted by name, with their types: feeding one is accepted
    /// and ignored, as TF1's `feed_dict` accepts any placeholder.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unread_feeds: Vec<(String, crate::types::TensorType)>,
}

/// The variables sharded over parameter-server tasks (TF1's
/// `replica_device_setter`): the owner of a variable holds its master copy
/// and its optimizer slots, and applies its updates.
///
/// Invariant: every variable named in `owners` owns a task below `tasks`,
/// and an optimizer slot has its primary variable's owner.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PsSharding {
    /// The number of ps tasks (`--ps-tasks`).
    pub tasks: u32,
    /// Variable (and slot) name -> owning task `k` of `/job:ps/task:k`.
    pub owners: BTreeMap<String, u32>,
}

impl PsSharding {
    /// The owner of variable `name`, if it is sharded.
    pub fn owner(&self, name: &str) -> Option<u32> {
        self.owners.get(name).copied()
    }
}

impl Program {
    /// Nothing recorded yet (a model graph as the user built it).
    pub fn is_empty(&self) -> bool {
        self.fetches.is_empty() && self.train_op.is_none() && self.schedule.is_none()
    }

    /// The names of the nodes the record refers to (fetches, then the train op), for passes that must keep them.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.fetches.values().map(|t| t.node.as_str()).chain(self.train_op.as_deref())
    }

    /// The text form (appended to the graph's text after the nodes):
    ///
    /// ```text
    /// fetch loss = loss/tower_mean:0
    /// train_op = train_op
    /// schedule: 2 streams, 1 events
    /// stream cpu:0/compute
    ///   run fc1/MatMul
    ///   record e0
    /// stream gpu:0/copy
    ///   wait e0
    ///   run fc1/MatMul/gpu0
    /// ```
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        if let Some(t) = self.task {
            let _ = writeln!(s, "task = /job:worker/task:{t}");
        }
        for (name, t) in &self.fetches {
            let _ = writeln!(s, "fetch {name} = {t}");
        }
        if let Some(t) = &self.train_op {
            let _ = writeln!(s, "train_op = {t}");
        }
        if let Some(ps) = &self.ps {
            let _ = writeln!(s, "ps tasks = {}", ps.tasks);
            for (v, k) in &ps.owners {
                let _ = writeln!(s, "owner {v} = {}", crate::device::ps_task_name(*k));
            }
        }
        if let Some(sched) = &self.schedule {
            let _ = writeln!(s, "schedule: {} streams, {} events", sched.streams.len(), sched.num_events);
            for st in &sched.streams {
                let _ = writeln!(s, "stream {}/{}", st.device.qualified(self.task), st.kind.name());
                for item in &st.items {
                    let _ = match item {
                        ScheduleItem::Run(n) => writeln!(s, "  run {n}"),
                        ScheduleItem::Record(e) => writeln!(s, "  record e{e}"),
                        ScheduleItem::Wait(e) => writeln!(s, "  wait e{e}"),
                    };
                }
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, GraphBuilder};

    fn scheduled() -> Graph {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, [2]).unwrap();
        let y = b.relu(x).unwrap();
        let mut g = b.finish();
        let y = g.node(y.node).name.clone();
        let p = g.program_mut();
        p.fetches.insert("y".into(), TensorRef::new(&y, 0));
        p.schedule = Some(Schedule {
            streams: vec![ScheduledStream {
                device: Device::CPU0,
                kind: StreamKind::Compute,
                items: vec![ScheduleItem::Run(y), ScheduleItem::Record(0)],
            }],
            num_events: 1,
        });
        g
    }

    #[test]
    fn the_record_round_trips_through_json_and_shows_in_the_text() {
        let g = scheduled();
        let back = Graph::from_json(&g.to_json().unwrap()).unwrap();
        assert_eq!(back.program(), g.program());
        let text = crate::text::to_text(&back).unwrap();
        assert!(
            text.ends_with(
                "fetch y = Relu:0\nschedule: 1 streams, 1 events\nstream cpu:0/compute\n  run Relu\n  record e0\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn an_empty_record_leaves_json_and_text_as_they_were() {
        let mut g = scheduled();
        g.set_program(Program::default());
        assert!(!g.to_json().unwrap().contains("program"));
        assert!(!crate::text::to_text(&g).unwrap().contains("schedule"));
    }

    #[test]
    fn a_record_naming_an_unknown_node_is_a_deserialize_error() {
        let json = scheduled().to_json().unwrap().replace("\"Run\": \"Relu\"", "\"Run\": \"Relu_9\"");
        let e = Graph::from_json(&json).unwrap_err().to_string();
        assert!(e.contains("'Relu_9'"), "{e}");
    }
}
