//! Guards of a training run: options checked before anything is built, in
//! the words of the command line (each error names its `--flag`), since
//! `towers train` is where a [`TrainConfig`] comes from. A nonsensical value
//! is refused here rather than trained on: `--lr nan` used to diverge to 10%
//! accuracy in silence, `--hidden 0` trained a network with no hidden units.

use towers_graph::Graph;
use towers_runtime::Session;

use towers_passes::{ProcessGroup, VarPlacement};

use crate::models::ModelKind;
use crate::saver::MAX_SECS;
use crate::train::{TrainConfig, TrainError};

fn bad(flag: &'static str, why: String) -> TrainError {
    TrainError::InvalidOption { flag, reason: why }
}

/// Check every option of a run; the first problem is an error naming its flag.
/// `world` is the number of processes training together (1 alone): weights
/// name every tower of every process.
pub fn validate(cfg: &TrainConfig, world: usize) -> Result<(), TrainError> {
    if !cfg.lr.is_finite() || cfg.lr <= 0.0 {
        return Err(bad("lr", format!("the learning rate must be a finite number above 0, got {}", cfg.lr)));
    }
    if !cfg.momentum.is_finite() || !(0.0..1.0).contains(&cfg.momentum) {
        return Err(bad(
            "momentum",
            format!(
                "must be a number in [0, 1) (0.9 is usual; 1 or more makes the updates grow without bound), got {}",
                cfg.momentum
            ),
        ));
    }
    if !cfg.rmsprop_momentum.is_finite() || !(0.0..1.0).contains(&cfg.rmsprop_momentum) {
        return Err(bad(
            "momentum",
            format!("RMSProp's momentum must be a number in [0, 1) (0.9 is usual), got {}", cfg.rmsprop_momentum),
        ));
    }
    if cfg.batch == 0 {
        return Err(bad("batch", "the global batch must hold at least 1 example".into()));
    }
    if let Some(clip) = cfg.clip_norm {
        if !clip.is_finite() || clip <= 0.0 {
            return Err(bad(
                "clip-norm",
                format!("the norm to clip to must be a finite number above 0 (5 is usual), got {clip}"),
            ));
        }
        if world > 1 {
            return Err(bad(
                "clip-norm",
                "clips the gradients of one process's towers; across processes each would clip its own share (leave it out under mpirun)".into(),
            ));
        }
    }
    if cfg.accumulate == 0 {
        return Err(bad("accumulate", "accumulate at least 1 micro-batch per tower".into()));
    }
    if cfg.accumulate > 1 && cfg.towers == 0 {
        return Err(bad(
            "accumulate",
            format!(
                "accumulates micro-batches per tower and needs --towers N (e.g. --towers 1 --accumulate {})",
                cfg.accumulate
            ),
        ));
    }
    // One process without towers has one device: a placement among the
    // towers' devices would silently put everything on cpu:0. (Under
    // several processes each has a tower /gpu:0 without --towers.)
    if cfg.towers == 0 && world <= 1 {
        let name = match cfg.variables {
            VarPlacement::Gpu0 => Some("gpu0"),
            VarPlacement::RoundRobin => Some("round-robin"),
            VarPlacement::Greedy => Some("greedy"),
            VarPlacement::Cpu | VarPlacement::Ps { .. } => None,
        };
        if let Some(name) = name {
            return Err(bad(
                "variables",
                format!(
                    "{name} places variables among the towers' devices and needs --towers N (e.g. --towers 1 --variables {name}); without --towers everything runs on cpu:0"
                ),
            ));
        }
    }
    if cfg.resume && cfg.checkpoint.is_none() {
        return Err(bad("resume", "needs --checkpoint FILE: the file to resume from".into()));
    }
    if cfg.restore_partial && !cfg.resume {
        return Err(bad(
            "restore-partial",
            "restores partially what --resume restores: add --resume and --checkpoint FILE".into(),
        ));
    }
    if cfg.overwrite && cfg.checkpoint.is_none() {
        return Err(bad("overwrite", "needs --checkpoint FILE: the file to overwrite".into()));
    }
    if cfg.dump_dir.is_none() && cfg.dump_after.iter().any(|p| p != "all") {
        return Err(bad("dump-after", "needs --dump-dir DIR: the folder to dump into".into()));
    }
    match cfg.steps {
        Some(0) => return Err(bad("steps", "train at least 1 step (or leave --steps out to use --epochs)".into())),
        None if cfg.epochs == 0 => return Err(bad("epochs", "train at least 1 epoch, or give --steps".into())),
        _ => {}
    }
    if cfg.model == ModelKind::Mlp {
        if let Some(i) = cfg.hidden.iter().position(|&w| w == 0) {
            return Err(bad(
                "hidden",
                format!("layer {} has width 0; every hidden layer needs at least 1 unit", i + 1),
            ));
        }
    }
    if cfg.eval_batch == 0 {
        return Err(TrainError::Options("eval_batch must be at least 1".into()));
    }
    if let Some(w) = &cfg.split_weights {
        if w.contains(&0) {
            return Err(bad("split-weights", format!("every tower needs a weight of at least 1, got {w:?}")));
        }
        // With several processes each worker has at least one tower (the
        // --ps-ranks ranks run none).
        let world = world.saturating_sub(cfg.ps_ranks).max(1);
        let all = if world > 1 || cfg.ps_ranks > 0 { cfg.towers.max(1) * world } else { cfg.towers };
        if w.len() != all {
            let which = if world > 1 {
                format!("{all} towers ({} per process x {world} processes, rank 0's first)", cfg.towers.max(1))
            } else {
                format!("{all} towers (--towers)")
            };
            return Err(bad(
                "split-weights",
                format!("gives {} weights for {which}; give one weight per tower", w.len()),
            ));
        }
    }
    if cfg.trace.is_some() && cfg.trace_steps == 0 {
        return Err(bad("trace-steps", "trace at least 1 step".into()));
    }
    if cfg.checkpoint_every.is_some() && cfg.checkpoint.is_none() {
        return Err(bad("checkpoint-every", "needs --checkpoint FILE to know where to write".into()));
    }
    if cfg.checkpoint_secs.is_some() && cfg.checkpoint.is_none() {
        return Err(bad("checkpoint-secs", "needs --checkpoint FILE to know where to write".into()));
    }
    if let Some(s) = cfg.checkpoint_secs {
        if !s.is_finite() || s <= 0.0 || s > MAX_SECS {
            return Err(bad(
                "checkpoint-secs",
                format!("must be a finite number of seconds above 0 and at most {MAX_SECS:e}, got {s}"),
            ));
        }
    }
    if cfg.keep.is_some() && cfg.checkpoint.is_none() {
        return Err(bad("keep", "needs --checkpoint FILE: the kept files are named after it".into()));
    }
    if cfg.keep == Some(0) {
        return Err(bad("keep", "keep at least 1 checkpoint (leave --keep out to keep only --checkpoint)".into()));
    }
    if cfg.checkpoint_every == Some(0) {
        return Err(bad("checkpoint-every", "write a checkpoint every 1 or more steps".into()));
    }
    let decays =
        matches!(cfg.lr_schedule, crate::train::LrScheduleKind::Step | crate::train::LrScheduleKind::Exponential);
    if decays && cfg.lr_decay_steps == 0 {
        return Err(bad("lr-decay-steps", "decay every 1 or more steps".into()));
    }
    if !cfg.lr_decay_rate.is_finite() || cfg.lr_decay_rate <= 0.0 || cfg.lr_decay_rate > 1.0 {
        return Err(bad(
            "lr-decay-rate",
            format!(
                "must be a number in (0, 1] (a decay; above 1 the rate grows at every decay), got {}",
                cfg.lr_decay_rate
            ),
        ));
    }
    if !cfg.lr_min.is_finite() || cfg.lr_min < 0.0 || cfg.lr_min > cfg.lr {
        return Err(bad("lr-min", format!("must be a finite number in 0..=--lr ({}), got {}", cfg.lr, cfg.lr_min)));
    }
    if cfg.eval_every == Some(0) {
        return Err(bad("eval-every", "evaluate every 1 or more steps".into()));
    }
    Ok(())
}

