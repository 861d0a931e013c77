//! `place`: give every node a device and a reason, then insert copies and
//! write-after-read edges.
//!
//! Rules, first match wins (reasons in quotes, as stored in `placement_reason`):
//! 1. a tower node runs on its tower's device ("tower 1");
//! 2. optimizer slots, `ApplyGradient`, `AssignMovingAverage`, `IncrementStep`
//!    and a variable's `TowerMean` (its gradient mean, or a batch-norm
//!    statistic mean) or `TowerMatMul` (its folded gradient mean) are colocated with their variable ("colocated with fc1/weights");
//! 3. an explicit device request on a non-tower node wins ("requested /device:CPU:0");
//! 4. variables by [`VarPlacement`] ("variables=cpu", "variables=gpu0",
//!    "variables=round_robin", "variables=greedy"), `global_step` excepted;
//!    with `VarPlacement::Ps` each variable gets an owner task
//!    `/job:ps/task:k` ([`crate::ps`]; "variables=ps round_robin:
//!    /job:ps/task:1") and lives on the host (`cpu:0`, or the single
//!    device); its slots get its owner. The owners are recorded in the
//!    program (`Program::ps`). A `/job:ps/...` request needs `--variables
//!    ps`, a variable, a task below `--ps-tasks`, and no GPU;
//! 5. the host (`cpu:0`) runs `global_step`, `train_op`, the loss mean, the
//!    placeholders and their `Split`s (the input pipeline is pinned to the host);
//! 6. any other node: the host when there are towers, else the first device.
//!
//! With no devices and no towers (single-device mode) every node goes to one
//! device: the one the nodes request if they all agree, else `cpu:0`.
//! A request for a device that does not exist is [`PassError::Placement`]
//! in TF's words. A kind without an index (`/device:GPU:*`) means the first
//! device of that kind.
//!
//! Then one `Copy` node per (source tensor, destination device) is put on
//! every data edge that crosses devices, named `<src>/read_<dev>` (slot 0)
//! or `<src>/read_<slot>_<dev>` (`fc1/weights/read_gpu_1`), placed on the
//! destination; no other copies exist.
//!
//! Write-after-read safety is enforced here (after the copies, which are
//! readers too): every node that writes a variable ([`Op::mutated_inputs`])
//! gets a control edge from every other reader of that variable that it
//! does not already follow, unless the reader depends on the writer (a read
//! of the new value). Readers through a `Copy`, `Identity`, `Reshape`,
//! `ExpandDims`, `Squeeze` or `StopGradient` of the variable count as readers
//! of the variable: a backend may alias those outputs to the variable's
//! memory (codegen aliases all but the copy; the CPU backend, whose devices share one memory, elides
//! copies), so the update must also wait for them. Two writers of one
//! variable are not ordered.

use std::collections::{BTreeMap, BTreeSet};

use towers_graph::{Device, DeviceKind, Graph, NewNode, NodeId, Op, Tensor};

use crate::manager::Pass;
use crate::options::VarPlacement;
use crate::ps::{assign_owners, PsCandidate};
use crate::state::{CompileState, PassError};
use towers_graph::{ps_task_name, PsSharding};

/// Place the graph (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct Place {
    pub strategy: VarPlacement,
    /// The tower devices (empty: the towers of `st.towers`, or single-device mode).
    pub devices: Vec<Device>,
}

struct Ctx {
    single: Option<Device>,
    available: BTreeSet<Device>,
}

impl Ctx {
    fn available_list(&self) -> String {
        let v: Vec<String> = self.available.iter().map(|d| d.spec().to_string()).collect();
        format!("[ {} ]", v.join(", "))
    }

