//! Training end to end: data, model, compile (train and eval programs), a
//! session on the CPU or the CUDA backend ([`BackendChoice`]), the step
//! loop, checkpoints and the test accuracy.
//!
//! The library never prints: progress goes to a [`TrainObserver`] the caller
//! supplies (the CLI prints `step N loss L` lines and a progress bar).
//! A training step allocates nothing: the batch buffers are allocated once and
//! the session's buffers were planned at load.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use thiserror::Error;
use towers_graph::layers::Activation;
use towers_graph::{Device, Optimizer, F32};
use towers_passes::{BnUpdates, ProcessGroup, SplitPolicy, VarPlacement};
use towers_runtime::comm::{Comm, LocalComm};
use towers_runtime::cuda::{self, CudaBackend, CudaUnavailable};
use towers_runtime::{CpuBackend, RuntimeError, Session};

use crate::compiler::{compile_eval, compile_train, CompileError, CompileOptions};
use crate::data::{Batcher, DataError, DataSpec, Dataset, EvalChunks};
use crate::models::{build, ModelKind, ModelSpec};
use crate::saver::Saver;
use crate::schedule::{Decay, Schedule};
use towers_passes::optimizer::LEARNING_RATE;

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
    #[error("--backend cuda: {0}")]
    Cuda(#[from] CudaUnavailable),
    #[error("--backend cuda across processes: {0}")]
    Nccl(String),
    #[error("--trace: {0}")]
    Trace(#[from] crate::trace::TraceError),
    /// The loss left the finite numbers: the run stops, and nothing is
    /// checkpointed from the diverged state.
    #[error("the loss is {loss} at step {step}: training diverged (try a smaller --lr){}; no checkpoint was written from this state", origin.as_ref().map(|o| format!("; {o}")).unwrap_or_default())]
    NonFiniteLoss { step: usize, loss: f32, origin: Option<String> },
    /// The planned buffers do not fit in the backend's memory.
    #[error("the {program} program needs {planned_gib:.2} GiB ({detail}), but the {backend} backend has only {available_gib:.2} GiB available; use a smaller --batch, or more --towers")]
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
/// why. With several processes the CUDA backend reduces its buckets over
/// NCCL, set up over `comm` (feature `nccl`; without it, an error).
pub fn open_session(
    choice: BackendChoice,
    seed: u64,
    comm: &Arc<dyn Comm>,
    cuda_graphs: bool,
) -> Result<(Session, String), TrainError> {
    let cuda_session = |why: &str| -> Result<(Session, String), TrainError> {
        let b = CudaBackend::new()?.with_graphs(cuda_graphs);
        let line = format!("backend: cuda on {}{why}", b.device());
        let b = with_nccl(b, comm)?;
        Ok((Session::with_backend(seed, Box::new(b)), line))
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

/// Which learning-rate schedule (`--lr-schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LrScheduleKind {
    #[default]
    Constant,
    Step,
    Cosine,
}

impl std::str::FromStr for LrScheduleKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "constant" => Ok(LrScheduleKind::Constant),
            "step" => Ok(LrScheduleKind::Step),
            "cosine" => Ok(LrScheduleKind::Cosine),
            o => Err(format!("unknown learning-rate schedule '{o}': expected constant, step or cosine")),
        }
    }
}

/// Which optimizer, with its hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerKind {
    Sgd,
    Momentum,
    Adam,
}

impl std::str::FromStr for OptimizerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sgd" => Ok(OptimizerKind::Sgd),
            "momentum" => Ok(OptimizerKind::Momentum),
            "adam" => Ok(OptimizerKind::Adam),
            o => Err(format!("unknown optimizer '{o}': expected sgd, momentum or adam")),
        }
    }
}

