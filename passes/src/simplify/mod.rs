//! `simplify`: equality saturation (egg) over the pure part of the graph.
//!
//! Runs once every shape is known: after `bind_batch` (and after `split` and
//! `grad_mean` when towers are used), before `apply` and `place`. It folds
//! what autodiff had to build for an unknown batch size: the ReduceMean
//! gradient `Mul(Reshape(BroadcastLike(1 / Sum(BroadcastLike(1, x)), x)), dy)`
//! becomes `Mul(1/N, dy)`; it also drops `Identity`s, no-op reshapes and
//! broadcasts, `x*1`, `x+0`, `--x`, merges reshape chains, and cancels
//! data movement: a split concatenated back in order, the slices of a
//! concat's gradient concatenated again ([`rules`] lists every rule with
//! its test).
//!
//! What the e-graph sees, per partition of nodes with one tower and one
//! requested device (so nothing moves between towers or devices):
//! - terms ([`lang::TensorLang`]): nodes whose op is `Binary` (and `AddN` of two, as `add`), `Unary`,
//!   `UnaryGrad` (any kernel op), `Identity`, `BroadcastLike`, `Reshape`,
//!   `ReduceSum`, `Concat`, `Slice`, `Split` (one `split_part` term per
//!   output) or a splat f32 `Const`, with fully known types, no placed device, no control
//!   edges in or out, at least one consumer, and a name that no part of the
//!   [`CompileState`] (loss, grads, tower grads and losses), the program
//!   record (fetches, train_op) and no collection refers to;
//! - every other tensor is an opaque leaf named `node:slot`: stateful nodes
//!   (variables, placeholders, dropout, optimizer updates), copies, tower
//!   means, no-ops and everything above that is kept by name are never
//!   merged, rewritten or removed (their inputs may be simplified).
//!
//! After saturation, [`fuse`] adds fused elementwise terms (chains of
//! single-consumer elementwise terms as one `(fused ew[..] ..)` term whose
//! kernel is generated from its expression) to the same e-graph, unless
//! [`Simplify::fuse`] is off; extraction then picks them where they save
//! launches, and they are written back as `Op::Fused` nodes named
//! `<node>/fused`.
//!
//! The analysis ([`lang::TypeAnalysis`]) carries each class's type and, for
//! splat constants, their value (folded in f64, rounded to f32 once when a
//! constant is written back); its `merge` asserts (debug) that both sides
//! agree. The runner has explicit limits and a time limit generous enough
//! never to be the reason it stops; a stop other than saturation is
//! reported as a diagnostic (the e-graph is still sound then, only less
//! simplified). Extraction uses [`cost::KernelCost`] (kernels, then bytes;
//! tree cost, see its docs for the sharing caveat).
//!
//! Writing back: the best term of every root (a term output consumed outside the
//! partition) is built bottom-up, one graph node per e-class. A class whose
//! original node has the op of the chosen term keeps that node and its name
//! (its inputs are re-pointed); the split parts of one `(axis, sizes,
//! input)` are outputs of one `Split` node (the original one when it is a
//! member of their class); other terms become new nodes named
//! `<root>/simplified` (`_1`, `_2`, ... by [`Graph::unique_name`]), in a
//! deterministic order. Pure nodes nothing uses any more are removed, and
//! types are re-inferred.

pub mod cost;
pub mod fuse;
pub mod lang;
pub mod rules;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use egg::{Extractor, Id, Runner, SimpleScheduler, StopReason, Symbol};
use towers_graph::{ConstValue, DType, DeviceSpec, Graph, NewNode, NodeId, Op, Tensor, F32};

use crate::manager::Pass;
use crate::state::{CompileState, PassError};
use cost::KernelCost;
use lang::{Attr, Bin, Konst, TEGraph, TensorLang, TypeAnalysis, Un, UnGrad};

/// Runner limits: explicit, and the same on every machine.
pub const ITER_LIMIT: usize = 10;
pub const NODE_LIMIT: usize = 20_000;
pub const TIME_LIMIT: Duration = Duration::from_secs(60);

/// The equality-saturation simplification pass (see the module docs).
#[derive(Debug, Clone)]
pub struct Simplify {
    /// Fuse chains of elementwise terms into generated kernels ([`fuse`]).
    pub fuse: bool,
}

