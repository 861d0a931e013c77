//! Thin owners of raw driver and cuBLAS handles, and NVRTC to a cubin.
//!
//! The backend drives the GPU through cudarc's raw layer (`driver::result`,
//! `cublas::result`, `nvrtc::sys`): device memory is addressed by plan
//! offsets into one allocation per plan device, which cudarc's typed slices
//! (and their per-stream event tracking) do not model. Every handle here is
//! created at load and destroyed on drop, with the context bound to the
//! calling thread first.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result as drv, sys, CudaContext};
use cudarc::nvrtc::sys as nvrtc;

pub(crate) fn derr(what: &str, e: impl std::fmt::Debug) -> String {
    format!("{what}: {e:?}")
}

/// One device allocation.
pub(crate) struct DevMem {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DevMem {
    /// `bytes` of device memory, zeroed (at least 4 bytes: never a zero-size allocation).
    pub fn zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DevMem, String> {
        ctx.bind_to_thread().map_err(|e| derr("cuCtxSetCurrent", e))?;
        let n = bytes.max(4);
        // SAFETY: a plain allocation in the bound context, zeroed synchronously.
        let ptr = unsafe { drv::malloc_sync(n) }.map_err(|e| derr(&format!("cuMemAlloc of {n} bytes"), e))?;
        unsafe { drv::memset_d8_sync(ptr, 0, n) }.map_err(|e| derr("cuMemsetD8", e))?;
        Ok(DevMem { ptr, bytes, ctx: Arc::clone(ctx) })
    }

    /// The context the memory belongs to.
    pub fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by `zeroed`, freed once; the backend synchronized before dropping.
        let _ = unsafe { drv::free_sync(self.ptr) };
    }
}

/// Page-locked (pinned) host memory: the GPU's copy engines read it by DMA
/// directly, with no staging copy by the driver.
pub(crate) struct PinnedStaging {
    ptr: *mut c_void,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl PinnedStaging {
    /// `bytes` of pinned host memory (at least 4: never a zero-size
    /// allocation), zeroed, so it is initialized before anyone reads it.
    pub fn zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<PinnedStaging, String> {
        ctx.bind_to_thread().map_err(|e| derr("cuCtxSetCurrent", e))?;
        let n = bytes.max(4);
        // SAFETY: a plain page-locked allocation in the bound context (flags
        // 0: cacheable, so the host may read it back at full speed).
        let ptr = unsafe { drv::malloc_host(n, 0) }.map_err(|e| derr(&format!("cuMemHostAlloc of {n} bytes"), e))?;
        if ptr.is_null() {
            return Err(format!("cuMemHostAlloc of {n} bytes returned a null pointer"));
        }
        // SAFETY: `n` writable bytes at `ptr`, owned by this value alone.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, n) };
        Ok(PinnedStaging { ptr, bytes, ctx: Arc::clone(ctx) })
    }

    /// The start of the memory, for the driver's copies.
    pub fn as_ptr(&self) -> *const c_void {
        self.ptr
    }

    /// The memory as `len` 4-byte elements of `dtype`'s host type (f32, or
    /// i32 for i32 and bool), or None when it holds fewer.
    pub fn slice_mut(&mut self, dtype: towers_vocab::DType, len: usize) -> Option<crate::backend::HostSliceMut<'_>> {
        use crate::backend::HostSliceMut;
        if len.checked_mul(4)? > self.bytes {
            return None;
        }
        // SAFETY: `len * 4 <= bytes` initialized (zeroed at allocation)
        // bytes, page-aligned (so aligned for f32 and i32), owned by this
        // value and borrowed mutably for the slice's lifetime.
        Some(unsafe {
            match dtype {
                towers_vocab::DType::F32 => {
                    HostSliceMut::F32(std::slice::from_raw_parts_mut(self.ptr as *mut f32, len))
                }
                _ => HostSliceMut::I32(std::slice::from_raw_parts_mut(self.ptr as *mut i32, len)),
            }
        })
    }
}

impl Drop for PinnedStaging {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by `zeroed`, freed once; the owner synchronized
        // the copies that read it before dropping (see `feeds`).
        let _ = unsafe { drv::free_host(self.ptr) };
    }
}

