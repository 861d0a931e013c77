//! `schedule`: order each device's work into streams with events.
//!
//! Invariants of the [`Schedule`] this stores in the program record
//! (`g.program().schedule`):
//! - every node except variables, placeholders and constants (no work) is
//!   `Run` exactly once, on one stream: `Copy` nodes on the copy stream of
//!   the accelerator side ([`copy_stream_device`]: host-to-device on the
//!   destination, device-to-host and device-to-device on the source, as CUDA
//!   programs issue them), `TowerMean` nodes on their device's collective
//!   stream, everything else on its device's compute stream;
//! - items follow one global topological order (ties by creation order),
//!   so each stream runs its nodes in that order; in a graph with
//!   with towers or cross-process all-reduces the collective nodes, the
//!   gradient copies feeding them and the optimizer updates are hoisted to
//!   right after their last producer, so a variable's reduction and update
//!   (a bucket's all-reduce) start while the backward pass goes on;
//! - an event exists only for a real cross-stream dependency (a data or
//!   control edge, looking through unscheduled nodes, whose producer runs on
//!   another stream): one `Record` right after the producer, and a `Wait`
//!   before the first consumer on each other stream, never twice on one
//!   stream; events are numbered in global order;
//! - deadlock-free by construction: a `Wait` refers to an event whose
//!   producer comes earlier in the global order, so running the streams in
//!   global order never blocks ([`check_deadlock_free`] replays it);
//! - streams are sorted by device, then kind.
//!
//! Write-after-read ordering is not added here: `place` adds those control
//! edges, and this pass turns them into events like any other edge.

use std::collections::{BTreeMap, BTreeSet};

use towers_graph::{Device, Graph, NodeId, Op};

use crate::manager::Pass;
use crate::state::{CompileState, PassError, Schedule, ScheduleItem, ScheduledStream, StreamKind};

/// Build the stream schedule (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct ScheduleStreams;

/// Whether a node has work to schedule.
pub fn is_scheduled(op: &Op) -> bool {
    !matches!(op, Op::Variable { .. } | Op::Placeholder { .. } | Op::Const { .. })
}

/// The stream kind of an op.
pub fn stream_kind(op: &Op) -> StreamKind {
    match op {
        Op::Copy => StreamKind::Copy,
        Op::TowerMean { .. } | Op::AllReduce { .. } | Op::Broadcast { .. } => StreamKind::Collective,
        _ => StreamKind::Compute,
    }
}

/// The device whose copy stream runs a `Copy` from `src` to `dst`: the
/// destination for a host-to-device copy, the source otherwise (a
/// device-to-host copy is issued by the device that has the data, and each
/// tower then moves its own data in parallel).
pub fn copy_stream_device(src: Device, dst: Device) -> Device {
    use towers_graph::DeviceKind::Cpu;
    if src.kind == Cpu && dst.kind != Cpu {
        dst
    } else {
        src
    }
}

/// The scheduled producers `id` depends on, looking through unscheduled nodes.
fn scheduled_preds(g: &Graph, id: NodeId) -> BTreeSet<NodeId> {
    let mut out = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut stack: Vec<NodeId> = g.inputs(id).iter().map(|t| t.node).chain(g.control_inputs(id)).collect();
    while let Some(p) = stack.pop() {
        if !seen.insert(p) {
            continue;
        }
        if is_scheduled(&g.node(p).op) {
            out.insert(p);
        } else {
            stack.extend(g.inputs(p).iter().map(|t| t.node).chain(g.control_inputs(p)));
        }
    }
    out
}

/// Move every collective node of a graph with towers or cross-process
/// all-reduces (its `TowerMean`s, `AllReduce`s, the optimizer updates, and
/// the copies read only by those: the towers' gradients on their way to a
/// mean, the learning rate on its way to the updates) to right after
/// its last scheduled producer: a topological order still (a node only
/// moves earlier, and never before a producer), in which each variable's
/// reduction and update (and each bucket's all-reduce) comes as soon as its
/// last gradient is written instead of after the whole backward pass, so
/// the devices that reduce and update start while the towers go on.
/// Graphs without either (one device) keep their order. A `TowerMatMul`
/// (a folded gradient mean: a product over the whole batch) is not hoisted:
/// where it shares a stream with a tower it would hold up that tower's
/// backward pass, which the other tower then waits for; after it, both
/// towers' threads are free to split it.
fn hoist_collectives(g: &Graph, order: Vec<NodeId>) -> Vec<NodeId> {
    if !order
        .iter()
        .any(|&id| matches!(g.node(id).op, Op::AllReduce { .. } | Op::TowerMean { .. } | Op::Broadcast { .. }))
    {
        return order;
    }
    let collective = |id: NodeId| {
        matches!(
            g.node(id).op,
            Op::TowerMean { .. } | Op::AllReduce { .. } | Op::ApplyGradient { .. } | Op::Broadcast { .. }
        )
    };
    // A copy whose every reader is hoisted: a tower's gradient on its way to
    // a mean, or the learning rate or step on their way to the updates.
    let feeds_hoisted = |id: NodeId| {
        let consumers = g.consumers(id);
        !consumers.is_empty() && consumers.iter().all(|&(c, _, _)| collective(c))
    };
    let hoisted = |id: NodeId| collective(id) || (matches!(g.node(id).op, Op::Copy) && feeds_hoisted(id));
    let preds: BTreeMap<NodeId, BTreeSet<NodeId>> =
        order.iter().filter(|&&id| hoisted(id)).map(|&id| (id, scheduled_preds(g, id))).collect();
    let mut out = Vec::with_capacity(order.len());
    let mut done: BTreeSet<NodeId> = BTreeSet::new();
    // Hoisted nodes not yet placed, in their original order.
    let mut pending: Vec<NodeId> = order.iter().copied().filter(|&id| hoisted(id)).collect();
    let mut flush = |out: &mut Vec<NodeId>, done: &mut BTreeSet<NodeId>| {
        // Placing a node may make pending collectives ready (in cascade).
        while let Some(i) = pending.iter().position(|p| preds[p].iter().all(|q| done.contains(q))) {
            let p = pending.remove(i);
            out.push(p);
            done.insert(p);
        }
    };
    flush(&mut out, &mut done);
    for id in order {
        if hoisted(id) {
            continue;
        }
        out.push(id);
        done.insert(id);
        flush(&mut out, &mut done);
    }
    out
}