impl Default for Simplify {
    fn default() -> Simplify {
        Simplify { fuse: true }
    }
}

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        let protected = protected_names(g, st);
        let mut keys: BTreeSet<(Option<usize>, DeviceSpec)> = BTreeSet::new();
        for id in g.node_ids() {
            let n = g.node(id);
            keys.insert((n.tower, n.requested_device.clone()));
        }
        for key in keys {
            let nodes: Vec<NodeId> = g
                .topo_order()?
                .into_iter()
                .filter(|&id| {
                    let n = g.node(id);
                    (n.tower, &n.requested_device) == (key.0, &key.1) && is_term(g, id, &protected)
                })
                .collect();
            if !nodes.is_empty() {
                simplify_partition(g, st, &nodes, key.0, &key.1, self.fuse)?;
            }
        }
        g.reinfer()?;
        Ok(())
    }
}

/// Names the compile state, the program record or a collection refers to:
/// kept as they are (here and by `tower_cse`).
pub(crate) fn protected_names(g: &Graph, st: &CompileState) -> BTreeSet<String> {
    let mut p = BTreeSet::new();
    p.extend(st.loss.iter().map(|t| t.node.clone()));
    p.extend(st.grads.values().map(|t| t.node.clone()));
    p.extend(st.tower_grads.iter().flat_map(|m| m.values().map(|t| t.node.clone())));
    p.extend(st.tower_losses.iter().map(|t| t.node.clone()));
    p.extend(g.program().node_names().map(str::to_string));
    p.extend(st.var_list.iter().cloned());
    p.extend(st.batch_inputs.iter().cloned());
    for names in g.collections().values() {
        p.extend(names.iter().cloned());
    }
    p
}

/// The splat value of an f32 constant whose data matches its shape.
fn splat(v: &ConstValue) -> Option<f64> {
    let n: usize = v.shape.iter().product();
    let first = v.data.first()?;
    (v.dtype == DType::F32 && v.data.len() == n && v.data.iter().all(|x| x.0.to_bits() == first.0.to_bits()))
        .then_some(first.0 as f64)
}

/// Whether node `id` is a term of the e-graph (see the module docs).
fn is_term(g: &Graph, id: NodeId, protected: &BTreeSet<String>) -> bool {
    let n = g.node(id);
    let op_ok = match &n.op {
        Op::Const { value } => splat(value).is_some(),
        // A sum of two (autodiff's gradient accumulation) is `add`: `add_n`
        // computes `x0 + x1` in the same rounding.
        Op::AddN => g.inputs(id).len() == 2,
        Op::Binary(_)
        | Op::Unary(_)
        | Op::UnaryGrad(_)
        | Op::Identity
        | Op::BroadcastLike
        | Op::Reshape { .. }
        | Op::ReduceSum { .. }
        | Op::Concat { .. }
        | Op::Slice { .. } => true,
        Op::Split { sizes, .. } => !sizes.is_empty(),
        _ => false,
    };
    let outputs = if matches!(n.op, Op::Split { .. }) { !n.outputs.is_empty() } else { n.outputs.len() == 1 };
    op_ok
        && !n.op.is_stateful()
        && outputs
        && n.outputs.iter().all(|t| t.shape.is_fully_known())
        && n.device.is_none()
        && !protected.contains(&n.name)
        && g.control_inputs(id).is_empty()
        && g.control_consumers(id).is_empty()
        && !g.consumers(id).is_empty()
}

fn leaf_name(g: &Graph, t: Tensor) -> String {
    format!("{}:{}", g.node(t.node).name, t.slot)
}

