//! Device strings and devices: re-exported from `towers_vocab::device`
//! (the plan carries devices too), so `towers_graph::device::*` and
//! `towers_graph::{Device, DeviceKind, DeviceSpec}` keep working. Parse
//! errors are [`DeviceError`]s; `?` turns them into the graph's
//! `GraphError::DeviceParse` / `GraphError::IncompleteDevice`.

pub use towers_vocab::device::{ps_task_name, Device, DeviceError, DeviceKind, DeviceSpec, PS_JOB};
