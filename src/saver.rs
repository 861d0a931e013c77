//! Periodic checkpoints during a run, as TF1's `tf.train.Saver` kept them.
//!
//! - `--checkpoint PATH` always holds the latest checkpoint (what `--resume`
//!   restores); it is written at the end of a run and at every periodic save.
//! - `--checkpoint-every N` saves after every N-th step, `--checkpoint-secs S`
//!   after the first step that ends S seconds or more after the last save;
//!   both may be given.
//! - `--keep K` also keeps step-stamped copies `STEM-<global_step>.EXT`
//!   (`model.safetensors` → `model-120.safetensors`), the last K of them
//!   (TF's `max_to_keep`).
//!
//! Invariants:
//! - **Nothing of another run is touched.** A run that did not resume
//!   refuses to start when `PATH` or stamped files of its stem exist, unless
//!   `--overwrite` says to replace them; a resumed run refuses stamped files
//!   newer than the step it resumed (they belong to another run). Pruning
//!   deletes only files of this run's series: the stamped files it wrote,
//!   and with `--resume` the older ones of the series it continues; never a
//!   file that was there under `--overwrite`.
//! - **No stray temporary files.** Every file is written atomically
//!   (runtime `Session::save_with_run`: temporary file, rename, the
//!   temporary removed on error); at start the temporaries of this
//!   checkpoint's series that a crash left (`.STEM.EXT.tmp`,
//!   `.STEM-<step>.EXT.tmp`) are deleted.
//! - **Only finite states are saved**: `train` stops before the saver on a
//!   non-finite loss, and the runtime refuses a save whose variables hold
//!   NaN or Inf, naming the tensor.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use towers_runtime::checkpoint::temp_path;
use towers_runtime::Session;

use crate::train::TrainError;

/// The longest `--checkpoint-secs` and `--comm-timeout` accepted: 1e9
/// seconds (about 31 years), far below where a `Duration` or an `Instant`
/// overflows.
pub const MAX_SECS: f64 = 1e9;

/// When and where a run saves (see the module docs).
pub struct Saver {
    path: PathBuf,
    every: Option<usize>,
    secs: Option<Duration>,
    keep: Option<usize>,
    last: Instant,
    /// The one-line description of the run, in every checkpoint's header.
    run: Option<String>,
    /// This run's series of stamped files, oldest first.
    series: Vec<(i64, PathBuf)>,
}

fn options(why: String) -> TrainError {
    TrainError::Options(why)
}

impl Saver {
    /// A saver of `path`; `secs` must be finite, positive and at most [`MAX_SECS`].
    pub fn new(path: &Path, every: Option<usize>, secs: Option<f64>, keep: Option<usize>) -> Saver {
        let secs = secs.and_then(|s| Duration::try_from_secs_f64(s.min(MAX_SECS)).ok());
        Saver { path: path.to_path_buf(), every, secs, keep, last: Instant::now(), run: None, series: Vec::new() }
    }

    /// Describe the run in every checkpoint's header ([`crate::resume::run_description`]).
    pub fn with_run(mut self, run: String) -> Saver {
        self.run = Some(run);
        self
    }

    /// Get ready to write: delete the series' stale temporary files, and
    /// check that nothing of another run would be replaced or pruned (see
    /// the module docs). `resumed_at` is the global step a resumed run
    /// restored (`None` when it did not resume from `path`).
    pub fn start(&mut self, resumed_at: Option<i64>, overwrite: bool) -> Result<(), TrainError> {
        for stale in self.stale_temporaries() {
            std::fs::remove_file(&stale).map_err(|e| {
                options(format!("--checkpoint: cannot delete the stale temporary file {}: {e}", stale.display()))
            })?;
        }
        let stamped = self.stamped_files();
        let p = self.path.display();
        match resumed_at {
            None if overwrite => {}
            None if self.path.exists() => {
                return Err(options(format!(
                    "--checkpoint {p} already exists and this run did not resume from it: add --resume to continue it, --overwrite to replace it, or choose another path"
                )));
            }
            None if !stamped.is_empty() => {
                return Err(options(format!(
                    "--checkpoint {p}: {} step-stamped checkpoint(s) of another run are beside it ({}): add --resume to continue that run, --overwrite to write beside them (they are never pruned), or choose another path",
                    stamped.len(),
                    names(&stamped)
                )));
            }
            None => {}
            Some(at) => {
                let newer: Vec<(i64, PathBuf)> = stamped.iter().filter(|(s, _)| *s > at).cloned().collect();
                if !newer.is_empty() && !overwrite {
                    return Err(options(format!(
                        "--checkpoint {p} holds step {at}, but newer step-stamped checkpoints of another run are beside it ({}): move them away, or add --overwrite to write beside them (they are never pruned)",
                        names(&newer)
                    )));
                }
                self.series = stamped.into_iter().filter(|(s, _)| *s <= at).collect();
            }
        }
        Ok(())
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
        if self.due(step) {
            self.save(sess)?;
        }
        Ok(())
    }

    /// Whether a checkpoint is due after `step` (by steps or by time).
    pub fn due(&self, step: usize) -> bool {
        let by_steps = self.every.is_some_and(|n| step.is_multiple_of(n));
        let by_time = self.secs.is_some_and(|d| self.last.elapsed() >= d);
        by_steps || by_time
    }

    /// Write the latest checkpoint (and its stamped copy with `--keep`).
    pub fn save(&mut self, sess: &Session) -> Result<(), TrainError> {
        self.save_with(sess, &[])
    }

