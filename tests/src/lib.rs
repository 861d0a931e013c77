//! Helpers shared by the end-to-end tests: small seed models, deterministic
//! batches, and a runner that trains `k` steps under given compiler options
//! and returns the losses and every variable, so that N-tower runs can be
//! compared with the single-device run on the whole batch.

use std::collections::BTreeMap;
use std::sync::Arc;

use towers::compiler::{compile_train, CompileOptions};
use towers::data::Dataset;
use towers::models::{build, Model, ModelKind, ModelSpec};
use towers_graph::{Device, GraphBuilder, Optimizer, Tensor, F32};
use towers_passes::ProcessGroup;
use towers_runtime::comm::{Comm, LocalComm};
use towers_runtime::Session;

/// splitmix64: a deterministic generator for the randomized tests, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// A small model on 8x8 inputs (MLP 64-16-10, or the seed convnet).
pub fn small_model(kind: ModelKind, batch_norm: bool, seed: u64) -> Model {
    let mut s = ModelSpec::new(kind, [8, 8, 1], 10);
    s.hidden = vec![16];
    s.batch_norm = batch_norm;
    s.seed = seed;
    build(&s).expect("the seed models build")
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub losses: Vec<f32>,
    pub variables: BTreeMap<String, Vec<f32>>,
}

/// Deterministic synthetic batches: `steps` batches of `batch` examples.
pub fn batches(batch: usize, steps: usize, seed: u64) -> Vec<(Vec<f32>, Vec<i32>)> {
    let d = Dataset::synthetic(batch * steps, 8, 8, 1, 10, seed).expect("synthetic data");
    (0..steps)
        .map(|s| {
            let imgs = d.images()[s * batch * 64..(s + 1) * batch * 64].to_vec();
            let labels = d.labels()[s * batch..(s + 1) * batch].to_vec();
            (imgs, labels)
        })
        .collect()
}

/// Compile `model` with `opts`, train one step per batch, return losses and variables.
pub fn run(model: &Model, opts: &CompileOptions, data: &[(Vec<f32>, Vec<i32>)]) -> RunResult {
    run_as(model, opts, data, Arc::new(LocalComm::single()))
}

/// As [`run`], as one rank of `comm`: compiled for that rank of a group of
/// `comm.world_size()` processes (`opts.process`), feeding only its rows of
/// every global batch, with the gradients all-reduced through `comm`.
pub fn run_as(model: &Model, opts: &CompileOptions, data: &[(Vec<f32>, Vec<i32>)], comm: Arc<dyn Comm>) -> RunResult {
    run_with(model, opts, data, comm, Box::new(towers_runtime::CpuBackend::new()))
}

/// As [`run`], on `backend` (a mixed session's, for one).
pub fn run_on(
    model: &Model,
    opts: &CompileOptions,
    data: &[(Vec<f32>, Vec<i32>)],
    backend: Box<dyn towers_runtime::Backend>,
) -> RunResult {
    run_with(model, opts, data, Arc::new(LocalComm::single()), backend)
}

/// As [`run_as`], on `backend`.
pub fn run_with(
    model: &Model,
    opts: &CompileOptions,
    data: &[(Vec<f32>, Vec<i32>)],
    comm: Arc<dyn Comm>,
    backend: Box<dyn towers_runtime::Backend>,
) -> RunResult {
    let mut opts = opts.clone();
    let ps_ranks = opts.process.ps_ranks;
    opts.process = ProcessGroup::new(comm.rank(), comm.world_size())
        .and_then(|p| p.with_ps_ranks(ps_ranks))
        .expect("a rank of its group");
    // A parameter-server rank (--ps-ranks) runs no towers: it feeds nothing.
    let feeds = !opts.process.is_ps_rank();
    let rows = opts.process_rows().expect("this rank's rows");
    let c = compile_train(&model.graph, &model.loss, &opts).expect("compiles");
    let mut sess = Session::with_backend(model.spec.seed, backend).with_comm(comm);
    sess.load("train", c.plan).expect("loads");
    // --variables ps across processes: the owners broadcast their values
    // inside the step (the plan's `Step::Broadcast`, `ps_exchange`); slots
    // live on their owner only.
    let slots: Vec<&String> = c.state.ps_groups.iter().flat_map(|g| &g.slots).collect();
    sess.check_replicas_of("before the first step", |n| !slots.iter().any(|s| *s == n)).expect("identical variables");
    let mut losses = Vec::new();
    for (imgs, labels) in data {
        let per = imgs.len() / labels.len();
        if feeds {
            sess.feed("train", &model.images, &imgs[rows.start * per..rows.end * per]).expect("feed images");
            sess.feed("train", &model.labels, &labels[rows.clone()]).expect("feed labels");
        }
        sess.run("train").expect("runs");
        losses.push(sess.fetch::<f32>("train", "loss").expect("loss")[0]);
    }
    let mut variables = BTreeMap::new();
    for name in sess.variable_names() {
        let v = match sess.variable::<f32>(&name) {
            Ok(v) => v,
            Err(_) => {
                sess.variable::<i32>(&name).expect("an f32 or i32 variable").into_iter().map(|x| x as f32).collect()
            }
        };
        variables.insert(name.to_string(), v);
    }
    RunResult { losses, variables }
}

