//! The hand-written TF1 path: `average_gradients` for users who build their
//! towers themselves (cifar10_multi_gpu_train.py's helper), with the
//! cross-tower reduction done right.
//!
//! Invariants of what [`average_gradients`] builds: one n-ary `TowerMean`
//! node per variable, named `<var>/grad_mean` (uniquified if taken), whose
//! inputs are the towers' gradients in tower order and whose weights are the
//! towers' shares of the batch. With equal shares that is TF's
//! `average_gradients`; with unequal shares it is the gradient one device
//! computes on the whole batch, where TF's plain mean of per-tower means is
//! not (the DataParallel pitfall).
//!
//! Batch norm in hand-built towers, as TF1 did it: each tower normalizes
//! with its own batch's statistics (the towers' `FusedBatchNorm` nodes
//! share `gamma`, `beta` and the moving averages by reuse), and each
//! tower's `batch_norm` adds its own moving-average updates to
//! `UPDATE_OPS`. TF1 recipes then ran the first tower's updates only
//! (`tf.get_collection(UPDATE_OPS, scope='tower_0')`); running them all
//! would update each moving average once per tower per step.
//! [`merge_tower_updates`] makes one update per moving average, as the
//! compiler's own towers have: from the first tower's statistics
//! ([`BnUpdates::Tower0`], TF1's choice) or from the towers' mean
//! ([`BnUpdates::Mean`], equal weights: a hand-built split of equal
//! shares).

use std::collections::{BTreeMap, BTreeSet};

use towers_graph::{keys, Graph, NewNode, Op, Tensor, F32};

use crate::options::BnUpdates;
use crate::state::PassError;

/// Add one weighted `TowerMean` node named `name` (uniquified) over `inputs`.
pub(crate) fn tower_mean(g: &mut Graph, name: &str, inputs: Vec<Tensor>, weights: &[f32]) -> Result<Tensor, PassError> {
    let name = g.unique_name(name);
    let op = Op::TowerMean { weights: weights.iter().map(|&w| F32(w)).collect() };
    Ok(Tensor::new(g.add(NewNode::new(name, op, inputs))?, 0))
}

/// Combine per-tower gradients: `tower_grads[t]` lists tower `t`'s
/// `(variable name, gradient)` pairs, `weights[t]` is tower `t`'s share of
/// the batch (the shares must be positive and sum to 1). Returns one
/// `(variable, combined gradient)` per variable, in tower 0's order.
///
/// Errors: no towers; a weight count that differs from the tower count;
/// weights that are not positive or do not sum to 1; a variable listed twice
/// in one tower; towers with different variable sets (the error names the
/// variables each tower lacks or adds).
pub fn average_gradients(
    g: &mut Graph,
    tower_grads: &[Vec<(String, Tensor)>],
    weights: &[f32],
) -> Result<Vec<(String, Tensor)>, PassError> {
    weighted_gradients(g, tower_grads, weights, 1.0)
}