/// Everything a training run needs.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    pub data: DataSpec,
    pub model: ModelKind,
    pub hidden: Vec<usize>,
    /// The MLP's hidden activation.
    pub activation: Activation,
    pub batch_norm: bool,
    pub optimizer: OptimizerKind,
    pub lr: f32,
    pub momentum: f32,
    pub nesterov: bool,
    /// Global batch size.
    pub batch: usize,
    /// Number of steps; when `None`, `epochs` full passes.
    pub steps: Option<usize>,
    pub epochs: usize,
    pub seed: u64,
    /// Report the loss every N steps (0 = never).
    pub log_every: usize,
    pub checkpoint: Option<PathBuf>,
    /// Restore from `checkpoint` before training when it exists.
    pub resume: bool,
    pub dump_dir: Option<PathBuf>,
    pub dump_after: Vec<String>,
    /// Number of towers (0 = one device, no replication).
    pub towers: usize,
    pub variables: VarPlacement,
    pub split_weights: Option<Vec<u32>>,
    pub accumulate: usize,
    pub bn_updates: BnUpdates,
    /// Batch size of the evaluation program.
    pub eval_batch: usize,
    /// Which backend runs the programs.
    pub backend: BackendChoice,
    /// Also write `checkpoint` every N steps (atomically, as at the end).
    pub checkpoint_every: Option<usize>,
    /// Also write `checkpoint` when this many seconds passed since the last save.
    pub checkpoint_secs: Option<f64>,
    /// Keep the last K step-stamped checkpoints beside `checkpoint` ([`crate::saver`]).
    pub keep: Option<usize>,
    /// Evaluate on the test split every N steps.
    pub eval_every: Option<usize>,
    /// On a non-finite loss, find the first node whose output is not finite.
    pub check_numerics: bool,
    /// The learning-rate schedule after warmup ([`crate::schedule`]).
    pub lr_schedule: LrScheduleKind,
    /// Step decay: multiply by `lr_decay_rate` every `lr_decay_steps` steps.
    pub lr_decay_steps: usize,
    pub lr_decay_rate: f32,
    /// Cosine: the rate at the end of the run.
    pub lr_min: f32,
    /// Linear warmup over the first N steps.
    pub warmup_steps: usize,
    /// The linear scaling rule: lr x global batch / 256.
    pub scale_lr: bool,
    /// Gradient bucket capacity of the cross-process all-reduce, in bytes.
    pub bucket_bytes: usize,
    /// Let buffers share arena bytes by liveness (off with `check_numerics`,
    /// which reads every tensor after a failed step).
    pub memory_reuse: bool,
    /// Fuse kernels in lowering (`CompileOptions::fuse_kernels`).
    pub fuse_kernels: bool,
    /// On the CUDA backend, replay each step as a CUDA graph where the
    /// program allows it (`CudaBackend::with_graphs`).
    pub cuda_graphs: bool,
    /// Write the last `trace_steps` steps of the run here as a Chrome trace
    /// ([`crate::trace`]).
    pub trace: Option<PathBuf>,
    pub trace_steps: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            data: DataSpec::Digits,
            model: ModelKind::Mlp,
            hidden: vec![256, 256],
            activation: Activation::Relu,
            batch_norm: false,
            optimizer: OptimizerKind::Momentum,
            lr: 0.05,
            momentum: 0.9,
            nesterov: false,
            batch: 32,
            steps: None,
            epochs: 20,
            seed: 0,
            log_every: 0,
            checkpoint: None,
            resume: false,
            dump_dir: None,
            dump_after: Vec::new(),
            towers: 0,
            variables: VarPlacement::Cpu,
            split_weights: None,
            accumulate: 1,
            bn_updates: BnUpdates::default(),
            eval_batch: 256,
            backend: BackendChoice::Cpu,
            checkpoint_every: None,
            checkpoint_secs: None,
            keep: None,
            eval_every: None,
            check_numerics: false,
            lr_schedule: LrScheduleKind::Constant,
            lr_decay_steps: 1000,
            lr_decay_rate: 0.5,
            lr_min: 0.0,
            warmup_steps: 0,
            scale_lr: false,
            bucket_bytes: towers_passes::DEFAULT_BUCKET_BYTES,
            memory_reuse: true,
            fuse_kernels: true,
            cuda_graphs: true,
            trace: None,
            trace_steps: 1,
        }
    }
}

