//! The device map of a real plan, and the load-time refusal of a GPU device
//! on a backend that runs GPU devices on CUDA, on a machine without CUDA
//! (issue 21, items 6 and 7).

mod common;

use towers_runtime::devices::{plan_map, BackendKind, Cuda, Machine};
use towers_runtime::CpuBackend;
use towers_runtime::{RuntimeError, Session};

use common::two_device_plan;

#[test]
fn a_gpu_device_on_a_cuda_backend_without_cuda_is_refused_at_load() {
    let machine = Machine::probe();
    let mut s = Session::with_backend(
        0,
        Box::new(common::CopyingFeeds(CpuBackend::new(), Some(BackendKind::Mixed { pinned: true }))),
    );
    let r = s.load("p", two_device_plan());
    match machine.cuda {
        Cuda::Gpus(n) if n > 0 => {
            r.expect("a machine with a GPU serves gpu:0");
        }
        _ => {
            let e = r.expect_err("no CUDA GPU for gpu:0");
            assert!(matches!(e, RuntimeError::UnservableDevice { .. }), "{e}");
            let text = e.to_string();
            assert!(
                text.starts_with("program 'p' asks for device gpu:0, but this machine has no CUDA GPU ("),
                "{text}"
            );
            assert!(text.ends_with("run with --backend cpu, which runs every /gpu:N as a host thread of its own, or run where a CUDA driver and a GPU exist"), "{text}");
            // Nothing was created: the plan's variables are unknown.
            assert!(s.variable_names().is_empty());
        }
    }
    // The CPU backend serves the same plan on any machine.
    let mut cpu = Session::new(0);
    cpu.load("p", two_device_plan()).expect("the CPU backend runs gpu:0 as a host thread");
    let map = cpu.device_map("p").expect("a map").to_string();
    assert_eq!(map.lines().count(), 2, "{map}");
    assert!(map.starts_with("cpu:0 -> host (pageable arena ") && map.contains("\ngpu:0 -> host thread "), "{map}");
    let note = cpu.backend_note();
    assert!(note.contains("\ndevices of p:\n  cpu:0 -> host ("), "{note}");
    assert!(matches!(cpu.device_map("q"), Err(RuntimeError::UnknownProgram { .. })));
}

#[test]
fn a_plans_devices_map_to_threads_and_contexts_exactly() {
    let plan = two_device_plan();
    let no_cuda = Machine { cuda: Cuda::Absent("no CUDA driver found".into()), cores: 2 };
    let arena = |i: usize| towers_runtime::devices::human_bytes(plan.devices[i].arena_bytes);
    assert_eq!(
        plan_map(&plan, BackendKind::Cpu, &no_cuda).expect("map").to_string(),
        format!(
            "cpu:0 -> host (pageable arena {}, thread 1 of 2)\ngpu:0 -> host thread 2 of 2 (arena {}; CPU backend: no CUDA driver found)",
            arena(0),
            arena(1)
        )
    );
    // One core: the host runs on gpu:0's thread.
    let one = Machine { cores: 1, ..no_cuda.clone() };
    let text = plan_map(&plan, BackendKind::Cpu, &one).expect("map").to_string();
    assert!(text.contains("thread 1 of 1, shared with gpu:0)"), "{text}");
    let gpus = Machine { cuda: Cuda::Gpus(1), cores: 2 };
    assert_eq!(
        plan_map(&plan, BackendKind::Mixed { pinned: true }, &gpus).expect("map").to_string(),
        format!(
            "cpu:0 -> host (pinned arena {}, thread 1 of 1)\ngpu:0 -> GPU 0 context 1 of 1 (arena {})",
            arena(0),
            arena(1)
        )
    );
    let e = plan_map(&plan, BackendKind::Mixed { pinned: true }, &no_cuda).expect_err("no CUDA");
    assert!(e.to_string().starts_with("device gpu:0 was asked for"), "{e}");
}