/// As [`average_gradients`], with weights summing to `share` instead of 1:
/// one process's part of the global mean (its towers' shares of the global
/// batch), which the cross-process all-reduce completes.
pub(crate) fn weighted_gradients(
    g: &mut Graph,
    tower_grads: &[Vec<(String, Tensor)>],
    weights: &[f32],
    share: f32,
) -> Result<Vec<(String, Tensor)>, PassError> {
    if tower_grads.is_empty() {
        return Err(PassError::Options("average_gradients needs the gradients of at least one tower".into()));
    }
    if weights.len() != tower_grads.len() {
        return Err(PassError::Options(format!(
            "average_gradients got {} weights for {} towers; give each tower's share of the batch",
            weights.len(),
            tower_grads.len()
        )));
    }
    let sum: f32 = weights.iter().sum();
    if weights.iter().any(|w| !(w.is_finite() && *w > 0.0)) || (sum - share).abs() > 1e-4 {
        return Err(PassError::Options(format!(
            "tower weights {weights:?} must be positive and sum to {share} (each tower's examples / the global batch); they sum to {sum}"
        )));
    }
    let mut sets = Vec::with_capacity(tower_grads.len());
    for (t, grads) in tower_grads.iter().enumerate() {
        let mut set = BTreeSet::new();
        for (v, _) in grads {
            if !set.insert(v.as_str()) {
                return Err(PassError::TowerGradientMismatch {
                    detail: format!("tower {t} lists variable '{v}' twice"),
                });
            }
        }
        sets.push(set);
    }
    let mut problems = Vec::new();
    for (t, set) in sets.iter().enumerate().skip(1) {
        let lacks: Vec<&str> = sets[0].difference(set).copied().collect();
        let adds: Vec<&str> = set.difference(&sets[0]).copied().collect();
        if !lacks.is_empty() {
            problems.push(format!("tower {t} has no gradient for [{}], which tower 0 has", lacks.join(", ")));
        }
        if !adds.is_empty() {
            problems.push(format!("tower {t} has gradients for [{}], which tower 0 lacks", adds.join(", ")));
        }
    }
    if !problems.is_empty() {
        return Err(PassError::TowerGradientMismatch { detail: problems.join("; ") });
    }
    let mut out = Vec::with_capacity(tower_grads[0].len());
    for (v, _) in &tower_grads[0] {
        let inputs: Vec<Tensor> = tower_grads
            .iter()
            .map(|grads| grads.iter().find(|(w, _)| w == v).map(|(_, t)| *t))
            .collect::<Option<_>>()
            .ok_or_else(|| PassError::TowerGradientMismatch {
                detail: format!("variable '{v}' is missing in a tower"),
            })?;
        out.push((v.clone(), tower_mean(g, &format!("{v}/grad_mean"), inputs, weights)?));
    }
    Ok(out)
}

/// Make one moving-average update per variable out of hand-built towers'
/// updates (see the module docs): the `AssignMovingAvg` nodes of
/// `UPDATE_OPS` that update the same variable are merged into the first
/// one (in collection order, i.e. tower 0's); with [`BnUpdates::Mean`] it
/// reads a `TowerMean` of every tower's statistic (in tower order, equal
/// weights), with [`BnUpdates::Tower0`] tower 0's alone. The other updates
/// are removed from the graph (and so from the train op's dependencies).
/// Returns how many updates were removed. A graph with one update per
/// variable is left as it is.
pub fn merge_tower_updates(g: &mut Graph, bn: BnUpdates) -> Result<usize, PassError> {
    let mut by_var: BTreeMap<String, Vec<towers_graph::NodeId>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for name in g.collection(keys::UPDATE_OPS).to_vec() {
        let id = g.find(&name)?;
        if !matches!(g.node(id).op, Op::AssignMovingAverage { .. }) {
            continue;
        }
        let var = g.node(g.inputs(id)[0].node).name.clone();
        if !by_var.contains_key(&var) {
            order.push(var.clone());
        }
        by_var.entry(var).or_default().push(id);
    }
    let mut removed = 0;
    for var in order {
        let ups = &by_var[&var];
        if ups.len() < 2 {
            continue;
        }
        if bn == BnUpdates::Mean {
            let stats: Vec<Tensor> = ups.iter().map(|&u| g.inputs(u)[1]).collect();
            let first = stats[0];
            let base = format!("{}/tower_mean", g.node(first.node).name);
            let base = if first.slot == 0 { base } else { format!("{base}_{}", first.slot) };
            let w = F32(1.0 / ups.len() as f32);
            let mean = tower_mean(g, &base, stats, &vec![w.0; ups.len()])?;
            g.set_input(ups[0], 1, mean)?;
        }
        for &u in &ups[1..] {
            g.remove(u);
            removed += 1;
        }
    }
    Ok(removed)
}

/// The GPUs a hand-built graph's nodes ask for (`/gpu:i` device scopes),
/// sorted: the towers' devices.
pub fn requested_gpus(g: &Graph) -> Vec<towers_graph::Device> {
    let set: BTreeSet<towers_graph::Device> = g
        .node_ids()
        .into_iter()
        .filter_map(|id| g.node(id).requested_device.concrete())
        .filter(|d| d.kind == towers_graph::DeviceKind::Gpu)
        .collect();
    set.into_iter().collect()
}
