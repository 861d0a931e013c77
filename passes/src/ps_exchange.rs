//! `ps_exchange`: the synchronous parameter-server update across processes
//! (`--variables ps` under `mpirun`, ZeRO stage 1).
//!
//! Runs only with several processes and a program record that shards the
//! variables (`Program::ps`, set by `place`), right after `all_reduce`.
//! Parameter-server task `k` lives on rank `k % world` (round-robin: with
//! the default `--ps-tasks` = world size, task `k` is rank `k`; with fewer
//! tasks some ranks own nothing, with more a rank owns several tasks).
//!
//! The exchange of one step:
//! 1. the gradients are summed across ranks by `all_reduce`'s buckets, in
//!    rank order, so the sum an owner applies is bit-identical to the one
//!    the all-reduce path applies; a bucket of gradients that only one
//!    rank's updates read (`to_owners`) is reduced to that rank alone
//!    (`AllReduce { root: Some(k) }`, the plan's `Step::Reduce`,
//!    `Comm::reduce_to`), so a rank receives the sums of the gradients it
//!    owns, and of the all-reduced rest (the loss, batch-norm statistics);
//! 2. only the owner of a variable runs its `ApplyGradient`: this pass
//!    removes every other rank's apply of it, its optimizer slots (which
//!    then exist on the owner alone: no buffer, no initializer, no
//!    checkpoint entry on the others) and whatever fed only them;
//! 3. each owner broadcasts the new values of its variables inside the
//!    step: one `Broadcast { root }` node per owning rank ([`PsGroup`]),
//!    chained into the collectives right after the last bucket reduced to
//!    it (the same order on every rank), after the owner's updates and
//!    after every reader of those variables on every rank (`place`'s
//!    write-after-read edges), so a shard's values go out as soon as they
//!    are final and overwrite nothing the step still reads.
//!
//! With `--ps-ranks K` (`ProcessGroup::ps_ranks`) task `k` lives on rank
//! `world - K + k % K`, and a parameter-server rank runs no towers: it
//! compiles the workers' graph up to the collectives, then its share of
//! every collective becomes a `-0.0`-filled tensor (the exact additive
//! identity, so every sum is the workers' bit for bit) and everything the
//! feeds reach is pruned (`zero_contributions`; a fetch the towers compute
//! on one rank alone is refused by `check_no_towers`).
//!
//! Invariants after this pass:
//! - a rank's graph holds an `ApplyGradient` exactly for the variables it
//!   owns, and a slot variable exactly when it holds its apply;
//! - every `AllReduce` bucket is kept on every rank (same collectives in
//!   the same order on every rank: the `Comm` contract), even a bucket
//!   whose gradients this rank no longer reads (a reduce to another rank:
//!   this rank only sends its share);
//! - `st.ps_groups` lists every owning rank once, ascending, with its
//!   variables sorted by name; it depends only on the graph, the owners
//!   and the world size, never on the rank, so every rank issues the same
//!   broadcasts;
//! - `global_step`, the learning rate and batch-norm moving averages are
//!   updated on every rank from the all-reduced statistics (bit-identical
//!   inputs everywhere), so they need no exchange;
//! - every variable but the removed slots stays, read or not (a rank
//!   that owns nothing still holds the learning rate the loop writes);
//! - `st.grads` keeps only the gradients still in the graph.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use towers_graph::{ConstValue, Graph, NewNode, NodeId, Op, Tensor, UnaryOp, F32};

use crate::manager::Pass;
use crate::options::ProcessGroup;
use crate::prune::{prune, roots};
use crate::state::{CompileState, PassError};

/// The variables one rank owns and broadcasts after every step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PsGroup {
    /// The owning rank (`task % world`).
    pub rank: usize,
    /// Its parameter-server tasks, ascending.
    pub tasks: Vec<u32>,
    /// The variables it updates, sorted by name.
    pub variables: Vec<String>,
    /// Their optimizer slots (they exist on this rank only), sorted by name.
    pub slots: Vec<String>,
    /// Each slot's shape (its variable's), in the order of `slots`.
    pub slot_shapes: Vec<Vec<usize>>,
    /// Bytes of the variables, and of their slots.
    pub variable_bytes: usize,
    pub slot_bytes: usize,
}

