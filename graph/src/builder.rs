//! The graph-building API in the spirit of TF1: name scopes, variable scopes
//! with reuse, device scopes and control dependencies.
//!
//! Naming is exactly TF1's:
//! - ops take the *name scope* path (`tower_0/fc/MatMul`), variables take only
//!   the *variable scope* path (`fc/weights`);
//! - re-entering a name scope uniquifies it (`fc_1/`), while variable scopes
//!   are never uniquified; a name scope ending in `/` re-enters that absolute
//!   scope as is;
//! - reuse is lexical: it is an argument of scope entry, ends at scope exit,
//!   and is inherited by sub-scopes (a child's `No` keeps the parent's mode).
//!
//! Scopes are closures, so nesting can never be improper.
//!
//! Deliberate differences from TF1 (pinned by `tests/*.rs`):
//! - control dependencies are added to every node created inside
//!   `control_dependencies`, even when a data input already orders it (TF
//!   skips such "dominated" control inputs); the schedule is the same, the
//!   text form shows the extra `^dep` edges;
//! - variables ignore control dependencies and name scopes (TF's
//!   `init_scope`), and record the device scope in force;
//! - `Graph::collection_in_scope` is a plain prefix test, as TF's
//!   `re.match`: pass `"tower_1/"`, not `"tower_1"`, which also matches
//!   `tower_10/`;
//! - `reshape` of a tensor with an unknown batch into a fully fixed shape
//!   (no `-1`) is an error at build time, where TF defers it to run time;
//! - a `name_scope` of `""` (TF: back to root) is rejected as a bad name;
//! - a failed op still uses up its name (`MatMul` fails, the next is
//!   `MatMul_1`), as in TF, whose `unique_name` runs before the shape check.

use std::collections::HashMap;

use crate::device::DeviceSpec;
use crate::error::{GraphError, Result};
use crate::graph::{keys, Graph, NewNode, NodeId, Tensor};
use crate::op::{BinaryOp, Initializer, Op};
use crate::types::{DType, Shape};

/// Variable reuse mode of a variable scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Create; an existing variable is an error (TF's `reuse=None`).
    No,
    /// Get; a missing variable is an error (TF's `reuse=True`).
    Yes,
    /// Get or create (TF's `tf.AUTO_REUSE`).
    Auto,
}

impl std::fmt::Display for Reuse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reuse::No => "No",
            Reuse::Yes => "Yes",
            Reuse::Auto => "Auto",
        })
    }
}

#[derive(Debug, Clone)]
struct VarScope {
    path: String,
    reuse: Reuse,
}

/// Options of [`GraphBuilder::get_variable_with`].
#[derive(Debug, Clone)]
pub struct VariableOptions {
    pub dtype: DType,
    pub trainable: bool,
    /// Extra collections besides the global (and trainable) variables.
    pub collections: Vec<String>,
    /// Weight decay: `scale * l2_loss(var)` (TF's `l2_regularizer(scale)`),
    /// built once, when the variable is created (never on reuse, as TF), and
    /// added to the `regularization_losses` collection.
    pub l2_regularizer: Option<f32>,
}

impl Default for VariableOptions {
    fn default() -> Self {
        VariableOptions { dtype: DType::F32, trainable: true, collections: Vec::new(), l2_regularizer: None }
    }
}

/// Builds a [`Graph`] with TF1 scoping rules.
#[derive(Debug)]
pub struct GraphBuilder {
    pub(crate) graph: Graph,
    pub(crate) name_scope: String,
    var_scopes: Vec<VarScope>,
    device: DeviceSpec,
    control: Vec<NodeId>,
    /// TF's `_names_in_use`: how many times each name was asked for.
    used: HashMap<String, usize>,
    /// TF's `variable_scopes_count`: how often each variable scope was opened
    /// since its parent was last entered (the layers' automatic names).
    pub(crate) scope_counts: HashMap<String, usize>,
    /// The layer defaults in force ([`GraphBuilder::arg_scope`]).
    pub(crate) layer_defaults: crate::layers::LayerDefaults,
}

impl Default for GraphBuilder {
    fn default() -> Self {
        GraphBuilder::new()
    }
}

