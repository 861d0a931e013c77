//! Owners of the raw driver handles the probes use (streams, events,
//! pinned flags, device buffers, one NVRTC-compiled module), each freed on
//! drop with its context bound, and the few stream operations the probes
//! enqueue. The backend's own handles (`towers_runtime::cuda::driver`) are
//! private to the crate, so the probes hold theirs here.
//!
//! Invariants: every handle keeps its context alive (an `Arc`) and binds it
//! before any call; the host never waits on the GPU longer than
//! [`SPIN_LIMIT`]; every driver function newer than CUDA 11 is asked for by
//! name ([`exports`]) before cudarc looks it up (which panics when missing).

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext};
use towers_kernels::cuda::Source;

use super::ProbeError;

/// The longest the host spins for the GPU before giving up.
pub const SPIN_LIMIT: Duration = Duration::from_secs(3);

/// The driver functions the probes call that a driver older than CUDA 12.5
/// may lack.
pub const NEEDED: [&str; 8] = [
    "cuStreamWaitValue32_v2",
    "cuStreamWriteValue32_v2",
    "cuLaunchHostFunc",
    "cuStreamBeginCapture_v2",
    "cuGraphInstantiateWithFlags",
    "cuMemcpyPeerAsync",
    "cuCtxCreate_v4",
    "cuMemHostGetDevicePointer_v2",
];

/// `r` as a result: an error naming `call` and the driver's text.
pub fn ck(call: &str, r: sys::CUresult) -> Result<(), ProbeError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the driver writes a pointer to a static string (or leaves null).
    let known = unsafe { sys::cuGetErrorString(r, &mut text) } == sys::CUresult::CUDA_SUCCESS;
    let text = if known && !text.is_null() {
        // SAFETY: a NUL-terminated static string of the driver.
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    } else {
        "no text from the driver".to_string()
    };
    Err(ProbeError::Driver { call: call.to_string(), code: format!("{r:?}"), text })
}

/// An error naming the first of `names` the loaded driver does not export.
pub fn exports(names: &[&str]) -> Result<(), ProbeError> {
    for name in names {
        // SAFETY: the driver library is loaded; a symbol lookup calls nothing.
        let found = unsafe { sys::culib().get::<unsafe extern "C" fn()>(name.as_bytes()).is_ok() };
        if !found {
            return Err(ProbeError::Other(format!(
                "the CUDA driver does not export {name}: the probes need CUDA 12.5 or newer"
            )));
        }
    }
    Ok(())
}