/// A non-blocking stream.
pub(crate) struct Stream {
    pub raw: sys::CUstream,
    ctx: Arc<CudaContext>,
}

impl Stream {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Stream, String> {
        ctx.bind_to_thread().map_err(|e| derr("cuCtxSetCurrent", e))?;
        let raw = drv::stream::create(drv::stream::StreamKind::NonBlocking).map_err(|e| derr("cuStreamCreate", e))?;
        Ok(Stream { raw, ctx: Arc::clone(ctx) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: created by `new`, destroyed once.
        unsafe {
            let _ = drv::stream::synchronize(self.raw);
            let _ = drv::stream::destroy(self.raw);
        }
    }
}

/// An event without timing (the cheapest kind), for cross-stream order.
pub(crate) struct Event {
    pub raw: sys::CUevent,
    ctx: Arc<CudaContext>,
}

impl Event {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Event, String> {
        Event::with_flags(ctx, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
    }

    /// An event that keeps its time (for traces).
    pub fn timed(ctx: &Arc<CudaContext>) -> Result<Event, String> {
        Event::with_flags(ctx, sys::CUevent_flags::CU_EVENT_DEFAULT)
    }

    fn with_flags(ctx: &Arc<CudaContext>, flags: sys::CUevent_flags) -> Result<Event, String> {
        ctx.bind_to_thread().map_err(|e| derr("cuCtxSetCurrent", e))?;
        let raw = drv::event::create(flags).map_err(|e| derr("cuEventCreate", e))?;
        Ok(Event { raw, ctx: Arc::clone(ctx) })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { drv::event::destroy(self.raw) };
    }
}

/// A cuBLAS handle bound to one stream (one handle per stream: a handle's
/// workspace must not be shared by GEMMs running concurrently).
pub(crate) struct Blas {
    pub raw: blas_sys::cublasHandle_t,
    ctx: Arc<CudaContext>,
}

impl Blas {
    pub fn new(ctx: &Arc<CudaContext>, stream: sys::CUstream) -> Result<Blas, String> {
        ctx.bind_to_thread().map_err(|e| derr("cuCtxSetCurrent", e))?;
        let raw = blas::create_handle().map_err(|e| derr("cublasCreate", e))?;
        // SAFETY: a fresh handle and a live stream of the same context.
        unsafe { blas::set_stream(raw, stream as blas_sys::cudaStream_t) }.map_err(|e| derr("cublasSetStream", e))?;
        Ok(Blas { raw, ctx: Arc::clone(ctx) })
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { blas::destroy_handle(self.raw) };
    }
}

/// A loaded module and its functions by entry name.
pub(crate) struct Module {
    raw: sys::CUmodule,
    functions: HashMap<&'static str, sys::CUfunction>,
    ctx: Arc<CudaContext>,
}

impl Module {
    pub fn load(ctx: &Arc<CudaContext>, cubin: &[u8]) -> Result<Module, String> {
        ctx.bind_to_thread().map_err(|e| derr("cuCtxSetCurrent", e))?;
        // SAFETY: a cubin produced by NVRTC for this device's architecture.
        let raw = unsafe { drv::module::load_data(cubin.as_ptr() as *const c_void) }
            .map_err(|e| derr("cuModuleLoadData", e))?;
        Ok(Module { raw, functions: HashMap::new(), ctx: Arc::clone(ctx) })
    }

