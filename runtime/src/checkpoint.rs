//! Checkpoints: every variable (optimizer slots and `global_step`
//! included) by its scoped name, in the safetensors format (little-endian
//! f32 or i32; bools as i32).
//!
//! Backend-neutral: values go through the session's variable reads and
//! writes (copies to and from host memory), so a checkpoint written from one
//! backend restores on another.
//!
//! Saving is atomic: the bytes go to a temporary file in the target's
//! directory, which is fsynced, renamed over the target, and the directory
//! fsynced. A crash at any point leaves either the old or the new
//! checkpoint, never a torn one; a stray temporary file from a crash is
//! simply overwritten by the next save.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use towers_graph::DType;

use crate::error::RuntimeError;
use crate::session::Session;
use crate::variables::HostVec;

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::I32 | DType::Bool => Dtype::I32,
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> RuntimeError + '_ {
    move |source| RuntimeError::Io { path: path.display().to_string(), source }
}

/// The temporary file a save of `path` writes first.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "checkpoint".into());
    path.with_file_name(format!(".{name}.tmp"))
}

impl Session {
    /// Write every variable to `path`, atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), RuntimeError> {
        let path = path.as_ref();
        let ck = |detail: String| RuntimeError::Checkpoint { path: path.display().to_string(), detail };
        let mut tensors = Vec::new();
        for name in self.variable_names() {
            let (dtype, shape) = self.variable_type(&name)?;
            let shape = shape.to_vec();
            let bytes: Vec<u8> = match self.read_host(&name)? {
                HostVec::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                HostVec::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            };
            tensors.push((name, dtype, shape, bytes));
        }
        let mut views = Vec::with_capacity(tensors.len());
        for (name, dtype, shape, bytes) in &tensors {
            let view = TensorView::new(st_dtype(*dtype), shape.clone(), bytes).map_err(|e| ck(e.to_string()))?;
            views.push((name.clone(), view));
        }
        let data = safetensors::tensor::serialize(views, None).map_err(|e| ck(e.to_string()))?;
        let tmp = temp_path(path);
        {
            let mut f = File::create(&tmp).map_err(io(&tmp))?;
            f.write_all(&data).map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
        }
        fs::rename(&tmp, path).map_err(io(path))?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
        Ok(())
    }

    /// Read every variable from `path`. Each variable the session knows must
    /// be in the checkpoint with the same dtype and shape; variables only in
    /// the checkpoint are kept until a plan declares them (so restoring
    /// before loading works). Nothing is written unless everything checks.
    pub fn restore(&mut self, path: impl AsRef<Path>) -> Result<(), RuntimeError> {
        let path = path.as_ref();
        let p = path.display().to_string();
        let data = fs::read(path).map_err(io(path))?;
        let st = SafeTensors::deserialize(&data).map_err(|e| RuntimeError::Checkpoint {
            path: p.clone(),
            detail: format!("not a safetensors file: {e}"),
        })?;
        // Check everything before writing anything.
        for name in self.variable_names() {
            let (dtype, shape) = self.variable_type(&name)?;
            let t = st
                .tensor(&name)
                .map_err(|_| RuntimeError::CheckpointMissing { path: p.clone(), name: name.clone() })?;
            if t.dtype() != st_dtype(dtype) || t.shape() != shape {
                return Err(RuntimeError::CheckpointMismatch {
                    path: p.clone(),
                    name: name.clone(),
                    in_file: format!("{:?}{:?}", t.dtype(), t.shape()).to_lowercase(),
                    in_session: format!("{dtype}{shape:?}"),
                });
            }
        }
        let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
        names.sort();
        let mut values = Vec::with_capacity(names.len());
        for name in names {
            let Ok(t) = st.tensor(&name) else { continue };
            let bytes = t.data();
            let n: usize = t.shape().iter().product();
            if bytes.len() != n * 4 {
                return Err(RuntimeError::Checkpoint {
                    path: p.clone(),
                    detail: format!("variable '{name}' has a truncated payload"),
                });
            }
            let words = bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
            let v = match t.dtype() {
                Dtype::F32 => HostVec::F32(words.map(f32::from_le_bytes).collect()),
                Dtype::I32 => HostVec::I32(words.map(i32::from_le_bytes).collect()),
                other => {
                    return Err(RuntimeError::Checkpoint {
                        path: p.clone(),
                        detail: format!("variable '{name}' has unsupported dtype {other:?}"),
                    })
                }
            };
            values.push((name, t.shape().to_vec(), v));
        }
        for (name, shape, v) in values {
            self.write_host(&name, &shape, v)?;
        }
        Ok(())
    }
}
