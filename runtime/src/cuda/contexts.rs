//! One CUDA context per logical GPU ([`CudaBackend::with_context_per_gpu`],
//! off by default): `gpu:i` gets a context of its own on physical GPU
//! `i mod n` (the rule of [`crate::devices::gpu_contexts`]), with its own
//! arena, streams, events, cuBLAS handles, modules and side buffer, so two
//! logical GPUs on one physical GPU copy between each other explicitly,
//! as two physical GPUs do. The first logical GPU on each physical GPU
//! takes that GPU's primary context (on GPU 0 the backend's own, which a
//! standalone load's `cpu:*` devices share); only further logical GPUs on
//! the same GPU get created contexts (measured: a CUDA graph replays
//! 3.7x slower in a created context than in the primary one).
//!
//! Slot 0 is the backend's own context (the primary context of GPU 0),
//! which serves `cpu:*` devices in a standalone load and every device when
//! contexts are shared (the default, what ran on the GPU before issue 21:
//! every logical device as streams of one context). Slots 1.. are created
//! on first use of a logical GPU and live as long as the backend.
//!
//! What a program spanning several contexts does differently:
//! - a copy between buffers of two contexts is `cuMemcpyPeerAsync` (it
//!   names both contexts); peer access is enabled between contexts on
//!   different physical GPUs where `cuDeviceCanAccessPeer` allows, and
//!   where it does not the driver stages the peer copy through host memory;
//! - an event is created in the context of the stream that records it, and
//!   a stream of another context waits on it with `cuStreamWaitEvent`
//!   (which takes an event of any context);
//! - the host binds each stream's context before it enqueues on it;
//! - a launch whose operand lies in another context is refused at load
//!   (a kernel must not read another device's memory);
//! - steps launch eagerly: the graph capture here forks and joins one
//!   context's streams, and `program_note` says so;
//! - a traced step has a timing origin per context (`trace`);
//! - NCCL's all-reduce runs in the backend's own context: a bucket in a
//!   context of its own is refused, naming the way to share one.
//!
//! Invariants: every slot's context outlives what was made in it (each
//! resource holds its context); a slot is never removed.

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};
use towers_codegen::{BufRef, Plan};
use towers_vocab::{Device, DeviceKind};

use super::driver::{derr, DevMem};
use super::lower::Modules;
use super::CudaBackend;
use crate::backend::BackendError;
use crate::devices::gpu_contexts;

/// The context of one logical GPU.
pub(crate) struct Slot {
    /// Declared before `ctx`: dropped first.
    pub modules: Modules,
    pub ctx: Arc<CudaContext>,
    /// `i` of `gpu:i`.
    pub logical: u32,
    pub physical: usize,
}

impl CudaBackend {
    /// This backend with one CUDA context per logical GPU (`on`), or every
    /// logical device as streams of one context (the default); see the
    /// module docs of `contexts`.
    pub fn with_context_per_gpu(mut self, on: bool) -> CudaBackend {
        self.per_gpu = on;
        self
    }

