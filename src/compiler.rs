//! The compiler: a model graph and its loss in, a placed graph and a `Plan`
//! out. This is what a TF1 user wrote by hand for multi-GPU training
//! (`tf.split`, `tower_i` scopes, reused variables, `average_gradients`,
//! `apply_gradients` on `/cpu:0`), done as passes:
//!
//! ```text
//! prune -> autodiff -> bind_batch -> [replicate -> split -> grad_mean] -> simplify -> apply -> place -> schedule -> lower
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
    Replicate, ScheduleStreams, Simplify, SplitBatch, SplitPolicy, TensorRef, VarPlacement,
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
    /// Fuse each variable's tower reduction into its optimizer update (on by
    /// default; off keeps every reduction a separate launch, e.g. to time it).
    pub fuse_reductions: bool,
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
        .add(Simplify)
        .add(ApplyOptimizer { optimizer: opts.optimizer.clone() })
        .add(Place { strategy: opts.variables, devices: opts.towers.clone() })
        .add(ScheduleStreams);
    let mut pm = dump(pm, &opts.dump_dir, &opts.dump_after);
    pm.run(&mut g, &mut st)?;
    let plan = lower(
        &g,
        &st,
        &LowerOptions { fuse_reductions: opts.fuse_reductions, ..LowerOptions::new(Mode::Train, "train") },
    )?;
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
        .add(Simplify)
        .add(Place { strategy: VarPlacement::Cpu, devices: Vec::new() })
        .add(ScheduleStreams);
    pm.run(&mut g, &mut st)?;
    let plan = lower(&g, &st, &LowerOptions::new(Mode::Eval, "eval"))?;
    Ok(Compiled { graph: g, state: st, plan, timings: pm.timings })
}

/// Whether a graph has ops whose train and eval behaviour differ.
pub fn has_mode_dependent_ops(g: &Graph) -> bool {
    g.node_ids().iter().any(|&i| matches!(g.node(i).op, Op::Dropout { .. } | Op::BatchNorm { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{build, ModelKind, ModelSpec};
    use towers_graph::{text::to_text, verify::verify, F32};
    use towers_passes::{Pass, Simplify};

    /// A seed model's training graph just before `simplify` (the passes of
    /// `compile_train` up to `grad_mean`), at a global batch of 32.
    fn before_simplify(kind: ModelKind, towers: u32) -> (Graph, CompileState) {
        let model = build(&ModelSpec::new(kind, [8, 8, 1], 10)).expect("model");
        let mut g = model.graph.clone();
        let mut roots = vec![g.find(&model.loss).expect("loss")];
        roots.extend(g.collection(keys::UPDATE_OPS).iter().filter_map(|n| g.get(n)));
        prune(&mut g, &roots);
        let mut st = CompileState {
            loss: Some(TensorRef::new(&model.loss, 0)),
            var_list: g.collection(keys::TRAINABLE_VARIABLES).to_vec(),
            ..Default::default()
        };
        let mut pm = PassManager::new().verify(true).add(Autodiff).add(BindBatch { batch: 32 });
        if towers > 0 {
            pm = pm
                .add(Replicate {
                    towers: (0..towers).map(Device::gpu).collect(),
                    accumulate: 1,
                    bn_updates: BnUpdates::default(),
                })
                .add(SplitBatch { policy: SplitPolicy::Even })
                .add(GradMean);
        }
        pm.run(&mut g, &mut st).expect("front passes");
        (g, st)
    }

    /// Node counts before and after `simplify`, and the simplified graph's text.
    fn simplify(kind: ModelKind, towers: u32) -> (usize, usize, String) {
        let (mut g, mut st) = before_simplify(kind, towers);
        let before = g.len();
        Simplify.run(&mut g, &mut st).expect("simplify");
        verify(&g, "simplify", false).expect("the simplified graph verifies");
        assert!(st.diagnostics.is_empty(), "{:?}", st.diagnostics);
        (before, g.len(), to_text(&g).expect("text"))
    }

    /// Per tower, the ReduceMean gradient (7 nodes: two ones, BroadcastLike,
    /// Sum, RealDiv, BroadcastLike, Reshape) becomes one scalar constant
    /// feeding the existing Mul, and the `logits` Identity goes: 7 nodes fewer.
    #[test]
    fn simplify_shrinks_the_seed_training_graphs() {
        for (kind, towers, before, after) in [
            (ModelKind::Mlp, 0, 39, 32),
            (ModelKind::Mlp, 2, 79, 65),
            (ModelKind::Convnet, 0, 55, 48),
            (ModelKind::Convnet, 2, 111, 97),
        ] {
            let (b, a, text) = simplify(kind, towers);
            if std::env::var_os("SIMPLIFY_DUMP").is_some() {
                eprintln!("{kind:?} towers={towers}: {b} -> {a}\n{text}");
            }
            assert_eq!((b, a), (before, after), "{kind:?} with {towers} towers");
            assert!(!text.contains("BroadcastLike"), "{text}");
            assert!(
                text.contains("Const { value: ConstValue { dtype: F32, shape: [], data: [0.03125] } }") || towers > 0
            );
            let (_, _, again) = simplify(kind, towers);
            assert_eq!(text, again, "simplify is deterministic");
        }
    }

    /// Simplifying twice changes nothing more.
    #[test]
    fn simplify_is_idempotent() {
        let (mut g, mut st) = before_simplify(ModelKind::Convnet, 2);
        Simplify.run(&mut g, &mut st).expect("simplify");
        let once = to_text(&g).expect("text");
        Simplify.run(&mut g, &mut st).expect("simplify again");
        assert_eq!(once, to_text(&g).expect("text"));
    }

    /// The training program still compiles and the loss and every gradient keep their names.
    #[test]
    fn compiled_programs_keep_their_named_tensors() {
        let model = build(&ModelSpec::new(ModelKind::Convnet, [8, 8, 1], 10)).expect("model");
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 32);
        o.towers = (0..2).map(Device::gpu).collect();
        let c = compile_train(&model.graph, &model.loss, &o).expect("compiles");
        for t in c.state.grads.values().chain(c.state.loss.iter()) {
            assert!(c.graph.get(&t.node).is_some(), "{t} is gone");
        }
        let e = compile_eval(&model.graph, &[("predictions", &model.predictions)], 16).expect("eval compiles");
        assert!(e.graph.get(&model.predictions).is_some());
    }
}
