//! Which physical device serves each logical device of a plan, and whether
//! this machine can serve them at all.
//!
//! The GPU rule, one place for the CUDA backend, the mixed session and the
//! placement report: `gpu:i` runs on physical GPU `i` where the machine has
//! it, otherwise on GPU `i mod n` (n GPUs); every logical GPU gets a CUDA
//! context of its own, so two logical GPUs sharing one physical GPU still
//! copy between each other explicitly (peer copies between contexts) and
//! never read each other's buffers. Contexts on one physical GPU are
//! numbered in the order of their logical indices ([`gpu_contexts`]).
//!
//! The device map ([`device_map`]) says, per plan device, where it runs:
//! a host thread (the CPU backend, and the host devices of a mixed
//! session, whose arena is pinned when CUDA takes part), a CUDA context of
//! its own (a mixed session's `gpu:*`), or the one context of the CUDA
//! backend. It is a pure function of data: the plan's devices with their
//! bytes ([`PlanDevice`]), the threads that run them, the backend
//! ([`BackendKind`]) and the machine ([`Machine`]); [`Machine::probe`] is
//! the only function here that looks at the real machine. The same inputs
//! give the same text, byte for byte.
//!
//! Invariants of [`check`] (what [`crate::Session::load`] refuses, before
//! anything is allocated): a process has one host device, `cpu:0`, on
//! every backend; a `gpu:*` device needs a CUDA GPU on the backends that
//! run it on CUDA ([`BackendKind::Cuda`], [`BackendKind::Mixed`]), and
//! none on the CPU backend (which runs it as a host thread). Any number of
//! logical GPUs fits on one physical GPU (contexts share it).

use std::fmt;

use thiserror::Error;
use towers_codegen::Plan;
use towers_vocab::{Device, DeviceKind};

/// The CUDA context serving one logical GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuContext {
    /// `i` of `gpu:i`.
    pub logical: u32,
    /// The physical GPU (CUDA ordinal).
    pub physical: usize,
    /// Its context among those on `physical`, 0-based.
    pub context: usize,
    /// How many contexts `physical` holds.
    pub of: usize,
}

/// The contexts for logical GPUs `logical` (any order, no repeats) on a
/// machine with `physical` GPUs (at least one), in the order given.
pub fn gpu_contexts(logical: &[u32], physical: usize) -> Vec<GpuContext> {
    let n = physical.max(1);
    let on = |p: usize| logical.iter().filter(move |&&l| l as usize % n == p);
    logical
        .iter()
        .map(|&l| {
            let p = l as usize % n;
            GpuContext { logical: l, physical: p, context: on(p).filter(|&&o| o < l).count(), of: on(p).count() }
        })
        .collect()
}

/// Whether this machine has CUDA, as far as the device map cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cuda {
    /// A usable driver with this many GPUs (0: a driver without a device).
    Gpus(usize),
    /// No usable CUDA, and why ("no CUDA driver found").
    Absent(String),
}

/// What the machine offers the plan's devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    pub cuda: Cuda,
    /// Cores the CPU backend plans its threads for.
    pub cores: usize,
}

impl Machine {
    /// This machine: the CUDA driver's device count (or why there is none)
    /// and the cores available to this process.
    pub fn probe() -> Machine {
        let cuda = match crate::cuda::probe() {
            crate::cuda::CudaStatus::Found { devices } => Cuda::Gpus(devices),
            other => Cuda::Absent(other.to_string()),
        };
        Machine { cuda, cores: std::thread::available_parallelism().map_or(1, |n| n.get()) }
    }

    /// The GPUs a CUDA backend could use (0 without CUDA).
    pub fn gpus(&self) -> usize {
        match self.cuda {
            Cuda::Gpus(n) => n,
            Cuda::Absent(_) => 0,
        }
    }

