//! The pipeline: the train and eval pass lists, written once.
//!
//! ```text
//! train: prune -> [open_batch] -> autodiff -> bind_batch -> [replicate -> split -> grad_mean] -> simplify -> [tower_cse] -> [tower_matmul] -> apply -> place -> {all_reduce -> (ps_exchange)} -> schedule
//! eval:  prune -> bind_batch -> simplify -> place -> schedule
//! manual: bind_batch -> simplify -> place -> schedule
//! ```
//! The manual pipeline compiles towers a user built by hand (seed 000's
//! style: `split`, `tower_i` scopes, `gradients`, `average_gradients`,
//! `apply_gradients`): its run fetches the loss as "loss", runs the one
//! `train_op` of the `train_op` collection, and first merges the towers'
//! moving-average updates ([`crate::manual::merge_tower_updates`]).
//! `open_batch` runs with one process (see [`crate::bind_batch`]); the
//! other bracketed passes run when towers are given (`tower_cse` also needs
//! `opts.merge_tower_duplicates`, `tower_matmul` needs
//! `opts.fold_tower_matmuls` and one process); `all_reduce` runs with
//! several processes (`opts.process`), which also always replicate (one
//! tower on `/gpu:0` when none are given). A run starts from a clone
//! of the model graph: the train pipeline seeds the compile state with the
//! loss and the trainable variables (or `opts.var_list`, checked by
//! [`crate::var_list::check`]), the eval pipeline seeds the program
//! record with the fetches and empties `update_ops` (evaluation updates
//! nothing). It returns the placed, scheduled graph, whose program record
//! (`g.program()`) is all lowering needs, plus the compile state and the
//! pass timings.
//!
//! Tests that need the graph part-way run a prefix of the same list
//! ([`Pipeline::before`]), so no test spells the pass list again.
//!
//! ```
//! use towers_graph::{layers::{dense, Activation}, DType, GraphBuilder, Optimizer, F32};
//! use towers_passes::{pipeline, CompileOptions};
//! let mut b = GraphBuilder::new();
//! let x = b.placeholder("x", DType::F32, [None, Some(4)]).unwrap();
//! let y = b.placeholder("y", DType::I32, [None]).unwrap();
//! let logits = dense(&mut b, "fc", x, 3, Activation::None).unwrap();
//! let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
//! let loss = b.reduce_mean_all(xent).unwrap();
//! let g = b.finish();
//! let loss = g.node(loss.node).name.clone();
//! let opts = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
//! let out = pipeline::train(&g, &loss, &opts).unwrap();
//! assert!(out.graph.program().schedule.is_some());
//! let front = pipeline::Pipeline::train(&loss, &opts).before("simplify").unwrap().run(&g).unwrap();
//! assert!(front.graph.program().schedule.is_none());
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use towers_graph::{keys, Device, Graph};

use crate::manager::{Pass, PassManager, PassTiming};
use crate::options::{CompileOptions, VarPlacement};
use crate::state::{CompileState, PassError, TensorRef};
use crate::{
    AllReduceBuckets, ApplyOptimizer, Autodiff, BindBatch, GradMean, OpenBatch, Place, Prune, PsExchange, Replicate,
    ScheduleStreams, Simplify, SplitBatch, TowerCse, TowerMatMuls,
};

/// What the pipeline compiles: it decides how a run is seeded.
#[derive(Debug, Clone)]
enum Program {
    /// A training step minimizing the scalar loss (a node name, output 0).
    Train { loss: String, fetches: Vec<(String, String)>, var_list: Vec<String> },
    /// A forward-only program fetching (user name, node name) pairs, output 0 each.
    Eval { fetches: Vec<(String, String)> },
    /// A hand-built training graph (its `apply_gradients` already ran),
    /// fetching its loss node.
    Manual { loss: String, bn_updates: crate::options::BnUpdates, fetches: Vec<(String, String)> },
}

