//! CUDA graphs: one training step captured once and replayed.
//!
//! An MNIST-sized step is a few dozen launches of a few microseconds each,
//! so the host's launch calls are a large part of it. After a program's
//! first step has run eagerly (which also warms cuBLAS's lazy set-up), the
//! backend enqueues the same step once more under stream capture and
//! instantiates the result; every later step is one `cuGraphLaunch`.
//!
//! Capture shape (the usual fork/join): an origin stream begins a
//! thread-local capture and records `fork`; every plan stream waits on
//! `fork`, which pulls it into the capture; the step's items are enqueued in
//! the program's order exactly as an eager step would (launches, SGEMMs,
//! copies, the plan's own records and waits); then every plan stream records
//! its own `join` event and the origin waits on all of them before the
//! capture ends. Capture enqueues nothing that runs.
//!
//! Invariants:
//! - A graph replays the same kernels with the same arguments in the same
//!   per-stream order as an eager step, so its results are bit-identical to
//!   an eager step's (tested on a GPU in `runtime/tests/cuda_backend.rs`).
//! - Only programs whose argument lists never change between steps are
//!   captured: a program with dropout (whose step counter is patched into
//!   its arguments every run) or with a cross-process all-reduce runs
//!   eagerly, and [`GraphState::Eager`] says why.
//! - Buffers, variables and the side table have fixed device addresses for
//!   the program's life (allocated at load), so feeds and variable writes
//!   between replays are seen by the next replay.
//! - A capture that fails is ended (the streams leave capture mode) and the
//!   program stays eager for good, with the driver's error as the reason;
//!   nothing panics.

use std::sync::Arc;

use cudarc::driver::{result as drv, sys, CudaContext};

use super::driver::{derr, Event, Stream};

/// An instantiated graph with the origin stream it launches on.
pub(crate) struct StepGraph {
    exec: sys::CUgraphExec,
    pub origin: Stream,
    ctx: Arc<CudaContext>,
}

impl StepGraph {
    /// Capture what `enqueue` puts on `streams` (raw handles of the plan's
    /// streams) as one graph. `enqueue` must only enqueue work on those
    /// streams; its error, or the driver's, ends the capture and is returned.
    pub fn capture(
        ctx: &Arc<CudaContext>,
        streams: &[sys::CUstream],
        enqueue: impl FnOnce() -> Result<(), String>,
    ) -> Result<StepGraph, String> {
        let origin = Stream::new(ctx)?;
        let fork = Event::new(ctx)?;
        let joins = streams.iter().map(|_| Event::new(ctx)).collect::<Result<Vec<_>, _>>()?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: a live stream of the bound context.
        unsafe { drv::stream::begin_capture(origin.raw, mode) }.map_err(|e| derr("cuStreamBeginCapture", e))?;
        let body = || -> Result<(), String> {
            // SAFETY: live events and streams of this context; the origin is capturing.
            unsafe {
                drv::event::record(fork.raw, origin.raw).map_err(|e| derr("cuEventRecord (fork)", e))?;
                for &s in streams {
                    drv::stream::wait_event(s, fork.raw, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
                        .map_err(|e| derr("cuStreamWaitEvent (fork)", e))?;
                }
            }
            enqueue()?;
            // SAFETY: as above.
            unsafe {
                for (&s, j) in streams.iter().zip(&joins) {
                    drv::event::record(j.raw, s).map_err(|e| derr("cuEventRecord (join)", e))?;
                    drv::stream::wait_event(origin.raw, j.raw, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
                        .map_err(|e| derr("cuStreamWaitEvent (join)", e))?;
                }
            }
            Ok(())
        };
        let captured = body();
        // Always end the capture, so the streams leave capture mode.
        // SAFETY: the origin began the capture above.
        let ended = unsafe { drv::stream::end_capture(origin.raw) };
        captured?;
        let graph = ended.map_err(|e| derr("cuStreamEndCapture", e))?;
        // SAFETY: a graph just captured; destroyed once instantiated (the exec keeps its own copy).
        let exec = unsafe {
            let exec = drv::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0));
            let _ = drv::graph::destroy(graph);
            exec.map_err(|e| derr("cuGraphInstantiate", e))?
        };
        // SAFETY: a live exec and stream; uploading ahead keeps the first replay's set-up out of the step.
        unsafe { drv::graph::upload(exec, origin.raw) }.map_err(|e| derr("cuGraphUpload", e))?;
        Ok(StepGraph { exec, origin, ctx: Arc::clone(ctx) })
    }

    /// Enqueue one replay on the origin stream.
    pub fn launch(&self) -> Result<(), String> {
        // SAFETY: a live exec and stream of the bound context.
        unsafe { drv::graph::launch(self.exec, self.origin.raw) }.map_err(|e| derr("cuGraphLaunch", e))
    }
}

impl Drop for StepGraph {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: instantiated by `capture`, destroyed once; the origin is synchronized first.
        unsafe {
            let _ = drv::stream::synchronize(self.origin.raw);
            let _ = drv::graph::exec_destroy(self.exec);
        }
    }
}

/// Whether a program's steps replay a graph.
pub(crate) enum GraphState {
    /// Graphs are wanted: capture after the next eager step.
    Pending,
    /// Steps replay this graph.
    Ready(StepGraph),
    /// Steps run eagerly, for this reason.
    Eager(String),
}

impl GraphState {
    /// One line for the backend note: `steps replay a CUDA graph` or why not.
    pub fn describe(&self) -> String {
        match self {
            GraphState::Pending => "steps will replay a CUDA graph after the first".into(),
            GraphState::Ready(_) => "steps replay a CUDA graph".into(),
            GraphState::Eager(why) => format!("steps launch eagerly ({why})"),
        }
    }
}
