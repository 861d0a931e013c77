//! `all_reduce`: sum the processes' partial reductions, bucket by bucket.
//!
//! Runs only with several processes (world size above 1), after `place`
//! and before `schedule`. Before it, every `TowerMean` (each gradient's, the
//! loss's, and the batch-norm statistics' means) is this process's partial
//! sum: its replicas weighted by their shares of the *global* batch (see
//! `split`), so the sum over all processes is exactly the single-device mean,
//! also for uneven shares.
//!
//! Invariants after this pass:
//! - every `TowerMean` is a member of exactly one bucket and feeds exactly
//!   one `AllReduce` node (its bucket's); every former reader of the mean
//!   (data and control consumers, the program record's fetches, `st.grads`,
//!   `st.loss`) reads the all-reduce's output instead;
//! - a bucket holds means of one device, in the order the backward pass
//!   finishes them (the topological position of a mean's latest input's
//!   producer, looking through copies; ties by name: the last layer's
//!   gradients first, as DDP's reverse order),
//!   filled greedily up to `bucket_bytes`; a mean larger than that gets a
//!   bucket of its own;
//! - buckets are numbered in the order they become ready (their last
//!   member's position), across devices; bucket `i` is the node
//!   `all_reduce/bucket_<i>` on its members' device, and has a control input
//!   from bucket `i - 1`, so every rank issues its collectives in bucket order
//!   even when buckets live on several devices' streams (the `Comm`
//!   contract: same collectives, same order, on every rank);
//! - `st.buckets` lists the buckets in that order.
//!
//! **Scale folded past the sum.** When every replica of every rank has the
//! same share of the global batch (`uniform`) and a mean has a single
//! replica (one tower, no accumulation), `mean = w * g` with the same `w` on
//! every rank, so `sum_r w * g_r = w * sum_r g_r`: the bucket then holds the
//! replica's gradient `g` itself, on the tower's device (the producer writes
//! its bucket view, no scaling pass before the collective), and the mean
//! stays where it was, after the all-reduce (and after the copy to the
//! variables' device, if any), where lowering fuses it into the apply as
//! one `MeanApply` with weight `w`. Every reader of the mean is unchanged.
//! The result differs from scaling first only by float reassociation (not
//! at all for `w` a power of two). A gradient that feeds anything but its
//! mean (through copies) is not folded.
//!
//! The result depends only on the graph and the options, never on the rank,
//! so every rank builds the same buckets. `schedule` runs each all-reduce on
//! its device's collective stream right after its last member is written
//! (collective nodes are hoisted), so it overlaps the rest of the backward
//! pass.
//!
//! **Reduce to the owner** (`to_owners`, `--variables ps`: the program
//! records parameter-server owners). A mean read only by the update of a
//! variable that rank `k` owns (task `k' % world`), through copies, and
//! neither fetched nor a control input, has root `k`; any other mean (a
//! batch-norm statistic, a clipped or fetched gradient) has none. Buckets
//! never mix roots (per device and root, filled in ready order, then
//! sorted by readiness), and a bucket with root `k` is `AllReduce { root:
//! Some(k) }`: the plan's `Step::Reduce`, whose sums reach rank `k` alone
//! (in rank order, bit-identical to the all-reduce's), so a rank receives
//! only the gradients it applies. `ps_exchange`, right after this pass,
//! keeps each variable's update on its owner only, so no other rank reads
//! a reduced bucket.
//!
//! With several processes, batch-norm moving averages must combine every
//! rank's statistics (`BnUpdates::Mean`); a moving average fed by anything
//! but a mean (`BnUpdates::Tower0`) would drift apart across ranks, and is an
//! error.

use std::collections::BTreeMap;

use towers_graph::{Device, Graph, NewNode, NodeId, Op, Tensor};

use crate::manager::Pass;
use crate::options::ProcessGroup;
use crate::state::{Bucket, CompileState, PassError, TensorRef};