impl TrainConfig {
    pub fn optimizer(&self) -> Optimizer {
        match self.optimizer {
            OptimizerKind::Sgd => Optimizer::Sgd { lr: F32(self.base_lr()) },
            OptimizerKind::Momentum => {
                Optimizer::Momentum { lr: F32(self.base_lr()), momentum: F32(self.momentum), nesterov: self.nesterov }
            }
            OptimizerKind::Adam => {
                Optimizer::Adam { lr: F32(self.base_lr()), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) }
            }
        }
    }

    /// The base learning rate: `lr`, or with `scale_lr` the linear scaling rule's.
    pub fn base_lr(&self) -> f32 {
        if self.scale_lr {
            Schedule::scaled_base(self.lr, self.batch)
        } else {
            self.lr
        }
    }

    /// The learning-rate schedule of a run of `total` steps.
    pub fn schedule(&self, total: usize) -> Schedule {
        let decay = match self.lr_schedule {
            LrScheduleKind::Constant => Decay::Constant,
            LrScheduleKind::Step => Decay::Step { every: self.lr_decay_steps, rate: self.lr_decay_rate },
            LrScheduleKind::Cosine => {
                Decay::Cosine { total: total.saturating_sub(self.warmup_steps).max(1), min: self.lr_min }
            }
        };
        Schedule { base: self.base_lr(), decay, warmup: self.warmup_steps }
    }

    /// The tower devices: `/gpu:0` .. `/gpu:N-1`.
    pub fn tower_devices(&self) -> Vec<Device> {
        (0..self.towers as u32).map(Device::gpu).collect()
    }

    /// The compiler options this run uses as process `process` of a group.
    pub fn compile_options_for(&self, process: ProcessGroup) -> CompileOptions {
        let mut o = self.compile_options();
        o.process = process;
        o
    }

    /// The compiler options this run uses (one process).
    pub fn compile_options(&self) -> CompileOptions {
        let mut o = CompileOptions::new(self.optimizer(), self.batch);
        o.bucket_bytes = self.bucket_bytes;
        o.towers = self.tower_devices();
        o.variables = self.variables;
        o.split = match &self.split_weights {
            Some(w) => SplitPolicy::Weighted(w.clone()),
            None => SplitPolicy::Even,
        };
        o.accumulate = self.accumulate;
        o.bn_updates = self.bn_updates;
        o.dump_dir = self.dump_dir.clone();
        o.dump_after = self.dump_after.clone();
        o.reuse_memory = self.memory_reuse && !self.check_numerics;
        o.fuse_kernels = self.fuse_kernels;
        // Folded weight-gradient products pay where the towers share one
        // memory (the CPU backend); on GPUs each device computes its own.
        o.fold_tower_matmuls = self.fuse_kernels && matches!(self.backend, BackendChoice::Cpu);
        // Shared computations merged across towers: read in place where the
        // towers share one memory; on GPUs a copy would replace a recomputation.
        o.merge_tower_duplicates = matches!(self.backend, BackendChoice::Cpu);
        o
    }

    pub fn model_spec(&self, data: &Dataset) -> ModelSpec {
        let mut s = ModelSpec::new(self.model, [data.height(), data.width(), data.channels()], data.num_classes());
        s.hidden = self.hidden.clone();
        s.activation = self.activation;
        s.batch_norm = self.batch_norm;
        s.seed = self.seed;
        s
    }
}

/// Progress callbacks.
pub trait TrainObserver {
    /// Before the first step: the total steps and what the backend said.
    fn start(&mut self, _total_steps: usize, _backend_note: &str) {}
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
    pub steps: usize,
    pub test_accuracy: f64,
    pub examples_per_sec: f64,
    pub backend_note: String,
    /// Warnings from the compiler (e.g. variables without gradients).
    pub diagnostics: Vec<String>,
    /// (step, test accuracy) of every periodic evaluation (`eval_every`).
    pub evals: Vec<(usize, f64)>,
}

/// Run a training job in this process alone and evaluate on the test split.
pub fn train(cfg: &TrainConfig, obs: &mut dyn TrainObserver) -> Result<TrainReport, TrainError> {
    train_in(cfg, Arc::new(LocalComm::single()), obs)
}

