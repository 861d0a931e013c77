//! The two programs of an asynchronous parameter-server run (`--ps-async`):
//! the worker's step without the optimizer, and each owner's apply-only
//! program.
//!
//! Invariants:
//! - the worker program is the training pipeline of one process on this
//!   rank's rows, stopped before `apply`: forward and backward (with the
//!   towers, splits and tower means of the synchronous run), fetching the
//!   loss, the optional training accuracy and every trainable variable's
//!   gradient as `grad:<variable>` ([`GRAD_PREFIX`]); it updates nothing;
//! - an owner's apply program holds its variables (same names, types and
//!   shapes as the model's, so the session shares them with the worker and
//!   evaluation programs), one placeholder `grad:<variable>` per variable,
//!   and the optimizer's own apply nodes ([`towers_passes::apply_gradients`]):
//!   every optimizer, its slots on the owner only, `learning_rate` and a
//!   `global_step` that counts the gradients this owner applied;
//! - ownership is the synchronous `--variables ps` run's
//!   ([`towers_passes::PsGroup`]: task k on rank k mod N), so both modes
//!   shard the variables the same way.

// Only an MPI build trains asynchronously; the other builds still check
// the options ([`check`]) and refuse.
#![cfg_attr(not(feature = "mpi"), allow(dead_code))]

use towers_codegen::{lower, Plan};
use towers_graph::{keys, Graph, NewNode, Op, Tensor};
use towers_passes::options::VarPlacement;
use towers_passes::{
    apply_gradients, pipeline, CompileState, PassManager, Pipeline, Place, ProcessGroup, ScheduleStreams,
};

use super::{Model, TRAIN_ACCURACY};
use crate::compiler::{train_lower_options, CompileError};
use crate::config::TrainConfig;
use crate::train::TrainError;

/// The prefix of a gradient's fetch in the worker program and of its feed
/// in the apply program (a colon: no variable name holds one).
pub const GRAD_PREFIX: &str = "grad:";

/// The worker program and the variables it computes gradients of (sorted).
pub(crate) struct WorkerProgram {
    pub plan: Plan,
    pub variables: Vec<String>,
    pub diagnostics: Vec<String>,
}

/// Refuse what the asynchronous mode cannot run (a typed error naming the flag).
pub(crate) fn check(cfg: &TrainConfig, model: &Model, world: usize) -> Result<(), TrainError> {
    let bad = |reason: String| TrainError::InvalidOption { flag: "ps-async", reason };
    if !matches!(cfg.variables, VarPlacement::Ps { .. }) {
        return Err(bad("needs --variables ps (the variables sharded over parameter-server tasks)".into()));
    }
    if cfg.ps_ranks > 0 {
        return Err(bad(format!(
            "does not run with --ps-ranks {} (its owners are workers that also train; drop --ps-ranks for the asynchronous mode, or --ps-async for separate synchronous ps ranks)",
            cfg.ps_ranks
        )));
    }
    if matches!(cfg.backend, crate::train::BackendChoice::Cuda) {
        return Err(bad("runs on the cpu backend only (give --backend cpu); its exchange reads and writes host variables between steps".into()));
    }
    if cfg.resume {
        return Err(bad("cannot resume (its checkpoint resumes synchronously: drop --ps-async, or --resume)".into()));
    }
    if cfg.checkpoint_every.is_some() || cfg.checkpoint_secs.is_some() {
        return Err(bad(
            "writes its checkpoint once, at the end, after the final broadcast (drop --checkpoint-every/--checkpoint-secs)".into(),
        ));
    }
    if cfg.trace.is_some() {
        return Err(bad("cannot be traced (drop --trace)".into()));
    }
    if !model.graph.collection(keys::UPDATE_OPS).is_empty() {
        return Err(bad(format!(
            "the model has update ops ({}, e.g. batch-norm moving averages), which have no owner to apply them asynchronously; train it synchronously or without batch norm",
            model.graph.collection(keys::UPDATE_OPS).join(", ")
        )));
    }
    if world < 2 {
        return Err(bad(
            "needs several processes: run it under mpirun -np N (N >= 2); with one process there is nobody to be asynchronous with (drop --ps-async)".into(),
        ));
    }
    Ok(())
}