/// Build the e-graph of one partition, saturate, extract, and write back.
fn simplify_partition(
    g: &mut Graph,
    st: &mut CompileState,
    nodes: &[NodeId],
    tower: Option<usize>,
    device: &DeviceSpec,
    fusion: bool,
) -> Result<(), PassError> {
    let in_part: BTreeSet<NodeId> = nodes.iter().copied().collect();
    let mut eg = TEGraph::new(TypeAnalysis::default());
    // The class of every term output.
    let mut class_of: BTreeMap<Tensor, Id> = BTreeMap::new();
    for &id in nodes {
        let mut ins = Vec::new();
        for t in g.inputs(id) {
            ins.push(match class_of.get(&t) {
                Some(&c) => c,
                None => {
                    let sym = Symbol::from(leaf_name(g, t));
                    eg.analysis.leaves.insert(sym, g.tensor_type(t)?.clone());
                    eg.add(TensorLang::Leaf(sym))
                }
            });
        }
        let n = g.node(id);
        let attr = |eg: &mut TEGraph, a: Attr| eg.add(TensorLang::Attr(a));
        if let Op::Split { axis, sizes } = &n.op {
            for (index, ty) in n.outputs.iter().enumerate() {
                let a = attr(&mut eg, Attr::Part { axis: *axis, sizes: sizes.clone(), index });
                let c = eg.add(TensorLang::SplitPart([a, ins[0]]));
                debug_assert_eq!(eg[c].data.ty.as_ref(), Some(ty), "simplify: analysis type of {}:{index}", n.name);
                class_of.insert(Tensor::new(id, index), c);
            }
            continue;
        }
        let enode = match &n.op {
            Op::Const { value } => {
                TensorLang::Num(Konst::new(DType::F32, value.shape.clone(), splat(value).unwrap_or_default()))
            }
            Op::Binary(b) => TensorLang::Binary(Bin(*b), [ins[0], ins[1]]),
            Op::AddN => TensorLang::Binary(Bin(towers_graph::BinaryOp::Add), [ins[0], ins[1]]),
            Op::Unary(u) => TensorLang::Unary(Un(*u), [ins[0]]),
            Op::UnaryGrad(u) => TensorLang::UnaryGrad(UnGrad(*u), [ins[0], ins[1]]),
            Op::Identity => TensorLang::Identity([ins[0]]),
            Op::BroadcastLike => TensorLang::BroadcastLike([ins[0], ins[1]]),
            Op::Reshape { shape } => TensorLang::Reshape([eg.add(TensorLang::Attr(Attr::Dims(shape.clone()))), ins[0]]),
            Op::ReduceSum { axes, keep_dims } => TensorLang::ReduceSum([
                eg.add(TensorLang::Attr(Attr::Axes { axes: axes.clone(), keep: *keep_dims })),
                ins[0],
            ]),
            Op::Concat { axis } => {
                let mut ch = vec![attr(&mut eg, Attr::Axis(*axis))];
                ch.extend(ins.iter().copied());
                TensorLang::Concat(ch.into_boxed_slice())
            }
            Op::Slice { begin, size } => {
                TensorLang::Slice([attr(&mut eg, Attr::Slice { begin: begin.clone(), size: size.clone() }), ins[0]])
            }
            other => unreachable!("simplify: {} is not a term", other.type_name()),
        };
        let c = eg.add(enode);
        debug_assert_eq!(eg[c].data.ty.as_ref(), Some(&n.outputs[0]), "simplify: analysis type of {}", n.name);
        class_of.insert(Tensor::new(id, 0), c);
    }
    eg.rebuild();

    // Roots: term outputs with a consumer outside the partition's terms.
    let mut roots: Vec<(Tensor, Vec<(NodeId, usize)>)> = Vec::new();
    for &id in nodes {
        let mut outside: BTreeMap<usize, Vec<(NodeId, usize)>> = BTreeMap::new();
        for (c, dst, src) in g.consumers(id) {
            if !in_part.contains(&c) {
                outside.entry(src).or_default().push((c, dst));
            }
        }
        roots.extend(outside.into_iter().map(|(slot, v)| (Tensor::new(id, slot), v)));
    }

    let runner = Runner::default()
        .with_egraph(eg)
        .with_iter_limit(ITER_LIMIT)
        .with_node_limit(NODE_LIMIT)
        .with_time_limit(TIME_LIMIT)
        .with_scheduler(SimpleScheduler)
        .run(&rules::rules());
    match &runner.stop_reason {
        Some(StopReason::Saturated) => {}
        other => st.warn(
            "simplify",
            format!(
                "equality saturation stopped before saturating ({other:?}) after {} iterations, {} e-nodes; the graph is simplified only partly",
                runner.iterations.len(),
                runner.egraph.total_number_of_nodes()
            ),
        ),
    }

    let mut eg = runner.egraph;
    if fusion {
        let root_classes: Vec<Id> = roots.iter().map(|(id, _)| class_of[id]).collect();
        // Activation gradients read by a bias gradient: lowering's to fuse.
        let keep: BTreeSet<Id> = roots
            .iter()
            .filter(|(t, outside)| {
                matches!(g.node(t.node).op, Op::UnaryGrad(_))
                    && outside.iter().any(|(c, _)| matches!(g.node(*c).op, Op::BiasAddGrad))
            })
            .map(|(t, _)| eg.find(class_of[t]))
            .collect();
        let report = fuse::fuse(&mut eg, &root_classes, &keep);
        if report.stop != fuse::FuseStop::Saturated {
            st.warn(
                "simplify",
                format!(
                    "fusion stopped before saturating ({:?}) after {} rounds, {} e-nodes added; fewer kernels are fused",
                    report.stop, report.rounds, report.added
                ),
            );
        }
    }
    let eg = &eg;
    let mut members: BTreeMap<Id, Vec<NodeId>> = BTreeMap::new();
    for &id in nodes {
        for slot in 0..g.node(id).outputs.len() {
            if let Some(&c) = class_of.get(&Tensor::new(id, slot)) {
                let v = members.entry(eg.find(c)).or_default();
                if !v.contains(&id) {
                    v.push(id);
                }
            }
        }
    }
    let mut w = Writer {
        eg,
        ex: Extractor::new(eg, KernelCost { egraph: eg }),
        members,
        memo: BTreeMap::new(),
        splits: BTreeMap::new(),
        used: BTreeSet::new(),
        tower,
        device,
    };
    for (root, outside) in &roots {
        let base = format!("{}/simplified", g.node(root.node).name);
        let t = w.tensor(g, class_of[root], &base)?;
        for &(consumer, dst) in outside {
            if t != *root {
                g.set_input(consumer, dst, t)?;
            }
        }
    }
    for &id in nodes {
        if !w.used.contains(&id) {
            g.remove(id);
        }
    }
    Ok(())
}

