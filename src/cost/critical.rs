//! The step as a critical path: a plan's streams and events simulated with
//! a cost per step (seed 001's `max(compute, communication)` per device,
//! refined by the plan's events).
//!
//! Invariants a reader may rely on:
//! - the simulation is a list schedule that keeps every ordering the plan
//!   states: a stream's steps run in order, a `Wait(e)` passes no earlier
//!   than the `Record(e)` it waits for, and the steps of streams that share
//!   a thread (`thread_of`) never overlap, as on the CPU backend, whose
//!   threads run their device's streams as lanes one step at a time;
//! - among the steps that can start, the one that can start earliest goes
//!   first (ties: bookkeeping before work, as a CPU backend thread runs the
//!   ready copies, records and waits of all its lanes before its next
//!   launch; then the lower stream index), so start times never decrease
//!   and the result is deterministic for a given plan and costs;
//! - records, waits and zero-cost steps take no time and hold no thread;
//!   a wait for a record made on another thread passes `handoff_ns` after
//!   the record (the calibrated wake-up latency between threads, seed
//!   001's per-message α);
//! - the critical path is the chain of steps, each the reason the next
//!   could not start sooner (its stream's previous step, the record it
//!   waited for, or the step that held its thread), ending at the step that
//!   finishes last; its length is the predicted step.
//!
//! - on a GPU ([`simulate_lanes`]) a lane is a host thread or a GPU stream
//!   ([`Lanes`]): the same rules hold per lane, GPU lanes start at once
//!   (only host workers wake late), and an event between two lanes costs
//!   the handoff of their kinds ([`Handoffs`]); [`simulate_woken`] is the
//!   case of host threads only, one handoff for all.
//!
//! Pure: no clock, no device; tests feed it fake plans and fake costs.

use towers_codegen::{Plan, Step};

use super::CostError;

/// A simulated step: when each plan step starts and how long it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The predicted step: the time the last plan step ends, in nanoseconds.
    pub step_ns: u64,
    /// Per stream, per step: (start, duration) in nanoseconds.
    pub times: Vec<Vec<(u64, u64)>>,
    /// The critical path, first step first, as (stream, step index); only
    /// the steps that take time.
    pub critical: Vec<(usize, usize)>,
}

/// Simulate one step of `plan`: `thread_of[s]` is the thread that runs
/// stream `s`, `cost[s][i]` the nanoseconds step `i` of stream `s` takes
/// (records and waits are free whatever it says), `handoff_ns` what an
/// event costs between two threads.
pub fn simulate(plan: &Plan, thread_of: &[usize], cost: &[Vec<u64>], handoff_ns: u64) -> Result<Schedule, CostError> {
    simulate_woken(plan, thread_of, cost, handoff_ns, 0)
}

/// [`simulate`] with every thread but thread 0 (the caller's, which starts
/// the step) free only `wake_ns` after the step starts: the CPU backend's
/// workers sleep between steps once they have waited longer than their
/// spin, and the start signal wakes them.
pub fn simulate_woken(
    plan: &Plan,
    thread_of: &[usize],
    cost: &[Vec<u64>],
    handoff_ns: u64,
    wake_ns: u64,
) -> Result<Schedule, CostError> {
    let threads = thread_of.iter().copied().max().map_or(0, |m| m + 1);
    let lanes = Lanes { thread_of: thread_of.to_vec(), gpu: vec![false; threads] };
    simulate_lanes(
        plan,
        &lanes,
        cost,
        Handoffs { host_ns: handoff_ns, gpu_ns: handoff_ns, bridge_ns: handoff_ns },
        wake_ns,
    )
}

/// Who runs each stream: a host thread or a GPU lane (a CUDA stream,
/// its own queue: GPU lanes overlap each other and the host threads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lanes {
    /// Per plan stream, its lane (a thread index; lane 0 is the caller's thread).
    pub thread_of: Vec<usize>,
    /// Per lane, whether it is a GPU stream (false: a host thread).
    pub gpu: Vec<bool>,
}

