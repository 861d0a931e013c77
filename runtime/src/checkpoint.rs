//! Checkpoints: every variable (optimizer slots and `global_step`
//! included) by its scoped name, in the safetensors format (little-endian
//! f32 or i32; bools as i32), with an optional one-line description of the
//! run that wrote it (the header's `__metadata__`, key [`RUN_KEY`]).
//!
//! Backend-neutral: values go through the session's variable reads and
//! writes (copies to and from host memory), so a checkpoint written from one
//! backend restores on another.
//!
//! Invariants:
//! - **Atomic saves.** The bytes go to a temporary file in the target's
//!   directory ([`temp_path`]), which is fsynced, renamed over the target,
//!   and the directory fsynced. A crash at any point leaves either the old
//!   or the new checkpoint, never a torn one. On every error the temporary
//!   file is removed (a full disk is not kept full); one left by a crash is
//!   the caller's to clean at its next start (the CLI's saver does).
//! - **Only regular files.** A target or source that exists and is not a
//!   regular file (a FIFO, a device, a folder) is refused before anything
//!   is opened: a FIFO would block forever, a device would be replaced.
//! - **Only finite values are saved or restored.** A variable holding NaN
//!   or Inf is an error naming the tensor, on save and on restore.
//! - **Restore like TF1's `Saver`.** [`Session::restore`] needs every
//!   variable of the session in the file with its dtype and shape (else it
//!   is a checkpoint of another model). Tensors the session has no variable
//!   for are kept for a program loaded later (an evaluation session
//!   restores a training checkpoint, optimizer slots and all, as
//!   `cifar10_eval.py` did). One thing is not taken from the file: the
//!   learning rates (`learning_rate` and every named optimizer's
//!   `<name>/learning_rate`, [`towers_vocab::is_learning_rate`]), which stay
//!   what the programs were compiled with (in TF1 a graph constant the
//!   `Saver` never saw: fine-tuning compiles a smaller one).
//!   A restored `global_step` becomes every loaded program's step, so
//!   dropout continues the masks of an uninterrupted run.
//! - **Exact resume is stricter.** [`Session::restore_ignoring`] (the
//!   CLI's `--resume`) also refuses a tensor the session does not have: a
//!   resumed run must continue the optimizer it saved.
//!   [`Session::restore_partial`] is the explicit opt-in for fine tuning
//!   (TF1's `Saver(var_list=model variables)`): it loads the model's
//!   variables that match, never the learning rates, and by default none
//!   of the training state ([`Session::training_state`]: steps, slots),
//!   and reports what it skipped; [`Session::restore_partial_with`]
//!   chooses the tensors by name.
//! - Nothing is written to the session unless the whole file checked.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use towers_vocab::{is_learning_rate, DType, GLOBAL_STEP};

use crate::error::RuntimeError;
use crate::session::Session;
use crate::variables::HostVec;

/// The header metadata key under which a checkpoint describes its run
/// (one key, so the header's bytes are deterministic).
pub const RUN_KEY: &str = "towers.run";

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::I32 | DType::Bool => Dtype::I32,
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> RuntimeError + '_ {
    move |source| RuntimeError::Io { path: path.display().to_string(), source }
}

fn ck(path: &Path, detail: String) -> RuntimeError {
    RuntimeError::Checkpoint { path: path.display().to_string(), detail }
}

/// The temporary file a save of `path` writes first.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "checkpoint".into());
    path.with_file_name(format!(".{name}.tmp"))
}

/// What kind of file system object `path` is, when it exists and is not a
/// regular file (following symbolic links): "a FIFO", "a folder", ...
pub fn not_regular(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = fs::metadata(path).ok()?.file_type();
    Some(if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    })
}

fn refuse_non_regular(path: &Path) -> Result<(), RuntimeError> {
    match not_regular(path) {
        Some(kind) => Err(ck(path, format!("is {kind}, not a regular file; give the path of a file"))),
        None => Ok(()),
    }
}

/// A checkpoint to write into a folder that does not exist (or is not a
/// folder): refused before anything is gathered, naming the folder, where
/// the OS would only say "No such file or directory".
fn refuse_missing_folder(path: &Path) -> Result<(), RuntimeError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => return Ok(()),
    };
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(ck(path, format!("{} is not a folder; save into a folder", dir.display()))),
        Err(_) => Err(ck(
            path,
            format!(
                "the folder {} does not exist; create it first (std::fs::create_dir_all) or save elsewhere",
                dir.display()
            ),
        )),
    }
}