    pub fn function(&mut self, entry: &'static str) -> Result<sys::CUfunction, String> {
        if let Some(f) = self.functions.get(entry) {
            return Ok(*f);
        }
        let name = CString::new(entry).map_err(|e| e.to_string())?;
        // SAFETY: a live module.
        let f = unsafe { drv::module::get_function(self.raw, name) }
            .map_err(|e| derr(&format!("cuModuleGetFunction({entry})"), e))?;
        self.functions.insert(entry, f);
        Ok(f)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: loaded by `load`, unloaded once, after every stream synchronized.
        let _ = unsafe { drv::module::unload(self.raw) };
    }
}

/// `(major, minor)` of the loaded NVRTC.
pub(crate) fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC was probed present before the backend started.
    unsafe { nvrtc::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
}

/// Cubins compiled in this process, by `towers_kernels::cuda::cache_key`
/// (source hash + architecture + NVRTC version): a second backend, or a
/// second context, does not compile again.
fn cubin_cache() -> &'static Mutex<HashMap<u64, Arc<Vec<u8>>>> {
    static CACHE: OnceLock<Mutex<HashMap<u64, Arc<Vec<u8>>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The cubin of a kernel family's source for `arch` (`sm_90`), from the
/// process cache, the disk cache ([`super::disk_cache`]) or compiled now. A
/// failed compile names the family and carries NVRTC's log.
pub(crate) fn cubin(source: &towers_kernels::cuda::Source, arch: &str) -> Result<Arc<Vec<u8>>, String> {
    let key = towers_kernels::cuda::cache_key(source, arch, nvrtc_version());
    if let Some(c) = cubin_cache().lock().map_err(|e| e.to_string())?.get(&key) {
        return Ok(Arc::clone(c));
    }
    let disk = super::disk_cache::CubinCache::from_env();
    let (image, _) = cubin_on_disk(source, arch, disk.as_ref())?;
    let image = Arc::new(image);
    cubin_cache().lock().map_err(|e| e.to_string())?.insert(key, Arc::clone(&image));
    Ok(image)
}

/// The cubin from `disk` when it holds a whole one for this source,
/// architecture and NVRTC version, else compiled and stored there (a failed
/// store is ignored); and whether it came from disk. NVRTC must
/// be present (probed by the caller).
pub(crate) fn cubin_on_disk(
    source: &towers_kernels::cuda::Source,
    arch: &str,
    disk: Option<&super::disk_cache::CubinCache>,
) -> Result<(Vec<u8>, bool), String> {
    let key = towers_kernels::cuda::cache_key(source, arch, nvrtc_version());
    if let Some(image) = disk.and_then(|d| d.get(key, arch)) {
        return Ok((image, true));
    }
    let image = compile(source.path, source.code, arch)?;
    if let Some(d) = disk {
        // A cache, not a dependency: a failed store only means the next
        // process compiles again.
        let _ = d.put(key, arch, &image);
    }
    Ok((image, false))
}

/// NVRTC straight to a cubin for a real architecture (`nvrtcGetCUBIN`):
/// the PTX of a newer NVRTC can be refused by an older driver's JIT.
fn compile(name: &str, code: &str, arch: &str) -> Result<Vec<u8>, String> {
    let fail = |what: &str, r: nvrtc::nvrtcResult| format!("NVRTC {what} for kernel family {name}: {r:?}");
    let ok = nvrtc::nvrtcResult::NVRTC_SUCCESS;
    let src = CString::new(code).map_err(|e| format!("{name}: {e}"))?;
    let cname = CString::new(name).map_err(|e| format!("{name}: {e}"))?;
    let mut prog: nvrtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NVRTC was probed present; every pointer outlives the calls.
    unsafe {
        let r =
            nvrtc::nvrtcCreateProgram(&mut prog, src.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null());
        if r != ok {
            return Err(fail("nvrtcCreateProgram", r));
        }
        let opts = [CString::new(format!("--gpu-architecture={arch}")).unwrap_or_default()];
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let result = nvrtc::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr());
        let out = if result != ok {
            let mut n = 0usize;
            nvrtc::nvrtcGetProgramLogSize(prog, &mut n);
            let mut buf = vec![0 as c_char; n.max(1)];
            nvrtc::nvrtcGetProgramLog(prog, buf.as_mut_ptr());
            let log = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
            Err(format!("NVRTC failed to compile kernel family {name} for {arch} ({result:?}):\n{log}"))
        } else {
            let mut n = 0usize;
            let r = nvrtc::nvrtcGetCUBINSize(prog, &mut n);
            if r != ok {
                Err(fail("nvrtcGetCUBINSize", r))
            } else {
                let mut image = vec![0u8; n];
                let r = nvrtc::nvrtcGetCUBIN(prog, image.as_mut_ptr() as *mut c_char);
                if r != ok {
                    Err(fail("nvrtcGetCUBIN", r))
                } else {
                    Ok(image)
                }
            }
        };
        nvrtc::nvrtcDestroyProgram(&mut prog);
        out
    }
}