/// A list of passes and how to seed them (see the module docs).
pub struct Pipeline {
    program: Program,
    passes: Vec<Box<dyn Pass>>,
    dump: Option<(PathBuf, Vec<String>)>,
    verify: Option<bool>,
}

/// What a pipeline run hands on: the graph (placed and scheduled after a
/// full run; its program record is what lowering reads), the compile state
/// and how long each pass took.
#[derive(Debug, Clone)]
pub struct PipelineOutput {
    pub graph: Graph,
    pub state: CompileState,
    pub timings: Vec<PassTiming>,
}

impl Pipeline {
    /// The training pipeline for the loss node `loss` under `opts` (dumps as `opts` asks).
    pub fn train(loss: &str, opts: &CompileOptions) -> Pipeline {
        let several = !opts.process.is_single();
        // With several processes every process has at least one tower.
        let towers = if several && opts.towers.is_empty() { vec![Device::gpu(0)] } else { opts.towers.clone() };
        let share = opts.process_share();
        // Every replica of every rank the same size: the means' scale folds
        // past the all-reduce (see `all_reduce`).
        let uniform = share
            .as_ref()
            .and_then(|s| s.global_sizes(opts.batch).ok())
            .is_some_and(|v| v.windows(2).all(|w| w[0] == w[1]));
        let mut passes: Vec<Box<dyn Pass>> = vec![Box::new(Prune)];
        // With several processes a placeholder of the global batch is refused
        // by `bind_batch` (no process feeds all of it): nothing to open.
        if share.is_none() {
            passes.push(Box::new(OpenBatch { batch: opts.batch }));
        }
        passes.push(Box::new(Autodiff));
        passes.push(Box::new(BindBatch { batch: opts.batch, share: share.clone() }));
        if !towers.is_empty() {
            passes.push(Box::new(Replicate {
                towers: towers.clone(),
                accumulate: opts.accumulate,
                bn_updates: opts.bn_updates,
            }));
            passes.push(Box::new(SplitBatch { policy: opts.split.clone(), share }));
            passes.push(Box::new(GradMean));
        }
        passes.push(Box::new(Simplify { fuse: opts.fuse_kernels }));
        if opts.merge_tower_duplicates && !towers.is_empty() {
            passes.push(Box::new(TowerCse));
        }
        if opts.fold_tower_matmuls && !towers.is_empty() && !several {
            passes.push(Box::new(TowerMatMuls));
        }
        passes.push(Box::new(ApplyOptimizer {
            optimizer: opts.optimizer.clone(),
            clip_global_norm: opts.clip_global_norm,
            name: opts.optimizer_name.clone(),
        }));
        passes.push(Box::new(Place { strategy: opts.variables, devices: towers }));
        if several {
            passes.push(Box::new(AllReduceBuckets {
                group: opts.process,
                bucket_bytes: opts.bucket_bytes,
                uniform,
                to_owners: matches!(opts.variables, VarPlacement::Ps { .. }),
            }));
            if matches!(opts.variables, VarPlacement::Ps { .. }) {
                passes.push(Box::new(PsExchange { group: opts.process }));
            }
        }
        passes.push(Box::new(ScheduleStreams));
        let dump = opts.dump_dir.clone().map(|d| (d, opts.dump_after.clone()));
        Pipeline {
            program: Program::Train {
                loss: loss.to_string(),
                fetches: opts.fetches.clone(),
                var_list: opts.var_list.clone(),
            },
            passes,
            dump,
            verify: None,
        }
    }

    /// The evaluation pipeline: forward only, on one device (variables on the
    /// host), fetching `fetches` (user name, node name) at batch size `batch`.
    pub fn eval(fetches: &[(&str, &str)], batch: usize) -> Pipeline {
        let passes: Vec<Box<dyn Pass>> = vec![
            Box::new(Prune),
            Box::new(BindBatch::new(batch)),
            Box::new(Simplify::default()),
            Box::new(Place { strategy: VarPlacement::Cpu, devices: Vec::new() }),
            Box::new(ScheduleStreams),
        ];
        let fetches = fetches.iter().map(|(u, n)| (u.to_string(), n.to_string())).collect();
        Pipeline { program: Program::Eval { fetches }, passes, dump: None, verify: None }
    }

