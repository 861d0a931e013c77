//! Periodic checkpoints during a run, as TF1's `tf.train.Saver` kept them.
//!
//! - `--checkpoint PATH` always holds the latest checkpoint (what `--resume`
//!   restores); it is written at the end of a run and at every periodic save.
//! - `--checkpoint-every N` saves after every N-th step, `--checkpoint-secs S`
//!   after the first step that ends S seconds or more after the last save;
//!   both may be given.
//! - `--keep K` also keeps step-stamped copies `STEM-<global_step>.EXT`
//!   (`model.safetensors` → `model-120.safetensors`), the last K of them: older
//!   stamped files of the same stem are deleted after each save (TF's
//!   `max_to_keep`).
//!
//! Every file is written atomically (runtime `Session::save`), and a save
//! happens only after a step whose loss was finite: a diverged state is
//! never written (`train` stops before reaching the saver).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use towers_runtime::Session;

use crate::train::TrainError;

/// When and where a run saves (see the module docs).
pub struct Saver {
    path: PathBuf,
    every: Option<usize>,
    secs: Option<Duration>,
    keep: Option<usize>,
    last: Instant,
}

impl Saver {
    pub fn new(path: &Path, every: Option<usize>, secs: Option<f64>, keep: Option<usize>) -> Saver {
        Saver { path: path.to_path_buf(), every, secs: secs.map(Duration::from_secs_f64), keep, last: Instant::now() }
    }

    /// The step-stamped file of `global_step`.
    pub fn stamped(&self, global_step: i64) -> PathBuf {
        let stem = self.path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        let name = match self.path.extension() {
            Some(ext) => format!("{stem}-{global_step}.{}", ext.to_string_lossy()),
            None => format!("{stem}-{global_step}"),
        };
        self.path.with_file_name(name)
    }

    /// Save after `step` (1-based in this run) if it is due.
    pub fn after_step(&mut self, sess: &Session, step: usize) -> Result<(), TrainError> {
        let by_steps = self.every.is_some_and(|n| step.is_multiple_of(n));
        let by_time = self.secs.is_some_and(|d| self.last.elapsed() >= d);
        if by_steps || by_time {
            self.save(sess)?;
        }
        Ok(())
    }

    /// Write the latest checkpoint (and its stamped copy with `--keep`).
    pub fn save(&mut self, sess: &Session) -> Result<(), TrainError> {
        sess.save(&self.path)?;
        if let Some(keep) = self.keep {
            let step = sess.read_variable_i32("global_step").ok().and_then(|g| g.first().copied()).unwrap_or(0);
            sess.save(self.stamped(step as i64))?;
            self.prune(keep)?;
        }
        self.last = Instant::now();
        Ok(())
    }

    /// The stamped checkpoints of this path, oldest first.
    pub fn stamped_files(&self) -> Vec<(i64, PathBuf)> {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let stem = self.path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        let ext = self.path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
        let mut out: Vec<(i64, PathBuf)> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                let step = name.strip_prefix(&format!("{stem}-"))?.strip_suffix(ext.as_str())?.parse().ok()?;
                Some((step, e.path()))
            })
            .collect();
        out.sort();
        out
    }

    fn prune(&self, keep: usize) -> Result<(), TrainError> {
        let files = self.stamped_files();
        for (_, f) in files.iter().take(files.len().saturating_sub(keep)) {
            std::fs::remove_file(f)
                .map_err(|e| TrainError::Options(format!("--keep: cannot delete {}: {e}", f.display())))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamped_names_follow_the_checkpoint_path() {
        let s = Saver::new(Path::new("runs/model.safetensors"), None, None, Some(2));
        assert_eq!(s.stamped(120), PathBuf::from("runs/model-120.safetensors"));
        let s = Saver::new(Path::new("ckpt"), None, None, Some(2));
        assert_eq!(s.stamped(7), PathBuf::from("ckpt-7"));
    }
}
