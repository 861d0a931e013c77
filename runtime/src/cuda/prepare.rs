//! Loading a plan on the CUDA backend ([`CudaBackend::prepare`], called by
//! `Backend::load`): everything that allocates or compiles happens here,
//! once, so that a step (`super::run`) only enqueues.
//!
//! What load does, in order: one zeroed device allocation per plan device
//! (`DevicePlan::arena_bytes`), every buffer and view at its plan offset
//! ([`CudaBackend::resolve`] checks it lies inside its arena); constants
//! uploaded; one CUDA event per plan event; per plan stream, one CUDA
//! stream, one cuBLAS handle when it runs GEMMs, one im2col workspace
//! ([`stream_workspace_bytes`]) and the scratch of its fused tower
//! products; every launch lowered to its items (`super::lower`, which
//! compiles each kernel family once per machine through NVRTC and the
//! disk cache) with its argument list built (`super::args`); pointer and
//! weight arrays gathered into one side buffer, uploaded, and patched into
//! the argument lists; the pinned staging of the feeds (`super::feeds`);
//! and the host's enqueue order ([`enqueue_order`]).
//!
//! Invariants kept for the run path:
//! - every device address an item holds lies inside an allocation owned by
//!   the [`Program`] (or a variable, which outlives it) and never moves;
//! - no argument list changes after load: dropout reads the step number
//!   from the side buffer's first word (`args::STEP_CELL`);
//! - in the enqueue order every `Record` comes before the `Wait`s on it (a
//!   CUDA wait sees the last record enqueued before it), or load fails;
//! - a malformed plan (an event out of range, a copy between buffers of
//!   other sizes, an all-reduce without a communicator of its size) is
//!   [`BackendError::BadPlan`]; a driver or NVRTC failure is
//!   [`BackendError::Device`]. Nothing panics.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{result as drv, CudaContext};
use towers_codegen::{BufRef, Plan, Step};
use towers_kernels::Kernel;
use towers_vocab::DType;

use super::args::{self, Side};
use super::contexts::event_slots;
use super::driver::{derr, Blas, DevMem, Event, Stream};
use super::feeds::Feeds;
use super::graph::GraphState;
use super::lower::{lower_launch, Dev, Op};
use super::part::{
    copy_call, event_calls, flag_addresses, on_served, part_order, recorded_by, served_streams, CopyCall, End,
    EventCall,
};
use super::pinned::device_address;
use super::{CudaBackend, Item, Program, StreamRun};
use crate::backend::BackendError;
use crate::comm::Comm;
use crate::mixed::PartPlan;

impl CudaBackend {
    /// One zeroed arena per plan device marked in `served` (`None` for the
    /// others); out of memory names the device, its arena size and the GPU.
    pub(super) fn arenas(&mut self, plan: &Plan, served: &[bool]) -> Result<Vec<Option<DevMem>>, BackendError> {
        self.bind()?;
        let mut arenas = Vec::with_capacity(plan.devices.len());
        for (d, &on) in plan.devices.iter().zip(served.iter().chain(std::iter::repeat(&false))) {
            if !on {
                arenas.push(None);
                continue;
            }
            let k = self.slot_for(d.device)?;
            let ctx = Arc::clone(self.slot_ctx(k));
            let mem = DevMem::zeroed(&ctx, d.arena_bytes).map_err(|e| {
                let free = ctx.mem_get_info().ok().map(|(free, _)| free);
                let gpu = self.slot_name(k);
                BackendError::Device(arena_failure(&plan.device_name(d.device), d.arena_bytes, &gpu, free, &e))
            })?;
            arenas.push(Some(mem));
        }
        self.bind()?;
        Ok(arenas)
    }

