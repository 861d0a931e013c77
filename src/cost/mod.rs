//! The cost model: which placement is fastest on this machine, predicted.
//!
//! Seed 001 models a step as compute and communication overlapped; towers
//! refines that with the plan itself. A compiled [`Plan`] is simulated
//! ([`critical::simulate`]): every launch, copy, in-process reduction and
//! all-reduce costs what a **calibration** measured for its kernel at its
//! shapes ([`calibrate::Calibration`]), the streams run as the CPU
//! backend's threads run them (one thread per device, the host joining the
//! last device's thread when the devices would take every core:
//! [`towers_runtime::cpu::thread_plans`]), and the events order them. The
//! predicted step is the critical path's length; [`explain::Prediction`]
//! adds the compute per device, the transfers per link and the path's
//! costliest items, and [`explain::choose`] picks the fastest placement
//! (`--variables auto`) with its reason.
//!
//! Invariants:
//! - calibration runs the plan on the CPU backend with its own kernels,
//!   traced ([`towers_runtime::Session::trace`]), outside any training
//!   step: a training step allocates nothing more because of this module;
//! - a calibration is cached as JSON under a directory the caller names,
//!   keyed by machine ([`machine_key`]: CPU model, SIMD path, cores) and
//!   plan hash ([`plan_hash`]); a file whose key does not match is never used;
//! - library code prints nothing: it returns data and text;
//! - output is deterministic for given costs (sorted maps, stable ties).
//!
//! What the calibration measures besides kernels: the CPU backend's own
//! latencies ([`explain::Latencies`]: an event's handoff between threads, a
//! step's start and join, the idle gap before each launch), from the same
//! traces. On a loaded machine these carry the operating system's
//! scheduling delays (milliseconds at a load of 13 on 2 cores), which is
//! why a calibration belongs to the moment and the machine it was taken on.
//!
//! Measured (`cargo bench --bench cost`, 2-vCPU AMD EPYC, AVX-512 path, at
//! a load average of 12-14 from other builds): 10 to 15 of the 24
//! predictions (MLP 784-256-256-10 and the convnet, 1/2/4 towers, four
//! placements, batch 256) within 20% of the mean measured step; the worst
//! rows are the ones whose measured time swung between calibration and
//! measurement. The bench is the check to rerun on a quiet machine.
//!
//! **On a GPU** (`--backend cuda`: a mixed session, `cpu:*` on host
//! threads, `gpu:*` on CUDA): the calibration runs in that session
//! ([`Calibration::measure_in`]; GPU steps timed by CUDA events around each
//! plan step, host steps by the host clock; traced steps launch eagerly, a
//! context per logical GPU as a run has them) and is keyed by the backend ([`machine_key_for`]), so a CPU
//! calibration never prices a GPU step. The simulation gives every GPU
//! stream a lane of its own (on CUDA each stream is its own queue, so they
//! overlap) beside the host threads that run `cpu:*` ([`lanes`]); an event
//! costs the handoff of its lanes' kinds (host↔host, GPU↔GPU, or bridged
//! host↔GPU: [`critical::Handoffs`]); a GPU launch costs its kernel plus the
//! GPU launch gap the traces showed; copies between host and device cost
//! what their signature, else their path (host->device, device->host,
//! device->device) measured. What this ignores: kernels of concurrent
//! streams share the GPU's SMs (two lanes' kernels overlap in the model
//! even when each fills the GPU), and several contexts on one GPU
//! time-slice (the calibration's kernels saw the slicing, the simulation's
//! lanes do not). A GPU run shows whether either matters:
//! `benches/cost_gpu.rs` prints beside each prediction the same costs on
//! one GPU lane (no overlap at all) and the measured step with a context
//! per GPU and with one; a measured step near the serial figure means the
//! streams did not overlap, one far from the one-context figure means the
//! contexts time-slice. Launch gaps are taken from eager traced steps, so
//! where CUDA graphs hide the host's enqueue time the prediction runs high.
//!
//! Copies between devices are elided on the CPU backend (one host memory),
//! so a copy's calibrated cost is its traced (near zero) time; the model
//! keeps them so that a backend with real links gets their measured costs
//! from the same code. Every transfer has a copy path ([`paths::CopyPath`]:
//! host->device, device->host, device->device, in-process reduction,
//! across processes); the calibration keeps an entry per path and the
//! explanation names each link's path.

pub mod calibrate;
pub mod critical;
pub mod explain;
pub mod lanes;
pub mod paths;
pub mod placements;
pub mod ps;

use thiserror::Error;
use towers_codegen::Plan;

pub use calibrate::{machine_key_for, Calibration};
pub use explain::{choose, predict, Choice, Prediction};
pub use placements::{auto, auto_on, candidate, candidate_on, Candidate, Target, PLACEMENTS};

/// Why a cost could not be predicted or calibrated.
#[derive(Debug, Error)]
pub enum CostError {
    #[error("cost model: {0}")]
    Shape(String),
    #[error("cost model: the plan's events can never all be recorded; stuck: {0}")]
    Stuck(String),
    #[error("cost model: no calibrated cost for '{0}' (calibrate this plan first)")]
    Uncalibrated(String),
    #[error("cost calibration: {0}")]
    Run(#[from] towers_runtime::RuntimeError),
    #[error("cost calibration: {0}")]
    Threads(String),
    /// The backend to calibrate on could not be opened (e.g. `--backend
    /// cuda` without CUDA); the message is the backend's own.
    #[error("{0}")]
    Session(String),
    #[error("cost model: compiling a candidate placement: {0}")]
    Compile(#[from] crate::compiler::CompileError),
    #[error("cost cache {}: {source}", path.display())]
    Cache { path: std::path::PathBuf, source: std::io::Error },
}

/// This machine, as calibrations are keyed: the CPU model string of
/// /proc/cpuinfo (or the architecture where there is none), the CPU
/// kernels' SIMD path, and the cores a plan's threads may use.
pub fn machine_key() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    format!("{model} | simd {} | {} cores", towers_kernels::simd::active(), cores())
}

/// The cores the CPU backend plans its threads for.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A stable 64-bit hash of a plan (FNV-1a over its JSON form): the same
/// plan, byte for byte, gives the same hash in every build and process.
pub fn plan_hash(plan: &Plan) -> u64 {
    fnv1a(plan.to_json().as_bytes())
}

pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The plan the cost module's tests price: the small MLP (8x8x1 input,
/// hidden 10, SGD, batch 8) at `towers` towers on `gpu:0..`, variables by
/// `variables`.
#[cfg(test)]
pub(crate) fn test_plan(towers: u32, variables: towers_passes::VarPlacement) -> Plan {
    use crate::models::{build, ModelKind, ModelSpec};
    let model = build(&ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10)).expect("model");
    let mut o = crate::compiler::CompileOptions::new(towers_graph::Optimizer::Sgd { lr: towers_graph::F32(0.1) }, 8);
    o.towers = (0..towers).map(towers_graph::Device::gpu).collect();
    o.variables = variables;
    crate::compiler::compile_train(&model.graph, &model.loss, &o).expect("compiles").plan
}
