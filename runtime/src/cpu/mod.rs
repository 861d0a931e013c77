//! # The CPU backend
//!
//! Executes plans on host memory: `/gpu:i` devices run as CPU devices.
//!
//! - `prepare`: at load, one arena per device, constants filled, every step
//!   resolved to views of memory with its scratch lists reserved;
//! - `exec`: dispatch of a launch to its CPU kernel; `collective`: the
//!   plan's all-reduce step through the session's communicator;
//! - `threads`, `sched`: **one thread per device** (the host on the caller;
//!   it runs the last device's streams too when the devices would otherwise
//!   take every core), a thread's streams as lanes in a deadlock-free
//!   order, events as atomics, idle threads spinning briefly before they sleep;
//! - `affinity`: each worker pinned to a core of its own;
//! - `store`: variable storage (host memory by name, shared by programs);
//! - `mem`: the only `unsafe` memory access, and its invariant.
//!
//! Invariants of this backend, on top of [`crate::backend`]'s:
//! - **Copies are elided.** Every device's arena and the variable store are
//!   host memory, so a plan's `Copy` step resolves its destination to its
//!   source at load (see `prepare::copy_aliases` for why that is sound) and
//!   only keeps its place between the events: the cross-device ordering
//!   stays. Hence no step may write a copy's destination (load refuses an
//!   all-reduce that would).
//! - **Zero allocation per `run`**: everything is resolved and reserved at
//!   load; a collective hands the communicator a reserved slice list.
//! - **Reads and writes are copies** between runs (`run` returns only when
//!   every thread finished the step), so nothing outside this module holds a
//!   view into its memory beyond one call: a feed written in place
//!   ([`Backend::with_feed_buffer`]) lends the closure the feed's arena
//!   slice itself (zero copies), between runs, through `&mut self`, for the
//!   closure's call only. Arenas are zeroed at load, so the lent slice is
//!   always initialized: the feed's last value, or zeros. Feed buffers are
//!   never reused for other tensors (codegen pins them), so that value is
//!   the last feed.

mod affinity;
mod collective;
pub(crate) mod exec;
pub(crate) mod mem;
mod offers;
mod part;
pub(crate) mod prepare;
mod sched;
mod store;
mod threads;

pub(crate) use threads::global_order;
/// Which thread runs which step (read by the cost model, `towers::cost`).
pub use threads::{thread_plans, ThreadPlan};

use std::sync::Arc;

use towers_codegen::{BufRef, BufferKind, Plan, VariableDecl};
use towers_vocab::DType;

use crate::backend::{Backend, BackendError, HostSlice, HostSliceMut, Profiled, ProgramId};
use crate::comm::Comm;
use crate::trace::Trace;
use prepare::{prepare, resolve_aliased, Exec, Prepared};
use sched::{Failure, Runner};
use store::Store;

struct Program {
    /// The plan as loaded (buffer offsets for feeds and fetches).
    plan: Plan,
    runner: Runner,
    prepared: Prepared,
    stream_names: Vec<String>,
}

/// The CPU backend; see the module docs.
#[derive(Default)]
pub struct CpuBackend {
    store: Store,
    programs: Vec<Program>,
    /// Plans reserved as parts of a mixed session, until loaded (`part`).
    reserved: Vec<Option<part::Reserved>>,
}

impl CpuBackend {
    pub fn new() -> CpuBackend {
        CpuBackend::default()
    }

    /// A CPU backend whose arenas and variables come from `memory`: the
    /// host part of a mixed session, in pinned memory a GPU copies directly
    /// (`towers_runtime::mixed`).
    pub fn with_host_memory(memory: Arc<dyn crate::host_memory::HostMemory>) -> CpuBackend {
        CpuBackend { store: Store { memory, ..Store::default() }, ..CpuBackend::default() }
    }