    /// Why this machine cannot run a GPU device on CUDA, if it cannot.
    fn no_gpu(&self) -> Option<String> {
        match &self.cuda {
            Cuda::Gpus(0) => Some("its CUDA driver reports no GPU".into()),
            Cuda::Gpus(_) => None,
            Cuda::Absent(why) => Some(why.clone()),
        }
    }
}

/// Which backend serves the plan's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// The CPU backend: every device is a host thread.
    Cpu,
    /// The CUDA backend of one context: every device, `cpu:0` included,
    /// runs as streams of one context on GPU 0.
    Cuda,
    /// A mixed session: `cpu:*` on the host (its arena `pinned`,
    /// page-locked, when CUDA takes part), each `gpu:*` on a CUDA context of
    /// its own ([`gpu_contexts`]).
    Mixed { pinned: bool },
    /// A mixed session whose `gpu:*` devices share one CUDA context on GPU
    /// 0 as streams (`--cuda-contexts one`); `cpu:*` on the pinned host.
    MixedOneContext,
}

impl BackendKind {
    /// The kind of a [`crate::Backend`] by its name ("cpu", "cuda", "mixed").
    pub fn of_name(name: &str) -> BackendKind {
        match name {
            "cuda" => BackendKind::Cuda,
            "mixed" => BackendKind::Mixed { pinned: true },
            "cpu+cuda" => BackendKind::Mixed { pinned: true },
            "cpu+cuda (one context)" => BackendKind::MixedOneContext,
            _ => BackendKind::Cpu,
        }
    }
}

/// A plan device with the bytes it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanDevice {
    pub device: Device,
    /// Its arena (activations, gradients, copies), as planned.
    pub arena_bytes: usize,
    /// The variables placed on it.
    pub variable_bytes: usize,
}

/// Every device of `plan` (arenas, streams, variables), sorted, with its bytes.
pub fn plan_devices(plan: &Plan) -> Vec<PlanDevice> {
    let mut all: Vec<Device> = plan.devices.iter().map(|d| d.device).collect();
    all.extend(plan.streams.iter().map(|s| s.device));
    all.extend(plan.variables.iter().map(|v| v.device));
    all.sort();
    all.dedup();
    all.into_iter()
        .map(|device| PlanDevice {
            device,
            arena_bytes: plan.devices.iter().filter(|d| d.device == device).map(|d| d.arena_bytes).sum(),
            variable_bytes: plan
                .variables
                .iter()
                .filter(|v| v.device == device)
                .map(|v| v.shape.iter().product::<usize>() * v.dtype.size_bytes())
                .sum(),
        })
        .collect()
}

/// The host threads that run `plan`'s devices on `backend` (each thread's
/// devices, in thread order): the CPU backend's [`crate::cpu::thread_plans`]
/// (the host may join the last device's thread); on a mixed session one
/// thread per host device; none on the CUDA backend.
pub fn host_threads(plan: &Plan, backend: BackendKind, cores: usize) -> Result<Vec<Vec<Device>>, String> {
    Ok(match backend {
        BackendKind::Cpu => crate::cpu::thread_plans(plan, cores)?.into_iter().map(|t| t.devices).collect(),
        BackendKind::Mixed { .. } | BackendKind::MixedOneContext => plan_devices(plan)
            .into_iter()
            .filter(|d| d.device.kind == DeviceKind::Cpu)
            .map(|d| vec![d.device])
            .collect(),
        BackendKind::Cuda => Vec::new(),
    })
}

/// A plan device this machine cannot serve; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Unservable {
    /// A host device other than `cpu:0` (TF1: "Could not satisfy explicit
    /// device specification").
    #[error("device {device} was asked for, but {}: {}", self.has(), self.how())]
    SecondHost { device: Device },
    /// A GPU device on a CUDA backend, on a machine without a CUDA GPU.
    #[error("device {device} was asked for, but {}: {}", self.has(), self.how())]
    NoCuda { device: Device, why: String },
}