/// What an event costs from the lane that records it to the lane that
/// waits for it, by the lanes' kinds (an event within one lane is free).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Handoffs {
    /// Host thread to host thread (a thread's wake-up).
    pub host_ns: u64,
    /// GPU stream to GPU stream (a stream waiting on an event on the GPU).
    pub gpu_ns: u64,
    /// Between a host thread and a GPU stream, either way (a bridged
    /// event: a flag in pinned memory written and polled).
    pub bridge_ns: u64,
}

/// [`simulate_woken`] on lanes of two kinds: host threads after the first
/// are free `wake_ns` after the step starts, GPU lanes at once (their part
/// counts the step from its own start); an event between two lanes costs
/// the handoff of their kinds ([`Handoffs`]).
pub fn simulate_lanes(
    plan: &Plan,
    lanes: &Lanes,
    cost: &[Vec<u64>],
    handoffs: Handoffs,
    wake_ns: u64,
) -> Result<Schedule, CostError> {
    let thread_of = &lanes.thread_of[..];
    let n = plan.streams.len();
    if thread_of.len() != n || cost.len() != n || plan.streams.iter().zip(cost).any(|(s, c)| s.steps.len() != c.len()) {
        return Err(CostError::Shape(format!(
            "the plan has {n} streams; the thread map has {} and the costs {} (one cost per step)",
            thread_of.len(),
            cost.len()
        )));
    }
    let threads = thread_of.iter().copied().max().map_or(0, |m| m + 1);
    if lanes.gpu.len() < threads {
        return Err(CostError::Shape(format!("{threads} lanes, but {} lane kinds", lanes.gpu.len())));
    }
    let handoff = |from: usize, to: usize| match (from == to, lanes.gpu[from], lanes.gpu[to]) {
        (true, _, _) => 0,
        (false, false, false) => handoffs.host_ns,
        (false, true, true) => handoffs.gpu_ns,
        _ => handoffs.bridge_ns,
    };
    let mut pos = vec![0usize; n];
    let mut ready = vec![0u64; n];
    let mut stream_prev: Vec<Option<(usize, usize)>> = vec![None; n];
    let mut free: Vec<u64> = (0..threads).map(|t| if t == 0 || lanes.gpu[t] { 0 } else { wake_ns }).collect();
    let mut thread_prev: Vec<Option<(usize, usize)>> = vec![None; threads];
    // Per event: (time recorded, the costly step behind it, recording thread).
    let mut recorded: Vec<Option<(u64, Option<(usize, usize)>, usize)>> = vec![None; plan.num_events];
    let mut times: Vec<Vec<(u64, u64)>> = plan.streams.iter().map(|s| vec![(0, 0); s.steps.len()]).collect();
    let mut why: Vec<Vec<Option<(usize, usize)>>> = plan.streams.iter().map(|s| vec![None; s.steps.len()]).collect();
    let total: usize = plan.streams.iter().map(|s| s.steps.len()).sum();
    for _ in 0..total {
        // (start, stream, reason) of the step that can start earliest.
        let mut best: Option<(u64, bool, usize, Option<(usize, usize)>)> = None;
        for si in 0..n {
            let Some(step) = plan.streams[si].steps.get(pos[si]) else { continue };
            let (mut start, mut reason) = (ready[si], stream_prev[si]);
            if let Step::Wait(e) = step {
                match recorded.get(*e).copied().flatten() {
                    None => continue,
                    Some((t, who, th)) => {
                        let t = t + handoff(th, thread_of[si]);
                        if t > start {
                            (start, reason) = (t, who);
                        }
                    }
                }
            }
            if takes_time(step, cost[si][pos[si]]) && free[thread_of[si]] > start {
                (start, reason) = (free[thread_of[si]], thread_prev[thread_of[si]]);
            }
            // At equal starts bookkeeping goes first (copies, records,
            // waits), as a CPU backend thread runs every ready bookkeeping
            // item of its lanes before its next launch.
            let work = !matches!(step, Step::Copy { .. } | Step::Record(_) | Step::Wait(_));
            if best.is_none_or(|(b, bw, _, _)| (start, work) < (b, bw)) {
                best = Some((start, work, si, reason));
            }
        }
        let Some((start, _, si, reason)) = best else {
            let stuck: Vec<String> = (0..n)
                .filter(|&si| pos[si] < plan.streams[si].steps.len())
                .map(|si| format!("{} at step {}", plan.stream_name(&plan.streams[si]), pos[si]))
                .collect();
            return Err(CostError::Stuck(stuck.join(", ")));
        };
        let i = pos[si];
        let step = &plan.streams[si].steps[i];
        let dur = if takes_time(step, cost[si][i]) { cost[si][i] } else { 0 };
        let end = start + dur;
        times[si][i] = (start, dur);
        why[si][i] = reason;
        // The latest step that takes time and leads here stands for this one.
        let me = if dur > 0 { Some((si, i)) } else { reason };
        ready[si] = end;
        stream_prev[si] = me;
        if dur > 0 {
            free[thread_of[si]] = end;
            thread_prev[thread_of[si]] = me;
        }
        if let Step::Record(e) = step {
            if let Some(r) = recorded.get_mut(*e) {
                *r = Some((end, me, thread_of[si]));
            }
        }
        pos[si] += 1;
    }
    // The step that ends last (ties: the first found), then back through reasons.
    let mut last: Option<(u64, (usize, usize))> = None;
    for (si, t) in times.iter().enumerate() {
        for (i, &(s, d)) in t.iter().enumerate() {
            if d > 0 && last.is_none_or(|(e, _)| s + d > e) {
                last = Some((s + d, (si, i)));
            }
        }
    }
    let step_ns = last.map_or(0, |(e, _)| e);
    let mut critical = Vec::new();
    let mut cur = last.map(|(_, at)| at);
    while let Some((si, i)) = cur {
        critical.push((si, i));
        // Reasons point at strictly earlier steps that take time: the walk ends.
        cur = why[si][i];
    }
    critical.reverse();
    Ok(Schedule { step_ns, times, critical })
}

