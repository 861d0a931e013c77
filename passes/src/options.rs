//! Options of the tower passes: how the batch is split, where variables
//! live, and whose batch-norm statistics update the moving averages; and
//! [`CompileOptions`], everything a training compilation is asked for.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use towers_graph::{Device, Optimizer};

/// Options of a training compilation (the pipeline's passes and the lowering after it).
///
/// ```
/// use towers_graph::{Device, Optimizer, F32};
/// use towers_passes::CompileOptions;
/// let mut opts = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 64);
/// opts.towers = vec![Device::gpu(0), Device::gpu(1)];
/// ```
#[derive(Debug, Clone)]
pub struct CompileOptions {
    /// Tower devices (`/gpu:0`..); empty compiles for one device without replication.
    pub towers: Vec<Device>,
    /// Where variables live.
    pub variables: VarPlacement,
    pub optimizer: Optimizer,
    /// How the global batch is split across towers.
    pub split: SplitPolicy,
    /// Micro-batches accumulated per tower per step (1 = none).
    pub accumulate: usize,
    /// Whose batch statistics update batch norm's moving averages.
    pub bn_updates: BnUpdates,
    /// The global batch size.
    pub batch: usize,
    /// Where to dump the graph after passes, and after which ("all" for every pass).
    pub dump_dir: Option<PathBuf>,
    pub dump_after: Vec<String>,
    /// Fuse each variable's tower reduction into its optimizer update (on by
    /// default: a `TowerMean` into a `MeanApply`, and, with
    /// `fuse_tower_updates`, a folded tower product into a plain SGD or
    /// non-Nesterov momentum update; off keeps every reduction a separate
    /// launch, e.g. to time it).
    /// Read by lowering, not by the passes.
    pub fuse_reductions: bool,
    /// Fuse elementwise neighbours into one launch (bias + activation, a
    /// convolution with both, an activation gradient with its bias
    /// gradient) and run activation gradients in place; on by default.
    /// Read by lowering, not by the passes.
    pub fuse_kernels: bool,
    /// This process's place among the processes training together (MPI
    /// ranks). World size 1 (the default) compiles exactly as a single
    /// process always did; above 1, `towers` are this process's local towers
    /// (at least one: none means one on `/gpu:0`), `batch` is still the
    /// global batch over all towers of all processes, and `split` divides it
    /// over all of them (weights: one per tower of every rank, rank by rank).
    pub process: ProcessGroup,
    /// Gradient bucket capacity in bytes for the cross-process all-reduce
    /// (PyTorch DDP's `bucket_cap_mb`, default 25 MiB): gradients are packed,
    /// in the order the backward pass finishes them, into buckets of at most
    /// this many bytes (a larger gradient gets a bucket of its own).
    pub bucket_bytes: usize,
    /// Let buffers of one device share arena bytes by liveness (on by
    /// default; off, every tensor keeps its bytes for the whole step and can
    /// be read after it). Read by lowering, not by the passes.
    pub reuse_memory: bool,
    /// Fold each weight gradient's mean over the replicas into one product
    /// over the whole batch (the `tower_matmul` pass), which the CPU
    /// runtime splits between two idle tower threads. Off by default: each
    /// tower then computes its own replica's product from the activations
    /// in its own core's cache, and only the gradients cross cores, as
    /// streaming reads. Measured on a 2-vCPU VM (MLP 784-256-256-10, two
    /// towers, AVX2): equal when the host runs the vCPUs close (cross-core
    /// reads at ~110 GB/s, `bench/probes/xcore.c`), 4-6% slower folded when
    /// it runs them apart (~40 GB/s), where the folded product reads the
    /// other core's activations inside the GEMM. Never for GPUs (each GPU
    /// computes its own replica's product) or across processes (the
    /// reduction is an all-reduce of each process's part).
    pub fold_tower_matmuls: bool,
    /// With `fuse_reductions`: a folded tower product read only by a plain
    /// SGD or non-Nesterov momentum update accumulates straight into the
    /// variable (or its accumulator) in one launch, `TowerMatMulApply`, and
    /// its gradient is never stored. On by default; off keeps the product
    /// and the update apart (e.g. to time what it saves). Read by lowering.
    pub fuse_tower_updates: bool,
    /// Compute once what every tower computes the same from shared state
    /// alone (the `tower_cse` pass: an L2 weight-decay term per tower, its
    /// gradient): on by default, for the CPU backend, where the towers
    /// share one memory and the other towers read the first tower's
    /// result in place. Exact (no bit changes). Off for plans meant for
    /// GPUs, where each other device would copy the result instead of
    /// recomputing it (`towers train` turns it off for `--backend cuda|auto`).
    pub merge_tower_duplicates: bool,
    /// Extra fetches of the training program, `(user name, node name)`
    /// (output 0), besides "loss": TF1's `sess.run([train_op, loss, acc])`
    /// named at compile time. A fetch the towers compute (a training
    /// accuracy) is computed in every tower and, being a scalar, combined
    /// across the towers as the loss is: a mean over the batch by each
    /// tower's share, a sum over the batch (a count of correct examples)
    /// added up, so that it is the value one device computes on the whole
    /// batch (anything else is averaged by the shares, with a diagnostic).
    /// A fetch whose axis 0 is the batch's rows (a final RNN state fed
    /// back as the next initial state, i32 predictions) is the towers' rows
    /// concatenated in batch order; any other non-scalar fetch inside the
    /// towers is an error (reduce it, or fetch it from an evaluation
    /// program). Empty by default.
    pub fetches: Vec<(String, String)>,
    /// Clip the averaged gradients to this global L2 norm before the
    /// optimizer applies them (TF1's `tf.clip_by_global_norm(grads, clip)`
    /// on `average_gradients(tower_grads)`; see [`crate::clip`]). `None`
    /// (the default) clips nothing. One process only.
    pub clip_global_norm: Option<f32>,
    /// The variables this training program differentiates and updates, by
    /// name (TF1's `optimizer.minimize(loss, var_list=...)`); empty (the
    /// default) trains every trainable variable the loss reaches. A GAN
    /// compiles its discriminator's program with
    /// `g.trainable_variables_in_scope("D/")` and its generator's with
    /// `"G/"`: each program then reads the other's variables and leaves them
    /// untouched. Every name must be an f32 variable of the graph (a
    /// non-trainable one is allowed, as in TF); one the loss does not reach
    /// is a diagnostic, none reached is [`crate::PassError::NoGradients`].
    pub var_list: Vec<String>,
    /// The optimizer's name (TF1's `AdamOptimizer(lr, name="d_adam")`);
    /// `None` (the default) is the optimizer's type name, reading the
    /// session's one `learning_rate` variable. Named, the program's updates
    /// read their own rate, `<name>/learning_rate` (write it between steps
    /// for a schedule), its slots are `<var>/<name>`, `<var>/<name>_1`, and
    /// Adam's bias correction counts this optimizer's own steps
    /// (`<name>/step`). What lets two training programs of one session
    /// (a GAN's D and G) train at different rates with Adam.
    pub optimizer_name: Option<String>,
}

