//! `tower_cse`: identical computations on shared state across towers,
//! computed once (tower algebra).
//!
//! After `replicate` every tower holds its own copy of the forward and
//! backward subgraph. The part of it that reads only shared state
//! (variables, constants) and not the tower's slice of the batch is the same
//! computation N times: an L2 weight-decay term `scale * l2_loss(W)` added
//! per tower (TF1's cifar10_multi_gpu_train), a reshape or cast of a
//! variable, and their gradients. This pass hash-conses the tower nodes
//! bottom-up: two nodes with the same op (attributes included: ops compare
//! floats by bits), the same output types and inputs of the same value are
//! one value, and a node of a later tower is merged into the first tower's
//! (its readers read the first tower's node, and it is removed).
//!
//! Exact: a merged node computed the same op on the same values, so every
//! bit downstream is unchanged.
//!
//! Invariants:
//! - only tower nodes (`tower = Some(_)`) are candidates, visited tower by
//!   tower and within a tower in topological order; the node kept is the
//!   first of its value in that order (the lowest tower's), with its name,
//!   tower and requested device, so `place` runs it on that tower's device
//!   (its rule 1) and puts a `Copy` on each edge to another tower's device
//!   (elided by the CPU backend, whose devices share one memory; on GPUs a
//!   copy replaces a recomputation, which is why `towers train` enables
//!   this pass for the CPU backend only, like `tower_matmul`);
//! - nodes are merged only across towers (micro-batches of one tower are
//!   ordered by control edges, and such nodes are never merged anyway);
//! - never merged (nor removed): stateful nodes ([`Op::is_stateful`]:
//!   variables, placeholders, dropout, every writer), copies, all-reduces,
//!   tower reductions and no-ops; nodes with control edges in or out;
//!   nodes with a type not fully known; nodes whose name the compile state,
//!   the program record or a collection refers to (the same list as
//!   `simplify` keeps, e.g. a tower's loss or gradient). Such a node may
//!   still be the node others are merged into;
//! - sources (constants) are classed by value, so their readers merge, but
//!   are never merged themselves (that would only add a copy); a later
//!   tower's constant left without readers is removed;
//! - batch-dependent nodes never merge: each tower reads its own output of
//!   the batch split, so their inputs differ.
//!
//! Why not in the e-graph: `simplify` builds one e-graph per tower and
//! device so that nothing moves between them, and most of what repeats
//! (`L2Loss`, `MatMul`, `Cast`, convolutions) is an opaque leaf there;
//! merging across towers is plain hash-consing over every pure op, which
//! needs no rewrite rules. It runs after `simplify`: fusion inlines a
//! shared elementwise term into each tower's kernel for free, which would
//! no longer be possible once it had readers in two towers.

use std::collections::{BTreeMap, HashMap};

use towers_graph::{Graph, NodeId, Op, Tensor, TensorType};

use crate::manager::Pass;
use crate::simplify::protected_names;
use crate::state::{CompileState, PassError};

/// Merge identical tower computations across towers (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct TowerCse;

/// What makes two nodes one value: the op with its attributes, the output
/// types, and the value (class) and slot of every input.
type Key = (Op, Vec<TensorType>, Vec<(NodeId, usize)>);

/// The key of node `id`, or `None` when it must stay a value of its own.
fn key(g: &Graph, id: NodeId, class: &BTreeMap<NodeId, NodeId>) -> Option<Key> {
    let n = g.node(id);
    let never = n.op.is_stateful()
        || matches!(n.op, Op::Copy | Op::AllReduce { .. } | Op::TowerMean { .. } | Op::TowerMatMul { .. } | Op::NoOp)
        || !g.control_inputs(id).is_empty()
        || !g.control_consumers(id).is_empty()
        || n.outputs.is_empty()
        || !n.outputs.iter().all(|t| t.shape.is_fully_known());
    if never {
        return None;
    }
    let inputs = g.inputs(id).iter().map(|t| (class.get(&t.node).copied().unwrap_or(t.node), t.slot)).collect();
    Some((n.op.clone(), n.outputs.clone(), inputs))
}