/// Whether a step with this cost occupies its thread.
fn takes_time(step: &Step, cost: u64) -> bool {
    cost > 0 && !matches!(step, Step::Record(_) | Step::Wait(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use towers_codegen::{Mode, StreamPlan};
    use towers_graph::{Device, StreamKind};
    use towers_kernels::Kernel;

    fn launch(node: &str) -> Step {
        Step::Launch {
            kernel: Kernel::Fill { value: 0.0 },
            inputs: vec![],
            outputs: vec![],
            workspace: None,
            node: node.into(),
        }
    }

    fn stream(device: Device, kind: StreamKind, steps: Vec<Step>) -> StreamPlan {
        StreamPlan { device, kind, steps }
    }

    /// A fake two-tower step: each tower computes (gpu:i/compute), records;
    /// the host waits for both and updates. Towers cost 5 and 8, the update 2.
    fn towers_plan() -> Plan {
        let (g0, g1, host) = (Device::gpu(0), Device::gpu(1), Device::CPU0);
        Plan {
            program: "train".into(),
            mode: Mode::Train,
            devices: vec![],
            variables: vec![],
            constants: vec![],
            feeds: vec![],
            fetches: vec![],
            tensors: vec![],
            streams: vec![
                stream(host, StreamKind::Compute, vec![Step::Wait(0), Step::Wait(1), launch("update")]),
                stream(g0, StreamKind::Compute, vec![launch("t0/fwd"), launch("t0/bwd"), Step::Record(0)]),
                stream(g1, StreamKind::Compute, vec![launch("t1/fwd"), launch("t1/bwd"), Step::Record(1)]),
            ],
            num_events: 2,
            task: None,
            unread_feeds: Vec::new(),
        }
    }

    fn costs() -> Vec<Vec<u64>> {
        vec![vec![0, 0, 2], vec![2, 3, 0], vec![4, 4, 0]]
    }

    /// Three threads: the towers overlap, the host waits for the slower
    /// tower (4 + 4 = 8), then updates (2): step 10 = max(5, 8) + 2, and the
    /// critical path runs through tower 1.
    /// Workers woken at the step's start begin `wake_ns` late; the
    /// caller's thread (0) does not.
    #[test]
    fn woken_workers_start_late() {
        let s = simulate_woken(&towers_plan(), &[0, 1, 2], &costs(), 0, 4).expect("simulates");
        let plain = simulate(&towers_plan(), &[0, 1, 2], &costs(), 0).expect("simulates");
        assert_eq!(s.step_ns, plain.step_ns + 4);
        assert_eq!(s.times[1][0].0, 4, "a worker's first launch waits for its wake-up");
    }

    /// A copy a tower waits for goes before a launch of the same thread
    /// that could start as early (the CPU backend runs ready bookkeeping
    /// first): gpu:1 starts at 1, not after gpu:0's 10-unit launch.
    #[test]
    fn bookkeeping_goes_before_a_launch_that_could_start_as_early() {
        let (g0, g1) = (Device::gpu(0), Device::gpu(1));
        let copy = Step::Copy {
            from: towers_codegen::BufRef::Variable("w".into()),
            to: towers_codegen::BufRef::Arena { device: 1, buffer: 0 },
            bytes: 4,
            node: "w/read".into(),
        };
        let mut plan = towers_plan();
        plan.streams = vec![
            stream(g0, StreamKind::Compute, vec![launch("t0/fwd")]),
            stream(g0, StreamKind::Copy, vec![copy, Step::Record(0)]),
            stream(g1, StreamKind::Compute, vec![Step::Wait(0), launch("t1/fwd")]),
        ];
        plan.num_events = 1;
        let s = simulate(&plan, &[0, 0, 1], &[vec![10], vec![1, 0], vec![0, 10]], 0).expect("simulates");
        assert_eq!(s.times[1][0], (0, 1), "the copy first");
        assert_eq!(s.times[2][1], (1, 10), "gpu:1 starts when the copy is done");
        assert_eq!(s.step_ns, 11);
    }

    #[test]
    fn towers_overlap_and_the_slower_one_is_critical() {
        let s = simulate(&towers_plan(), &[0, 1, 2], &costs(), 0).expect("simulates");
        assert_eq!(s.step_ns, 10);
        assert_eq!(s.critical, vec![(2, 0), (2, 1), (0, 2)]);
        assert_eq!(s.times[0][2], (8, 2));
        assert_eq!(s.times[1][1], (2, 3));
    }

    /// The host joined to tower 1's thread (the CPU backend with fewer
    /// cores than devices): nothing changes here since the host's update
    /// runs after tower 1 anyway; all on one thread the step is the sum
    /// 2+3+4+4+2 = 15, and the path holds every launch.
    #[test]
    fn a_shared_thread_serializes_its_streams() {
        let s = simulate(&towers_plan(), &[1, 0, 1], &costs(), 0).expect("simulates");
        assert_eq!(s.step_ns, 10);
        let one = simulate(&towers_plan(), &[0, 0, 0], &costs(), 0).expect("simulates");
        assert_eq!(one.step_ns, 15);
        assert_eq!(one.critical.len(), 5);
        // Each step on one thread starts when the one before it on the path ends.
        for w in one.critical.windows(2) {
            let ((a, i), (b, j)) = (w[0], w[1]);
            assert_eq!(one.times[a][i].0 + one.times[a][i].1, one.times[b][j].0);
        }
    }

    /// Making tower 0 the slow one moves the critical path onto it.
    #[test]
    fn the_critical_path_follows_the_costs() {
        let mut c = costs();
        c[1] = vec![6, 6, 0];
        let s = simulate(&towers_plan(), &[0, 1, 2], &c, 0).expect("simulates");
        assert_eq!(s.step_ns, 14);
        assert_eq!(s.critical, vec![(1, 0), (1, 1), (0, 2)]);
    }

    /// A handoff of 3 between threads delays the host's update after the
    /// slower tower (10 + 3); with the host on tower 1's thread only tower
    /// 0's record crosses threads, and it is not the late one (10).
    #[test]
    fn events_between_threads_cost_the_handoff() {
        let s = simulate(&towers_plan(), &[0, 1, 2], &costs(), 3).expect("simulates");
        assert_eq!(s.step_ns, 13);
        assert_eq!(s.times[0][2], (11, 2));
        let joined = simulate(&towers_plan(), &[1, 0, 1], &costs(), 3).expect("simulates");
        assert_eq!(joined.step_ns, 10);
    }

    /// A GPU step: gpu:0 computes (4) and records; its copy stream waits
    /// (GPU to GPU handoff 1) and copies the result down (1), recording for
    /// the host, which waits (bridged: 3) and updates (2): 4+1+1+3+2 = 11.
    /// The copy stream is a lane of its own, so a second compute launch on
    /// gpu:0 (5) overlaps the copy; on one host thread it could not.
    #[test]
    fn gpu_streams_are_lanes_of_their_own_and_events_cost_by_kind() {
        let (g0, host) = (Device::gpu(0), Device::CPU0);
        let copy = Step::Copy {
            from: towers_codegen::BufRef::Arena { device: 1, buffer: 0 },
            to: towers_codegen::BufRef::Arena { device: 0, buffer: 0 },
            bytes: 4,
            node: "grad/down".into(),
        };
        let mut plan = towers_plan();
        plan.streams = vec![
            stream(host, StreamKind::Compute, vec![Step::Wait(1), launch("update")]),
            stream(g0, StreamKind::Compute, vec![launch("fwd"), Step::Record(0), launch("next")]),
            stream(g0, StreamKind::Copy, vec![Step::Wait(0), copy, Step::Record(1)]),
        ];
        plan.num_events = 2;
        let cost = vec![vec![0, 2], vec![4, 0, 5], vec![0, 1, 0]];
        let lanes = Lanes { thread_of: vec![0, 1, 2], gpu: vec![false, true, true] };
        let h = Handoffs { host_ns: 100, gpu_ns: 1, bridge_ns: 3 };
        let s = simulate_lanes(&plan, &lanes, &cost, h, 50).expect("simulates");
        assert_eq!(s.times[2][1], (5, 1), "the copy waits for the record plus the GPU handoff");
        assert_eq!(s.times[0][1], (9, 2), "the host waits for the copy plus the bridge");
        assert_eq!(s.times[1][2], (4, 5), "gpu:0's next launch overlaps the copy on its own lane");
        assert_eq!(s.step_ns, 11, "GPU lanes are not delayed by the host workers' wake-up");
        assert_eq!(s.critical, vec![(1, 0), (2, 1), (0, 1)]);
        // gpu:0's streams on one host thread: the copy waits behind `next`.
        let host_lanes = Lanes { thread_of: vec![0, 1, 1], gpu: vec![false, false] };
        let t = simulate_lanes(&plan, &host_lanes, &cost, h, 0).expect("simulates");
        assert_eq!(t.times[2][1], (4, 1), "bookkeeping first on a shared thread");
        assert_eq!(t.times[1][2], (5, 5));
        // Too few lane kinds for the lanes named: refused.
        let bad = Lanes { thread_of: vec![0, 1, 2], gpu: vec![false] };
        assert!(matches!(simulate_lanes(&plan, &bad, &cost, h, 0), Err(CostError::Shape(_))));
    }

    /// A wait on an event never recorded is an error naming the stuck
    /// stream; costs of the wrong shape are refused.
    #[test]
    fn bad_plans_and_costs_are_errors() {
        let mut p = towers_plan();
        p.streams[2].steps.pop();
        let e = simulate(&p, &[0, 1, 2], &[vec![0, 0, 2], vec![2, 3, 0], vec![4, 4]], 0).expect_err("stuck");
        assert!(e.to_string().contains("cpu:0/compute at step 1"), "{e}");
        let e = simulate(&towers_plan(), &[0, 1], &costs(), 0).expect_err("shape");
        assert!(matches!(e, CostError::Shape(_)), "{e}");
    }
}
