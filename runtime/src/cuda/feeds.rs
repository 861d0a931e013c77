//! Feeds written in place on the CUDA backend: one pinned staging buffer
//! per fed placeholder.
//!
//! A feed copied from the caller's pageable memory (`write_buffer`) goes
//! through the driver's own bounce buffers at about 12 GB/s on an H200. A
//! feed written in place (`Session::feed_with_*`) instead fills a
//! page-locked (pinned) host buffer made at load, which the copy engine
//! reads by DMA directly: when the caller's closure returns, one
//! `cuMemcpyHtoDAsync` on the program's own copy stream moves it to the
//! feed's device buffer and the host goes on (it may fill the next feed
//! while the first one crosses the bus).
//!
//! Invariants:
//! - **Staging is never rewritten under a copy.** Each staging buffer has
//!   an event recorded after the copy that reads it; lending it again first
//!   waits for that event, so the DMA reads exactly what the closure wrote.
//! - **The next step reads the feed.** `run` records `fed` on the copy
//!   stream after the last copy and, before enqueuing anything, makes the
//!   streams the step starts on wait for it on the GPU: every plan stream
//!   for an eager step, the origin stream a CUDA graph is launched on for a
//!   replayed one (the graph's first nodes follow it in stream order). The
//!   waits are enqueued outside any capture, so no graph holds them.
//! - **Host accesses stay ordered.** `write_buffer` and `read_buffer` use
//!   synchronous copies on the legacy stream, which the backend's
//!   non-blocking streams are not ordered with: they synchronize the copy
//!   stream first ([`Feeds::settle`]), so a read sees the feed and a write
//!   is not overtaken by an older staged copy.
//! - `run` ends with `cuCtxSynchronize`: afterwards no copy is in flight
//!   ([`Feeds::completed`]).
//! - **Drop order**: the copy stream is dropped (synchronized) before the
//!   pinned memory is freed, and a program drops its `Feeds` before its
//!   device arenas.
//! - Lending allocates nothing: staging, events and the stream are made at
//!   load. The staging is zeroed at load, so the lent memory is always
//!   initialized: zeros, then whatever was last lent for that feed.

use std::sync::Arc;

use cudarc::driver::{result as drv, sys, CudaContext};
use towers_codegen::{BufRef, Plan};

use super::driver::{derr, Event, PinnedStaging, Stream};
use super::lower::Dev;
use crate::backend::{BackendError, HostSliceMut};

/// The staging of one fed buffer.
struct Staged {
    buf: BufRef,
    dst: Dev,
    /// Recorded on the copy stream after the copy that reads `host`.
    done: Event,
    /// Whether a copy reading `host` may still run (`done` not waited for).
    in_flight: bool,
    host: PinnedStaging,
}

/// A program's feed staging (see the module docs). Field order is drop
/// order: the copy stream (synchronized on drop) before the memory.
pub(crate) struct Feeds {
    copy: Option<Stream>,
    /// The context of the copy stream and the fed buffers (bound by every method).
    ctx: Arc<CudaContext>,
    fed: Option<Event>,
    staged: Vec<Staged>,
    /// Whether a copy was enqueued since the last completed step.
    pending: bool,
}