fn check_scope_name(name: &str) -> Result<()> {
    let body = name.strip_suffix('/').unwrap_or(name);
    if body.is_empty()
        || !body.chars().all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c))
        || body.starts_with('/')
        || body.contains("//")
    {
        return Err(GraphError::BadScopeName {
            name: name.to_string(),
            reason: "use letters, digits, '.', '_', '-' and '/' separators (TF's rule), and no empty components".into(),
        });
    }
    Ok(())
}

/// A node name must be addressable: not empty, no `:` (TF's `node:slot`
/// names an output), no empty path component, no control character.
/// Whether `name` can name a node (one a fetch and a dump can address):
/// [`GraphError::BadNodeName`] says why not. The builder checks every
/// name it is given; model files that bypassed it are checked with this.
pub fn check_node_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "a node needs a name"
    } else if name.contains(':') {
        "':' separates a node from its output slot ('node:0'); use letters, digits, '.', '_', '-' and '/'"
    } else if name.starts_with('/') || name.ends_with('/') || name.contains("//") {
        "'/' separates scopes and needs a name on both sides"
    } else if name.chars().any(char::is_control) {
        "control characters (a newline, a tab) cannot be written in a fetch or a dump"
    } else {
        return Ok(());
    };
    Err(GraphError::BadNodeName { name: name.to_string(), reason: reason.into() })
}

impl GraphBuilder {
    pub fn new() -> GraphBuilder {
        GraphBuilder {
            graph: Graph::new(),
            name_scope: String::new(),
            var_scopes: vec![VarScope { path: String::new(), reuse: Reuse::No }],
            device: DeviceSpec::default(),
            control: Vec::new(),
            used: HashMap::new(),
            scope_counts: HashMap::new(),
            layer_defaults: Default::default(),
        }
    }

    /// A builder with a graph-level seed, TF's `tf.set_random_seed(seed)`:
    /// the variables' initial values (by name) and the op seeds of
    /// [`GraphBuilder::dropout`] derive from it, whatever seed the session
    /// has. See [`crate::seeds`] for which seed decides what.
    ///
    /// ```
    /// use towers_graph::GraphBuilder;
    /// let b = GraphBuilder::with_seed(7);
    /// assert_eq!(b.graph().random_seed(), Some(7));
    /// ```
    pub fn with_seed(seed: u64) -> GraphBuilder {
        let mut b = GraphBuilder::new();
        b.graph.set_random_seed(seed);
        b
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    /// Direct access for passes and helpers that add nodes outside scopes.
    pub fn graph_mut(&mut self) -> &mut Graph {
        &mut self.graph
    }
    pub fn finish(self) -> Graph {
        self.graph
    }

    /// The current name scope path (no trailing slash; empty at root).
    pub fn current_name_scope(&self) -> &str {
        &self.name_scope
    }
    /// The current variable scope path.
    pub fn current_variable_scope(&self) -> &str {
        self.var_scopes.last().map(|s| s.path.as_str()).unwrap_or("")
    }
    pub fn current_reuse(&self) -> Reuse {
        self.var_scopes.last().map(|s| s.reuse).unwrap_or(Reuse::No)
    }

    pub(crate) fn join(prefix: &str, name: &str) -> String {
        if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        }
    }

    /// TF's `unique_name`: `name`, then `name_1`, `name_2`, ...
    fn unique(&mut self, full: &str) -> String {
        let key = full.to_string();
        let mut i = *self.used.get(&key).unwrap_or(&0);
        let mut candidate = if i == 0 { key.clone() } else { format!("{key}_{i}") };
        while self.graph.get(&candidate).is_some() || (i > 0 && self.used.contains_key(&candidate)) {
            i += 1;
            candidate = format!("{key}_{i}");
        }
        self.used.insert(key, i + 1);
        self.used.entry(candidate.clone()).or_insert(1);
        candidate
    }

