//! The placement report (`towers compile --emit placement`): every variable
//! with its device, bytes and reason; every op group (nodes sharing a tower,
//! a top-level scope, a device and a reason) with its size; and the planned
//! bytes per device: variables and optimizer slots resident there plus the
//! arena of activations, gradients and copies, planned with memory reuse
//! (peak) beside the sum of all its buffers (what the arena would be with
//! none) and their ratio. This is where GPU 0's extra memory shows when it
//! holds the variables. With `--variables ps`, every variable's owner
//! (`/job:ps/task:k`) and each task's bytes of variables and of optimizer
//! slots (the state an owner alone keeps). [`device_section`] adds the
//! physical mapping: where each plan device runs on a backend on this
//! machine ([`towers_runtime::devices`]).

use std::collections::BTreeMap;
use std::fmt::Write;

use towers_codegen::Plan;
use towers_graph::{Device, Graph, Op};

fn group_of(name: &str) -> String {
    let parts: Vec<&str> = name.split('/').collect();
    let mut take = 1;
    if parts[0].starts_with("tower_") && parts.len() > 2 {
        take = 2;
        if parts.get(1).is_some_and(|p| p.starts_with("micro_")) && parts.len() > 3 {
            take = 3;
        }
    }
    if parts.len() <= take {
        return "(root)".into();
    }
    parts[..take].join("/")
}

/// Render the placement report of a placed graph and its plan.
pub fn placement_report(g: &Graph, plan: &Plan) -> String {
    let mut s = String::new();
    let mut var_bytes: BTreeMap<Device, usize> = BTreeMap::new();
    // The device column fits the longest name (`/job:worker/task:1/device:CPU:0`
    // in a multi-process plan), so the columns after it stay aligned.
    let w = plan
        .devices
        .iter()
        .map(|d| d.device)
        .chain(plan.variables.iter().map(|v| v.device))
        .map(|d| plan.device_name(d).len())
        .max()
        .unwrap_or(0)
        .max(8);
    let _ = writeln!(s, "variables ({}):", plan.variables.len());
    let _ = writeln!(s, "  {:<48} {:<w$} {:>12}  reason", "name", "device", "bytes");
    for v in &plan.variables {
        let bytes = v.shape.iter().product::<usize>() * v.dtype.size_bytes();
        *var_bytes.entry(v.device).or_default() += bytes;
        let reason = g.get(&v.name).and_then(|id| g.node(id).placement_reason.clone()).unwrap_or_default();
        let _ = writeln!(s, "  {:<48} {:<w$} {:>12}  {}", v.name, plan.device_name(v.device), bytes, reason);
    }
    let mut groups: BTreeMap<(String, Device, String), (usize, usize)> = BTreeMap::new();
    for id in g.node_ids() {
        let n = g.node(id);
        if matches!(n.op, Op::Variable { .. }) {
            continue;
        }
        let Some(dev) = n.device else { continue };
        let reason = n.placement_reason.clone().unwrap_or_default();
        let e = groups.entry((group_of(&n.name), dev, reason)).or_default();
        e.0 += 1;
        e.1 += n.outputs.iter().filter_map(|t| t.byte_size()).sum::<usize>();
    }
    let _ = writeln!(s, "\nop groups ({}):", groups.len());
    let _ = writeln!(s, "  {:<40} {:<w$} {:>6} {:>12}  reason", "group", "device", "ops", "out bytes");
    for ((grp, dev, reason), (count, bytes)) in &groups {
        let _ = writeln!(s, "  {:<40} {:<w$} {:>6} {:>12}  {}", grp, plan.device_name(*dev), count, bytes, reason);
    }
    let _ = writeln!(
        s,
        "\nplanned bytes per device (arena: peak with memory reuse; no reuse: every buffer its own bytes):"
    );
    let _ = writeln!(
        s,
        "  {:<w$} {:>14} {:>14} {:>14} {:>7} {:>14}",
        "device", "variables", "no reuse", "arena", "ratio", "total"
    );
    let mut devices: Vec<Device> = plan.devices.iter().map(|d| d.device).chain(var_bytes.keys().copied()).collect();
    devices.sort();
    devices.dedup();
    for d in devices {
        let v = var_bytes.get(&d).copied().unwrap_or(0);
        let a: usize = plan.devices.iter().filter(|p| p.device == d).map(|p| p.arena_bytes).sum();
        let all: usize = plan.devices.iter().filter(|p| p.device == d).map(|p| p.bytes_without_reuse()).sum();
        let ratio = if all == 0 { "-".to_string() } else { format!("{:.2}", a as f64 / all as f64) };
        let _ = writeln!(s, "  {:<w$} {:>14} {:>14} {:>14} {:>7} {:>14}", plan.device_name(d), v, all, a, ratio, v + a);
    }
    if let Some(ps) = &g.program().ps {
        ps_section(&mut s, g, plan, ps);
    }
    let copies = g.node_ids().iter().filter(|&&i| matches!(g.node(i).op, Op::Copy)).count();
    let reductions = g.node_ids().iter().filter(|&&i| matches!(g.node(i).op, Op::TowerMean { .. })).count();
    let _ = writeln!(s, "\ncopies: {copies}, cross-tower reductions: {reductions}, events: {}", plan.num_events);
    // Cross-process all-reduces, in the order they start (several processes only).
    let mut buckets: Vec<(usize, String, usize, usize, Option<usize>)> = g
        .node_ids()
        .into_iter()
        .filter_map(|i| match g.node(i).op {
            Op::AllReduce { bucket, root } => {
                let n = g.node(i);
                let bytes = n.outputs.iter().filter_map(|t| t.byte_size()).sum();
                Some((bucket, n.name.clone(), n.outputs.len(), bytes, root))
            }
            _ => None,
        })
        .collect();
    buckets.sort();
    if !buckets.is_empty() {
        let total: usize = buckets.iter().map(|b| b.3).sum();
        let _ = writeln!(s, "all-reduce buckets across processes: {} ({total} B per step)", buckets.len());
        for (_, name, tensors, bytes, root) in &buckets {
            let to = root.map(|k| format!(", reduce→rank {k}")).unwrap_or_default();
            let _ = writeln!(s, "  {name}: {tensors} tensors, {bytes} B{to}");
        }
    }
    s
}