/// The default gradient bucket capacity: 25 MiB, as PyTorch DDP's `bucket_cap_mb=25`.
pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// One process's place in a group of processes training one model together
/// (an MPI communicator: rank `rank` of `world`). TF1 names the devices of
/// rank `i` `/job:worker/task:i/...`. With `ps_ranks` K > 0
/// (`--ps-ranks K`, `--variables ps`), the last K ranks are
/// parameter-server ranks that run no towers: the first `world - K` ranks
/// are the workers, which split the global batch among themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcessGroup {
    pub rank: usize,
    pub world: usize,
    /// How many of the last ranks are parameter-server ranks (0: none).
    #[serde(default)]
    pub ps_ranks: usize,
}

impl ProcessGroup {
    /// One process alone: world size 1.
    pub const SINGLE: ProcessGroup = ProcessGroup { rank: 0, world: 1, ps_ranks: 0 };

    /// Rank `rank` of `world` processes; an error unless `rank < world`.
    pub fn new(rank: usize, world: usize) -> Result<ProcessGroup, crate::PassError> {
        if world == 0 || rank >= world {
            return Err(crate::PassError::Options(format!(
                "process rank {rank} of world size {world}: the rank must be in 0..{world} and the world size at least 1"
            )));
        }
        Ok(ProcessGroup { rank, world, ps_ranks: 0 })
    }

    /// The same rank with the last `k` ranks as parameter-server ranks
    /// (`--ps-ranks k`); an error naming the flag unless at least one
    /// worker is left (`k < world`).
    pub fn with_ps_ranks(self, k: usize) -> Result<ProcessGroup, crate::PassError> {
        if k > 0 && k >= self.world {
            return Err(crate::PassError::Options(format!(
                "--ps-ranks {k} with {} processes leaves no worker: the last K ranks run no towers, so K must be below the number of processes (mpirun -np {} or more)",
                self.world,
                k + 1
            )));
        }
        Ok(ProcessGroup { ps_ranks: k, ..self })
    }

    /// The ranks that run towers (all of them without `--ps-ranks`).
    pub fn workers(&self) -> usize {
        self.world - self.ps_ranks
    }

    /// Whether this rank is a parameter-server rank (`--ps-ranks`): it runs
    /// no towers, feeds no data and takes part in the collectives with
    /// `-0.0`-filled buffers.
    pub fn is_ps_rank(&self) -> bool {
        self.rank >= self.workers()
    }