/// Build the schedule of a placed graph.
pub fn schedule(g: &Graph) -> Result<Schedule, PassError> {
    let order: Vec<NodeId> = g.topo_order()?.into_iter().filter(|&i| is_scheduled(&g.node(i).op)).collect();
    let order = hoist_collectives(g, order);
    let mut stream_of: BTreeMap<NodeId, (Device, StreamKind)> = BTreeMap::new();
    for &id in &order {
        let n = g.node(id);
        let d = n.device.ok_or_else(|| PassError::MissingState {
            pass: "schedule".into(),
            what: format!("a device for '{}'", n.name),
            after: "place".into(),
        })?;
        let d = match (&n.op, g.inputs(id).first().and_then(|t| g.node(t.node).device)) {
            (Op::Copy, Some(src)) => copy_stream_device(src, d),
            _ => d,
        };
        stream_of.insert(id, (d, stream_kind(&n.op)));
    }
    let preds: BTreeMap<NodeId, BTreeSet<NodeId>> = order.iter().map(|&id| (id, scheduled_preds(g, id))).collect();
    // Producers with a consumer on another stream get an event, numbered in global order.
    let needs: BTreeSet<NodeId> =
        order.iter().flat_map(|id| preds[id].iter().filter(|p| stream_of[*p] != stream_of[id]).copied()).collect();
    let mut event_of: BTreeMap<NodeId, usize> = BTreeMap::new();
    for &id in &order {
        if needs.contains(&id) {
            let e = event_of.len();
            event_of.insert(id, e);
        }
    }
    let mut items: BTreeMap<(Device, StreamKind), Vec<ScheduleItem>> = BTreeMap::new();
    let mut waited: BTreeSet<((Device, StreamKind), usize)> = BTreeSet::new();
    for &id in &order {
        let s = stream_of[&id];
        let mut waits: Vec<usize> = preds[&id]
            .iter()
            .filter(|p| stream_of[*p] != s)
            .map(|p| event_of[p])
            .filter(|e| !waited.contains(&(s, *e)))
            .collect();
        waits.sort_unstable();
        let list = items.entry(s).or_default();
        for e in waits {
            waited.insert((s, e));
            list.push(ScheduleItem::Wait(e));
        }
        list.push(ScheduleItem::Run(g.node(id).name.clone()));
        if let Some(&e) = event_of.get(&id) {
            list.push(ScheduleItem::Record(e));
        }
    }
    Ok(Schedule {
        streams: items.into_iter().map(|((device, kind), items)| ScheduledStream { device, kind, items }).collect(),
        num_events: event_of.len(),
    })
}

/// Replay the streams as independent queues: a stream may advance past a
/// `Wait` only once the event was recorded. Ok if every stream finishes;
/// otherwise the stuck streams and what they wait for.
pub fn check_deadlock_free(s: &Schedule) -> Result<(), String> {
    let mut pos = vec![0usize; s.streams.len()];
    let mut recorded = vec![false; s.num_events];
    loop {
        let mut progressed = false;
        for (i, st) in s.streams.iter().enumerate() {
            while let Some(item) = st.items.get(pos[i]) {
                match item {
                    ScheduleItem::Wait(e) if !recorded.get(*e).copied().unwrap_or(false) => break,
                    ScheduleItem::Record(e) => {
                        if let Some(r) = recorded.get_mut(*e) {
                            *r = true;
                        }
                    }
                    _ => {}
                }
                pos[i] += 1;
                progressed = true;
            }
        }
        if pos.iter().zip(&s.streams).all(|(p, st)| *p == st.items.len()) {
            return Ok(());
        }
        if !progressed {
            let stuck: Vec<String> = s
                .streams
                .iter()
                .zip(&pos)
                .filter(|(st, p)| **p < st.items.len())
                .map(|(st, p)| format!("{} at {:?}", st.name(), st.items[*p]))
                .collect();
            return Err(format!("deadlock: {}", stuck.join(", ")));
        }
    }
}

impl Pass for ScheduleStreams {
    fn name(&self) -> &'static str {
        "schedule"
    }

    fn run(&mut self, g: &mut Graph, _st: &mut CompileState) -> Result<(), PassError> {
        g.program_mut().schedule = Some(schedule(g)?);
        Ok(())
    }
}

#[cfg(test)]
mod copy_stream_tests {
    use super::copy_stream_device;
    use towers_graph::Device;

    #[test]
    fn copies_run_on_the_accelerator_side() {
        let (cpu, g0, g1) = (Device::CPU0, Device::gpu(0), Device::gpu(1));
        assert_eq!(copy_stream_device(cpu, g1), g1, "host to device: the device pulls");
        assert_eq!(copy_stream_device(g1, cpu), g1, "device to host: the device pushes");
        assert_eq!(copy_stream_device(g0, g1), g0, "device to device: the source pushes");
    }
}