    /// The threads and runner of a prepared plan (of the whole plan, or of a
    /// part of a mixed session: `part`).
    fn finish_load(
        &mut self,
        name: &str,
        plan: &Plan,
        prepared: Prepared,
        part: Option<(&[bool], &Arc<crate::mixed::Bridge>)>,
    ) -> Result<ProgramId, BackendError> {
        let bad = BackendError::BadPlan;
        let Prepared { arenas, vars, streams, aliases, foreign } = prepared;
        let prepared = Prepared { arenas, vars, streams: Vec::new(), aliases, foreign };
        let cores = std::thread::available_parallelism().map_or(usize::MAX, |n| n.get());
        let threads = threads::thread_plans_with(plan, cores, part.map(|(s, b)| (s, b.as_ref()))).map_err(bad)?;
        let host_joined = threads.first().is_some_and(|t| t.devices.len() > 1);
        let mut streams: Vec<Vec<Option<Exec>>> = streams;
        let threads: Vec<Vec<(usize, usize, Exec)>> = threads
            .iter()
            .map(|t| t.items.iter().filter_map(|&(si, k)| streams[si][k].take().map(|x| (si, k, x))).collect())
            .collect();
        let bridge = part.map(|(_, b)| Arc::clone(b));
        let runner = Runner::new(threads, plan.num_events, name, host_joined, bridge).map_err(bad)?;
        let stream_names = plan.streams.iter().map(|s| s.name()).collect();
        self.programs.push(Program { plan: plan.clone(), runner, prepared, stream_names });
        Ok(ProgramId(self.programs.len() - 1))
    }

    fn program(&self, id: ProgramId) -> Result<&Program, BackendError> {
        self.programs.get(id.0).ok_or_else(|| BackendError::Access(format!("no program {}", id.0)))
    }

    fn var_slot(&self, name: &str, len: usize, fits: bool) -> Result<mem::Slot, BackendError> {
        let v = self
            .store
            .vars
            .get(name)
            .ok_or_else(|| BackendError::Access(format!("variable '{name}' does not exist")))?;
        let slot = v.region.all();
        if slot.len() != len || !fits {
            return Err(BackendError::Access(format!(
                "variable '{name}' is {}{:?}; the host data has another dtype or {len} elements",
                v.dtype, v.shape
            )));
        }
        Ok(slot)
    }

