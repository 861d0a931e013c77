//! Training's shared parts: its errors ([`TrainError`]), the backend
//! choice and session ([`BackendChoice`], [`open_session`]), the progress
//! callbacks ([`TrainObserver`]), the report and the evaluation; [`train`]
//! runs a seed model through the one training loop, [`crate::trainer`]'s.
//!
//! The library never prints: progress goes to a [`TrainObserver`] the caller
//! supplies (the CLI prints `step N loss L` lines and a progress bar).
//! A training step allocates nothing: the batch buffers are allocated once and
//! the session's buffers were planned at load.

use std::sync::Arc;

use thiserror::Error;
use towers_runtime::comm::{Comm, LocalComm};
use towers_runtime::cuda::{self, CudaBackend, CudaUnavailable};
use towers_runtime::devices::{BackendKind, Machine};
use towers_runtime::{CpuBackend, RuntimeError, Session};

pub use crate::config::{LrScheduleKind, OptimizerKind, TrainConfig};

use crate::compiler::CompileError;
use crate::data::{DataError, Dataset, EvalChunks};

/// Errors of a training run.
#[derive(Debug, Error)]
pub enum TrainError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Graph(#[from] towers_graph::GraphError),
    #[error("invalid training options: {0}")]
    Options(String),
    /// An option out of its range: `flag` is the command line's name of
    /// the [`TrainConfig`] field (`--lr` for `lr`, `--checkpoint-every` for `checkpoint_every`).
    #[error("invalid training options: --{flag}: {reason}")]
    InvalidOption { flag: &'static str, reason: String },
    /// The model's names or graph do not fit together or the data set.
    #[error(transparent)]
    Model(#[from] crate::trainer::ModelError),
    /// `--resume` met a checkpoint of another model (see [`crate::resume`]).
    #[error("--resume: {0}")]
    Resume(String),
    #[error("--backend cuda: {0}")]
    Cuda(#[from] CudaUnavailable),
    /// A device of the run that this machine cannot serve on the chosen
    /// backend ([`check_devices`]), found before anything is loaded.
    /// (The flag is named where the backend is the cause: a GPU device
    /// without CUDA; a second host device is refused on every backend.)
    #[error("{}{source}", match source { towers_runtime::devices::Unservable::NoCuda { .. } => format!("--backend {backend}: "), _ => String::new() })]
    Unservable { backend: &'static str, source: towers_runtime::devices::Unservable },
    #[error("--backend cuda across processes: {0}")]
    Nccl(String),
    /// The mixed session (host part and CUDA part) could not be made.
    #[error("--backend cuda: {0}")]
    Mixed(String),
    #[error("--trace: {0}")]
    Trace(#[from] crate::trace::TraceError),
    /// The loss left the finite numbers: the run stops, and nothing is
    /// checkpointed from the diverged state.
    #[error("the loss is {loss} at step {step}: training diverged (try a smaller --lr){}; no checkpoint was written from this state", origin.as_ref().map(|o| format!("; {o}")).unwrap_or_default())]
    NonFiniteLoss { step: usize, loss: f32, origin: Option<String> },
    /// The variables left the finite numbers while the loss had not: the
    /// run stops, and the state is not saved.
    #[error(
        "training diverged: {0}; try a smaller --lr (--check-numerics names the first node whose output is not finite)"
    )]
    NonFiniteState(String),
    /// The planned buffers do not fit in the backend's memory.
    #[error("the {program} program needs {planned_gib:.2} GiB ({detail}), but the {backend} backend has only {available_gib:.2} GiB available; use a smaller --batch{}", if backend == "cpu" { " or fewer --towers (on the cpu backend every tower lives in the same host memory)" } else { ", or more --towers on more devices" })]
    Memory { program: String, backend: String, planned_gib: f64, available_gib: f64, detail: String },
}

/// Which backend runs the programs (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// The CPU backend: every device runs as a CPU device.
    #[default]
    Cpu,
    /// The CUDA backend; an error naming the missing library when it cannot start.
    Cuda,
    /// CUDA when a driver, a GPU, NVRTC and cuBLAS are all present, else the CPU.
    Auto,
}

impl std::str::FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(BackendChoice::Cpu),
            "cuda" => Ok(BackendChoice::Cuda),
            "auto" => Ok(BackendChoice::Auto),
            other => Err(format!("unknown backend '{other}' (cpu, cuda or auto)")),
        }
    }
}

