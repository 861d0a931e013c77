//! A plan's predicted step, explained: compute per device, transfer per
//! link (copies between devices, the towers' in-process reductions, the
//! all-reduce across processes), the predicted step and the critical
//! path's costliest items; and the choice of the fastest placement.
//!
//! Invariants:
//! - devices are listed in plan order, links sorted by (from, to), path
//!   items by cost, largest first (ties in path order): the text is
//!   deterministic for given costs;
//! - a launch counts as a reduction when its kernel combines the towers'
//!   gradients in process ([`super::paths::is_reduction`]: `weighted_sum`,
//!   `mean_apply`, `multi_apply`, `gemm_tower_mean`, `gemm_tower_apply`); it
//!   is then a transfer on the link `towers -> <its device>`, not compute;
//! - every link names its copy path ([`CopyPath`]), and a prediction from
//!   a calibration lists the calibration's entry per path;
//! - [`choose`] takes the lowest predicted step; ties go to the earlier
//!   candidate, so listing `cpu` first keeps TF1's default on a tie.

use std::collections::BTreeMap;

use towers_codegen::{BufRef, Plan, Step};
use towers_passes::VarPlacement;

use super::calibrate::Calibration;
pub use super::critical::Lanes;
use super::critical::{simulate_lanes, Handoffs, Schedule};
use super::paths::{is_reduction, CopyPath, PathCost};
use super::CostError;

/// Traffic on one link, predicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// `cpu:0 -> gpu:1`, `towers -> cpu:0` (in-process reduction), `all-reduce`.
    pub name: String,
    /// The way its transfers go (host->device, ...).
    pub path: CopyPath,
    pub steps: usize,
    pub bytes: usize,
    pub ns: u64,
}

/// One item of the critical path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathItem {
    pub stream: String,
    /// The kernel's name, `copy` or `all_reduce`.
    pub kind: String,
    pub node: String,
    pub ns: u64,
}

/// The backend's own latencies, calibrated beside the kernels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latencies {
    /// From a record on one thread to the wait it ends on another.
    pub handoff_ns: u64,
    /// Per step: starting the threads and joining them at the end.
    pub step_ns: u64,
    /// From the step's start to a worker thread's first item (its wake-up).
    pub wake_ns: u64,
    /// From a record on one GPU stream to the wait it ends on another.
    pub gpu_handoff_ns: u64,
    /// Between a host thread and a GPU stream (a bridged event).
    pub bridge_ns: u64,
}

/// A plan's predicted step, explained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prediction {
    /// The critical path plus the per-step latency.
    pub step_ns: u64,
    pub latencies: Latencies,
    /// Per device (plan order): nanoseconds of compute launches.
    pub compute: Vec<(String, u64)>,
    pub links: Vec<Link>,
    /// Steps on the critical path.
    pub path_len: usize,
    /// The path's costliest items, largest first.
    pub top: Vec<PathItem>,
    /// The calibration's entry per copy path ([`super::paths`]), in
    /// [`CopyPath::ALL`] order; empty when predicted from bare costs.
    pub paths: Vec<(CopyPath, PathCost)>,
    /// Whether any stream ran on a GPU lane ([`super::lanes`]).
    pub gpu: bool,
}

/// The threads of the CPU backend for `plan` on `cores` cores, as a thread
/// index per stream ([`towers_runtime::cpu::thread_plans`]).
pub fn cpu_threads(plan: &Plan, cores: usize) -> Result<Vec<usize>, CostError> {
    let threads = towers_runtime::cpu::thread_plans(plan, cores).map_err(CostError::Threads)?;
    plan.streams
        .iter()
        .map(|s| {
            threads
                .iter()
                .position(|t| t.devices.contains(&s.device))
                .ok_or_else(|| CostError::Threads(format!("no thread runs {}", plan.stream_name(s))))
        })
        .collect()
}