    fn buf_slot(&self, id: ProgramId, r: &BufRef, len: usize) -> Result<prepare::Buf, BackendError> {
        let p = self.program(id)?;
        let b = resolve_aliased(&p.plan, &p.prepared.arenas, &self.store, &p.prepared.aliases, &p.prepared.foreign, r)
            .map_err(BackendError::Access)?;
        if b.slot.len() != len {
            return Err(BackendError::Access(format!(
                "{} has {} elements, the host data {len}",
                p.plan.ref_name(r),
                b.slot.len()
            )));
        }
        Ok(b)
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    /// `MemAvailable` of /proc/meminfo: every device of this backend lives in host memory.
    fn memory_available(&self) -> Option<u64> {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    fn create_variable(&mut self, decl: &VariableDecl, init: HostSlice<'_>) -> Result<(), BackendError> {
        self.store.create(&decl.name, decl.dtype, &decl.shape, init).map_err(BackendError::Access)
    }

    fn load(&mut self, name: &str, plan: &Plan, comm: Arc<dyn Comm>) -> Result<ProgramId, BackendError> {
        let prepared = prepare(plan, &self.store, &comm).map_err(BackendError::BadPlan)?;
        self.finish_load(name, plan, prepared, None)
    }

    fn run(&mut self, id: ProgramId) -> Result<(), BackendError> {
        let Some(p) = self.programs.get_mut(id.0) else {
            return Err(BackendError::Access(format!("no program {}", id.0)));
        };
        p.runner.step().map_err(|f| match f {
            Failure::Kernel(node, detail) => BackendError::Kernel { node, detail },
            Failure::Collective(node, source) => BackendError::Collective { node, source },
        })
    }

    fn write_buffer(&mut self, id: ProgramId, r: &BufRef, data: HostSlice<'_>) -> Result<(), BackendError> {
        let b = self.buf_slot(id, r, data.len())?;
        if !data.fits(b.dtype) {
            return Err(BackendError::Access(format!("a {} buffer cannot take this host data", b.dtype)));
        }
        // SAFETY: no step is running (`run` holds `&mut self` until every thread is done).
        unsafe { b.slot.write(data) };
        Ok(())
    }

    /// The arena slice of the feed itself: the closure writes the feed in place.
    fn with_feed_buffer(
        &mut self,
        id: ProgramId,
        r: &BufRef,
        fill: &mut dyn FnMut(HostSliceMut<'_>),
    ) -> Result<bool, BackendError> {
        let p = self.program(id)?;
        if !p.plan.buffer(r).is_some_and(|b| b.kind == BufferKind::Feed) {
            return Err(BackendError::Access(format!("{} is not a feed buffer", p.plan.ref_name(r))));
        }
        let b = resolve_aliased(&p.plan, &p.prepared.arenas, &self.store, &p.prepared.aliases, &p.prepared.foreign, r)
            .map_err(BackendError::Access)?;
        // SAFETY: no step is running (`run` holds `&mut self` until every
        // thread is done, and `&mut self` is held here), and the slice lives
        // only for the call of `fill` (its lifetime is the call's), which
        // cannot reach this backend: no other view of the slot is used
        // meanwhile. The arena was zeroed at load: initialized memory.
        let lent = unsafe {
            match b.dtype {
                DType::F32 => HostSliceMut::F32(b.slot.f32_mut()),
                DType::I32 | DType::Bool => HostSliceMut::I32(b.slot.i32_mut()),
            }
        };
        fill(lent);
        Ok(true)
    }

    fn read_buffer(&self, id: ProgramId, r: &BufRef, out: HostSliceMut<'_>) -> Result<(), BackendError> {
        let b = self.buf_slot(id, r, out.len())?;
        if !out.fits(b.dtype) {
            return Err(BackendError::Access(format!("a {} buffer cannot be read into this host memory", b.dtype)));
        }
        // SAFETY: no step is running while `&self` is borrowed.
        unsafe { b.slot.read(out) };
        Ok(())
    }

    fn write_variable(&mut self, name: &str, data: HostSlice<'_>) -> Result<(), BackendError> {
        let fits = self.store.vars.get(name).is_some_and(|v| data.fits(v.dtype));
        let slot = self.var_slot(name, data.len(), fits)?;
        // SAFETY: no step is running (`&mut self`).
        unsafe { slot.write(data) };
        Ok(())
    }

    fn read_variable(&self, name: &str, out: HostSliceMut<'_>) -> Result<(), BackendError> {
        let fits = self.store.vars.get(name).is_some_and(|v| out.fits(v.dtype));
        let slot = self.var_slot(name, out.len(), fits)?;
        // SAFETY: no step is running while `&self` is borrowed.
        unsafe { slot.read(out) };
        Ok(())
    }

    fn set_profiling(&mut self, id: ProgramId, on: bool) {
        if let Some(p) = self.programs.get_mut(id.0) {
            p.runner.set_profiling(on);
        }
    }

    fn profile(&self, id: ProgramId) -> Vec<Profiled> {
        let Some(p) = self.programs.get(id.0) else { return Vec::new() };
        p.runner
            .profile()
            .into_iter()
            .map(|e| Profiled {
                stream: p.stream_names.get(e.stream).cloned().unwrap_or_default(),
                kernel: e.kind,
                node: e.node,
                nanos: e.nanos,
            })
            .collect()
    }

    fn set_tracing(&mut self, id: ProgramId, on: bool) -> Result<(), BackendError> {
        let p = self.programs.get_mut(id.0).ok_or_else(|| BackendError::Access(format!("no program {}", id.0)))?;
        p.runner.set_tracing(on);
        Ok(())
    }

    fn trace(&self, id: ProgramId) -> Result<Trace, BackendError> {
        self.program(id)?
            .runner
            .trace()
            .ok_or_else(|| BackendError::Access("no step has run with tracing on (turn it on before the run)".into()))
    }

    fn steps_run(&self, id: ProgramId) -> u64 {
        self.programs.get(id.0).map_or(0, |p| p.runner.steps_run())
    }

    fn set_step(&mut self, id: ProgramId, step: u64) {
        if let Some(p) = self.programs.get_mut(id.0) {
            p.runner.set_step(step);
        }
    }

    fn device_note(&self, gpus: &[String]) -> String {
        let names = match gpus.len() {
            0 | 1 => gpus.concat(),
            n => format!("{} and {}", gpus[..n - 1].join(", "), gpus[n - 1]),
        };
        let verb = if gpus.len() == 1 { "runs as a CPU device" } else { "run as CPU devices" };
        match crate::cuda::probe() {
            crate::cuda::CudaStatus::Found { devices } => {
                format!("{names} {verb}: a CUDA driver with {devices} device(s) was found, but this build executes plans on the CPU backend")
            }
            other => format!("{names} {verb}: {other}"),
        }
    }
}
