//! `--resume`: restoring a run from `--checkpoint`, as strictly as TF1's
//! `Saver`.
//!
//! Invariants:
//! - Every checkpoint this CLI writes describes its run in one line
//!   ([`run_description`], the header metadata `towers.run`): the model,
//!   its input, and the options that decide the variables' meaning
//!   (hidden widths and activation of an MLP, batch norm of a convnet, the
//!   optimizer), and the batch.
//! - A strict resume (the default) needs the same model: the description's
//!   fields equal (the batch excepted: a different batch is a warning, since
//!   the data order then differs from an uninterrupted run), every variable
//!   present with its dtype and shape, no unknown tensor, every value
//!   finite. A checkpoint without a description (written by a library
//!   caller) is checked by its tensors alone.
//! - `--restore-partial` loads the matching tensors and returns one line per
//!   skipped tensor or differing field, which the CLI prints before the
//!   first step. Non-finite values are refused even then. It restores the
//!   model's variables only, as TF1's fine-tuning recipes (slim's
//!   `assign_from_checkpoint_fn` over the model variables): `global_step`,
//!   `learning_rate` and the optimizer slots start fresh
//!   (`Session::restore_partial`, which leaves `Session::training_state` out),
//!   so `--steps 100` trains 100 steps.

use std::collections::BTreeMap;
use std::path::Path;

use towers_runtime::checkpoint::read_run_metadata;
use towers_runtime::{RuntimeError, Session};

use crate::config::TrainConfig;
use crate::data::Dataset;
use crate::models::ModelKind;
use crate::train::TrainError;

/// The one-line description of a run that its checkpoints carry, e.g.
/// `model=mlp; input=8x8x1; classes=10; hidden=256,256; activation=relu; optimizer=momentum; batch=32`.
/// A user's model ([`crate::trainer::Model`]) is `model=graph` with
/// `graph=` a fingerprint of its model file's text (FNV-1a, 64 bits): a
/// checkpoint of another graph is refused by name before its tensors are compared.
pub fn run_description(cfg: &TrainConfig, data: &Dataset, model: &crate::trainer::Model) -> String {
    let user = !model.builtin;
    let mut f = vec![
        ("model", if user { "graph".into() } else { format!("{:?}", cfg.model).to_lowercase() }),
        ("input", format!("{}x{}x{}", data.height(), data.width(), data.channels())),
        ("classes", data.num_classes().to_string()),
    ];
    match cfg.model {
        _ if user => f.push(("graph", fingerprint(model))),
        ModelKind::Mlp => {
            let h: Vec<String> = cfg.hidden.iter().map(|w| w.to_string()).collect();
            f.push(("hidden", h.join(",")));
            f.push(("activation", format!("{:?}", cfg.activation).to_lowercase()));
        }
        ModelKind::Convnet => f.push(("batch_norm", cfg.batch_norm.to_string())),
    }
    let nesterov =
        if cfg.nesterov && cfg.optimizer == crate::config::OptimizerKind::Momentum { "+nesterov" } else { "" };
    f.push(("optimizer", format!("{:?}{nesterov}", cfg.optimizer).to_lowercase()));
    f.push(("batch", cfg.batch.to_string()));
    f.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ")
}

/// FNV-1a of the model file's text, as 16 hex digits.
fn fingerprint(model: &crate::trainer::Model) -> String {
    let text = model.to_json().unwrap_or_default();
    let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    format!("{h:016x}")
}

fn fields(desc: &str) -> BTreeMap<&str, &str> {
    desc.split("; ").filter_map(|kv| kv.split_once('=')).collect()
}

