//! Running a loaded program on the CUDA backend: one step, eager or
//! replayed as a CUDA graph ([`CudaBackend::run_step`], called by
//! `Backend::run`).
//!
//! An eager step walks the program's host order ([`enqueue`]): launches
//! (`cuLaunchKernel`), cuBLAS SGEMMs ([`gemm`]), device-to-device
//! `cuMemcpyAsync` copies, `cuEventRecord` / `cuStreamWaitEvent`, NCCL
//! all-reduces; then the context is synchronized, so `run` returns with the
//! step complete. Dropout reads the step number (the program's run count)
//! from the side buffer's first word, written here before the step.
//!
//! CUDA graphs (`super::graph`): after a program's first eager step (which
//! also sets cuBLAS up), the same [`enqueue`] runs once more under stream
//! capture and every later step is one `cuGraphLaunch` of the result,
//! bit for bit what the eager step computes, since the items and their
//! arguments never change after load. A profiled or traced step always
//! runs eagerly: profiling synchronizes and times each item on the host,
//! tracing records timing events around every plan step.
//!
//! Invariants: a step allocates nothing on the host; the streams a step
//! starts on wait (on the GPU) for the feeds staged since the last step;
//! an item's failure names its node ([`BackendError::Kernel`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result as drv, sys, CudaContext};

use super::driver::{derr, Event};
use super::graph::{GraphState, StepGraph};
use super::lower::{Gemm, Op};
#[cfg(feature = "nccl")]
use super::nccl;
use super::trace::Tracer;
use super::{CudaBackend, StreamRun};
use crate::backend::{BackendError, ProgramId};

impl CudaBackend {
    pub(super) fn run_step(&mut self, id: ProgramId) -> Result<(), BackendError> {
        self.bind()?;
        let ctx = Arc::clone(&self.ctx);
        #[cfg(feature = "nccl")]
        let nccl = self.nccl.as_ref();
        let p = self.programs.get_mut(id.0).ok_or_else(|| BackendError::Access(format!("no program {}", id.0)))?;
        // Every context the program uses (the backend's own when it uses none).
        let ctxs: Vec<Arc<CudaContext>> = if p.ctxs.is_empty() { vec![Arc::clone(&ctx)] } else { p.ctxs.clone() };
        let sync = || -> Result<(), BackendError> {
            for c in &ctxs {
                c.synchronize()
                    .map_err(|e| BackendError::Device(derr("the step failed on the GPU (cuCtxSynchronize)", e)))?;
            }
            ctx.bind_to_thread().map_err(|e| BackendError::Device(derr("cuCtxSetCurrent", e)))
        };
        for (c, cell) in &p.step_cells {
            c.bind_to_thread().map_err(|e| BackendError::Device(derr("cuCtxSetCurrent", e)))?;
            // SAFETY: the side buffer's first 8 bytes, in the bound context; the previous step has completed.
            unsafe { drv::memcpy_htod_sync(*cell, &[p.runs]) }
                .map_err(|e| BackendError::Device(derr("writing the step number", e)))?;
        }
        ctx.bind_to_thread().map_err(|e| BackendError::Device(derr("cuCtxSetCurrent", e)))?;
        let eager = p.profiling || p.tracing;
        if let (GraphState::Ready(g), false) = (&p.graph, eager) {
            // The replay starts on the graph's origin stream: it waits there for the staged feeds.
            p.feeds.order_before_step(std::iter::once(g.origin.raw)).map_err(BackendError::Device)?;
            ctxs[0].bind_to_thread().map_err(|e| BackendError::Device(derr("cuCtxSetCurrent", e)))?;
            g.launch().map_err(BackendError::Device)?;
            sync()?;
            p.feeds.completed();
            p.runs += 1;
            return Ok(());
        }
        p.feeds.order_before_step(p.streams.iter().map(|s| s.stream.raw)).map_err(BackendError::Device)?;
        let started = Instant::now();
        let tracer = if p.tracing { p.tracer.as_ref() } else { None };
        if let Some(t) = tracer {
            let streams = &p.streams;
            // SAFETY: each plan stream's live stream, of that stream's context.
            unsafe { t.start(|s| streams[s].stream.raw) }.map_err(BackendError::Device)?;
            ctx.bind_to_thread().map_err(|e| BackendError::Device(derr("cuCtxSetCurrent", e)))?;
        }
        let profile = if p.profiling { Some(&mut p.profile) } else { None };
        enqueue(
            &ctx,
            &mut p.streams,
            &p.events,
            &p.order,
            #[cfg(feature = "nccl")]
            nccl,
            profile,
            tracer,
        )?;
        sync()?;
        p.feeds.completed();
        if let (true, Some(t)) = (p.tracing, p.tracer.as_mut()) {
            let start_ns = started.duration_since(p.loaded).as_nanos() as u64;
            let wall_ns = started.elapsed().as_nanos() as u64;
            let streams = &p.streams;
            let ran = |s: usize, j: usize| streams[s].items.iter().any(|i| i.step == j);
            t.finish(p.runs, start_ns, wall_ns, ran).map_err(BackendError::Device)?;
        }
        p.runs += 1;
        if let (GraphState::Pending, false) = (&p.graph, eager) {
            // The first eager step has run (cuBLAS is set up): capture the next.
            // One context (`graph_state`): its streams, the origin made in it.
            let cap = Arc::clone(&ctxs[0]);
            let raw: Vec<sys::CUstream> =
                p.streams.iter().filter(|s| Arc::ptr_eq(&s.ctx, &cap)).map(|s| s.stream.raw).collect();
            let (streams, events, order) = (&mut p.streams, &p.events, &p.order);
            let captured = StepGraph::capture(&cap, &raw, || {
                enqueue(
                    &cap,
                    streams,
                    events,
                    order,
                    #[cfg(feature = "nccl")]
                    nccl,
                    None,
                    None,
                )
                .map_err(|e| e.to_string())
            });
            p.graph = match captured {
                Ok(g) => GraphState::Ready(g),
                Err(why) => GraphState::Eager(format!("capturing the step as a CUDA graph failed: {why}")),
            };
        }
        Ok(())
    }
}