impl Unservable {
    /// The device refused.
    pub fn device(&self) -> Device {
        match self {
            Unservable::SecondHost { device } | Unservable::NoCuda { device, .. } => *device,
        }
    }
    /// What the machine has.
    pub fn has(&self) -> String {
        match self {
            Unservable::SecondHost { .. } => "a process has one host device, cpu:0".into(),
            Unservable::NoCuda { why, .. } => format!("this machine has no CUDA GPU ({why}), only the host"),
        }
    }
    /// How to map it.
    pub fn how(&self) -> String {
        match self {
            Unservable::SecondHost { device } => format!(
                "place what is on /cpu:{} on /cpu:0, or on a tower device /gpu:N (the CPU backend runs /gpu:N as CPU devices of their own)",
                device.index
            ),
            Unservable::NoCuda { .. } => "run with --backend cpu, which runs every /gpu:N as a host thread of its own, or run where a CUDA driver and a GPU exist".into(),
        }
    }
}

/// Refuse the first device of `devices` that `backend` cannot serve on
/// `machine` (see the module docs).
pub fn check(devices: &[Device], backend: BackendKind, machine: &Machine) -> Result<(), Unservable> {
    for &d in devices {
        match d.kind {
            DeviceKind::Cpu if d.index != 0 => return Err(Unservable::SecondHost { device: d }),
            DeviceKind::Gpu if backend != BackendKind::Cpu => {
                if let Some(why) = machine.no_gpu() {
                    return Err(Unservable::NoCuda { device: d, why });
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Where one device runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runs {
    /// On host thread `thread` (0-based) of `threads`, with `shares`, the
    /// other devices whose streams that thread runs. `why`: for a GPU
    /// device on the CPU backend, why no GPU serves it.
    Host { thread: usize, threads: usize, shares: Vec<Device>, pinned: bool, why: Option<String> },
    /// On a CUDA context of its own; `gpus`: the machine's GPUs, `logical`:
    /// the plan's GPU devices.
    Context { context: GpuContext, gpus: usize, logical: usize },
    /// On the CUDA backend's one context on GPU 0, with `devices` devices
    /// in all.
    OneContext { devices: usize },
}

/// One line of the device map: a plan device and where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLine {
    pub device: PlanDevice,
    pub runs: Runs,
}

/// Where each device of a plan runs; `Display` writes one line per device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMap {
    pub lines: Vec<DeviceLine>,
}

/// `bytes` for people: B, kB, MB, GB (powers of 1000), one decimal.
pub fn human_bytes(bytes: usize) -> String {
    let b = bytes as f64;
    match bytes {
        0..1_000 => format!("{bytes} B"),
        1_000..1_000_000 => format!("{:.1} kB", b / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} MB", b / 1e6),
        _ => format!("{:.1} GB", b / 1e9),
    }
}

/// Where each of `devices` runs on `backend` on `machine`; `threads` are
/// the host threads' devices ([`host_threads`]). A device the machine
/// cannot serve is [`Unservable`] ([`check`]).
pub fn device_map(
    devices: &[PlanDevice],
    threads: &[Vec<Device>],
    backend: BackendKind,
    machine: &Machine,
) -> Result<DeviceMap, Unservable> {
    check(&devices.iter().map(|d| d.device).collect::<Vec<_>>(), backend, machine)?;
    let gpus: Vec<u32> = devices.iter().filter(|d| d.device.kind == DeviceKind::Gpu).map(|d| d.device.index).collect();
    let contexts = gpu_contexts(&gpus, machine.gpus());
    let host = |d: Device, pinned: bool, why: Option<String>| -> Runs {
        let thread = threads.iter().position(|t| t.contains(&d));
        Runs::Host {
            thread: thread.unwrap_or(0),
            threads: threads.len().max(1),
            shares: thread.map(|t| threads[t].iter().copied().filter(|&o| o != d).collect()).unwrap_or_default(),
            pinned,
            why,
        }
    };
    let lines = devices
        .iter()
        .map(|&pd| {
            let d = pd.device;
            let runs = match (backend, d.kind) {
                (BackendKind::Cpu, DeviceKind::Cpu) => host(d, false, None),
                (BackendKind::Cpu, DeviceKind::Gpu) => {
                    let why = match &machine.cuda {
                        Cuda::Absent(why) => format!("CPU backend: {why}"),
                        Cuda::Gpus(n) => format!("CPU backend chosen; the machine has {n} CUDA GPU(s)"),
                    };
                    host(d, false, Some(why))
                }
                (BackendKind::Mixed { pinned }, DeviceKind::Cpu) => host(d, pinned, None),
                (BackendKind::MixedOneContext, DeviceKind::Cpu) => host(d, true, None),
                (BackendKind::MixedOneContext, DeviceKind::Gpu) => Runs::OneContext { devices: gpus.len() },
                (BackendKind::Mixed { .. }, DeviceKind::Gpu) => Runs::Context {
                    context: contexts.iter().copied().find(|c| c.logical == d.index).unwrap_or(GpuContext {
                        logical: d.index,
                        physical: 0,
                        context: 0,
                        of: 1,
                    }),
                    gpus: machine.gpus(),
                    logical: gpus.len(),
                },
                (BackendKind::Cuda, _) => Runs::OneContext { devices: devices.len() },
            };
            DeviceLine { device: pd, runs }
        })
        .collect();
    Ok(DeviceMap { lines })
}

/// [`device_map`] of a whole plan on `backend` on `machine`.
pub fn plan_map(plan: &Plan, backend: BackendKind, machine: &Machine) -> Result<DeviceMap, PlanMapError> {
    let devices = plan_devices(plan);
    let threads = host_threads(plan, backend, machine.cores).map_err(PlanMapError::Threads)?;
    Ok(device_map(&devices, &threads, backend, machine)?)
}

/// Why a plan's device map could not be drawn.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanMapError {
    #[error(transparent)]
    Unservable(#[from] Unservable),
    /// The plan's events can never all be recorded (no thread order exists).
    #[error("{0}")]
    Threads(String),
}

fn list(devices: &[Device]) -> String {
    devices.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
}

impl fmt::Display for DeviceLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pd = &self.device;
        let mut bytes = human_bytes(pd.arena_bytes);
        if pd.variable_bytes > 0 {
            bytes += &format!(", variables {}", human_bytes(pd.variable_bytes));
        }
        write!(f, "{} -> ", pd.device)?;
        match &self.runs {
            Runs::Host { thread, threads, shares, pinned, why } => {
                let place = if pd.device.kind == DeviceKind::Cpu { "host" } else { "host thread" };
                if pd.device.kind == DeviceKind::Cpu {
                    let mem = if *pinned { "pinned" } else { "pageable" };
                    write!(f, "{place} ({mem} arena {bytes}, thread {} of {threads}", thread + 1)?;
                } else {
                    write!(f, "{place} {} of {threads} (arena {bytes}", thread + 1)?;
                }
                if !shares.is_empty() {
                    write!(f, ", shared with {}", list(shares))?;
                }
                match why {
                    Some(w) => write!(f, "; {w})"),
                    None => f.write_str(")"),
                }
            }
            Runs::Context { context: c, gpus, logical } => {
                write!(f, "GPU {} context {} of {} (arena {bytes}", c.physical, c.context + 1, c.of)?;
                if *logical > *gpus {
                    let n = if *gpus == 1 { "one GPU".to_string() } else { format!("{gpus} GPUs") };
                    write!(f, "; {n} for {logical} logical GPUs")?;
                }
                f.write_str(")")
            }
            Runs::OneContext { devices } => {
                write!(f, "GPU 0, the CUDA backend's one context (arena {bytes}")?;
                if *devices > 1 {
                    write!(f, "; streams of {devices} devices share it")?;
                }
                f.write_str(")")
            }
        }
    }
}

impl fmt::Display for DeviceMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, l) in self.lines.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{l}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "devices_tests.rs"]
mod tests;