    /// The pipeline for towers built by hand (see the module docs), on
    /// `devices` (the towers' devices; `place` refuses a node that asks for
    /// another).
    pub fn manual(loss: &str, opts: &CompileOptions, devices: Vec<Device>) -> Pipeline {
        let passes: Vec<Box<dyn Pass>> = vec![
            Box::new(BindBatch::new(opts.batch)),
            Box::new(Simplify { fuse: opts.fuse_kernels }),
            Box::new(Place { strategy: opts.variables, devices }),
            Box::new(ScheduleStreams),
        ];
        let dump = opts.dump_dir.clone().map(|d| (d, opts.dump_after.clone()));
        Pipeline {
            program: Program::Manual {
                loss: loss.to_string(),
                bn_updates: opts.bn_updates,
                fetches: opts.fetches.clone(),
            },
            passes,
            dump,
            verify: None,
        }
    }

    /// The passes' names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Keep only the passes before the first one named `pass` (the graph as
    /// `pass` would see it); an error if the pipeline has no such pass.
    pub fn before(mut self, pass: &str) -> Result<Pipeline, PassError> {
        let i = self.passes.iter().position(|p| p.name() == pass).ok_or_else(|| {
            PassError::Options(format!("the pipeline has no pass '{pass}' (it runs {})", self.names().join(", ")))
        })?;
        self.passes.truncate(i);
        Ok(self)
    }

    /// Dump the graph (text with its program record, and dot) after every
    /// pass named in `after` ("all": after each) into `dir`.
    pub fn dump(mut self, dir: impl AsRef<Path>, after: &[String]) -> Pipeline {
        self.dump = Some((dir.as_ref().to_path_buf(), after.to_vec()));
        self
    }

    /// Force the graph verifier on or off (default: on in debug builds).
    pub fn verify(mut self, on: bool) -> Pipeline {
        self.verify = Some(on);
        self
    }

