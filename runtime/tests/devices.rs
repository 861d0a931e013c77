//! The device map of a real plan, and the load-time refusal of a GPU device
//! on a backend that runs GPU devices on CUDA, on a machine without CUDA
//! (issue 21, items 6 and 7).

mod common;

use std::sync::Arc;

use towers_codegen::{BufRef, Plan, VariableDecl};
use towers_runtime::devices::{plan_map, BackendKind, Cuda, Machine};
use towers_runtime::{Backend, BackendError, Comm, CpuBackend, HostSlice, HostSliceMut, Profiled, ProgramId, Trace};
use towers_runtime::{RuntimeError, Session};

use common::two_device_plan;

/// The CPU backend under the name of a mixed session: what `Session::load`
/// checks against a backend that runs `gpu:*` on CUDA contexts.
struct NamedMixed(CpuBackend);

impl Backend for NamedMixed {
    fn name(&self) -> &'static str {
        "mixed"
    }
    fn create_variable(&mut self, decl: &VariableDecl, init: HostSlice<'_>) -> Result<(), BackendError> {
        self.0.create_variable(decl, init)
    }
    fn load(&mut self, name: &str, plan: &Plan, comm: Arc<dyn Comm>) -> Result<ProgramId, BackendError> {
        self.0.load(name, plan, comm)
    }
    fn run(&mut self, program: ProgramId) -> Result<(), BackendError> {
        self.0.run(program)
    }
    fn write_buffer(&mut self, program: ProgramId, buf: &BufRef, data: HostSlice<'_>) -> Result<(), BackendError> {
        self.0.write_buffer(program, buf, data)
    }
    fn read_buffer(&self, program: ProgramId, buf: &BufRef, out: HostSliceMut<'_>) -> Result<(), BackendError> {
        self.0.read_buffer(program, buf, out)
    }
    fn write_variable(&mut self, name: &str, data: HostSlice<'_>) -> Result<(), BackendError> {
        self.0.write_variable(name, data)
    }
    fn read_variable(&self, name: &str, out: HostSliceMut<'_>) -> Result<(), BackendError> {
        self.0.read_variable(name, out)
    }
    fn set_profiling(&mut self, program: ProgramId, on: bool) {
        self.0.set_profiling(program, on)
    }
    fn profile(&self, program: ProgramId) -> Vec<Profiled> {
        self.0.profile(program)
    }
    fn set_tracing(&mut self, program: ProgramId, on: bool) -> Result<(), BackendError> {
        self.0.set_tracing(program, on)
    }
    fn trace(&self, program: ProgramId) -> Result<Trace, BackendError> {
        self.0.trace(program)
    }
    fn steps_run(&self, program: ProgramId) -> u64 {
        self.0.steps_run(program)
    }
    fn set_step(&mut self, program: ProgramId, step: u64) {
        self.0.set_step(program, step)
    }
    fn device_note(&self, gpus: &[String]) -> String {
        self.0.device_note(gpus)
    }
}

#[test]
fn a_gpu_device_on_a_cuda_backend_without_cuda_is_refused_at_load() {
    let machine = Machine::probe();
    let mut s = Session::with_backend(0, Box::new(NamedMixed(CpuBackend::new())));
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
