//! Issue 21 item 2: what holds with several contexts on GPU 0, the layout
//! `CudaBackend::with_context_per_gpu` gives a one-GPU machine: peer copies
//! between contexts, a stream of one context waiting on another's event,
//! a kernel reading another context's pointer (in a child process: a fault
//! poisons the context), and CUDA graph capture per context and across.
//!
//! A [`Finding`] whose `relied_on` is set is an assumption the backend
//! depends on today (peer copies move the bytes; cross-context event waits
//! order): the test fails when it does not hold. The others are questions
//! whose answer is reported either way.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext};

use super::gpu::{bind, ck, new_context, pause, DevBuf, Event, Graph, Kernel, Pinned, Stream};
use super::{gb_per_s, ProbeError};

/// One finding of the several-contexts probes.
#[derive(Debug, Clone)]
pub struct Finding {
    pub name: String,
    /// `held`, `failed` or a value.
    pub verdict: String,
    pub detail: String,
    /// Whether the backend relies on it (then a `failed` fails the test).
    pub relied_on: bool,
}

impl Finding {
    fn check(name: String, held: bool, detail: String, relied_on: bool) -> Finding {
        Finding { name, verdict: if held { "held" } else { "failed" }.into(), detail, relied_on }
    }

    /// Whether it is a relied-on assumption that failed.
    pub fn broken(&self) -> bool {
        self.relied_on && self.verdict == "failed"
    }
}

/// `n` contexts on GPU 0, a stream each.
pub struct Ctxs {
    pub streams: Vec<Stream>,
    pub ctxs: Vec<Arc<CudaContext>>,
}

impl Ctxs {
    pub fn new(n: usize) -> Result<Ctxs, ProbeError> {
        let ctxs = (0..n).map(|_| new_context()).collect::<Result<Vec<_>, _>>()?;
        let streams = ctxs.iter().map(Stream::new).collect::<Result<Vec<_>, _>>()?;
        Ok(Ctxs { streams, ctxs })
    }

    fn n(&self) -> usize {
        self.ctxs.len()
    }

    /// `cuMemcpyPeerAsync(dst of context d <- src of context s)` on the
    /// stream of context `on`.
    fn peer_copy(&self, (dst, d): (&DevBuf, usize), (src, s): (&DevBuf, usize), on: usize) -> Result<(), ProbeError> {
        bind(&self.ctxs[on])?;
        let (dc, sc) = (self.ctxs[d].cu_ctx(), self.ctxs[s].cu_ctx());
        let r = unsafe { sys::cuMemcpyPeerAsync(dst.ptr, dc, src.ptr, sc, src.bytes, self.streams[on].raw) };
        ck("cuMemcpyPeerAsync", r)
    }

