//! The training loop of asynchronous parameter servers (`--ps-async`):
//! every MPI rank is a worker and owns a shard of the variables; workers
//! push gradients and pull values without waiting for each other, and each
//! owner applies every gradient as it arrives
//! ([`towers_runtime::comm::AsyncPs`] has the protocol).
//!
//! Invariants:
//! - not exact: the values a gradient is computed from, and the order the
//!   owners apply gradients in, depend on timing; the run says so once, in
//!   its start note;
//! - every gradient is applied exactly once: each owner applies
//!   world × steps gradients (one per worker step), counted in the report;
//! - every rank ends with the same variables: after the last gradient, one
//!   synchronous broadcast of each shard ([`towers_runtime::comm::ValueExchange`]),
//!   checked with the replica digest;
//! - each worker reads the same rows of each global batch as in the
//!   synchronous run, so both see the same examples;
//! - the staleness of every applied gradient is recorded on its owner and
//!   gathered to rank 0 ([`AsyncReport`]).

use std::sync::Arc;

use towers_runtime::comm::{Comm, Staleness};
use towers_runtime::Session;

use super::Model;
use crate::config::TrainConfig;
use crate::data::Dataset;
use crate::train::{TrainError, TrainObserver, TrainReport};

/// The note every `--ps-async` run starts with.
pub const NOT_EXACT: &str = "ps-async: asynchronous parameter servers; the results depend on timing (which values each gradient was computed from, and the order owners apply gradients in) and are not exact or reproducible";

/// The environment variable a test sets to slow one worker down: `rank:ms`
/// sleeps `ms` milliseconds before each of that rank's steps (read once).
pub const SLOW_WORKER_ENV: &str = "TOWERS_TEST_PS_ASYNC_SLOW";

/// What an asynchronous run reports: each owner's staleness (gathered to
/// rank 0) and this rank's digest of the variables.
#[derive(Debug, Clone, PartialEq)]
pub struct AsyncReport {
    /// (owning rank, its gradients' staleness), ranks ascending; on rank 0
    /// only (empty on the others).
    pub owners: Vec<(usize, Staleness)>,
    /// This rank's checksum of the trained variables after the final
    /// broadcast ([`Session::variables_checksum_of`]): the same on every rank.
    pub digest: u64,
    /// Gradients each owner should have applied: workers × steps.
    pub expected_per_owner: u64,
}

impl AsyncReport {
    /// Every owner's record as one.
    pub fn total(&self) -> Staleness {
        let mut t = Staleness::default();
        for (_, s) in &self.owners {
            t.merge(s);
        }
        t
    }

    /// The report's lines: the total, then one per owner.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "ps-async: {} gradients over {} shard(s) ({} per shard expected): {}",
            self.total().applied,
            self.owners.len(),
            self.expected_per_owner,
            self.total()
        )];
        out.extend(self.owners.iter().map(|(r, s)| format!("ps-async: shard of rank {r}: {s}")));
        out
    }
}

/// What [`fit_async`] needs from the common start of a run.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) struct AsyncRun<'a> {
    pub sess: Session,
    pub model: &'a Model,
    pub cfg: &'a TrainConfig,
    pub train_set: &'a Dataset,
    pub test_set: &'a Dataset,
    pub comm: Arc<dyn Comm>,
    pub which: String,
}

/// Train `run.model` with asynchronous parameter servers (see the module docs).
#[cfg(not(feature = "mpi"))]
pub(crate) fn fit_async(run: AsyncRun<'_>, _obs: &mut dyn TrainObserver) -> Result<TrainReport, TrainError> {
    super::async_compile::check(run.cfg, run.model, run.comm.world_size())?;
    Err(TrainError::InvalidOption {
        flag: "ps-async",
        reason: "this towers was built without MPI: build it with --features mpi and run it under mpirun".into(),
    })
}