/// A row-major GEMM as cuBLAS's column-major `c^T = op(b)^T op(a)^T`; a
/// batch of them (`batch > 1`) as one `cublasSgemmStridedBatched`, the
/// strides swapping places with the operands.
///
/// # Safety
/// The handle and every pointer are live; the sizes match the buffers.
unsafe fn gemm(h: blas_sys::cublasHandle_t, g: &Gemm) -> Result<(), String> {
    use blas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
    let (op_a, lda) = if g.ta { (CUBLAS_OP_T, g.m) } else { (CUBLAS_OP_N, g.k) };
    let (op_b, ldb) = if g.tb { (CUBLAS_OP_T, g.k) } else { (CUBLAS_OP_N, g.n) };
    if g.batch != 1 {
        let [sa, sb, sc] = g.strides;
        return blas::sgemm_strided_batched(
            h,
            op_b,
            op_a,
            g.n as i32,
            g.m as i32,
            g.k as i32,
            &g.alpha,
            g.b as *const f32,
            ldb.max(1) as i32,
            sb as i64,
            g.a as *const f32,
            lda.max(1) as i32,
            sa as i64,
            &g.beta,
            g.c as *mut f32,
            g.n.max(1) as i32,
            sc as i64,
            g.batch as i32,
        )
        .map_err(|e| derr("cublasSgemmStridedBatched", e));
    }
    blas::sgemm(
        h,
        op_b,
        op_a,
        g.n as i32,
        g.m as i32,
        g.k as i32,
        &g.alpha,
        g.b as *const f32,
        ldb.max(1) as i32,
        g.a as *const f32,
        lda.max(1) as i32,
        &g.beta,
        g.c as *mut f32,
        g.n.max(1) as i32,
    )
    .map_err(|e| derr("cublasSgemm", e))
}