    /// The concrete device a node asks for, if any; an error if it does not exist.
    fn request(&self, g: &Graph, id: NodeId) -> Result<Option<Device>, PassError> {
        let n = g.node(id);
        let spec = &n.requested_device;
        let Some(kind) = spec.kind else {
            return Ok(None);
        };
        if self.single.is_some() {
            return Ok(self.single);
        }
        let found = match spec.index {
            Some(index) => Some(Device { kind, index }).filter(|d| self.available.contains(d)),
            None => self.available.iter().copied().find(|d| d.kind == kind),
        };
        match found {
            Some(d) => Ok(Some(d)),
            None => Err(PassError::Placement {
                node: n.name.clone(),
                reason: format!(
                    "'{}' was explicitly assigned to {spec} but available devices are {}. Make sure the device specification refers to a valid device.",
                    n.name,
                    self.available_list()
                ),
            }),
        }
    }
}

fn var_bytes(g: &Graph, id: NodeId) -> usize {
    g.node(id).outputs.first().and_then(|t| t.byte_size()).unwrap_or(0)
}

impl Place {
    /// Devices of the non-slot variables by strategy, in creation order.
    fn place_variables(
        &self,
        g: &Graph,
        vars: &[NodeId],
        slot_bytes: &BTreeMap<String, usize>,
        devices: &[Device],
    ) -> BTreeMap<NodeId, (Device, String)> {
        let reason = format!("variables={}", self.strategy.name());
        let devs: Vec<Device> = if devices.is_empty() { vec![Device::CPU0] } else { devices.to_vec() };
        let mut out = BTreeMap::new();
        match self.strategy {
            VarPlacement::Cpu => vars.iter().for_each(|&v| {
                out.insert(v, (Device::CPU0, reason.clone()));
            }),
            VarPlacement::Gpu0 => vars.iter().for_each(|&v| {
                out.insert(v, (devs[0], reason.clone()));
            }),
            VarPlacement::RoundRobin => vars.iter().enumerate().for_each(|(i, &v)| {
                out.insert(v, (devs[i % devs.len()], reason.clone()));
            }),
            // The owners are chosen by `shard_ps`; the values live on the host.
            VarPlacement::Ps { .. } => vars.iter().for_each(|&v| {
                out.insert(v, (Device::CPU0, reason.clone()));
            }),
            VarPlacement::Greedy => {
                let size = |v: NodeId| var_bytes(g, v) + slot_bytes.get(&g.node(v).name).copied().unwrap_or(0);
                let mut sorted = vars.to_vec();
                sorted.sort_by(|&a, &b| size(b).cmp(&size(a)).then_with(|| g.node(a).name.cmp(&g.node(b).name)));
                let mut load = vec![0usize; devs.len()];
                for v in sorted {
                    let (i, _) = load.iter().enumerate().min_by_key(|(i, l)| (**l, *i)).unwrap_or((0, &0));
                    load[i] += size(v);
                    out.insert(v, (devs[i], reason.clone()));
                }
            }
        }
        out
    }
}

/// Check the `/job:ps` requests (see the module docs, rule 4).
/// Nodes colocated with a variable (its slots and writers, which inherit
/// its device scope) go where it goes and are not checked here.
fn check_ps_requests(
    g: &Graph,
    ids: &[NodeId],
    strategy: VarPlacement,
    colocate: &BTreeMap<NodeId, NodeId>,
) -> Result<(), PassError> {
    for &id in ids {
        let n = g.node(id);
        let spec = &n.requested_device;
        if !spec.is_ps() || colocate.contains_key(&id) {
            continue;
        }
        let VarPlacement::Ps { tasks, .. } = strategy else {
            return Err(PassError::Placement {
                node: n.name.clone(),
                reason: format!(
                    "'{}' was explicitly assigned to {spec} but available devices are [ /job:localhost/replica:0/task:0/device:CPU:0 ]. Make sure the device specification refers to a valid device (parameter-server tasks exist with --variables ps --ps-tasks K).",
                    n.name
                ),
            });
        };
        if !matches!(n.op, Op::Variable { .. }) {
            return Err(PassError::Placement {
                node: n.name.clone(),
                reason: format!(
                    "'{}' ({} in scope '{}') was explicitly assigned to {spec}, but a parameter-server task holds only variables (as replica_device_setter's ps_ops); leave /job:ps out of the device string of ops",
                    n.name,
                    n.op.type_name(),
                    n.scope
                ),
            });
        }
        if spec.kind == Some(DeviceKind::Gpu) {
            return Err(PassError::Placement {
                node: n.name.clone(),
                reason: format!(
                    "'{}' was explicitly assigned to {spec}, but a parameter-server task keeps its variables in host memory; use {} or leave the task out (one of {tasks} tasks is chosen)",
                    n.name,
                    ps_task_name(spec.task.unwrap_or(0)),
                ),
            });
        }
    }
    Ok(())
}