/// Predict `plan` on the backend its calibration was measured on (its
/// lanes: [`super::lanes`]), with `cores` cores, from that calibration.
pub fn predict(plan: &Plan, cal: &Calibration, cores: usize, top: usize) -> Result<Prediction, CostError> {
    let lanes = super::lanes::lanes(plan, &cal.backend, cores)?;
    predict_in(plan, cal, &lanes, top)
}

/// [`predict`] on the lanes given (e.g. [`super::lanes::one_gpu_lane`]).
pub fn predict_in(plan: &Plan, cal: &Calibration, lanes: &Lanes, top: usize) -> Result<Prediction, CostError> {
    let costs = cal.step_costs(plan)?;
    let lat = Latencies {
        handoff_ns: cal.handoff_ns,
        step_ns: cal.step_overhead_ns,
        wake_ns: cal.wake_ns,
        gpu_handoff_ns: cal.gpu_handoff_ns,
        bridge_ns: cal.bridge_ns,
    };
    let mut p = predict_lanes(plan, lanes, &costs, lat, top)?;
    p.paths = CopyPath::ALL.iter().filter_map(|&c| cal.paths.get(c.name()).map(|&e| (c, e))).collect();
    Ok(p)
}

/// Predict `plan` with a host thread per stream and a cost per step (fakes in tests).
pub fn predict_with(
    plan: &Plan,
    thread_of: &[usize],
    costs: &[Vec<u64>],
    latencies: Latencies,
    top: usize,
) -> Result<Prediction, CostError> {
    let n = thread_of.iter().copied().max().map_or(0, |m| m + 1);
    let lanes = Lanes { thread_of: thread_of.to_vec(), gpu: vec![false; n] };
    let lat = Latencies { gpu_handoff_ns: latencies.handoff_ns, bridge_ns: latencies.handoff_ns, ..latencies };
    predict_lanes(plan, &lanes, costs, lat, top)
}

