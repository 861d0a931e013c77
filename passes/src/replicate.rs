//! `replicate`: one copy of the forward and backward subgraph per tower (and,
//! with gradient accumulation, per micro-batch of each tower).
//!
//! The tower subgraph is every ancestor (over data and control edges) of the
//! loss and of every gradient in `st.grads`, except variables, placeholders
//! and nodes that write state (`ApplyGradient`, `AssignMovingAverage`,
//! `IncrementStep`). Invariants after this pass:
//! - replica `r` of tower `i`, micro-batch `j` (`r = i*k + j`) holds a copy
//!   of every tower-subgraph node named `<prefix><original name>`, where the
//!   prefix is `tower_i/` (k = 1) or `tower_i/micro_j/` (k > 1), with
//!   `tower = Some(i)` and requested device = tower `i`'s device;
//! - variables are never copied: every replica reads the one variable node
//!   (TF's reused variables); placeholders are shared too, `split` slices them;
//! - the original tower subgraph is removed;
//! - micro-batches of one tower run in sequence: each root of micro-batch
//!   `j+1` has control edges from micro-batch `j`'s loss and gradients;
//! - update ops (collection `update_ops`) are not replicated; their inputs
//!   from the tower subgraph are rewired by [`BnUpdates`]: `Tower0` reads
//!   replica 0 (TF's choice), `Mean` reads one `TowerMean` over the replicas
//!   named `<tensor>/tower_mean` (its weights are set to the replicas' batch
//!   shares by `split`);
//! - any other node outside the subgraph that read a tower node now reads
//!   replica 0's copy, reported as a diagnostic; control edges from the
//!   subgraph to outside nodes come from every replica;
//! - `st.tower_losses`/`st.tower_grads` are per replica, `st.towers` the
//!   tower devices, `st.replicas` the replicas, `st.loss` replica 0's loss
//!   and `st.grads` is emptied (`grad_mean` fills it with the combined ones),
//!   so no later pass can silently apply one replica's gradient.
//!
//! Dropout's `first_row` is set by `split`, the pass that knows each
//! replica's rows.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use towers_graph::{keys, Device, Graph, NewNode, NodeId, Op, Tensor, F32};

use crate::manager::Pass;
use crate::options::BnUpdates;
use crate::state::{CompileState, PassError, Replica, TensorRef};

/// Replicate the model per tower (see the module docs).
#[derive(Debug, Clone)]
pub struct Replicate {
    /// One device per tower, distinct.
    pub towers: Vec<Device>,
    /// Micro-batches per tower (k >= 1); k > 1 is gradient accumulation.
    pub accumulate: usize,
    /// Whose batch statistics update the moving averages.
    pub bn_updates: BnUpdates,
}

impl Replicate {
    /// One micro-batch per tower, batch-norm statistics averaged.
    pub fn new(towers: Vec<Device>) -> Replicate {
        Replicate { towers, accumulate: 1, bn_updates: BnUpdates::default() }
    }
}

fn is_writer(op: &Op) -> bool {
    !op.mutated_inputs().is_empty()
}

/// The tower subgraph: ancestors of `seeds`, minus variables, placeholders and writers.
fn tower_set(g: &Graph, seeds: &[NodeId]) -> BTreeSet<NodeId> {
    let mut set = BTreeSet::new();
    let mut stack: Vec<NodeId> = seeds.to_vec();
    while let Some(n) = stack.pop() {
        let op = &g.node(n).op;
        if matches!(op, Op::Variable { .. } | Op::Placeholder { .. }) || is_writer(op) || !set.insert(n) {
            continue;
        }
        stack.extend(g.inputs(n).iter().map(|t| t.node));
        stack.extend(g.control_inputs(n));
    }
    set
}

pub(crate) fn check_devices(towers: &[Device]) -> Result<(), PassError> {
    if towers.is_empty() {
        return Err(PassError::Options(
            "replicate needs at least one tower device (e.g. [gpu:0, gpu:1]); for one device, leave out replicate, split and grad_mean"
                .into(),
        ));
    }
    let mut seen = BTreeSet::new();
    let dups: Vec<String> = towers.iter().filter(|d| !seen.insert(**d)).map(|d| d.to_string()).collect();
    if !dups.is_empty() {
        let all: Vec<String> = towers.iter().map(|d| d.to_string()).collect();
        return Err(PassError::Options(format!(
            "duplicate tower devices [{}] in [{}]: each tower needs its own device; use accumulate for several micro-batches on one device",
            dups.join(", "),
            all.join(", ")
        )));
    }
    Ok(())
}

