//! The `towers` command line: `towers train` and `towers compile`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use std::sync::Arc;

use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use towers::compiler::{compile_train, CompileOptions};
use towers::data::DataSpec;
use towers::graph::layers::Activation;
use towers::models::{build, ModelKind, ModelSpec};
use towers::passes::{BnUpdates, ProcessGroup, VarPlacement};
use towers::runtime::comm::{Comm, LocalComm};
use towers::train::{train_in, BackendChoice, LrScheduleKind, OptimizerKind, TrainConfig, TrainObserver};
use towers::watch::{Tee, Watch};

#[derive(Parser)]
#[command(name = "towers", version, about = "A computation-graph compiler for synchronous data-parallel training")]
struct Cli {
    /// Log compiler passes and their timings to standard error.
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Train a model and print its test accuracy.
    Train(TrainArgs),
    /// Compile a model and write its graph, dot, plan or placement report.
    Compile(CompileArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum Model {
    Mlp,
    Convnet,
}

#[derive(Clone, Copy, ValueEnum)]
enum Act {
    Relu,
    Sigmoid,
    Tanh,
    Swish,
}

#[derive(Clone, Copy, ValueEnum)]
enum Opt {
    Sgd,
    Momentum,
    Adam,
    /// TF1's RMSPropOptimizer defaults: decay 0.9, momentum 0, epsilon 1e-10.
    Rmsprop,
    /// TF1's AdagradOptimizer: initial accumulator 0.1.
    Adagrad,
}

#[derive(Clone, Copy, ValueEnum)]
enum Vars {
    Cpu,
    Gpu0,
    RoundRobin,
    Greedy,
    /// The fastest placement the cost model predicts on this machine (`towers::cost`).
    Auto,
}

#[derive(Clone, Copy, ValueEnum)]
enum Bn {
    Tower0,
    Mean,
}

#[derive(Clone, Copy, ValueEnum)]
enum Emit {
    Graph,
    Dot,
    Plan,
    PlanJson,
    Placement,
    /// The CUDA C of every kernel the plan launches, one file each, into the folder given by -o.
    Cuda,
}

/// Model and tower options shared by `train` and `compile`.
#[derive(Args, Clone)]
struct Common {
    /// Which network.
    #[arg(long, value_enum, default_value = "mlp")]
    model: Model,
    /// Batch norm after each convolution (convnet).
    #[arg(long)]
    batch_norm: bool,
    /// Hidden widths of the MLP, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "256,256")]
    hidden: Vec<usize>,
    /// Activation of the MLP's hidden layers (swish: x * sigmoid(x), built
    /// from two ops that the compiler fuses with their gradients).
    #[arg(long, value_enum, default_value = "relu")]
    activation: Act,
    /// Optimizer.
    #[arg(long, value_enum, default_value = "momentum")]
    optimizer: Opt,
    /// Learning rate (default: 0.001 for adam and rmsprop, 0.05 for adagrad; for sgd and momentum 0.1 for the
    /// MLP and 0.05 for the convnet: the defaults whose worst seed clears the
    /// documented accuracy on every SIMD path, bench/accuracy.sh).
    #[arg(long)]
    lr: Option<f32>,
    /// Momentum coefficient.
    #[arg(long, default_value_t = 0.9)]
    momentum: f32,
    /// Nesterov momentum.
    #[arg(long)]
    nesterov: bool,
    /// Global batch size (split across towers).
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Number of towers (/gpu:0 .. /gpu:N-1); omit for one device without replication.
    #[arg(long)]
    towers: Option<usize>,
    /// Where variables live.
    #[arg(long, value_enum, default_value = "cpu")]
    variables: Vars,
    /// Split the batch by these weights, one per tower (e.g. 3,1).
    #[arg(long, value_delimiter = ',')]
    split_weights: Option<Vec<u32>>,
    /// Accumulate gradients over K micro-batches per tower.
    #[arg(long, default_value_t = 1)]
    accumulate: usize,
    /// Whose batch statistics update the batch-norm moving averages.
    #[arg(long, value_enum, default_value = "mean")]
    bn_updates: Bn,
    /// Seed of initializers, dropout and batch order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Data: `digits` (embedded 8x8), `mnist5k` (embedded real MNIST, 28x28) or `mnist:DIR` (IDX files).
    #[arg(long, default_value = "digits")]
    data: String,
    /// Dump the graph (text and dot) after passes into this folder.
    #[arg(long)]
    dump_dir: Option<PathBuf>,
    /// Passes to dump after (default: all), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    dump_after: Vec<String>,
    /// With several processes: gradient bucket capacity of the cross-process
    /// all-reduce in MiB (PyTorch DDP's bucket_cap_mb).
    #[arg(long, default_value_t = 25.0)]
    bucket_mb: f64,
    /// Give every buffer arena bytes of its own for the whole step (by
    /// default buffers of a device share bytes once their last reader ran).
    #[arg(long)]
    no_memory_reuse: bool,
    /// Every graph op its own launch with a buffer of its own: no kernel
    /// fusion (elementwise chains into generated kernels, bias and
    /// activation, a convolution or a matmul with its bias, activation and
    /// pool, the gradients' fusions, the cross-entropy's, the optimizer
    /// updates of one device as one launch), no in-place gradients and no
    /// towers' weight gradients folded into one product over the batch,
    /// e.g. to compare a fused run with the plain one.
    #[arg(long)]
    no_fusion: bool,
    /// On the CUDA backend, launch every step's kernels from the host
    /// instead of replaying the step as a CUDA graph.
    #[arg(long)]
    no_cuda_graphs: bool,
    /// Where `--variables auto` and `--explain-cost` cache their
    /// calibrations (by machine and plan hash).
    #[arg(long, default_value = "target/towers-cost")]
    cost_cache: PathBuf,
}

#[derive(Args)]
struct TrainArgs {
    #[command(flatten)]
    common: Common,
    /// Number of training steps (overrides --epochs).
    #[arg(long)]
    steps: Option<usize>,
    /// Number of passes over the training set (default: 40 for the MLP, 20 for
    /// the convnet).
    #[arg(long)]
    epochs: Option<usize>,
    /// Print `step N loss L` every N steps.
    #[arg(long, default_value_t = 0)]
    log_every: usize,
    /// Save variables here at the end (safetensors, written atomically).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Restore from --checkpoint first, when the file exists. Strict, as
    /// TF1's Saver: the checkpoint must be of the same model (every
    /// variable with its dtype and shape, no other tensor, the same model
    /// options) and hold only finite values.
    #[arg(long)]
    resume: bool,
    /// With --resume: load only the checkpoint's tensors that match this
    /// model by name, dtype and shape (fine tuning); the others keep their
    /// initial values, and every skipped tensor is printed before the first
    /// step. Non-finite values are still refused.
    #[arg(long)]
    restore_partial: bool,
    /// Replace an existing --checkpoint that this run does not resume, and
    /// write beside step-stamped files of another run (which --keep then
    /// never deletes). Without it such a run is refused before it starts.
    #[arg(long)]
    overwrite: bool,
    /// Also write --checkpoint every N steps (atomically; never from a diverged state).
    #[arg(long)]
    checkpoint_every: Option<usize>,
    /// Also write --checkpoint when S seconds passed since the last save
    /// (above 0, at most 1e9).
    #[arg(long)]
    checkpoint_secs: Option<f64>,
    /// Keep the last K step-stamped checkpoints (STEM-<global_step>.EXT) beside --checkpoint;
    /// only this run's series is pruned.
    #[arg(long)]
    keep: Option<usize>,
    /// Print `step N test accuracy A` on the held-out split every N steps.
    #[arg(long)]
    eval_every: Option<usize>,
    /// When the loss stops being finite, name the first node whose output is not finite
    /// (keeps every tensor readable after the step: implies --no-memory-reuse).
    #[arg(long)]
    check_numerics: bool,
    /// Learning-rate schedule: constant, step (x --lr-decay-rate every --lr-decay-steps) or cosine (to --lr-min;
    /// the default: it makes the final accuracy depend far less on the rounding of one SIMD path).
    #[arg(long, default_value = "cosine")]
    lr_schedule: LrScheduleKind,
    /// Step decay: steps between decays.
    #[arg(long, default_value_t = 1000)]
    lr_decay_steps: usize,
    /// Step decay: the factor of each decay.
    #[arg(long, default_value_t = 0.5)]
    lr_decay_rate: f32,
    /// Cosine: the learning rate at the end of the run.
    #[arg(long, default_value_t = 0.0)]
    lr_min: f32,
    /// Linear warmup of the learning rate over the first N steps.
    #[arg(long, default_value_t = 0)]
    warmup_steps: usize,
    /// The linear scaling rule (Goyal et al. 2017): lr x global batch / 256.
    #[arg(long)]
    scale_lr: bool,
    /// Which backend runs the step: cpu, cuda (an error naming what is
    /// missing when it cannot start), or auto (cuda when a driver, a GPU,
    /// NVRTC and cuBLAS are all present, else cpu). The run prints which.
    #[arg(long, default_value = "cpu")]
    backend: BackendChoice,
    /// Write TensorBoard event files (scalars, the placed graph) into this folder.
    #[arg(long)]
    logdir: Option<PathBuf>,
    /// Draw the loss and test-accuracy curves into this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Under an MPI launcher: end every rank when a collective waits this
    /// many seconds for another rank (a rank that hung or died); above 0, at
    /// most 1e9.
    #[arg(long, default_value_t = 300.0)]
    comm_timeout: f64,
    /// Write the last --trace-steps steps as a Chrome trace (JSON for
    /// Perfetto or chrome://tracing): one lane per device stream, every
    /// launch, copy, wait and all-reduce with its node and duration (on the cuda
    /// backend from CUDA timing events; traced steps launch without graphs).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// How many steps --trace writes: the last N of the run.
    #[arg(long, default_value_t = 1)]
    trace_steps: usize,
}

#[derive(Args)]
struct CompileArgs {
    #[command(flatten)]
    common: Common,
    /// What to write.
    #[arg(long, value_enum, default_value = "plan")]
    emit: Emit,
    /// Output file (default: standard output).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// With --emit dot: the collapsed view, one node per name scope per
    /// device, variables grouped by device, edges labelled with bytes per step.
    #[arg(long)]
    collapse: bool,
    /// Input geometry HxWxC when not taken from --data (e.g. 28x28x1).
    #[arg(long)]
    input: Option<String>,
    /// Compile for a group of this many processes (what `mpirun -np N towers
    /// train` runs), as rank --rank; see that rank's plan, buckets and devices.
    #[arg(long, default_value_t = 1)]
    world_size: usize,
    /// Which rank of --world-size to compile for.
    #[arg(long, default_value_t = 0)]
    rank: usize,
    /// Instead of --emit: for each placement (cpu, gpu0, round-robin,
    /// greedy) at 1, 2 and 4 towers, the cost model's predicted compute per
    /// device, transfer per link, step and critical path on this machine
    /// (calibrated on the CPU backend, cached under --cost-cache).
    #[arg(long)]
    explain_cost: bool,
}

/// `--variables auto`: the placement with the fastest predicted step for
/// this model and tower count on this machine; says why on stderr. With
/// several processes each would time its own machine and might choose
/// differently, so it is refused there.
fn auto_variables(
    c: &Common,
    cfg: &mut TrainConfig,
    input: [usize; 3],
    classes: usize,
    processes: usize,
) -> Result<(), String> {
    if !matches!(c.variables, Vars::Auto) {
        return Ok(());
    }
    if processes > 1 {
        return Err(format!(
            "--variables auto: each of the {processes} processes would time its own machine and could choose another placement; give one (cpu, gpu0, round-robin, greedy), e.g. the one `towers compile --variables auto` picks"
        ));
    }
    let model = build(&towers::cost::placements::model_spec(cfg, input, classes)).map_err(|e| e.to_string())?;
    let choice = towers::cost::auto(&model.graph, &model.loss, &cfg.compile_options(), cfg.towers, &c.cost_cache)
        .map_err(|e| format!("--variables auto: {e}"))?;
    eprintln!("--variables auto: {}", choice.reason);
    cfg.variables = choice.placement;
    Ok(())
}

/// `--explain-cost`: every placement at 1, 2 and 4 towers, predicted.
fn explain_cost(c: &Common, cfg: &TrainConfig, input: [usize; 3], classes: usize) -> Result<(), String> {
    let model = build(&towers::cost::placements::model_spec(cfg, input, classes)).map_err(|e| e.to_string())?;
    println!("cost model on {} (calibrations under {})", towers::cost::machine_key(), c.cost_cache.display());
    for towers in [1, 2, 4] {
        for v in towers::cost::PLACEMENTS {
            let k =
                towers::cost::candidate(&model.graph, &model.loss, &cfg.compile_options(), towers, v, &c.cost_cache)
                    .map_err(|e| format!("--explain-cost: {e}"))?;
            let from = if k.cached { ", calibration cached" } else { "" };
            print!("{}", k.prediction.text(&format!("towers={towers} variables={}{from}", v.name())));
        }
    }
    Ok(())
}

/// `--bucket-mb` in bytes (at least one byte, finite).
fn bucket_bytes(mb: f64) -> Result<usize, String> {
    let bytes = mb * (1u64 << 20) as f64;
    if !bytes.is_finite() || bytes < 1.0 || mb > 1e6 {
        return Err(format!(
            "--bucket-mb {mb:e}: give a positive size in MiB, at most 1e6 (a terabyte), e.g. 25 (PyTorch DDP's default)"
        ));
    }
    Ok(bytes as usize)
}

fn config(c: &Common) -> Result<TrainConfig, String> {
    let optimizer = match c.optimizer {
        Opt::Sgd => OptimizerKind::Sgd,
        Opt::Momentum => OptimizerKind::Momentum,
        Opt::Adam => OptimizerKind::Adam,
        Opt::Rmsprop => OptimizerKind::RmsProp,
        Opt::Adagrad => OptimizerKind::Adagrad,
    };
    let lr = c.lr.unwrap_or(match (optimizer, c.model) {
        (OptimizerKind::Adam | OptimizerKind::RmsProp, _) => 0.001,
        (OptimizerKind::Adagrad, _) => 0.05,
        (_, Model::Mlp) => 0.1,
        (_, Model::Convnet) => 0.05,
    });
    Ok(TrainConfig {
        data: DataSpec::parse(&c.data).map_err(|e| e.to_string())?,
        model: match c.model {
            Model::Mlp => ModelKind::Mlp,
            Model::Convnet => ModelKind::Convnet,
        },
        hidden: c.hidden.clone(),
        activation: match c.activation {
            Act::Relu => Activation::Relu,
            Act::Sigmoid => Activation::Sigmoid,
            Act::Tanh => Activation::Tanh,
            Act::Swish => Activation::Swish,
        },
        batch_norm: c.batch_norm,
        optimizer,
        lr,
        momentum: c.momentum,
        nesterov: c.nesterov,
        batch: c.batch,
        seed: c.seed,
        towers: match c.towers {
            Some(0) => return Err("--towers must be at least 1 (omit it for one device without towers)".into()),
            Some(n) => n,
            None => 0,
        },
        variables: match c.variables {
            Vars::Cpu => VarPlacement::Cpu,
            Vars::Gpu0 => VarPlacement::Gpu0,
            Vars::RoundRobin => VarPlacement::RoundRobin,
            Vars::Greedy => VarPlacement::Greedy,
            // Replaced by the cost model's choice (`auto_variables`) before any compile.
            Vars::Auto => VarPlacement::default(),
        },
        split_weights: c.split_weights.clone(),
        accumulate: c.accumulate,
        bn_updates: match c.bn_updates {
            Bn::Tower0 => BnUpdates::Tower0,
            Bn::Mean => BnUpdates::Mean,
        },
        dump_dir: c.dump_dir.clone(),
        dump_after: c.dump_after.clone(),
        bucket_bytes: bucket_bytes(c.bucket_mb)?,
        memory_reuse: !c.no_memory_reuse,
        fuse_kernels: !c.no_fusion,
        cuda_graphs: !c.no_cuda_graphs,
        ..TrainConfig::default()
    })
}

struct Printer {
    log_every: usize,
    eval_every: bool,
    bar: Option<ProgressBar>,
}

impl TrainObserver for Printer {
    fn start(&mut self, total: usize, note: &str) {
        if !note.is_empty() {
            eprintln!("{note}");
        }
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total as u64);
            bar.set_style(
                ProgressStyle::with_template("{bar:40} {pos}/{len} steps  {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            self.bar = Some(bar);
        }
    }
    fn step(&mut self, step: usize, loss: f32, eps: f64) {
        if self.log_every > 0 && step.is_multiple_of(self.log_every) {
            match &self.bar {
                Some(b) => b.println(format!("step {step} loss {loss:.6}")),
                None => println!("step {step} loss {loss:.6}"),
            }
        }
        if let Some(b) = &self.bar {
            b.set_position(step as u64);
            if step.is_multiple_of(10) {
                b.set_message(format!("loss {loss:.4}  {eps:.0} examples/s"));
            }
        }
    }

    /// Periodic evaluations (`--eval-every`); the final accuracy has its own line.
    fn eval(&mut self, step: usize, accuracy: f64) {
        if !self.eval_every {
            return;
        }
        match &self.bar {
            Some(b) => b.println(format!("step {step} test accuracy {accuracy:.4}")),
            None => println!("step {step} test accuracy {accuracy:.4}"),
        }
    }
}

/// Whether an MPI launcher started this process (Open MPI, MPICH/Hydra, PMIx).
fn launched_by_mpi() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok().and_then(|s| s.parse::<usize>().ok()))
}