/// A session on the chosen backend, and a line saying which one runs and
/// why. CUDA runs as a mixed session (`MixedBackend::with_cuda`): `cpu:*`
/// on host threads with pinned memory, `gpu:*` on CUDA contexts, one per
/// logical GPU unless `one_context`. With several processes the CUDA part
/// reduces the buckets it holds over NCCL, set up over `comm` (feature
/// `nccl`; without it, an error); buckets on the host go through `comm`.
pub fn open_session(
    choice: BackendChoice,
    seed: u64,
    comm: &Arc<dyn Comm>,
    cuda_graphs: bool,
    one_context: bool,
) -> Result<(Session, String), TrainError> {
    let cuda_session = |why: &str| -> Result<(Session, String), TrainError> {
        let b = CudaBackend::new()?.with_graphs(cuda_graphs);
        let contexts = match (one_context, comm.world_size() > 1) {
            (true, true) => {
                "one context on GPU 0 for every gpu:* (NCCL's all-reduce across processes runs in one context)"
            }
            (true, false) => "one context on GPU 0 for every gpu:*",
            (false, _) => "a CUDA context per gpu:*",
        };
        let line = format!("backend: cuda on {}{why}: cpu:* on the host (pinned memory), {contexts}", b.device());
        let b = with_nccl(b, comm)?;
        let m = towers_runtime::mixed::MixedBackend::with_cuda(b, one_context)
            .map_err(|e| TrainError::Mixed(e.to_string()))?;
        Ok((Session::with_backend(seed, Box::new(m)), line))
    };
    match choice {
        BackendChoice::Cpu => Ok((Session::with_backend(seed, Box::new(CpuBackend::new())), "backend: cpu".into())),
        BackendChoice::Cuda => Ok(cuda_session("")?),
        BackendChoice::Auto => {
            match cuda::available().map_err(TrainError::from).and_then(|_| cuda_session(" (auto)")) {
                Ok(s) => Ok(s),
                Err(e) => {
                    Ok((Session::with_backend(seed, Box::new(CpuBackend::new())), format!("backend: cpu (auto: {e})")))
                }
            }
        }
    }
}

impl BackendChoice {
    /// The flag's value, as written on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Cpu => "cpu",
            BackendChoice::Cuda => "cuda",
            BackendChoice::Auto => "auto",
        }
    }

    /// Which backend this choice runs the devices on, on `machine` (the one
    /// place that maps a `--backend` to a [`BackendKind`]): `auto` takes
    /// CUDA where the machine has a GPU.
    pub fn kind(self, machine: &Machine) -> BackendKind {
        match self {
            BackendChoice::Cpu => BackendKind::Cpu,
            BackendChoice::Cuda => BackendKind::Mixed { pinned: true },
            BackendChoice::Auto if machine.gpus() > 0 => BackendKind::Mixed { pinned: true },
            BackendChoice::Auto => BackendKind::Cpu,
        }
    }
}

/// The devices a run of `cfg` asks for, known before compiling: the host,
/// the towers (`/gpu:0` .. `/gpu:N-1`), and every concrete device a node
/// of `graph` (a `--graph` model) requests; sorted.
pub fn requested_devices(cfg: &TrainConfig, graph: Option<&towers_graph::Graph>) -> Vec<towers_graph::Device> {
    let mut v = vec![towers_graph::Device::CPU0];
    v.extend(cfg.tower_devices());
    if let Some(g) = graph {
        v.extend(g.node_ids().into_iter().filter_map(|id| g.node(id).requested_device.concrete()));
    }
    v.sort();
    v.dedup();
    v
}

/// Refuse, at the start of a run, a device this machine cannot serve on
/// the chosen backend ([`towers_runtime::devices::check`]): a `/gpu:N`
/// under `--backend cuda` on a machine with no CUDA GPU, or a host device
/// other than `/cpu:0`. The error names the device, what the machine has
/// and how to map it. (`Session::load` checks every plan again.)
pub fn check_devices(
    choice: BackendChoice,
    devices: &[towers_graph::Device],
    machine: &Machine,
) -> Result<(), TrainError> {
    towers_runtime::devices::check(devices, choice.kind(machine), machine)
        .map_err(|source| TrainError::Unservable { backend: choice.name(), source })
}