    /// As [`Saver::save`], with tensors other ranks hold (`--variables ps`
    /// across processes: their optimizer slots) written beside the
    /// session's variables.
    pub fn save_with(&mut self, sess: &Session, extra: &[(String, Vec<usize>, Vec<f32>)]) -> Result<(), TrainError> {
        sess.save_with_extra(&self.path, self.run.as_deref(), extra).map_err(|e| match e {
            e @ towers_runtime::RuntimeError::NonFiniteVariable { .. } => TrainError::NonFiniteState(e.to_string()),
            e => TrainError::Runtime(e),
        })?;
        if let Some(keep) = self.keep {
            let step = sess.variable::<i32>("global_step").ok().and_then(|g| g.first().copied()).unwrap_or(0);
            let stamped = self.stamped(step as i64);
            sess.save_with_extra(&stamped, self.run.as_deref(), extra)?;
            if !self.series.iter().any(|(s, _)| *s == step as i64) {
                self.series.push((step as i64, stamped));
                self.series.sort();
            }
            self.prune(keep)?;
        }
        self.last = Instant::now();
        Ok(())
    }

    fn dir(&self) -> PathBuf {
        match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    /// When `path` is a step-stamped snapshot of a series (`STEM-<N>.EXT`
    /// with `STEM.EXT` or another stamped file of that stem beside it): the
    /// series' path and N. Resuming such a file as `--checkpoint` would
    /// overwrite the snapshot with the run's last state.
    pub fn series_of(path: &Path) -> Option<(PathBuf, i64)> {
        let stem = path.file_stem()?.to_str()?;
        let (base, n) = stem.rsplit_once('-')?;
        if base.is_empty() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let step: i64 = n.parse().ok()?;
        let head_name = match path.extension() {
            Some(ext) => format!("{base}.{}", ext.to_string_lossy()),
            None => base.to_string(),
        };
        let head = path.with_file_name(head_name);
        let series = Saver::new(&head, None, None, None);
        let siblings =
            series.stamped_files().into_iter().filter(|(s, p)| *s != step || p.file_name() != path.file_name());
        (head.exists() || siblings.count() > 0).then_some((head, step))
    }

    /// The stamped checkpoints of this path in its folder, oldest first.
    pub fn stamped_files(&self) -> Vec<(i64, PathBuf)> {
        let stem = self.path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        let ext = self.path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
        let mut out: Vec<(i64, PathBuf)> = std::fs::read_dir(self.dir())
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

    /// Temporary files of this series that a crashed save left behind.
    fn stale_temporaries(&self) -> Vec<PathBuf> {
        let main = temp_path(&self.path);
        let stamped = self.stamped(0);
        let stamped_tmp = temp_path(&stamped).file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        // ".STEM-0.EXT.tmp" → prefix ".STEM-", suffix ".EXT.tmp", digits between.
        let (pre, post) =
            stamped_tmp.split_once("-0").map(|(a, b)| (format!("{a}-"), b.to_string())).unwrap_or_default();
        let mut out: Vec<PathBuf> = std::fs::read_dir(self.dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                let n = e.file_name().to_string_lossy().to_string();
                let digits = n.strip_prefix(pre.as_str()).and_then(|r| r.strip_suffix(post.as_str()));
                e.path() == main
                    || digits.is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit() || b == b'-'))
            })
            .map(|e| e.path())
            .collect();
        if main.exists() && !out.contains(&main) {
            out.push(main);
        }
        out.sort();
        out
    }

    /// Delete this series' stamped files but the last `keep`.
    fn prune(&mut self, keep: usize) -> Result<(), TrainError> {
        let drop = self.series.len().saturating_sub(keep);
        for (_, f) in self.series.drain(..drop) {
            match std::fs::remove_file(&f) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(options(format!("--keep: cannot delete {}: {e}", f.display()))),
            }
        }
        Ok(())
    }
}

/// At most four file names, then how many more.
fn names(files: &[(i64, PathBuf)]) -> String {
    let mut v: Vec<String> =
        files.iter().take(4).map(|(_, p)| p.file_name().unwrap_or_default().to_string_lossy().to_string()).collect();
    if files.len() > 4 {
        v.push(format!("and {} more", files.len() - 4));
    }
    v.join(", ")
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

    #[test]
    fn stale_temporaries_are_those_of_this_series_only() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for n in [".x.st.tmp", ".x-5.st.tmp", ".x-120.st.tmp", ".y-5.st.tmp", ".x-a.st.tmp", "x-5.st", ".xx-5.st.tmp"] {
            std::fs::write(d.join(n), b"partial").unwrap();
        }
        let s = Saver::new(&d.join("x.st"), None, None, Some(2));
        let found: Vec<String> =
            s.stale_temporaries().iter().map(|p| p.file_name().unwrap().to_string_lossy().to_string()).collect();
        assert_eq!(found, [".x-120.st.tmp", ".x-5.st.tmp", ".x.st.tmp"]);
    }

    #[test]
    fn a_fresh_run_refuses_a_foreign_series_and_overwrite_never_prunes_it() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for n in ["x-11350.st", "x-11360.st"] {
            std::fs::write(d.join(n), b"old").unwrap();
        }
        let mut s = Saver::new(&d.join("x.st"), None, None, Some(2));
        let e = s.start(None, false).unwrap_err().to_string();
        assert!(e.contains("x-11350.st, x-11360.st") && e.contains("--overwrite"), "{e}");
        s.start(None, true).expect("--overwrite writes beside them");
        assert!(s.series.is_empty(), "the foreign files are not this run's series");
        // Resumed at step 11355: x-11360 is newer, from another run.
        let e = s.start(Some(11355), false).unwrap_err().to_string();
        assert!(e.contains("x-11360.st") && !e.contains("x-11350.st,"), "{e}");
        s.start(Some(11360), false).expect("the series this run continues");
        assert_eq!(s.series.len(), 2);
    }
}