/// Writes extracted terms back into the graph, one node per e-class.
struct Writer<'a> {
    eg: &'a TEGraph,
    ex: Extractor<'a, KernelCost<'a>, TensorLang, TypeAnalysis>,
    /// Original nodes by (canonical) e-class, in topological order.
    members: BTreeMap<Id, Vec<NodeId>>,
    memo: BTreeMap<Id, Tensor>,
    /// The `Split` node written for each split op and input: its parts are its outputs.
    splits: BTreeMap<(usize, Vec<usize>, Tensor), NodeId>,
    /// Original nodes kept (as the node of their class).
    used: BTreeSet<NodeId>,
    tower: Option<usize>,
    device: &'a DeviceSpec,
}

impl Writer<'_> {
    fn tensor(&mut self, g: &mut Graph, class: Id, base: &str) -> Result<Tensor, PassError> {
        let c = self.eg.find(class);
        if let Some(&t) = self.memo.get(&c) {
            return Ok(t);
        }
        let node = self.ex.find_best_node(c).clone();
        let t = match &node {
            TensorLang::Leaf(sym) => {
                let (name, slot) = sym.as_str().rsplit_once(':').expect("leaf names are node:slot");
                Tensor::new(g.find(name)?, slot.parse().expect("leaf slot"))
            }
            TensorLang::Attr(_) | TensorLang::Scalar(_) => {
                unreachable!("simplify: extracted a {node} term as a tensor")
            }
            _ => {
                let mut ins = Vec::new();
                for i in node.tensor_inputs() {
                    ins.push(self.tensor(g, i, base)?);
                }
                let op = match &node {
                    TensorLang::Num(k) => Op::Const { value: materialize(k) },
                    n => n.op(|i| self.eg[i].data.attr.clone()).expect("a compute term has an op"),
                };
                if let Op::Split { .. } = op {
                    let slot = node.slot(|i| self.eg[i].data.attr.clone());
                    let t = Tensor::new(self.split(g, c, op, ins[0], base)?, slot);
                    self.memo.insert(c, t);
                    return Ok(t);
                }
                let reuse = self.members.get(&c).and_then(|v| {
                    v.iter().copied().find(|&n| {
                        !self.used.contains(&n) && same_kind(&g.node(n).op, &op) && g.inputs(n).len() == ins.len()
                    })
                });
                match reuse {
                    Some(n) => {
                        self.used.insert(n);
                        // An `AddN` stays one only while its operands have one
                        // type: `add` broadcasts (a scalar's gradient sunk into
                        // a full one), `AddN` does not.
                        let keep_add_n = g.node(n).op == Op::AddN && {
                            let types = ins.iter().map(|&t| g.tensor_type(t).ok()).collect::<Vec<_>>();
                            types.iter().all(|t| t.is_some() && *t == types[0])
                        };
                        if g.node(n).op != op && !keep_add_n {
                            g.node_mut(n).op = op;
                        }
                        let old = g.inputs(n);
                        for (slot, t) in ins.into_iter().enumerate() {
                            if old[slot] != t {
                                g.set_input(n, slot, t)?;
                            }
                        }
                        Tensor::new(n, 0)
                    }
                    None => {
                        // A fused kernel is named after the node of its class, if any.
                        let name = match (&op, self.members.get(&c).and_then(|v| v.first())) {
                            (Op::Fused { .. }, Some(&n)) => g.unique_name(&format!("{}/fused", g.node(n).name)),
                            _ => g.unique_name(base),
                        };
                        let mut nn = NewNode::new(name, op, ins);
                        nn.requested_device = self.device.clone();
                        let id = g.add(nn)?;
                        g.node_mut(id).tower = self.tower;
                        Tensor::new(id, 0)
                    }
                }
            }
        };
        self.memo.insert(c, t);
        Ok(t)
    }
}

