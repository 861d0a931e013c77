//! The options of a training run ([`TrainConfig`]) and what derives from
//! them: the optimizer, the learning-rate schedule, the compiler options and
//! the model spec. Checked by [`crate::guards::validate`] before anything is
//! built (`towers train` and `towers compile` both go through it).
//!
//! Invariant: a field's default here is the CLI's default, so a config
//! built in code trains what the same command line trains.

use std::path::PathBuf;

use towers_graph::layers::Activation;
use towers_graph::{Device, Optimizer, F32};
use towers_passes::{BnUpdates, ProcessGroup, SplitPolicy, VarPlacement};

use crate::compiler::CompileOptions;
use crate::data::{DataSpec, Dataset};
use crate::models::{ModelKind, ModelSpec};
use crate::schedule::{Decay, Schedule};
use crate::train::BackendChoice;

/// Which learning-rate schedule (`--lr-schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LrScheduleKind {
    #[default]
    Constant,
    Step,
    Exponential,
    Cosine,
}

impl std::str::FromStr for LrScheduleKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "constant" => Ok(LrScheduleKind::Constant),
            "step" => Ok(LrScheduleKind::Step),
            "exponential" => Ok(LrScheduleKind::Exponential),
            "cosine" => Ok(LrScheduleKind::Cosine),
            o => Err(format!("unknown learning-rate schedule '{o}': expected constant, step, exponential or cosine")),
        }
    }
}

/// Which optimizer, with its hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerKind {
    Sgd,
    Momentum,
    Adam,
    /// TF1's `RMSPropOptimizer` with its defaults (decay 0.9, momentum 0 unless
    /// [`TrainConfig::rmsprop_momentum`], epsilon 1e-10).
    RmsProp,
    /// TF1's `AdagradOptimizer` with its default initial accumulator 0.1.
    Adagrad,
}

impl std::str::FromStr for OptimizerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sgd" => Ok(OptimizerKind::Sgd),
            "momentum" => Ok(OptimizerKind::Momentum),
            "adam" => Ok(OptimizerKind::Adam),
            "rmsprop" => Ok(OptimizerKind::RmsProp),
            "adagrad" => Ok(OptimizerKind::Adagrad),
            o => Err(format!("unknown optimizer '{o}': expected sgd, momentum, adam, rmsprop or adagrad")),
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
    /// The momentum of `--optimizer momentum`.
    pub momentum: f32,
    pub nesterov: bool,
    /// The momentum term of RMSProp (TF1's `RMSPropOptimizer(momentum=)`,
    /// default 0; the CLI's `--momentum` with `--optimizer rmsprop`).
    pub rmsprop_momentum: f32,
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
    /// With `resume`: load only the tensors that match the model, and say
    /// which were skipped (fine tuning), instead of refusing a checkpoint
    /// of another model ([`crate::resume`]).
    pub restore_partial: bool,
    /// Replace an existing `checkpoint` (and write beside a step-stamped
    /// series) that this run did not resume from ([`crate::saver`]).
    pub overwrite: bool,
    pub dump_dir: Option<PathBuf>,
    pub dump_after: Vec<String>,
    /// Number of towers (0 = one device, no replication).
    pub towers: usize,
    pub variables: VarPlacement,
    pub split_weights: Option<Vec<u32>>,
    pub accumulate: usize,
    pub bn_updates: BnUpdates,
    /// Clip the averaged gradients to this global norm (`--clip-norm`).
    pub clip_norm: Option<f32>,
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
    /// On the CUDA backend, every logical GPU as streams of one context on
    /// GPU 0 (`--cuda-contexts one`) instead of a context per logical GPU.
    pub cuda_one_context: bool,
    /// Write the last `trace_steps` steps of the run here as a Chrome trace
    /// ([`crate::trace`]).
    pub trace: Option<PathBuf>,
    pub trace_steps: usize,
    /// With `--variables ps` across MPI processes: asynchronous parameter
    /// servers ([`crate::trainer::async_fit`]); not exact.
    pub ps_async: bool,
    /// `--ps-ranks K`: the last K processes are parameter-server ranks
    /// that run no towers (0: the ps tasks live on the workers).
    pub ps_ranks: usize,
    /// How long an asynchronous exchange waits for a silent rank (`--comm-timeout`).
    pub comm_timeout: std::time::Duration,
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
            rmsprop_momentum: 0.0,
            batch: 32,
            steps: None,
            epochs: 20,
            seed: 0,
            log_every: 0,
            checkpoint: None,
            resume: false,
            restore_partial: false,
            overwrite: false,
            dump_dir: None,
            dump_after: Vec::new(),
            towers: 0,
            variables: VarPlacement::Cpu,
            split_weights: None,
            accumulate: 1,
            bn_updates: BnUpdates::default(),
            clip_norm: None,
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
            cuda_one_context: false,
            trace: None,
            trace_steps: 1,
            ps_async: false,
            ps_ranks: 0,
            comm_timeout: std::time::Duration::from_secs(300),
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
            OptimizerKind::RmsProp => Optimizer::RmsProp {
                lr: F32(self.base_lr()),
                decay: F32(0.9),
                momentum: F32(self.rmsprop_momentum),
                epsilon: F32(1e-10),
            },
            OptimizerKind::Adagrad => {
                Optimizer::Adagrad { lr: F32(self.base_lr()), initial_accumulator_value: F32(0.1) }
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
            LrScheduleKind::Exponential => Decay::Exponential { every: self.lr_decay_steps, rate: self.lr_decay_rate },
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
        o.clip_global_norm = self.clip_norm;
        o.dump_dir = self.dump_dir.clone();
        o.dump_after = self.dump_after.clone();
        o.reuse_memory = self.memory_reuse && !self.check_numerics;
        o.fuse_kernels = self.fuse_kernels;
        // Each tower computes its own weight gradients (the default; see
        // `CompileOptions::fold_tower_matmuls` for why the fold is opt-in).
        o.fold_tower_matmuls = false;
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

/// Builder-style setters: `TrainConfig::default().with_steps(200).with_towers(2)`.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($field:ident: $ty:ty) $(=> $wrap:path)?;)*) => {
        impl TrainConfig {
            $(
                $(#[$doc])*
                pub fn $name(mut self, value: $ty) -> Self {
                    self.$field = $($wrap)?(value);
                    self
                }
            )*
        }
    };
}