/// Train `run.model` with asynchronous parameter servers (see the module docs).
#[cfg(feature = "mpi")]
pub(crate) fn fit_async(run: AsyncRun<'_>, obs: &mut dyn TrainObserver) -> Result<TrainReport, TrainError> {
    use std::time::Instant;

    use towers_passes::optimizer::LEARNING_RATE;
    use towers_passes::ProcessGroup;
    use towers_runtime::comm::{AsyncPrograms, AsyncPs, AsyncShard};
    use towers_runtime::RuntimeError;

    use super::async_compile::{self, GRAD_PREFIX};
    use super::TRAIN_ACCURACY;
    use crate::compiler::{compile_eval, CompileError};
    use crate::data::Batcher;
    use crate::saver::Saver;
    use crate::train::{evaluate, PsStep};

    let AsyncRun { mut sess, model, cfg, train_set, test_set, comm, which } = run;
    let (rank, world) = (comm.rank(), comm.world_size());
    async_compile::check(cfg, model, world)?;
    if sess.backend_name() != "cpu" {
        return Err(TrainError::InvalidOption {
            flag: "ps-async",
            reason: format!("runs on the cpu backend only, not {} (give --backend cpu)", sess.backend_name()),
        });
    }
    let process = ProcessGroup::new(rank, world).map_err(CompileError::from)?;
    let lead = rank == 0;
    let rows = cfg.compile_options_for(process).process_rows().map_err(CompileError::from)?;
    let state = async_compile::owners(model, cfg, process)?;
    let owners: Vec<(usize, Vec<String>)> = state.ps_groups.iter().map(|g| (g.rank, g.variables.clone())).collect();
    let worker = async_compile::worker(model, cfg, rows.len())?;
    let eval_batch = super::fit::eval_batch(cfg, model, test_set.len());
    let eval = compile_eval(&model.graph, &[("predictions", &model.predictions)], eval_batch)?;
    sess.load("train", worker.plan)?;
    let mine = owners.iter().find(|(r, _)| *r == rank).map(|(_, v)| v);
    if let Some(vars) = mine {
        sess.load("apply", async_compile::apply(model, cfg, vars)?)?;
    }
    sess.load("eval", eval.plan)?;
    let mut shards = Vec::with_capacity(owners.len());
    for (owner, vars) in &owners {
        let mut sized = Vec::with_capacity(vars.len());
        for v in vars {
            sized.push((v.clone(), sess.variable_type(v)?.1.iter().product::<usize>()));
        }
        shards.push(AsyncShard { owner: *owner, vars: sized });
    }
    let trained = worker.variables.clone();
    let shared = |name: &str| trained.iter().any(|v| v == name);
    sess.check_replicas_of("before the first step", shared)?;
    let programs = AsyncPrograms {
        worker: "train".into(),
        apply: mine.map(|_| "apply".to_string()),
        grad_prefix: GRAD_PREFIX.into(),
    };
    let mut ex = AsyncPs::new(&sess, shards, programs, cfg.comm_timeout)?;
    let mut batcher = Batcher::new(train_set, cfg.batch, cfg.seed)?.with_rows(rows)?;
    let total = super::fit::total_steps(cfg, batcher.batches_per_epoch())?;
    let schedule = cfg.schedule(total);
    let slow = slow_worker(rank);
    let note = format!("{which}\n{}\n{NOT_EXACT}", sess.backend_note());
    obs.start(total, &note);
    let (mut losses, mut train_accuracies, mut evals) = (Vec::new(), Vec::new(), Vec::new());
    let (mut loss, mut accuracy) = ([0f32], [0f32]);
    let started = Instant::now();
    for step in 1..=total {
        if let Some(pause) = slow {
            std::thread::sleep(pause);
        }
        sess.feed_with("train", &model.images, |b| batcher.fill_images(b))??;
        sess.feed_with("train", &model.labels, |b| batcher.fill_labels(b))??;
        batcher.advance();
        let lr = schedule.at(step - 1);
        if mine.is_some() {
            sess.write_variable(LEARNING_RATE, &[lr])?;
        }
        obs.learning_rate(step, lr);
        comm.note_step(step as u64);
        sess.run("train")?;
        sess.fetch_into("train", "loss", &mut loss)?;
        if !loss[0].is_finite() {
            return Err(TrainError::NonFiniteLoss { step, loss: loss[0], origin: None });
        }
        ex.push(&mut sess, step as u64)?;
        if lead && cfg.eval_every.is_some_and(|every| step % every == 0 && step < total) {
            let acc = evaluate(&mut sess, test_set, eval_batch, &model.images, &model.labels)?;
            evals.push((step, acc));
            obs.eval(step, acc);
        }
        let logged = (cfg.log_every > 0 && step % cfg.log_every == 0) || step == total;
        if logged {
            losses.push((step, loss[0]));
        }
        if model.accuracy.is_some() {
            sess.fetch_into("train", TRAIN_ACCURACY, &mut accuracy)?;
            if logged {
                train_accuracies.push((step, accuracy[0]));
            }
            obs.train_accuracy(step, accuracy[0]);
        }
        let eps = (step * cfg.batch) as f64 / started.elapsed().as_secs_f64().max(1e-9);
        obs.step(step, loss[0], eps);
    }
    ex.finish(&mut sess)?;
    let examples_per_sec = (total * cfg.batch) as f64 / started.elapsed().as_secs_f64().max(1e-9);
    // Every gradient is applied: one synchronous broadcast of each shard.
    let mut ps = PsStep::new(&sess, "train", &state)?
        .ok_or_else(|| TrainError::Options("--ps-async: the model has no variables to shard".into()))?;
    ps.exchange_values(&mut sess)?;
    sess.check_replicas_of("after the last step", shared)?;
    if let Some(path) = &cfg.checkpoint {
        // The whole file a synchronous run writes: every owner's slots
        // gathered to rank 0, and global_step the steps taken (the data's
        // position; the owners' counters hold the gradients they applied).
        let extra = ps.gather_slots(&sess)?;
        if lead {
            if sess.variable_names().iter().any(|n| n == "global_step") {
                sess.write_variable_i32("global_step", &[total as i32])?;
            }
            let run = crate::resume::run_description(cfg, train_set, model);
            let mut saver = Saver::new(path, None, None, cfg.keep).with_run(run);
            saver.start(None, cfg.overwrite)?;
            saver.save_with(&sess, &extra)?;
        }
    }
    let collective =
        |node: &str, e| RuntimeError::Collective { program: "train".into(), node: node.into(), source: Box::new(e) };
    let words = ex.staleness().to_words();
    let mut all = vec![0f32; if lead { words.len() * world } else { 0 }];
    comm.gather_to(0, &words, &mut all).map_err(|e| collective("ps_async/staleness", e))?;
    // Rank 0 alone received the records (`all` is empty elsewhere).
    let owned = owners.iter().filter(|_| lead);
    let report = AsyncReport {
        owners: owned.map(|(r, _)| (*r, Staleness::from_words(&all[r * words.len()..][..words.len()]))).collect(),
        digest: sess.variables_checksum_of(shared)?,
        expected_per_owner: (world * total) as u64,
    };
    let (mut test_accuracy, mut acc) = (0.0, [0f32; 2]);
    if lead {
        test_accuracy = evaluate(&mut sess, test_set, eval_batch, &model.images, &model.labels)?;
        acc = [test_accuracy as f32, (test_accuracy - test_accuracy as f32 as f64) as f32];
    }
    comm.broadcast(0, &mut [&mut acc[..]]).map_err(|e| collective("test accuracy", e))?;
    if !lead {
        test_accuracy = acc[0] as f64 + acc[1] as f64;
    }
    obs.eval(total, test_accuracy);
    Ok(TrainReport {
        losses,
        train_accuracies,
        steps: total,
        trained: total,
        test_accuracy,
        examples_per_sec,
        backend_note: note,
        diagnostics: worker.diagnostics,
        evals,
        ps_async: Some(report),
    })
}

/// The test hook's pause for this rank ([`SLOW_WORKER_ENV`]), if any.
#[cfg(feature = "mpi")]
fn slow_worker(rank: usize) -> Option<std::time::Duration> {
    let v = std::env::var(SLOW_WORKER_ENV).ok()?;
    let (r, ms) = v.split_once(':')?;
    let ms: u64 = ms.trim().parse().ok()?;
    (r.trim().parse::<usize>().ok()? == rank).then(|| std::time::Duration::from_millis(ms))
}