/// The synchronous ps run's compile state, whose `ps_groups` say every
/// owning rank, its variables and its optimizer slots (the names the apply
/// programs create too).
pub(crate) fn owners(model: &Model, cfg: &TrainConfig, process: ProcessGroup) -> Result<CompileState, TrainError> {
    let opts = cfg.compile_options_for(process);
    let mut state = pipeline::train(&model.graph, &model.loss, &opts).map_err(CompileError::from)?.state;
    state.ps_groups.retain(|g| !g.variables.is_empty());
    Ok(state)
}

/// The worker program on `rows` examples per step (this rank's rows).
pub(crate) fn worker(model: &Model, cfg: &TrainConfig, rows: usize) -> Result<WorkerProgram, TrainError> {
    let mut opts = cfg.compile_options();
    opts.batch = rows;
    opts.variables = VarPlacement::Cpu;
    if let Some(acc) = &model.accuracy {
        opts.fetches.push((TRAIN_ACCURACY.into(), acc.clone()));
    }
    let front = Pipeline::train(&model.loss, &opts).before("apply").map_err(CompileError::from)?;
    let out = front.run(&model.graph).map_err(CompileError::from)?;
    let (mut g, mut st) = (out.graph, out.state);
    let loss = st.loss.clone().ok_or_else(|| TrainError::Options("the worker program lost its loss".into()))?;
    let program = g.program_mut();
    program.fetches.entry("loss".into()).or_insert(loss);
    for (var, grad) in &st.grads {
        program.fetches.insert(format!("{GRAD_PREFIX}{var}"), grad.clone());
    }
    let variables: Vec<String> = st.grads.keys().cloned().collect();
    let mut pm = PassManager::new();
    pm.push(Box::new(Place { strategy: VarPlacement::Cpu, devices: opts.towers.clone() }));
    pm.push(Box::new(ScheduleStreams));
    pm.run(&mut g, &mut st).map_err(CompileError::from)?;
    let plan = lower(&g, &train_lower_options(&opts)).map_err(CompileError::from)?;
    let diagnostics = st.diagnostics.iter().map(|d| format!("{}: {}", d.pass, d.message)).collect();
    Ok(WorkerProgram { plan, variables, diagnostics })
}

/// The apply program of the owner of `variables`.
pub(crate) fn apply(model: &Model, cfg: &TrainConfig, variables: &[String]) -> Result<Plan, TrainError> {
    let mut g = Graph::new();
    let mut grads = Vec::with_capacity(variables.len());
    for name in variables {
        let node = model.graph.node(model.graph.find(name)?);
        let Op::Variable { dtype, shape, .. } = &node.op else {
            return Err(TrainError::Options(format!("'{name}' is not a variable of the model")));
        };
        let mut var = NewNode::new(name.clone(), node.op.clone(), Vec::new());
        var.scope = node.scope.clone();
        g.add(var)?;
        let feed = Op::Placeholder { dtype: *dtype, shape: shape.clone().into() };
        let p = g.add(NewNode::new(format!("{GRAD_PREFIX}{name}"), feed, Vec::new()))?;
        grads.push((name.clone(), Tensor::new(p, 0)));
    }
    let res = apply_gradients(&mut g, &grads, &cfg.optimizer()).map_err(CompileError::from)?;
    let train_op = g.node(res.train_op).name.clone();
    g.program_mut().train_op = Some(train_op);
    let mut st = CompileState::default();
    let mut pm = PassManager::new();
    pm.push(Box::new(Place { strategy: VarPlacement::Cpu, devices: Vec::new() }));
    pm.push(Box::new(ScheduleStreams));
    pm.run(&mut g, &mut st).map_err(CompileError::from)?;
    let mut opts = cfg.compile_options();
    opts.batch = 1;
    Ok(lower(&g, &train_lower_options(&opts)).map_err(CompileError::from)?)
}

#[cfg(test)]
#[path = "async_compile_tests.rs"]
mod tests;