/// The rank that runs parameter-server task `task` among `world` ranks,
/// the last `ps_ranks` of which are parameter-server ranks (`--ps-ranks`):
/// task `k` on rank `k % world` without them, on rank
/// `world - ps_ranks + k % ps_ranks` with them.
pub fn task_rank(task: u32, world: usize, ps_ranks: usize) -> usize {
    match ps_ranks {
        0 => task as usize % world.max(1),
        k => world.saturating_sub(k) + task as usize % k,
    }
}

/// Keep each variable's update on its owner only (see the module docs).
#[derive(Debug, Clone)]
pub struct PsExchange {
    pub group: ProcessGroup,
}

impl Pass for PsExchange {
    fn name(&self) -> &'static str {
        "ps_exchange"
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        let Some(ps) = g.program().ps.clone() else { return Ok(()) };
        if self.group.is_single() {
            return Ok(());
        }
        let world = self.group.world;
        let mut groups: BTreeMap<usize, PsGroup> = BTreeMap::new();
        let mut drop: Vec<NodeId> = Vec::new();
        for id in g.topo_order()? {
            let n = g.node(id);
            let Op::ApplyGradient { optimizer } = &n.op else { continue };
            let slots = optimizer.slot_names().len();
            let inputs = g.inputs(id);
            let var = g.node(inputs[0].node).name.clone();
            let task = ps.owner(&var).ok_or_else(|| {
                PassError::Options(format!(
                    "'{var}' is updated by '{}' but has no parameter-server owner; --variables ps shards every trainable variable (is it created after place?)",
                    n.name
                ))
            })?;
            let rank = task_rank(task, world, self.group.ps_ranks);
            let slot_names: Vec<(String, Vec<usize>)> = inputs[1..=slots]
                .iter()
                .map(|t| {
                    let n = g.node(t.node);
                    let shape = n.outputs[t.slot].shape.dims().unwrap_or_default();
                    (n.name.clone(), shape)
                })
                .collect();
            let bytes = |t: &towers_graph::Tensor| g.node(t.node).outputs[t.slot].byte_size().unwrap_or(0);
            let variable_bytes = bytes(&inputs[0]);
            let slot_bytes: usize = inputs[1..=slots].iter().map(bytes).sum();
            let entry = groups.entry(rank).or_insert_with(|| PsGroup {
                rank,
                tasks: Vec::new(),
                variables: Vec::new(),
                slots: Vec::new(),
                slot_shapes: Vec::new(),
                variable_bytes: 0,
                slot_bytes: 0,
            });
            entry.variable_bytes += variable_bytes;
            entry.slot_bytes += slot_bytes;
            entry.tasks.push(task);
            entry.variables.push(var);
            for (name, shape) in slot_names {
                entry.slots.push(name);
                entry.slot_shapes.push(shape);
            }
            if rank != self.group.rank {
                drop.push(id);
                drop.extend(inputs[1..=slots].iter().map(|t| t.node));
            }
        }
        if groups.is_empty() {
            return Err(PassError::MissingState {
                pass: "ps_exchange".into(),
                what: "the optimizer's updates to place on their owners".into(),
                after: "apply".into(),
            });
        }
        for id in drop {
            g.remove(id);
        }
        let fed = if self.group.is_ps_rank() { zero_contributions(g)? } else { BTreeSet::new() };
        // Whatever fed only the removed updates goes too; every bucket and
        // every other variable stays (a rank that owns nothing still holds
        // the learning rate the training loop writes each step).
        let mut keep = roots(g, st)?;
        keep.extend(
            g.node_ids().into_iter().filter(|&id| matches!(g.node(id).op, Op::AllReduce { .. } | Op::Variable { .. })),
        );
        if self.group.is_ps_rank() {
            check_no_towers(g, &fed)?;
            keep.retain(|id| !fed.contains(id));
        }
        prune(g, &keep);
        st.var_list.retain(|v| g.get(v).is_some());
        st.grads.retain(|_, t| g.get(&t.node).is_some());
        let groups: Vec<PsGroup> = groups.into_values().collect();
        broadcasts(g, st, &groups, self.group.rank)?;
        st.ps_groups = groups
            .into_iter()
            .map(|mut p| {
                let tasks: BTreeSet<u32> = p.tasks.iter().copied().collect();
                p.tasks = tasks.into_iter().collect();
                p.variables.sort();
                let mut slots: Vec<(String, Vec<usize>)> = p.slots.drain(..).zip(p.slot_shapes.drain(..)).collect();
                slots.sort();
                (p.slots, p.slot_shapes) = slots.into_iter().unzip();
                p
            })
            .collect();
        g.reinfer()?;
        Ok(())
    }
}

