//! Which thread runs which step: one thread per device, except that the
//! host's streams join the last device's thread when the devices would
//! otherwise take every core ([`thread_plans`]).
//!
//! A plan has several streams per device (compute, copy, collective). On the
//! CPU backend a separate thread per stream only adds context switches (the
//! machine has as many cores as towers), so each device's streams are run by
//! one thread, as lanes (`sched::run_thread` interleaves them as their events
//! allow). The items of a thread are listed in the order of one simulated
//! sequential execution of the whole plan ([`global_order`]): it exists only
//! if the plan cannot deadlock (every `Wait` refers to an event recorded
//! earlier in that order), it fixes which lane comes first (the order its
//! stream first appears) and the items' indices in profiles and traces.
//!
//! The simulation takes work one launch at a time: after each launch (or
//! collective) it first takes every step that costs nothing and unblocks
//! others, on every stream (records, copies, waits already satisfied), then
//! the next launch of the ready stream that has run the fewest.

use towers_codegen::{Plan, Step};
use towers_vocab::Device;

/// One thread's work: (stream index, step index) in execution order; its
/// lanes take launches in the order their streams first appear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadPlan {
    /// The devices whose streams it runs (two when the host's joined a device's).
    pub devices: Vec<Device>,
    pub items: Vec<(usize, usize)>,
}

/// A sequential execution order of all steps, or the stuck streams if the
/// plan's events cannot be satisfied.
pub fn global_order(plan: &Plan) -> Result<Vec<(usize, usize)>, String> {
    global_order_with(plan, &|_| false)
}

/// [`global_order`] with the events `external` says are recorded elsewhere
/// (by another part of a mixed session) taken as recorded from the start:
/// a part's own order. The whole plan's order, checked by the mixed
/// backend, is what guarantees those records come.
pub fn global_order_with(plan: &Plan, external: &dyn Fn(usize) -> bool) -> Result<Vec<(usize, usize)>, String> {
    let mut recorded = vec![false; plan.num_events];
    let mut pos = vec![0usize; plan.streams.len()];
    let total: usize = plan.streams.iter().map(|s| s.steps.len()).sum();
    let mut order = Vec::with_capacity(total);
    let is_work = |st: &Step| {
        matches!(st, Step::Launch { .. } | Step::AllReduce { .. } | Step::Reduce { .. } | Step::Broadcast { .. })
    };
    let mut launched = vec![0usize; plan.streams.len()];
    while order.len() < total {
        let mut progressed = false;
        // Every free step that is ready, on every stream, until none is.
        let mut again = true;
        while again {
            again = false;
            for (si, s) in plan.streams.iter().enumerate() {
                while let Some(step) = s.steps.get(pos[si]) {
                    match step {
                        Step::Wait(e) if !recorded.get(*e).copied().unwrap_or(false) && !external(*e) => break,
                        st if is_work(st) => break,
                        Step::Record(e) => {
                            if let Some(r) = recorded.get_mut(*e) {
                                *r = true;
                            }
                            again = true;
                        }
                        _ => {}
                    }
                    order.push((si, pos[si]));
                    pos[si] += 1;
                    progressed = true;
                }
            }
        }
        // Then one launch: of the ready stream that has run the fewest so
        // far (streams advance side by side, as their threads do), ties to
        // the first.
        let next = (0..plan.streams.len())
            .filter(|&si| plan.streams[si].steps.get(pos[si]).is_some_and(is_work))
            .min_by_key(|&si| (launched[si], si));
        if let Some(si) = next {
            order.push((si, pos[si]));
            pos[si] += 1;
            launched[si] += 1;
            progressed = true;
        }
        if !progressed {
            let stuck: Vec<String> = plan
                .streams
                .iter()
                .enumerate()
                .filter_map(|(si, s)| s.steps.get(pos[si]).map(|st| format!("{} at {:?}", s.name(), st)))
                .collect();
            return Err(format!("the plan's events can never all be recorded: stuck streams {}", stuck.join("; ")));
        }
    }
    Ok(order)
}

/// One thread per device, each running its streams' steps in global order;
/// threads sorted by device.
///
/// When the host (`cpu:0`) and at least `cores` other devices have streams,
/// and the plan has no collective across processes, the host's streams run
/// on the last device's thread instead, after that device's own lanes: a
/// host thread would have no core of its own, and each event the towers
/// record for it (a loss, a gradient) would wake it on a tower's core in the
/// middle of the tower's work. Measured on the MLP 784-256-256-10 at two
/// towers on two cores, variables on the host: the towers stalled 60-70 us
/// at such a wake-up, and 30-65 us at each step's start. A collective blocks
/// its thread until every rank reached it, so plans with one keep the host
/// alone (a tower's lanes behind a blocked all-reduce could hold up the
/// other rank).
pub fn thread_plans(plan: &Plan, cores: usize) -> Result<Vec<ThreadPlan>, String> {
    thread_plans_with(plan, cores, None)
}