    /// Peer copies around the ring of contexts (`i -> i+1`), 64 MiB each:
    /// the bytes equal, and the slowest pair's GB/s; and what the driver
    /// says of peer access within one GPU.
    pub fn copies(&self, reps: u32) -> Result<Vec<Finding>, ProbeError> {
        let n = self.n();
        let bytes = 64 << 20;
        let src = self.ctxs.iter().map(|c| DevBuf::new(c, bytes)).collect::<Result<Vec<_>, _>>()?;
        let dst = self.ctxs.iter().map(|c| DevBuf::new(c, bytes)).collect::<Result<Vec<_>, _>>()?;
        for (i, b) in src.iter().enumerate() {
            bind(&self.ctxs[i])?;
            self.streams[i].memset(b.ptr, pattern(i), bytes / 4)?;
            self.streams[i].sync()?;
        }
        let (mut slowest, mut fastest, mut equal) = (f64::INFINITY, 0.0f64, true);
        for i in 0..n {
            let j = (i + 1) % n;
            self.peer_copy((&dst[j], j), (&src[i], i), i)?;
            self.streams[i].sync()?;
            let t0 = Instant::now();
            for _ in 0..reps {
                self.peer_copy((&dst[j], j), (&src[i], i), i)?;
            }
            self.streams[i].sync()?;
            let gbs = gb_per_s(bytes as u64 * u64::from(reps), t0.elapsed().as_secs_f64());
            slowest = slowest.min(gbs);
            fastest = fastest.max(gbs);
            equal &= dst[j].read()?.iter().all(|&w| w == pattern(i));
        }
        let mut can = 0;
        let dev = self.ctxs[0].cu_device();
        ck("cuDeviceCanAccessPeer", unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, dev) })?;
        bind(&self.ctxs[0])?;
        let enable = match unsafe { sys::cuCtxEnablePeerAccess(self.ctxs[1].cu_ctx(), 0) } {
            sys::CUresult::CUDA_SUCCESS => "succeeds".to_string(),
            e => format!("returns {e:?}"),
        };
        Ok(vec![
            Finding::check(
                format!("ctx{n}_peer_copy"),
                equal,
                format!(
                    "cuMemcpyPeerAsync around a ring of {n} contexts on GPU 0, 64 MiB x {reps}: bytes {}; {slowest:.1} to {fastest:.1} GB/s",
                    if equal { "equal" } else { "DIFFER" }
                ),
                true,
            ),
            Finding {
                name: format!("ctx{n}_peer_access_same_gpu"),
                verdict: format!("cuDeviceCanAccessPeer(0, 0) = {can}"),
                detail: format!("cuCtxEnablePeerAccess between two contexts of GPU 0 {enable}"),
                relied_on: false,
            },
        ])
    }

    /// Context 0's stream is held on a pinned gate, then writes a buffer
    /// and records an event; context `k`'s stream waits on that event and
    /// copies the buffer. Before the gate opens, context `k` must not have
    /// finished; after, it must hold the written values.
    pub fn event_waits(&self) -> Result<Vec<Finding>, ProbeError> {
        let n = self.n();
        let words = 1 << 18;
        let flags = Pinned::new(&self.ctxs[0], 2)?;
        let src = DevBuf::new(&self.ctxs[0], words * 4)?;
        let (mut early, mut wrong, mut waited_us) = (Vec::new(), Vec::new(), Vec::new());
        let run =
            |early: &mut Vec<usize>, wrong: &mut Vec<usize>, waited_us: &mut Vec<f64>| -> Result<(), ProbeError> {
                for k in 1..n {
                    let key = k as u32;
                    let dst = DevBuf::new(&self.ctxs[k], words * 4)?;
                    let ev = Event::untimed(&self.ctxs[0])?;
                    bind(&self.ctxs[k])?;
                    self.streams[k].memset(dst.ptr, 0, words)?;
                    self.streams[k].sync()?;
                    bind(&self.ctxs[0])?;
                    self.streams[0].wait_value(flags.dev_word(0), key)?;
                    self.streams[0].memset(src.ptr, pattern(k), words)?;
                    ev.record(&self.streams[0])?;
                    bind(&self.ctxs[k])?;
                    self.streams[k].wait_event(&ev)?;
                    self.peer_copy((&dst, k), (&src, 0), k)?;
                    self.streams[k].write_value(flags.dev_word(1), key)?;
                    pause(Duration::from_millis(2));
                    if flags.word(1).load(Ordering::Acquire) >= key {
                        early.push(k);
                    }
                    let t0 = Instant::now();
                    flags.word(0).store(key, Ordering::Release);
                    let t1 = flags.spin_until(1, key, &format!("context {k}'s copy after the event of context 0"))?;
                    waited_us.push(t1.duration_since(t0).as_secs_f64() * 1e6);
                    if !dst.read()?.iter().all(|&w| w == pattern(k)) {
                        wrong.push(k);
                    }
                }
                Ok(())
            };
        let ran = run(&mut early, &mut wrong, &mut waited_us);
        // Open the gate whatever happened, so no stream stays held.
        flags.word(0).store(u32::MAX, Ordering::Release);
        ran?;
        let held = early.is_empty() && wrong.is_empty();
        let worst = waited_us.iter().cloned().fold(0.0, f64::max);
        Ok(vec![Finding::check(
            format!("ctx{n}_cross_event_wait"),
            held,
            format!(
                "cuStreamWaitEvent in contexts 1..{} on an event of context 0 held behind a gate: finished early in {early:?}, stale data in {wrong:?}; gate to copy done at most {worst:.0} us",
                n - 1
            ),
            true,
        )])
    }

    /// Graph capture: each context's own stream (a memset), a capture
    /// forking from context 0 into context 1 and joining back (an event of
    /// each), and a capture in context 0 waiting on an event context 1
    /// recorded outside it.
    pub fn captures(&self) -> Result<Vec<Finding>, ProbeError> {
        let n = self.n();
        let words = 1 << 16;
        let mut own = Vec::new();
        for (i, ctx) in self.ctxs.iter().enumerate() {
            let buf = DevBuf::new(ctx, words * 4)?;
            let s = &self.streams[i];
            let outcome = Graph::capture(ctx, s, || s.memset(buf.ptr, pattern(i), words)).and_then(|g| {
                g.launch(s)?;
                s.sync()?;
                Ok(buf.read()?.iter().all(|&w| w == pattern(i)))
            });
            own.push(match outcome {
                Ok(true) => "held".to_string(),
                Ok(false) => "replayed with wrong bytes".to_string(),
                Err(e) => e.to_string(),
            });
        }
        let all = own.iter().all(|o| o == "held");
        let mut out = vec![Finding::check(
            format!("ctx{n}_capture_per_context"),
            all,
            format!("a memset captured, instantiated and replayed in each context: {}", own.join("; ")),
            false,
        )];
        out.push(self.fork_capture(words)?);
        out.push(self.foreign_event_capture(words)?);
        Ok(out)
    }

    fn fork_capture(&self, words: usize) -> Result<Finding, ProbeError> {
        let n = self.n();
        let a = DevBuf::new(&self.ctxs[0], words * 4)?;
        let b = DevBuf::new(&self.ctxs[1], words * 4)?;
        let fork = Event::untimed(&self.ctxs[0])?;
        let join = Event::untimed(&self.ctxs[1])?;
        // Fresh streams: a refused capture leaves no state on the others.
        let (s0, s1) = (&Stream::new(&self.ctxs[0])?, &Stream::new(&self.ctxs[1])?);
        let outcome = Graph::capture(&self.ctxs[0], s0, || {
            s0.memset(a.ptr, 0xF0F0_0001, words)?;
            fork.record(s0)?;
            bind(&self.ctxs[1])?;
            s1.wait_event(&fork)?;
            self.peer_copy((&b, 1), (&a, 0), 1)?;
            join.record(s1)?;
            bind(&self.ctxs[0])?;
            s0.wait_event(&join)
        })
        .and_then(|g| {
            bind(&self.ctxs[0])?;
            g.launch(s0)?;
            s0.sync()?;
            Ok(b.read()?.iter().all(|&w| w == 0xF0F0_0001))
        });
        Ok(capture_finding(
            format!("ctx{n}_capture_across_contexts"),
            "one capture forking context 0's stream into context 1's (a peer copy) and joining",
            outcome,
            ("captured, instantiated, replayed; bytes equal", "replayed, but context 1 holds the wrong bytes"),
        ))
    }

    fn foreign_event_capture(&self, words: usize) -> Result<Finding, ProbeError> {
        let n = self.n();
        let a = DevBuf::new(&self.ctxs[0], words * 4)?;
        let outside = Event::untimed(&self.ctxs[1])?;
        bind(&self.ctxs[1])?;
        outside.record(&self.streams[1])?;
        let s0 = &Stream::new(&self.ctxs[0])?;
        let outcome = Graph::capture(&self.ctxs[0], s0, || {
            s0.wait_event(&outside)?;
            s0.memset(a.ptr, 0xF0F0_0002, words)
        })
        .and_then(|g| {
            g.launch(s0)?;
            s0.sync()?;
            Ok(a.read()?.iter().all(|&w| w == 0xF0F0_0002))
        });
        Ok(capture_finding(
            format!("ctx{n}_capture_waits_foreign_event"),
            "a capture in context 0 waiting on an event context 1 recorded outside it",
            outcome,
            ("captured, instantiated, replayed", "replayed with the wrong bytes"),
        ))
    }
}

