//! The IR: a petgraph `StableGraph` of [`Node`]s joined by typed [`Edge`]s.
//!
//! Invariants (checked by [`crate::verify`]):
//! - node names are unique; `names` maps every name to its node;
//! - every data input slot `0..n` of a node has exactly one incoming data edge
//!   whose source slot exists;
//! - the graph is acyclic over data and control edges;
//! - `outputs` equals what [`crate::infer::infer`] gives for the inputs.
//!
//! Determinism: every iteration that can reach output goes by `seq` (the
//! creation number) or by [`Graph::topo_order`], which breaks ties by `seq`,
//! never by `NodeIndex` (StableGraph reuses freed indices). Names, not
//! indices, are the handles that survive passes.

use petgraph::stable_graph::{NodeIndex, StableGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BinaryHeap};

use crate::device::{Device, DeviceSpec};
use crate::error::{GraphError, Result};
use crate::infer::{infer, InferError};
use crate::op::Op;
use crate::program::Program;
use crate::types::TensorType;

/// A node handle, valid until the node is removed.
pub type NodeId = NodeIndex<u32>;

use crate::tensor::fresh_identity;
pub use crate::tensor::Tensor;

/// An edge: data (with slots) or control (ordering only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Edge {
    Data { src_slot: usize, dst_slot: usize },
    Control,
}

/// One operation instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Unique scoped name (`tower_0/fc1/MatMul`, `fc1/weights`).
    pub name: String,
    pub op: Op,
    /// Output types, from shape inference.
    pub outputs: Vec<TensorType>,
    /// The name scope the node was created in (for errors and dot clusters).
    pub scope: String,
    /// The device the user asked for (merged from `device` scopes).
    pub requested_device: DeviceSpec,
    /// The device placement assigned.
    pub device: Option<Device>,
    /// Why placement chose that device.
    pub placement_reason: Option<String>,
    /// The tower this node belongs to, once replicated.
    pub tower: Option<usize>,
    /// Creation number: the deterministic order of the graph.
    pub seq: u64,
}

/// A computation graph.
#[derive(Debug, Clone)]
pub struct Graph {
    /// Which graph this is, for [`Tensor`]'s same-graph check; a clone keeps
    /// it (its tensors are the clone's too), a new or deserialized graph
    /// draws a fresh one. Never serialized, never part of any output.
    identity: u32,
    g: StableGraph<Node, Edge>,
    names: BTreeMap<String, NodeId>,
    collections: BTreeMap<String, Vec<String>>,
    next_seq: u64,
    /// What the graph is compiled for (fetches, train op, schedule): filled in by the passes, read by lowering.
    program: Program,
    /// Graph-level seed (`tf.set_random_seed`): with [`Graph::seed_set`],
    /// it decides the variables' initial values and every op seed derived
    /// from it (dropout); see [`crate::seeds`].
    pub seed: u64,
    /// Whether [`Graph::seed`] was set (`GraphBuilder::with_seed`,
    /// [`Graph::set_random_seed`]); unset, the session's seed initializes
    /// the variables.
    pub seed_set: bool,
}

/// Well-known collection keys, as TF's `GraphKeys`.
pub mod keys {
    pub const GLOBAL_VARIABLES: &str = "variables";
    pub const TRAINABLE_VARIABLES: &str = "trainable_variables";
    pub const UPDATE_OPS: &str = "update_ops";
    pub const REGULARIZATION_LOSSES: &str = "regularization_losses";
    pub const LOSSES: &str = "losses";
    pub const TRAIN_OP: &str = "train_op";
}

/// Parameters of a new node.
#[derive(Debug, Clone)]
pub struct NewNode {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<Tensor>,
    pub control_inputs: Vec<NodeId>,
    pub scope: String,
    pub requested_device: DeviceSpec,
}

impl NewNode {
    pub fn new(name: impl Into<String>, op: Op, inputs: Vec<Tensor>) -> NewNode {
        let name = name.into();
        let scope = name.rsplit_once('/').map(|(s, _)| s.to_string()).unwrap_or_default();
        NewNode { name, op, inputs, control_inputs: Vec::new(), scope, requested_device: DeviceSpec::default() }
    }
}