/// With `VarPlacement::Ps`: the owner task of every sharded variable and of
/// its slots, and each primary's placement reason.
fn shard_ps(
    g: &Graph,
    strategy: VarPlacement,
    vars: &[NodeId],
    colocate: &BTreeMap<NodeId, NodeId>,
) -> Result<Option<(PsSharding, BTreeMap<NodeId, String>)>, PassError> {
    let VarPlacement::Ps { tasks, strategy: ps } = strategy else {
        return Ok(None);
    };
    let cands: Vec<PsCandidate> = vars
        .iter()
        .map(|&v| PsCandidate {
            name: g.node(v).name.clone(),
            bytes: var_bytes(g, v),
            requested: g.node(v).requested_device.ps_task(),
        })
        .collect();
    let owners = assign_owners(&cands, tasks, ps)?;
    let mut sharding = PsSharding { tasks, owners: BTreeMap::new() };
    let mut reasons = BTreeMap::new();
    for (&v, &k) in vars.iter().zip(&owners) {
        sharding.owners.insert(g.node(v).name.clone(), k);
        let why = if g.node(v).requested_device.ps_task().is_some() { "requested" } else { ps.name() };
        reasons.insert(v, format!("variables=ps {why}: {}", ps_task_name(k)));
    }
    for (&node, &var) in colocate {
        if matches!(g.node(node).op, Op::Variable { .. }) {
            if let Some(k) = sharding.owner(&g.node(var).name) {
                sharding.owners.insert(g.node(node).name.clone(), k);
            }
        }
    }
    Ok(Some((sharding, reasons)))
}