impl Pass for Replicate {
    fn name(&self) -> &'static str {
        "replicate"
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        check_devices(&self.towers)?;
        if self.accumulate == 0 {
            return Err(PassError::Options("accumulate must be at least 1 micro-batch per tower".into()));
        }
        let missing = |what: &str| PassError::MissingState {
            pass: "replicate".into(),
            what: what.into(),
            after: "autodiff".into(),
        };
        let loss_ref = st.loss.clone().ok_or_else(|| missing("the loss (st.loss)"))?;
        let loss = loss_ref.resolve(g)?;
        let grads: Vec<(String, Tensor)> =
            st.grads.iter().map(|(v, t)| Ok((v.clone(), t.resolve(g)?))).collect::<Result<_, PassError>>()?;
        let mut seeds = vec![loss.node];
        seeds.extend(grads.iter().map(|(_, t)| t.node));
        // The extra fetches (a training accuracy) are computed per replica too.
        for f in g.program().fetches.values() {
            seeds.push(f.resolve(g)?.node);
        }
        let set = tower_set(g, &seeds);
        let order: Vec<NodeId> = g.topo_order()?.into_iter().filter(|n| set.contains(n)).collect();
        let replicas = self.towers.len() * self.accumulate;
        if replicas > 1 || st.global_batch.is_some() {
            let kinds = crate::loss_kind::kinds(g, &st.batch_inputs)?;
            for &n in &order {
                if let Some(why) = crate::loss_kind::cross_row_read(g, n, &kinds) {
                    let node = g.node(n);
                    return Err(PassError::Options(format!(
                        "node '{}' ({}) reads across the examples of the batch: {why}; split over {replicas} replica(s) (towers x micro-batches) and the processes, each holds only its own rows of the batch, so it cannot compute what one device computes on the whole batch. Compute it per example (on an axis other than 0), or compile without towers, accumulation and processes",
                        node.name,
                        node.op.type_name()
                    )));
                }
            }
        }

        // Batch norm in training normalizes by the batch's statistics: each
        // replica's own rows (TF1's towers did the same), so unlike the rest of
        // the step it is not the update one device computes on the whole
        // batch. Allowed, and said.
        if replicas > 1 || st.global_batch.is_some() {
            let bn: Vec<&str> = order
                .iter()
                .filter(|&&n| matches!(g.node(n).op, Op::BatchNorm { .. }))
                .map(|&n| g.node(n).name.as_str())
                .collect();
            if let Some(first) = bn.first() {
                let more = if bn.len() > 1 { format!(" and {} more", bn.len() - 1) } else { String::new() };
                let msg = format!(
                    "batch norm '{first}'{more} normalizes each replica's rows by that replica's own batch statistics, as TF1's towers did: with {replicas} replica(s) (towers x micro-batches, per process) the step is not the one device computes on the whole batch; for that, compile without towers, accumulation and processes"
                );
                st.warn("replicate", msg);
            }
        }

        // Edges leaving the subgraph, recorded before any copy exists.
        let mut out_data: Vec<(NodeId, usize, Tensor)> = Vec::new();
        let mut out_ctrl: Vec<(NodeId, NodeId)> = Vec::new();
        for &n in &order {
            for (c, dst, src) in g.consumers(n) {
                if !set.contains(&c) {
                    out_data.push((c, dst, Tensor::new(n, src)));
                }
            }
            for c in g.control_consumers(n) {
                if !set.contains(&c) {
                    out_ctrl.push((n, c));
                }
            }
        }

        let k = self.accumulate;
        let mut replicas = Vec::new();
        let mut maps: Vec<HashMap<NodeId, NodeId>> = Vec::new();
        for (i, dev) in self.towers.iter().enumerate() {
            for j in 0..k {
                let prefix = if k == 1 { format!("tower_{i}/") } else { format!("tower_{i}/micro_{j}/") };
                let mut map: HashMap<NodeId, NodeId> = HashMap::new();
                for &n in &order {
                    let node = g.node(n);
                    let m = |t: &Tensor| Tensor::new(*map.get(&t.node).unwrap_or(&t.node), t.slot);
                    let inputs = g.inputs(n).iter().map(m).collect();
                    let control_inputs = g.control_inputs(n).iter().map(|c| *map.get(c).unwrap_or(c)).collect();
                    let scope = if node.scope.is_empty() {
                        prefix.trim_end_matches('/').to_string()
                    } else {
                        format!("{prefix}{}", node.scope)
                    };
                    let id = g.add(NewNode {
                        name: format!("{prefix}{}", node.name),
                        op: node.op.clone(),
                        inputs,
                        control_inputs,
                        scope,
                        requested_device: dev.spec(),
                    })?;
                    g.node_mut(id).tower = Some(i);
                    map.insert(n, id);
                }
                // Micro-batch j runs after micro-batch j-1 of the same tower.
                if j > 0 {
                    let prev = &maps[maps.len() - 1];
                    let sinks: BTreeSet<NodeId> = seeds.iter().filter_map(|s| prev.get(s).copied()).collect();
                    for &n in &order {
                        let has_set_input = g.inputs(n).iter().any(|t| set.contains(&t.node))
                            || g.control_inputs(n).iter().any(|c| set.contains(c));
                        if !has_set_input {
                            for &s in &sinks {
                                g.add_control(s, map[&n])?;
                            }
                        }
                    }
                }
                replicas.push(Replica { tower: i, micro: j, prefix });
                maps.push(map);
            }
        }