/// Bind `ctx` to this thread.
pub fn bind(ctx: &Arc<CudaContext>) -> Result<(), ProbeError> {
    ck("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx.cu_ctx()) })
}

/// A new context on GPU 0 (not the primary one), or the driver's error.
pub fn new_context() -> Result<Arc<CudaContext>, ProbeError> {
    std::panic::catch_unwind(|| CudaContext::new_non_primary(0, 0))
        .map_err(|_| ProbeError::Other("cuCtxCreate: cudarc panicked (a driver function is missing)".into()))?
        .map_err(|e| ProbeError::Other(format!("cuCtxCreate on GPU 0 failed: {e:?}")))
}

/// A non-blocking stream.
pub struct Stream {
    pub raw: sys::CUstream,
    ctx: Arc<CudaContext>,
}

impl Stream {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Stream, ProbeError> {
        bind(ctx)?;
        let mut raw = std::ptr::null_mut();
        ck("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream { raw, ctx: Arc::clone(ctx) })
    }

    pub fn sync(&self) -> Result<(), ProbeError> {
        bind(&self.ctx)?;
        ck("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.raw) })
    }

    /// `cuStreamWaitValue32(addr >= value)`.
    pub fn wait_value(&self, addr: sys::CUdeviceptr, value: u32) -> Result<(), ProbeError> {
        let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        ck("cuStreamWaitValue32", unsafe { sys::cuStreamWaitValue32_v2(self.raw, addr, value, geq) })
    }

    /// `cuStreamWriteValue32(addr = value)`, with the default barrier.
    pub fn write_value(&self, addr: sys::CUdeviceptr, value: u32) -> Result<(), ProbeError> {
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        ck("cuStreamWriteValue32", unsafe { sys::cuStreamWriteValue32_v2(self.raw, addr, value, flags) })
    }

    /// `cuMemsetD32Async(dst, value, words)`.
    pub fn memset(&self, dst: sys::CUdeviceptr, value: u32, words: usize) -> Result<(), ProbeError> {
        ck("cuMemsetD32Async", unsafe { sys::cuMemsetD32Async(dst, value, words, self.raw) })
    }

    /// `cuStreamWaitEvent(event)`.
    pub fn wait_event(&self, event: &Event) -> Result<(), ProbeError> {
        ck("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(self.raw, event.raw, 0) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = bind(&self.ctx);
        unsafe {
            let _ = sys::cuStreamSynchronize(self.raw);
            let _ = sys::cuStreamDestroy_v2(self.raw);
        }
    }
}

/// An event.
pub struct Event {
    pub raw: sys::CUevent,
    ctx: Arc<CudaContext>,
}

impl Event {
    /// An event with `flags` (`CUevent_flags` bits).
    pub fn new(ctx: &Arc<CudaContext>, flags: u32) -> Result<Event, ProbeError> {
        bind(ctx)?;
        let mut raw = std::ptr::null_mut();
        ck("cuEventCreate", unsafe { sys::cuEventCreate(&mut raw, flags) })?;
        Ok(Event { raw, ctx: Arc::clone(ctx) })
    }

    /// An event without timing.
    pub fn untimed(ctx: &Arc<CudaContext>) -> Result<Event, ProbeError> {
        Event::new(ctx, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    }

    pub fn record(&self, stream: &Stream) -> Result<(), ProbeError> {
        ck("cuEventRecord", unsafe { sys::cuEventRecord(self.raw, stream.raw) })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = bind(&self.ctx);
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}

/// Pinned, mapped, portable host words (the bridge's flags are such).
pub struct Pinned {
    host: *mut c_void,
    pub dev: sys::CUdeviceptr,
    words: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: plain host memory read and written through atomics only.
unsafe impl Send for Pinned {}
unsafe impl Sync for Pinned {}

impl Pinned {
    /// `words` zeroed 4-byte words, allocated as `PinnedHost` does
    /// (`CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP`).
    pub fn new(ctx: &Arc<CudaContext>, words: usize) -> Result<Pinned, ProbeError> {
        bind(ctx)?;
        let mut host = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        ck("cuMemHostAlloc", unsafe { sys::cuMemHostAlloc(&mut host, words * 4, flags) })?;
        // SAFETY: `words * 4` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, words * 4) };
        let mut dev = 0;
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) };
        let p = Pinned { host, dev, words, ctx: Arc::clone(ctx) };
        ck("cuMemHostGetDevicePointer", r)?;
        Ok(p)
    }

    /// Word `i` as the host sees it.
    pub fn word(&self, i: usize) -> &AtomicU32 {
        assert!(i < self.words, "pinned word {i} of {}", self.words);
        // SAFETY: in bounds, 4-byte aligned (page-aligned block), alive as long as `self`.
        unsafe { &*(self.host as *const AtomicU32).add(i) }
    }

    /// The device address of word `i`.
    pub fn dev_word(&self, i: usize) -> sys::CUdeviceptr {
        self.dev + 4 * i as u64
    }

    /// Spin until word `i` is at least `target`; the time it was seen.
    pub fn spin_until(&self, i: usize, target: u32, what: &str) -> Result<Instant, ProbeError> {
        spin_until(self.word(i), target, what)
    }
}

/// Spin until `word` is at least `target` (acquire loads); the time it was
/// seen, or a timeout after [`SPIN_LIMIT`] naming `what`.
pub fn spin_until(word: &AtomicU32, target: u32, what: &str) -> Result<Instant, ProbeError> {
    let start = Instant::now();
    loop {
        if word.load(Ordering::Acquire) >= target {
            return Ok(Instant::now());
        }
        if start.elapsed() > SPIN_LIMIT {
            return Err(ProbeError::Timeout { what: what.to_string(), ms: SPIN_LIMIT.as_millis() });
        }
        std::hint::spin_loop();
    }
}

/// Spin for `d` (lets the GPU reach a wait before the host releases it).
pub fn pause(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = bind(&self.ctx);
        let _ = unsafe { sys::cuMemFreeHost(self.host) };
    }
}

/// Device memory of one context.
pub struct DevBuf {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DevBuf {
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DevBuf, ProbeError> {
        bind(ctx)?;
        let mut ptr = 0;
        ck(&format!("cuMemAlloc of {bytes} bytes"), unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) })?;
        Ok(DevBuf { ptr, bytes, ctx: Arc::clone(ctx) })
    }

    /// The buffer's words, read synchronously in its own context.
    pub fn read(&self) -> Result<Vec<u32>, ProbeError> {
        bind(&self.ctx)?;
        let mut out = vec![0u32; self.bytes / 4];
        let r = unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut c_void, self.ptr, self.bytes) };
        ck("cuMemcpyDtoH", r)?;
        Ok(out)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let _ = bind(&self.ctx);
        let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// The probes' one kernel: `dst[i] = src[i]` for `i < n` (a read of `src`,
/// which may belong to another context).
pub const COPY_KERNEL: &str = r#"
extern "C" __global__ void probe_copy(const unsigned int* src, unsigned int* dst, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}
"#;

/// [`COPY_KERNEL`] compiled by the backend's NVRTC path
/// (`towers_runtime::cuda::compile_cubin`) for the device of `ctx` and
/// loaded in `ctx`.
pub struct Kernel {
    module: sys::CUmodule,
    pub func: sys::CUfunction,
    ctx: Arc<CudaContext>,
}

impl Kernel {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernel, ProbeError> {
        let (major, minor) =
            ctx.compute_capability().map_err(|e| ProbeError::Other(format!("cuDeviceGetAttribute: {e:?}")))?;
        let source = Source { family: "probe", path: "probe/probe_copy.cu", code: COPY_KERNEL };
        let (cubin, _) = towers_runtime::cuda::compile_cubin(&source, &format!("sm_{major}{minor}"), None)
            .map_err(ProbeError::Other)?;
        bind(ctx)?;
        let mut module = std::ptr::null_mut();
        ck("cuModuleLoadData", unsafe { sys::cuModuleLoadData(&mut module, cubin.as_ptr() as *const c_void) })?;
        let mut k = Kernel { module, func: std::ptr::null_mut(), ctx: Arc::clone(ctx) };
        let r = unsafe { sys::cuModuleGetFunction(&mut k.func, module, c"probe_copy".as_ptr()) };
        ck("cuModuleGetFunction(probe_copy)", r)?;
        Ok(k)
    }

    /// Launch `dst[i] = src[i]` for `n` words on `stream`.
    pub fn launch(
        &self,
        stream: &Stream,
        src: sys::CUdeviceptr,
        dst: sys::CUdeviceptr,
        n: u32,
    ) -> Result<(), ProbeError> {
        let (mut s, mut d, mut n_) = (src, dst, n);
        let mut params =
            [&mut s as *mut _ as *mut c_void, &mut d as *mut _ as *mut c_void, &mut n_ as *mut _ as *mut c_void];
        let blocks = n.div_ceil(256).max(1);
        let r = unsafe {
            sys::cuLaunchKernel(
                self.func,
                blocks,
                1,
                1,
                256,
                1,
                1,
                0,
                stream.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        ck("cuLaunchKernel(probe_copy)", r)
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let _ = bind(&self.ctx);
        let _ = unsafe { sys::cuModuleUnload(self.module) };
    }
}

/// A captured graph, instantiated, destroyed on drop.
pub struct Graph {
    graph: sys::CUgraph,
    pub exec: sys::CUgraphExec,
    ctx: Arc<CudaContext>,
}

impl Graph {
    /// Capture what `enqueue` puts on `origin` (and the streams it forks
    /// into), then instantiate it; the driver's error at the call that
    /// refused, the capture ended either way.
    pub fn capture(
        ctx: &Arc<CudaContext>,
        origin: &Stream,
        enqueue: impl FnOnce() -> Result<(), ProbeError>,
    ) -> Result<Graph, ProbeError> {
        bind(ctx)?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        ck("cuStreamBeginCapture", unsafe { sys::cuStreamBeginCapture_v2(origin.raw, mode) })?;
        let inside = enqueue();
        bind(ctx)?;
        let mut graph = std::ptr::null_mut();
        let ended = ck("cuStreamEndCapture", unsafe { sys::cuStreamEndCapture(origin.raw, &mut graph) });
        inside?;
        ended?;
        let mut g = Graph { graph, exec: std::ptr::null_mut(), ctx: Arc::clone(ctx) };
        ck("cuGraphInstantiate", unsafe { sys::cuGraphInstantiateWithFlags(&mut g.exec, graph, 0) })?;
        Ok(g)
    }

    pub fn launch(&self, stream: &Stream) -> Result<(), ProbeError> {
        ck("cuGraphLaunch", unsafe { sys::cuGraphLaunch(self.exec, stream.raw) })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let _ = bind(&self.ctx);
        unsafe {
            if !self.exec.is_null() {
                let _ = sys::cuGraphExecDestroy(self.exec);
            }
            if !self.graph.is_null() {
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }
}