/// Enqueue one step: every item in the program's host order, on its
/// stream, with the stream's context bound (`bound` is bound on return). With `profile`, each item is synchronized and
/// timed on the host.
#[allow(clippy::too_many_arguments)]
fn enqueue(
    bound: &Arc<CudaContext>,
    streams: &mut [StreamRun],
    events: &[Event],
    order: &[(usize, usize)],
    #[cfg(feature = "nccl")] nccl: Option<&nccl::NcclComm>,
    mut profile: Option<&mut BTreeMap<(usize, usize), u64>>,
    tracer: Option<&Tracer>,
) -> Result<(), BackendError> {
    // Nothing known bound: the first item binds its stream's context.
    let mut current: *const CudaContext = std::ptr::null();
    let bind = |c: &Arc<CudaContext>, current: &mut *const CudaContext| -> Result<(), BackendError> {
        if Arc::as_ptr(c) != *current {
            c.bind_to_thread().map_err(|e| BackendError::Device(derr("cuCtxSetCurrent", e)))?;
            *current = Arc::as_ptr(c);
        }
        Ok(())
    };
    for &(s, k) in order {
        let st = &mut streams[s];
        bind(&st.ctx, &mut current)?;
        let stream = st.stream.raw;
        let t0 = profile.is_some().then(Instant::now);
        let step = st.items[k].step;
        let first = k == 0 || st.items[k - 1].step != step;
        let last = st.items.get(k + 1).is_none_or(|i| i.step != step);
        let mark = |end: bool| -> Result<(), BackendError> {
            match tracer {
                // SAFETY: a live stream of this context.
                Some(t) => unsafe { t.mark(s, step, end, stream) }.map_err(BackendError::Device),
                None => Ok(()),
            }
        };
        if first {
            mark(false)?;
        }
        let item = &mut st.items[k];
        // SAFETY: every handle and device address was created or checked at load and lives as long as the program.
        let r = unsafe {
            match &mut item.op {
                Op::Kernel(l) => {
                    drv::launch_kernel(l.f, (l.grid, 1, 1), (l.block, 1, 1), l.smem, stream, l.args.params())
                        .map_err(|e| derr("cuLaunchKernel", e))
                }
                Op::Gemm(g) => match &st.blas {
                    Some(b) => gemm(b.raw, g),
                    None => Err("no cuBLAS handle on this stream".into()),
                },
                Op::Copy { dst, src, bytes } => {
                    drv::memcpy_dtod_async(*dst, *src, *bytes, stream).map_err(|e| derr("cuMemcpyDtoDAsync", e))
                }
                Op::CopyHtoD { dst, src, bytes } => {
                    sys::cuMemcpyHtoDAsync_v2(*dst, *src as *const std::ffi::c_void, *bytes, stream)
                        .result()
                        .map_err(|e| derr("cuMemcpyHtoDAsync from pinned host memory", e))
                }
                Op::CopyDtoH { dst, src, bytes } => {
                    sys::cuMemcpyDtoHAsync_v2(*dst as *mut std::ffi::c_void, *src, *bytes, stream)
                        .result()
                        .map_err(|e| derr("cuMemcpyDtoHAsync to pinned host memory", e))
                }
                Op::Signal { flag, .. } => sys::cuStreamWriteValue32_v2(
                    stream,
                    *flag,
                    1,
                    sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
                )
                .result()
                .map_err(|e| derr("cuStreamWriteValue32 (bridged event)", e)),
                Op::WaitFlag(flag) => sys::cuStreamWaitValue32_v2(
                    stream,
                    *flag,
                    1,
                    sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
                )
                .result()
                .map_err(|e| derr("cuStreamWaitValue32 (bridged event)", e)),
                Op::CopyPeer { dst, dst_ctx, src, src_ctx, bytes } => {
                    sys::cuMemcpyPeerAsync(*dst, *dst_ctx, *src, *src_ctx, *bytes, stream)
                        .result()
                        .map_err(|e| derr("cuMemcpyPeerAsync", e))
                }
                Op::Record(e) => drv::event::record(events[*e].raw, stream).map_err(|e| derr("cuEventRecord", e)),
                Op::Wait(e) => {
                    drv::stream::wait_event(stream, events[*e].raw, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
                        .map_err(|e| derr("cuStreamWaitEvent", e))
                }
                Op::Nothing => Ok(()),
                #[cfg(feature = "nccl")]
                Op::AllReduce { ptr, count } => match nccl {
                    Some(n) => n.all_reduce_in_place(*ptr, *count, stream as *mut std::ffi::c_void),
                    None => Err("no NCCL communicator".into()),
                },
                #[cfg(not(feature = "nccl"))]
                Op::AllReduce { ptr, count } => {
                    Err(format!("the sum of {count} f32 at {ptr:#x} needs NCCL: build with --features nccl"))
                }
            }
        };
        r.map_err(|detail| BackendError::Kernel { node: item.node.clone(), detail })?;
        if last {
            mark(true)?;
        }
        if let (Some(t0), Some(profile)) = (t0, profile.as_deref_mut()) {
            // SAFETY: a live stream.
            unsafe { drv::stream::synchronize(stream) }.map_err(|e| BackendError::Kernel {
                node: item.node.clone(),
                detail: derr("cuStreamSynchronize", e),
            })?;
            *profile.entry((s, k)).or_insert(0) += t0.elapsed().as_nanos() as u64;
        }
    }
    bind(bound, &mut current)
}
