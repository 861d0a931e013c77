//! Device names: device strings, parsed and canonicalized once at the API
//! boundary, the concrete [`Device`] a plan's buffers and launches live on,
//! and the [`StreamKind`] of a device's streams.
//!
//! TF1 accepts partial specifications (`/cpu:0`, `/gpu:1`, `/device:GPU:1`,
//! `/job:worker/task:0/device:GPU:1`); every component is optional. Invariant:
//! two [`DeviceSpec`]s compare equal exactly when their canonical strings
//! (`Display`) are equal, so passes never compare raw user strings.
//!
//! Jobs: TF1's cluster names its processes by job and task. towers knows
//! two jobs: `worker` (the MPI rank that runs towers, `/job:worker/task:i`)
//! and `ps` (a parameter-server task that owns a shard of the variables,
//! `/job:ps/task:k`, see [`DeviceSpec::ps_task`]); `localhost` is the one
//! process alone. A job name is TF's `[A-Za-z][_A-Za-z0-9]*`.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A device string that does not parse, or that must name one device and
/// does not. The graph reports these as its own `GraphError::DeviceParse`
/// and `GraphError::IncompleteDevice`, with the same messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// Not a TF device string; `reason` says which part and why (TF's words).
    #[error("Malformed device specification '{spec}': {reason}")]
    Parse { spec: String, reason: String },
    /// A valid spec that lacks the type or the index of one device.
    #[error("device '{spec}' must name one device, with a type and an index (for example /gpu:0 or /cpu:0)")]
    Incomplete { spec: String },
}

/// The kind of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DeviceKind {
    /// A host CPU.
    Cpu,
    /// A CUDA GPU.
    Gpu,
}

impl DeviceKind {
    fn upper(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "CPU",
            DeviceKind::Gpu => "GPU",
        }
    }
}

/// A possibly partial device specification, as TF's `DeviceSpec`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceSpec {
    /// `/job:NAME` (`worker`, `ps`, `localhost`).
    pub job: Option<String>,
    /// `/replica:N`.
    pub replica: Option<u32>,
    /// `/task:N`.
    pub task: Option<u32>,
    /// The device type (`CPU`, `GPU`).
    pub kind: Option<DeviceKind>,
    /// The device index; `None` for `*` or unset.
    pub index: Option<u32>,
}

/// A concrete device of this process: a kind and an index (`cpu:0`, `gpu:1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Device {
    /// CPU or GPU.
    pub kind: DeviceKind,
    /// The index among this process's devices of that kind.
    pub index: u32,
}

impl Device {
    /// `cpu:0`.
    pub const CPU0: Device = Device { kind: DeviceKind::Cpu, index: 0 };
    /// `cpu:index`.
    pub fn cpu(index: u32) -> Device {
        Device { kind: DeviceKind::Cpu, index }
    }
    /// `gpu:index`.
    pub fn gpu(index: u32) -> Device {
        Device { kind: DeviceKind::Gpu, index }
    }
    /// The spec that names exactly this device.
    pub fn spec(self) -> DeviceSpec {
        DeviceSpec { kind: Some(self.kind), index: Some(self.index), ..Default::default() }
    }
    /// The device's name as one process of several sees it: TF1's
    /// `/job:worker/task:<task>/device:GPU:1` when `task` is given (the
    /// device of rank `task`), else the local short form (`gpu:1`).
    pub fn qualified(self, task: Option<usize>) -> String {
        match task {
            Some(t) => format!("/job:worker/task:{t}/device:{}:{}", self.kind.upper(), self.index),
            None => self.to_string(),
        }
    }

    /// Parse a device string that must name one concrete device (`/gpu:1`).
    pub fn parse(s: &str) -> Result<Device, DeviceError> {
        let spec = DeviceSpec::parse(s)?;
        spec.concrete().ok_or_else(|| DeviceError::Incomplete { spec: s.to_string() })
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = match self.kind {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
        };
        write!(f, "{k}:{}", self.index)
    }
}

