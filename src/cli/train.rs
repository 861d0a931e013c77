//! `towers train`: the flags into a [`TrainConfig`], the seed model or the
//! `--graph` model through the one training loop ([`towers::trainer`]),
//! and what the run prints: `step N loss L [train acc A]` lines, the
//! progress bar on a terminal, `step N test accuracy A`, and the final
//! `test accuracy: A`. Only rank 0 of an MPI group prints.

use std::io::IsTerminal;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use towers::runtime::comm::{Comm, LocalComm};
use towers::runtime::devices::Machine;
use towers::train::{train_in, TrainObserver};
use towers::trainer::fit_in;
use towers::watch::{Tee, Watch};

use super::args::{Model, TrainArgs};
use super::config::{
    auto_variables, config, cuda_contexts, cuda_flags, fixed_batch, ps_tasks, unused_flags, user_model,
};

/// The CLI's observer: log lines and the progress bar.
struct Printer {
    log_every: usize,
    /// The training accuracy of the step being reported (models that have one).
    train_acc: Option<f32>,
    eval_every: bool,
    bar: Option<ProgressBar>,
}

impl TrainObserver for Printer {
    fn start(&mut self, total: usize, note: &str) {
        if !note.is_empty() {
            errln!("{note}");
        }
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total as u64);
            bar.set_style(
                ProgressStyle::with_template("{bar:40} {pos}/{len} steps  {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            self.bar = Some(bar);
        }
    }
    fn train_accuracy(&mut self, _step: usize, accuracy: f32) {
        self.train_acc = Some(accuracy);
    }
    fn step(&mut self, step: usize, loss: f32, eps: f64) {
        if self.log_every > 0 && step.is_multiple_of(self.log_every) {
            let line = match self.train_acc {
                Some(a) => format!("step {step} loss {loss:.6} train acc {a:.4}"),
                None => format!("step {step} loss {loss:.6}"),
            };
            match &self.bar {
                Some(b) => b.println(line),
                None => outln!("{line}"),
            }
        }
        if let Some(b) = &self.bar {
            b.set_position(step as u64);
            if step.is_multiple_of(10) {
                b.set_message(format!("loss {loss:.4}  {eps:.0} examples/s"));
            }
        }
    }

    /// Periodic evaluations (`--eval-every`); the final accuracy has its own line.
    fn eval(&mut self, step: usize, accuracy: f64) {
        if !self.eval_every {
            return;
        }
        match &self.bar {
            Some(b) => b.println(format!("step {step} test accuracy {accuracy:.4}")),
            None => outln!("step {step} test accuracy {accuracy:.4}"),
        }
    }
}

/// Whether an MPI launcher started this process (Open MPI, MPICH/Hydra, PMIx).
fn launched_by_mpi() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok().and_then(|s| s.parse::<usize>().ok()))
}

/// The communicator of this run: MPI under a launcher, else this process alone.
fn communicator(timeout_secs: f64) -> Result<Arc<dyn Comm>, String> {
    let max = towers::saver::MAX_SECS;
    let timeout = match std::time::Duration::try_from_secs_f64(timeout_secs) {
        Ok(t) if (1e-3..=max).contains(&timeout_secs) => t,
        _ => {
            return Err(format!(
                "--comm-timeout {timeout_secs:e}: give a number of seconds above 0 (at least 0.001) and at most {max:e}, e.g. 300"
            ))
        }
    };
    match launched_by_mpi() {
        #[cfg(feature = "mpi")]
        Some(_) => {
            let c = towers::runtime::comm::MpiComm::init_with_timeout(timeout).map_err(|e| e.to_string())?;
            Ok(Arc::new(c))
        }
        #[cfg(not(feature = "mpi"))]
        Some(n) if n > 1 => Err(format!(
            "an MPI launcher started {n} processes, but this towers was built without MPI: build it with `cargo build --release --features mpi` (each process would otherwise train alone)"
        )),
        _ => {
            let _ = timeout; // used by the MPI communicator only
            Ok(Arc::new(LocalComm::single()))
        }
    }
}

