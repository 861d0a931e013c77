//! Issue 21 item 1: what an event crossing between the host and a GPU
//! stream costs, by mechanism, as round trips timed on the host clock.
//!
//! Every trip increments one monotone counter `k`, so a `GEQ` wait never
//! needs its flag cleared. Host→GPU trips end with a `cuStreamWriteValue32`
//! the host spins on (the same GPU→host leg for each); GPU→host trips start
//! with a `cuStreamWaitValue32` the host releases (the same host→GPU leg
//! for each). Before the host releases a trip it spins [`SETTLE`], so the
//! GPU (or the driver's callback thread) is already waiting: the figure is
//! the wake-up, not the enqueue. The event mechanism cannot be enqueued
//! ahead (a `cuStreamWaitEvent` binds to the record made before it), so its
//! trip includes the record and the wait's enqueue.
//!
//! Pinned words: 0 the gate (host→GPU), 1 the GPU's answer, 2 and 3 the
//! captured graph's gate and answer.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext};

use super::gpu::{bind, ck, pause, spin_until, Event, Graph, Pinned, Stream, SPIN_LIMIT};
use super::{ProbeError, Stats};

/// How long the host waits before releasing a trip.
pub const SETTLE: Duration = Duration::from_micros(30);

/// What a host function reads and writes (lives as long as the probe,
/// which synchronizes its stream before dropping it).
#[repr(C)]
struct Ctl {
    gate: *const AtomicU32,
    target: AtomicU32,
    done: AtomicU32,
    timed_out: AtomicU32,
}

/// Host function: spin until the gate reaches the target (bounded).
unsafe extern "C" fn wait_gate(user: *mut c_void) {
    let c = &*(user as *const Ctl);
    let t = c.target.load(Ordering::Acquire);
    let start = Instant::now();
    while (*c.gate).load(Ordering::Acquire) < t {
        if start.elapsed() > SPIN_LIMIT {
            c.timed_out.store(1, Ordering::Release);
            return;
        }
        std::hint::spin_loop();
    }
}

/// Host function: publish the target as done.
unsafe extern "C" fn signal_done(user: *mut c_void) {
    let c = &*(user as *const Ctl);
    c.done.store(c.target.load(Ordering::Acquire), Ordering::Release);
}

/// The crossing probes' state on one context.
pub struct Cross {
    pub ctx: Arc<CudaContext>,
    gpu_side: Stream,
    host_side: Stream,
    flags: Pinned,
    ctl: Box<Ctl>,
    k: u32,
}

impl Cross {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Cross, ProbeError> {
        let flags = Pinned::new(ctx, 4)?;
        let ctl = Box::new(Ctl {
            gate: flags.word(0) as *const AtomicU32,
            target: AtomicU32::new(0),
            done: AtomicU32::new(0),
            timed_out: AtomicU32::new(0),
        });
        Ok(Cross { gpu_side: Stream::new(ctx)?, host_side: Stream::new(ctx)?, flags, ctl, ctx: Arc::clone(ctx), k: 0 })
    }

    fn next(&mut self) -> u32 {
        self.k += 1;
        self.k
    }

    fn host_func(&self, f: unsafe extern "C" fn(*mut c_void)) -> Result<(), ProbeError> {
        let user = &*self.ctl as *const Ctl as *mut c_void;
        ck("cuLaunchHostFunc", unsafe { sys::cuLaunchHostFunc(self.gpu_side.raw, Some(f), user) })
    }

    /// Release the gate at `k` after [`SETTLE`]; the time of the release.
    fn release(&self, k: u32) -> Instant {
        pause(SETTLE);
        let t0 = Instant::now();
        self.flags.word(0).store(k, Ordering::Release);
        t0
    }

    fn check_callback(&self) -> Result<(), ProbeError> {
        if self.ctl.timed_out.swap(0, Ordering::AcqRel) != 0 {
            return Err(ProbeError::Timeout { what: "the host function's gate".into(), ms: SPIN_LIMIT.as_millis() });
        }
        Ok(())
    }

    /// `n` trips (after `n / 10` not counted) of `one`, which returns one
    /// trip's microseconds.
    fn trips(
        &mut self,
        n: usize,
        mut one: impl FnMut(&mut Cross, u32) -> Result<f64, ProbeError>,
    ) -> Result<Stats, ProbeError> {
        bind(&self.ctx)?;
        let mut v = Vec::with_capacity(n);
        for i in 0..n + n / 10 {
            let k = self.next();
            let us = one(self, k)?;
            if i >= n / 10 {
                v.push(us);
            }
        }
        self.gpu_side.sync()?;
        Stats::of(&v).ok_or_else(|| ProbeError::Other("no finite latencies".into()))
    }

    /// Host→GPU through `cuStreamWaitValue32` on the pinned gate.
    pub fn h2g_wait_value(&mut self, n: usize) -> Result<Stats, ProbeError> {
        self.trips(n, |c, k| {
            c.gpu_side.wait_value(c.flags.dev_word(0), k)?;
            c.gpu_side.write_value(c.flags.dev_word(1), k)?;
            let t0 = c.release(k);
            Ok(us(t0, c.flags.spin_until(1, k, "the GPU's answer")?))
        })
    }