impl Pass for Place {
    fn name(&self) -> &'static str {
        "place"
    }
    fn places(&self) -> bool {
        true
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        let devices = if self.devices.is_empty() { st.towers.clone() } else { self.devices.clone() };
        if !devices.is_empty() {
            crate::replicate::check_devices(&devices)?;
        }
        for t in &st.towers {
            if !devices.contains(t) {
                let all: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
                return Err(PassError::Options(format!(
                    "tower device {t} is not among the devices given to place [{}]",
                    all.join(", ")
                )));
            }
        }
        let ids = g.node_ids();
        let single = if devices.is_empty() {
            let asked: BTreeSet<Device> = ids.iter().filter_map(|&i| g.node(i).requested_device.concrete()).collect();
            if asked.len() > 1 {
                // Name the first node of each device asked for (in creation order).
                let mut by_seq = ids.clone();
                by_seq.sort_by_key(|&i| g.node(i).seq);
                let mut first: Vec<(Device, String)> = Vec::new();
                for &i in &by_seq {
                    if let Some(d) = g.node(i).requested_device.concrete() {
                        if !first.iter().any(|(f, _)| *f == d) {
                            first.push((d, g.node(i).name.clone()));
                        }
                    }
                }
                let said: Vec<String> = first.iter().map(|(d, n)| format!("'{n}' requests /{d}")).collect();
                let gpus: Vec<String> = first
                    .iter()
                    .filter(|(d, _)| *d != Device::CPU0)
                    .map(|(d, _)| format!("Device::{}", d.to_string().replace(':', "(") + ")"))
                    .collect();
                // The CLI's `--towers N` is /gpu:0 to /gpu:N-1: say it only when that is what was asked.
                let mut indices: Vec<u32> =
                    first.iter().filter(|(d, _)| *d != Device::CPU0).map(|(d, _)| d.index).collect();
                indices.sort_unstable();
                let cli = if indices.iter().enumerate().all(|(i, &d)| d as usize == i) {
                    format!("CLI: --towers {}", indices.len().max(1))
                } else {
                    "the CLI's --towers N runs /gpu:0 to /gpu:N-1, so name these devices through the API".to_string()
                };
                return Err(PassError::Placement {
                    node: first.get(1).map(|(_, n)| n.clone()).unwrap_or_default(),
                    reason: format!(
                        "{}, but the program is compiled for one device (no towers); to run on those devices set CompileOptions::towers = vec![{}] ({cli}), or remove the device scopes",
                        said.join(" and "),
                        gpus.join(", "),
                    ),
                });
            }
            let one = asked.into_iter().next().unwrap_or(Device::CPU0);
            if one.kind == Device::CPU0.kind && one != Device::CPU0 {
                let who = ids.iter().copied().find(|&i| g.node(i).requested_device.concrete() == Some(one));
                return Err(PassError::Placement {
                    node: who.map(|i| g.node(i).name.clone()).unwrap_or_default(),
                    reason: format!(
                        "device {one} was asked for, but a process has one host device, cpu:0: place what is on /{one} on /cpu:0, or on a tower device /gpu:N (CompileOptions::towers; the CPU backend runs /gpu:N as CPU devices of their own)"
                    ),
                });
            }
            Some(one)
        } else {
            None
        };
        let mut available: BTreeSet<Device> = devices.iter().copied().collect();
        available.insert(Device::CPU0);
        let ctx = Ctx { single, available };
        for &id in &ids {
            if g.node(id).tower.is_none() && !g.node(id).requested_device.is_ps() {
                ctx.request(g, id)?;
            }
        }

        // Colocation facts: slots and writers name their variable.
        let mut colocate: BTreeMap<NodeId, NodeId> = BTreeMap::new();
        let mut slot_bytes: BTreeMap<String, usize> = BTreeMap::new();
        let mut steps: BTreeSet<NodeId> = BTreeSet::new();
        for &id in &ids {
            let op = &g.node(id).op;
            let muts = op.mutated_inputs();
            if muts.is_empty() {
                continue;
            }
            let ins = g.inputs(id);
            let Some(var) = ins.first().map(|t| t.node) else {
                continue;
            };
            colocate.insert(id, var);
            if matches!(op, Op::IncrementStep) {
                steps.insert(var);
            }
            for t in ins.iter().take(muts.end).skip(1) {
                colocate.insert(t.node, var);
                *slot_bytes.entry(g.node(var).name.clone()).or_default() += var_bytes(g, t.node);
            }
            // A TowerMean feeding a writer (a gradient or statistic mean) goes with the variable.
            for t in ins.iter().skip(muts.end) {
                if matches!(g.node(t.node).op, Op::TowerMean { .. } | Op::TowerMatMul { .. }) {
                    colocate.insert(t.node, var);
                }
            }
        }
        for (v, t) in &st.grads {
            if let (Some(var), Some(m)) = (g.get(v), g.get(&t.node)) {
                if matches!(g.node(m).op, Op::TowerMean { .. } | Op::TowerMatMul { .. }) {
                    colocate.entry(m).or_insert(var);
                }
            }
        }
        check_ps_requests(g, &ids, self.strategy, &colocate)?;
        if let Some(step) = g.get("global_step") {
            steps.insert(step);
        }
        // The learning rates live with global_step on the host: the training
        // loop writes them between steps. An update's last input is its rate
        // (`learning_rate`, or a named optimizer's `<name>/learning_rate`).
        if let Some(lr) = g.get(crate::optimizer::LEARNING_RATE) {
            steps.insert(lr);
        }
        for &id in &ids {
            if matches!(g.node(id).op, Op::ApplyGradient { .. }) {
                if let Some(lr) = g.inputs(id).last() {
                    if matches!(g.node(lr.node).op, Op::Variable { .. }) {
                        steps.insert(lr.node);
                    }
                }
            }
        }

        // With parameter servers, a variable pinned to a job-less host device
        // (cifar10's `_variable_on_cpu`: `/cpu:0`) is sharded too, as TF1's
        // replica_device_setter merges `/job:ps/task:k` under its spec; its
        // value lives on the host either way.
        let ps_merges = |spec: &towers_graph::DeviceSpec| {
            matches!(self.strategy, VarPlacement::Ps { .. })
                && spec.job.is_none()
                && spec.task.is_none()
                && spec.kind == Some(DeviceKind::Cpu)
                && spec.index.is_none_or(|i| i == 0)
        };
        let mut vars = Vec::new();
        for &id in &ids {
            let n = g.node(id);
            if matches!(n.op, Op::Variable { .. })
                && !colocate.contains_key(&id)
                && !steps.contains(&id)
                && (n.requested_device.is_ps() || ps_merges(&n.requested_device) || ctx.request(g, id)?.is_none())
            {
                vars.push(id);
            }
        }
        // A placement asked for, and every variable pinned by a device scope:
        // explicit devices win (as in TF1), so the placement does nothing. Said.
        if vars.is_empty() && self.strategy != VarPlacement::Cpu {
            let pinned: Vec<&str> = ids
                .iter()
                .filter(|&&i| {
                    matches!(g.node(i).op, Op::Variable { .. }) && !colocate.contains_key(&i) && !steps.contains(&i)
                })
                .map(|&i| g.node(i).name.as_str())
                .collect();
            if let Some(first) = pinned.first() {
                let msg = format!(
                    "variables={} places no variable: all {} ('{first}', ...) are pinned by their device scopes, and an explicit device wins; create the variables outside the device scope to let the placement choose",
                    self.strategy.name(),
                    pinned.len()
                );
                st.warn("place", msg);
            }
        }
        let ps = shard_ps(g, self.strategy, &vars, &colocate)?;
        let mut var_dev: BTreeMap<NodeId, (Device, String)> = if let Some(d) = single {
            vars.iter().map(|&v| (v, (d, "single device".to_string()))).collect()
        } else {
            self.place_variables(g, &vars, &slot_bytes, &devices)
        };
        if let Some((_, reasons)) = &ps {
            for (v, why) in reasons {
                if let Some(p) = var_dev.get_mut(v) {
                    p.1 = why.clone();
                }
            }
        }
        let default_dev =
            if st.towers.is_empty() { devices.first().copied().unwrap_or(Device::CPU0) } else { Device::CPU0 };
        let loss_mean = g.program().fetches.get("loss").and_then(|t| g.get(&t.node));
        let train_op = g.program().train_op.as_ref().and_then(|n| g.get(n));

        let mut placed: BTreeMap<NodeId, (Device, String)> = BTreeMap::new();
        for id in g.topo_order()? {
            let n = g.node(id);
            let host = |why: &str| (Device::CPU0, format!("host: {why}"));
            let decision = if let Some(d) = single {
                let ps_reason = ps.as_ref().and_then(|p| p.1.get(&id)).cloned();
                (d, ps_reason.unwrap_or_else(|| "single device".to_string()))
            } else if let Some(t) = n.tower {
                let d = *st.towers.get(t).ok_or_else(|| PassError::Placement {
                    node: n.name.clone(),
                    reason: format!("the node belongs to tower {t}, but there are {} towers", st.towers.len()),
                })?;
                (d, format!("tower {t}"))
            } else if let Some(&var) = colocate.get(&id) {
                let d = placed.get(&var).map(|p| p.0).unwrap_or(Device::CPU0);
                (d, format!("colocated with {}", g.node(var).name))
            } else if let Some(p) = var_dev.get(&id) {
                // Before the request: a /job:ps variable's request names its owner, not a local device.
                p.clone()
            } else if let Some(d) = ctx.request(g, id)? {
                // `/gpu:*` (no index) asks for any GPU: say which one it got.
                let why = if n.requested_device.index.is_none() {
                    format!("requested {}, placed on {}", n.requested_device, d.spec())
                } else {
                    format!("requested {}", d.spec())
                };
                (d, why)
            } else if steps.contains(&id) && towers_graph::is_learning_rate(&n.name) {
                host("learning rate, set between steps")
            } else if steps.contains(&id) {
                host("global step")
            } else if Some(id) == train_op {
                host("train_op")
            } else if Some(id) == loss_mean {
                host("loss mean")
            } else if matches!(n.op, Op::Placeholder { .. })
                || (matches!(n.op, Op::Split { .. })
                    && g.inputs(id).iter().all(|t| matches!(g.node(t.node).op, Op::Placeholder { .. })))
            {
                host("input pipeline")
            } else if default_dev == Device::CPU0 {
                host("outside the towers")
            } else {
                (default_dev, "default device".to_string())
            };
            placed.insert(id, decision);
        }
        for (id, (d, why)) in placed {
            let n = g.node_mut(id);
            n.device = Some(d);
            n.placement_reason = Some(why);
        }
        g.program_mut().ps = ps.map(|p| p.0);
        insert_copies(g)?;
        add_war_edges(g)?;
        Ok(())
    }
}