impl Feeds {
    /// Pinned staging for every buffer of `feeds` (once per buffer),
    /// whose device range `resolve` gives.
    pub fn new<'a>(
        ctx: &Arc<CudaContext>,
        feeds: impl Iterator<Item = &'a BufRef>,
        resolve: impl Fn(&BufRef) -> Result<Dev, String>,
    ) -> Result<Feeds, String> {
        let mut staged: Vec<Staged> = Vec::new();
        for r in feeds {
            if staged.iter().any(|s| &s.buf == r) {
                continue;
            }
            let dst = resolve(r)?;
            let host = PinnedStaging::zeroed(ctx, dst.len * 4)?;
            staged.push(Staged { buf: r.clone(), dst, done: Event::new(ctx)?, in_flight: false, host });
        }
        let (copy, fed) =
            if staged.is_empty() { (None, None) } else { (Some(Stream::new(ctx)?), Some(Event::new(ctx)?)) };
        Ok(Feeds { copy, ctx: Arc::clone(ctx), fed, staged, pending: false })
    }

    /// Lend `fill` the staging of feed buffer `r`, then enqueue its copy to
    /// the device. The context is bound by the caller.
    pub fn lend(
        &mut self,
        plan: &Plan,
        r: &BufRef,
        fill: &mut dyn FnMut(HostSliceMut<'_>),
    ) -> Result<(), BackendError> {
        let (Some(copy), Some(s)) = (&self.copy, self.staged.iter_mut().find(|s| &s.buf == r)) else {
            return Err(BackendError::Access(format!("{} is not a feed buffer", plan.ref_name(r))));
        };
        let dev = |what: &str, e| BackendError::Device(derr(what, e));
        self.ctx.bind_to_thread().map_err(|e| dev("cuCtxSetCurrent", e))?;
        if s.in_flight {
            // SAFETY: a live event of this context.
            unsafe { drv::event::synchronize(s.done.raw) }.map_err(|e| dev("cuEventSynchronize (staging)", e))?;
            s.in_flight = false;
        }
        let Some(lent) = s.host.slice_mut(s.dst.dtype, s.dst.len) else {
            return Err(BackendError::Access(format!("the staging of {} is smaller than it", plan.ref_name(r))));
        };
        fill(lent);
        let bytes = s.dst.len * 4;
        // SAFETY: `host` holds at least `bytes` bytes (checked by
        // `slice_mut` above) and stays allocated and unwritten until `done`
        // has been waited for (module invariants); `dst` is a live device
        // range of `bytes` bytes (resolved at load); `copy` is a live stream
        // of the bound context.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(s.dst.ptr, s.host.as_ptr(), bytes, copy.raw)
                .result()
                .map_err(|e| dev("cuMemcpyHtoDAsync from pinned staging", e))?;
            drv::event::record(s.done.raw, copy.raw).map_err(|e| dev("cuEventRecord (staging)", e))?;
        }
        s.in_flight = true;
        self.pending = true;
        Ok(())
    }

    /// Before a step: make `streams` (those the step starts on) wait on
    /// the GPU for the copies enqueued since the last step.
    pub fn order_before_step(&mut self, streams: impl Iterator<Item = sys::CUstream>) -> Result<(), String> {
        let (true, Some(copy), Some(fed)) = (self.pending, &self.copy, &self.fed) else { return Ok(()) };
        self.ctx.bind_to_thread().map_err(|e| derr("cuCtxSetCurrent", e))?;
        // SAFETY: live streams and events of the bound context.
        unsafe {
            drv::event::record(fed.raw, copy.raw).map_err(|e| derr("cuEventRecord (feeds)", e))?;
            for s in streams {
                drv::stream::wait_event(s, fed.raw, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
                    .map_err(|e| derr("cuStreamWaitEvent (feeds)", e))?;
            }
        }
        Ok(())
    }

    /// Before a synchronous copy to or from the program's buffers: wait for
    /// the staged copies still in flight.
    pub fn settle(&self) -> Result<(), String> {
        match (&self.copy, self.pending) {
            // SAFETY: a live stream of the bound context.
            (Some(copy), true) => {
                self.ctx.bind_to_thread().map_err(|e| derr("cuCtxSetCurrent", e))?;
                unsafe { drv::stream::synchronize(copy.raw) }.map_err(|e| derr("cuStreamSynchronize (feeds)", e))
            }
            _ => Ok(()),
        }
    }

    /// After the context was synchronized: no copy is in flight.
    pub fn completed(&mut self) {
        self.pending = false;
        for s in &mut self.staged {
            s.in_flight = false;
        }
    }
}