/// The communicator of this run: MPI under a launcher, else this process alone.
fn communicator(timeout_secs: f64) -> Result<Arc<dyn Comm>, String> {
    let max = towers::saver::MAX_SECS;
    let timeout = match std::time::Duration::try_from_secs_f64(timeout_secs) {
        Ok(t) if (1e-3..=max).contains(&timeout_secs) => t,
        _ => {
            return Err(format!(
                "--comm-timeout {timeout_secs:e}: give a number of seconds above 0 (at least 0.001) and at most {max:e}, e.g. 300"
            ))
        }
    };
    match launched_by_mpi() {
        #[cfg(feature = "mpi")]
        Some(_) => {
            let c = towers::runtime::comm::MpiComm::init_with_timeout(timeout).map_err(|e| e.to_string())?;
            Ok(Arc::new(c))
        }
        #[cfg(not(feature = "mpi"))]
        Some(n) if n > 1 => Err(format!(
            "an MPI launcher started {n} processes, but this towers was built without MPI: build it with `cargo build --release --features mpi` (each process would otherwise train alone)"
        )),
        _ => {
            let _ = timeout; // used by the MPI communicator only
            Ok(Arc::new(LocalComm::single()))
        }
    }
}

fn run_train(a: TrainArgs) -> Result<(), String> {
    let comm = communicator(a.comm_timeout)?;
    let r = run_train_in(a, Arc::clone(&comm));
    if let Err(e) = &r {
        if comm.world_size() > 1 {
            // Every rank sees a collective's failure; one that fails alone
            // must not leave the others waiting for it.
            eprintln!("error (rank {} of {}): {e}", comm.rank(), comm.world_size());
            comm.abort(1);
        }
    }
    r
}