/// `b` with NCCL over `comm` when `comm` has several ranks.
#[cfg(feature = "nccl")]
fn with_nccl(b: CudaBackend, comm: &Arc<dyn Comm>) -> Result<CudaBackend, TrainError> {
    if comm.world_size() == 1 {
        return Ok(b);
    }
    b.with_nccl(&**comm).map_err(|e| TrainError::Nccl(e.to_string()))
}

/// `b`, when `comm` has one rank: this towers was built without NCCL.
#[cfg(not(feature = "nccl"))]
fn with_nccl(b: CudaBackend, comm: &Arc<dyn Comm>) -> Result<CudaBackend, TrainError> {
    if comm.world_size() == 1 {
        return Ok(b);
    }
    Err(TrainError::Nccl(format!(
        "{} processes on the CUDA backend reduce over NCCL, and this towers was built without it: build with `cargo build --release --features mpi,nccl` (or train these processes with --backend cpu)",
        comm.world_size()
    )))
}

/// Progress callbacks.
pub trait TrainObserver {
    /// Before the first step: the total steps and what the backend said.
    fn start(&mut self, _total_steps: usize, _backend_note: &str) {}
    /// The step's training accuracy (models that name one), combined
    /// across towers by share; called just before [`TrainObserver::step`].
    fn train_accuracy(&mut self, _step: usize, _accuracy: f32) {}
    /// After each step with its loss; `examples_per_sec` over the run so far.
    fn step(&mut self, _step: usize, _loss: f32, _examples_per_sec: f64) {}
    /// The placed, scheduled training graph, once compiled (before `start`).
    fn compiled(&mut self, _graph: &towers_graph::Graph) {}
    /// Test accuracy after `step` (during training when evaluation is
    /// periodic, and once at the end of the run).
    fn eval(&mut self, _step: usize, _accuracy: f64) {}
    /// The learning rate of `step`, when a schedule sets it.
    fn learning_rate(&mut self, _step: usize, _lr: f32) {}
}

/// An observer that records nothing.
pub struct Quiet;
impl TrainObserver for Quiet {}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct TrainReport {
    /// (step, loss) at every `log_every` step, and the last step.
    pub losses: Vec<(usize, f32)>,
    /// (step, training accuracy) at the same steps as `losses`, when the
    /// model names an accuracy (empty otherwise).
    pub train_accuracies: Vec<(usize, f32)>,
    /// The run's last global step (`--steps`, or `--epochs` in steps).
    pub steps: usize,
    /// The steps this run trained: `steps` less those a resumed checkpoint
    /// had taken (0 when it was already at or past `steps`).
    pub trained: usize,
    pub test_accuracy: f64,
    pub examples_per_sec: f64,
    pub backend_note: String,
    /// Warnings from the compiler (e.g. variables without gradients).
    pub diagnostics: Vec<String>,
    /// (step, test accuracy) of every periodic evaluation (`eval_every`).
    pub evals: Vec<(usize, f64)>,
    /// `--ps-async`: the staleness of the applied gradients (gathered on
    /// rank 0) and the variables' digest.
    pub ps_async: Option<crate::trainer::AsyncReport>,
}

/// Train the seed model `cfg` describes ([`TrainConfig::model`]) in this
/// process alone and evaluate it on the test split ([`crate::trainer::fit`]
/// trains a model of your own).
pub fn train(cfg: &TrainConfig, obs: &mut dyn TrainObserver) -> Result<TrainReport, TrainError> {
    train_in(cfg, Arc::new(LocalComm::single()), obs)
}

/// [`train`] as one rank of `comm`: see [`crate::trainer::fit_in`], whose
/// loop this is.
pub fn train_in(
    cfg: &TrainConfig,
    comm: Arc<dyn Comm>,
    obs: &mut dyn TrainObserver,
) -> Result<TrainReport, TrainError> {
    crate::trainer::fit_seed_in(cfg, comm, obs)
}