impl Default for Graph {
    fn default() -> Graph {
        Graph {
            identity: fresh_identity(),
            g: StableGraph::default(),
            names: BTreeMap::new(),
            collections: BTreeMap::new(),
            next_seq: 0,
            program: Program::default(),
            seed: 0,
            seed_set: false,
        }
    }
}

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Output `slot` of node `node`, as a tensor this graph will recognise
    /// as its own.
    pub fn tensor(&self, node: NodeId, slot: usize) -> Tensor {
        Tensor::of_graph(node, slot, self.identity)
    }

    /// Add a node; runs shape inference and rejects duplicate names and bad slots.
    pub fn add(&mut self, n: NewNode) -> Result<NodeId> {
        if self.names.contains_key(&n.name) {
            return Err(GraphError::DuplicateName { name: n.name });
        }
        let mut in_types = Vec::with_capacity(n.inputs.len());
        for t in &n.inputs {
            if !t.may_join(self.identity) {
                return Err(GraphError::ForeignTensor { node: n.name.clone(), index: t.node.index(), slot: t.slot });
            }
            in_types.push(self.tensor_type(*t)?.clone());
        }
        for c in &n.control_inputs {
            if !self.g.contains_node(*c) {
                return Err(GraphError::ForeignNode { index: c.index() });
            }
        }
        let outputs = infer(&n.op, &in_types).map_err(|e| self.wrap_infer(&n.name, &n.scope, &n.op, e))?;
        let id = self.g.add_node(Node {
            name: n.name.clone(),
            op: n.op,
            outputs,
            scope: n.scope,
            requested_device: n.requested_device,
            device: None,
            placement_reason: None,
            tower: None,
            seq: self.next_seq,
        });
        self.next_seq += 1;
        for (dst_slot, t) in n.inputs.iter().enumerate() {
            self.g.add_edge(t.node, id, Edge::Data { src_slot: t.slot, dst_slot });
        }
        for c in n.control_inputs {
            self.g.add_edge(c, id, Edge::Control);
        }
        self.names.insert(n.name, id);
        Ok(id)
    }

    fn wrap_infer(&self, name: &str, scope: &str, op: &Op, e: InferError) -> GraphError {
        match e {
            InferError::Arity { expected, got } => GraphError::Arity {
                node: name.to_string(),
                scope: scope.to_string(),
                op: op.type_name().to_string(),
                expected,
                got,
            },
            InferError::Detail(detail) => GraphError::Shape {
                node: name.to_string(),
                scope: scope.to_string(),
                op: op.type_name().to_string(),
                detail,
            },
        }
    }

    /// The type of one output.
    pub fn tensor_type(&self, t: Tensor) -> Result<&TensorType> {
        let node = self.g.node_weight(t.node).ok_or(GraphError::ForeignNode { index: t.node.index() })?;
        node.outputs.get(t.slot).ok_or_else(|| GraphError::BadSlot {
            node: node.name.clone(),
            slot: t.slot,
            outputs: node.outputs.len(),
        })
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id]
    }
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.g[id]
    }
    pub fn contains(&self, id: NodeId) -> bool {
        self.g.contains_node(id)
    }
    pub fn len(&self) -> usize {
        self.g.node_count()
    }
    pub fn is_empty(&self) -> bool {
        self.g.node_count() == 0
    }

    /// The node with this name.
    pub fn get(&self, name: &str) -> Option<NodeId> {
        self.names.get(name).copied()
    }

    /// The node with this name, or an error listing the closest names.
    pub fn find(&self, name: &str) -> Result<NodeId> {
        self.get(name).ok_or_else(|| GraphError::UnknownNode {
            name: name.to_string(),
            hint: crate::suggest::closest(name, self.names.keys().map(|s| s.as_str())),
        })
    }

    /// Node ids in creation order.
    pub fn node_ids(&self) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = self.g.node_indices().collect();
        v.sort_by_key(|&i| self.g[i].seq);
        v
    }

    /// The data inputs of a node, by input slot.
    pub fn inputs(&self, id: NodeId) -> Vec<Tensor> {
        let mut v: Vec<(usize, Tensor)> = self
            .g
            .edges_directed(id, Direction::Incoming)
            .filter_map(|e| match *e.weight() {
                Edge::Data { src_slot, dst_slot } => Some((dst_slot, self.tensor(e.source(), src_slot))),
                Edge::Control => None,
            })
            .collect();
        v.sort_by_key(|(d, _)| *d);
        v.into_iter().map(|(_, t)| t).collect()
    }

    /// Control inputs, in creation order.
    pub fn control_inputs(&self, id: NodeId) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = self
            .g
            .edges_directed(id, Direction::Incoming)
            .filter(|e| matches!(e.weight(), Edge::Control))
            .map(|e| e.source())
            .collect();
        v.sort_by_key(|&i| self.g[i].seq);
        v.dedup();
        v
    }

    /// Data consumers: (consumer, its input slot, our output slot), in creation order.
    pub fn consumers(&self, id: NodeId) -> Vec<(NodeId, usize, usize)> {
        let mut v: Vec<(NodeId, usize, usize)> = self
            .g
            .edges_directed(id, Direction::Outgoing)
            .filter_map(|e| match *e.weight() {
                Edge::Data { src_slot, dst_slot } => Some((e.target(), dst_slot, src_slot)),
                Edge::Control => None,
            })
            .collect();
        v.sort_by_key(|&(n, d, s)| (self.g[n].seq, d, s));
        v
    }

    /// Nodes that have a control edge from `id`.
    pub fn control_consumers(&self, id: NodeId) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = self
            .g
            .edges_directed(id, Direction::Outgoing)
            .filter(|e| matches!(e.weight(), Edge::Control))
            .map(|e| e.target())
            .collect();
        v.sort_by_key(|&i| self.g[i].seq);
        v.dedup();
        v
    }

    /// A topological order over data and control edges; ties broken by creation order.
    pub fn topo_order(&self) -> Result<Vec<NodeId>> {
        let mut indeg: BTreeMap<NodeId, usize> = BTreeMap::new();
        for id in self.g.node_indices() {
            indeg.insert(id, self.g.edges_directed(id, Direction::Incoming).count());
        }
        let mut heap: BinaryHeap<std::cmp::Reverse<(u64, NodeId)>> =
            indeg.iter().filter(|(_, &d)| d == 0).map(|(&i, _)| std::cmp::Reverse((self.g[i].seq, i))).collect();
        let mut order = Vec::with_capacity(self.g.node_count());
        while let Some(std::cmp::Reverse((_, id))) = heap.pop() {
            order.push(id);
            for e in self.g.edges_directed(id, Direction::Outgoing) {
                let d = indeg.get_mut(&e.target()).expect("edge target is a node");
                *d -= 1;
                if *d == 0 {
                    heap.push(std::cmp::Reverse((self.g[e.target()].seq, e.target())));
                }
            }
        }
        if order.len() != self.g.node_count() {
            let stuck: Vec<String> = indeg
                .iter()
                .filter(|(i, _)| !order.contains(i))
                .map(|(&i, _)| self.g[i].name.clone())
                .take(8)
                .collect();
            return Err(GraphError::Cycle {
                from: stuck.first().cloned().unwrap_or_default(),
                to: stuck.last().cloned().unwrap_or_default(),
                path: stuck.join(" -> "),
            });
        }
        Ok(order)
    }

    /// Whether `to` is reachable from `from` along any edges.
    pub fn reaches(&self, from: NodeId, to: NodeId) -> bool {
        let mut stack = vec![from];
        let mut seen = std::collections::HashSet::new();
        while let Some(n) = stack.pop() {
            if n == to {
                return true;
            }
            if seen.insert(n) {
                stack.extend(self.g.neighbors_directed(n, Direction::Outgoing));
            }
        }
        false
    }

    /// Re-point data input `dst_slot` of `node` at `src`.
    pub fn set_input(&mut self, node: NodeId, dst_slot: usize, src: Tensor) -> Result<()> {
        self.tensor_type(src)?;
        if self.reaches(node, src.node) {
            return Err(GraphError::Cycle {
                from: self.g[src.node].name.clone(),
                to: self.g[node].name.clone(),
                path: format!("{} already depends on {}", self.g[src.node].name, self.g[node].name),
            });
        }
        let old: Vec<_> = self
            .g
            .edges_directed(node, Direction::Incoming)
            .filter(|e| matches!(*e.weight(), Edge::Data { dst_slot: d, .. } if d == dst_slot))
            .map(|e| e.id())
            .collect();
        for e in old {
            self.g.remove_edge(e);
        }
        self.g.add_edge(src.node, node, Edge::Data { src_slot: src.slot, dst_slot });
        Ok(())
    }

    /// Add a control edge `from -> to` (no-op if present).
    pub fn add_control(&mut self, from: NodeId, to: NodeId) -> Result<()> {
        if self.reaches(to, from) {
            return Err(GraphError::Cycle {
                from: self.g[from].name.clone(),
                to: self.g[to].name.clone(),
                path: format!("{} already depends on {}", self.g[from].name, self.g[to].name),
            });
        }
        if !self.control_inputs(to).contains(&from) {
            self.g.add_edge(from, to, Edge::Control);
        }
        Ok(())
    }

    /// Remove every control edge into `node`.
    pub fn clear_control_inputs(&mut self, node: NodeId) {
        let es: Vec<_> = self
            .g
            .edges_directed(node, Direction::Incoming)
            .filter(|e| matches!(e.weight(), Edge::Control))
            .map(|e| e.id())
            .collect();
        for e in es {
            self.g.remove_edge(e);
        }
    }

    /// Remove a node and its edges. Its name leaves every collection.
    pub fn remove(&mut self, id: NodeId) -> Option<Node> {
        let n = self.g.remove_node(id)?;
        self.names.remove(&n.name);
        for v in self.collections.values_mut() {
            v.retain(|x| x != &n.name);
        }
        Some(n)
    }

    /// Re-run shape inference over the whole graph in topological order
    /// (after feeds' batch sizes are bound or split).
    pub fn reinfer(&mut self) -> Result<()> {
        for id in self.topo_order()? {
            let ins: Vec<TensorType> =
                self.inputs(id).iter().map(|t| self.tensor_type(*t).cloned()).collect::<Result<_>>()?;
            let n = &self.g[id];
            let out = infer(&n.op, &ins).map_err(|e| self.wrap_infer(&n.name, &n.scope, &n.op, e))?;
            self.g[id].outputs = out;
        }
        Ok(())
    }

    /// A name not yet used, `base` or `base_1`, `base_2`, ...
    pub fn unique_name(&self, base: &str) -> String {
        if !self.names.contains_key(base) {
            return base.to_string();
        }
        (1..).map(|i| format!("{base}_{i}")).find(|n| !self.names.contains_key(n)).unwrap_or_default()
    }

    pub fn add_to_collection(&mut self, key: &str, name: &str) {
        let v = self.collections.entry(key.to_string()).or_default();
        if !v.iter().any(|x| x == name) {
            v.push(name.to_string());
        }
    }
    /// The names in a collection, in insertion order.
    pub fn collection(&self, key: &str) -> &[String] {
        self.collections.get(key).map(|v| v.as_slice()).unwrap_or(&[])
    }
    /// Items of a collection whose names start with `scope` (TF's prefix filter).
    pub fn collection_in_scope(&self, key: &str, scope: &str) -> Vec<String> {
        self.collection(key).iter().filter(|n| n.starts_with(scope)).cloned().collect()
    }
    pub fn collections(&self) -> &BTreeMap<String, Vec<String>> {
        &self.collections
    }
    pub fn set_collection(&mut self, key: &str, names: Vec<String>) {
        self.collections.insert(key.to_string(), names);
    }

    /// The program record (empty for a model graph as the user built it).
    pub fn program(&self) -> &Program {
        &self.program
    }
    pub fn program_mut(&mut self) -> &mut Program {
        &mut self.program
    }
    pub fn set_program(&mut self, p: Program) {
        self.program = p;
    }

    /// Trainable variables, in creation order.
    pub fn trainable_variables(&self) -> Vec<NodeId> {
        self.collection(keys::TRAINABLE_VARIABLES).iter().filter_map(|n| self.get(n)).collect()
    }
    /// The names of the trainable variables whose names start with `scope`,
    /// in creation order: TF1's `tf.trainable_variables(scope)` (a prefix
    /// match, as TF's `re.match`), what `CompileOptions::var_list` takes to
    /// train one part of a model (a GAN's `"G/"`). As in TF, `"G"` also
    /// matches `"Gen/.."`: end the scope with `/` to mean that scope only.
    pub fn trainable_variables_in_scope(&self, scope: &str) -> Vec<String> {
        self.collection_in_scope(keys::TRAINABLE_VARIABLES, scope)
    }
    /// All variables, in creation order.
    pub fn global_variables(&self) -> Vec<NodeId> {
        self.collection(keys::GLOBAL_VARIABLES).iter().filter_map(|n| self.get(n)).collect()
    }
}

