//! Calibration: what each kernel of a plan, at its shapes, and each copy
//! and collective costs on this machine, measured with a backend's own
//! kernel calls: the CPU backend's ([`Calibration::measure`]) or any
//! session's ([`Calibration::measure_in`]: a CUDA mixed session times its
//! GPU steps with CUDA events, its host steps with the host clock).
//!
//! The plan is loaded in a fresh [`Session`], fed fixed
//! deterministic data, run `warmup` steps untraced, then `steps` steps
//! traced; each traced launch, copy and all-reduce is filed under its
//! [`signature`] (the kernel's name and parameters and its operands'
//! shapes, a copy's bytes and devices), and a signature's cost is the
//! mean of its samples (what a training run's throughput pays). The same traces give the backend's two
//! latencies: an event's handoff between threads and the per-step start
//! and join. Every step runs with the threads, cores and
//! neighbours it has in training, so the costs include what sharing the
//! cores does to a kernel.
//!
//! Invariants:
//! - a [`Calibration`] holds the machine key (which names the backend:
//!   [`machine_key_for`]), the backend and the plan hash it was measured
//!   for; [`Calibration::load`] returns one only when all match, so a CPU
//!   calibration never prices a GPU step, nor the reverse;
//! - lanes ([`super::lanes`]) split the launch gaps and handoffs by kind:
//!   host threads and GPU streams each get their own.
//! - the cache file is `<dir>/<hash of the machine key>/<plan hash>.json`,
//!   written whole (write to a temporary name, then rename);
//! - signatures are sorted (a `BTreeMap`): the JSON is deterministic for
//!   given costs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use towers_codegen::text::kernel_params;
use towers_codegen::{BufRef, Plan, Step};
use towers_graph::{DType, DeviceKind};
use towers_runtime::Session;

use super::paths::{CopyPath, PathCost};
use super::{fnv1a, machine_key, plan_hash, CostError};

/// Measured costs of one plan's kernels on one machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// [`machine_key`] of the machine that measured it.
    pub machine: String,
    /// [`plan_hash`] of the plan it was measured on.
    pub plan_hash: u64,
    /// Traced steps behind each median.
    pub steps: usize,
    /// The mean traced step, nanoseconds (what the plan took while calibrating).
    pub traced_step_ns: u64,
    /// Signature → mean nanoseconds.
    pub costs: BTreeMap<String, u64>,
    /// Mean time from a record to the end of a wait for it that blocked
    /// on another thread (the record's time: the end of the traced step
    /// before it on its stream).
    #[serde(default)]
    pub handoff_ns: u64,
    /// Mean per step of the time before its first item starts plus the
    /// time after its last item ends (waking and joining the threads).
    #[serde(default)]
    pub step_overhead_ns: u64,
    /// Mean time from a step's first item to a worker thread's first
    /// item: the wake-up of a worker asleep between steps (thread 0, the
    /// caller, starts the step itself).
    #[serde(default)]
    pub wake_ns: u64,
    /// Mean idle time on a thread before a launch, since the item before it
    /// on that thread (a launch, copy or passed wait) ended: the runtime's
    /// bookkeeping, and on a loaded machine the time the OS ran another process. Every launch
    /// and collective costs it on top of its kernel ([`Calibration::step_costs`]).
    #[serde(default)]
    pub launch_gap_ns: u64,
    /// The backend it was measured on ([`towers_runtime::Session::backend_name`]:
    /// `cpu`, `cpu+cuda`, `cpu+cuda (one context)`, `cpu+cpu`).
    #[serde(default = "cpu_backend")]
    pub backend: String,
    /// [`Calibration::launch_gap_ns`] on GPU streams (the host's enqueue
    /// latency a traced, eager GPU step shows; 0 on the CPU backend).
    #[serde(default)]
    pub gpu_launch_gap_ns: u64,
    /// Mean handoff of an event between two GPU streams.
    #[serde(default)]
    pub gpu_handoff_ns: u64,
    /// Mean handoff of an event between a host thread and a GPU stream
    /// (each part's times count from its own start of the step, so this is
    /// within a thread wake-up of the truth).
    #[serde(default)]
    pub bridge_ns: u64,
    /// Per copy path ([`CopyPath::name`]): the transfers timed on it, their
    /// bytes and nanoseconds ([`super::paths`]). A copy whose signature was
    /// never timed is priced by its path's cost per byte.
    #[serde(default)]
    pub paths: BTreeMap<String, PathCost>,
}