    /// The slot serving device `d`, creating its context on first use.
    pub(super) fn slot_for(&mut self, d: Device) -> Result<usize, BackendError> {
        if !self.per_gpu || d.kind != DeviceKind::Gpu {
            return Ok(0);
        }
        if let Some(k) = self.slots.iter().position(|s| s.logical == d.index) {
            return Ok(k + 1);
        }
        let fail = |what: &str, e: &dyn std::fmt::Debug| {
            BackendError::Device(format!("{d}: {}", derr(what, format!("{e:?}"))))
        };
        let needed = ["cuCtxCreate_v4", "cuMemcpyPeerAsync", "cuDeviceCanAccessPeer", "cuCtxEnablePeerAccess"];
        super::libs::driver_exports(&needed, "one CUDA context per logical GPU")
            .map_err(|e| BackendError::Device(format!("{d}: {e}")))?;
        let n = CudaContext::device_count().map_err(|e| fail("cuDeviceGetCount", &e))?.max(1) as usize;
        let physical = d.index as usize % n;
        // The first logical GPU on a physical GPU takes that GPU's primary
        // context (GPU 0's is the backend's own); each further one a context
        // created for it. On the H200 a CUDA graph replayed in a created
        // context ran 3.7x slower than the same graph in the primary one
        // (1.23 against 0.33 ms a step; eager steps were 0.38 in both).
        let ctx = if self.slots.iter().any(|s| s.physical == physical) {
            std::panic::catch_unwind(|| CudaContext::new_non_primary(physical, 0))
                .map_err(|_| fail("cuCtxCreate", &"the CUDA driver panicked"))?
                .map_err(|e| fail(&format!("cuCtxCreate on GPU {physical}"), &e))?
        } else if physical == self.ctx.ordinal() {
            Arc::clone(&self.ctx)
        } else {
            CudaContext::new(physical).map_err(|e| fail(&format!("cuDevicePrimaryCtxRetain on GPU {physical}"), &e))?
        };
        let (major, minor) = ctx.compute_capability().map_err(|e| fail("cuDeviceGetAttribute", &e))?;
        for other in self.slots.iter().filter(|s| s.physical != physical) {
            enable_peer_access(&ctx, &other.ctx).map_err(|e| BackendError::Device(format!("{d}: {e}")))?;
        }
        let modules = Modules::new(&ctx, format!("sm_{major}{minor}"));
        self.slots.push(Slot { modules, ctx, logical: d.index, physical });
        self.bind()?;
        Ok(self.slots.len())
    }

    /// The context of slot `k`.
    pub(super) fn slot_ctx(&self, k: usize) -> &Arc<CudaContext> {
        match k.checked_sub(1).and_then(|i| self.slots.get(i)) {
            Some(s) => &s.ctx,
            None => &self.ctx,
        }
    }

    /// The kernel modules of slot `k`.
    pub(super) fn slot_modules(&mut self, k: usize) -> &mut Modules {
        match k.checked_sub(1) {
            Some(i) if i < self.slots.len() => &mut self.slots[i].modules,
            _ => &mut self.modules,
        }
    }

    /// `GPU 0, context 2 of 4` for slot `k` (the backend's own context for 0).
    pub(super) fn slot_name(&self, k: usize) -> String {
        let Some(s) = k.checked_sub(1).and_then(|i| self.slots.get(i)) else {
            return format!("GPU {} ({}), the backend's own context", self.ctx.ordinal(), self.device());
        };
        let logical: Vec<u32> = self.slots.iter().map(|s| s.logical).collect();
        let n = CudaContext::device_count().unwrap_or(1).max(1) as usize;
        match gpu_contexts(&logical, n).into_iter().find(|c| c.logical == s.logical) {
            Some(c) => format!("GPU {} context {} of {}", c.physical, c.context + 1, c.of),
            None => format!("GPU {}", s.physical),
        }
    }

    /// The context holding buffer or variable `r` (None when unknown).
    pub(super) fn ctx_of(&self, arenas: &[Option<DevMem>], r: &BufRef) -> Option<sys::CUcontext> {
        match r {
            BufRef::Arena { device, .. } => arenas.get(*device)?.as_ref().map(|m| m.ctx().cu_ctx()),
            BufRef::Variable(n) => self.vars.get(n).map(|v| v.mem.ctx().cu_ctx()),
        }
    }

    /// The device note when each logical GPU has its own context.
    pub(super) fn context_note(&self, plan_gpus: &[String]) -> String {
        let n = CudaContext::device_count().unwrap_or(1).max(1) as usize;
        let logical: Vec<u32> =
            plan_gpus.iter().filter_map(|g| g.strip_prefix("gpu:").and_then(|i| i.parse().ok())).collect();
        format!("{} ({}, one CUDA context per logical GPU)", mapping(&logical, n).join("; "), self.gpu_name)
    }
}