/// The serialized form: nodes in creation order, inputs by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SerialGraph {
    pub seed: u64,
    /// Whether the seed was set (absent from the JSON when not).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub seed_set: bool,
    pub nodes: Vec<SerialNode>,
    pub collections: BTreeMap<String, Vec<String>>,
    /// The program record; absent from the JSON of a graph that has none.
    #[serde(default, skip_serializing_if = "Program::is_empty")]
    pub program: Program,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SerialNode {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<(String, usize)>,
    pub control_inputs: Vec<String>,
    pub scope: String,
    pub requested_device: DeviceSpec,
    pub device: Option<Device>,
    pub placement_reason: Option<String>,
    pub tower: Option<usize>,
}

impl Graph {
    pub fn to_serial(&self) -> Result<SerialGraph> {
        let mut nodes = Vec::new();
        for id in self.topo_order()? {
            let n = &self.g[id];
            nodes.push(SerialNode {
                name: n.name.clone(),
                op: n.op.clone(),
                inputs: self.inputs(id).iter().map(|t| (self.g[t.node].name.clone(), t.slot)).collect(),
                control_inputs: self.control_inputs(id).iter().map(|&c| self.g[c].name.clone()).collect(),
                scope: n.scope.clone(),
                requested_device: n.requested_device.clone(),
                device: n.device,
                placement_reason: n.placement_reason.clone(),
                tower: n.tower,
            });
        }
        Ok(SerialGraph {
            seed: self.seed,
            seed_set: self.seed_set,
            nodes,
            collections: self.collections.clone(),
            program: self.program.clone(),
        })
    }