fn dev_tag(d: Device) -> String {
    let k = match d.kind {
        DeviceKind::Cpu => "cpu",
        DeviceKind::Gpu => "gpu",
    };
    format!("{k}_{}", d.index)
}

/// One `Copy` per (source tensor, destination device) on every crossing edge.
fn insert_copies(g: &mut Graph) -> Result<(), PassError> {
    let mut copies: BTreeMap<(Tensor, Device), Tensor> = BTreeMap::new();
    for id in g.topo_order()? {
        let Some(dst) = g.node(id).device else {
            continue;
        };
        for (slot, t) in g.inputs(id).into_iter().enumerate() {
            if g.node(t.node).device == Some(dst) {
                continue;
            }
            let c = match copies.get(&(t, dst)) {
                Some(c) => *c,
                None => {
                    let src = &g.node(t.node).name;
                    let base = if t.slot == 0 {
                        format!("{src}/read_{}", dev_tag(dst))
                    } else {
                        format!("{src}/read_{}_{}", t.slot, dev_tag(dst))
                    };
                    let name = g.unique_name(&base);
                    let c = g.add(NewNode::new(name, Op::Copy, vec![t]))?;
                    let n = g.node_mut(c);
                    n.device = Some(dst);
                    n.placement_reason = Some(format!("copy to {dst}"));
                    copies.insert((t, dst), Tensor::new(c, 0));
                    Tensor::new(c, 0)
                }
            };
            g.set_input(id, slot, c)?;
        }
    }
    Ok(())
}