    /// Run the passes over a clone of `model`.
    pub fn run(self, model: &Graph) -> Result<PipelineOutput, PassError> {
        let mut g = model.clone();
        let mut st = CompileState::default();
        match &self.program {
            Program::Train { loss, fetches, var_list } => {
                st.loss = Some(TensorRef::new(loss, 0));
                check_fetch_names(&g, fetches, true)?;
                for (user, node) in fetches {
                    g.find(node).map_err(|e| {
                        PassError::Options(format!(
                            "fetch '{user}' of CompileOptions::fetches names a node the graph lacks: {e}"
                        ))
                    })?;
                    g.program_mut().fetches.insert(user.clone(), TensorRef::new(node, 0));
                }
                // Prune drops the variables the loss does not reach.
                st.var_list = if var_list.is_empty() {
                    g.collection(keys::TRAINABLE_VARIABLES).to_vec()
                } else {
                    crate::var_list::check(&g, var_list)?;
                    var_list.clone()
                };
                st.requested_vars = var_list.clone();
            }
            Program::Eval { fetches } => {
                check_fetch_names(&g, fetches, false)?;
                let record = &mut g.program_mut().fetches;
                for (user, node) in fetches {
                    record.insert(user.clone(), TensorRef::new(node, 0));
                }
                // Evaluation has no update ops and no optimizer.
                g.set_collection(keys::UPDATE_OPS, Vec::new());
            }
            Program::Manual { loss, bn_updates, fetches } => {
                g.find(loss)?;
                let train_op = match g.collection(keys::TRAIN_OP) {
                    [one] => one.clone(),
                    [] => {
                        return Err(PassError::Options(format!(
                            "the hand-built graph of loss '{loss}' has no train op: call apply_gradients on the averaged gradients before compile_manual"
                        )))
                    }
                    many => {
                        return Err(PassError::Options(format!(
                            "the hand-built graph has {} train ops ({}); apply_gradients once, on the averaged gradients",
                            many.len(),
                            many.join(", ")
                        )))
                    }
                };
                check_fetch_names(&g, fetches, true)?;
                crate::manual::merge_tower_updates(&mut g, *bn_updates)?;
                st.loss = Some(TensorRef::new(loss, 0));
                let program = g.program_mut();
                program.fetches.insert("loss".into(), TensorRef::new(loss, 0));
                program.train_op = Some(train_op);
                // The user's towers are theirs: a metric is fetched as built
                // (combine per-tower values with average_gradients, as the loss).
                for (user, node) in fetches {
                    g.find(node).map_err(|e| {
                        PassError::Options(format!(
                            "fetch '{user}' of CompileOptions::fetches names a node the graph lacks: {e}"
                        ))
                    })?;
                    g.program_mut().fetches.insert(user.clone(), TensorRef::new(node, 0));
                }
            }
        }
        let mut pm = PassManager::new();
        for p in self.passes {
            pm.push(p);
        }
        if let Some((dir, after)) = &self.dump {
            pm = pm.dump(dir, after);
        }
        if let Some(on) = self.verify {
            pm = pm.verify(on);
        }
        pm.run(&mut g, &mut st)?;
        // The loss is fetched as "loss", and also by the name the user gave
        // it (with towers that node is per tower; the name means the mean).
        if let Program::Train { loss, .. } = &self.program {
            let fetches = &mut g.program_mut().fetches;
            if let Some(mean) = fetches.get("loss").cloned() {
                fetches.entry(loss.clone()).or_insert(mean);
            }
        }
        Ok(PipelineOutput { graph: g, state: st, timings: pm.timings })
    }
}

/// Run the training pipeline (see [`Pipeline::train`]) over `model`.
pub fn train(model: &Graph, loss: &str, opts: &CompileOptions) -> Result<PipelineOutput, PassError> {
    check_replication(opts)?;
    if opts.process.world <= 1 {
        check_one_process_devices(model)?;
    }
    if !opts.towers.is_empty() {
        check_no_hand_towers(model)?;
    }
    Pipeline::train(loss, opts).run(model)
}

/// Refuse replicating a graph that already builds its towers by hand (TF1's
/// `for i in range(num_gpus): with tf.name_scope('tower_%d' % i)` kept in a
/// port): every tower would run every hand-built tower, `tower_0/tower_1/..`.
fn check_no_hand_towers(model: &Graph) -> Result<(), PassError> {
    let mut towers = std::collections::BTreeSet::new();
    for id in model.node_ids() {
        let name = &model.node(id).name;
        let Some(rest) = name.strip_prefix("tower_") else { continue };
        if let Some((i, _)) = rest.split_once('/') {
            if let Ok(i) = i.parse::<usize>() {
                towers.insert(i);
            }
        }
    }
    if towers.len() < 2 {
        return Ok(());
    }
    let scopes: Vec<String> = towers.iter().take(4).map(|i| format!("tower_{i}/")).collect();
    Err(PassError::Options(format!(
        "the graph already builds {} towers by hand ({}...): compile_train replicates the model itself, so each of its towers would run all of them; build the model once (delete the tower loop, keep the scopes' reuse), or compile the hand-built towers as they are with compile_manual",
        towers.len(),
        scopes.join(", ")
    )))
}

