//! `grad_mean`: combine the replicas' gradients and losses.
//!
//! Invariants after this pass:
//! - per variable with a gradient in the replicas, exactly one n-ary
//!   `TowerMean` node named `<var>/grad_mean` whose inputs are the replicas'
//!   gradients in replica order and whose weights are `st.tower_weights`
//!   (each replica's share of the batch, summing to 1) for a loss that is a
//!   mean over the batch, so N towers compute exactly the single-device
//!   gradient, also for uneven splits (a plain mean of per-tower means would
//!   weight a small tower's examples more: the DataParallel pitfall); for a
//!   loss that is a sum over the batch (`reduce_sum`, `l2_loss`) every
//!   weight is 1, the sum of the replicas' sums (see [`crate::loss_kind`]);
//!   for any other loss the shares, with a diagnostic saying that N towers
//!   cannot equal one device;
//! - `st.grads[var]` is that node's output; the loss likewise is one
//!   `TowerMean` named `loss/tower_mean`, stored in `st.loss` and the
//!   program record's `fetches["loss"]`;
//! - variables of `st.var_list` with no gradient in any replica are listed in
//!   one diagnostic and get no mean (and so no update); replicas with
//!   different variable sets are an error (see [`crate::manual`]).

use towers_graph::Graph;

use std::collections::BTreeMap;

use towers_graph::{NodeId, Op, F32};

use crate::loss_kind::{kinds, Kind};
use crate::manager::Pass;
use crate::manual::{tower_mean, weighted_gradients};
use crate::state::{CompileState, PassError, TensorRef};

/// Combine the replicas' gradients (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct GradMean;

impl Pass for GradMean {
    fn name(&self) -> &'static str {
        "grad_mean"
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        let r = st.tower_losses.len();
        if r == 0 || st.tower_grads.len() != r {
            return Err(PassError::MissingState {
                pass: "grad_mean".into(),
                what: "per-tower losses and gradients".into(),
                after: "replicate".into(),
            });
        }
        if st.tower_weights.len() != r {
            return Err(PassError::MissingState {
                pass: "grad_mean".into(),
                what: "the towers' shares of the batch".into(),
                after: "split".into(),
            });
        }
        let tower0 = st.tower_losses[0].resolve(g)?;
        let kinds = kinds(g, &st.batch_inputs)?;
        let kind = kinds.get(&tower0.node).copied().unwrap_or(Kind::Opaque);
        weigh_fetches(g, st, &kinds)?;
        // With several processes the replicas' weights are shares of the
        // global batch: this process's part of the mean.
        let mut share = match (st.global_batch, st.batch_size) {
            (Some(global), Some(local)) => local as f32 / global as f32,
            _ => 1.0,
        };
        let mut weights: Vec<f32> = st.tower_weights.iter().map(|&w| w as f32).collect();
        match kind {
            Kind::Mean | Kind::Free => {}
            Kind::Sum => {
                weights = vec![1.0; r];
                share = r as f32;
            }
            // One replica (one tower, no micro-batches) is one device.
            Kind::Rows | Kind::Opaque if r == 1 => {}
            Kind::Rows | Kind::Opaque => {
                let loss = g.node(tower0.node).name.clone();
                st.warn(
                    "grad_mean",
                    format!(
                        "the loss ('{loss}' in replica 0) is neither a mean nor a sum over the batch's rows, so no weighting of the {r} replicas gives one device's update: their losses and gradients are averaged by their shares of the batch (TF1's average_gradients); for an exact update write the loss as reduce_mean (or reduce_sum) of per-example terms plus terms that do not depend on the batch (a regularizer goes with a mean)"
                    ),
                );
            }
        }
        // Variables in var_list order, then any others by name.
        let mut order: Vec<String> = st.var_list.clone();
        for tg in &st.tower_grads {
            for v in tg.keys() {
                if !order.contains(v) {
                    order.push(v.clone());
                }
            }
        }
        let mut per_replica = Vec::with_capacity(r);
        for tg in &st.tower_grads {
            let mut grads = Vec::new();
            for v in &order {
                if let Some(t) = tg.get(v) {
                    grads.push((v.clone(), t.resolve(g)?));
                }
            }
            per_replica.push(grads);
        }
        let none: Vec<&str> =
            order.iter().filter(|v| st.tower_grads.iter().all(|tg| !tg.contains_key(*v))).map(|v| v.as_str()).collect();
        if !none.is_empty() {
            let msg = format!("no gradient in any tower for [{}]: not averaged and not updated", none.join(", "));
            st.warn("grad_mean", msg);
        }
        let means = weighted_gradients(g, &per_replica, &weights, share)?;
        st.grads = means.into_iter().map(|(v, t)| (v, TensorRef::of(g, t))).collect();
        let losses = st.tower_losses.iter().map(|l| l.resolve(g)).collect::<Result<Vec<_>, _>>()?;
        let mean = tower_mean(g, "loss/tower_mean", losses, &weights)?;
        let loss = TensorRef::of(g, mean);
        g.program_mut().fetches.insert("loss".into(), loss.clone());
        st.loss = Some(loss);
        Ok(())
    }
}

/// Weigh the replicas' values of each extra fetch (`replicate`'s
/// `<node>/tower_mean`, which `split` weighted by the shares) as the loss's
/// are weighed: a sum over the batch (a count of correct examples, a summed
/// loss) is added up, a mean keeps the shares, anything else keeps them and
/// gets a diagnostic.
fn weigh_fetches(g: &mut Graph, st: &mut CompileState, kinds: &BTreeMap<NodeId, Kind>) -> Result<(), PassError> {
    let fetches: Vec<(String, String)> =
        g.program().fetches.iter().map(|(user, f)| (user.clone(), f.node.clone())).collect();
    for (user, node) in fetches {
        let Some(id) = g.get(&node) else { continue };
        if user == "loss" || !matches!(g.node(id).op, Op::TowerMean { .. }) || !node.ends_with("/tower_mean") {
            continue;
        }
        let Some(first) = g.inputs(id).first().copied() else { continue };
        match kinds.get(&first.node).copied().unwrap_or(Kind::Opaque) {
            Kind::Mean | Kind::Free => {}
            Kind::Sum => {
                if let Op::TowerMean { weights } = &mut g.node_mut(id).op {
                    weights.iter_mut().for_each(|w| *w = F32(1.0));
                }
            }
            Kind::Rows | Kind::Opaque if g.inputs(id).len() == 1 => {}
            Kind::Rows | Kind::Opaque => st.warn(
                "grad_mean",
                format!(
                    "fetch '{user}' is neither a mean nor a sum over the batch's rows, so the towers' values are averaged by their shares of the batch, which need not be its value on the whole batch; fetch a reduce_mean or reduce_sum of per-example values, or fetch it from an evaluation program"
                ),
            ),
        }
    }
    Ok(())
}
