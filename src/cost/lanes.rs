//! Who runs each stream of a plan, as the cost model simulates it: the
//! lanes of a backend ([`super::critical::Lanes`]).
//!
//! - `cpu` (the CPU backend): its threads, [`super::explain::cpu_threads`]
//!   (one per device, the host joining the last device's thread when the
//!   devices would take every core); every lane a host thread;
//! - a mixed session (`cpu+cuda`, `cpu+cuda (one context)`, and the
//!   CPU-only test pair `cpu+cpu`): each `cpu:*` device a host thread of its
//!   own (as the host part runs them, [`towers_runtime::devices::host_threads`]),
//!   lanes 0.. in device order, then every stream of a `gpu:*` device a GPU
//!   lane of its own, in stream order: on CUDA each plan stream is its own
//!   queue, so streams overlap; the pair's second part is modelled as if it
//!   were a GPU;
//! - `cuda` alone (every device, `cpu:0` included, on one context): every
//!   stream a GPU lane.
//!
//! Invariants: lanes depend only on the plan, the backend's name and the
//! cores; every stream has a lane; lane 0 is the caller's thread where the
//! backend has host threads.

use towers_codegen::Plan;
use towers_graph::DeviceKind;
use towers_runtime::devices::{host_threads, BackendKind};

use super::critical::Lanes;
use super::explain::cpu_threads;
use super::CostError;

/// The lanes of `plan` on the backend named `backend` with `cores` cores.
pub fn lanes(plan: &Plan, backend: &str, cores: usize) -> Result<Lanes, CostError> {
    match backend {
        "cpu" => {
            let thread_of = cpu_threads(plan, cores)?;
            let n = thread_of.iter().copied().max().map_or(0, |m| m + 1);
            Ok(Lanes { thread_of, gpu: vec![false; n] })
        }
        "cuda" => Ok(Lanes { thread_of: (0..plan.streams.len()).collect(), gpu: vec![true; plan.streams.len()] }),
        _ => {
            let hosts = host_threads(plan, BackendKind::Mixed { pinned: true }, cores).map_err(CostError::Threads)?;
            let mut gpu = vec![false; hosts.len()];
            let thread_of = plan
                .streams
                .iter()
                .map(|s| match s.device.kind {
                    DeviceKind::Gpu => {
                        gpu.push(true);
                        Ok(gpu.len() - 1)
                    }
                    DeviceKind::Cpu => hosts
                        .iter()
                        .position(|t| t.contains(&s.device))
                        .ok_or_else(|| CostError::Threads(format!("no host thread runs {}", plan.stream_name(s)))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Lanes { thread_of, gpu })
        }
    }
}

/// `lanes` with every GPU lane merged into one (the first GPU lane's
/// index): the step as if the GPU ran its streams' work one item at a time.
/// Beside [`lanes`]' prediction and the measured step it shows whether
/// concurrent streams really overlapped (kernels sharing SMs do not).
pub fn one_gpu_lane(lanes: &Lanes) -> Lanes {
    let Some(first) = lanes.gpu.iter().position(|g| *g) else { return lanes.clone() };
    let thread_of = lanes.thread_of.iter().map(|&l| if lanes.gpu[l] { first } else { l }).collect();
    Lanes { thread_of, gpu: lanes.gpu.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;

    use towers_graph::Device;
    use towers_passes::VarPlacement;

    /// On a mixed session the host's streams share its thread (lane 0) and
    /// every GPU stream is a lane of its own; the CPU backend has one
    /// thread per device; CUDA alone makes every stream a GPU lane.
    #[test]
    fn each_backend_has_its_lanes() {
        let p = crate::cost::test_plan(2, VarPlacement::Cpu);
        let mixed = lanes(&p, "cpu+cuda", 8).expect("lanes");
        assert_eq!(mixed.thread_of.len(), p.streams.len());
        let gpu_streams = p.streams.iter().filter(|s| s.device.kind == DeviceKind::Gpu).count();
        assert!(gpu_streams > 2, "compute and copy streams per tower: {gpu_streams}");
        assert_eq!(mixed.gpu.iter().filter(|g| **g).count(), gpu_streams);
        assert_eq!(mixed.gpu.len(), 1 + gpu_streams, "one host thread for cpu:0");
        for (s, &l) in p.streams.iter().zip(&mixed.thread_of) {
            assert_eq!(mixed.gpu[l], s.device.kind == DeviceKind::Gpu, "{}", p.stream_name(s));
            if s.device == Device::CPU0 {
                assert_eq!(l, 0);
            }
        }
        let cpu = lanes(&p, "cpu", 8).expect("lanes");
        assert_eq!(cpu.gpu, vec![false; 3], "cpu:0, gpu:0, gpu:1: a thread each");
        let cuda = lanes(&p, "cuda", 8).expect("lanes");
        assert_eq!(cuda.thread_of, (0..p.streams.len()).collect::<Vec<_>>());
        assert!(cuda.gpu.iter().all(|g| *g));
        // Merged, every GPU stream runs on the first GPU lane; hosts keep theirs.
        let one = one_gpu_lane(&mixed);
        for (s, (&a, &b)) in p.streams.iter().zip(mixed.thread_of.iter().zip(&one.thread_of)) {
            assert_eq!(b, if s.device.kind == DeviceKind::Gpu { 1 } else { a });
        }
        assert_eq!(one_gpu_lane(&cpu), cpu);
    }
}