/// In one process every device is of task 0 of the worker job (TF1's
/// `/job:localhost/replica:0/task:0`): a device scope naming another task
/// or a job towers does not run would be placed on this process's device
/// with its job and task dropped, silently. Refused, naming the node (TF1:
/// "Could not satisfy explicit device specification"). `/job:ps` is
/// `place`'s to check (parameter-server tasks exist with `VarPlacement::Ps`).
/// With several processes `all_reduce` checks the tasks against the rank.
fn check_one_process_devices(model: &Graph) -> Result<(), PassError> {
    for id in model.node_ids() {
        let n = model.node(id);
        let spec = &n.requested_device;
        if spec.is_ps() {
            continue;
        }
        let job_ok = spec.job.as_deref().is_none_or(|j| j == "worker" || j == "localhost");
        if job_ok && spec.task.is_none_or(|t| t == 0) {
            continue;
        }
        let why = if job_ok {
            format!("a one-process program has task 0 only (task {} is another process)", spec.task.unwrap_or(0))
        } else {
            format!("job '{}' is not one towers runs (worker, localhost, ps)", spec.job.as_deref().unwrap_or(""))
        };
        return Err(PassError::Placement {
            node: n.name.clone(),
            reason: format!(
                "'{}' (scope '{}') was explicitly assigned to {spec}, but {why}: leave the job and task out of the device string (/gpu:0), or run it as that task of a process group (CompileOptions::process, under mpirun)",
                n.name, n.scope
            ),
        });
    }
    Ok(())
}

/// Refuse what only the compiler's towers honour when no tower is asked
/// for (one process): it would be ignored, not done.
fn check_replication(opts: &CompileOptions) -> Result<(), PassError> {
    // `ProcessGroup`'s fields are public: a literal gets the checks of
    // `ProcessGroup::new` and `with_ps_ranks`, in the API's words.
    let p = opts.process;
    if p.world == 0 || p.rank >= p.world || (p.ps_ranks > 0 && p.ps_ranks >= p.world) {
        return Err(PassError::Options(format!(
            "CompileOptions::process = ProcessGroup {{ rank: {}, world: {}, ps_ranks: {} }}: the rank must be in 0..world, the world at least 1, and ps_ranks below the world (at least one worker); build it with ProcessGroup::new(rank, world) and .with_ps_ranks(k)",
            p.rank, p.world, p.ps_ranks
        )));
    }
    if opts.accumulate == 0 {
        return Err(PassError::Options(
            "CompileOptions::accumulate is 0: accumulate at least 1 micro-batch per tower (1: none)".into(),
        ));
    }
    if opts.clip_global_norm.is_some() && !opts.process.is_single() {
        return Err(PassError::Options(
            "CompileOptions::clip_global_norm with several processes: the gradients are all-reduced after the optimizer's clipping point, so each process would clip its own share; clip in one process (towers), or leave it unset".into(),
        ));
    }
    // A process has one host device: a tower on /cpu:1 would compile, then
    // be refused by every session at load (the runtime's words, said here).
    if let Some(d) = opts.towers.iter().find(|d| d.kind == towers_graph::DeviceKind::Cpu && d.index != 0) {
        return Err(PassError::Options(format!(
            "CompileOptions::towers names {d}, but a process has one host device, cpu:0: put the towers on /gpu:N (the CPU backend runs each /gpu:N as a CPU device of its own), or on cpu:0"
        )));
    }
    if !opts.towers.is_empty() || !opts.process.is_single() {
        return Ok(());
    }
    if opts.accumulate > 1 {
        return Err(PassError::Options(format!(
            "CompileOptions::accumulate = {} accumulates micro-batches per tower, and no tower is given: set `towers = vec![Device::gpu(0)]` (one tower, the same update as one device) to accumulate on one device",
            opts.accumulate
        )));
    }
    if let crate::options::SplitPolicy::Weighted(w) = &opts.split {
        return Err(PassError::Options(format!(
            "CompileOptions::split weights the towers ({} weights), and no tower is given: set `towers` to one device per weight, or leave `split` at `SplitPolicy::Even`",
            w.len()
        )));
    }
    Ok(())
}