impl DeviceSpec {
    /// Parse a TF device string. Accepts the canonical form, the legacy short
    /// forms `/cpu:0`, `/GPU:1`, `/device:gpu:*`, and the empty string.
    pub fn parse(s: &str) -> Result<DeviceSpec, DeviceError> {
        let mut spec = DeviceSpec::default();
        let trimmed = s.trim();
        if trimmed.is_empty() {
            return Ok(spec);
        }
        let bad_int =
            |lit: &str| DeviceError::Parse { spec: s.to_string(), reason: format!("invalid literal for int: {lit}") };
        let parse_index = |lit: &str| -> Result<Option<u32>, DeviceError> {
            if lit == "*" {
                Ok(None)
            } else {
                lit.parse::<u32>().map(Some).map_err(|_| bad_int(lit))
            }
        };
        let set_kind = |spec: &mut DeviceSpec, kind: DeviceKind, idx: &str| -> Result<(), DeviceError> {
            if spec.kind.is_some() {
                return Err(DeviceError::Parse {
                    spec: s.to_string(),
                    reason: format!("Cannot specify multiple device types: {s}"),
                });
            }
            spec.kind = Some(kind);
            spec.index = parse_index(idx)?;
            Ok(())
        };
        for part in trimmed.split('/').filter(|p| !p.is_empty()) {
            let fields: Vec<&str> = part.split(':').collect();
            let key = fields[0].to_ascii_lowercase();
            match (key.as_str(), fields.len()) {
                ("job", 2) => {
                    let name = fields[1];
                    let mut chars = name.chars();
                    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
                        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
                    if !valid {
                        return Err(DeviceError::Parse {
                            spec: s.to_string(),
                            reason: format!(
                                "invalid job name '{name}' in '{s}' (a job is a letter then letters, digits or '_', e.g. /job:ps/task:0 or /job:worker/task:1)"
                            ),
                        });
                    }
                    spec.job = Some(name.to_string())
                }
                ("replica", 2) => spec.replica = parse_index(fields[1])?,
                ("task", 2) => spec.task = parse_index(fields[1])?,
                ("device", 3) => match fields[1].to_ascii_lowercase().as_str() {
                    "cpu" => set_kind(&mut spec, DeviceKind::Cpu, fields[2])?,
                    "gpu" => set_kind(&mut spec, DeviceKind::Gpu, fields[2])?,
                    other => {
                        return Err(DeviceError::Parse {
                            spec: s.to_string(),
                            reason: format!("Unknown device type: '{other}' in '{s}' (expected CPU or GPU)"),
                        })
                    }
                },
                ("cpu", 2) => set_kind(&mut spec, DeviceKind::Cpu, fields[1])?,
                ("gpu", 2) => set_kind(&mut spec, DeviceKind::Gpu, fields[1])?,
                _ => {
                    return Err(DeviceError::Parse {
                        spec: s.to_string(),
                        reason: format!("Unknown attribute: '{part}' in '{s}'"),
                    })
                }
            }
        }
        Ok(spec)
    }

    /// Fields set in `inner` win; unset fields are filled from `self` (the
    /// outer scope), as TF's merging device functions do.
    pub fn merged_with(&self, inner: &DeviceSpec) -> DeviceSpec {
        let kind_changed = inner.kind.is_some() && inner.kind != self.kind;
        DeviceSpec {
            job: inner.job.clone().or_else(|| self.job.clone()),
            replica: inner.replica.or(self.replica),
            task: inner.task.or(self.task),
            kind: inner.kind.or(self.kind),
            index: if kind_changed { inner.index } else { inner.index.or(self.index) },
        }
    }

    /// The concrete local device this spec names, if kind and index are set.
    pub fn concrete(&self) -> Option<Device> {
        match (self.kind, self.index) {
            (Some(kind), Some(index)) => Some(Device { kind, index }),
            _ => None,
        }
    }

    /// Whether nothing is specified (the empty string).
    pub fn is_empty(&self) -> bool {
        *self == DeviceSpec::default()
    }

    /// The parameter-server task this spec names, `k` of `/job:ps/task:k`
    /// (none for any other job, or for `/job:ps` without a task).
    pub fn ps_task(&self) -> Option<u32> {
        if self.job.as_deref() == Some(PS_JOB) {
            self.task
        } else {
            None
        }
    }

    /// Whether the spec names the parameter-server job (`/job:ps...`).
    pub fn is_ps(&self) -> bool {
        self.job.as_deref() == Some(PS_JOB)
    }
}

/// TF1's parameter-server job name (`/job:ps/task:k`).
pub const PS_JOB: &str = "ps";

/// The canonical name of parameter-server task `k`: `/job:ps/task:k`.
pub fn ps_task_name(k: u32) -> String {
    format!("/job:{PS_JOB}/task:{k}")
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(j) = &self.job {
            write!(f, "/job:{j}")?;
        }
        if let Some(r) = self.replica {
            write!(f, "/replica:{r}")?;
        }
        if let Some(t) = self.task {
            write!(f, "/task:{t}")?;
        }
        if let Some(k) = self.kind {
            match self.index {
                Some(i) => write!(f, "/device:{}:{i}", k.upper())?,
                None => write!(f, "/device:{}:*", k.upper())?,
            }
        }
        Ok(())
    }
}

/// The kind of a stream (TF's stream group: compute, copies, collectives).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum StreamKind {
    /// Kernels.
    Compute,
    /// Host/device and device/device copies.
    Copy,
    /// All-reduces and other collectives.
    Collective,
}