fn run_train_in(a: TrainArgs, comm: Arc<dyn Comm>) -> Result<(), String> {
    let lead = comm.rank() == 0;
    let mut cfg = config(&a.common)?;
    let (input, classes) = towers::cost::placements::geometry(&cfg.data);
    auto_variables(&a.common, &mut cfg, input, classes, comm.world_size())?;
    cfg.steps = a.steps;
    cfg.epochs = a.epochs.unwrap_or(match a.common.model {
        Model::Mlp => 40,
        Model::Convnet => 20,
    });
    cfg.log_every = a.log_every;
    cfg.checkpoint = a.checkpoint;
    cfg.resume = a.resume;
    cfg.restore_partial = a.restore_partial;
    cfg.overwrite = a.overwrite;
    cfg.backend = a.backend;
    cfg.checkpoint_every = a.checkpoint_every;
    cfg.checkpoint_secs = a.checkpoint_secs;
    cfg.keep = a.keep;
    cfg.eval_every = a.eval_every;
    cfg.check_numerics = a.check_numerics;
    cfg.lr_schedule = a.lr_schedule;
    cfg.lr_decay_steps = a.lr_decay_steps;
    cfg.lr_decay_rate = a.lr_decay_rate;
    cfg.lr_min = a.lr_min;
    cfg.warmup_steps = a.warmup_steps;
    cfg.scale_lr = a.scale_lr;
    cfg.trace = a.trace;
    cfg.trace_steps = a.trace_steps;
    // Before anything is created (the --logdir event file): options first.
    towers::guards::validate(&cfg, comm.world_size()).map_err(|e| e.to_string())?;
    if let (true, Some(path)) = (lead, &a.plot) {
        // Checked now, not when the run ends.
        if path.extension().is_none_or(|e| !e.eq_ignore_ascii_case("svg")) {
            return Err(format!("--plot {}: draws SVG only; give a file name ending in .svg", path.display()));
        }
        towers::outputs::check_file("plot", path)?;
    }
    let mut p = Printer { log_every: a.log_every, eval_every: a.eval_every.is_some(), bar: None };
    let mut watch = match &a.logdir {
        Some(dir) if lead => Watch::with_logdir(dir).map_err(|e| e.to_string())?,
        _ => Watch::new(),
    };
    let r = train_in(&cfg, Arc::clone(&comm), &mut Tee(&mut p, &mut watch)).map_err(|e| e.to_string())?;
    if !lead {
        // Rank 0 reports for the group.
        return Ok(());
    }
    if let Some(b) = &p.bar {
        b.finish_and_clear();
    }
    let event_file = watch.event_file().map(|f| f.display().to_string());
    let history = watch.finish().map_err(|e| e.to_string())?;
    if let Some(f) = event_file {
        eprintln!("events: {f}");
    }
    if let Some(path) = &a.plot {
        towers::plot::plot_svg(path, &history).map_err(|e| e.to_string())?;
    }
    for d in &r.diagnostics {
        eprintln!("warning: {d}");
    }
    eprintln!("{} steps, {:.0} examples/s", r.steps, r.examples_per_sec);
    println!("test accuracy: {:.4}", r.test_accuracy);
    Ok(())
}

