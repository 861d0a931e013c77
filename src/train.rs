//! Training end to end: data, model, compile (train and eval programs), a
//! session on the CPU or the CUDA backend ([`BackendChoice`]), the step
//! loop, checkpoints and the test accuracy.
//!
//! The library never prints: progress goes to a [`TrainObserver`] the caller
//! supplies (the CLI prints `step N loss L` lines and a progress bar).
//! A training step allocates nothing: the batch buffers are allocated once and
//! the session's buffers were planned at load.

use std::sync::Arc;
use std::time::Instant;

use thiserror::Error;
use towers_passes::ProcessGroup;
use towers_runtime::comm::{Comm, LocalComm};
use towers_runtime::cuda::{self, CudaBackend, CudaUnavailable};
use towers_runtime::{CpuBackend, RuntimeError, Session};

pub use crate::config::{LrScheduleKind, OptimizerKind, TrainConfig};

use crate::compiler::{compile_eval, compile_train, CompileError};
use crate::data::{Batcher, DataError, Dataset, EvalChunks};
use crate::models::build;
use crate::saver::Saver;
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
    /// `--resume` met a checkpoint of another model (see [`crate::resume`]).
    #[error("--resume: {0}")]
    Resume(String),
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
/// rows of every global batch ([`crate::compiler::CompileOptions::process_rows`]), and the
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
    if lead {
        crate::guards::check_outputs(cfg)?;
    }
    // The session first: its memory check counts the data set against what
    // the backend had before it was loaded ([`towers_runtime::memory`]).
    let (sess, which) = open_session(cfg.backend, cfg.seed, &comm, cfg.cuda_graphs)?;
    let mut sess = sess.with_comm(Arc::clone(&comm));
    sess.note_memory_baseline();
    let (train_set, test_set) = cfg.data.load()?;
    if sess.backend_name() == "cpu" {
        sess.reserve_memory(train_set.host_bytes() + test_set.host_bytes());
    }
    let model = build(&cfg.model_spec(&train_set))?;
    crate::guards::check_dump_after(cfg, process)?;
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
    let mut resumed_at = None;
    let mut restore_notes = Vec::new();
    let run = crate::resume::run_description(cfg, &train_set);
    if let (true, Some(path)) = (cfg.resume, &cfg.checkpoint) {
        if path.exists() {
            restore_notes = crate::resume::restore(&mut sess, cfg, path, &run)?;
            // An exact resume: global_step steps were taken, so the data
            // order and every random stream (dropout) continue from there.
            if let Ok(g) = sess.read_variable_i32("global_step") {
                done = g.first().copied().unwrap_or(0).max(0) as usize;
                batcher.seek(done as u64);
                sess.set_step("train", done as u64)?;
            }
            resumed_at = Some(done as i64);
        }
    }

    sess.check_replicas(if done > 0 { "after resuming" } else { "before the first step" })?;

    let total = cfg.steps.unwrap_or(cfg.epochs * batcher.batches_per_epoch());
    let schedule = cfg.schedule(total);
    let mut note = format!("{which}\n{}", sess.backend_note());
    for n in &restore_notes {
        note.push('\n');
        note.push_str(n);
    }
    // Rank 0 writes the checkpoints.
    let mut saver = match cfg.checkpoint.as_ref().filter(|_| lead) {
        Some(p) => {
            let mut s = Saver::new(p, cfg.checkpoint_every, cfg.checkpoint_secs, cfg.keep).with_run(run);
            s.start(resumed_at, cfg.overwrite)?;
            Some(s)
        }
        None => None,
    };
    obs.start(total, &note);
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