    /// Whether this is one process alone (no cross-process collectives).
    pub fn is_single(&self) -> bool {
        self.world == 1
    }

    /// TF1's name of this process's job and task, `/job:worker/task:<rank>`.
    pub fn task(&self) -> String {
        if self.is_ps_rank() {
            return format!("/job:ps/task:{}", self.rank - self.workers());
        }
        format!("/job:worker/task:{}", self.rank)
    }
}

impl Default for ProcessGroup {
    fn default() -> ProcessGroup {
        ProcessGroup::SINGLE
    }
}

impl CompileOptions {
    pub fn new(optimizer: Optimizer, batch: usize) -> CompileOptions {
        CompileOptions {
            towers: Vec::new(),
            variables: VarPlacement::Cpu,
            optimizer,
            split: SplitPolicy::Even,
            accumulate: 1,
            bn_updates: BnUpdates::default(),
            batch,
            dump_dir: None,
            dump_after: Vec::new(),
            fuse_reductions: true,
            fuse_kernels: true,
            process: ProcessGroup::SINGLE,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            reuse_memory: true,
            fold_tower_matmuls: false,
            fuse_tower_updates: true,
            merge_tower_duplicates: true,
            fetches: Vec::new(),
            clip_global_norm: None,
            var_list: Vec::new(),
            optimizer_name: None,
        }
    }
}

/// How `split` divides the global batch across the replicas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum SplitPolicy {
    /// Equal shares; the global batch must divide by towers × micro-batches.
    #[default]
    Even,
    /// Shares proportional to one weight per tower (`[3, 1]` on 256 gives
    /// 192 and 64). Every share must be an exact integer: no example is
    /// ever dropped or duplicated.
    Weighted(Vec<u32>),
}

/// Where `place` puts variables (TF's "variables on the CPU or on GPU 0", or sharded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum VarPlacement {
    /// All on `cpu:0` (cifar10_multi_gpu_train.py's choice).
    #[default]
    Cpu,
    /// All on the first tower device.
    Gpu0,
    /// Round-robin over the tower devices in variable creation order
    /// (TF's `replica_device_setter` default).
    RoundRobin,
    /// By byte size (variable plus its optimizer slots), largest first, ties
    /// by name, each onto the least-loaded tower device (ties by device
    /// order). Sorting first makes it independent of creation order, unlike
    /// TF's `GreedyLoadBalancingStrategy`.
    Greedy,
    /// Sharded over `tasks` parameter-server tasks, `/job:ps/task:k` (TF1's
    /// `replica_device_setter`): each variable gets an owner task by
    /// `strategy` (see [`crate::ps`]); in this process its value and slots
    /// live on the host (`cpu:0`). Across processes, the owner alone keeps
    /// the variable's optimizer slots and applies its updates.
    Ps { tasks: u32, strategy: PsStrategy },
}

/// How `--variables ps` picks each variable's owner task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum PsStrategy {
    /// Task `i mod K` for the `i`-th variable in creation order (TF's
    /// `_RoundRobinStrategy`, `replica_device_setter`'s default).
    #[default]
    RoundRobin,
    /// The least-loaded task so far (ties: the lowest), in creation order,
    /// its load growing by the variable's bytes (TF's
    /// `GreedyLoadBalancingStrategy` with `byte_size_load_fn`).
    Greedy,
}

impl PsStrategy {
    /// The short name used in placement reasons and flags (`round_robin`, `greedy`).
    pub fn name(self) -> &'static str {
        match self {
            PsStrategy::RoundRobin => "round_robin",
            PsStrategy::Greedy => "greedy",
        }
    }
}

impl VarPlacement {
    /// The short name used in placement reasons (`variables=cpu`).
    pub fn name(self) -> &'static str {
        match self {
            VarPlacement::Cpu => "cpu",
            VarPlacement::Gpu0 => "gpu0",
            VarPlacement::RoundRobin => "round_robin",
            VarPlacement::Greedy => "greedy",
            VarPlacement::Ps { .. } => "ps",
        }
    }
}

/// Whose batch statistics feed the batch-norm moving averages (`update_ops`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum BnUpdates {
    /// Tower 0's statistics only: what TF1 recipes did (cifar10_estimator,
    /// tf_cnn_benchmarks take the first tower; Inception the last), on the
    /// grounds that the statistics "accumulate extremely fast". The other
    /// towers' statistics are computed and thrown away.
    Tower0,
    /// The replicas' statistics combined by one `TowerMean` weighted by the
    /// replicas' shares of the batch (the default: every example counts, as
    /// on one device, up to the mean of per-replica variances).
    #[default]
    Mean,
}