/// The signature a step's cost is filed under (None for records and waits,
/// which cost nothing): `gemm m=.. n=.. k=.. | f32[256,784] f32[784,256] -> f32[256,256]`,
/// `copy 802816 B cpu:0 -> gpu:1`, `all_reduce 1 buffers 802816 B`.
pub fn signature(plan: &Plan, step: &Step) -> Option<String> {
    let ty = |r: &BufRef| match plan.type_of(r) {
        Some((d, s)) => format!("{}{s:?}", dtype_name(d)),
        None => "?".into(),
    };
    let device = |r: &BufRef| match r {
        BufRef::Arena { device, .. } => plan.devices.get(*device).map(|d| plan.device_name(d.device)),
        BufRef::Variable(n) => plan.variable(n).map(|v| plan.device_name(v.device)),
    };
    match step {
        Step::Launch { kernel, inputs, outputs, .. } => {
            let ins: Vec<String> = inputs.iter().map(ty).collect();
            let outs: Vec<String> = outputs.iter().map(ty).collect();
            Some(format!("{} {} | {} -> {}", kernel.name(), kernel_params(kernel), ins.join(" "), outs.join(" ")))
        }
        Step::Copy { from, to, bytes, .. } => Some(format!(
            "copy {bytes} B {} -> {}",
            device(from).unwrap_or_else(|| "?".into()),
            device(to).unwrap_or_else(|| "?".into())
        )),
        Step::AllReduce { buffers, .. } => {
            let bytes: usize = buffers.iter().filter_map(|b| plan.buffer(b)).map(|b| b.bytes).sum();
            Some(format!("all_reduce {} buffers {bytes} B", buffers.len()))
        }
        Step::Reduce { root, buffers, .. } => {
            let bytes: usize = buffers.iter().filter_map(|b| plan.buffer(b)).map(|b| b.bytes).sum();
            Some(format!("reduce to {root} {} buffers {bytes} B", buffers.len()))
        }
        Step::Broadcast { root, buffers, .. } => {
            let bytes: usize = buffers.iter().filter_map(|b| plan.buffer(b)).map(|b| b.bytes).sum();
            Some(format!("broadcast from {root} {} buffers {bytes} B", buffers.len()))
        }
        Step::Record(_) | Step::Wait(_) => None,
    }
}

fn cpu_backend() -> String {
    "cpu".into()
}

/// The machine key of calibrations measured in `sess` (before it loads
/// any program): [`machine_key`], the backend's name, and for a backend
/// other than the CPU's its note (the GPU's name and architecture, how the
/// devices map).
pub fn machine_key_for(sess: &Session) -> String {
    match sess.backend_name() {
        "cpu" => format!("{} | backend cpu", machine_key()),
        name => format!("{} | backend {name} | {}", machine_key(), sess.backend_note()),
    }
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::I32 => "i32",
        DType::Bool => "bool",
    }
}