/// Insert the bucketed cross-process all-reduces (see the module docs).
#[derive(Debug, Clone)]
pub struct AllReduceBuckets {
    pub group: ProcessGroup,
    /// Bucket capacity in bytes.
    pub bucket_bytes: usize,
    /// Every replica of every rank has the same share of the global batch
    /// (the scale fold of the module docs applies).
    pub uniform: bool,
    /// `--variables ps`: a gradient read only by the update of a variable
    /// owned by rank `k` is reduced to rank `k` alone (see the module docs).
    pub to_owners: bool,
}

/// A tensor to reduce: its node (a mean, or the single replica's gradient
/// of a folded mean, output `slot`), device, size and when the backward
/// pass finishes it.
#[derive(Debug, Clone)]
struct Member {
    id: NodeId,
    slot: usize,
    /// A folded mean's gradient (its readers keep their names).
    folded: bool,
    name: String,
    device: Device,
    bytes: usize,
    ready: usize,
    /// The rank its sum goes to (`None`: every rank).
    root: Option<usize>,
}

/// Pack the means into buckets (see the module docs): per device and root
/// in ready order, greedily up to `cap` bytes; buckets then sorted by
/// readiness.
fn pack(mut members: Vec<Member>, cap: usize) -> Vec<Vec<Member>> {
    members.sort_by(|a, b| (a.device, a.root, a.ready, &a.name).cmp(&(b.device, b.root, b.ready, &b.name)));
    let mut buckets: Vec<Vec<Member>> = Vec::new();
    let mut bytes = 0;
    for m in members {
        match buckets.last_mut() {
            Some(b) if b[0].device == m.device && b[0].root == m.root && bytes + m.bytes <= cap => {
                bytes += m.bytes;
                b.push(m);
            }
            _ => {
                bytes = m.bytes;
                buckets.push(vec![m]);
            }
        }
    }
    let ready = |b: &Vec<Member>| b.iter().map(|m| m.ready).max().unwrap_or(0);
    buckets.sort_by_key(|b| (ready(b), b[0].device, b[0].root));
    buckets
}

/// The rank a mean's sum must reach under `--variables ps`: `Some(k)` when
/// every reader of the mean (through copies and identities) is the update
/// of a variable owned by rank `k` (as its gradient input), and the mean is
/// neither fetched nor a control input; `None` (every rank needs it: a
/// batch-norm statistic, a clipped or fetched gradient) otherwise.
fn owner_rank(g: &Graph, mean: NodeId, fetched: &[NodeId], group: ProcessGroup) -> Option<usize> {
    let ps = g.program().ps.as_ref()?;
    let mut root = None;
    let mut todo = vec![mean];
    while let Some(id) = todo.pop() {
        if fetched.contains(&id) || !g.control_consumers(id).is_empty() {
            return None;
        }
        let consumers = g.consumers(id);
        if consumers.is_empty() {
            return None;
        }
        for (c, dst, _) in consumers {
            match &g.node(c).op {
                Op::Copy | Op::Identity => todo.push(c),
                Op::ApplyGradient { optimizer } if dst == 1 + optimizer.slot_names().len() => {
                    let var = g.inputs(c).first().map(|t| g.node(t.node).name.clone())?;
                    let rank = crate::ps_exchange::task_rank(ps.owner(&var)?, group.world, group.ps_ranks);
                    if root.is_some_and(|r| r != rank) {
                        return None;
                    }
                    root = Some(rank);
                }
                _ => return None,
            }
        }
    }
    root
}

/// The node that computed `id`'s value, looking through copies between
/// devices (a gradient copied to the reduction's device is ready when its
/// producer ran, whatever order the copies were created in).
fn producer(g: &Graph, mut id: NodeId) -> NodeId {
    while matches!(g.node(id).op, Op::Copy) {
        match g.inputs(id).first() {
            Some(t) => id = t.node,
            None => break,
        }
    }
    id
}