/// Write `data` to `path` atomically (see the module docs): temporary file,
/// fsync, rename, directory fsync; the temporary file is removed on every
/// error.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), std::io::Error> {
    let tmp = temp_path(path);
    let r = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)
    })();
    if r.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    r?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir).and_then(|d| d.sync_all())
}

/// The run description of the checkpoint at `path` (its [`RUN_KEY`]
/// metadata), reading only the header; `None` when it has none.
pub fn read_run_metadata(path: &Path) -> Result<Option<String>, RuntimeError> {
    refuse_non_regular(path)?;
    let mut f = File::open(path).map_err(io(path))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|_| ck(path, "not a safetensors file: shorter than its 8-byte header length".into()))?;
    let n = u64::from_le_bytes(len);
    let size = f.metadata().map_err(io(path))?.len();
    if n > size.saturating_sub(8) || n > 100_000_000 {
        return Err(ck(path, format!("not a safetensors file: a header of {n} bytes in a file of {size}")));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(io(path))?;
    let v: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| ck(path, format!("not a safetensors file: its header is not JSON ({e})")))?;
    Ok(v.get("__metadata__").and_then(|m| m.get(RUN_KEY)).and_then(|s| s.as_str()).map(String::from))
}

/// What [`Session::restore_partial`] left out, one line per tensor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Variables of the session absent from the file (they keep their initial values).
    pub missing: Vec<String>,
    /// Tensors whose dtype or shape differ: "name: f32[3, 4] in the file, f32[4, 4] here".
    pub mismatched: Vec<String>,
    /// Tensors of the file the session does not have (not loaded, not carried on).
    pub unknown: Vec<String>,
    /// Tensors of the file that match a variable of the session but were
    /// not restored: the learning rates (always the program's, as
    /// [`Session::restore`]) and what the selection left out (by default
    /// the training state: `global_step`, optimizer steps and slots, which
    /// start fresh).
    pub left_out: Vec<String>,
}

impl Skipped {
    /// Whether every tensor of the file was restored and every variable found.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.mismatched.is_empty() && self.unknown.is_empty() && self.left_out.is_empty()
    }
}

/// The decoded tensors of a checkpoint, checked finite.
fn decode(path: &Path, st: &SafeTensors<'_>) -> Result<Vec<(String, Vec<usize>, HostVec)>, RuntimeError> {
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let mut values = Vec::with_capacity(names.len());
    for name in names {
        let t = st.tensor(&name).map_err(|e| ck(path, format!("variable '{name}': {e}")))?;
        let bytes = t.data();
        let n = t.shape().iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n.and_then(|n| n.checked_mul(4)) != Some(bytes.len()) {
            return Err(ck(path, format!("variable '{name}' has a truncated payload")));
        }
        let words = bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
        let v = match t.dtype() {
            Dtype::F32 => HostVec::F32(words.map(f32::from_le_bytes).collect()),
            Dtype::I32 => HostVec::I32(words.map(i32::from_le_bytes).collect()),
            other => return Err(ck(path, format!("variable '{name}' has unsupported dtype {other:?}"))),
        };
        if let HostVec::F32(x) = &v {
            if let Some(i) = x.iter().position(|x| !x.is_finite()) {
                return Err(RuntimeError::CheckpointNonFinite {
                    path: path.display().to_string(),
                    name,
                    index: i,
                    value: x[i],
                });
            }
        }
        values.push((name, t.shape().to_vec(), v));
    }
    Ok(values)
}

fn describe(dtype: Dtype, shape: &[usize]) -> String {
    format!("{dtype:?}{shape:?}").to_lowercase()
}

