//! The compiler: a model graph and its loss in, a placed graph and a `Plan`
//! out. This is what a TF1 user wrote by hand for multi-GPU training
//! (`tf.split`, `tower_i` scopes, reused variables, `average_gradients`,
//! `apply_gradients` on `/cpu:0`), done as passes:
//!
//! ```text
//! prune -> [open_batch] -> autodiff -> bind_batch -> [replicate -> split -> grad_mean] -> simplify -> [tower_cse] -> [tower_matmul] -> apply -> place -> schedule -> lower
//! ```
//! The bracketed passes run when towers are given. The pass lists live in
//! [`towers_passes::pipeline`]; this module runs one and lowers the graph it
//! returns (codegen reads the graph's program record, nothing else). The
//! evaluation program is compiled from the same model graph, forward only,
//! on one device; it shares the variables with the training program by name.

use thiserror::Error;
use towers_codegen::{lower, CodegenError, LowerOptions, Mode, Plan};
use towers_graph::{Graph, GraphError, Op};
use towers_passes::{pipeline, CompileState, PassError, PassTiming, PipelineOutput};

pub use towers_passes::prune::prune;
pub use towers_passes::CompileOptions;

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

/// The result of a compilation.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The placed, scheduled graph (its program record holds the fetches and the schedule).
    pub graph: Graph,
    pub state: CompileState,
    pub plan: Plan,
    pub timings: Vec<PassTiming>,
}

/// Compile the training program of `model` (whose scalar loss is the node `loss`).
pub fn compile_train(model: &Graph, loss: &str, opts: &CompileOptions) -> Result<Compiled, CompileError> {
    let PipelineOutput { graph, state, timings } = pipeline::train(model, loss, opts)?;
    lower_train(graph, state, timings, opts)
}

/// Compile a training graph whose towers the user built by hand, as
/// cifar10_multi_gpu_train.py did (`tf.split` of the batch, a `tower_i`
/// name scope and `/gpu:i` device per tower, variables reused, `gradients`
/// per tower, [`towers_passes::average_gradients`],
/// [`towers_passes::apply_gradients`]): everything after the user's
/// `apply_gradients`, i.e. the fetches ("loss" is the node `loss`), the one
/// train op, one moving-average update per batch-norm variable
/// (`opts.bn_updates`, see [`towers_passes::manual`]), batch binding,
/// `simplify`, placement (`opts.variables`; the devices are `opts.towers`,
/// or the GPUs the graph's device scopes name), the stream schedule and
/// lowering. TF1 has no such function: there `sess.run(train_op)` ran the
/// graph as built. Options that only the compiler's own towers use
/// (`split`, `accumulate`, `fold_tower_matmuls`, `merge_tower_duplicates`,
/// `process`) are ignored; `optimizer` too (the graph has its apply nodes).
/// `fetches` are fetched as the graph computes them (a per-tower metric is
/// the user's to combine, e.g. with `average_gradients` as the loss).
///
/// Seed 000's loop compiled this way equals [`compile_train`]'s towers bit
/// for bit, dropout and batch norm included, when both are built with the
/// same graph seed and the automatic towers neither fold the weight
/// gradients into one product nor merge the towers' duplicates
/// (`fold_tower_matmuls = false`, `merge_tower_duplicates = false`), since
/// those reorder sums.
pub fn compile_manual(graph: &Graph, loss: &str, opts: &CompileOptions) -> Result<Compiled, CompileError> {
    let PipelineOutput { graph, state, timings } = pipeline::manual(graph, loss, opts)?;
    lower_train(graph, state, timings, opts)
}

/// Lower a training pipeline's output with the options' fusion and memory
/// choices: the one lowering both [`compile_train`] and [`compile_manual`] use.
fn lower_train(
    graph: Graph,
    state: CompileState,
    timings: Vec<PassTiming>,
    opts: &CompileOptions,
) -> Result<Compiled, CompileError> {
    let plan = lower(&graph, &train_lower_options(opts))?;
    Ok(Compiled { graph, state, plan, timings })
}

/// The lowering options of a training program compiled with `opts`.
pub fn train_lower_options(opts: &CompileOptions) -> LowerOptions {
    LowerOptions {
        fuse_reductions: opts.fuse_reductions,
        fuse_tower_updates: opts.fuse_tower_updates,
        fuse_kernels: opts.fuse_kernels,
        reuse_memory: opts.reuse_memory,
        ..LowerOptions::new(Mode::Train, "train")
    }
}

impl Compiled {
    /// The fused launches lowering made of this training program, compiled
    /// with `opts` (one group per launch: its kernel, lead and members).
    pub fn fusions(&self, opts: &CompileOptions) -> Result<towers_codegen::fusion::FusionPlan, CompileError> {
        Ok(towers_codegen::fusion::find_fusions(&self.graph, &train_lower_options(opts))?)
    }

    /// Log (tracing, debug) each pass's time and the whole compile's,
    /// started at `since`: what `-v` shows.
    pub fn log_timings(&self, since: std::time::Instant) {
        for t in &self.timings {
            tracing::debug!(pass = t.pass, micros = t.elapsed.as_micros() as u64, "compiler pass");
        }
        tracing::debug!(
            micros = since.elapsed().as_micros() as u64,
            nodes = self.graph.len(),
            events = self.plan.num_events,
            "compiled the training program"
        );
    }
}

/// Compile a forward-only evaluation program fetching `fetches` (user name,
/// node name) at batch size `batch`, on one device.
pub fn compile_eval(model: &Graph, fetches: &[(&str, &str)], batch: usize) -> Result<Compiled, CompileError> {
    let PipelineOutput { graph, state, timings } = pipeline::eval(model, fetches, batch)?;
    let plan = lower(&graph, &LowerOptions::new(Mode::Eval, "eval"))?;
    Ok(Compiled { graph, state, plan, timings })
}

/// Whether a graph has ops whose train and eval behaviour differ.
pub fn has_mode_dependent_ops(g: &Graph) -> bool {
    g.node_ids().iter().any(|&i| matches!(g.node(i).op, Op::Dropout { .. } | Op::BatchNorm { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{build, ModelKind, ModelSpec};
    use towers_graph::{text::to_text, verify::verify, Device, Optimizer, F32};
    use towers_passes::{Pass, Pipeline, Simplify};

    /// A seed model's training graph just before `simplify` (the passes of
    /// `compile_train` up to `grad_mean`), at a global batch of 32.
    fn before_simplify(kind: ModelKind, towers: u32) -> (Graph, CompileState) {
        let model = build(&ModelSpec::new(kind, [8, 8, 1], 10)).expect("model");
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 32);
        o.towers = (0..towers).map(Device::gpu).collect();
        let front = Pipeline::train(&model.loss, &o).before("simplify").expect("the pipeline simplifies");
        let out = front.verify(true).run(&model.graph).expect("front passes");
        (out.graph, out.state)
    }

    /// Node counts before and after `simplify`, and the simplified graph's text.
    fn simplify(kind: ModelKind, towers: u32) -> (usize, usize, String) {
        let (mut g, mut st) = before_simplify(kind, towers);
        let before = g.len();
        Simplify::default().run(&mut g, &mut st).expect("simplify");
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
        Simplify::default().run(&mut g, &mut st).expect("simplify");
        let once = to_text(&g).expect("text");
        Simplify::default().run(&mut g, &mut st).expect("simplify again");
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