fn parse_input(s: &str) -> Result<[usize; 3], String> {
    let v: Vec<usize> = s
        .split('x')
        .map(|p| p.parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--input '{s}': {e}; give HxWxC, e.g. 28x28x1"))?;
    let dims = match v.as_slice() {
        [h, w, c] => [*h, *w, *c],
        [h, w] => [*h, *w, 1],
        _ => return Err(format!("--input '{s}' must be HxWxC, e.g. 28x28x1")),
    };
    if dims.contains(&0) || dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_none_or(|n| n > 1 << 28) {
        return Err(format!(
            "--input '{s}': every dimension must be at least 1, and the image at most 2^28 values, e.g. 28x28x1"
        ));
    }
    Ok(dims)
}

fn run_compile(a: CompileArgs) -> Result<(), String> {
    let mut cfg = config(&a.common)?;
    let process = ProcessGroup::new(a.rank, a.world_size).map_err(|e| format!("--rank/--world-size: {e}"))?;
    // The same guards as `towers train`: what compiles is what would train.
    towers::guards::validate(&cfg, process.world).map_err(|e| e.to_string())?;
    towers::guards::check_dump_after(&cfg, process).map_err(|e| e.to_string())?;
    if let Some(d) = &cfg.dump_dir {
        towers::outputs::check_dir("dump-dir", d)?;
    }
    match (&a.output, a.emit) {
        (Some(o), Emit::Cuda) => towers::outputs::check_dir("output", o)?,
        (Some(o), _) => towers::outputs::check_file("output", o)?,
        (None, _) => {}
    }
    if a.collapse && !matches!(a.emit, Emit::Dot) {
        return Err("--collapse is a view of the dot output: use it with --emit dot".into());
    }
    let (input, classes) = match &a.input {
        Some(s) => (parse_input(s)?, 10),
        None => match &cfg.data {
            DataSpec::Digits => ([8, 8, 1], 10),
            DataSpec::Mnist(_) | DataSpec::Mnist5k => ([28, 28, 1], 10),
        },
    };
    if a.explain_cost {
        return explain_cost(&a.common, &cfg, input, classes);
    }
    auto_variables(&a.common, &mut cfg, input, classes, a.world_size)?;
    let mut spec = ModelSpec::new(cfg.model, input, classes);
    spec.hidden = cfg.hidden.clone();
    spec.activation = cfg.activation;
    spec.batch_norm = cfg.batch_norm;
    spec.seed = cfg.seed;
    let model = build(&spec).map_err(|e| e.to_string())?;
    let opts: CompileOptions = cfg.compile_options_for(process);
    let c = compile_train(&model.graph, &model.loss, &opts).map_err(|e| e.to_string())?;
    let text = match a.emit {
        Emit::Graph => towers::graph::text::to_text(&c.graph).map_err(|e| e.to_string())?,
        Emit::Dot if a.collapse => towers::graph::dot::to_dot_collapsed(&c.graph).map_err(|e| e.to_string())?,
        Emit::Dot => towers::graph::dot::to_dot(&c.graph).map_err(|e| e.to_string())?,
        Emit::Plan => c.plan.to_text(),
        Emit::PlanJson => c.plan.to_json(),
        Emit::Placement => towers::report::placement_report(&c.graph, &c.plan),
        Emit::Cuda => return write_cuda(&c.plan, a.output),
    };
    match a.output {
        Some(p) => towers::outputs::write_atomic(&p, text.as_bytes())
            .map_err(|e| format!("--output: cannot write {}: {e}", p.display())),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// `--emit cuda -o DIR`: one `.cu` file per kernel the plan launches, and `index.txt`.
fn write_cuda(plan: &towers::codegen::Plan, output: Option<PathBuf>) -> Result<(), String> {
    let dir = output.ok_or("--emit cuda writes one file per kernel: give the folder with -o DIR")?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (name, text) in towers::cuda_emit::cuda_files(plan)? {
        let p = dir.join(name);
        towers::outputs::write_atomic(&p, text.as_bytes()).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = if cli.verbose { tracing::Level::DEBUG } else { tracing::Level::WARN };
    tracing_subscriber::fmt().with_max_level(level).with_writer(std::io::stderr).with_target(false).init();
    // TOWERS_SIMD names a path this CPU lacks: refused before anything runs.
    if let Err(e) = towers_kernels::simd::selected() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let r = match cli.cmd {
        Cmd::Train(a) => run_train(a),
        Cmd::Compile(a) => run_compile(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