impl Session {
    /// Write every variable to `path`, atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), RuntimeError> {
        self.save_with_run(path, None)
    }

    /// Write every variable to `path`, atomically, with `run` (a one-line
    /// description of the run) as the header's [`RUN_KEY`] metadata. Refused,
    /// with nothing written, when a variable holds NaN or Inf or when `path`
    /// is not a regular file.
    pub fn save_with_run(&self, path: impl AsRef<Path>, run: Option<&str>) -> Result<(), RuntimeError> {
        self.save_with_extra(path, run, &[])
    }

    /// As [`Session::save_with_run`], with `extra` f32 tensors (name,
    /// shape, values) written beside the session's variables: the optimizer
    /// slots other ranks own under `--variables ps` across processes,
    /// gathered to the rank that writes, so the file is the one a single
    /// process writes. A name the session also holds is an error.
    pub fn save_with_extra(
        &self,
        path: impl AsRef<Path>,
        run: Option<&str>,
        extra: &[(String, Vec<usize>, Vec<f32>)],
    ) -> Result<(), RuntimeError> {
        let path = path.as_ref();
        refuse_non_regular(path)?;
        refuse_missing_folder(path)?;
        let mut tensors = Vec::new();
        for (name, shape, v) in extra {
            if self.variable_type(name).is_ok() {
                return Err(ck(
                    path,
                    format!("tensor '{name}' is both a variable of this session and an extra tensor"),
                ));
            }
            if shape.iter().product::<usize>() != v.len() {
                return Err(ck(path, format!("tensor '{name}' has {} values for shape {shape:?}", v.len())));
            }
            if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                return Err(RuntimeError::NonFiniteVariable {
                    path: path.display().to_string(),
                    name: name.clone(),
                    index: i,
                    value: v[i],
                });
            }
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            tensors.push((name.clone(), DType::F32, shape.clone(), bytes));
        }
        for name in self.variable_names() {
            let (dtype, shape) = self.variable_type(&name)?;
            let shape = shape.to_vec();
            let bytes: Vec<u8> = match self.read_host(&name)? {
                HostVec::F32(v) => {
                    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                        return Err(RuntimeError::NonFiniteVariable {
                            path: path.display().to_string(),
                            name,
                            index: i,
                            value: v[i],
                        });
                    }
                    v.iter().flat_map(|x| x.to_le_bytes()).collect()
                }
                HostVec::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            };
            tensors.push((name, dtype, shape, bytes));
        }
        let mut views = Vec::with_capacity(tensors.len());
        for (name, dtype, shape, bytes) in &tensors {
            let view = TensorView::new(st_dtype(*dtype), shape.clone(), bytes).map_err(|e| ck(path, e.to_string()))?;
            views.push((name.clone(), view));
        }
        let meta = run.map(|r| HashMap::from([(RUN_KEY.to_string(), r.to_string())]));
        let data = safetensors::tensor::serialize(views, meta).map_err(|e| ck(path, e.to_string()))?;
        write_atomic(path, &data).map_err(io(path))
    }

    /// Read every variable from `path` as TF1's `Saver.restore` did (see
    /// the module docs): each variable the session knows must be in the
    /// checkpoint with the same dtype and shape; the file's other tensors
    /// are kept until a plan declares them (so restoring before loading
    /// works, and an evaluation session takes a training checkpoint); the
    /// learning rate stays the program's (write another with
    /// [`Session::set_variable`]); a restored `global_step` becomes every
    /// loaded program's step. Nothing is written unless everything checks.
    pub fn restore(&mut self, path: impl AsRef<Path>) -> Result<(), RuntimeError> {
        self.restore_with(path.as_ref(), is_learning_rate, false)
    }

    /// The strict restore of an exact resume (the CLI's `--resume`): as
    /// [`Session::restore`], but the file may hold no tensor the session
    /// lacks ([`RuntimeError::CheckpointUnknown`]: a checkpoint of another
    /// model or optimizer), the learning rate is restored too, and the
    /// file's tensors `ignore` accepts are left out (not loaded, not
    /// counted as unknown): a rank of a `--variables ps` run restores a
    /// whole checkpoint and skips the optimizer slots other ranks own.
    pub fn restore_ignoring(
        &mut self,
        path: impl AsRef<Path>,
        ignore: impl Fn(&str) -> bool,
    ) -> Result<(), RuntimeError> {
        self.restore_with(path.as_ref(), ignore, true)
    }

    fn restore_with(&mut self, path: &Path, ignore: impl Fn(&str) -> bool, strict: bool) -> Result<(), RuntimeError> {
        let data = read_regular(path)?;
        let st = parse(path, &data)?;
        for name in self.variable_names().into_iter().filter(|n| !ignore(n)) {
            let (dtype, shape) = self.variable_type(&name)?;
            let t = st.tensor(&name).map_err(|_| RuntimeError::CheckpointMissing {
                path: path.display().to_string(),
                name: name.clone(),
            })?;
            if t.dtype() != st_dtype(dtype) || t.shape() != shape {
                return Err(RuntimeError::CheckpointMismatch {
                    path: path.display().to_string(),
                    name: name.clone(),
                    in_file: describe(t.dtype(), t.shape()),
                    in_session: format!("{dtype}{shape:?}"),
                });
            }
        }
        let known = self.variable_names();
        if strict && !known.is_empty() {
            let mut unknown: Vec<String> = st
                .names()
                .into_iter()
                .filter(|n| !ignore(n) && known.binary_search_by(|k| k.as_str().cmp(n)).is_err())
                .map(String::from)
                .collect();
            if !unknown.is_empty() {
                unknown.sort();
                return Err(RuntimeError::CheckpointUnknown { path: path.display().to_string(), names: unknown });
            }
        }
        let mut step = None;
        for (name, shape, v) in decode(path, &st)? {
            if ignore(&name) {
                continue;
            }
            if let (GLOBAL_STEP, HostVec::I32(v)) = (name.as_str(), &v) {
                step = v.first().map(|s| (*s).max(0) as u64);
            }
            self.write_host(&name, &shape, v)?;
        }
        if let Some(step) = step {
            for program in self.program_names() {
                self.set_step(&program, step)?;
            }
        }
        Ok(())
    }

    /// Fine tuning (TF1's `Saver(var_list=model variables).restore`, slim's
    /// `assign_from_checkpoint_fn`): read the model's variables of `path`
    /// that match the session's by name, dtype and shape, and say what was
    /// skipped. The training state ([`Session::training_state`]) is not
    /// taken from the file: the learning rates stay the programs', and
    /// `global_step`, the optimizers' steps and slots keep their values, so
    /// the run starts at step 0 with fresh moments ([`Skipped::left_out`]
    /// lists them). Missing variables keep their values, unknown tensors
    /// are dropped; every tensor must still be finite and well formed.
    /// [`Session::restore_partial_with`] chooses the tensors.
    pub fn restore_partial(&mut self, path: impl AsRef<Path>) -> Result<Skipped, RuntimeError> {
        let state = self.training_state();
        self.restore_partial_with(path, |n| !state.contains(n))
    }

    /// [`Session::restore_partial`] of the file's tensors `select` accepts
    /// (TF1's `Saver(var_list=..)`, `init_from_checkpoint`): e.g.
    /// `|n| n.starts_with("body/")` restores a pretrained body under a new
    /// head. A slot or step `select` accepts is restored (continuing an
    /// optimizer); a restored `global_step` becomes every program's step;
    /// the learning rates are never taken from the file. The tensors
    /// refused are listed in [`Skipped::left_out`] when the session has
    /// them, in [`Skipped::unknown`] otherwise; [`Skipped::missing`] lists
    /// only the session's selected variables absent from the file.
    pub fn restore_partial_with(
        &mut self,
        path: impl AsRef<Path>,
        select: impl Fn(&str) -> bool,
    ) -> Result<Skipped, RuntimeError> {
        let path = path.as_ref();
        let data = read_regular(path)?;
        let st = parse(path, &data)?;
        let mut skipped = Skipped::default();
        let mut load = Vec::new();
        for (name, shape, v) in decode(path, &st)? {
            match self.variable_type(&name) {
                Err(_) => skipped.unknown.push(name),
                Ok(_) if is_learning_rate(&name) || !select(&name) => skipped.left_out.push(name),
                Ok((dtype, want)) => {
                    let file_dtype = match v {
                        HostVec::F32(_) => Dtype::F32,
                        HostVec::I32(_) => Dtype::I32,
                    };
                    if file_dtype != st_dtype(dtype) || want != shape.as_slice() {
                        let here = format!("{dtype}{want:?}");
                        skipped
                            .mismatched
                            .push(format!("{name}: {} in the file, {here} here", describe(file_dtype, &shape)));
                    } else {
                        load.push((name, shape, v));
                    }
                }
            }
        }
        for name in self.variable_names() {
            if select(&name) && !is_learning_rate(&name) && st.tensor(&name).is_err() {
                skipped.missing.push(name);
            }
        }
        let mut step = None;
        for (name, shape, v) in load {
            if let (GLOBAL_STEP, HostVec::I32(v)) = (name.as_str(), &v) {
                step = v.first().map(|s| (*s).max(0) as u64);
            }
            self.write_host(&name, &shape, v)?;
        }
        if let Some(step) = step {
            for program in self.program_names() {
                self.set_step(&program, step)?;
            }
        }
        Ok(skipped)
    }
}

/// The bytes of the regular file `path`.
fn read_regular(path: &Path) -> Result<Vec<u8>, RuntimeError> {
    refuse_non_regular(path)?;
    fs::read(path).map_err(io(path))
}

fn parse<'a>(path: &Path, data: &'a [u8]) -> Result<SafeTensors<'a>, RuntimeError> {
    SafeTensors::deserialize(data).map_err(|e| ck(path, format!("not a safetensors file: {e}")))
}