impl StreamKind {
    /// The lower-case name used in plan text (`compute`).
    pub fn name(self) -> &'static str {
        match self {
            StreamKind::Compute => "compute",
            StreamKind::Copy => "copy",
            StreamKind::Collective => "collective",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_canonicalizes_tf_forms() {
        let cases = [
            ("/cpu:0", "/device:CPU:0"),
            ("/gpu:1", "/device:GPU:1"),
            ("/GPU:1", "/device:GPU:1"),
            ("/device:gpu:*", "/device:GPU:*"),
            ("/job:worker/task:0/device:GPU:1", "/job:worker/task:0/device:GPU:1"),
            ("/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:0"),
            ("", ""),
        ];
        for (input, canon) in cases {
            assert_eq!(DeviceSpec::parse(input).unwrap().to_string(), canon, "{input}");
        }
        assert_eq!(DeviceSpec::parse("/gpu:1").unwrap(), DeviceSpec::parse("/device:GPU:1").unwrap());
    }

    #[test]
    fn rejects_bad_strings_with_tf_messages() {
        let e = DeviceSpec::parse("/tpu:0").unwrap_err().to_string();
        assert!(e.contains("Unknown attribute: 'tpu:0' in '/tpu:0'"), "{e}");
        let e = DeviceSpec::parse("/cpu:0/gpu:1").unwrap_err().to_string();
        assert!(e.contains("Cannot specify multiple device types"), "{e}");
        let e = DeviceSpec::parse("/gpu:x").unwrap_err().to_string();
        assert!(e.contains("invalid literal for int: x"), "{e}");
    }

    #[test]
    fn parses_ps_and_worker_tasks() {
        let ps = DeviceSpec::parse("/job:ps/task:3").unwrap();
        assert_eq!(ps.to_string(), "/job:ps/task:3");
        assert_eq!(ps.ps_task(), Some(3));
        assert!(ps.is_ps());
        assert_eq!(ps_task_name(3), ps.to_string());
        let ps_cpu = DeviceSpec::parse("/job:ps/task:0/cpu:0").unwrap();
        assert_eq!(ps_cpu.to_string(), "/job:ps/task:0/device:CPU:0");
        assert_eq!(ps_cpu.ps_task(), Some(0));
        let w = DeviceSpec::parse("/job:worker/task:1/device:GPU:0").unwrap();
        assert_eq!((w.job.as_deref(), w.task, w.ps_task()), (Some("worker"), Some(1), None));
        assert!(!w.is_ps());
        // A ps job without a task: the strategy picks it.
        let any = DeviceSpec::parse("/job:ps").unwrap();
        assert!(any.is_ps() && any.ps_task().is_none());
        assert_eq!(DeviceSpec::parse("/job:ps/task:*").unwrap().ps_task(), None);
    }

    #[test]
    fn rejects_malformed_ps_and_worker_tasks() {
        let e = DeviceSpec::parse("/job:ps/task:x").unwrap_err().to_string();
        assert!(e.contains("invalid literal for int: x"), "{e}");
        let e = DeviceSpec::parse("/job:worker/task:-1").unwrap_err().to_string();
        assert!(e.contains("invalid literal for int: -1"), "{e}");
        let e = DeviceSpec::parse("/job:ps/task:").unwrap_err().to_string();
        assert!(e.contains("invalid literal for int: "), "{e}");
        let e = DeviceSpec::parse("/job:ps/task:1:2").unwrap_err().to_string();
        assert!(e.contains("Unknown attribute: 'task:1:2' in '/job:ps/task:1:2'"), "{e}");
        let e = DeviceSpec::parse("/job:/task:0").unwrap_err().to_string();
        assert!(e.starts_with("Malformed device specification '/job:/task:0'"), "{e}");
        let e = DeviceSpec::parse("/job:1ps/task:0").unwrap_err().to_string();
        assert!(e.contains("invalid job name '1ps'"), "{e}");
        let e = DeviceSpec::parse("/job:ps/tsk:0").unwrap_err().to_string();
        assert!(e.contains("Unknown attribute: 'tsk:0' in '/job:ps/tsk:0'"), "{e}");
    }

    #[test]
    fn device_needs_type_and_index() {
        assert_eq!(Device::parse("/gpu:1").unwrap(), Device::gpu(1));
        let e = Device::parse("/gpu:*").unwrap_err();
        assert!(matches!(e, DeviceError::Incomplete { .. }), "{e:?}");
        assert_eq!(Device::gpu(1).qualified(Some(2)), "/job:worker/task:2/device:GPU:1");
        assert_eq!(Device::CPU0.to_string(), "cpu:0");
        assert_eq!(StreamKind::Collective.name(), "collective");
    }

    #[test]
    fn inner_fields_override_outer() {
        let outer = DeviceSpec::parse("/job:foo").unwrap();
        let inner = DeviceSpec::parse("/device:gpu:1").unwrap();
        assert_eq!(outer.merged_with(&inner).to_string(), "/job:foo/device:GPU:1");
        let outer = DeviceSpec::parse("/gpu:0").unwrap();
        let inner = DeviceSpec::parse("/cpu:0").unwrap();
        assert_eq!(outer.merged_with(&inner).to_string(), "/device:CPU:0");
    }
}