/// Run a training job as one rank of `comm` (an MPI process, or a thread of
/// a [`LocalComm`] group): every rank runs the same command; each feeds its
/// rows of every global batch ([`CompileOptions::process_rows`]), and the
/// plan all-reduces the gradients across ranks. The variables are checked
/// identical on every rank before the first step and after the last
/// ([`Session::check_replicas`]). Rank 0 alone reports progress to `obs`,
/// writes checkpoints (every rank reads them on resume) and computes the
/// test accuracy, which it broadcasts, so every rank's report holds it.
pub fn train_in(
    cfg: &TrainConfig,
    comm: Arc<dyn Comm>,
    obs: &mut dyn TrainObserver,
) -> Result<TrainReport, TrainError> {
    let process = ProcessGroup::new(comm.rank(), comm.world_size()).map_err(CompileError::from)?;
    let lead = process.rank == 0;
    let mut quiet = Quiet;
    let obs: &mut dyn TrainObserver = if lead { obs } else { &mut quiet };
    crate::guards::validate(cfg, process.world)?;
    let (train_set, test_set) = cfg.data.load()?;
    let model = build(&cfg.model_spec(&train_set))?;
    let t0 = Instant::now();
    let opts = cfg.compile_options_for(process);
    let rows = opts.process_rows().map_err(CompileError::from)?;
    let compiled = compile_train(&model.graph, &model.loss, &opts)?;
    for t in &compiled.timings {
        tracing::debug!(pass = t.pass, micros = t.elapsed.as_micros() as u64, "compiler pass");
    }
    tracing::debug!(
        micros = t0.elapsed().as_micros() as u64,
        nodes = compiled.graph.len(),
        events = compiled.plan.num_events,
        "compiled the training program"
    );
    obs.compiled(&compiled.graph);
    let eval_batch = cfg.eval_batch.min(test_set.len()).max(1);
    let eval = compile_eval(&model.graph, &[("predictions", &model.predictions)], eval_batch)?;

    let (sess, which) = open_session(cfg.backend, cfg.seed, &comm, cfg.cuda_graphs)?;
    let mut sess = sess.with_comm(Arc::clone(&comm));
    let which = if process.is_single() { which } else { format!("{which}; {}", comm.describe()) };
    let memory = |e: RuntimeError| match e {
        RuntimeError::OutOfMemory { program, backend, planned, available, detail } => {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            TrainError::Memory { program, backend, planned_gib: gib(planned), available_gib: gib(available), detail }
        }
        e => TrainError::Runtime(e),
    };
    sess.load("train", compiled.plan).map_err(memory)?;
    sess.load("eval", eval.plan).map_err(memory)?;
    let mut batcher = Batcher::new(&train_set, cfg.batch, cfg.seed)?.with_rows(rows.clone())?;
    // Steps already taken (a resumed run): --steps and --epochs count the
    // whole run in global steps, as TF's max_steps, so the same command
    // with --resume trains what remains.
    let mut done = 0usize;
    if let (true, Some(path)) = (cfg.resume, &cfg.checkpoint) {
        if path.exists() {
            sess.restore(path)?;
            // An exact resume: global_step steps were taken, so the data
            // order and every random stream (dropout) continue from there.
            if let Ok(g) = sess.read_variable_i32("global_step") {
                done = g.first().copied().unwrap_or(0).max(0) as usize;
                batcher.seek(done as u64);
                sess.set_step("train", done as u64)?;
            }
        }
    }

    sess.check_replicas(if done > 0 { "after resuming" } else { "before the first step" })?;

    let total = cfg.steps.unwrap_or(cfg.epochs * batcher.batches_per_epoch());
    let schedule = cfg.schedule(total);
    let note = format!("{which}\n{}", sess.backend_note());
    obs.start(total, &note);
    // Rank 0 writes the checkpoints.
    let mut saver = cfg
        .checkpoint
        .as_ref()
        .filter(|_| lead)
        .map(|p| Saver::new(p, cfg.checkpoint_every, cfg.checkpoint_secs, cfg.keep));
    let mut losses = Vec::new();
    let mut evals = Vec::new();
    let mut loss = [0f32];
    // Traced: the last `trace_steps` steps of the run (steady state: the
    // first steps' one-time costs, such as waking the workers, stay out).
    let first_traced = cfg.trace.as_ref().map(|_| total.saturating_sub(cfg.trace_steps.max(1)).max(done) + 1);
    if first_traced.is_some() {
        // A backend that cannot trace says so now, not after the run.
        sess.set_tracing("train", true)?;
        sess.set_tracing("train", false)?;
    }
    let mut traces = Vec::new();
    let started = Instant::now();
    for step in done + 1..=total {
        if first_traced == Some(step) {
            sess.set_tracing("train", true)?;
        }
        // The batch is gathered straight into the feeds' memory (the CPU
        // backend's arena, the CUDA backend's pinned staging): no vector
        // in between, the same bytes.
        sess.feed_with_f32("train", &model.images, |b| batcher.fill_images(b))??;
        sess.feed_with_i32("train", &model.labels, |b| batcher.fill_labels(b))??;
        batcher.advance();
        // The schedule's rate of this update (0-based global step), into the
        // plan's learning_rate variable: no recompilation, no allocation.
        let lr = schedule.at(step - 1);
        sess.write_variable(LEARNING_RATE, &[lr])?;
        obs.learning_rate(step, lr);
        comm.note_step(step as u64);
        sess.run("train")?;
        if first_traced.is_some_and(|f| step >= f) {
            traces.push(sess.trace("train")?);
        }
        sess.fetch_f32_into("train", "loss", &mut loss)?;
        let loss = loss[0];
        if !loss.is_finite() {
            let origin = if cfg.check_numerics {
                crate::guards::first_non_finite(&sess, "train", &compiled.graph)
            } else {
                Some("--check-numerics names the first node whose output is not finite".into())
            };
            return Err(TrainError::NonFiniteLoss { step, loss, origin });
        }
        if let Some(saver) = saver.as_mut() {
            saver.after_step(&sess, step)?;
        }
        if lead && cfg.eval_every.is_some_and(|every| step % every == 0 && step < total) {
            let acc = evaluate(&mut sess, &test_set, eval_batch, &model.images, &model.labels)?;
            evals.push((step, acc));
            obs.eval(step, acc);
        }
        let eps = ((step - done) * cfg.batch) as f64 / started.elapsed().as_secs_f64().max(1e-9);
        if (cfg.log_every > 0 && step % cfg.log_every == 0) || step == total {
            losses.push((step, loss));
        }
        obs.step(step, loss, eps);
    }
    let examples_per_sec = (total.saturating_sub(done) * cfg.batch) as f64 / started.elapsed().as_secs_f64().max(1e-9);
    if let Some(path) = &cfg.trace {
        sess.set_tracing("train", false)?;
        crate::trace::write_chrome_trace(path, sess.plan("train")?, &traces, sess.backend_name())?;
    }
    sess.check_replicas("after the last step")?;
    if let Some(saver) = saver.as_mut() {
        saver.save(&sess)?;
    }
    // Computed once, on rank 0, and broadcast to the others.
    let (mut test_accuracy, mut accuracy) = (0.0, [0f32; 2]);
    if lead {
        test_accuracy = evaluate(&mut sess, &test_set, eval_batch, &model.images, &model.labels)?;
        // An f64 as two f32s (high part, remainder), to cross the f32 communicator.
        accuracy = [test_accuracy as f32, (test_accuracy - test_accuracy as f32 as f64) as f32];
    }
    if !process.is_single() {
        comm.broadcast(0, &mut [&mut accuracy[..]]).map_err(|e| RuntimeError::Collective {
            program: "eval".into(),
            node: "test accuracy".into(),
            source: Box::new(e),
        })?;
    }
    if !lead {
        test_accuracy = accuracy[0] as f64 + accuracy[1] as f64;
    }
    obs.eval(total, test_accuracy);
    Ok(TrainReport {
        losses,
        steps: total,
        test_accuracy,
        examples_per_sec,
        backend_note: note,
        diagnostics: compiled.state.diagnostics.iter().map(|d| format!("{}: {}", d.pass, d.message)).collect(),
        evals,
    })
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
        sess.feed_with_f32("eval", images_name, |b| chunks.fill_images(b))??;
        if fed_labels {
            sess.feed_with_i32("eval", labels_name, |b| chunks.fill_labels(b))??;
        }
        sess.run("eval")?;
        let pred = sess.fetch_i32("eval", "predictions")?;
        let labels = &data.labels()[examples.clone()];
        correct += pred.iter().zip(labels).filter(|(p, l)| p == l).count();
        seen += examples.len();
        chunks.advance();
    }
    Ok(if seen == 0 { 0.0 } else { correct as f64 / seen as f64 })
}