    /// Host→GPU through `cuLaunchHostFunc` spinning on the gate.
    pub fn h2g_host_func(&mut self, n: usize) -> Result<Stats, ProbeError> {
        self.trips(n, |c, k| {
            c.ctl.target.store(k, Ordering::Release);
            c.host_func(wait_gate)?;
            c.gpu_side.write_value(c.flags.dev_word(1), k)?;
            let t0 = c.release(k);
            let t1 = c.flags.spin_until(1, k, "the GPU's answer after a host function")?;
            c.check_callback()?;
            Ok(us(t0, t1))
        })
    }

    /// Host→GPU through an event recorded on a host-side stream and
    /// `cuStreamWaitEvent` (enqueued after the record: see the module docs).
    pub fn h2g_event(&mut self, n: usize) -> Result<Stats, ProbeError> {
        let ev = Event::untimed(&self.ctx)?;
        self.trips(n, |c, k| {
            pause(SETTLE);
            let t0 = Instant::now();
            ev.record(&c.host_side)?;
            c.gpu_side.wait_event(&ev)?;
            c.gpu_side.write_value(c.flags.dev_word(1), k)?;
            Ok(us(t0, c.flags.spin_until(1, k, "the GPU's answer after an event wait")?))
        })
    }

    /// GPU→host through `cuStreamWriteValue32` the host spins on.
    pub fn g2h_write_value(&mut self, n: usize) -> Result<Stats, ProbeError> {
        self.h2g_wait_value(n)
    }

    /// GPU→host through an event: polled with `cuEventQuery` (`poll`), or
    /// waited with `cuEventSynchronize` on an event of `flags`.
    pub fn g2h_event(&mut self, n: usize, flags: u32, poll: bool) -> Result<Stats, ProbeError> {
        let ev = Event::new(&self.ctx, flags)?;
        self.trips(n, |c, k| {
            c.gpu_side.wait_value(c.flags.dev_word(0), k)?;
            ev.record(&c.gpu_side)?;
            let t0 = c.release(k);
            if poll {
                loop {
                    match unsafe { sys::cuEventQuery(ev.raw) } {
                        sys::CUresult::CUDA_SUCCESS => break,
                        sys::CUresult::CUDA_ERROR_NOT_READY if t0.elapsed() < SPIN_LIMIT => {}
                        sys::CUresult::CUDA_ERROR_NOT_READY => {
                            return Err(ProbeError::Timeout { what: "cuEventQuery".into(), ms: SPIN_LIMIT.as_millis() })
                        }
                        e => ck("cuEventQuery", e)?,
                    }
                }
            } else {
                ck("cuEventSynchronize", unsafe { sys::cuEventSynchronize(ev.raw) })?;
            }
            Ok(us(t0, Instant::now()))
        })
    }

    /// GPU→host through a `cuLaunchHostFunc` callback setting a host word.
    pub fn g2h_host_func(&mut self, n: usize) -> Result<Stats, ProbeError> {
        self.trips(n, |c, k| {
            c.ctl.target.store(k, Ordering::Release);
            c.gpu_side.wait_value(c.flags.dev_word(0), k)?;
            c.host_func(signal_done)?;
            let t0 = c.release(k);
            Ok(us(t0, spin_until(&c.ctl.done, k, "the host function's signal")?))
        })
    }

    /// Capture a wait and a write on pinned words 2 and 3 into a CUDA
    /// graph: Err with the driver's refusal, else the round trip of `n`
    /// replays (both words cleared before each).
    pub fn graph_memops(&mut self, n: usize) -> Result<Result<Stats, ProbeError>, ProbeError> {
        let stream = Stream::new(&self.ctx)?;
        let (gate, answer) = (self.flags.dev_word(2), self.flags.dev_word(3));
        let graph = match Graph::capture(&self.ctx, &stream, || {
            stream.wait_value(gate, 1)?;
            stream.write_value(answer, 1)
        }) {
            Ok(g) => g,
            Err(refused) => return Ok(Err(refused)),
        };
        let mut v = Vec::with_capacity(n);
        for i in 0..n + n / 10 {
            self.flags.word(2).store(0, Ordering::Release);
            self.flags.word(3).store(0, Ordering::Release);
            if let Err(e) = graph.launch(&stream) {
                return Ok(Err(e));
            }
            pause(SETTLE);
            let t0 = Instant::now();
            self.flags.word(2).store(1, Ordering::Release);
            let t1 = self.flags.spin_until(3, 1, "the captured graph's answer")?;
            stream.sync()?;
            if i >= n / 10 {
                v.push(us(t0, t1));
            }
        }
        Ok(Stats::of(&v).ok_or_else(|| ProbeError::Other("no finite latencies".into())))
    }
}

impl Drop for Cross {
    fn drop(&mut self) {
        // Release anything still waiting so the streams' drops can sync.
        self.flags.word(0).store(u32::MAX, Ordering::Release);
        self.flags.word(2).store(u32::MAX, Ordering::Release);
        let _ = self.gpu_side.sync();
    }
}

fn us(t0: Instant, t1: Instant) -> f64 {
    t1.saturating_duration_since(t0).as_secs_f64() * 1e6
}