impl Writer<'_> {
    /// The `Split` node of `op` over `x` (one per split op and input): an
    /// original split of class `c` with that op when one is left, else a new one.
    fn split(&mut self, g: &mut Graph, c: Id, op: Op, x: Tensor, base: &str) -> Result<NodeId, PassError> {
        let Op::Split { axis, sizes } = &op else { unreachable!("simplify: a split part's op is a split") };
        let key = (*axis, sizes.clone(), x);
        if let Some(&n) = self.splits.get(&key) {
            return Ok(n);
        }
        let reuse = self
            .members
            .get(&c)
            .and_then(|v| v.iter().copied().find(|&n| !self.used.contains(&n) && g.node(n).op == op));
        let n = match reuse {
            Some(n) => {
                self.used.insert(n);
                if g.inputs(n)[0] != x {
                    g.set_input(n, 0, x)?;
                }
                n
            }
            None => {
                let mut nn = NewNode::new(g.unique_name(base), op.clone(), vec![x]);
                nn.requested_device = self.device.clone();
                let id = g.add(nn)?;
                g.node_mut(id).tower = self.tower;
                id
            }
        };
        self.splits.insert(key, n);
        Ok(n)
    }
}

/// Whether a node of op `a` can be kept as the node of a term of op `b`
/// (attributes may differ; the kernel op of an elementwise node may not).
fn same_kind(a: &Op, b: &Op) -> bool {
    match (a, b) {
        (Op::Binary(x), Op::Binary(y)) => x == y,
        (Op::AddN, Op::Binary(y)) => *y == towers_graph::BinaryOp::Add,
        (Op::Unary(x), Op::Unary(y)) | (Op::UnaryGrad(x), Op::UnaryGrad(y)) => x == y,
        _ => std::mem::discriminant(a) == std::mem::discriminant(b),
    }
}