/// Predict `plan` on host threads and GPU lanes with a cost per step.
pub fn predict_lanes(
    plan: &Plan,
    lanes: &Lanes,
    costs: &[Vec<u64>],
    latencies: Latencies,
    top: usize,
) -> Result<Prediction, CostError> {
    let handoffs =
        Handoffs { host_ns: latencies.handoff_ns, gpu_ns: latencies.gpu_handoff_ns, bridge_ns: latencies.bridge_ns };
    let Schedule { step_ns, critical, .. } = simulate_lanes(plan, lanes, costs, handoffs, latencies.wake_ns)?;
    let step_ns = step_ns + latencies.step_ns;
    let dev_name = |i: usize| plan.devices.get(i).map(|d| plan.device_name(d.device)).unwrap_or_else(|| "?".into());
    let device_of = |r: &BufRef| match r {
        BufRef::Arena { device, .. } => dev_name(*device),
        BufRef::Variable(n) => plan.variable(n).map(|v| plan.device_name(v.device)).unwrap_or_else(|| "?".into()),
    };
    let mut compute: Vec<(String, u64)> = plan.devices.iter().map(|d| (plan.device_name(d.device), 0)).collect();
    let mut links: BTreeMap<String, Link> = BTreeMap::new();
    let mut add_link = |name: String, path: CopyPath, bytes: usize, ns: u64| {
        let l = links.entry(name.clone()).or_insert(Link { name, path, steps: 0, bytes: 0, ns: 0 });
        l.steps += 1;
        l.bytes += bytes;
        l.ns += ns;
    };
    for (si, s) in plan.streams.iter().enumerate() {
        let dev = plan.device_name(s.device);
        for (i, st) in s.steps.iter().enumerate() {
            let ns = costs[si][i];
            match st {
                Step::Launch { kernel, .. } if is_reduction(kernel.name()) => {
                    let bytes = CopyPath::of_step(plan, st).map_or(0, |(_, b)| b);
                    add_link(format!("towers -> {dev}"), CopyPath::Reduction, bytes, ns);
                }
                Step::Launch { .. } => match compute.iter_mut().find(|(d, _)| *d == dev) {
                    Some((_, t)) => *t += ns,
                    None => compute.push((dev.clone(), ns)),
                },
                Step::Copy { from, to, bytes, .. } => {
                    let path = CopyPath::of_step(plan, st).map_or(CopyPath::HostToHost, |p| p.0);
                    add_link(format!("{} -> {}", device_of(from), device_of(to)), path, *bytes, ns)
                }
                Step::AllReduce { buffers, .. } => {
                    let bytes = buffers.iter().filter_map(|b| plan.buffer(b)).map(|b| b.bytes).sum();
                    add_link("all-reduce".into(), CopyPath::AcrossProcesses, bytes, ns);
                }
                Step::Reduce { root, buffers, .. } => {
                    let bytes = buffers.iter().filter_map(|b| plan.buffer(b)).map(|b| b.bytes).sum();
                    add_link(format!("reduce→rank {root}"), CopyPath::AcrossProcesses, bytes, ns);
                }
                Step::Broadcast { root, buffers, .. } => {
                    let bytes = buffers.iter().filter_map(|b| plan.buffer(b)).map(|b| b.bytes).sum();
                    add_link(format!("broadcast from rank {root}"), CopyPath::AcrossProcesses, bytes, ns);
                }
                Step::Record(_) | Step::Wait(_) => {}
            }
        }
    }
    let mut items: Vec<PathItem> = critical
        .iter()
        .map(|&(si, i)| {
            let s = &plan.streams[si];
            let (kind, node) = match &s.steps[i] {
                Step::Launch { kernel, node, .. } => (kernel.name().to_string(), node.clone()),
                Step::Copy { node, .. } => ("copy".into(), node.clone()),
                Step::AllReduce { node, .. } => ("all_reduce".into(), node.clone()),
                Step::Reduce { node, .. } => ("reduce".into(), node.clone()),
                Step::Broadcast { node, .. } => ("broadcast".into(), node.clone()),
                Step::Record(e) | Step::Wait(e) => ("event".into(), format!("e{e}")),
            };
            PathItem { stream: plan.stream_name(s), kind, node, ns: costs[si][i] }
        })
        .collect();
    let path_len = items.len();
    // Stable: equal costs keep their path order.
    items.sort_by_key(|it| std::cmp::Reverse(it.ns));
    items.truncate(top);
    Ok(Prediction {
        step_ns,
        latencies,
        compute,
        links: links.into_values().collect(),
        path_len,
        top: items,
        paths: Vec::new(),
        gpu: lanes.gpu.iter().any(|g| *g),
    })
}

fn ms(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

impl Prediction {
    /// The prediction as indented lines, under a heading the caller gives.
    pub fn text(&self, heading: &str) -> String {
        let mut out = format!(
            "{heading}: predicted step {} (handoff between threads {}, worker wake-up {}, per-step start and join {})\n",
            ms(self.step_ns),
            ms(self.latencies.handoff_ns),
            ms(self.latencies.wake_ns),
            ms(self.latencies.step_ns)
        );
        if self.gpu {
            out += &format!(
                "  GPU lanes: a stream each (handoff between GPU streams {}, between host and GPU {})\n",
                ms(self.latencies.gpu_handoff_ns),
                ms(self.latencies.bridge_ns)
            );
        }
        let compute: Vec<String> = self.compute.iter().map(|(d, ns)| format!("{d} {}", ms(*ns))).collect();
        out += &format!("  compute per device: {}\n", compute.join(", "));
        if self.links.is_empty() {
            out += "  transfer per link: none\n";
        } else {
            let links: Vec<String> = self
                .links
                .iter()
                .map(|l| format!("{} [{}] {} ({} steps, {} B)", l.name, l.path.name(), ms(l.ns), l.steps, l.bytes))
                .collect();
            out += &format!("  transfer per link: {}\n", links.join("; "));
        }
        if !self.paths.is_empty() {
            let paths: Vec<String> = self.paths.iter().map(|(p, c)| c.text(p.name())).collect();
            out += &format!("  calibrated copy paths: {}\n", paths.join("; "));
        }
        out += &format!("  critical path ({} items), costliest:\n", self.path_len);
        for it in &self.top {
            out += &format!("    {:>10}  {} {} {}\n", ms(it.ns), it.stream, it.kind, it.node);
        }
        out
    }
}

/// A placement chosen by predicted step, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub placement: VarPlacement,
    pub reason: String,
}

