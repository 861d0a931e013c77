//! The compiler: a model graph and its loss in, a placed graph and a `Plan`
//! out. This is what a TF1 user wrote by hand for multi-GPU training
//! (`tf.split`, `tower_i` scopes, reused variables, `average_gradients`,
//! `apply_gradients` on `/cpu:0`), done as passes:
//!
//! ```text
//! prune -> autodiff -> bind_batch -> [replicate -> split -> grad_mean] -> apply -> place -> schedule -> lower
//! ```
//! The bracketed passes run when towers are given. The evaluation program is
//! compiled from the same model graph, forward only, on one device; it
//! shares the variables with the training program by name.

use std::collections::BTreeSet;
use std::path::PathBuf;

use thiserror::Error;
use towers_codegen::{lower, CodegenError, LowerOptions, Mode, Plan};
use towers_graph::{keys, Device, Graph, GraphError, NodeId, Op, Optimizer};
use towers_passes::{
    ApplyOptimizer, Autodiff, BindBatch, BnUpdates, CompileState, GradMean, PassError, PassManager, PassTiming, Place,
    Replicate, ScheduleStreams, SplitBatch, SplitPolicy, TensorRef, VarPlacement,
};

/// Everything that can go wrong while compiling.
#[derive(Debug, Error)]
pub enum CompileError {
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error(transparent)]
    Pass(#[from] PassError),
    #[error(transparent)]
    Codegen(#[from] CodegenError),
}

/// Options of a training compilation.
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
        }
    }
}

/// The result of a compilation.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The placed, scheduled graph.
    pub graph: Graph,
    pub state: CompileState,
    pub plan: Plan,
    pub timings: Vec<PassTiming>,
}

/// Keep only the ancestors of `roots` (over data and control edges).
pub fn prune(g: &mut Graph, roots: &[NodeId]) {
    let mut keep = BTreeSet::new();
    let mut stack: Vec<NodeId> = roots.to_vec();
    while let Some(n) = stack.pop() {
        if keep.insert(n) {
            stack.extend(g.inputs(n).iter().map(|t| t.node));
            stack.extend(g.control_inputs(n));
        }
    }
    for id in g.node_ids() {
        if !keep.contains(&id) {
            g.remove(id);
        }
    }
}

fn dump(pm: PassManager, opts_dir: &Option<PathBuf>, after: &[String]) -> PassManager {
    match opts_dir {
        Some(d) => pm.dump(d, after),
        None => pm,
    }
}

/// Compile the training program of `model` (whose scalar loss is the node `loss`).
pub fn compile_train(model: &Graph, loss: &str, opts: &CompileOptions) -> Result<Compiled, CompileError> {
    let mut g = model.clone();
    let loss_id = g.find(loss)?;
    let mut roots = vec![loss_id];
    roots.extend(g.collection(keys::UPDATE_OPS).iter().filter_map(|n| g.get(n)));
    prune(&mut g, &roots);
    let mut st = CompileState {
        loss: Some(TensorRef::new(loss, 0)),
        var_list: g.collection(keys::TRAINABLE_VARIABLES).to_vec(),
        ..Default::default()
    };
    let mut pm = PassManager::new().add(Autodiff).add(BindBatch { batch: opts.batch });
    if !opts.towers.is_empty() {
        pm = pm
            .add(Replicate { towers: opts.towers.clone(), accumulate: opts.accumulate, bn_updates: opts.bn_updates })
            .add(SplitBatch { policy: opts.split.clone() })
            .add(GradMean);
    }
    pm = pm
        .add(ApplyOptimizer { optimizer: opts.optimizer.clone() })
        .add(Place { strategy: opts.variables, devices: opts.towers.clone() })
        .add(ScheduleStreams);
    let mut pm = dump(pm, &opts.dump_dir, &opts.dump_after);
    pm.run(&mut g, &mut st)?;
    let plan = lower(&g, &st, &LowerOptions { mode: Mode::Train, program: "train".into() })?;
    Ok(Compiled { graph: g, state: st, plan, timings: pm.timings })
}

/// Compile a forward-only evaluation program fetching `fetches` (user name,
/// node name) at batch size `batch`, on one device.
pub fn compile_eval(model: &Graph, fetches: &[(&str, &str)], batch: usize) -> Result<Compiled, CompileError> {
    let mut g = model.clone();
    let roots: Vec<NodeId> = fetches.iter().map(|(_, n)| g.find(n)).collect::<Result<_, _>>()?;
    prune(&mut g, &roots);
    let mut st = CompileState::default();
    for (user, node) in fetches {
        st.fetches.insert(user.to_string(), TensorRef::new(*node, 0));
    }
    // Evaluation has no update ops and no optimizer.
    g.set_collection(keys::UPDATE_OPS, Vec::new());
    let mut pm = PassManager::new()
        .add(BindBatch { batch })
        .add(Place { strategy: VarPlacement::Cpu, devices: Vec::new() })
        .add(ScheduleStreams);
    pm.run(&mut g, &mut st)?;
    let plan = lower(&g, &st, &LowerOptions { mode: Mode::Eval, program: "eval".into() })?;
    Ok(Compiled { graph: g, state: st, plan, timings: pm.timings })
}

/// Whether a graph has ops whose train and eval behaviour differ.
pub fn has_mode_dependent_ops(g: &Graph) -> bool {
    g.node_ids().iter().any(|&i| matches!(g.node(i).op, Op::Dropout { .. } | Op::BatchNorm { .. }))
}