/// Check every output path of a run before any work (the process that
/// writes them: rank 0): `--checkpoint`, `--trace`, `--dump-dir`. A
/// `--checkpoint` that exists must be resumed (`--resume`) or replaced on
/// purpose (`--overwrite`); see [`crate::saver`].
pub fn check_outputs(cfg: &TrainConfig) -> Result<(), TrainError> {
    let o = |e: String| TrainError::Options(e);
    if let Some(p) = &cfg.checkpoint {
        crate::outputs::check_file("checkpoint", p).map_err(o)?;
        // Going back to a snapshot (TF1's `saver.restore(sess, "model.ckpt-200")`)
        // must not destroy it: this run would write its state into it.
        if let (true, false, true, Some((head, step))) =
            (cfg.resume, cfg.overwrite, p.exists(), crate::saver::Saver::series_of(p))
        {
            let (p, head) = (p.display(), head.display());
            return Err(o(format!(
                "--checkpoint {p} is the step-{step} snapshot of the series {head}: resuming it would overwrite it with this run's state (and name its snapshots after it); to go back to step {step}, copy it (cp {p} {head}) and resume --checkpoint {head} (add --overwrite when newer snapshots are beside it), or copy it to a new name to branch off; --overwrite resumes it in place"
            )));
        }
        if p.exists() && !cfg.resume && !cfg.overwrite {
            return Err(o(format!(
                "--checkpoint {} already exists and this run does not resume from it: add --resume to continue it, --overwrite to replace it, or choose another path",
                p.display()
            )));
        }
    }
    if let Some(p) = &cfg.trace {
        crate::outputs::check_file("trace", p).map_err(o)?;
    }
    if let Some(p) = &cfg.dump_dir {
        crate::outputs::check_dir("dump-dir", p).map_err(o)?;
    }
    Ok(())
}