        let mapped = |map: &HashMap<NodeId, NodeId>, t: Tensor| Tensor::new(map[&t.node], t.slot);
        st.tower_losses = maps.iter().map(|m| TensorRef::of(g, mapped(m, loss))).collect();
        st.tower_grads = maps
            .iter()
            .map(|m| {
                grads.iter().map(|(v, t)| (v.clone(), TensorRef::of(g, mapped(m, *t)))).collect::<BTreeMap<_, _>>()
            })
            .collect();

        // Rewire the readers outside the subgraph.
        let update_ops: BTreeSet<String> = g.collection(keys::UPDATE_OPS).iter().cloned().collect();
        let mut means: BTreeMap<Tensor, Tensor> = BTreeMap::new();
        let r = maps.len();
        for (c, dst, t) in out_data {
            let cname = g.node(c).name.clone();
            let is_float = g.tensor_type(t)?.dtype.is_float();
            let src = if update_ops.contains(&cname) && self.bn_updates == BnUpdates::Mean && is_float {
                if let Some(m) = means.get(&t) {
                    *m
                } else {
                    let base = format!("{}/tower_mean", g.node(t.node).name);
                    let name = g.unique_name(&if t.slot == 0 { base } else { format!("{base}_{}", t.slot) });
                    let w = F32(1.0 / r as f32);
                    let id = g.add(NewNode::new(
                        name,
                        Op::TowerMean { weights: vec![w; r] },
                        maps.iter().map(|m| mapped(m, t)).collect(),
                    ))?;
                    means.insert(t, Tensor::new(id, 0));
                    Tensor::new(id, 0)
                }
            } else {
                if !update_ops.contains(&cname) {
                    st.warn(
                        "replicate",
                        format!(
                            "'{cname}' is outside the towers but reads '{}'; it now reads tower 0's copy",
                            g.node(t.node).name
                        ),
                    );
                }
                mapped(&maps[0], t)
            };
            g.set_input(c, dst, src)?;
        }
        for (n, c) in out_ctrl {
            for m in &maps {
                g.add_control(m[&n], c)?;
            }
        }

        // A fetch computed in the replicas: for a scalar float, their
        // share-weighted mean (the weights are set by `split`, as the
        // loss's; `grad_mean` adds them up for a sum over the batch); for
        // per-row values (a final RNN state, predictions), the replicas'
        // rows concatenated in batch order: one device's tensor.
        let kinds = crate::loss_kind::kinds(g, &st.batch_inputs)?;
        let mut fetches = std::mem::take(&mut g.program_mut().fetches);
        for (user, f) in fetches.iter_mut() {
            if let Some(id) = g.get(&f.node) {
                if set.contains(&id) {
                    let t = Tensor::new(id, f.slot);
                    let ty = g.tensor_type(t)?.clone();
                    let rows =
                        ty.shape.rank() > 0 && f.slot == 0 && kinds.get(&id) == Some(&crate::loss_kind::Kind::Rows);
                    // Any dtype: the layout kernels move 4-byte elements as bits.
                    if rows {
                        let name = g.unique_name(&format!("{}/tower_concat", f.node));
                        let concat = g.add(NewNode::new(
                            name,
                            Op::Concat { axis: 0 },
                            maps.iter().map(|m| mapped(m, t)).collect(),
                        ))?;
                        *f = TensorRef::of(g, Tensor::new(concat, 0));
                        continue;
                    }
                    if ty.shape.rank() != 0 || !ty.dtype.is_float() {
                        let how = "only scalar float fetches (combined like the loss) and tensors whose axis 0 is the batch's rows (concatenated in batch order) are gathered across towers: reduce it, or fetch it from an evaluation program";
                        return Err(PassError::Options(format!(
                            "fetch '{user}' ('{}') is computed in every tower ({ty} on one device); {how}",
                            f.node
                        )));
                    }
                    let name = g.unique_name(&format!("{}/tower_mean", f.node));
                    let w = F32(1.0 / r as f32);
                    let mean = g.add(NewNode::new(
                        name,
                        Op::TowerMean { weights: vec![w; r] },
                        maps.iter().map(|m| mapped(m, t)).collect(),
                    ))?;
                    *f = TensorRef::of(g, Tensor::new(mean, 0));
                }
            }
        }
        g.program_mut().fetches = fetches;
        for &n in order.iter().rev() {
            g.remove(n);
        }
        st.loss = st.tower_losses.first().cloned();
        st.grads.clear();
        st.towers = self.towers.clone();
        st.replicas = replicas;
        Ok(())
    }
}