/// How the checkpoint's run (`theirs`) differs from this one (`ours`): one
/// line per field, the batch apart.
fn differences(theirs: &str, ours: &str) -> (Vec<String>, Option<String>) {
    let (t, o) = (fields(theirs), fields(ours));
    let mut keys: Vec<&str> = t.keys().chain(o.keys()).copied().collect();
    keys.sort();
    keys.dedup();
    let mut model = Vec::new();
    let mut batch = None;
    for k in keys {
        let (a, b) = (t.get(k).copied().unwrap_or("(none)"), o.get(k).copied().unwrap_or("(none)"));
        if a == b {
            continue;
        }
        let line = format!("{k}: {a} in the checkpoint, {b} in this run");
        if k == "batch" {
            batch = Some(line);
        } else {
            model.push(line);
        }
    }
    (model, batch)
}

/// Restore `sess` from `path` for `cfg` (strict, or partial with
/// `cfg.restore_partial`); the lines to print before the first step.
/// `elsewhere`: tensors of the file another rank holds (`--variables ps`
/// across processes: the optimizer slots other ranks own), left out.
pub fn restore(
    sess: &mut Session,
    cfg: &TrainConfig,
    path: &Path,
    ours: &str,
    elsewhere: &std::collections::BTreeSet<String>,
) -> Result<Vec<String>, TrainError> {
    let hint = "; to load only the tensors that match (fine tuning), add --restore-partial";
    let mut notes = Vec::new();
    let theirs = read_run_metadata(path)?;
    let (model, batch) = theirs.as_deref().map(|t| differences(t, ours)).unwrap_or_default();
    if !model.is_empty() && !cfg.restore_partial {
        return Err(TrainError::Resume(format!(
            "{} is a checkpoint of another model ({}){hint}",
            path.display(),
            model.join("; ")
        )));
    }
    if let Some(b) = batch {
        notes.push(format!("warning: --resume: {b}; the data order differs from an uninterrupted run"));
    }
    if cfg.restore_partial {
        for m in model {
            notes.push(format!("--restore-partial: {m}"));
        }
        // The runtime's fine-tuning restore leaves the training state
        // (steps, rates, slots) at its initial values and lists it.
        let fresh = sess.training_state();
        let s = sess.restore_partial(path)?;
        if !fresh.is_empty() {
            let counter = |n: &str| n == "global_step" || n.ends_with("/step");
            let slots = fresh.iter().filter(|n| !counter(n) && !towers_graph::is_learning_rate(n)).count();
            notes.push(format!(
                "--restore-partial: restored the model's variables only (fine tuning, as TF1's init_from_checkpoint): global_step, the learning rate and {slots} optimizer slot(s) start fresh, so the run trains from step 0"
            ));
        }
        for n in &s.missing {
            notes.push(format!("--restore-partial: skipped '{n}': not in the checkpoint (keeps its initial value)"));
        }
        for n in &s.mismatched {
            notes.push(format!("--restore-partial: skipped '{n}' (keeps its initial value)"));
        }
        for n in s.unknown.iter().filter(|n| !elsewhere.contains(*n)) {
            notes.push(format!("--restore-partial: skipped '{n}': this model has no such variable (dropped)"));
        }
        if s.missing.is_empty() && s.mismatched.is_empty() && s.unknown.is_empty() {
            notes.push("--restore-partial: every tensor matched; nothing was skipped".into());
        }
        return Ok(notes);
    }
    sess.restore_ignoring(path, |n| elsewhere.contains(n)).map_err(|e| match e {
        RuntimeError::CheckpointMissing { .. }
        | RuntimeError::CheckpointMismatch { .. }
        | RuntimeError::CheckpointUnknown { .. } => TrainError::Resume(format!("{e}{hint}")),
        e => TrainError::Runtime(e),
    })?;
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_each_field_and_keep_the_batch_apart() {
        let a = "model=mlp; input=8x8x1; activation=relu; batch=32";
        let b = "model=mlp; input=8x8x1; activation=tanh; batch=64";
        let (m, batch) = differences(a, b);
        assert_eq!(m, ["activation: relu in the checkpoint, tanh in this run"]);
        assert_eq!(batch.as_deref(), Some("batch: 32 in the checkpoint, 64 in this run"));
        assert_eq!(differences(a, a), (Vec::new(), None));
    }
}