/// `--lr-min` and `--lr-decay-*` typed with a `--lr-schedule` that does not
/// read them are refused (they were dropped in silence).
fn unused_schedule_flags(
    schedule: towers::train::LrScheduleKind,
    lr_min: Option<f32>,
    decay_steps: Option<usize>,
    decay_rate: Option<f32>,
) -> Result<(), String> {
    use towers::train::LrScheduleKind as K;
    let name = format!("{schedule:?}").to_lowercase();
    if lr_min.is_some() && schedule != K::Cosine {
        return Err(format!(
            "--lr-min is the end of the cosine schedule; --lr-schedule {name} does not read it: add --lr-schedule cosine (the default), or leave --lr-min out"
        ));
    }
    let decays = matches!(schedule, K::Step | K::Exponential);
    for (flag, given) in [("lr-decay-steps", decay_steps.is_some()), ("lr-decay-rate", decay_rate.is_some())] {
        if given && !decays {
            return Err(format!(
                "--{flag} shapes the step and exponential schedules; --lr-schedule {name} does not read it: add --lr-schedule step or exponential, or leave --{flag} out"
            ));
        }
    }
    Ok(())
}

pub fn run_train(a: TrainArgs) -> Result<(), String> {
    let comm = communicator(a.comm_timeout)?;
    let r = run_train_in(a, Arc::clone(&comm));
    if let Err(e) = &r {
        if comm.world_size() > 1 {
            // Every rank sees a collective's failure; one that fails alone
            // must not leave the others waiting for it.
            errln!("error (rank {} of {}): {e}", comm.rank(), comm.world_size());
            comm.abort(1);
        }
    }
    r
}

