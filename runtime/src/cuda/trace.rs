//! Step timelines on the GPU (`Backend::set_tracing`, `towers train
//! --backend cuda --trace FILE`).
//!
//! Turning tracing on creates, once, a timing event `t0` per CUDA context
//! the program's streams use and a begin and an end event for every step
//! of every plan stream, each in its stream's context; a traced run then
//! launches eagerly (never through a CUDA graph), recording each context's
//! `t0` on that context's first stream before anything else, and each plan
//! step's begin and end events on its stream around the ops it lowered to.
//! After the run's synchronization, `cuEventElapsedTime` gives each plan
//! step's start (from its context's `t0`) and duration, kept as numbers;
//! [`Tracer::trace`] builds the backend-neutral [`Trace`] only when asked.
//! A traced run allocates nothing.
//!
//! Several contexts (one per logical GPU): `cuEventElapsedTime` compares
//! only events of one context, so each context's times count from its own
//! `t0`, and the timelines are laid side by side as if the `t0`s were one
//! instant. They are recorded one after the other before any work is
//! enqueued, on idle streams, so they run within the host's few
//! microseconds of enqueueing them: the convention a mixed session's parts
//! use too (`mixed::MixedBackend::trace`).
//!
//! Invariants: a stream's events come in its step order and never overlap
//! (the GPU runs one stream's work in order); a wait's duration is the time
//! its stream stood still; the event timer's resolution is about half a
//! microsecond, so tiny items may read 0. Times before `t0` (another stream
//! started first) read 0.

use std::sync::Arc;

use cudarc::driver::{result as drv, sys, CudaContext};

use super::driver::{derr, Event};
use crate::trace::{Trace, TraceEvent};

/// One context's origin: its `t0` event, recorded on `stream`, the first
/// plan stream in that context.
struct Zero {
    ctx: Arc<CudaContext>,
    t0: Event,
    stream: usize,
}

/// The timing events of one traced program and its last traced step.
pub(crate) struct Tracer {
    zeros: Vec<Zero>,
    /// Per plan stream: the index of its context's [`Zero`] (`usize::MAX`
    /// for a stream without steps to trace).
    zero_of: Vec<usize>,
    /// Per plan stream, per plan step: its begin and end events.
    spans: Vec<Vec<(Event, Event)>>,
    /// Per plan stream, per plan step: (start ns from its context's `t0`, duration ns) of the last traced step.
    times: Vec<Vec<(u64, u64)>>,
    /// The last traced step: its number, its start since load and its wall time (ns).
    last: Option<(u64, u64, u64)>,
}

impl Tracer {
    /// Events for `steps[s]` plan steps on each stream `s`, made in that
    /// stream's context `ctxs[s]`.
    pub fn new(ctxs: &[&Arc<CudaContext>], steps: &[usize]) -> Result<Tracer, String> {
        if ctxs.len() != steps.len() {
            return Err(format!("{} stream contexts for {} streams", ctxs.len(), steps.len()));
        }
        let spans = steps
            .iter()
            .zip(ctxs)
            .map(|(&n, ctx)| (0..n).map(|_| Ok((Event::timed(ctx)?, Event::timed(ctx)?))).collect())
            .collect::<Result<Vec<Vec<_>>, String>>()?;
        let times = steps.iter().map(|&n| vec![(0, 0); n]).collect();
        let mut zeros: Vec<Zero> = Vec::new();
        let mut zero_of = Vec::with_capacity(ctxs.len());
        for (s, ctx) in ctxs.iter().enumerate() {
            if steps[s] == 0 {
                // Nothing traced here (another part's stream): no origin.
                zero_of.push(usize::MAX);
                continue;
            }
            match zeros.iter().position(|z| Arc::ptr_eq(&z.ctx, ctx)) {
                Some(k) => zero_of.push(k),
                None => {
                    zero_of.push(zeros.len());
                    zeros.push(Zero { ctx: Arc::clone(ctx), t0: Event::timed(ctx)?, stream: s });
                }
            }
        }
        Ok(Tracer { zeros, zero_of, spans, times, last: None })
    }

    /// Record every context's `t0` on its first stream (the first of the
    /// step), `raw(s)` being plan stream `s`'s stream. Leaves the last
    /// context it recorded in bound.
    ///
    /// # Safety
    /// `raw(s)` is a live stream of stream `s`'s context.
    pub unsafe fn start(&self, raw: impl Fn(usize) -> sys::CUstream) -> Result<(), String> {
        for z in &self.zeros {
            z.ctx.bind_to_thread().map_err(|e| derr("cuCtxSetCurrent", e))?;
            drv::event::record(z.t0.raw, raw(z.stream)).map_err(|e| derr("cuEventRecord (trace)", e))?;
        }
        Ok(())
    }

    /// Record plan step `step` of stream `s` beginning (`end` false) or ending, on `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream of stream `s`'s context, bound.
    pub unsafe fn mark(&self, s: usize, step: usize, end: bool, stream: sys::CUstream) -> Result<(), String> {
        let Some((b, e)) = self.spans.get(s).and_then(|v| v.get(step)) else {
            return Err(format!("no trace events for step {step} of stream {s}"));
        };
        let ev = if end { e.raw } else { b.raw };
        drv::event::record(ev, stream).map_err(|e| derr("cuEventRecord (trace)", e))
    }

    /// After the step has completed: read every plan step's times. `ran`
    /// says which plan steps recorded their events this step.
    pub fn finish(
        &mut self,
        step: u64,
        start_ns: u64,
        wall_ns: u64,
        ran: impl Fn(usize, usize) -> bool,
    ) -> Result<(), String> {
        let ms = |a: &Event, b: &Event| -> Result<f32, String> {
            // SAFETY: both events were recorded in this step, which has completed.
            unsafe { drv::event::elapsed(a.raw, b.raw) }.map_err(|e| derr("cuEventElapsedTime", e))
        };
        for (s, (spans, times)) in self.spans.iter().zip(self.times.iter_mut()).enumerate() {
            let Some(Zero { t0, .. }) = self.zeros.get(self.zero_of[s]) else { continue };
            for (j, ((b, e), t)) in spans.iter().zip(times.iter_mut()).enumerate() {
                *t = if ran(s, j) {
                    let start = ms(t0, b)?.max(0.0);
                    let dur = ms(b, e)?.max(0.0);
                    ((start as f64 * 1e6) as u64, (dur as f64 * 1e6) as u64)
                } else {
                    (0, 0)
                };
            }
        }
        self.last = Some((step, start_ns, wall_ns));
        Ok(())
    }

    /// The last traced step as a [`Trace`]: `label(s, j)` gives plan step
    /// `j` of stream `s`'s kind and node, `None` for the steps left out
    /// (event records). None before any traced step.
    pub fn trace(&self, label: impl Fn(usize, usize) -> Option<(&'static str, String)>) -> Option<Trace> {
        let (step, start_ns, dur_ns) = self.last?;
        let mut events = Vec::new();
        for (s, times) in self.times.iter().enumerate() {
            for (j, &(start, dur)) in times.iter().enumerate() {
                if let Some((kind, node)) = label(s, j) {
                    events.push(TraceEvent { stream: s, index: j, kind, node, start_ns: start, dur_ns: dur });
                }
            }
        }
        Some(Trace { step, start_ns, dur_ns, events })
    }
}