setters! {
    /// The data set (`--data`).
    with_data(data: DataSpec);
    /// The optimizer (`--optimizer`).
    with_optimizer(optimizer: OptimizerKind);
    /// The base learning rate (`--lr`).
    with_lr(lr: f32);
    /// The momentum coefficient (`--momentum`).
    with_momentum(momentum: f32);
    /// The global batch (`--batch`).
    with_batch(batch: usize);
    /// Train this many global steps (`--steps`, overrides `epochs`).
    with_steps(steps: usize) => Some;
    /// Train this many passes over the training set (`--epochs`).
    with_epochs(epochs: usize);
    /// Seed of the initial values, dropout and batch order (`--seed`).
    with_seed(seed: u64);
    /// Number of towers `/gpu:0..N-1` (`--towers`; 0 = one device).
    with_towers(towers: usize);
    /// Where the variables live (`--variables`).
    with_variables(variables: VarPlacement);
    /// Split the batch by these weights, one per tower (`--split-weights`).
    with_split_weights(split_weights: Vec<u32>) => Some;
    /// Report the loss (and training accuracy) every N steps (`--log-every`).
    with_log_every(log_every: usize);
    /// Save the variables here at the end (`--checkpoint`).
    with_checkpoint(checkpoint: PathBuf) => Some;
    /// Restore from the checkpoint first when it exists (`--resume`).
    with_resume(resume: bool);
    /// Also save every N steps (`--checkpoint-every`).
    with_checkpoint_every(checkpoint_every: usize) => Some;
    /// Keep the last K step-stamped checkpoints (`--keep`).
    with_keep(keep: usize) => Some;
    /// Evaluate on the test split every N steps (`--eval-every`).
    with_eval_every(eval_every: usize) => Some;
    /// The learning-rate schedule (`--lr-schedule`).
    with_lr_schedule(lr_schedule: LrScheduleKind);
    /// Linear warmup over the first N steps (`--warmup-steps`).
    with_warmup_steps(warmup_steps: usize);
    /// Which backend runs the step (`--backend`).
    with_backend(backend: BackendChoice);
    /// Write the last steps as a Chrome trace (`--trace`).
    with_trace(trace: PathBuf) => Some;
    /// How many steps the trace keeps (`--trace-steps`).
    with_trace_steps(trace_steps: usize);
    /// The built-in model (`--model`).
    with_model(model: ModelKind);
    /// The MLP's hidden layer widths (`--hidden`).
    with_hidden(hidden: Vec<usize>);
    /// The hidden layers' activation (`--activation`).
    with_activation(activation: Activation);
    /// Batch norm after each hidden layer (`--batch-norm`).
    with_batch_norm(batch_norm: bool);
    /// Nesterov momentum (`--nesterov`).
    with_nesterov(nesterov: bool);
    /// RMSProp's momentum term (`--optimizer rmsprop --momentum M`; 0 by default, as TF1).
    with_rmsprop_momentum(rmsprop_momentum: f32);
    /// Replace an existing checkpoint this run does not resume from (`--overwrite`).
    with_overwrite(overwrite: bool);
    /// Restore only the variables that match (`--restore-partial`, with `resume`).
    with_restore_partial(restore_partial: bool);
    /// Micro-batches accumulated per tower per step (`--accumulate`).
    with_accumulate(accumulate: usize);
    /// Clip the averaged gradients to this global norm (`--clip-norm`).
    with_clip_norm(clip_norm: f32) => Some;
    /// Whose batch statistics update batch norm's moving averages (`--bn-updates`).
    with_bn_updates(bn_updates: BnUpdates);
    /// The evaluation batch (`--eval-batch`).
    with_eval_batch(eval_batch: usize);
    /// Also save every S seconds (`--checkpoint-secs`).
    with_checkpoint_secs(checkpoint_secs: f64) => Some;
    /// Stop at the first non-finite loss or variable (`--check-numerics`).
    with_check_numerics(check_numerics: bool);
    /// Steps per decay of the `exponential`/`step` schedules (`--lr-decay-steps`).
    with_lr_decay_steps(lr_decay_steps: usize);
    /// The decay factor of those schedules (`--lr-decay-rate`).
    with_lr_decay_rate(lr_decay_rate: f32);
    /// The floor of the `cosine` schedule (`--lr-min`).
    with_lr_min(lr_min: f32);
    /// Scale the learning rate by the number of towers (`--scale-lr`).
    with_scale_lr(scale_lr: bool);
    /// Reuse arena bytes between tensors (`--no-memory-reuse` turns it off).
    with_memory_reuse(memory_reuse: bool);
    /// Fuse kernels (`--no-fusion` turns it off).
    with_fuse_kernels(fuse_kernels: bool);
    /// Capture and replay CUDA graphs (`--no-cuda-graphs` turns it off).
    with_cuda_graphs(cuda_graphs: bool);
}

impl TrainConfig {
    /// Check every option as `towers train` does (one process); the first
    /// problem is an error naming its flag ([`crate::train::TrainError::InvalidOption`]).
    pub fn validate(&self) -> Result<(), crate::train::TrainError> {
        crate::guards::validate(self, 1)
    }
}