/// Run [`run_as`] on `world` ranks of an in-process group (one thread per
/// rank, the same code path as MPI processes); the ranks' results in rank order.
pub fn run_ranks(model: &Model, opts: &CompileOptions, data: &[(Vec<f32>, Vec<i32>)], world: usize) -> Vec<RunResult> {
    std::thread::scope(|s| {
        let handles: Vec<_> = LocalComm::group(world)
            .into_iter()
            .map(|c| s.spawn(move || run_as(model, opts, data, Arc::new(c))))
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    })
}

/// The largest relative difference between two runs' variables (over all
/// elements: |a-b| / max(1, |b|)), and the variable where it occurs.
pub fn max_rel_diff(a: &RunResult, b: &RunResult) -> (f32, String) {
    let mut worst = (0f32, String::new());
    for (name, vb) in &b.variables {
        let Some(va) = a.variables.get(name) else {
            return (f32::INFINITY, format!("{name} missing"));
        };
        for (x, y) in va.iter().zip(vb) {
            let d = (x - y).abs() / y.abs().max(1.0);
            if d > worst.0 || d.is_nan() {
                worst = (d, name.clone());
            }
        }
    }
    worst
}

/// Run this test binary's test `test` as `np` MPI ranks (`mpirun -np np
/// --oversubscribe`, allowed as root), with `env` set in every rank; the
/// exit status and the ranks' stdout and stderr together. `None` when
/// `mpirun` is missing outside CI (the caller prints SKIPPED); under CI (the
/// variable `CI` set) a missing `mpirun` is a failure, since `.ci/run`
/// installs Open MPI.
pub fn mpirun_self(test: &str, np: usize, env: &[(&str, &str)]) -> Option<(bool, String)> {
    use std::process::Command;
    if Command::new("mpirun").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "mpirun is missing under CI: .ci/run installs openmpi-bin");
        return None;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let session = mpi_session_dir();
    let mut cmd = Command::new("mpirun");
    cmd.args(["-np", &np.to_string(), "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_orte_tmpdir_base", &session);
    for (k, v) in env {
        cmd.args(["-x", &format!("{k}={v}")]);
    }
    let out = cmd.arg(exe).args(["--exact", test, "--nocapture", "--test-threads=1"]).output().expect("mpirun starts");
    let _ = std::fs::remove_dir_all(&session);
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    Some((out.status.success(), text))
}

/// A session folder of its own for one `mpirun` (Open MPI's
/// `orte_tmpdir_base`): launchers started at once by parallel tests
/// otherwise race on the shared one under /tmp ("File exists" from
/// `session_dir.c`).
pub fn mpi_session_dir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "towers-mpi-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// Whether this process is a rank started by an MPI launcher.
pub fn under_mpirun() -> bool {
    std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some()
}

/// The tolerance of the equivalence tests: relative (|a-b| / max(1,|b|))
/// after 3 steps (float reassociation of per-tower and per-rank sums).
pub const TOL: f32 = 2e-5;

/// SGD, Momentum (plain and Nesterov), Adam, RMSProp (with a momentum, so
/// both its slots matter) and Adagrad, as the equivalence tests use them.
pub fn optimizers() -> Vec<Optimizer> {
    vec![
        Optimizer::Sgd { lr: F32(0.1) },
        Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false },
        Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: true },
        Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) },
        Optimizer::RmsProp { lr: F32(0.01), decay: F32(0.9), momentum: F32(0.5), epsilon: F32(1e-10) },
        Optimizer::Adagrad { lr: F32(0.05), initial_accumulator_value: F32(0.1) },
    ]
}

/// Tower devices `/gpu:0` .. `/gpu:n-1`.
pub fn towers(n: u32) -> Vec<Device> {
    (0..n).map(Device::gpu).collect()
}

/// As [`max_rel_diff`] over the variables `a` holds (a rank of a
/// `--variables ps` run holds only its own optimizer slots); a variable of
/// `a` that `b` lacks is an infinite difference.
pub fn max_rel_diff_held(a: &RunResult, b: &RunResult) -> (f32, String) {
    let mut worst = (0f32, String::new());
    for (name, va) in &a.variables {
        let Some(vb) = b.variables.get(name) else {
            return (f32::INFINITY, format!("{name} is not a variable of the reference"));
        };
        if va.len() != vb.len() {
            return (f32::INFINITY, format!("{name} has {} elements, the reference {}", va.len(), vb.len()));
        }
        for (x, y) in va.iter().zip(vb) {
            let d = (x - y).abs() / y.abs().max(1.0);
            if d > worst.0 || d.is_nan() {
                worst = (d, name.clone());
            }
        }
    }
    worst
}

/// The model record of a hand-built graph on the 8x8x1 digits: placeholders
/// `images` and `labels`, a node named `loss`, and `logits` (also the
/// predictions); `seed` is the graph's.
pub fn digits_model(b: GraphBuilder, logits: Tensor, seed: u64) -> Model {
    let mut spec = ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10);
    spec.seed = seed;
    let logits = b.graph().node(logits.node).name.clone();
    Model {
        spec,
        graph: b.finish(),
        images: "images".into(),
        labels: "labels".into(),
        loss: "loss".into(),
        predictions: logits.clone(),
        logits,
    }
}

/// [`digits_model`] with TF's classification loss: `loss` = the batch mean of
/// the sparse softmax cross entropy of `logits` against `labels`.
pub fn mean_xent_model(mut b: GraphBuilder, logits: Tensor, labels: Tensor, seed: u64) -> Model {
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, labels).expect("logits [N, 10], labels [N]");
    let mean = b.reduce_mean(xent, &[0], false).expect("a mean over the batch");
    b.identity(mean, "loss").expect("the loss");
    digits_model(b, logits, seed)
}