/// A splat constant as a graph constant: the f64 value rounded to f32 once.
fn materialize(k: &Konst) -> ConstValue {
    let n: usize = k.dims.iter().product();
    ConstValue { dtype: k.dtype, shape: k.dims.clone(), data: vec![F32(k.value() as f32); n] }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::TensorRef;
    use towers_graph::{verify::verify, Shape};

    fn add(g: &mut Graph, name: &str, op: Op, ins: &[NodeId]) -> NodeId {
        g.add(NewNode::new(name, op, ins.iter().map(|&i| Tensor::new(i, 0)).collect())).expect("add")
    }

    /// `Neg(Identity(Mul(x, 1)))` reads `x` directly; a fetched Identity, a
    /// node with a control edge and two equal placeholders are kept as they are.
    #[test]
    fn simplifies_pure_nodes_and_keeps_named_stateful_and_controlled_ones() {
        let mut g = Graph::new();
        let ph = |_: ()| Op::Placeholder { dtype: DType::F32, shape: Shape::known(&[4]) };
        let x = add(&mut g, "x", ph(()), &[]);
        let x2 = add(&mut g, "x2", ph(()), &[]);
        let one = add(&mut g, "one", Op::Const { value: ConstValue::scalar(1.0) }, &[]);
        let m = add(&mut g, "m", Op::Binary(towers_graph::BinaryOp::Mul), &[x, one]);
        let id = add(&mut g, "id", Op::Identity, &[m]);
        let neg = add(&mut g, "neg", Op::Unary(towers_graph::UnaryOp::Neg), &[id]);
        let fetched = add(&mut g, "fetched", Op::Identity, &[x2]);
        let _use_fetched = add(&mut g, "use_fetched", Op::Unary(towers_graph::UnaryOp::Neg), &[fetched]);
        let mut nn = NewNode::new(
            "controlled",
            Op::Binary(towers_graph::BinaryOp::Mul),
            vec![Tensor::new(x2, 0), Tensor::new(one, 0)],
        );
        nn.control_inputs = vec![neg];
        let controlled = g.add(nn).expect("add");
        let _use_controlled = add(&mut g, "use_controlled", Op::Unary(towers_graph::UnaryOp::Neg), &[controlled]);
        let mut st = CompileState::default();
        g.program_mut().fetches.insert("f".into(), TensorRef::new("fetched", 0));

        Simplify::default().run(&mut g, &mut st).expect("simplify");
        verify(&g, "simplify", false).expect("verifies");
        assert_eq!(g.inputs(g.find("neg").unwrap())[0], Tensor::new(x, 0), "neg reads x directly");
        assert!(g.get("m").is_none() && g.get("id").is_none());
        for kept in ["x", "x2", "fetched", "controlled", "one"] {
            assert!(g.get(kept).is_some(), "{kept} is kept");
        }
        assert_eq!(g.inputs(g.find("use_fetched").unwrap())[0].node, g.find("fetched").unwrap());
        assert!(st.diagnostics.is_empty());
    }

    /// A split concatenated back in order is its input: the neg reads x and
    /// the split and concat are gone. A split whose parts are concatenated
    /// out of order keeps its node and name, with both outputs read.
    #[test]
    fn cancels_split_then_concat_and_keeps_a_split_it_cannot() {
        use towers_graph::UnaryOp;
        let mut g = Graph::new();
        let ph = || Op::Placeholder { dtype: DType::F32, shape: Shape::known(&[4, 6]) };
        let x = add(&mut g, "x", ph(), &[]);
        let split = |sizes: Vec<usize>| Op::Split { axis: 1, sizes };
        let s = add(&mut g, "s", split(vec![2, 4]), &[x]);
        let c = g
            .add(NewNode::new("c", Op::Concat { axis: 1 }, vec![Tensor::new(s, 0), Tensor::new(s, 1)]))
            .expect("concat");
        add(&mut g, "neg", Op::Unary(UnaryOp::Neg), &[c]);
        let x2 = add(&mut g, "x2", ph(), &[]);
        let s2 = add(&mut g, "s2", split(vec![3, 3]), &[x2]);
        let c2 = g
            .add(NewNode::new("c2", Op::Concat { axis: 1 }, vec![Tensor::new(s2, 1), Tensor::new(s2, 0)]))
            .expect("concat");
        add(&mut g, "neg2", Op::Unary(UnaryOp::Neg), &[c2]);
        let mut st = CompileState::default();
        Simplify::default().run(&mut g, &mut st).expect("simplify");
        verify(&g, "simplify", false).expect("verifies");
        assert_eq!(g.inputs(g.find("neg").unwrap()), vec![Tensor::new(x, 0)]);
        assert!(g.get("s").is_none() && g.get("c").is_none(), "the split and the concat are gone");
        let (s2, c2) = (g.find("s2").unwrap(), g.find("c2").unwrap());
        assert_eq!(g.inputs(c2), vec![Tensor::new(s2, 1), Tensor::new(s2, 0)]);
        assert_eq!(g.inputs(s2), vec![Tensor::new(x2, 0)]);
    }
}