/// A parameter-server rank's share of every collective (`--ps-ranks`): it
/// runs no towers, so each input of every `AllReduce` becomes a fresh
/// `-0.0`-filled tensor (`Neg` of a `+0.0` constant, rewritten every step
/// into the buffer the collective sums in place). `-0.0` is the exact
/// additive identity (`x + -0.0 == x` bit for bit for every `x`, `+0.0`
/// and `-0.0` included), so the rank-ordered sums equal the workers' alone.
/// The towers then feed nothing the program keeps, and `prune` drops them.
fn zero_contributions(g: &mut Graph) -> Result<BTreeSet<NodeId>, PassError> {
    let reduces: Vec<NodeId> =
        g.topo_order()?.into_iter().filter(|&id| matches!(g.node(id).op, Op::AllReduce { .. })).collect();
    for r in reduces {
        let device = g.node(r).device;
        for (slot, t) in g.inputs(r).into_iter().enumerate() {
            let ty = g.tensor_type(t)?.clone();
            let shape = ty.shape.dims().ok_or_else(|| {
                PassError::Options(format!(
                    "'{}' (input {slot} of '{}') has no static shape; a --ps-ranks rank fills its share of the collective with -0.0 and needs the shape",
                    g.node(t.node).name,
                    g.node(r).name
                ))
            })?;
            let n: usize = shape.iter().product();
            let value = ConstValue { dtype: ty.dtype, shape, data: vec![F32(0.0); n] };
            let base = format!("ps_rank/{}/{slot}", g.node(r).name);
            let zeros = g.add(NewNode::new(g.unique_name(&format!("{base}/zeros")), Op::Const { value }, vec![]))?;
            g.node_mut(zeros).device = device;
            let op = Op::Unary(UnaryOp::Neg);
            let neg =
                g.add(NewNode::new(g.unique_name(&format!("{base}/neg_zeros")), op, vec![Tensor::new(zeros, 0)]))?;
            g.node_mut(neg).device = device;
            g.set_input(r, slot, Tensor::new(neg, 0))?;
        }
    }
    // What remains of the towers is what the feeds reach through data
    // edges; an ordering edge from it (`place`'s write-after-read edges
    // into the updates) orders nothing that runs here any more.
    let mut fed: BTreeSet<NodeId> = BTreeSet::new();
    let mut todo: Vec<NodeId> =
        g.node_ids().into_iter().filter(|&id| matches!(g.node(id).op, Op::Placeholder { .. })).collect();
    while let Some(id) = todo.pop() {
        if fed.insert(id) {
            todo.extend(g.consumers(id).into_iter().map(|(c, _, _)| c));
        }
    }
    for id in g.node_ids().into_iter().filter(|id| !fed.contains(id)) {
        let controls = g.control_inputs(id);
        if controls.iter().any(|c| fed.contains(c)) {
            g.clear_control_inputs(id);
            for c in controls.into_iter().filter(|c| !fed.contains(c)) {
                g.add_control(c, id)?;
            }
        }
    }
    Ok(fed)
}