/// The finding of a capture probe: held when the replay left the right
/// bytes (`said.0`), failed when it left wrong ones (`said.1`) or the
/// driver refused (its error).
fn capture_finding(name: String, what: &str, outcome: Result<bool, ProbeError>, said: (&str, &str)) -> Finding {
    let (verdict, detail) = match outcome {
        Ok(true) => ("held", said.0.to_string()),
        Ok(false) => ("failed", said.1.to_string()),
        Err(e) => ("failed", format!("the driver says: {e}")),
    };
    Finding { name, verdict: verdict.into(), detail: format!("{what}: {detail}"), relied_on: false }
}

/// The words context `i`'s buffers are filled with.
pub fn pattern(i: usize) -> u32 {
    0xC0DE_0000 + i as u32
}

/// The child's side of the foreign-pointer probe: a kernel of context 0
/// reads a buffer of context `n - 1`; prints the `CHILD` lines
/// [`super::child_outcome`] parses.
pub fn foreign_read(n: usize) -> Result<(), ProbeError> {
    let c = Ctxs::new(n)?;
    let words = 1 << 12;
    let last = n - 1;
    let theirs = DevBuf::new(&c.ctxs[last], words * 4)?;
    bind(&c.ctxs[last])?;
    c.streams[last].memset(theirs.ptr, pattern(last), words)?;
    c.streams[last].sync()?;
    let kernel = Kernel::load(&c.ctxs[0])?;
    let mine = DevBuf::new(&c.ctxs[0], words * 4)?;
    bind(&c.ctxs[0])?;
    let ran = kernel.launch(&c.streams[0], theirs.ptr, mine.ptr, words as u32).and_then(|()| c.streams[0].sync());
    match ran {
        Err(e) => println!("{} fault {e}", super::CHILD_MARK),
        Ok(()) => {
            let right = mine.read()?.iter().all(|&w| w == pattern(last));
            println!("{} read {}", super::CHILD_MARK, if right { "right" } else { "wrong" });
        }
    }
    let after = match theirs.read() {
        Ok(_) => format!("context {last} (the owner) still usable"),
        Err(e) => format!("context {last} (the owner) unusable: {e}"),
    };
    let own = match bind(&c.ctxs[0]).and_then(|()| ck("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })) {
        Ok(()) => "context 0 (the reader) still usable".to_string(),
        Err(e) => format!("context 0 (the reader) unusable: {e}"),
    };
    println!("CHILD after: {after}; {own}");
    // A poisoned context may refuse to free: leave the process to end it.
    std::mem::forget(c);
    std::mem::forget((kernel, mine, theirs));
    Ok(())
}
