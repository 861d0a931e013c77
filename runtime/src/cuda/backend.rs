//! The CUDA backend behind the [`Backend`] seam: variables, loading and
//! running programs (`super::prepare`, `super::run`), reads and writes of
//! buffers and variables, feeds written in place, profiles, traces and the
//! notes the CLI prints.
//!
//! Invariants:
//! - **Reads and writes** of buffers and variables are synchronous copies
//!   between device memory and the caller's host slice, after the session's
//!   dtype and length checks are repeated here. A buffer write also waits
//!   for its DMA (a copy from pageable memory may return before it lands,
//!   and the step's non-blocking streams are not ordered with the legacy
//!   stream it runs on).
//! - **Feeds written in place** (`super::feeds`): `with_feed_buffer` lends
//!   the pinned staging buffer made at load, then enqueues its asynchronous
//!   copy on the program's copy stream; the next `run` makes the streams it
//!   starts on wait for those copies on the GPU, and synchronous reads and
//!   writes of the program's buffers wait for them first (`Feeds::settle`).
//! - Every entry point binds the backend's context to the calling thread
//!   before it touches a handle.

use std::sync::Arc;

use cudarc::driver::{result as drv, CudaContext};
use towers_codegen::{BufRef, Plan, Step, VariableDecl};

use super::driver::{derr, DevMem};
use super::lower::Op;
use super::trace::Tracer;
use super::{CudaBackend, Var};
use crate::backend::{Backend, BackendError, HostSlice, HostSliceMut, Profiled, ProgramId};
use crate::comm::Comm;
use crate::trace::Trace;

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    /// Free device memory of the one GPU (every logical device maps onto it).
    fn memory_available(&self) -> Option<u64> {
        self.ctx.mem_get_info().ok().map(|(free, _total)| free as u64)
    }

    fn create_variable(&mut self, decl: &VariableDecl, init: HostSlice<'_>) -> Result<(), BackendError> {
        if self.vars.contains_key(&decl.name) {
            return Err(BackendError::Access(format!("variable '{}' already exists", decl.name)));
        }
        let len: usize = decl.shape.iter().product();
        if init.len() != len || !init.fits(decl.dtype) {
            return Err(BackendError::Access(format!(
                "variable '{}' is {}{:?}; the initial value has another dtype or {} elements",
                decl.name,
                decl.dtype,
                decl.shape,
                init.len()
            )));
        }
        // In the context of its device (each logical GPU's own, when contexts are per GPU).
        let k = self.slot_for(decl.device)?;
        let ctx = Arc::clone(self.slot_ctx(k));
        let mem = DevMem::zeroed(&ctx, len * 4).map_err(BackendError::Device)?;
        // SAFETY: `mem` holds `len` 4-byte elements.
        let r = match init {
            HostSlice::F32(s) => unsafe { drv::memcpy_htod_sync(mem.ptr, s) },
            HostSlice::I32(s) => unsafe { drv::memcpy_htod_sync(mem.ptr, s) },
        };
        r.map_err(|e| BackendError::Device(derr("uploading a variable", e)))?;
        self.bind()?;
        self.vars.insert(decl.name.clone(), Var { mem, dtype: decl.dtype, shape: decl.shape.clone(), len });
        Ok(())
    }

    fn load(&mut self, _name: &str, plan: &Plan, comm: Arc<dyn Comm>) -> Result<ProgramId, BackendError> {
        // Standalone, every plan device is served here (cpu:0 included, in
        // device memory); a mixed session serves cpu:* on the host instead.
        let arenas = self.arenas(plan, &vec![true; plan.devices.len()])?;
        let p = self.prepare(plan, &comm, arenas, None)?;
        self.programs.push(p);
        Ok(ProgramId(self.programs.len() - 1))
    }

    /// A step; as a mixed session's part, a failed step still sets the
    /// flags of the bridged events this part records (`Bridge::record`,
    /// from the host), so the other parts' waiters return instead of
    /// waiting for ever; the error is what the step returns.
    fn run(&mut self, id: ProgramId) -> Result<(), BackendError> {
        let r = self.run_step(id);
        if r.is_err() {
            if let Some(p) = self.programs.get(id.0) {
                if let Some(b) = &p.bridge {
                    for it in p.streams.iter().flat_map(|s| &s.items) {
                        if let Op::Signal { event, .. } = it.op {
                            b.record(event);
                        }
                    }
                }
            }
        }
        r
    }

    fn write_buffer(&mut self, id: ProgramId, r: &BufRef, data: HostSlice<'_>) -> Result<(), BackendError> {
        self.bind()?;
        let p = self.program(id)?;
        let d = self.resolve(&p.plan, &p.arenas, r).map_err(BackendError::Access)?;
        if d.len != data.len() || !data.fits(d.dtype) {
            return Err(BackendError::Access(format!(
                "{} is {} with {} elements; the host data has another dtype or {} elements",
                p.plan.ref_name(r),
                d.dtype,
                d.len,
                data.len()
            )));
        }
        // An older staged copy to this buffer must not land after this one.
        p.feeds.settle().map_err(BackendError::Device)?;
        self.bind_holder(&p.arenas, r)?;
        // SAFETY: `d` is a live device range of `d.len` 4-byte elements; no step is running.
        let res = match data {
            HostSlice::F32(s) => unsafe { drv::memcpy_htod_sync(d.ptr, s) },
            HostSlice::I32(s) => unsafe { drv::memcpy_htod_sync(d.ptr, s) },
        };
        res.map_err(|e| BackendError::Device(derr("cuMemcpyHtoD", e)))?;
        // From pageable memory the synchronous copy may return before its
        // last DMA lands (CUDA's documented behaviour), and the step's
        // non-blocking streams are not ordered with the legacy stream it
        // ran on: wait for it, so the next step (or a later staged copy of
        // this buffer) comes after it.
        // SAFETY: the null handle names the context's legacy stream.
        unsafe { drv::stream::synchronize(std::ptr::null_mut()) }
            .map_err(|e| BackendError::Device(derr("cuStreamSynchronize (legacy stream)", e)))
    }

    /// The feed's pinned staging buffer (made at load), copied to the GPU
    /// asynchronously when `fill` returns; the next `run` waits for it.
    fn with_feed_buffer(
        &mut self,
        id: ProgramId,
        r: &BufRef,
        fill: &mut dyn FnMut(HostSliceMut<'_>),
    ) -> Result<bool, BackendError> {
        self.bind()?;
        let p = self.programs.get_mut(id.0).ok_or_else(|| BackendError::Access(format!("no program {}", id.0)))?;
        p.feeds.lend(&p.plan, r, fill)?;
        Ok(true)
    }

    fn read_buffer(&self, id: ProgramId, r: &BufRef, out: HostSliceMut<'_>) -> Result<(), BackendError> {
        self.bind()?;
        let p = self.program(id)?;
        let d = self.resolve(&p.plan, &p.arenas, r).map_err(BackendError::Access)?;
        if d.len != out.len() || !out.fits(d.dtype) {
            return Err(BackendError::Access(format!(
                "{} is {} with {} elements; the host memory has another dtype or {} elements",
                p.plan.ref_name(r),
                d.dtype,
                d.len,
                out.len()
            )));
        }
        // A feed written in place may still be crossing the bus.
        p.feeds.settle().map_err(BackendError::Device)?;
        self.bind_holder(&p.arenas, r)?;
        // SAFETY: as `write_buffer`.
        let res = match out {
            HostSliceMut::F32(s) => unsafe { drv::memcpy_dtoh_sync(s, d.ptr) },
            HostSliceMut::I32(s) => unsafe { drv::memcpy_dtoh_sync(s, d.ptr) },
        };
        res.map_err(|e| BackendError::Device(derr("cuMemcpyDtoH", e)))
    }

    fn write_variable(&mut self, name: &str, data: HostSlice<'_>) -> Result<(), BackendError> {
        self.bind()?;
        let v = self.vars.get(name).ok_or_else(|| BackendError::Access(format!("variable '{name}' does not exist")))?;
        if v.len != data.len() || !data.fits(v.dtype) {
            return Err(BackendError::Access(format!(
                "variable '{name}' is {}{:?}; the host data has another dtype or {} elements",
                v.dtype,
                v.shape,
                data.len()
            )));
        }
        v.mem.ctx().bind_to_thread().map_err(|e| BackendError::Device(derr("cuCtxSetCurrent", e)))?;
        // SAFETY: the variable's allocation holds `v.len` elements; no step is running.
        let res = match data {
            HostSlice::F32(s) => unsafe { drv::memcpy_htod_sync(v.mem.ptr, s) },
            HostSlice::I32(s) => unsafe { drv::memcpy_htod_sync(v.mem.ptr, s) },
        };
        res.map_err(|e| BackendError::Device(derr("cuMemcpyHtoD", e)))
    }

    fn read_variable(&self, name: &str, out: HostSliceMut<'_>) -> Result<(), BackendError> {
        self.bind()?;
        let v = self.vars.get(name).ok_or_else(|| BackendError::Access(format!("variable '{name}' does not exist")))?;
        if v.len != out.len() || !out.fits(v.dtype) {
            return Err(BackendError::Access(format!(
                "variable '{name}' is {}{:?}; the host memory has another dtype or {} elements",
                v.dtype,
                v.shape,
                out.len()
            )));
        }
        v.mem.ctx().bind_to_thread().map_err(|e| BackendError::Device(derr("cuCtxSetCurrent", e)))?;
        // SAFETY: as `write_variable`.
        let res = match out {
            HostSliceMut::F32(s) => unsafe { drv::memcpy_dtoh_sync(s, v.mem.ptr) },
            HostSliceMut::I32(s) => unsafe { drv::memcpy_dtoh_sync(s, v.mem.ptr) },
        };
        res.map_err(|e| BackendError::Device(derr("cuMemcpyDtoH", e)))
    }

    /// Profiling synchronizes after every item and times it on the host
    /// (launch and execution together): slower steps, exact attribution.
    fn set_profiling(&mut self, id: ProgramId, on: bool) {
        if let Some(p) = self.programs.get_mut(id.0) {
            p.profiling = on;
            p.profile.clear();
        }
    }

    fn profile(&self, id: ProgramId) -> Vec<Profiled> {
        let Some(p) = self.programs.get(id.0) else { return Vec::new() };
        p.profile
            .iter()
            .map(|(&(s, k), &nanos)| {
                let it = &p.streams[s].items[k];
                Profiled { stream: p.streams[s].name.clone(), kernel: it.kernel, node: it.node.clone(), nanos }
            })
            .collect()
    }

    /// Traced steps launch eagerly with timing events around every plan
    /// step ([`trace`]); the events are created the first time tracing is
    /// turned on, so a traced run allocates nothing.
    fn set_tracing(&mut self, id: ProgramId, on: bool) -> Result<(), BackendError> {
        self.bind()?;
        let ctx = Arc::clone(&self.ctx);
        let p = self.programs.get_mut(id.0).ok_or_else(|| BackendError::Access(format!("no program {}", id.0)))?;
        if on && p.tracer.is_none() {
            // Timing events for the streams this backend runs only.
            let steps: Vec<usize> =
                p.plan.streams.iter().zip(&p.streams_on).map(|(s, &on)| if on { s.steps.len() } else { 0 }).collect();
            let ctxs: Vec<&Arc<CudaContext>> = p.streams.iter().map(|s| &s.ctx).collect();
            p.tracer = Some(Tracer::new(&ctxs, &steps).map_err(BackendError::Device)?);
            ctx.bind_to_thread().map_err(|e| BackendError::Device(derr("cuCtxSetCurrent", e)))?;
        }
        p.tracing = on;
        Ok(())
    }

    fn trace(&self, id: ProgramId) -> Result<Trace, BackendError> {
        let p = self.program(id)?;
        let label = |s: usize, j: usize| -> Option<(&'static str, String)> {
            if !p.streams_on.get(s).copied().unwrap_or(false) {
                return None;
            }
            let step = p.plan.streams.get(s)?.steps.get(j)?;
            match step {
                Step::Record(_) => None,
                Step::Wait(e) => Some(("wait", format!("event {e}"))),
                Step::Copy { node, .. } => Some(("copy", node.clone())),
                Step::AllReduce { node, .. } => Some(("all_reduce", node.clone())),
                Step::Reduce { node, .. } => Some(("reduce", node.clone())),
                Step::Broadcast { node, .. } => Some(("broadcast", node.clone())),
                Step::Launch { kernel, node, .. } => Some((kernel.name(), node.clone())),
            }
        };
        p.tracer
            .as_ref()
            .and_then(|t| t.trace(label))
            .ok_or_else(|| BackendError::Access("no step of this program has run with tracing on".into()))
    }

    fn steps_run(&self, id: ProgramId) -> u64 {
        self.programs.get(id.0).map_or(0, |p| p.runs)
    }

    /// `runs` is the step dropout sees (`let step = p.runs` in `run`).
    fn set_step(&mut self, id: ProgramId, step: u64) {
        if let Some(p) = self.programs.get_mut(id.0) {
            p.runs = step;
        }
    }

    fn program_note(&self, id: ProgramId) -> Option<String> {
        let p = self.programs.get(id.0)?;
        let items = || p.streams.iter().flat_map(|s| &s.items);
        let flags = items().filter(|i| matches!(i.op, Op::Signal { .. } | Op::WaitFlag(_))).count();
        let host = items().filter(|i| matches!(i.op, Op::CopyHtoD { .. } | Op::CopyDtoH { .. })).count();
        if flags + host == 0 {
            return Some(p.graph.describe());
        }
        Some(format!(
            "{}; {host} copies to or from pinned host memory, {flags} event records and waits crossing to the host part as stream memory operations",
            p.graph.describe()
        ))
    }

    fn device_note(&self, gpus: &[String]) -> String {
        if self.per_gpu && !gpus.is_empty() {
            let host = if self.as_part {
                ""
            } else {
                "; cpu:0's steps and variables run in the backend's own context on GPU 0"
            };
            return format!("{}{host}", self.context_note(gpus));
        }
        if gpus.is_empty() {
            return format!("cpu:0 runs on the one CUDA device {}", self.device());
        }
        let names = match gpus.len() {
            0 | 1 => gpus.concat(),
            n => format!("{} and {}", gpus[..n - 1].join(", "), gpus[n - 1]),
        };
        let how = if gpus.len() > 1 { ", as separate streams of one context" } else { "" };
        if self.as_part {
            return format!("{names} run on the one CUDA device {}{how}", self.device());
        }
        format!("{names} run on the one CUDA device {}{how}; cpu:0's steps and variables run on it too", self.device())
    }
}

impl CudaBackend {
    /// Bind the context holding buffer or variable `r` (synchronous copies
    /// run on its legacy stream).
    pub(super) fn bind_holder(&self, arenas: &[Option<DevMem>], r: &BufRef) -> Result<(), BackendError> {
        let ctx = match r {
            BufRef::Arena { device, .. } => arenas.get(*device).and_then(|a| a.as_ref()).map(|m| m.ctx()),
            BufRef::Variable(n) => self.vars.get(n).map(|v| v.mem.ctx()),
        };
        match ctx {
            Some(c) => c.bind_to_thread().map_err(|e| BackendError::Device(derr("cuCtxSetCurrent", e))),
            None => Ok(()),
        }
    }
}