/// The owner of every sharded variable and slot, and each ps task's load:
/// its variables' bytes and its optimizer slots' bytes, in the plan's
/// order of variables.
fn ps_section(s: &mut String, g: &Graph, plan: &Plan, ps: &towers_graph::PsSharding) {
    let mut per_task = vec![(0usize, 0usize, 0usize); ps.tasks as usize];
    let _ = writeln!(s, "\nparameter-server tasks: {} (owner of each variable and slot):", ps.tasks);
    let _ = writeln!(s, "  {:<48} {:<16} {:>12}  kind", "name", "owner", "bytes");
    let slots: std::collections::BTreeSet<String> = g
        .node_ids()
        .into_iter()
        // An update's inputs after its variable (a value broadcast writes
        // variables only).
        .filter(|&i| !g.node(i).op.mutated_inputs().is_empty() && !matches!(g.node(i).op, Op::Broadcast { .. }))
        .flat_map(|i| {
            let muts = g.node(i).op.mutated_inputs();
            g.inputs(i).into_iter().take(muts.end).skip(1).map(|t| g.node(t.node).name.clone()).collect::<Vec<_>>()
        })
        .collect();
    // In the plan's order of variables (creation order), as the strategies deal them.
    for (name, k) in plan.variables.iter().filter_map(|v| ps.owner(&v.name).map(|k| (&v.name, k))) {
        let bytes = g.get(name).and_then(|id| g.node(id).outputs.first().and_then(|t| t.byte_size())).unwrap_or(0);
        let slot = slots.contains(name);
        if let Some(t) = per_task.get_mut(k as usize) {
            if slot {
                t.2 += bytes;
            } else {
                t.0 += 1;
                t.1 += bytes;
            }
        }
        let kind = if slot { "slot" } else { "variable" };
        let _ = writeln!(s, "  {:<48} {:<16} {:>12}  {kind}", name, towers_graph::ps_task_name(k), bytes);
    }
    let _ = writeln!(s, "  {:<16} {:>9} {:>14} {:>14}", "task", "variables", "var bytes", "slot bytes");
    for (k, (n, vb, sb)) in per_task.iter().enumerate() {
        let _ = writeln!(s, "  {:<16} {:>9} {:>14} {:>14}", towers_graph::ps_task_name(k as u32), n, vb, sb);
    }
    // A rank of several compiles only its own tasks' slots (`ps_exchange`):
    // the others' are in their owners' programs.
    if let Some(rank) = g.program().task {
        let mine: usize = per_task.iter().map(|t| t.2).sum();
        let _ = writeln!(
            s,
            "  this program is rank {rank}'s: it holds {mine} B of optimizer slots (the tasks it runs); the other tasks' slots live on their owner ranks only"
        );
        return;
    }
    // What ZeRO-1 saves: a task keeps only its own slots instead of all of them.
    let total: usize = per_task.iter().map(|t| t.2).sum();
    let most = per_task.iter().map(|t| t.2).max().unwrap_or(0);
    let _ = writeln!(
        s,
        "  optimizer slots: {total} B in all; the most any task owns is {most} B ({} B fewer than a full copy)",
        total - most
    );
}

/// The placement report's physical mapping: where each device of the plan
/// runs with `--backend {backend}` on `machine` (one line per device, as
/// `towers train` prints them at the start of a run).
pub fn device_section(
    plan: &Plan,
    backend: crate::train::BackendChoice,
    machine: &towers_runtime::devices::Machine,
) -> Result<String, crate::train::TrainError> {
    use towers_runtime::devices::{plan_map, Cuda, PlanMapError};
    let map = plan_map(plan, backend.kind(machine), machine).map_err(|e| match e {
        PlanMapError::Unservable(source) => crate::train::TrainError::Unservable { backend: backend.name(), source },
        PlanMapError::Threads(t) => crate::train::TrainError::Options(t),
    })?;
    let cuda = match &machine.cuda {
        Cuda::Gpus(n) => format!("{n} CUDA GPU(s)"),
        Cuda::Absent(why) => why.clone(),
    };
    let mut s = format!(
        "\nwhere each device runs (--backend {} on this machine: {cuda}, {} cores):\n",
        backend.name(),
        machine.cores
    );
    for line in map.to_string().lines() {
        let _ = writeln!(s, "  {line}");
    }
    Ok(s)
}