/// For a mean of one replica (`g` through copies and identities), the
/// gradient `g` when it feeds nothing but this mean: each node of the chain
/// from `g` to the mean has one data consumer, no control consumer and no
/// fetch.
fn single_replica_gradient(g: &Graph, mean: NodeId, fetched: &[NodeId]) -> Option<Tensor> {
    let inputs = g.inputs(mean);
    let [mut t] = inputs[..] else { return None };
    loop {
        let n = g.node(t.node);
        let sole = g.consumers(t.node).len() == 1 && g.control_consumers(t.node).is_empty();
        if !sole || fetched.contains(&t.node) || n.outputs.len() != 1 {
            return None;
        }
        match n.op {
            Op::Copy | Op::Identity => t = *g.inputs(t.node).first()?,
            _ => return Some(t),
        }
    }
}

impl Pass for AllReduceBuckets {
    fn name(&self) -> &'static str {
        "all_reduce"
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        if self.group.ps_ranks > 0 && !self.to_owners {
            return Err(PassError::Options(format!(
                "ProcessGroup::ps_ranks = {} needs CompileOptions::variables = VarPlacement::Ps: parameter-server ranks hold sharded variables, and the all-reduce layout has none (set VarPlacement::Ps, or build the group without with_ps_ranks; CLI: --variables ps, or drop --ps-ranks)",
                self.group.ps_ranks
            )));
        }
        if self.bucket_bytes == 0 {
            return Err(PassError::Options("the gradient bucket size must be at least 1 byte".into()));
        }
        let order = g.topo_order()?;
        // A device of another process cannot run here (each rank builds and
        // compiles its own graph, as TF1's between-graph replication).
        for &id in &order {
            let n = g.node(id);
            let spec = &n.requested_device;
            let job_ok = spec.job.as_deref().is_none_or(|j| j == "worker" || j == "localhost");
            if !job_ok || spec.task.is_some_and(|t| t as usize != self.group.rank) {
                return Err(PassError::Options(format!(
                    "'{}' (scope '{}') requests device '{}', which is not a device of this process ({}, rank {} of {}): leave the job and task out of the device string (each rank places its own towers), or use /job:worker/task:{}",
                    n.name,
                    n.scope,
                    spec,
                    self.group.task(),
                    self.group.rank,
                    self.group.world,
                    self.group.rank
                )));
            }
        }
        let pos: BTreeMap<NodeId, usize> = order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        for &id in &order {
            let n = g.node(id);
            if let Op::AssignMovingAverage { .. } = n.op {
                let fed_by_mean =
                    g.inputs(id).get(1).is_some_and(|t| matches!(g.node(t.node).op, Op::TowerMean { .. }));
                if !fed_by_mean {
                    return Err(PassError::Options(format!(
                        "'{}' (scope '{}') updates a moving average from one tower's statistics, but with {} processes each rank would drift apart; use BnUpdates::Mean (--bn-updates mean) so every rank's statistics are combined",
                        n.name, n.scope, self.group.world
                    )));
                }
            }
        }
        let fetched: Vec<NodeId> = g.program().fetches.values().filter_map(|t| g.find(&t.node).ok()).collect();
        let mut members = Vec::new();
        for &id in &order {
            let n = g.node(id);
            if !matches!(n.op, Op::TowerMean { .. }) {
                continue;
            }
            let folded = if self.uniform { single_replica_gradient(g, id, &fetched) } else { None };
            let (m, slot) = folded.map_or((id, 0), |t| (t.node, t.slot));
            let n = g.node(m);
            let device = n.device.ok_or_else(|| PassError::MissingState {
                pass: "all_reduce".into(),
                what: format!("a device for '{}'", n.name),
                after: "place".into(),
            })?;
            let bytes = n.outputs[slot].byte_size().unwrap_or(0);
            let ready = g.inputs(id).iter().map(|t| pos[&producer(g, t.node)]).max().unwrap_or(0);
            let root = if self.to_owners { owner_rank(g, id, &fetched, self.group) } else { None };
            members.push(Member {
                id: m,
                slot,
                folded: folded.is_some(),
                name: n.name.clone(),
                device,
                bytes,
                ready,
                root,
            });
        }
        if members.is_empty() {
            return Err(PassError::MissingState {
                pass: "all_reduce".into(),
                what: "the towers' means to reduce across processes".into(),
                after: "grad_mean".into(),
            });
        }
        let mut renamed: BTreeMap<String, TensorRef> = BTreeMap::new();
        let mut previous: Option<NodeId> = None;
        st.buckets.clear();
        for (i, bucket) in pack(members, self.bucket_bytes).into_iter().enumerate() {
            let inputs: Vec<Tensor> = bucket.iter().map(|m| Tensor::new(m.id, m.slot)).collect();
            // Readers of the members, taken before the all-reduce becomes one.
            let readers: Vec<Vec<(NodeId, usize)>> = bucket
                .iter()
                .map(|m| g.consumers(m.id).into_iter().filter(|c| c.2 == m.slot).map(|(c, dst, _)| (c, dst)).collect())
                .collect();
            let controls: Vec<Vec<NodeId>> =
                bucket.iter().map(|m| if m.folded { Vec::new() } else { g.control_consumers(m.id) }).collect();
            let root = bucket[0].root;
            let name = g.unique_name(&format!("all_reduce/bucket_{i}"));
            let mut new = NewNode::new(name.clone(), Op::AllReduce { bucket: i, root }, inputs);
            new.control_inputs.extend(previous);
            let ar = g.add(new)?;
            g.node_mut(ar).device = Some(bucket[0].device);
            for (slot, m) in bucket.iter().enumerate() {
                for &(c, dst) in &readers[slot] {
                    g.set_input(c, dst, Tensor::new(ar, slot))?;
                }
                for &c in &controls[slot] {
                    g.add_control(ar, c)?;
                }
                if !m.folded {
                    renamed.insert(m.name.clone(), TensorRef { node: name.clone(), slot });
                }
            }
            st.buckets.push(Bucket {
                node: name,
                device: bucket[0].device,
                members: bucket.iter().map(|m| m.name.clone()).collect(),
                bytes: bucket.iter().map(|m| m.bytes).sum(),
                root,
            });
            previous = Some(ar);
        }
        let rename = |t: &TensorRef| renamed.get(&t.node).filter(|_| t.slot == 0).cloned();
        let fetches = &mut g.program_mut().fetches;
        for t in fetches.values_mut() {
            if let Some(r) = rename(t) {
                *t = r;
            }
        }
        for t in st.grads.values_mut() {
            if let Some(r) = rename(t) {
                *t = r;
            }
        }
        if let Some(r) = st.loss.as_ref().and_then(rename) {
            st.loss = Some(r);
        }
        g.program_mut().task = Some(self.group.rank);
        g.reinfer()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, device: Device, bytes: usize, ready: usize) -> Member {
        Member { id: NodeId::new(0), slot: 0, folded: false, name: name.into(), device, bytes, ready, root: None }
    }

    fn names(b: &[Vec<Member>]) -> Vec<Vec<&str>> {
        b.iter().map(|b| b.iter().map(|m| m.name.as_str()).collect()).collect()
    }

    #[test]
    fn buckets_fill_in_ready_order_up_to_the_cap() {
        let c = Device::CPU0;
        let b = pack(vec![m("w1", c, 400, 9), m("b1", c, 100, 8), m("w2", c, 300, 5), m("b2", c, 50, 4)], 400);
        // Ready order: b2 (4), w2 (5), b1 (8), w1 (9). b2+w2 = 350 fits; +b1 = 450 does not.
        assert_eq!(names(&b), [vec!["b2", "w2"], vec!["b1"], vec!["w1"]]);
    }

    #[test]
    fn a_tensor_larger_than_the_cap_gets_a_bucket_of_its_own() {
        let c = Device::CPU0;
        let b = pack(vec![m("big", c, 1000, 2), m("a", c, 10, 1), m("z", c, 10, 3)], 100);
        assert_eq!(names(&b), [vec!["a"], vec!["big"], vec!["z"]]);
    }

    #[test]
    fn buckets_never_mix_devices_and_start_in_order_of_readiness() {
        let (c, g0) = (Device::CPU0, Device::gpu(0));
        let b = pack(vec![m("x", g0, 4, 1), m("y", c, 4, 2), m("z", g0, 4, 3)], 1 << 20);
        // [y] is ready at 2, [x, z] at 3.
        assert_eq!(names(&b), [vec!["y"], vec!["x", "z"]]);
    }
}