/// Every `--dump-after` name is a pass of the pipeline this run compiles
/// (or `all`); an unknown name is an error listing the passes.
pub fn check_dump_after(cfg: &TrainConfig, process: ProcessGroup) -> Result<(), TrainError> {
    let opts = cfg.compile_options_for(process);
    let names = towers_passes::Pipeline::train("loss", &opts).names();
    match cfg.dump_after.iter().find(|p| *p != "all" && !names.contains(&p.as_str())) {
        Some(p) => {
            Err(bad("dump-after", format!("no pass is named '{p}'; this run's passes are: all, {}", names.join(", "))))
        }
        None => Ok(()),
    }
}

/// `--check-numerics` (TF's `tf.debugging.check_numerics`, after the fact):
/// the first node of the step, in the graph's topological order, with an f32
/// output that is not finite, as "node 'NAME' (scope 'SCOPE', on DEVICE)".
/// Reads every tensor of the program from the backend: only on the failure
/// path, never in a healthy step.
pub fn first_non_finite(sess: &Session, program: &str, graph: &Graph) -> Option<String> {
    let order = graph.topo_order().ok()?;
    let plan = sess.plan(program).ok()?;
    for id in order {
        let n = graph.node(id);
        // Variables already hold this step's update: the question is which
        // computation produced a non-finite value, so state and the copies
        // of variables (which read the updated variable on the CPU backend) are skipped.
        let of_variable = |t: &towers_graph::Tensor| graph.node(t.node).op.is_stateful();
        if n.op.is_stateful() || (matches!(n.op, towers_graph::Op::Copy) && graph.inputs(id).iter().any(of_variable)) {
            continue;
        }
        for slot in 0..n.outputs.len() {
            let name = if slot == 0 { n.name.clone() } else { format!("{}:{slot}", n.name) };
            if matches!(plan.lookup(&name), Some(towers_codegen::BufRef::Variable(_)) | None) {
                continue;
            }
            let Ok(values) = sess.fetch::<f32>(program, &name) else { continue };
            if values.iter().any(|v| !v.is_finite()) {
                let scope = n.name.rsplit_once('/').map(|(s, _)| s).unwrap_or("");
                let device = n.device.map(|d| d.to_string()).unwrap_or_else(|| "no device".into());
                let kind = if values.iter().any(|v| v.is_nan()) { "NaN" } else { "Inf" };
                return Some(format!(
                    "node '{name}' ({}, scope '{scope}', on {device}) is the first with {kind} values",
                    n.op.type_name()
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(f: impl FnOnce(&mut TrainConfig)) -> String {
        let mut c = TrainConfig::default();
        f(&mut c);
        validate(&c, 1).expect_err("refused").to_string()
    }

    #[test]
    fn the_defaults_pass() {
        validate(&TrainConfig::default(), 1).expect("defaults are valid");
    }

    #[test]
    fn each_nonsensical_option_is_an_error_naming_its_flag() {
        assert!(err(|c| c.lr = f32::NAN).contains("--lr: the learning rate must be a finite number above 0, got NaN"));
        assert!(err(|c| c.lr = f32::INFINITY).contains("--lr:"));
        assert!(err(|c| c.lr = -0.1).contains("got -0.1"));
        assert!(err(|c| c.lr = 0.0).contains("--lr:"));
        assert!(err(|c| c.momentum = f32::NAN).contains("--momentum:"));
        assert!(err(|c| c.batch = 0).contains("--batch:"));
        assert!(err(|c| c.accumulate = 0).contains("--accumulate:"));
        assert!(err(|c| c.clip_norm = Some(0.0)).contains("--clip-norm:"));
        assert!(err(|c| c.clip_norm = Some(f32::NAN)).contains("--clip-norm:"));
        assert!(err(|c| c.steps = Some(0)).contains("--steps:"));
        assert!(err(|c| c.epochs = 0).contains("--epochs:"));
        assert!(err(|c| c.hidden = vec![64, 0]).contains("--hidden: layer 2 has width 0"));
        assert!(err(|c| c.split_weights = Some(vec![3, 1])).contains("gives 2 weights for 0 towers (--towers)"));
        assert!(err(|c| {
            c.towers = 2;
            c.split_weights = Some(vec![1, 0])
        })
        .contains("--split-weights: every tower needs a weight of at least 1"));
        assert!(err(|c| c.checkpoint_every = Some(5)).contains("--checkpoint-every: needs --checkpoint FILE"));
        assert!(err(|c| c.eval_every = Some(0)).contains("--eval-every:"));
        assert!(err(|c| c.keep = Some(2)).contains("--keep: needs --checkpoint"));
        assert!(err(|c| c.lr_min = 1.0).contains("--lr-min: must be a finite number in 0..=--lr"));
        assert!(err(|c| {
            c.lr_schedule = crate::train::LrScheduleKind::Step;
            c.lr_decay_steps = 0
        })
        .contains("--lr-decay-steps:"));
        assert!(err(|c| {
            c.checkpoint = Some("m.safetensors".into());
            c.keep = Some(0)
        })
        .contains("--keep: keep at least 1"));
        assert!(err(|c| {
            c.checkpoint = Some("m.safetensors".into());
            c.checkpoint_secs = Some(f64::NAN)
        })
        .contains("--checkpoint-secs: must be a finite number"));
    }

    /// A placement among the towers' devices needs towers (one process);
    /// under several processes each has a tower without --towers.
    #[test]
    fn variables_among_towers_need_towers() {
        for (v, name) in
            [(VarPlacement::Gpu0, "gpu0"), (VarPlacement::RoundRobin, "round-robin"), (VarPlacement::Greedy, "greedy")]
        {
            let e = err(|c| c.variables = v);
            assert!(
                e.contains(&format!("--variables: {name} places variables among the towers' devices and needs --towers N (e.g. --towers 1 --variables {name})")),
                "{e}"
            );
            assert!(e.contains("without --towers everything runs on cpu:0"), "{e}");
            validate(&TrainConfig { variables: v, towers: 1, ..TrainConfig::default() }, 1).expect("with towers");
            validate(&TrainConfig { variables: v, ..TrainConfig::default() }, 2).expect("a tower per process");
        }
    }

    #[test]
    fn zero_epochs_are_fine_when_steps_are_given() {
        let c = TrainConfig { epochs: 0, steps: Some(3), ..TrainConfig::default() };
        validate(&c, 1).expect("--steps overrides --epochs");
    }
}