/// The mean (0 for none): a chain of steps costs the sum of its items'
/// means on average, where the sum of medians falls short whenever the
/// times are skewed (a preempted kernel, a cold cache).
fn mean(v: &[u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    (v.iter().map(|&x| x as u128).sum::<u128>() / v.len() as u128) as u64
}

impl Calibration {
    /// Measure `plan` on this machine: `warmup` untraced steps, then
    /// `steps` traced ones (at least one).
    pub fn measure(plan: &Plan, warmup: usize, steps: usize) -> Result<Calibration, CostError> {
        Calibration::measure_in(&mut Session::new(0), plan, warmup, steps)
    }

    /// Measure `plan` in `sess`, a session with no program loaded yet (its
    /// backend's note is part of the key): loaded as `calibrate`, `warmup`
    /// untraced steps, then `steps` traced ones (at least one).
    pub fn measure_in(sess: &mut Session, plan: &Plan, warmup: usize, steps: usize) -> Result<Calibration, CostError> {
        let steps = steps.max(1);
        let machine = machine_key_for(sess);
        let backend = sess.backend_name().to_string();
        sess.load("calibrate", plan.clone())?;
        for (name, r) in &plan.feeds {
            let Some((dtype, shape)) = plan.type_of(r) else { continue };
            let len: usize = shape.iter().product();
            match dtype {
                // Small varied values: no kernel sees only zeros (a branch or
                // a denormal could make it cheaper than in training).
                DType::F32 => {
                    let data: Vec<f32> = (0..len).map(|i| (i % 17) as f32 * 0.05).collect();
                    sess.feed("calibrate", name, &data)?;
                }
                // Class 0 is valid for every label feed.
                DType::I32 | DType::Bool => sess.feed("calibrate", name, &vec![0; len])?,
            }
        }
        for _ in 0..warmup {
            sess.run("calibrate")?;
        }
        // Per plan step, the signature it is filed under (computed once).
        let sigs: Vec<Vec<Option<String>>> =
            plan.streams.iter().map(|s| s.steps.iter().map(|st| signature(plan, st)).collect()).collect();
        let step_paths: Vec<Vec<Option<(CopyPath, usize)>>> =
            plan.streams.iter().map(|s| s.steps.iter().map(|st| CopyPath::of_step(plan, st)).collect()).collect();
        let mut paths: BTreeMap<String, PathCost> = BTreeMap::new();
        let mut samples: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut step_times = Vec::with_capacity(steps);
        let (mut handoffs, mut overheads, mut gaps) = (Vec::new(), Vec::with_capacity(steps), Vec::new());
        let (mut wakes, mut gpu_gaps, mut gpu_handoffs, mut bridges) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let lanes = super::lanes::lanes(plan, &backend, super::cores())?;
        let threads = &lanes.thread_of;
        let mut by_thread: Vec<Vec<(u64, u64, bool)>> = vec![Vec::new(); lanes.gpu.len()];
        // Where each event is recorded: (stream, step index).
        let mut record_at = vec![None; plan.num_events];
        for (si, s) in plan.streams.iter().enumerate() {
            for (i, st) in s.steps.iter().enumerate() {
                if let Step::Record(e) = st {
                    if let Some(r) = record_at.get_mut(*e) {
                        *r = Some((si, i));
                    }
                }
            }
        }
        let mut spans: Vec<Vec<Option<(u64, u64)>>> = plan.streams.iter().map(|s| vec![None; s.steps.len()]).collect();
        sess.set_tracing("calibrate", true)?;
        for _ in 0..steps {
            sess.run("calibrate")?;
            let t = sess.trace("calibrate")?;
            step_times.push(t.dur_ns);
            spans.iter_mut().for_each(|s| s.iter_mut().for_each(|x| *x = None));
            let (mut first, mut last) = (u64::MAX, 0u64);
            for e in &t.events {
                if let Some(x) = spans.get_mut(e.stream).and_then(|s| s.get_mut(e.index)) {
                    *x = Some((e.start_ns, e.start_ns + e.dur_ns));
                }
                first = first.min(e.start_ns);
                last = last.max(e.start_ns + e.dur_ns);
            }
            if first <= last {
                overheads.push(first + t.dur_ns.saturating_sub(last));
            }
            // Per thread, its items by start: a launch's gap is the idle time
            // since the item before it on its thread ended.
            by_thread.iter_mut().for_each(Vec::clear);
            for e in &t.events {
                let work = matches!(
                    plan.streams.get(e.stream).and_then(|s| s.steps.get(e.index)),
                    Some(Step::Launch { .. } | Step::AllReduce { .. } | Step::Reduce { .. } | Step::Broadcast { .. })
                );
                if let Some(v) = threads.get(e.stream).and_then(|&th| by_thread.get_mut(th)) {
                    v.push((e.start_ns, e.start_ns + e.dur_ns, work));
                }
            }
            for (th, v) in by_thread.iter_mut().enumerate() {
                v.sort_unstable();
                let gpu = lanes.gpu[th];
                if let (true, Some(&(a, _, _))) = (th > 0 && !gpu, v.first()) {
                    wakes.push(a.saturating_sub(first));
                }
                let mut end = None;
                for &(a, b, work) in v.iter() {
                    if let (true, Some(e)) = (work, end) {
                        if gpu { &mut gpu_gaps } else { &mut gaps }.push(a.saturating_sub(e));
                    }
                    end = Some(end.map_or(b, |e: u64| e.max(b)));
                }
            }
            for e in t.events.iter().filter(|e| e.kind == "wait") {
                let Some(Step::Wait(ev)) = plan.streams.get(e.stream).and_then(|s| s.steps.get(e.index)) else {
                    continue;
                };
                let Some((rs, ri)) = record_at.get(*ev).copied().flatten() else { continue };
                let (Some(&from), Some(&to)) = (threads.get(rs), threads.get(e.stream)) else { continue };
                if from == to {
                    continue;
                }
                let kind = match (lanes.gpu[from], lanes.gpu[to]) {
                    (false, false) => &mut handoffs,
                    (true, true) => &mut gpu_handoffs,
                    _ => &mut bridges,
                };
                let recorded = spans[rs][..ri].iter().rev().find_map(|x| x.map(|(_, end)| end)).unwrap_or(0);
                let end = e.start_ns + e.dur_ns;
                // Only a wait that blocked shows the handoff.
                if e.start_ns < recorded && end >= recorded {
                    kind.push(end - recorded);
                }
            }
            for e in &t.events {
                if let Some(Some(sig)) = sigs.get(e.stream).and_then(|s| s.get(e.index)) {
                    samples.entry(sig.clone()).or_default().push(e.dur_ns);
                }
                if let Some(Some((path, bytes))) = step_paths.get(e.stream).and_then(|s| s.get(e.index)) {
                    paths.entry(path.name().to_string()).or_default().add(*bytes, e.dur_ns);
                }
            }
        }
        sess.set_tracing("calibrate", false)?;
        let costs = samples.into_iter().map(|(k, v)| (k, mean(&v))).collect();
        Ok(Calibration {
            machine,
            backend,
            gpu_launch_gap_ns: mean(&gpu_gaps),
            gpu_handoff_ns: mean(&gpu_handoffs),
            bridge_ns: mean(&bridges),
            plan_hash: plan_hash(plan),
            steps,
            traced_step_ns: mean(&step_times),
            costs,
            handoff_ns: mean(&handoffs),
            step_overhead_ns: mean(&overheads),
            wake_ns: mean(&wakes),
            launch_gap_ns: mean(&gaps),
            paths,
        })
    }

    /// The cached calibration of `plan` on this machine under `dir`, or a
    /// fresh one (then written there). The flag says whether it came from the cache.
    pub fn cached(dir: &Path, plan: &Plan, warmup: usize, steps: usize) -> Result<(Calibration, bool), CostError> {
        Calibration::cached_in(dir, Session::new(0), plan, warmup, steps)
    }

    /// [`Calibration::cached`] in `sess` (a fresh session of the backend to
    /// calibrate on, consumed: a cache miss measures in it).
    pub fn cached_in(
        dir: &Path,
        mut sess: Session,
        plan: &Plan,
        warmup: usize,
        steps: usize,
    ) -> Result<(Calibration, bool), CostError> {
        let (machine, hash) = (machine_key_for(&sess), plan_hash(plan));
        if let Some(c) = Calibration::load(dir, &machine, hash) {
            return Ok((c, true));
        }
        let c = Calibration::measure_in(&mut sess, plan, warmup, steps)?;
        c.save(dir)?;
        Ok((c, false))
    }

    /// The cache file of a machine key and plan hash under `dir`.
    pub fn path(dir: &Path, machine: &str, plan_hash: u64) -> PathBuf {
        dir.join(format!("{:016x}", fnv1a(machine.as_bytes()))).join(format!("{plan_hash:016x}.json"))
    }

    /// The calibration cached under `dir` for this machine key and plan
    /// hash; None when there is none, it does not parse, or its key differs
    /// (the key names the backend, and so must the file: [`machine_key_for`]).
    pub fn load(dir: &Path, machine: &str, plan_hash: u64) -> Option<Calibration> {
        let text = std::fs::read_to_string(Calibration::path(dir, machine, plan_hash)).ok()?;
        let c: Calibration = serde_json::from_str(&text).ok()?;
        let backend = machine.split(" | backend ").nth(1).map(|b| b.split(" | ").next().unwrap_or(b));
        (c.machine == machine && c.plan_hash == plan_hash && backend == Some(c.backend.as_str())).then_some(c)
    }

    /// Write this calibration to its cache file under `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), CostError> {
        let path = Calibration::path(dir, &self.machine, self.plan_hash);
        let err = |source| CostError::Cache { path: path.clone(), source };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(err)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| err(std::io::Error::other(e)))?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text).map_err(err)?;
        std::fs::rename(&tmp, &path).map_err(err)
    }

    /// The cost of every step of `plan` (per stream, per step): a launch's
    /// or collective's measured mean plus the launch gap, a copy's measured
    /// mean (or, for a copy never timed at its size and devices, its
    /// path's cost per byte: [`PathCost::predict`]), records and waits
    /// free; an error names the first signature this calibration lacks.
    pub fn step_costs(&self, plan: &Plan) -> Result<Vec<Vec<u64>>, CostError> {
        plan.streams
            .iter()
            .map(|s| {
                s.steps
                    .iter()
                    .map(|st| match signature(plan, st) {
                        None => Ok(0),
                        Some(sig) => {
                            let gap = match st {
                                Step::Copy { .. } => 0,
                                _ if s.device.kind == DeviceKind::Gpu && self.backend != "cpu" => {
                                    self.gpu_launch_gap_ns
                                }
                                _ => self.launch_gap_ns,
                            };
                            if let Some(c) = self.costs.get(&sig) {
                                return Ok(c + gap);
                            }
                            match (st, CopyPath::of_step(plan, st)) {
                                (Step::Copy { .. }, Some((path, bytes))) => self
                                    .paths
                                    .get(path.name())
                                    .map(|p| p.predict(bytes))
                                    .ok_or(CostError::Uncalibrated(sig)),
                                _ => Err(CostError::Uncalibrated(sig)),
                            }
                        }
                    })
                    .collect()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use towers_passes::VarPlacement;

    /// A measured calibration covers every step of its plan, is written and
    /// read back equal under its plan's hash, and is not found under
    /// another plan's hash or another machine's key.
    #[test]
    fn the_cache_round_trips_keyed_by_machine_and_plan_hash() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (p1, p2) = (crate::cost::test_plan(1, VarPlacement::Cpu), crate::cost::test_plan(2, VarPlacement::Cpu));
        assert_ne!(plan_hash(&p1), plan_hash(&p2));
        assert_eq!(plan_hash(&p1), plan_hash(&crate::cost::test_plan(1, VarPlacement::Cpu)), "the hash is stable");
        let (c, cached) = Calibration::cached(dir.path(), &p2, 1, 2).expect("calibrates");
        assert!(!cached);
        let costs = c.step_costs(&p2).expect("every signature was measured");
        assert_eq!(costs.len(), p2.streams.len());
        let (again, cached) = Calibration::cached(dir.path(), &p2, 1, 2).expect("loads");
        assert!(cached);
        assert_eq!(again, c);
        assert!(Calibration::load(dir.path(), &c.machine, plan_hash(&p1)).is_none());
        assert!(Calibration::load(dir.path(), "another machine", c.plan_hash).is_none());
        // A file under the right name but for another plan is not used.
        let forged = Calibration { plan_hash: plan_hash(&p1), ..c.clone() };
        let path = Calibration::path(dir.path(), &c.machine, c.plan_hash);
        std::fs::write(&path, serde_json::to_string(&forged).expect("json")).expect("write");
        assert!(Calibration::load(dir.path(), &c.machine, c.plan_hash).is_none());
        // The one-tower plan has kernels at other shapes: the two-tower
        // calibration lacks them, and says which.
        let e = c.step_costs(&p1).expect_err("other shapes");
        assert!(matches!(e, CostError::Uncalibrated(_)), "{e}");
    }

    /// Measured in a mixed session (the CPU-only pair, standing in for a
    /// CUDA one): the calibration names that backend, its key differs from
    /// the CPU backend's, every step of the plan is priced, and a cache
    /// holding one backend's calibration never serves the other's.
    #[test]
    fn a_calibration_in_another_backend_is_keyed_by_it() {
        use towers_runtime::mixed::MixedBackend;
        let pair = || Session::with_backend(0, Box::new(MixedBackend::cpu_pair().expect("pair")));
        let p = crate::cost::test_plan(2, VarPlacement::Cpu);
        let dir = tempfile::tempdir().expect("tempdir");
        let (c, cached) = Calibration::cached_in(dir.path(), pair(), &p, 1, 2).expect("calibrates");
        assert!(!cached);
        assert_eq!(c.backend, "cpu+cpu");
        assert!(c.machine.contains(" | backend cpu+cpu | "), "{}", c.machine);
        assert_ne!(c.machine, machine_key_for(&Session::new(0)));
        let costs = c.step_costs(&p).expect("every step priced");
        assert_eq!(costs.len(), p.streams.len());
        // Copies between the parts are real copies, timed on their paths.
        assert!(c.paths.contains_key("host->device") && c.paths.contains_key("device->host"), "{:?}", c.paths);
        // The pair's second part is modelled as GPU lanes: a prediction has them.
        let pred = crate::cost::predict(&p, &c, 8, 3).expect("predicts");
        assert!(pred.gpu && pred.step_ns > 0);
        assert!(pred.text("pair").contains("GPU lanes: a stream each"));
        // The CPU backend's key finds nothing in this cache; the pair's does.
        assert!(Calibration::load(dir.path(), &machine_key_for(&Session::new(0)), c.plan_hash).is_none());
        assert!(Calibration::cached_in(dir.path(), pair(), &p, 1, 2).expect("loads").1);
        let (cpu, cached) = Calibration::cached_in(dir.path(), Session::new(0), &p, 1, 2).expect("calibrates");
        assert!(!cached && cpu.backend == "cpu");
        // A file claiming another backend under this key is refused.
        let forged = Calibration { backend: "cpu".into(), ..c.clone() };
        forged.save(dir.path()).expect("saves");
        assert!(Calibration::load(dir.path(), &c.machine, c.plan_hash).is_none());
    }

    /// A calibration keeps one entry per copy path its plan takes (the
    /// sums of its traced transfers), and prices a copy it never timed by
    /// its path's cost per byte.
    #[test]
    fn a_calibration_has_an_entry_per_copy_path() {
        let p = crate::cost::test_plan(2, VarPlacement::Cpu);
        let c = Calibration::measure(&p, 1, 2).expect("calibrates");
        let mut expected: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for st in p.streams.iter().flat_map(|s| &s.steps) {
            if let Some((path, bytes)) = CopyPath::of_step(&p, st) {
                let e = expected.entry(path.name().to_string()).or_default();
                e.0 += 2; // two traced steps
                e.1 += 2 * bytes as u64;
            }
        }
        assert!(expected.contains_key("host->device") && expected.contains_key("device->host"), "{expected:?}");
        let got: BTreeMap<String, (u64, u64)> = c.paths.iter().map(|(k, v)| (k.clone(), (v.items, v.bytes))).collect();
        assert_eq!(got, expected);
        // Forget one copy's signature: it is priced by its path instead.
        let (si, i) = p
            .streams
            .iter()
            .enumerate()
            .find_map(|(si, s)| s.steps.iter().position(|st| matches!(st, Step::Copy { .. })).map(|i| (si, i)))
            .expect("a copy");
        let sig = signature(&p, &p.streams[si].steps[i]).expect("a signature");
        let mut forgot = c.clone();
        forgot.costs.remove(&sig);
        let (path, bytes) = CopyPath::of_step(&p, &p.streams[si].steps[i]).expect("a path");
        let costs = forgot.step_costs(&p).expect("priced by its path");
        assert_eq!(costs[si][i], c.paths[path.name()].predict(bytes));
        // Without the path either, the signature is named.
        forgot.paths.remove(path.name());
        assert!(matches!(forgot.step_costs(&p), Err(CostError::Uncalibrated(s)) if s == sig));
    }
}