    pub fn from_serial(s: &SerialGraph) -> Result<Graph> {
        let mut g = Graph { seed: s.seed, seed_set: s.seed_set, ..Graph::default() };
        for n in &s.nodes {
            let lookup = |name: &str, g: &Graph| {
                g.get(name).ok_or_else(|| {
                    GraphError::Deserialize(format!(
                        "node '{}' refers to '{name}', which is not defined before it",
                        n.name
                    ))
                })
            };
            let inputs = n
                .inputs
                .iter()
                .map(|(name, slot)| Ok(Tensor::new(lookup(name, &g)?, *slot)))
                .collect::<Result<Vec<_>>>()?;
            let control_inputs = n.control_inputs.iter().map(|c| lookup(c, &g)).collect::<Result<Vec<_>>>()?;
            let id = g
                .add(NewNode {
                    name: n.name.clone(),
                    op: n.op.clone(),
                    inputs,
                    control_inputs,
                    scope: n.scope.clone(),
                    requested_device: n.requested_device.clone(),
                })
                .map_err(|e| GraphError::Deserialize(format!("node '{}': {e}", n.name)))?;
            let node = g.node_mut(id);
            node.device = n.device;
            node.placement_reason = n.placement_reason.clone();
            node.tower = n.tower;
        }
        for (k, v) in &s.collections {
            for name in v {
                if g.get(name).is_none() {
                    return Err(GraphError::Deserialize(format!("collection '{k}' names unknown node '{name}'")));
                }
            }
            g.collections.insert(k.clone(), v.clone());
        }
        let p = &s.program;
        let runs = p.schedule.iter().flat_map(|s| &s.streams).flat_map(|s| &s.items).filter_map(|i| match i {
            crate::program::ScheduleItem::Run(n) => Some(n.as_str()),
            _ => None,
        });
        for name in p.node_names().chain(runs) {
            if g.get(name).is_none() {
                return Err(GraphError::Deserialize(format!("the program record names unknown node '{name}'")));
            }
        }
        g.program = s.program.clone();
        Ok(g)
    }

    /// JSON text of the graph.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(&self.to_serial()?).map_err(|e| GraphError::Deserialize(e.to_string()))
    }

    /// Parse a graph from JSON; malformed input is an error, never a panic.
    pub fn from_json(s: &str) -> Result<Graph> {
        let sg: SerialGraph = serde_json::from_str(s).map_err(|e| GraphError::Deserialize(e.to_string()))?;
        Graph::from_serial(&sg)
    }
}