/// Predictions this close to the lowest (a fraction of it) are ties: a
/// calibration on a shared machine moves single predictions by a few
/// percent from run to run, and `--variables auto` must not flip between
/// placements on that noise.
pub const TIE_MARGIN: f64 = 0.05;

/// The first candidate (in the order given: the CLI gives cpu, gpu0,
/// round-robin, greedy, TF1's advice first) whose predicted step is within
/// [`TIE_MARGIN`] of the lowest, and a reason naming every candidate's
/// prediction; None without candidates.
pub fn choose(candidates: &[(VarPlacement, Prediction)]) -> Option<Choice> {
    let lowest = candidates.iter().map(|(_, p)| p.step_ns).min()?;
    let tie = (lowest as f64 * (1.0 + TIE_MARGIN)).ceil() as u64;
    let (best, p) = candidates.iter().find(|(_, p)| p.step_ns <= tie)?;
    let others: Vec<String> = candidates
        .iter()
        .filter(|(v, _)| v != best)
        .map(|(v, o)| {
            let pct = 100.0 * (o.step_ns as f64 / p.step_ns.max(1) as f64 - 1.0);
            format!("{} {} (+{pct:.0}%)", v.name(), ms(o.step_ns))
        })
        .collect();
    let mut reason = if p.step_ns == lowest {
        format!("variables={} has the lowest predicted step, {}", best.name(), ms(p.step_ns))
    } else {
        format!(
            "variables={} is within {:.0}% of the lowest predicted step, {} against {} (a tie within the calibration's noise: the first in order wins)",
            best.name(),
            TIE_MARGIN * 100.0,
            ms(p.step_ns),
            ms(lowest)
        )
    };
    if !others.is_empty() {
        reason += &format!("; {}", others.join(", "));
    }
    if let Some(t) = p.top.first() {
        reason += &format!("; its critical path is led by {} {} on {} ({})", t.kind, t.node, t.stream, ms(t.ns));
    }
    Some(Choice { placement: *best, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    use towers_graph::DeviceKind;

    const PLACEMENTS: [VarPlacement; 4] =
        [VarPlacement::Cpu, VarPlacement::Gpu0, VarPlacement::RoundRobin, VarPlacement::Greedy];

    fn plan(vars: VarPlacement) -> Plan {
        crate::cost::test_plan(2, vars)
    }

    /// Fake costs on a fake machine of 8 cores (every device a thread of its
    /// own): each launch costs 10 on a GPU device and `host` on the CPU one,
    /// copies and collectives 1.
    fn fake(plan: &Plan, host: u64) -> Prediction {
        let threads = cpu_threads(plan, 8).expect("threads");
        let costs: Vec<Vec<u64>> = plan
            .streams
            .iter()
            .map(|s| {
                s.steps
                    .iter()
                    .map(|st| match st {
                        Step::Launch { .. } if s.device.kind == DeviceKind::Cpu => host,
                        Step::Launch { .. } => 10,
                        Step::Copy { .. } | Step::AllReduce { .. } | Step::Reduce { .. } | Step::Broadcast { .. } => 1,
                        Step::Record(_) | Step::Wait(_) => 0,
                    })
                    .collect()
            })
            .collect();
        predict_with(plan, &threads, &costs, Latencies::default(), 3).expect("predicts")
    }

    /// With a fast host, keeping the variables there wins (their updates
    /// run beside the towers); with a host 100x slower than a tower device,
    /// any placement that keeps work off it wins, and the reason says so.
    #[test]
    fn auto_picks_the_fastest_predicted_placement() {
        let plans: Vec<(VarPlacement, Plan)> = PLACEMENTS.iter().map(|&v| (v, plan(v))).collect();
        let fast: Vec<(VarPlacement, Prediction)> = plans.iter().map(|(v, p)| (*v, fake(p, 1))).collect();
        let c = choose(&fast).expect("a choice");
        assert_eq!(c.placement, VarPlacement::Cpu, "{}", c.reason);
        let slow: Vec<(VarPlacement, Prediction)> = plans.iter().map(|(v, p)| (*v, fake(p, 1000))).collect();
        let c = choose(&slow).expect("a choice");
        assert_ne!(c.placement, VarPlacement::Cpu, "{}", c.reason);
        let best = slow.iter().map(|(_, p)| p.step_ns).min().expect("min");
        let first_within = slow.iter().find(|(_, p)| p.step_ns as f64 <= best as f64 * (1.0 + TIE_MARGIN));
        assert_eq!(first_within.map(|(v, _)| *v), Some(c.placement), "{}", c.reason);
        assert!(c.reason.starts_with(&format!("variables={} ", c.placement.name())), "{}", c.reason);
        assert!(c.reason.contains("cpu "), "{}", c.reason);
        assert!(choose(&[]).is_none());
    }

    /// Predictions within the margin are ties, broken by the order given
    /// (the same choice on every run whatever the noise); outside it the
    /// lowest wins.
    #[test]
    fn near_ties_go_to_the_first_candidate_in_order() {
        let p = fake(&plan(VarPlacement::Cpu), 1);
        let at = |ns: u64| Prediction { step_ns: ns, ..p.clone() };
        let c = choose(&[(VarPlacement::Cpu, at(1040)), (VarPlacement::Gpu0, at(1000))]).expect("a choice");
        assert_eq!(c.placement, VarPlacement::Cpu, "{}", c.reason);
        assert!(c.reason.contains("within 5% of the lowest predicted step"), "{}", c.reason);
        let c = choose(&[(VarPlacement::Cpu, at(1060)), (VarPlacement::Gpu0, at(1000))]).expect("a choice");
        assert_eq!(c.placement, VarPlacement::Gpu0, "{}", c.reason);
        assert!(c.reason.contains("has the lowest predicted step"), "{}", c.reason);
    }

    /// The explanation adds up: the compute per device and the reductions
    /// account for every launch's fake cost, and the top items are sorted.
    #[test]
    fn the_prediction_accounts_for_every_launch() {
        let p = plan(VarPlacement::Cpu);
        let pred = fake(&p, 3);
        let launches: u64 = p
            .streams
            .iter()
            .flat_map(|s| s.steps.iter().map(move |st| (s.device.kind, st)))
            .map(|(k, st)| match (k, st) {
                (DeviceKind::Cpu, Step::Launch { .. }) => 3,
                (_, Step::Launch { .. }) => 10,
                _ => 0,
            })
            .sum();
        let reduced: u64 = pred.links.iter().filter(|l| l.name.starts_with("towers")).map(|l| l.ns).sum();
        assert_eq!(pred.compute.iter().map(|(_, ns)| ns).sum::<u64>() + reduced, launches);
        assert!(pred.top.windows(2).all(|w| w[0].ns >= w[1].ns));
        assert!(pred.step_ns > 0 && pred.step_ns <= launches + 100);
        let text = pred.text("mlp, 2 towers, variables=cpu");
        assert!(text.contains("compute per device: cpu:0"), "{text}");
        // Each link names its copy path: weights go up, gradients come down.
        for link in
            ["cpu:0 -> gpu:0 [host->device]", "gpu:1 -> cpu:0 [device->host]", "towers -> cpu:0 [in-process reduction]"]
        {
            assert!(text.contains(link), "{link}: {text}");
        }
        assert!(pred.links.iter().all(|l| l.path != CopyPath::DeviceToDevice), "{:?}", pred.links);
        assert!(!text.contains("calibrated copy paths"), "bare costs have no calibration: {text}");
        assert_eq!(text, fake(&p, 3).text("mlp, 2 towers, variables=cpu"), "deterministic");
    }
}