    /// Load `plan` with its reserved `arenas` ([`CudaBackend::arenas`]):
    /// standalone (`part` None) every stream runs here; as a mixed
    /// session's part, only the streams of `part.served` devices, with the
    /// other parts' memory in `part.foreign` and bridged events as flags
    /// (`super::part`).
    pub(super) fn prepare(
        &mut self,
        plan: &Plan,
        comm: &Arc<dyn Comm>,
        arenas: Vec<Option<DevMem>>,
        part: Option<&PartPlan<'_>>,
    ) -> Result<Program, BackendError> {
        let bad = BackendError::BadPlan;
        let dev = BackendError::Device;
        self.bind()?;
        if arenas.len() != plan.devices.len() {
            return Err(bad(format!("{} arenas for {} plan devices", arenas.len(), plan.devices.len())));
        }
        let all = vec![true; plan.devices.len()];
        let served: &[bool] = part.map_or(&all, |p| p.served);
        let no_foreign = BTreeMap::new();
        let foreign = part.map_or(&no_foreign, |p| p.foreign);
        let streams_on = match part {
            Some(_) => served_streams(plan, served),
            None => vec![true; plan.streams.len()],
        };
        for v in &plan.variables {
            let here = plan.devices.iter().position(|d| d.device == v.device).is_none_or(|i| served[i]);
            let foreign_var = foreign.contains_key(&BufRef::Variable(v.name.clone()));
            if here && !foreign_var && !self.vars.contains_key(&v.name) {
                return Err(bad(format!("variable '{}' was not created before load", v.name)));
            }
        }
        for c in &plan.constants {
            if part.is_some() && !on_served(&c.buffer, served) {
                continue;
            }
            let d = self.resolve(plan, &arenas, &c.buffer).map_err(bad)?;
            self.bind_holder(&arenas, &c.buffer)?;
            if d.len != c.data.len() {
                return Err(bad(format!(
                    "constant {} has {} values for {} elements",
                    plan.ref_name(&c.buffer),
                    c.data.len(),
                    d.len
                )));
            }
            // SAFETY: `d` lies inside a live allocation (checked by `resolve`) of `d.len` 4-byte elements.
            let r = match d.dtype {
                DType::F32 => unsafe { drv::memcpy_htod_sync(d.ptr, &c.data) },
                _ => {
                    let v: Vec<i32> = c.data.iter().map(|x| *x as i32).collect();
                    unsafe { drv::memcpy_htod_sync(d.ptr, &v) }
                }
            };
            r.map_err(|e| dev(derr("uploading a constant", e)))?;
        }
        self.bind()?;
        if part.is_some() {
            let needed = [
                "cuStreamWaitValue32_v2",
                "cuStreamWriteValue32_v2",
                "cuMemHostGetDevicePointer_v2",
                "cuMemcpyHtoDAsync_v2",
                "cuMemcpyDtoHAsync_v2",
            ];
            super::libs::driver_exports(&needed, "a CUDA part of a mixed session").map_err(dev)?;
        }
        // Bridged events: which this part records, and their flags' device addresses.
        let recorded_here = recorded_by(plan, &streams_on);
        let bridged = |e: usize| part.is_some_and(|p| p.bridge.is_bridged(e));
        // The context of each stream (slot 0 for the streams of other parts).
        let mut stream_slot = Vec::with_capacity(plan.streams.len());
        for (s, on) in plan.streams.iter().zip(&streams_on) {
            stream_slot.push(if *on { self.slot_for(s.device)? } else { 0 });
        }
        let events = event_slots(plan, &stream_slot)
            .into_iter()
            .map(|k| Event::new(self.slot_ctx(k)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(dev)?;
        // One side buffer per context (its first word the step number).
        let mut sides: BTreeMap<usize, Side> = BTreeMap::new();
        let mut streams = Vec::new();
        for (si, s) in plan.streams.iter().enumerate() {
            let slot = stream_slot[si];
            let ctx = Arc::clone(self.slot_ctx(slot));
            ctx.bind_to_thread().map_err(|e| dev(derr("cuCtxSetCurrent", e)))?;
            if !streams_on[si] {
                // Another part runs this stream: an empty stream here keeps the plan's numbering.
                let stream = Stream::new(&ctx).map_err(dev)?;
                let (items, scratch) = (Vec::new(), Vec::new());
                streams.push(StreamRun {
                    items,
                    ctx,
                    blas: None,
                    _ws: None,
                    _scratch: scratch,
                    stream,
                    name: s.name(),
                });
                continue;
            }
            // Bridged events: the device addresses of their flags, in this stream's context.
            let calls = s.steps.iter().flat_map(|st| event_calls(st, &bridged, &recorded_here));
            let flags = flag_addresses(calls, plan.num_events, |e| {
                let Some(p) = part else { return Err(format!("event {e} is bridged without a bridge")) };
                if !p.bridge.pinned() {
                    return Err(format!(
                        "event {e} crosses parts, and the bridge's flags are in pageable host memory, which a GPU stream cannot write or wait on; make the mixed session with the CUDA backend's pinned host memory (towers_runtime::mixed::MixedBackend::with_cuda)"
                    ));
                }
                device_address(p.bridge.flag_addr(e)).map_err(|err| format!("the flag of bridged event {e}: {err}"))
            })
            .map_err(bad)?;
            let ws_mem = match stream_workspace_bytes(s) {
                0 => None,
                n => Some(DevMem::zeroed(&ctx, n).map_err(dev)?),
            };
            let ws_dev = ws_mem.as_ref().map(|m| Dev { ptr: m.ptr, len: m.bytes / 4, dtype: DType::F32 });
            let mut items: Vec<Item> = Vec::new();
            let mut scratch = Vec::new();
            for (j, step) in s.steps.iter().enumerate() {
                match step {
                    Step::Record(e) | Step::Wait(e) if *e >= plan.num_events => {
                        return Err(bad(format!("event {e} is out of range (the plan has {})", plan.num_events)))
                    }
                    Step::Record(_) | Step::Wait(_) => {
                        for call in event_calls(step, &bridged, &recorded_here) {
                            let flag =
                                |e: usize| flags.get(&e).copied().ok_or_else(|| bad(format!("no flag for event {e}")));
                            let (op, kernel) = match call {
                                EventCall::Record(e) => (Op::Record(e), "record"),
                                EventCall::Signal(e) => (Op::Signal { event: e, flag: flag(e)? }, "signal"),
                                EventCall::Wait(e) => (Op::Wait(e), "wait"),
                                EventCall::WaitFlag(e) => (Op::WaitFlag(flag(e)?), "wait_flag"),
                            };
                            items.push(Item { step: j, op, kernel, node: String::new() });
                        }
                    }
                    Step::Copy { from, to, bytes, node } => {
                        let end = |r: &BufRef| -> Result<(End, Option<usize>), String> {
                            match foreign.get(r) {
                                Some(l) => Ok((End::Foreign(*l), None)),
                                None => self.resolve(plan, &arenas, r).map(|d| (End::Own(d.ptr), Some(d.len))),
                            }
                        };
                        let (f, f_len) = end(from).map_err(bad)?;
                        let (t, t_len) = end(to).map_err(bad)?;
                        if [f_len, t_len].into_iter().flatten().any(|n| n * 4 != *bytes) {
                            return Err(bad(format!("copy '{node}' has mismatched buffers")));
                        }
                        let call =
                            copy_call(node, (f, &plan.ref_name(from)), (t, &plan.ref_name(to)), *bytes).map_err(bad)?;
                        let (src_ctx, dst_ctx) = (self.ctx_of(&arenas, from), self.ctx_of(&arenas, to));
                        let op = match call {
                            // Two contexts (one per logical GPU): a peer copy naming both.
                            CopyCall::DtoD { dst, src } if src_ctx != dst_ctx => match (src_ctx, dst_ctx) {
                                (Some(src_ctx), Some(dst_ctx)) => {
                                    Op::CopyPeer { dst, dst_ctx, src, src_ctx, bytes: *bytes }
                                }
                                _ => return Err(bad(format!("copy '{node}': the context of a buffer is unknown"))),
                            },
                            CopyCall::DtoD { dst, src } => Op::Copy { dst, src, bytes: *bytes },
                            CopyCall::HtoD { dst, src } => Op::CopyHtoD { dst, src, bytes: *bytes },
                            CopyCall::DtoH { dst, src } => Op::CopyDtoH { dst, src, bytes: *bytes },
                        };
                        items.push(Item { step: j, op, kernel: "copy", node: node.clone() });
                    }
                    Step::Broadcast { node, root, .. } => {
                        return Err(bad(format!(
                            "broadcast '{node}' from rank {root} (--variables ps across processes): the CUDA backend does not run parameter-server value broadcasts; train with --variables replicated (NCCL all-reduce) on GPUs, or run the ps program on the CPU backend"
                        )));
                    }
                    Step::Reduce { node, root, .. } => {
                        // A gradient bucket to its owner (--variables ps across
                        // processes): NCCL's ncclReduce would run here, but its
                        // sum order is not the rank order the CPU path promises.
                        return Err(bad(format!(
                            "reduce '{node}' to rank {root} (--variables ps across processes): the CUDA backend does not run parameter-server reduces; train with --variables replicated (NCCL all-reduce) on GPUs, or run the ps program on the CPU backend"
                        )));
                    }
                    Step::AllReduce { node, buffers } => {
                        if comm.world_size() == 1 && self.nccl_world().is_none() {
                            items.push(Item { step: j, op: Op::Nothing, kernel: "all_reduce", node: node.clone() });
                            continue;
                        }
                        if self.nccl_world() != Some(comm.world_size()) {
                            return Err(bad(format!(
                                "all-reduce '{node}': {} ranks ({}) need an NCCL communicator of as many ranks on the CUDA backend (build with --features nccl and set it up with CudaBackend::with_nccl over the same communicator)",
                                comm.world_size(),
                                comm.describe()
                            )));
                        }
                        if self.per_gpu {
                            return Err(bad(format!(
                                "all-reduce '{node}' across processes: NCCL runs in the backend's own context, and this bucket lies in a logical GPU's context of its own; share one context (towers train --cuda-contexts one, the default under several processes; or CudaBackend::with_context_per_gpu(false))"
                            )));
                        }
                        for r in buffers {
                            let d = self.resolve(plan, &arenas, r).map_err(bad)?;
                            if d.dtype != DType::F32 {
                                return Err(bad(format!(
                                    "all-reduce '{node}': buffer of {} (NCCL sums f32 here)",
                                    d.dtype
                                )));
                            }
                            let op = Op::AllReduce { ptr: d.ptr, count: d.len };
                            items.push(Item { step: j, op, kernel: "all_reduce", node: node.clone() });
                        }
                    }
                    Step::Launch { kernel, inputs, outputs, workspace, node } => {
                        let here = Some(ctx.cu_ctx());
                        if let Some(r) = inputs
                            .iter()
                            .chain(outputs)
                            .chain(workspace)
                            .find(|r| self.ctx_of(&arenas, r).is_some_and(|c| Some(c) != here))
                        {
                            return Err(bad(format!(
                                "node '{node}' on {} names {}, which lies in another logical GPU's CUDA context: a kernel reads only its own device's memory (the plan must copy it first)",
                                plan.device_name(s.device),
                                plan.ref_name(r)
                            )));
                        }
                        let res = |v: &[BufRef]| {
                            v.iter().map(|r| self.resolve(plan, &arenas, r)).collect::<Result<Vec<_>, _>>()
                        };
                        let ins = res(inputs).map_err(bad)?;
                        let outs = res(outputs).map_err(bad)?;
                        let mut ws =
                            workspace.as_ref().map(|r| self.resolve(plan, &arenas, r)).transpose().map_err(bad)?;
                        if is_conv(kernel) {
                            ws = ws_dev;
                        }
                        if let Kernel::TowerMatMulApply { m, n, .. } = kernel {
                            // The fused product's own scratch (the CPU needs none).
                            let mem = DevMem::zeroed(&ctx, m * n * 4).map_err(dev)?;
                            ws = Some(Dev { ptr: mem.ptr, len: m * n, dtype: DType::F32 });
                            scratch.push(mem);
                        }
                        let mut ops = Vec::new();
                        let side = sides.entry(slot).or_default();
                        lower_launch(kernel, &ins, &outs, ws, self.slot_modules(slot), side, &mut ops).map_err(
                            |e| {
                                if e.starts_with("NVRTC") || e.starts_with("cu") {
                                    dev(format!("node '{node}' ({}): {e}", kernel.name()))
                                } else {
                                    bad(format!(
                                        "node '{node}': the CUDA backend cannot run kernel {}: {e}",
                                        kernel.name()
                                    ))
                                }
                            },
                        )?;
                        items.extend(ops.into_iter().map(|op| Item {
                            step: j,
                            op,
                            kernel: kernel.name(),
                            node: node.clone(),
                        }));
                    }
                }
            }
            let stream = Stream::new(&ctx).map_err(dev)?;
            let blas = if items.iter().any(|i| matches!(i.op, Op::Gemm(_))) {
                Some(Blas::new(&ctx, stream.raw).map_err(dev)?)
            } else {
                None
            };
            streams.push(StreamRun { items, ctx, blas, _ws: ws_mem, _scratch: scratch, stream, name: s.name() });
        }
        // Slot 0's side buffer always exists (the standalone path's one buffer).
        sides.entry(0).or_default();
        let mut side_mems = Vec::with_capacity(sides.len());
        let mut step_cells = Vec::new();
        for (&slot, side) in &sides {
            let ctx = Arc::clone(self.slot_ctx(slot));
            // Never empty: its first word is the step number (`args::STEP_CELL`).
            let side_mem = DevMem::zeroed(&ctx, side.bytes.len()).map_err(dev)?;
            // SAFETY: `side_mem` holds `side.bytes.len()` bytes, in the context `zeroed` bound.
            unsafe { drv::memcpy_htod_sync(side_mem.ptr, &side.bytes) }
                .map_err(|e| dev(derr("uploading launch tables", e)))?;
            let mut uses_step = false;
            for (st, _) in streams.iter_mut().zip(&stream_slot).filter(|(_, k)| **k == slot) {
                for it in &mut st.items {
                    if let Op::Kernel(k) = &mut it.op {
                        k.args.patch_side(side_mem.ptr);
                        uses_step |= k.args.uses_step;
                    }
                }
            }
            if uses_step {
                step_cells.push((ctx, side_mem.ptr + args::STEP_CELL as u64));
            }
            side_mems.push(side_mem);
        }
        self.bind()?;
        let fed: Vec<&BufRef> =
            plan.feeds.iter().map(|(_, r)| r).filter(|r| part.is_none() || on_served(r, served)).collect();
        let feed_ctx = match fed.first() {
            Some(r) => self.ctx_of(&arenas, r),
            None => None,
        };
        if let Some(r) = fed.iter().find(|r| self.ctx_of(&arenas, r) != feed_ctx) {
            return Err(bad(format!(
                "the feeds lie in several CUDA contexts ({} among them); feed one device's buffers, or share one context (towers train --cuda-contexts one, or CudaBackend::with_context_per_gpu(false))",
                plan.ref_name(r)
            )));
        }
        let feed_slot = match fed.first() {
            Some(BufRef::Arena { device, .. }) => match plan.devices.get(*device) {
                Some(d) => self.slot_for(d.device)?,
                None => 0,
            },
            _ => 0,
        };
        let feeds_ctx = Arc::clone(self.slot_ctx(feed_slot));
        let has_feeds = !fed.is_empty();
        let feeds = Feeds::new(&feeds_ctx, fed.into_iter(), |r| self.resolve(plan, &arenas, r)).map_err(dev)?;
        self.bind()?;
        let mut ctxs: Vec<Arc<CudaContext>> = Vec::new();
        let busy = streams.iter().filter(|s| !s.items.is_empty()).map(|s| &s.ctx);
        for c in busy.chain(has_feeds.then_some(&feeds_ctx)) {
            if !ctxs.iter().any(|k| Arc::ptr_eq(k, c)) {
                ctxs.push(Arc::clone(c));
            }
        }
        let order = match part {
            // The whole plan's order: see `super::part` (stream memory waits).
            Some(_) => {
                let global = crate::cpu::global_order(plan).map_err(bad)?;
                let steps: Vec<Vec<usize>> = streams.iter().map(|s| s.items.iter().map(|i| i.step).collect()).collect();
                part_order(&global, &steps).map_err(bad)?
            }
            None => enqueue_order(&streams, plan.num_events).map_err(bad)?,
        };
        let graph = graph_state(self.graphs, &streams, ctxs.len());
        Ok(Program {
            graph,
            feeds,
            plan: plan.clone(),
            order,
            streams,
            events,
            arenas,
            _side: side_mems,
            step_cells,
            ctxs,
            runs: 0,
            profiling: false,
            tracer: None,
            tracing: false,
            loaded: Instant::now(),
            profile: BTreeMap::new(),
            bridge: part.map(|p| Arc::clone(p.bridge)),
            streams_on,
        })
    }
}

fn is_conv(k: &Kernel) -> bool {
    matches!(
        k,
        Kernel::Conv2D { .. }
            | Kernel::Conv2DBiasAct { .. }
            | Kernel::Conv2DBackpropInput { .. }
            | Kernel::Conv2DBackpropFilter { .. }
    )
}

/// The workspace one stream's convolutions share (they run one after the
/// other on it). The plan sizes its workspace for the CPU: a chunk of
/// about 64K floats that stays in cache, which on a GPU means dozens of
/// small im2col + GEMM launches per convolution; here each convolution gets
/// its whole column matrix (up to `towers_kernels::launch::MAX_WORKSPACE_BYTES`), so an
/// MNIST-sized convolution is one im2col and one GEMM. Allocated at load.
fn stream_workspace_bytes(s: &towers_codegen::StreamPlan) -> usize {
    let mut bytes = 0;
    for step in &s.steps {
        if let Step::Launch {
            kernel:
                Kernel::Conv2D { geom, .. }
                | Kernel::Conv2DBiasAct { geom, .. }
                | Kernel::Conv2DBackpropInput { geom, .. }
                | Kernel::Conv2DBackpropFilter { geom, .. },
            ..
        } = step
        {
            bytes = bytes.max(towers_kernels::launch::conv_workspace_floats(geom) * 4);
        }
    }
    bytes
}

/// The host's enqueue order: round robin over the streams, each advancing
/// until a `Wait` on an event not yet recorded in this step. A CUDA wait
/// sees the last record *enqueued* before it, so every record must be
/// enqueued first; a plan where that is impossible would deadlock.
fn enqueue_order(streams: &[StreamRun], num_events: usize) -> Result<Vec<(usize, usize)>, String> {
    let mut pos = vec![0usize; streams.len()];
    let mut recorded = vec![false; num_events];
    let mut order = Vec::new();
    loop {
        let mut progress = false;
        for (s, st) in streams.iter().enumerate() {
            while pos[s] < st.items.len() {
                match st.items[pos[s]].op {
                    Op::Wait(e) if !recorded[e] => break,
                    Op::Record(e) => recorded[e] = true,
                    _ => {}
                }
                order.push((s, pos[s]));
                pos[s] += 1;
                progress = true;
            }
        }
        if pos.iter().zip(streams).all(|(p, s)| *p == s.items.len()) {
            return Ok(order);
        }
        if !progress {
            let stuck: Vec<String> = streams
                .iter()
                .zip(&pos)
                .filter(|(s, p)| **p < s.items.len())
                .map(|(s, p)| format!("{} at step {p}", s.name))
                .collect();
            return Err(format!("the streams wait on events never recorded before them: {}", stuck.join(", ")));
        }
    }
}

/// Whether a program's steps can replay a graph ([`graph`]'s invariants):
/// graphs wanted, one context, and no all-reduce across processes (argument lists never
/// change after load: dropout reads its step from device memory).
fn graph_state(wanted: bool, streams: &[StreamRun], contexts: usize) -> GraphState {
    let all_reduce = streams.iter().flat_map(|s| &s.items).find(|it| matches!(it.op, Op::AllReduce { .. }));
    match eager_because(wanted, all_reduce.map(|it| it.node.as_str()), contexts) {
        Some(why) => GraphState::Eager(why),
        None => GraphState::Pending,
    }
}

/// Why a program must launch eagerly, if it must: graphs not `wanted`, an
/// all-reduce across processes (its node), or streams in several contexts.
fn eager_because(wanted: bool, all_reduce: Option<&str>, contexts: usize) -> Option<String> {
    if !wanted {
        return Some("CUDA graphs are turned off".into());
    }
    if contexts > 1 {
        return Some(format!(
            "the program's streams span {contexts} CUDA contexts, one per logical GPU, and this backend captures one context's streams only"
        ));
    }
    all_reduce.map(|node| format!("'{node}' is an all-reduce across processes"))
}

/// The error of an arena that could not be allocated: the logical device,
/// the arena's size, the GPU serving it, its free memory when known, and
/// the driver's error.
pub(super) fn arena_failure(device: &str, bytes: usize, gpu: &str, free: Option<usize>, err: &str) -> String {
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let free = free.map_or_else(String::new, |f| format!(", {:.1} MiB free", mib(f)));
    format!(
        "{device}: its arena of {bytes} bytes ({:.1} MiB) does not fit on {gpu}{free} ({err}); use a smaller batch, fewer towers per GPU, or --variables cpu",
        mib(bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_run_eagerly_for_a_reason() {
        assert_eq!(eager_because(true, None, 1), None);
        assert_eq!(eager_because(true, None, 0), None);
        assert!(eager_because(false, None, 1).is_some_and(|w| w.contains("turned off")));
        assert!(eager_because(true, None, 3).is_some_and(|w| w.contains("span 3 CUDA contexts")));
        assert!(eager_because(true, Some("grads/all_reduce"), 1).is_some_and(|w| w.contains("'grads/all_reduce'")));
    }

    #[test]
    fn an_arena_that_does_not_fit_names_its_device_and_size() {
        let m = arena_failure("gpu:1", 3 << 20, "GPU 0 (H100)", Some(1 << 20), "cuMemAlloc: OUT_OF_MEMORY");
        assert!(m.starts_with("gpu:1: its arena of 3145728 bytes (3.0 MiB)"), "{m}");
        assert!(m.contains("GPU 0 (H100), 1.0 MiB free") && m.contains("OUT_OF_MEMORY"), "{m}");
        assert!(!arena_failure("cpu:0", 4, "GPU 0", None, "e").contains("free"));
    }
}