/// Accuracy of the loaded "eval" program over a data set, every example counted once.
pub fn evaluate(
    sess: &mut Session,
    data: &Dataset,
    chunk: usize,
    images_name: &str,
    labels_name: &str,
) -> Result<f64, TrainError> {
    let mut chunks = EvalChunks::new(data, chunk)?;
    let fed_labels = sess.plan("eval")?.feeds.iter().any(|(n, _)| n == labels_name);
    let (mut correct, mut seen) = (0usize, 0usize);
    loop {
        let examples = chunks.peek();
        if examples.is_empty() {
            break;
        }
        // Each chunk straight into the feeds' memory, as in training.
        sess.feed_with("eval", images_name, |b| chunks.fill_images(b))??;
        if fed_labels {
            sess.feed_with("eval", labels_name, |b| chunks.fill_labels(b))??;
        }
        sess.run("eval")?;
        let pred = sess.fetch::<i32>("eval", "predictions")?;
        let labels = &data.labels()[examples.clone()];
        correct += pred.iter().zip(labels).filter(|(p, l)| p == l).count();
        seen += examples.len();
        chunks.advance();
    }
    Ok(if seen == 0 { 0.0 } else { correct as f64 / seen as f64 })
}

/// The parameter-server half of a step under `--variables ps` across
/// processes (see `towers_passes::ps_exchange`): the bytes of the owners'
/// value broadcasts (which the plan runs inside each step), the checkpoint
/// agreement and slot gather, and the names of the optimizer slots,
/// which live on their owner only (so the replica check leaves them out).
pub struct PsStep {
    exchange: towers_runtime::comm::ValueExchange,
    slots: std::collections::BTreeSet<String>,
    /// Every owning rank's (rank, slots, their shapes), ranks ascending.
    owners: Vec<(usize, Vec<String>, Vec<Vec<usize>>)>,
    /// Bytes of optimizer slots this rank holds, and in all ranks together.
    pub slot_bytes: (usize, usize),
}

impl PsStep {
    /// The exchange for a compiled training program loaded as `program`;
    /// `None` when it has no owners (one process, or no `--variables ps`).
    pub fn new(
        sess: &Session,
        program: &str,
        state: &towers_passes::CompileState,
    ) -> Result<Option<PsStep>, TrainError> {
        if state.ps_groups.is_empty() {
            return Ok(None);
        }
        let groups: Vec<(usize, Vec<String>)> = state.ps_groups.iter().map(|g| (g.rank, g.variables.clone())).collect();
        let exchange = towers_runtime::comm::ValueExchange::new(sess, program, &groups)?;
        let slots: std::collections::BTreeSet<String> =
            state.ps_groups.iter().flat_map(|g| g.slots.iter().cloned()).collect();
        let bytes = |name: &str| {
            let plan = sess.plan(program).ok()?;
            let d = plan.variables.iter().find(|d| d.name == name)?;
            Some(d.shape.iter().product::<usize>() * d.dtype.size_bytes())
        };
        let mine = slots.iter().filter_map(|s| bytes(s)).sum();
        let all = state.ps_groups.iter().map(|g| g.slot_bytes).sum();
        let owners = state.ps_groups.iter().map(|g| (g.rank, g.slots.clone(), g.slot_shapes.clone())).collect();
        Ok(Some(PsStep { exchange, slots, owners, slot_bytes: (mine, all) }))
    }

    /// Broadcast every owner's current values to every rank, once, outside
    /// a step (a collective: every rank calls it). The synchronous plan does
    /// this inside each step; `--ps-async` calls it after its last step so
    /// every rank ends with the owners' values.
    pub fn exchange_values(&mut self, sess: &mut Session) -> Result<(), TrainError> {
        Ok(self.exchange.run(sess)?)
    }

    /// The optimizer slots other ranks own (a restore skips them).
    pub fn others_slots(&self, rank: usize) -> std::collections::BTreeSet<String> {
        self.owners.iter().filter(|o| o.0 != rank).flat_map(|o| o.1.iter().cloned()).collect()
    }

    /// Whether every rank saves now: rank 0's `due`, broadcast (a collective).
    pub fn agree(&self, sess: &Session, due: bool) -> Result<bool, TrainError> {
        let mut flag = [if due { 1.0f32 } else { 0.0 }];
        sess.comm().broadcast(0, &mut [&mut flag[..]]).map_err(|e| RuntimeError::Collective {
            program: "(checkpoint)".into(),
            node: "save now".into(),
            source: Box::new(e),
        })?;
        Ok(flag[0] != 0.0)
    }