fn run_train_in(a: TrainArgs, comm: Arc<dyn Comm>) -> Result<(), String> {
    let lead = comm.rank() == 0;
    let mut cfg = config(&a.common)?;
    cuda_flags(&a.common, a.backend)?;
    let user = user_model(&a.common)?;
    fixed_batch(&a.common, user.as_ref(), cfg.batch, comm.world_size())?;
    let (input, classes) = towers::cost::placements::geometry(&cfg.data);
    auto_variables(&a.common, user.as_ref(), &mut cfg, input, classes, comm.world_size(), a.backend)?;
    ps_tasks(&a.common, &mut cfg, comm.world_size())?;
    // The machine's GPUs decide `--cuda-contexts` left out (none probed for --backend cpu).
    let gpus = match a.backend {
        towers::train::BackendChoice::Cpu => 0,
        _ => match Machine::probe().cuda {
            towers::runtime::devices::Cuda::Gpus(n) => n,
            towers::runtime::devices::Cuda::Absent(_) => 0,
        },
    };
    cuda_contexts(&a.common, &mut cfg, comm.world_size(), gpus);
    cfg.steps = a.steps;
    cfg.epochs = a.epochs.unwrap_or(match a.common.model {
        _ if user.is_some() => 20,
        Model::Mlp => 40,
        Model::Convnet => 20,
    });
    cfg.log_every = a.log_every;
    cfg.checkpoint = a.checkpoint;
    cfg.resume = a.resume;
    cfg.restore_partial = a.restore_partial;
    cfg.overwrite = a.overwrite;
    cfg.backend = a.backend;
    cfg.checkpoint_every = a.checkpoint_every;
    cfg.checkpoint_secs = a.checkpoint_secs;
    cfg.keep = a.keep;
    cfg.eval_every = a.eval_every;
    cfg.check_numerics = a.check_numerics;
    cfg.lr_schedule = a.lr_schedule;
    cfg.lr_decay_steps = a.lr_decay_steps.unwrap_or(cfg.lr_decay_steps);
    cfg.lr_decay_rate = a.lr_decay_rate.unwrap_or(cfg.lr_decay_rate);
    cfg.lr_min = a.lr_min.unwrap_or(cfg.lr_min);
    cfg.warmup_steps = a.warmup_steps;
    cfg.scale_lr = a.scale_lr;
    cfg.trace = a.trace;
    cfg.trace_steps = a.trace_steps;
    cfg.ps_async = a.ps_async;
    // `ps_tasks` above set cfg.ps_ranks from --ps-ranks.
    // Checked by `communicator` above.
    cfg.comm_timeout = std::time::Duration::try_from_secs_f64(a.comm_timeout).unwrap_or(cfg.comm_timeout);
    // Before anything is created (the --logdir event file): options first.
    towers::guards::validate(&cfg, comm.world_size()).map_err(|e| e.to_string())?;
    unused_flags(&a.common)?;
    unused_schedule_flags(a.lr_schedule, a.lr_min, a.lr_decay_steps, a.lr_decay_rate)?;
    // No output on an input (the --graph file) nor on another output.
    let mut paths: Vec<(&str, &std::path::Path, bool)> = Vec::new();
    if let Some(g) = &a.common.graph {
        paths.push(("graph", g, true));
    }
    for (flag, p) in [("checkpoint", &cfg.checkpoint), ("trace", &cfg.trace), ("plot", &a.plot)] {
        if let Some(p) = p {
            paths.push((flag, p, false));
        }
    }
    towers::outputs::check_distinct(&paths)?;
    // Devices this machine cannot serve on --backend (a /gpu:N under
    // --backend cuda without CUDA, a /cpu:1): refused before any data loads.
    let devices = towers::train::requested_devices(&cfg, user.as_ref().map(|m| &m.graph));
    towers::train::check_devices(cfg.backend, &devices, &Machine::probe()).map_err(|e| e.to_string())?;
    if let (true, Some(path)) = (lead, &a.plot) {
        // Checked now, not when the run ends.
        if path.extension().is_none_or(|e| !e.eq_ignore_ascii_case("svg")) {
            return Err(format!("--plot {}: draws SVG only; give a file name ending in .svg", path.display()));
        }
        towers::outputs::check_file("plot", path)?;
    }
    // A reused --dump-dir holds this run's dumps only (one process: under
    // several, another rank may already be writing its own).
    if let (Some(d), 1) = (&cfg.dump_dir, comm.world_size()) {
        towers::outputs::check_dir("dump-dir", d)?;
        towers::outputs::clear_stale_dumps(d)?;
    }
    let mut p = Printer { log_every: a.log_every, train_acc: None, eval_every: a.eval_every.is_some(), bar: None };
    let mut watch = match &a.logdir {
        Some(dir) if lead => Watch::with_logdir(dir).map_err(|e| e.to_string())?,
        _ => Watch::new(),
    };
    let mut obs = Tee(&mut p, &mut watch);
    let r = match &user {
        Some(m) => fit_in(m, &cfg, Arc::clone(&comm), &mut obs),
        None => train_in(&cfg, Arc::clone(&comm), &mut obs),
    }
    .map_err(|e| e.to_string())?;
    if !lead {
        // Rank 0 reports for the group.
        return Ok(());
    }
    if let Some(b) = &p.bar {
        b.finish_and_clear();
    }
    let event_file = watch.event_file().map(|f| f.display().to_string());
    let history = watch.finish().map_err(|e| e.to_string())?;
    if let Some(f) = event_file {
        errln!("events: {f}");
    }
    if let Some(path) = &a.plot {
        towers::plot::plot_svg(path, &history).map_err(|e| e.to_string())?;
    }
    for d in &r.diagnostics {
        errln!("warning: {d}");
    }
    for line in r.ps_async.iter().flat_map(|p| p.lines()) {
        errln!("{line}");
    }
    // The steps this run trained: a resumed run counts from its checkpoint's.
    let done = r.steps - r.trained.min(r.steps);
    match (r.trained, done) {
        (t, 0) if t == r.steps => errln!("{t} steps, {:.0} examples/s", r.examples_per_sec),
        (0, _) => {
            errln!("0 steps, 0 examples/s (nothing to train: the checkpoint is at or past the last step, {})", r.steps)
        }
        (t, d) => errln!(
            "{t} steps, {:.0} examples/s (resumed at global step {d}: steps {} to {})",
            r.examples_per_sec,
            d + 1,
            r.steps
        ),
    }
    outln!("test accuracy: {:.4}", r.test_accuracy);
    Ok(())
}
