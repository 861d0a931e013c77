//! The training loop of every run: [`fit_in`] and its wrappers.
//!
//! Invariants:
//! - One loop: `towers train` (the seed models and `--graph`) and a library
//!   caller's own [`Model`] run this code, with the same options.
//! - A step allocates nothing: the batch is gathered straight into the
//!   feeds' memory, the schedule's rate is written into the plan's
//!   `learning_rate` variable, and the loss and the training accuracy are
//!   fetched into fixed buffers.
//! - The training accuracy (when the model names one) is fetched with the
//!   step it belongs to; across towers it is combined by each tower's share
//!   of the batch, like the loss (`CompileOptions::fetches`).

use std::sync::Arc;
use std::time::Instant;

use towers_passes::optimizer::LEARNING_RATE;
use towers_passes::ProcessGroup;
use towers_runtime::comm::{Comm, LocalComm};
use towers_runtime::RuntimeError;

use super::Model;
use crate::compiler::{compile_eval, compile_train, CompileError};
use crate::config::TrainConfig;
use crate::data::{Batcher, Dataset};
use crate::saver::Saver;
use crate::train::{evaluate, open_session, Quiet, TrainError, TrainObserver, TrainReport};

/// The user name of the training accuracy in the training program's fetches.
pub const TRAIN_ACCURACY: &str = "accuracy";

/// Which model a run trains.
pub(crate) enum Which<'a> {
    /// The caller's.
    Given(&'a Model),
    /// The seed model `cfg` describes, built for the loaded data's geometry.
    Seed,
}

/// Where a run's examples come from.
enum Source {
    /// Loaded after the session opened (its memory check counts them).
    Spec,
    /// The caller's arrays.
    Sets(Box<(Dataset, Dataset)>),
}

/// Train `model` in this process alone on `cfg.data`, and evaluate it on
/// the test split: everything `towers train` does (towers, placement,
/// schedules, checkpoints with exact resume, periodic evaluation, traces,
/// guards, the backend choice); progress goes to `obs` (e.g. a
/// [`crate::watch::Watch`] for TensorBoard and plots).
pub fn fit(model: &Model, cfg: &TrainConfig, obs: &mut dyn TrainObserver) -> Result<TrainReport, TrainError> {
    fit_in(model, cfg, Arc::new(LocalComm::single()), obs)
}

/// [`fit`] on the caller's own examples (e.g. from
/// [`Dataset::new`]) instead of `cfg.data`.
pub fn fit_datasets(
    model: &Model,
    cfg: &TrainConfig,
    train: Dataset,
    test: Dataset,
    obs: &mut dyn TrainObserver,
) -> Result<TrainReport, TrainError> {
    run(Which::Given(model), cfg, Source::Sets(Box::new((train, test))), Arc::new(LocalComm::single()), obs)
}

/// Train `model` as one rank of `comm` (an MPI process, or a thread of a
/// [`LocalComm`] group): every rank runs the same call; each feeds its
/// rows of every global batch ([`crate::compiler::CompileOptions::process_rows`]), and the
/// plan all-reduces the gradients across ranks. The variables are checked
/// identical on every rank before the first step and after the last
/// ([`towers_runtime::Session::check_replicas`]). Rank 0 alone reports progress to `obs`,
/// writes checkpoints (every rank reads them on resume) and computes the
/// test accuracy, which it broadcasts, so every rank's report holds it.
pub fn fit_in(
    model: &Model,
    cfg: &TrainConfig,
    comm: Arc<dyn Comm>,
    obs: &mut dyn TrainObserver,
) -> Result<TrainReport, TrainError> {
    run(Which::Given(model), cfg, Source::Spec, comm, obs)
}

/// Train the seed model `cfg` describes as one rank of `comm` ([`crate::train::train_in`]).
pub(crate) fn fit_seed_in(
    cfg: &TrainConfig,
    comm: Arc<dyn Comm>,
    obs: &mut dyn TrainObserver,
) -> Result<TrainReport, TrainError> {
    run(Which::Seed, cfg, Source::Spec, comm, obs)
}