impl Pass for TowerCse {
    fn name(&self) -> &'static str {
        "tower_cse"
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        let protected = protected_names(g, st);
        let order = g.topo_order()?;
        // Tower by tower, each in topological order: a tower node reads only
        // its own tower's nodes and shared ones, so inputs come first.
        let mut visit: Vec<(usize, usize, NodeId)> =
            order.iter().enumerate().filter_map(|(i, &id)| g.node(id).tower.map(|t| (t, i, id))).collect();
        visit.sort();
        // The node each visited duplicate has the value of.
        let mut class: BTreeMap<NodeId, NodeId> = BTreeMap::new();
        // Looked up only, never iterated: the result does not depend on hash order.
        let mut first: HashMap<Key, NodeId> = HashMap::new();
        let mut duplicates: Vec<NodeId> = Vec::new();
        for &(tower, _, id) in &visit {
            let Some(k) = key(g, id, &class) else { continue };
            let Some(&rep) = first.get(&k) else {
                first.insert(k, id);
                continue;
            };
            class.insert(id, rep);
            let node = g.node(id);
            let merge = g.node(rep).tower != Some(tower) && !g.inputs(id).is_empty() && !protected.contains(&node.name);
            if merge {
                for (reader, dst, src) in g.consumers(id) {
                    g.set_input(reader, dst, Tensor::new(rep, src))?;
                }
                g.remove(id);
            } else if !g.consumers(id).is_empty() {
                // Read now (its readers come later in the visit): removed
                // below only if merging its readers leaves it unread.
                duplicates.push(id);
            }
        }
        // Duplicates left without readers (a later tower's constants): last first, so chains go too.
        for &id in duplicates.iter().rev() {
            let unread = g.consumers(id).is_empty() && g.control_consumers(id).is_empty();
            if unread && !protected.contains(&g.node(id).name) {
                g.remove(id);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use towers_graph::{verify::verify, BinaryOp, ConstValue, DType, Device, Initializer, NewNode, Shape, F32};

    use super::*;
    use crate::state::TensorRef;

    /// Two towers by hand: a variable `w` f32[4,3], a placeholder `x`
    /// f32[8,4] split by rows (`split/x`, outside the towers), and per tower
    /// `i`: `tower_i/c` = 0.01, `tower_i/l2` = L2Loss(w), `tower_i/reg` =
    /// c * l2, `tower_i/xw` = x_i · w, `tower_i/drop` = Dropout(w) (same
    /// attributes in both towers), `tower_i/sum` = Sum(xw) + reg + Sum(drop);
    /// `mean` (a `TowerMean`, no tower) reads both sums.
    fn two_towers() -> Graph {
        let mut g = Graph::new();
        let add = |g: &mut Graph, name: &str, op: Op, ins: Vec<Tensor>, tower: Option<usize>| {
            let mut nn = NewNode::new(name, op, ins);
            if let Some(t) = tower {
                nn.requested_device = Device::gpu(t as u32).spec();
            }
            let id = g.add(nn).expect("add");
            g.node_mut(id).tower = tower;
            id
        };
        let var = Op::Variable { dtype: DType::F32, shape: vec![4, 3], init: Initializer::Zeros, trainable: true };
        let w = Tensor::new(add(&mut g, "w", var, vec![], None), 0);
        let ph = Op::Placeholder { dtype: DType::F32, shape: Shape::known(&[8, 4]) };
        let x = add(&mut g, "x", ph, vec![], None);
        let split = add(&mut g, "split/x", Op::Split { axis: 0, sizes: vec![4, 4] }, vec![Tensor::new(x, 0)], None);
        let mut sums = Vec::new();
        for i in 0..2 {
            let t = |s: &str| format!("tower_{i}/{s}");
            let one = |id| vec![Tensor::new(id, 0)];
            let c = add(&mut g, &t("c"), Op::Const { value: ConstValue::scalar(0.01) }, vec![], Some(i));
            let l2 = add(&mut g, &t("l2"), Op::L2Loss, vec![w], Some(i));
            let reg =
                add(&mut g, &t("reg"), Op::Binary(BinaryOp::Mul), vec![Tensor::new(c, 0), Tensor::new(l2, 0)], Some(i));
            let mm = Op::MatMul { transpose_a: false, transpose_b: false };
            let xw = add(&mut g, &t("xw"), mm, vec![Tensor::new(split, i), w], Some(i));
            let drop = Op::Dropout { rate: F32(0.5), seed: 7, first_row: 0, row_elems: 0 };
            let drop = add(&mut g, &t("drop"), drop, vec![w], Some(i));
            let all = Op::ReduceSum { axes: vec![0, 1], keep_dims: false };
            let s1 = add(&mut g, &t("sum_xw"), all.clone(), one(xw), Some(i));
            let s2 = add(&mut g, &t("sum_drop"), all, one(drop), Some(i));
            let a =
                add(&mut g, &t("a"), Op::Binary(BinaryOp::Add), vec![Tensor::new(s1, 0), Tensor::new(reg, 0)], Some(i));
            let sum =
                add(&mut g, &t("sum"), Op::Binary(BinaryOp::Add), vec![Tensor::new(a, 0), Tensor::new(s2, 0)], Some(i));
            sums.push(Tensor::new(sum, 0));
        }
        add(&mut g, "mean", Op::TowerMean { weights: vec![F32(0.5), F32(0.5)] }, sums, None);
        g
    }

    fn input(g: &Graph, node: &str, slot: usize) -> String {
        g.node(g.inputs(g.find(node).unwrap())[slot].node).name.clone()
    }

    /// The regularizer reads only shared state: tower 1's `l2` and `reg`
    /// are gone, its reader reads tower 0's, and tower 1's constant, left
    /// unread, is gone too. Tower 0's nodes keep their names and towers.
    #[test]
    fn shared_state_computations_are_merged_into_the_first_towers() {
        let mut g = two_towers();
        TowerCse.run(&mut g, &mut CompileState::default()).unwrap();
        verify(&g, "tower_cse", false).unwrap();
        for gone in ["tower_1/l2", "tower_1/reg", "tower_1/c"] {
            assert!(g.get(gone).is_none(), "{gone} is merged");
        }
        assert_eq!(input(&g, "tower_1/a", 1), "tower_0/reg");
        assert_eq!(g.node(g.find("tower_0/reg").unwrap()).tower, Some(0));
        assert_eq!(input(&g, "tower_0/reg", 0), "tower_0/c");
    }

    /// Each tower's product reads its own rows of the batch: never merged,
    /// and neither is what reads it.
    #[test]
    fn batch_dependent_computations_are_not_merged() {
        let mut g = two_towers();
        TowerCse.run(&mut g, &mut CompileState::default()).unwrap();
        for kept in ["tower_1/xw", "tower_1/sum_xw", "tower_1/a", "tower_1/sum"] {
            assert!(g.get(kept).is_some(), "{kept} is kept");
        }
        assert_eq!(input(&g, "tower_1/sum_xw", 0), "tower_1/xw");
    }

    /// Dropout draws random numbers (stateful): two dropouts of the same
    /// variable with the same attributes stay two, and so do their readers.
    #[test]
    fn dropout_is_never_merged() {
        let mut g = two_towers();
        TowerCse.run(&mut g, &mut CompileState::default()).unwrap();
        assert!(g.get("tower_1/drop").is_some() && g.get("tower_1/sum_drop").is_some());
        assert_eq!(input(&g, "tower_1/sum_drop", 0), "tower_1/drop");
    }

    /// A node the program record (a fetch) or the compile state (a tower's
    /// loss) names is kept, and read as before; what it reads still merges.
    #[test]
    fn named_nodes_are_kept() {
        let mut g = two_towers();
        g.program_mut().fetches.insert("l2_1".into(), TensorRef::new("tower_1/l2", 0));
        let mut st = CompileState { tower_losses: vec![TensorRef::new("tower_1/reg", 0)], ..Default::default() };
        TowerCse.run(&mut g, &mut st).unwrap();
        assert!(g.get("tower_1/l2").is_some() && g.get("tower_1/reg").is_some());
        assert_eq!(input(&g, "tower_1/a", 1), "tower_1/reg");
        assert_eq!(input(&g, "tower_1/reg", 1), "tower_1/l2");
    }

    /// Same graph, same result, byte for byte.
    #[test]
    fn deterministic() {
        let text = || {
            let mut g = two_towers();
            TowerCse.run(&mut g, &mut CompileState::default()).unwrap();
            towers_graph::text::to_text(&g).unwrap()
        };
        assert_eq!(text(), text());
    }
}
