//! Every flag of `towers train` and `towers compile` (clap derive), in one
//! place: flags both commands take go in [`Common`], `train`'s alone in
//! [`TrainArgs`], `compile`'s alone in [`CompileArgs`]; their meaning is
//! turned into a [`towers::train::TrainConfig`] in `cli/config.rs`.
//!
//! Invariant: a new flag is a field here and one line in `cli/config.rs`
//! (or `cli/train.rs` for train-only flags); nothing else parses arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use towers::train::{BackendChoice, LrScheduleKind};

#[derive(Parser)]
#[command(name = "towers", version, about = "A computation-graph compiler for synchronous data-parallel training")]
pub struct Cli {
    /// Log compiler passes and their timings to standard error.
    #[arg(short, long, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Train a model and print its test accuracy.
    Train(TrainArgs),
    /// Compile a model and write its graph, dot, plan or placement report.
    Compile(CompileArgs),
}

/// `--cuda-contexts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CudaContexts {
    PerGpu,
    One,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Model {
    Mlp,
    Convnet,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Act {
    Relu,
    Sigmoid,
    Tanh,
    Swish,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Opt {
    Sgd,
    Momentum,
    Adam,
    /// TF1's RMSPropOptimizer defaults: decay 0.9, momentum 0 (or --momentum M), epsilon 1e-10.
    Rmsprop,
    /// TF1's AdagradOptimizer: initial accumulator 0.1.
    Adagrad,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Vars {
    Cpu,
    Gpu0,
    RoundRobin,
    Greedy,
    /// The fastest placement the cost model predicts on this machine (`towers::cost`).
    Auto,
    /// Sharded over --ps-tasks parameter-server tasks (/job:ps/task:k), as
    /// TF1's replica_device_setter; under mpirun task k runs on rank k mod N,
    /// which alone updates its variables and keeps their optimizer slots
    /// (ZeRO-1), then broadcasts the new values.
    Ps,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum PsStrat {
    /// Task i mod K for the i-th variable (replica_device_setter's default).
    RoundRobin,
    /// The least-loaded task by bytes so far (TF's GreedyLoadBalancingStrategy).
    Greedy,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Bn {
    Tower0,
    Mean,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Emit {
    Graph,
    Dot,
    Plan,
    PlanJson,
    Placement,
    /// The CUDA C of every kernel the plan launches, one file each, into the folder given by -o.
    Cuda,
    /// The fused launches: one line per launch, its kernel, lead node and members.
    Fusions,
}

/// Model and tower options shared by `train` and `compile`.
#[derive(Args, Clone)]
pub struct Common {
    /// Which network.
    #[arg(long, value_enum, default_value = "mlp")]
    pub model: Model,
    /// Train or compile the model saved in this file instead of a seed model
    /// (`towers::trainer::Model::save_json`: the graph and the names of its loss,
    /// placeholders, predictions and training accuracy).
    #[arg(long, value_name = "MODEL.json", conflicts_with_all = ["model", "hidden", "activation", "batch_norm"])]
    pub graph: Option<PathBuf>,
    /// Batch norm after each convolution (--model convnet only).
    #[arg(long)]
    pub batch_norm: bool,
    /// Hidden widths of the MLP, comma separated (--model mlp only) [default: 256,256].
    #[arg(long, value_delimiter = ',')]
    pub hidden: Option<Vec<usize>>,
    /// Activation of the MLP's hidden layers (--model mlp only; swish: x * sigmoid(x), built
    /// from two ops that the compiler fuses with their gradients) [default: relu].
    #[arg(long, value_enum)]
    pub activation: Option<Act>,
    /// Optimizer.
    #[arg(long, value_enum, default_value = "momentum")]
    pub optimizer: Opt,
    /// Learning rate (default: 0.001 for adam and rmsprop, 0.05 for adagrad; for sgd and momentum 0.1 for the
    /// MLP and 0.05 for the convnet, the defaults whose worst seed clears the
    /// documented accuracy on every SIMD path, bench/accuracy.sh; 0.05 for --graph).
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f32>,
    /// Momentum coefficient of --optimizer momentum [default: 0.9], or
    /// RMSProp's momentum term with --optimizer rmsprop [default: 0, as TF1];
    /// refused with sgd, adam and adagrad, which have none.
    #[arg(long, allow_negative_numbers = true)]
    pub momentum: Option<f32>,
    /// Nesterov momentum (--optimizer momentum only).
    #[arg(long)]
    pub nesterov: bool,
    /// Global batch size (split across towers).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Number of towers (/gpu:0 .. /gpu:N-1); omit for one device without replication.
    #[arg(long)]
    pub towers: Option<usize>,
    /// Where variables live.
    #[arg(long, value_enum, default_value = "cpu")]
    pub variables: Vars,
    /// With --variables ps: the number of parameter-server tasks
    /// (default: the number of processes, one shard per rank; 1 alone).
    /// Under mpirun task k runs on rank k mod N.
    #[arg(long)]
    pub ps_tasks: Option<u32>,
    /// With --variables ps under mpirun -np N: the last K ranks are
    /// parameter-server ranks that run no towers (they hold the variables
    /// they own and their slots, apply and send the values back); the first
    /// N-K ranks are the workers, which split the batch. --ps-tasks
    /// defaults to K; task k runs on rank N-K + k mod K.
    #[arg(long)]
    pub ps_ranks: Option<u32>,
    /// With --variables ps: how variables are dealt to the tasks.
    #[arg(long, value_enum, default_value = "round-robin")]
    pub ps_strategy: PsStrat,
    /// Split the batch by these weights, one per tower (e.g. 3,1).
    #[arg(long, value_delimiter = ',')]
    pub split_weights: Option<Vec<u32>>,
    /// Accumulate gradients over K micro-batches per tower.
    #[arg(long, default_value_t = 1)]
    pub accumulate: usize,
    /// Clip the averaged gradients to this global L2 norm before the
    /// update (TF1's tf.clip_by_global_norm; 5 is usual for RNNs).
    #[arg(long, value_name = "NORM", allow_negative_numbers = true)]
    pub clip_norm: Option<f32>,
    /// Whose batch statistics update the batch-norm moving averages.
    #[arg(long, value_enum, default_value = "mean")]
    pub bn_updates: Bn,
    /// Seed of initializers, dropout and batch order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Data: `digits` (embedded 8x8), `mnist5k` (embedded real MNIST, 28x28) or `mnist:DIR` (IDX files)
    /// [default: digits].
    #[arg(long)]
    pub data: Option<String>,
    /// Dump the graph (text and dot) after passes into this folder.
    #[arg(long)]
    pub dump_dir: Option<PathBuf>,
    /// Passes to dump after (default: all), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub dump_after: Vec<String>,
    /// With several processes: gradient bucket capacity of the cross-process
    /// all-reduce in MiB (PyTorch DDP's bucket_cap_mb).
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// Give every buffer arena bytes of its own for the whole step (by
    /// default buffers of a device share bytes once their last reader ran).
    #[arg(long)]
    pub no_memory_reuse: bool,
    /// Every graph op its own launch with a buffer of its own: no kernel
    /// fusion (elementwise chains into generated kernels, bias and
    /// activation, a convolution or a matmul with its bias, activation and
    /// pool, the gradients' fusions, the cross-entropy's, the optimizer
    /// updates of one device as one launch) and no in-place gradients,
    /// e.g. to compare a fused run with the plain one.
    #[arg(long)]
    pub no_fusion: bool,
    /// On the CUDA backend, launch every step's kernels from the host
    /// instead of replaying the step as a CUDA graph.
    #[arg(long)]
    pub no_cuda_graphs: bool,
    /// On --backend cuda, the CUDA contexts of the plan's GPU devices:
    /// per-gpu gives each logical GPU a context of its own on GPU i mod n
    /// (the placement the compiler reports, on any number of GPUs); one
    /// runs every logical GPU as streams of one context on GPU 0 (towers
    /// sharing one GPU then overlap, and the step replays as one CUDA graph).
    /// Default: per-gpu in one process; one under several processes, where
    /// NCCL's all-reduce of the GPUs' gradients runs in one context.
    #[arg(long, value_enum)]
    pub cuda_contexts: Option<CudaContexts>,
    /// Where `--variables auto` and `--explain-cost` cache their
    /// calibrations (by machine and plan hash).
    #[arg(long, default_value = "target/towers-cost")]
    pub cost_cache: PathBuf,
}

#[derive(Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub common: Common,
    /// Number of training steps (overrides --epochs).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Number of passes over the training set (default: 40 for the MLP, 20 for
    /// the convnet and --graph).
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Print `step N loss L` every N steps (with `train acc A` when the
    /// model has a training accuracy: the seed models, and --graph files that name one).
    #[arg(long, default_value_t = 0)]
    pub log_every: usize,
    /// Save variables here at the end (safetensors, written atomically).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Restore from --checkpoint first, when the file exists. Strict, as
    /// TF1's Saver: the checkpoint must be of the same model (every
    /// variable with its dtype and shape, no other tensor, the same model
    /// options) and hold only finite values.
    #[arg(long)]
    pub resume: bool,
    /// With --resume: load only the checkpoint's model variables that match
    /// this model by name, dtype and shape (fine tuning); the others keep
    /// their initial values, and every skipped tensor is printed before the
    /// first step. global_step, the learning rate and the optimizer slots
    /// start fresh (TF1 fine tuning): --steps N trains N steps. Non-finite
    /// values are still refused.
    #[arg(long)]
    pub restore_partial: bool,
    /// Replace an existing --checkpoint that this run does not resume, and
    /// write beside step-stamped files of another run (which --keep then
    /// never deletes). Without it such a run is refused before it starts.
    #[arg(long)]
    pub overwrite: bool,
    /// Also write --checkpoint every N steps (atomically; never from a diverged state).
    #[arg(long)]
    pub checkpoint_every: Option<usize>,
    /// Also write --checkpoint when S seconds passed since the last save
    /// (above 0, at most 1e9).
    #[arg(long)]
    pub checkpoint_secs: Option<f64>,
    /// Keep the last K step-stamped checkpoints (STEM-<global_step>.EXT) beside --checkpoint;
    /// only this run's series is pruned.
    #[arg(long)]
    pub keep: Option<usize>,
    /// Print `step N test accuracy A` on the held-out split every N steps.
    #[arg(long)]
    pub eval_every: Option<usize>,
    /// When the loss stops being finite, name the first node whose output is not finite
    /// (keeps every tensor readable after the step: implies --no-memory-reuse).
    #[arg(long)]
    pub check_numerics: bool,
    /// Learning-rate schedule: constant, step (x --lr-decay-rate every --lr-decay-steps), exponential (the same,
    /// continuously) or cosine (to --lr-min;
    /// the default: it makes the final accuracy depend far less on the rounding of one SIMD path).
    #[arg(long, default_value = "cosine")]
    pub lr_schedule: LrScheduleKind,
    /// Step and exponential decay: steps between decays [default: 1000].
    #[arg(long)]
    pub lr_decay_steps: Option<usize>,
    /// Step and exponential decay: the factor of each decay [default: 0.5].
    #[arg(long, allow_negative_numbers = true)]
    pub lr_decay_rate: Option<f32>,
    /// Cosine: the learning rate at the end of the run [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pub lr_min: Option<f32>,
    /// Linear warmup of the learning rate over the first N steps.
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: usize,
    /// The linear scaling rule (Goyal et al. 2017): lr x global batch / 256.
    #[arg(long)]
    pub scale_lr: bool,
    /// Which backend runs the step: cpu, cuda (an error naming what is
    /// missing when it cannot start), or auto (cuda when a driver, a GPU,
    /// NVRTC and cuBLAS are all present, else cpu). The run prints which.
    #[arg(long, default_value = "cpu")]
    pub backend: BackendChoice,
    /// Write TensorBoard event files (scalars, the placed graph) into this folder.
    #[arg(long)]
    pub logdir: Option<PathBuf>,
    /// Draw the loss and test-accuracy curves into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Under an MPI launcher: end every rank when a collective waits this
    /// many seconds for another rank (a rank that hung or died); above 0, at
    /// most 1e9.
    #[arg(long, default_value_t = 300.0)]
    pub comm_timeout: f64,
    /// With --variables ps under mpirun: asynchronous parameter servers.
    /// Workers push gradients and pull values without waiting for each
    /// other; each owner applies gradients as they arrive. Not exact: the
    /// results depend on timing. Reports the gradients' staleness.
    #[arg(long)]
    pub ps_async: bool,
    /// Write the last --trace-steps steps as a Chrome trace (JSON for
    /// Perfetto or chrome://tracing): one lane per device stream, every
    /// launch, copy, wait and all-reduce with its node and duration (on the cuda
    /// backend from CUDA timing events; traced steps launch without graphs).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// How many steps --trace writes: the last N of the run.
    #[arg(long, default_value_t = 1)]
    pub trace_steps: usize,
}

#[derive(Args)]
pub struct CompileArgs {
    #[command(flatten)]
    pub common: Common,
    /// What to write (not with --explain-cost, which writes its report).
    #[arg(long, value_enum, default_value = "plan", conflicts_with = "explain_cost")]
    pub emit: Emit,
    /// Output file (default: standard output, also `-o -`); never the --graph file.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// With --emit dot: the collapsed view, one node per name scope per
    /// device, variables grouped by device, edges labelled with bytes per step.
    #[arg(long)]
    pub collapse: bool,
    /// Input geometry HxWxC when not taken from --data (e.g. 28x28x1).
    #[arg(long)]
    pub input: Option<String>,
    /// Compile for a group of this many processes (what `mpirun -np N towers
    /// train` runs), as rank --rank; see that rank's plan, buckets and devices.
    #[arg(long, default_value_t = 1)]
    pub world_size: usize,
    /// Which rank of --world-size to compile for.
    #[arg(long, default_value_t = 0)]
    pub rank: usize,
    /// Instead of --emit: for each placement (cpu, gpu0, round-robin,
    /// greedy) at 1, 2 and 4 towers and at --towers (a count --batch does
    /// not split over is skipped, saying so), written to -o or standard output, the cost model's predicted compute per
    /// device, transfer per link, step and critical path on this machine
    /// (calibrated on --backend: the CPU backend, or with cuda a mixed CUDA
    /// session; cached under --cost-cache, keyed by machine and backend).
    #[arg(long)]
    pub explain_cost: bool,
    /// With --emit placement: say where each device runs on this backend
    /// on this machine (cpu, cuda or auto, as `towers train --backend`).
    #[arg(long, default_value = "cpu")]
    pub backend: BackendChoice,
}