/// The run's length in global steps: `--steps`, else `--epochs` x the
/// batches of an epoch (computed only without `--steps`, and checked: a
/// product past `usize` is an error naming `--epochs`, not a panic).
pub(super) fn total_steps(cfg: &TrainConfig, batches_per_epoch: usize) -> Result<usize, TrainError> {
    match cfg.steps {
        Some(steps) => Ok(steps),
        None => cfg.epochs.checked_mul(batches_per_epoch).ok_or_else(|| TrainError::InvalidOption {
            flag: "epochs",
            reason: format!(
                "{} epochs x {batches_per_epoch} batches per epoch is more steps than this machine can count; give fewer --epochs, or the number of steps with --steps N",
                cfg.epochs
            ),
        }),
    }
}

/// The evaluation's batch: the images placeholder's fixed rows when the
/// model declares them (the last chunk of the test set padded, its padding
/// not counted: [`crate::train::evaluate`]), else `cfg.eval_batch` (at most
/// the test set).
pub(super) fn eval_batch(cfg: &TrainConfig, model: &Model, test_len: usize) -> usize {
    model.fixed_batch().unwrap_or_else(|| cfg.eval_batch.min(test_len)).max(1)
}

fn run(
    which_model: Which<'_>,
    cfg: &TrainConfig,
    source: Source,
    comm: Arc<dyn Comm>,
    obs: &mut dyn TrainObserver,
) -> Result<TrainReport, TrainError> {
    let process = ProcessGroup::new(comm.rank(), comm.world_size())
        .and_then(|p| p.with_ps_ranks(cfg.ps_ranks))
        .map_err(CompileError::from)?;
    // A parameter-server rank (--ps-ranks) runs no towers and feeds nothing.
    let feeds = !process.is_ps_rank();
    let lead = process.rank == 0;
    let mut quiet = Quiet;
    let obs: &mut dyn TrainObserver = if lead { obs } else { &mut quiet };
    crate::guards::validate(cfg, process.world)?;
    if let Which::Given(m) = &which_model {
        m.check()?;
    }
    if lead {
        crate::guards::check_outputs(cfg)?;
    }
    // The session first: its memory check counts the data set against what
    // the backend had before it was loaded ([`towers_runtime::memory`]).
    let (sess, which) = open_session(cfg.backend, cfg.seed, &comm, cfg.cuda_graphs, cfg.cuda_one_context)?;
    let mut sess = sess.with_comm(Arc::clone(&comm));
    sess.note_memory_baseline();
    let (train_set, test_set) = match source {
        Source::Spec => cfg.data.load()?,
        Source::Sets(sets) => *sets,
    };
    if sess.backend_name() == "cpu" {
        sess.reserve_memory(train_set.host_bytes() + test_set.host_bytes());
    }
    let seed;
    let model = match which_model {
        Which::Given(m) => m,
        Which::Seed => {
            seed = Model::from_builtin(crate::models::build(&cfg.model_spec(&train_set))?);
            &seed
        }
    };
    model.check_data(&train_set)?;
    model.check_data(&test_set)?;
    crate::guards::check_dump_after(cfg, process)?;
    if cfg.ps_async {
        let which = format!("{which}; {}", comm.describe());
        let (train_set, test_set) = (&train_set, &test_set);
        let run = super::async_fit::AsyncRun { sess, model, cfg, train_set, test_set, comm, which };
        return super::async_fit::fit_async(run, obs);
    }
    let t0 = Instant::now();
    let mut opts = cfg.compile_options_for(process);
    if let Some(acc) = &model.accuracy {
        opts.fetches.push((TRAIN_ACCURACY.into(), acc.clone()));
    }
    let rows = opts.process_rows().map_err(CompileError::from)?;
    let compiled = compile_train(&model.graph, &model.loss, &opts)?;
    compiled.log_timings(t0);
    obs.compiled(&compiled.graph);
    let eval_batch = eval_batch(cfg, model, test_set.len());
    let eval = compile_eval(&model.graph, &[("predictions", &model.predictions)], eval_batch)?;

    let which = if process.is_single() { which } else { format!("{which}; {}", comm.describe()) };
    let memory = |e: RuntimeError| match e {
        RuntimeError::OutOfMemory { program, backend, planned, available, detail } => {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            TrainError::Memory { program, backend, planned_gib: gib(planned), available_gib: gib(available), detail }
        }
        e => TrainError::Runtime(e),
    };
    sess.load("train", compiled.plan).map_err(memory)?;
    // --variables ps across processes: owners broadcast their new values.
    let ps = crate::train::PsStep::new(&sess, "train", &compiled.state)?;
    let slots = ps.as_ref().map(|p| p.slots().clone()).unwrap_or_default();
    let shared = |name: &str| !slots.contains(name);
    sess.load("eval", eval.plan).map_err(memory)?;
    let mut batcher = Batcher::new(&train_set, cfg.batch, cfg.seed)?.with_rows(rows.clone())?;
    // Steps already taken (a resumed run): --steps and --epochs count the
    // whole run in global steps, as TF's max_steps, so the same command
    // with --resume trains what remains.
    let mut done = 0usize;
    let mut resumed_at = None;
    let mut restore_notes = Vec::new();
    let run = crate::resume::run_description(cfg, &train_set, model);
    if let (true, Some(path)) = (cfg.resume, &cfg.checkpoint) {
        if path.exists() {
            let elsewhere = ps.as_ref().map(|p| p.others_slots(process.rank)).unwrap_or_default();
            restore_notes = crate::resume::restore(&mut sess, cfg, path, &run, &elsewhere)?;
            // An exact resume: global_step steps were taken, so the data
            // order and every random stream (dropout) continue from there.
            if let Ok(g) = sess.variable::<i32>("global_step") {
                done = g.first().copied().unwrap_or(0).max(0) as usize;
                batcher.seek(done as u64);
                sess.set_step("train", done as u64)?;
            }
            resumed_at = Some(done as i64);
        }
    }

    sess.check_replicas_of(if done > 0 { "after resuming" } else { "before the first step" }, shared)?;

    let total = total_steps(cfg, batcher.batches_per_epoch())?;
    let schedule = cfg.schedule(total);
    // What --resume did, said at the start (TF1's "Restoring parameters from").
    if let (true, Some(path)) = (cfg.resume, &cfg.checkpoint) {
        let path = path.display();
        let asked = match cfg.steps {
            Some(n) => format!("--steps {n}"),
            None => format!("--epochs {} ({total} steps)", cfg.epochs),
        };
        restore_notes.insert(
            0,
            match resumed_at {
                None => format!("--resume: {path} does not exist yet; starting from step 0"),
                Some(_) if done >= total => {
                    format!("--resume: {path} is already at step {done} >= {asked}: nothing to train")
                }
                Some(_) => format!(
                    "--resume: resumed from {path} at global step {done} ({} of {asked} to train)",
                    total - done
                ),
            },
        );
    }
    let mut note = format!("{which}\n{}", sess.backend_note());
    if let Some(ps) = &ps {
        note.push('\n');
        note.push_str(&ps.describe(process.rank));
    }
    if !process.is_single() {
        note.push('\n');
        note.push_str(&crate::train::exchange_note(&compiled.graph, &compiled.state, ps.as_ref(), process.rank));
    }
    for n in &restore_notes {
        note.push('\n');
        note.push_str(n);
    }
    // Rank 0 writes the checkpoints.
    let mut saver = match cfg.checkpoint.as_ref().filter(|_| lead) {
        Some(p) => {
            let mut s = Saver::new(p, cfg.checkpoint_every, cfg.checkpoint_secs, cfg.keep).with_run(run);
            s.start(resumed_at, cfg.overwrite)?;
            Some(s)
        }
        None => None,
    };
    obs.start(total, &note);
    let mut losses = Vec::new();
    let mut train_accuracies = Vec::new();
    let mut evals = Vec::new();
    let mut loss = [0f32];
    let mut accuracy = [0f32];
    // Traced: the last `trace_steps` steps of the run (steady state: the
    // first steps' one-time costs, such as waking the workers, stay out).
    let first_traced = cfg.trace.as_ref().map(|_| total.saturating_sub(cfg.trace_steps.max(1)).max(done) + 1);
    if first_traced.is_some() {
        // A backend that cannot trace says so now, not after the run.
        sess.set_tracing("train", true)?;
        sess.set_tracing("train", false)?;
    }
    let mut traces = Vec::new();
    let started = Instant::now();
    for step in done + 1..=total {
        if first_traced == Some(step) {
            sess.set_tracing("train", true)?;
        }
        // The batch is gathered straight into the feeds' memory (the CPU
        // backend's arena, the CUDA backend's pinned staging): no vector
        // in between, the same bytes.
        if feeds {
            sess.feed_with("train", &model.images, |b| batcher.fill_images(b))??;
            sess.feed_with("train", &model.labels, |b| batcher.fill_labels(b))??;
        }
        batcher.advance();
        // The schedule's rate of this update (0-based global step), into the
        // plan's learning_rate variable: no recompilation, no allocation.
        let lr = schedule.at(step - 1);
        sess.write_variable(LEARNING_RATE, &[lr])?;
        obs.learning_rate(step, lr);
        comm.note_step(step as u64);
        // Under --variables ps the owners' values come back inside the step
        // (the plan's broadcasts, `ps_exchange`).
        sess.run("train")?;
        if first_traced.is_some_and(|f| step >= f) {
            traces.push(sess.trace("train")?);
        }
        sess.fetch_into("train", "loss", &mut loss)?;
        let loss = loss[0];
        if !loss.is_finite() {
            let origin = if cfg.check_numerics {
                crate::guards::first_non_finite(&sess, "train", &compiled.graph)
            } else {
                Some("--check-numerics names the first node whose output is not finite".into())
            };
            return Err(TrainError::NonFiniteLoss { step, loss, origin });
        }
        match ps.as_ref().filter(|_| cfg.checkpoint.is_some()) {
            // Sharded slots: every rank takes part in a save (rank 0 decides).
            Some(ps) => {
                if ps.agree(&sess, saver.as_ref().is_some_and(|s| s.due(step)))? {
                    let extra = ps.gather_slots(&sess)?;
                    if let Some(saver) = saver.as_mut() {
                        saver.save_with(&sess, &extra)?;
                    }
                }
            }
            None => {
                if let Some(saver) = saver.as_mut() {
                    saver.after_step(&sess, step)?;
                }
            }
        }
        if lead && cfg.eval_every.is_some_and(|every| step % every == 0 && step < total) {
            let acc = evaluate(&mut sess, &test_set, eval_batch, &model.images, &model.labels)?;
            evals.push((step, acc));
            obs.eval(step, acc);
        }
        let eps = ((step - done) * cfg.batch) as f64 / started.elapsed().as_secs_f64().max(1e-9);
        let logged = (cfg.log_every > 0 && step % cfg.log_every == 0) || step == total;
        if logged {
            losses.push((step, loss));
        }
        if model.accuracy.is_some() {
            sess.fetch_into("train", TRAIN_ACCURACY, &mut accuracy)?;
            if logged {
                train_accuracies.push((step, accuracy[0]));
            }
            obs.train_accuracy(step, accuracy[0]);
        }
        obs.step(step, loss, eps);
    }
    let examples_per_sec = (total.saturating_sub(done) * cfg.batch) as f64 / started.elapsed().as_secs_f64().max(1e-9);
    if let Some(path) = &cfg.trace {
        sess.set_tracing("train", false)?;
        crate::trace::write_chrome_trace(path, sess.plan("train")?, &traces, sess.backend_name())?;
    }
    sess.check_replicas_of("after the last step", shared)?;
    let extra = match ps.as_ref().filter(|_| cfg.checkpoint.is_some()) {
        Some(ps) => ps.gather_slots(&sess)?,
        None => Vec::new(),
    };
    if let Some(saver) = saver.as_mut() {
        saver.save_with(&sess, &extra)?;
    }
    // Computed once, on rank 0, and broadcast to the others.
    let (mut test_accuracy, mut accuracy) = (0.0, [0f32; 2]);
    if lead {
        test_accuracy = evaluate(&mut sess, &test_set, eval_batch, &model.images, &model.labels)?;
        // An f64 as two f32s (high part, remainder), to cross the f32 communicator.
        accuracy = [test_accuracy as f32, (test_accuracy - test_accuracy as f32 as f64) as f32];
    }
    if !process.is_single() {
        comm.broadcast(0, &mut [&mut accuracy[..]]).map_err(|e| RuntimeError::Collective {
            program: "eval".into(),
            node: "test accuracy".into(),
            source: Box::new(e),
        })?;
    }
    if !lead {
        test_accuracy = accuracy[0] as f64 + accuracy[1] as f64;
    }
    obs.eval(total, test_accuracy);
    Ok(TrainReport {
        losses,
        train_accuracies,
        steps: total,
        trained: total.saturating_sub(done),
        test_accuracy,
        examples_per_sec,
        backend_note: note,
        diagnostics: compiled.state.diagnostics.iter().map(|d| format!("{}: {}", d.pass, d.message)).collect(),
        evals,
        ps_async: None,
    })
}