/// [`thread_plans`] for a part of a mixed session (`part`: per plan device
/// whether this part serves it, and the bridge of the events crossing
/// parts): threads only for the served devices, waits on bridged events
/// taken as satisfied (see [`global_order_with`]).
pub fn thread_plans_with(
    plan: &Plan,
    cores: usize,
    part: Option<(&[bool], &crate::mixed::Bridge)>,
) -> Result<Vec<ThreadPlan>, String> {
    let order = match part {
        Some((_, bridge)) => global_order_with(plan, &|e| bridge.is_bridged(e))?,
        None => global_order(plan)?,
    };
    let served = |d: &Device| match part {
        Some((served, _)) => plan.devices.iter().zip(served).any(|(p, s)| *s && p.device == *d),
        None => true,
    };
    let mut devices: Vec<Device> = plan.streams.iter().map(|s| s.device).filter(served).collect();
    devices.sort();
    devices.dedup();
    let collective = plan.streams.iter().any(|s| {
        s.steps.iter().any(|st| matches!(st, Step::AllReduce { .. } | Step::Reduce { .. } | Step::Broadcast { .. }))
    });
    let join = devices.len() > cores.max(1) && devices.first() == Some(&Device::CPU0) && !collective;
    let of = |d: Device| -> Vec<(usize, usize)> {
        order.iter().copied().filter(|&(si, _)| plan.streams[si].device == d).collect()
    };
    let mut threads: Vec<ThreadPlan> = devices.iter().map(|&d| ThreadPlan { devices: vec![d], items: of(d) }).collect();
    if join {
        let host = threads.remove(0);
        let last = threads.pop().ok_or("a plan with the host and other devices has a last device")?;
        let items = last.items.into_iter().chain(host.items).collect();
        threads.insert(0, ThreadPlan { devices: vec![Device::CPU0, last.devices[0]], items });
    }
    Ok(threads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use towers_codegen::{Mode, StreamPlan};
    use towers_vocab::StreamKind;

    fn plan(streams: Vec<(Device, Vec<Step>)>, num_events: usize) -> Plan {
        Plan {
            program: "t".into(),
            mode: Mode::Train,
            devices: vec![],
            variables: vec![],
            constants: vec![],
            feeds: vec![],
            fetches: vec![],
            tensors: vec![],
            streams: streams
                .into_iter()
                .map(|(device, steps)| StreamPlan { device, kind: StreamKind::Compute, steps })
                .collect(),
            num_events,
            task: None,
            unread_feeds: Vec::new(),
        }
    }

    #[test]
    fn merges_a_devices_streams_in_an_order_that_cannot_deadlock() {
        // gpu:0/compute waits for e0 from cpu:0, records e1; gpu:0/copy waits
        // e1 then records e2; cpu:0 records e0 then waits e2. Concatenating
        // gpu:0's streams copy-first would deadlock; the global order does not.
        let g = Device::gpu(0);
        let c = Device::CPU0;
        let p = plan(
            vec![
                (c, vec![Step::Record(0), Step::Wait(2)]),
                (g, vec![Step::Wait(1), Step::Record(2)]),
                (g, vec![Step::Wait(0), Step::Record(1)]),
            ],
            3,
        );
        let t = thread_plans(&p, 8).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].devices, vec![c]);
        assert_eq!(t[1].items, vec![(2, 0), (2, 1), (1, 0), (1, 1)]);
    }

    /// A device's copy stream keeps pace with its compute stream: the copy
    /// waiting for the first launch's event runs right after that launch,
    /// before the device's next launch, and a launch of another device can
    /// interleave.
    #[test]
    fn copies_run_as_soon_as_their_event_is_recorded() {
        let launch = |node: &str| Step::Launch {
            kernel: towers_codegen::Kernel::IncrementStep,
            inputs: vec![],
            outputs: vec![],
            workspace: None,
            node: node.into(),
        };
        let copy = || Step::Copy {
            from: towers_codegen::BufRef::Variable("a".into()),
            to: towers_codegen::BufRef::Variable("b".into()),
            bytes: 4,
            node: "copy".into(),
        };
        let g = Device::gpu(0);
        let p = plan(
            vec![
                (Device::CPU0, vec![Step::Wait(1), launch("update")]),
                (g, vec![launch("a"), Step::Record(0), launch("b"), launch("c")]),
                (g, vec![Step::Wait(0), copy(), Step::Record(1)]),
            ],
            2,
        );
        let order = global_order(&p).unwrap();
        let pos = |s: usize, k: usize| order.iter().position(|&x| x == (s, k)).unwrap();
        assert!(pos(2, 1) < pos(1, 2), "the copy runs before the device's next launch: {order:?}");
        assert!(pos(0, 1) < pos(1, 3), "the update is ready before the device's last launch: {order:?}");
        let t = thread_plans(&p, 8).unwrap();
        assert_eq!(t[1].items, vec![(1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (1, 2), (1, 3)]);
    }

    /// Two towers and the host on two cores: the host's streams join the
    /// last tower's thread, after its lanes; with a core to spare, or with
    /// a collective, the host keeps its own thread.
    #[test]
    fn the_host_joins_the_last_device_when_cores_run_out() {
        let (c, g0, g1) = (Device::CPU0, Device::gpu(0), Device::gpu(1));
        let streams = |collective: bool| {
            let host_tail =
                if collective { Step::AllReduce { buffers: vec![], node: "ar".into() } } else { Step::Wait(1) };
            vec![
                (c, vec![Step::Record(0), Step::Wait(2), host_tail]),
                (g0, vec![Step::Wait(0), Step::Record(1)]),
                (g1, vec![Step::Wait(0), Step::Record(2)]),
            ]
        };
        let t = thread_plans(&plan(streams(false), 3), 2).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].devices, vec![c, g1]);
        assert_eq!(t[0].items, vec![(2, 0), (2, 1), (0, 0), (0, 1), (0, 2)], "the tower's lanes first");
        assert_eq!(t[1].devices, vec![g0]);
        assert_eq!(thread_plans(&plan(streams(false), 3), 3).unwrap().len(), 3, "a core for the host");
        assert_eq!(thread_plans(&plan(streams(true), 3), 2).unwrap().len(), 3, "a collective keeps the host alone");
    }

    #[test]
    fn unsatisfiable_events_are_an_error() {
        let p = plan(vec![(Device::CPU0, vec![Step::Wait(0)])], 1);
        assert!(global_order(&p).unwrap_err().contains("stuck"));
    }
}