    /// Open a name scope for ops (uniquified on re-entry; a trailing `/`
    /// re-enters an absolute scope as is).
    pub fn name_scope<T, E: From<GraphError>>(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut Self) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        check_scope_name(name)?;
        let new = match name.strip_suffix('/') {
            Some(abs) => abs.to_string(),
            None => {
                let full = Self::join(&self.name_scope, name);
                self.unique(&full)
            }
        };
        let saved = std::mem::replace(&mut self.name_scope, new);
        let r = f(self);
        self.name_scope = saved;
        r
    }

    /// Open a variable scope: variables created inside take its path; it also
    /// opens a name scope of the same name (uniquified, as TF does).
    pub fn variable_scope<T, E: From<GraphError>>(
        &mut self,
        name: &str,
        reuse: Reuse,
        f: impl FnOnce(&mut Self) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        check_scope_name(name)?;
        let parent = self.var_scopes.last().cloned().unwrap_or(VarScope { path: String::new(), reuse: Reuse::No });
        let effective = match (parent.reuse, reuse) {
            (Reuse::Yes, Reuse::No) | (Reuse::Yes, Reuse::Auto) => Reuse::Yes,
            (p, Reuse::No) => p,
            (_, r) => r,
        };
        let path = Self::join(&parent.path, name.trim_end_matches('/'));
        *self.scope_counts.entry(path.clone()).or_insert(0) += 1;
        self.var_scopes.push(VarScope { path: path.clone(), reuse: effective });
        let r = self.name_scope(name.trim_end_matches('/'), f);
        self.var_scopes.pop();
        // TF's `close_variable_subscopes`: the next entry names its layers afresh.
        let prefix = format!("{path}/");
        self.scope_counts.retain(|k, _| !k.starts_with(&prefix));
        r
    }

    /// Re-enter the current variable scope with another reuse mode, without a
    /// new name scope (what TF users did with `variable_scope(get_variable_scope(), reuse=True)`).
    pub fn reuse_scope<T, E: From<GraphError>>(
        &mut self,
        reuse: Reuse,
        f: impl FnOnce(&mut Self) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let cur = self.var_scopes.last().cloned().unwrap_or(VarScope { path: String::new(), reuse: Reuse::No });
        let effective = if cur.reuse == Reuse::Yes { Reuse::Yes } else { reuse };
        // As TF re-entering a scope object: its counts are restored on exit.
        *self.scope_counts.entry(cur.path.clone()).or_insert(0) += 1;
        let saved_counts = self.scope_counts.clone();
        self.var_scopes.push(VarScope { path: cur.path, reuse: effective });
        let r = f(self);
        self.var_scopes.pop();
        self.scope_counts = saved_counts;
        r
    }

    /// Open a device scope; fields set here override the outer scope's.
    pub fn device<T, E: From<GraphError>>(
        &mut self,
        spec: &str,
        f: impl FnOnce(&mut Self) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let inner = DeviceSpec::parse(spec).map_err(GraphError::from)?;
        let merged = self.device.merged_with(&inner);
        let saved = std::mem::replace(&mut self.device, merged);
        let r = f(self);
        self.device = saved;
        r
    }

    /// Every node created inside gets control edges from `deps`.
    pub fn control_dependencies<T, E: From<GraphError>>(
        &mut self,
        deps: &[NodeId],
        f: impl FnOnce(&mut Self) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let saved = self.control.len();
        self.control.extend_from_slice(deps);
        let r = f(self);
        self.control.truncate(saved);
        r
    }

    /// Add an op node named `name` in the current name scope (uniquified).
    pub fn op(&mut self, name: &str, op: Op, inputs: &[Tensor]) -> Result<NodeId> {
        check_node_name(name)?;
        let full = Self::join(&self.name_scope, name);
        let full = self.unique(&full);
        let mut control = self.control.clone();
        control.sort_by_key(|&c| self.graph.node(c).seq);
        control.dedup();
        self.graph.add(NewNode {
            name: full,
            op,
            inputs: inputs.to_vec(),
            control_inputs: control,
            scope: self.name_scope.clone(),
            requested_device: self.device.clone(),
        })
    }

    /// Add an op with one output and return it.
    pub fn op1(&mut self, name: &str, op: Op, inputs: &[Tensor]) -> Result<Tensor> {
        let id = self.op(name, op, inputs)?;
        Ok(self.graph.tensor(id, 0))
    }

    /// Output `slot` of node `node` of this builder's graph (see
    /// [`Graph::tensor`]).
    pub fn tensor(&self, node: NodeId, slot: usize) -> Tensor {
        self.graph.tensor(node, slot)
    }

    /// TF's `get_variable`: create or reuse `scope/name` by the reuse rules.
    pub fn get_variable(&mut self, name: &str, shape: impl Into<Shape>, init: Initializer) -> Result<Tensor> {
        self.get_variable_with(name, shape, init, VariableOptions::default())
    }

    pub fn get_variable_with(
        &mut self,
        name: &str,
        shape: impl Into<Shape>,
        init: Initializer,
        opts: VariableOptions,
    ) -> Result<Tensor> {
        check_scope_name(name)?;
        let shape: Shape = shape.into();
        let scope = self.var_scopes.last().cloned().unwrap_or(VarScope { path: String::new(), reuse: Reuse::No });
        let full = Self::join(&scope.path, name);
        if let Some(id) = self.graph.get(&full) {
            let node = self.graph.node(id);
            if let Op::Variable { dtype, shape: found, .. } = &node.op {
                if scope.reuse == Reuse::No {
                    return Err(GraphError::VariableExists {
                        name: full,
                        scope: scope.path,
                        reuse: scope.reuse.to_string(),
                    });
                }
                let found = Shape::known(found);
                if !shape.compatible(&found) {
                    return Err(GraphError::VariableShapeMismatch { name: full, requested: shape, found });
                }
                if *dtype != opts.dtype {
                    return Err(GraphError::VariableDtypeMismatch { name: full, requested: opts.dtype, found: *dtype });
                }
                return Ok(self.graph.tensor(id, 0));
            }
            return Err(GraphError::DuplicateName { name: full });
        }
        if scope.reuse == Reuse::Yes {
            let vars: Vec<&str> = self.graph.collection(keys::GLOBAL_VARIABLES).iter().map(|s| s.as_str()).collect();
            return Err(GraphError::VariableMissing {
                hint: crate::suggest::closest(&full, vars.into_iter()),
                name: full,
                scope: scope.path,
            });
        }
        let dims = shape.dims().ok_or_else(|| GraphError::Shape {
            node: full.clone(),
            scope: scope.path.clone(),
            op: "VariableV2".into(),
            detail: format!("a variable needs a fully known shape, got {shape}"),
        })?;
        // Variables ignore name scopes and control dependencies (TF creates
        // them under `name_scope(None)` and `init_scope`).
        self.used.entry(full.clone()).or_insert(1);
        let id = self.graph.add(NewNode {
            name: full.clone(),
            op: Op::Variable { dtype: opts.dtype, shape: dims, init, trainable: opts.trainable },
            inputs: vec![],
            control_inputs: vec![],
            scope: scope.path.clone(),
            requested_device: self.device.clone(),
        })?;
        self.graph.add_to_collection(keys::GLOBAL_VARIABLES, &full);
        if opts.trainable {
            self.graph.add_to_collection(keys::TRAINABLE_VARIABLES, &full);
        }
        for c in &opts.collections {
            self.graph.add_to_collection(c, &full);
        }
        let var = self.graph.tensor(id, 0);
        if let Some(scale) = opts.l2_regularizer {
            // TF builds the regularizer under `name_scope(var + "/Regularizer/")`,
            // colocated with the variable.
            let saved_scope = std::mem::replace(&mut self.name_scope, format!("{full}/Regularizer"));
            let saved_device = std::mem::replace(&mut self.device, self.graph.node(id).requested_device.clone());
            let saved_control = std::mem::take(&mut self.control);
            let reg = self.l2_loss(var).and_then(|l2| {
                let s = self.scalar(scale)?;
                self.op1("l2_regularizer", Op::Binary(BinaryOp::Mul), &[s, l2])
            });
            self.name_scope = saved_scope;
            self.device = saved_device;
            self.control = saved_control;
            let name = self.graph.node(reg?.node).name.clone();
            self.graph.add_to_collection(keys::REGULARIZATION_LOSSES, &name);
        }
        Ok(var)
    }

    /// The sum of the `regularization_losses` collection (TF's
    /// `tf.losses.get_regularization_loss`), or `None` when it is empty.
    pub fn regularization_loss(&mut self) -> Result<Option<Tensor>> {
        let terms: Vec<Tensor> = self
            .graph
            .collection(keys::REGULARIZATION_LOSSES)
            .iter()
            .filter_map(|n| self.graph.get(n))
            .map(|id| self.graph.tensor(id, 0))
            .collect();
        match terms.len() {
            0 => Ok(None),
            1 => Ok(Some(terms[0])),
            _ => self.op1("total_regularization_loss", Op::AddN, &terms).map(Some),
        }
    }

    /// Add a node's name to a collection.
    pub fn add_to_collection(&mut self, key: &str, t: impl Into<NodeId>) {
        let name = self.graph.node(t.into()).name.clone();
        self.graph.add_to_collection(key, &name);
    }
}