    /// The optimizer slots of the ranks other than 0, gathered to rank 0
    /// (name, shape, values; empty on the other ranks), so that rank 0
    /// writes the whole checkpoint a single process writes. A collective:
    /// every rank calls it at the same step.
    pub fn gather_slots(&self, sess: &Session) -> Result<Vec<(String, Vec<usize>, Vec<f32>)>, TrainError> {
        let rank = sess.comm().rank();
        let len = |shapes: &[Vec<usize>]| shapes.iter().map(|s| s.iter().product::<usize>()).sum::<usize>();
        let mut send = Vec::new();
        if rank != 0 {
            for (r, names, shapes) in &self.owners {
                if *r == rank {
                    let at = send.len();
                    send.resize(at + len(shapes), 0.0);
                    let mut off = at;
                    for (name, shape) in names.iter().zip(shapes) {
                        let n = shape.iter().product::<usize>();
                        sess.read_variable_into(name, &mut send[off..off + n])?;
                        off += n;
                    }
                }
            }
        }
        let others = self.owners.iter().filter(|o| o.0 != 0);
        let total: usize = others.clone().map(|o| len(&o.2)).sum();
        let mut recv = vec![0.0; if rank == 0 { total } else { 0 }];
        sess.comm().gather_to(0, &send, &mut recv).map_err(|e| RuntimeError::Collective {
            program: "(checkpoint)".into(),
            node: "optimizer slots to rank 0".into(),
            source: Box::new(e),
        })?;
        let mut out = Vec::new();
        if rank == 0 {
            let mut off = 0;
            for (_, names, shapes) in others {
                for (name, shape) in names.iter().zip(shapes) {
                    let n = shape.iter().product::<usize>();
                    out.push((name.clone(), shape.clone(), recv[off..off + n].to_vec()));
                    off += n;
                }
            }
        }
        Ok(out)
    }

    /// The optimizer slots of every owner (each held by its owner only).
    pub fn slots(&self) -> &std::collections::BTreeSet<String> {
        &self.slots
    }

    /// One line for the run's notes: the slots this rank holds against a
    /// full copy, and the bytes of the values' broadcasts per step.
    pub fn describe(&self, rank: usize) -> String {
        let (mine, all) = self.slot_bytes;
        let (sent, received) = self.value_bytes(rank);
        format!(
            "ps: rank {rank} holds {mine} B of optimizer slots of {all} B in all ({} B fewer than a full copy); per step it broadcasts {sent} B of values and receives {received} B",
            all - mine
        )
    }

    /// Bytes this rank sends and receives per step in the values' broadcasts.
    pub fn value_bytes(&self, rank: usize) -> (usize, usize) {
        self.exchange.bytes(rank)
    }
}

/// One line for a multi-process run's notes: what crosses processes per
/// step on this rank (the payload of the gradient collectives: every rank
/// sends each bucket; it receives the sums of the all-reduced buckets and,
/// under `--variables ps`, of the buckets reduced to it, its own
/// variables' gradients; then the values it broadcasts and receives) and
/// the optimizer slots it holds (read off the compiled graph: the slot
/// inputs of the updates this rank runs).
pub fn exchange_note(
    graph: &towers_graph::Graph,
    state: &towers_passes::CompileState,
    ps: Option<&PsStep>,
    rank: usize,
) -> String {
    let grads: usize = state.buckets.iter().map(|b| b.bytes).sum();
    let all: Vec<&towers_passes::Bucket> = state.buckets.iter().filter(|b| b.root.is_none()).collect();
    let to_owner: Vec<&towers_passes::Bucket> = state.buckets.iter().filter(|b| b.root.is_some()).collect();
    let all_bytes: usize = all.iter().map(|b| b.bytes).sum();
    let owner_bytes: usize = to_owner.iter().map(|b| b.bytes).sum();
    let sums = all_bytes + to_owner.iter().filter(|b| b.root == Some(rank)).map(|b| b.bytes).sum::<usize>();
    let mut slots = 0usize;
    for id in graph.node_ids() {
        if let towers_graph::Op::ApplyGradient { optimizer } = &graph.node(id).op {
            let inputs = graph.inputs(id);
            for t in &inputs[1..=optimizer.slot_names().len()] {
                slots += graph.node(t.node).outputs[t.slot].byte_size().unwrap_or(0);
            }
        }
    }
    let (sent, received) = ps.map_or((0, 0), |p| p.value_bytes(rank));
    format!(
        "exchange: rank {rank} sends {grads} B of gradients per step (all-reduces {all_bytes} B in {} bucket(s), reduces {owner_bytes} B to their owners in {} bucket(s)) and receives {sums} B of sums, broadcasts {sent} B of values and receives {received} B; it holds {slots} B of optimizer slots",
        all.len(),
        to_owner.len()
    )
}