/// The nodes that read variable `v`'s memory: its consumers that do not
/// write it, and, through copies and aliasing ops, their consumers too.
fn readers(g: &Graph, v: NodeId) -> Vec<NodeId> {
    let mut out = Vec::new();
    let mut stack = vec![v];
    let mut seen = BTreeSet::new();
    while let Some(n) = stack.pop() {
        for (c, slot, _) in g.consumers(n) {
            if !seen.insert(c) || (n == v && g.node(c).op.mutated_inputs().contains(&slot)) {
                continue;
            }
            out.push(c);
            // The array ops `ExpandDims` and `Squeeze` (issue 22) are views too.
            let view = matches!(g.node(c).op, Op::ExpandDims { .. } | Op::Squeeze { .. });
            if view || matches!(g.node(c).op, Op::Copy | Op::Identity | Op::Reshape { .. } | Op::StopGradient) {
                stack.push(c);
            }
        }
    }
    out.sort_by_key(|&c| g.node(c).seq);
    out
}

/// Every writer of a variable runs after the variable's other readers.
pub(crate) fn add_war_edges(g: &mut Graph) -> Result<(), PassError> {
    for w in g.node_ids() {
        let muts = g.node(w).op.mutated_inputs();
        if muts.is_empty() {
            continue;
        }
        let vars: Vec<NodeId> = g.inputs(w).iter().take(muts.end).map(|t| t.node).collect();
        for v in vars {
            for c in readers(g, v) {
                if c == w || g.reaches(c, w) || g.reaches(w, c) {
                    continue;
                }
                g.add_control(c, w)?;
            }
        }
    }
    Ok(())
}