/// Run the manual pipeline (see [`Pipeline::manual`]) over a hand-built
/// graph, on `opts.towers`, or where none are given on the GPUs its nodes
/// ask for ([`crate::manual::requested_gpus`]).
pub fn manual(model: &Graph, loss: &str, opts: &CompileOptions) -> Result<PipelineOutput, PassError> {
    if !opts.var_list.is_empty() {
        return Err(PassError::Options(format!(
            "CompileOptions::var_list ({} variables) with compile_manual: a hand-built graph already chose its variables; pass them to gradients(..) and apply_gradients, and leave var_list empty",
            opts.var_list.len()
        )));
    }
    let devices = if opts.towers.is_empty() { crate::manual::requested_gpus(model) } else { opts.towers.clone() };
    Pipeline::manual(loss, opts, devices).run(model)
}

/// Run the evaluation pipeline (see [`Pipeline::eval`]) over `model`.
pub fn eval(model: &Graph, fetches: &[(&str, &str)], batch: usize) -> Result<PipelineOutput, PassError> {
    if fetches.is_empty() {
        return Err(PassError::Options(
            "an evaluation program needs at least one fetch, e.g. &[(\"logits\", \"model/logits/BiasAdd\")]".into(),
        ));
    }
    let mut pipeline = Pipeline::eval(fetches, batch);
    // TF1's evaluation graph is the training tower's model again, its ops
    // under `/gpu:0` and its variables under `/cpu:0` (cifar10_eval.py):
    // run it where its scopes say, as compile_manual runs the devices its
    // scopes name, rather than refusing the second device.
    let asked: BTreeSet<Device> =
        model.node_ids().into_iter().filter_map(|i| model.node(i).requested_device.concrete()).collect();
    if asked.len() > 1 {
        let gpus: Vec<Device> = asked.into_iter().filter(|d| d.kind != Device::CPU0.kind).collect();
        if !gpus.is_empty() {
            pipeline.passes = pipeline
                .passes
                .into_iter()
                .map(|p| -> Box<dyn Pass> {
                    if p.name() == "place" {
                        Box::new(Place { strategy: VarPlacement::Cpu, devices: gpus.clone() })
                    } else {
                        p
                    }
                })
                .collect();
        }
    }
    pipeline.run(model)
}

/// The user names of a program's fetches must each mean one tensor: not
/// empty, not given twice, not `loss` beside a training program's loss,
/// and not the name of another node of the graph or of the variables the
/// optimizer creates (`global_step`, `learning_rate`): a session looks a
/// name up among the fetches first, so such a fetch would hide that
/// tensor (`fetch("x")` returning an accuracy instead of the fed `x`).
/// A fetch named as its own node (`("logits", "logits")`) is fine.
fn check_fetch_names(g: &Graph, fetches: &[(String, String)], training: bool) -> Result<(), PassError> {
    for (i, (user, node)) in fetches.iter().enumerate() {
        let bad = |why: String| Err(PassError::Options(format!("the fetch name '{user}' (node '{node}') {why}")));
        if user.trim().is_empty() {
            return bad("is empty: name each fetch, e.g. (\"accuracy\", node)".into());
        }
        if let Some((_, other)) = fetches[..i].iter().find(|(u, _)| u == user) {
            return bad(format!("is given twice (also for node '{other}'): give each fetch its own name"));
        }
        if training && user == "loss" {
            return bad(
                "would hide the training loss, which the program fetches as 'loss'; give it another name".into()
            );
        }
        // `x:0` is output 0 of node `x`: fetching it as "x" hides nothing.
        let own = user == node.strip_suffix(":0").unwrap_or(node);
        let reserved = towers_graph::is_learning_rate(user) || user == towers_graph::GLOBAL_STEP;
        let shadowed = !own && (g.get(user).is_some() || reserved);
        if shadowed {
            return bad(format!(
                "is the name of another tensor of the program ('{user}'), which fetching it would then no longer return; give the fetch another name"
            ));
        }
    }
    Ok(())
}