/// A parameter-server rank computes no per-rank value: every fetch must
/// be reduced across the ranks (the loss, a reduced accuracy), not read
/// from the towers (`fed`: whatever the feeds reach).
fn check_no_towers(g: &Graph, fed: &BTreeSet<NodeId>) -> Result<(), PassError> {
    for (name, t) in &g.program().fetches {
        let id = t.resolve(g)?.node;
        if fed.contains(&id) {
            return Err(PassError::Options(format!(
                "--ps-ranks: the fetch '{name}' ('{}') is computed from one rank's batch and not reduced across ranks, but a parameter-server rank runs no towers; fetch a value averaged over the towers (a scalar mean, as the loss), or co-locate the ps tasks (drop --ps-ranks)",
                g.node(id).name
            )));
        }
    }
    Ok(())
}

/// The owners' values back, in the plan: one `Broadcast { root }` per
/// owning rank over its variables, chained into the collectives' order
/// right after the last bucket reduced to that rank (owners in rank
/// order; an owner with no reduced bucket after the last bucket), so the
/// order is the same on every rank. On the owner it follows its updates
/// of those variables; on every rank it follows every reader of them
/// (`place`'s write-after-read edges), so it overwrites nothing this step
/// still reads.
fn broadcasts(g: &mut Graph, st: &CompileState, groups: &[PsGroup], rank: usize) -> Result<(), PassError> {
    let buckets: Vec<NodeId> = st.buckets.iter().map(|b| g.find(&b.node)).collect::<Result<_, _>>()?;
    let last_of =
        |r: usize| st.buckets.iter().rposition(|b| b.root == Some(r)).unwrap_or(st.buckets.len().saturating_sub(1));
    let mut order: Vec<NodeId> = Vec::new();
    let mut made: Vec<(usize, NodeId)> = Vec::new();
    for grp in groups {
        let vars: Vec<NodeId> = grp.variables.iter().map(|v| g.find(v)).collect::<Result<_, _>>()?;
        let device = g.node(vars[0]).device;
        let inputs = vars.iter().map(|&v| Tensor::new(v, 0)).collect();
        let name = g.unique_name(&format!("ps_broadcast/rank_{}", grp.rank));
        let op = Op::Broadcast { root: grp.rank, variables: vars.len() };
        let b = g.add(NewNode::new(name, op, inputs))?;
        g.node_mut(b).device = device;
        if grp.rank == rank {
            // After this rank's updates of the variables it sends.
            let applies: Vec<NodeId> = vars
                .iter()
                .flat_map(|&v| g.consumers(v))
                .filter(|&(c, slot, _)| slot == 0 && matches!(g.node(c).op, Op::ApplyGradient { .. }))
                .map(|(c, _, _)| c)
                .collect();
            for a in applies {
                g.add_control(a, b)?;
            }
        }
        made.push((last_of(grp.rank), b));
    }
    for (i, &bucket) in buckets.iter().enumerate() {
        order.push(bucket);
        order.extend(made.iter().filter(|m| m.0 == i).map(|m| m.1));
    }
    if buckets.is_empty() {
        order.extend(made.iter().map(|m| m.1));
    }
    for w in order.windows(2) {
        if !g.reaches(w[0], w[1]) {
            g.add_control(w[0], w[1])?;
        }
    }
    crate::place::add_war_edges(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_map_to_ranks_round_robin() {
        assert_eq!((0..5).map(|k| task_rank(k, 2, 0)).collect::<Vec<_>>(), [0, 1, 0, 1, 0]);
        assert_eq!(task_rank(3, 4, 0), 3);
        // --ps-ranks 2 of 5: workers 0..3, tasks on ranks 3 and 4.
        assert_eq!((0..4).map(|k| task_rank(k, 5, 2)).collect::<Vec<_>>(), [3, 4, 3, 4]);
    }
}