/// `gpu:1 -> GPU 0 context 2 of 4 (one GPU for 4 logical GPUs)` per
/// logical GPU, on a machine with `physical` GPUs.
pub(crate) fn mapping(logical: &[u32], physical: usize) -> Vec<String> {
    gpu_contexts(logical, physical)
        .iter()
        .map(|c| {
            let shared = if c.of > 1 { format!(" (one GPU for {} logical GPUs)", c.of) } else { String::new() };
            format!("gpu:{} -> GPU {} context {} of {}{shared}", c.logical, c.physical, c.context + 1, c.of)
        })
        .collect()
}

/// Let `a` address `b`'s memory where the two GPUs allow it (copies run
/// either way; peer access makes them direct).
fn enable_peer_access(a: &Arc<CudaContext>, b: &Arc<CudaContext>) -> Result<(), String> {
    let mut can = 0;
    // SAFETY: two valid device handles.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.cu_device(), b.cu_device()) }
        .result()
        .map_err(|e| derr("cuDeviceCanAccessPeer", e))?;
    if can == 0 {
        return Ok(());
    }
    for (from, to) in [(a, b), (b, a)] {
        from.bind_to_thread().map_err(|e| derr("cuCtxSetCurrent", e))?;
        // SAFETY: a live context, bound; flags must be 0.
        match unsafe { sys::cuCtxEnablePeerAccess(to.cu_ctx(), 0) } {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
            e => return Err(derr("cuCtxEnablePeerAccess", e)),
        }
    }
    Ok(())
}

/// Which slot records each of a plan's events: that of the first stream
/// recording it (`stream_slot` per plan stream), slot 0 for the others.
pub(crate) fn event_slots(plan: &Plan, stream_slot: &[usize]) -> Vec<usize> {
    let mut slots = vec![None; plan.num_events];
    for (s, k) in plan.streams.iter().zip(stream_slot) {
        for step in &s.steps {
            if let towers_codegen::Step::Record(e) = step {
                if let Some(slot @ None) = slots.get_mut(*e) {
                    *slot = Some(*k);
                }
            }
        }
    }
    slots.into_iter().map(|k| k.unwrap_or(0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use towers_codegen::{Mode, Step, StreamPlan};
    use towers_vocab::StreamKind;

    #[test]
    fn the_note_maps_each_logical_gpu_to_its_context() {
        assert_eq!(
            mapping(&[0, 1], 1),
            vec![
                "gpu:0 -> GPU 0 context 1 of 2 (one GPU for 2 logical GPUs)".to_string(),
                "gpu:1 -> GPU 0 context 2 of 2 (one GPU for 2 logical GPUs)".to_string(),
            ]
        );
        assert_eq!(
            mapping(&[0, 1, 2], 4),
            vec!["gpu:0 -> GPU 0 context 1 of 1", "gpu:1 -> GPU 1 context 1 of 1", "gpu:2 -> GPU 2 context 1 of 1"]
        );
    }

    #[test]
    fn an_event_lives_in_the_context_of_its_recording_stream() {
        let stream = |d: Device, steps| StreamPlan { device: d, kind: StreamKind::Compute, steps };
        let plan = Plan {
            program: "p".into(),
            mode: Mode::Train,
            devices: Vec::new(),
            variables: Vec::new(),
            constants: Vec::new(),
            feeds: Vec::new(),
            fetches: Vec::new(),
            tensors: Vec::new(),
            streams: vec![
                stream(Device::gpu(0), vec![Step::Wait(1), Step::Record(0)]),
                stream(Device::gpu(1), vec![Step::Wait(0), Step::Record(1), Step::Record(0)]),
            ],
            num_events: 3,
            task: None,
            unread_feeds: Vec::new(),
        };
        assert_eq!(event_slots(&plan, &[1, 2]), vec![1, 2, 0]);
    }
}
