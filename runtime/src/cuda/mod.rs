//! # The CUDA backend
//!
//! Executes plans on NVIDIA GPUs through cudarc (driver API), NVRTC and
//! cuBLAS. Every library is probed before first use ([`libs`]): where one is
//! missing, [`CudaBackend::new`] returns [`CudaUnavailable`] naming it and
//! the `LD_LIBRARY_PATH` it needs, never a panic. [`probe`] still answers
//! "is there a driver" for the CLI.
//!
//! - **Devices.** Standalone, by default, one context (the primary context
//!   of GPU 0) and every logical device of a plan, `/gpu:i` and `/cpu:0`
//!   too, maps onto it: a two-tower plan runs its towers as separate
//!   streams of that context, and variables placed on `/cpu:0` live in
//!   device memory ([`Backend::device_note`](crate::Backend::device_note)
//!   says so). With [`CudaBackend::with_context_per_gpu`] each logical GPU
//!   gets a context of its own on physical GPU `i mod n`, copies between
//!   them are peer copies ([`contexts`]).
//! - **Mixed sessions** ([`part`]): the backend is a
//!   [`Part`](crate::mixed::Part) serving only the `gpu:*` devices beside a
//!   CPU backend whose memory is pinned ([`PinnedHost`],
//!   [`CudaBackend::pinned_host`]): copies to and from the host are
//!   asynchronous copies on the plan's copy streams, and events crossing to
//!   the host are stream memory operations on pinned flags. Feeds written in
//!   place are staged in pinned host memory too ([`feeds`]).
//! - **Load** ([`prepare`]) does everything that allocates or compiles:
//!   arenas, constants, streams, events, cuBLAS handles, workspaces, each
//!   kernel family compiled once per machine by NVRTC to a cubin for the
//!   device's own `sm_XY` (the PTX of a newer NVRTC is refused by an older
//!   driver's JIT), kept in memory for the process and on disk across
//!   processes ([`disk_cache`]), and loaded once per context; every
//!   launch's argument list built ([`args`], [`lower`]); and the order in
//!   which the host enqueues the streams' steps, chosen so that every
//!   `Record` is enqueued before the `Wait`s on it.
//! - **Run** ([`run`]) walks that order, or replays it as a CUDA graph
//!   ([`graph`], on unless [`CudaBackend::with_graphs`] turns them off),
//!   then synchronizes the context, so `run` returns with the step
//!   complete. Programs with an all-reduce across processes stay eager;
//!   [`Backend::program_note`](crate::Backend::program_note) says which way each program runs and why.
//!   `Step::AllReduce` with a communicator of world size 1 and no NCCL
//!   does nothing (the sum over one rank); with NCCL (any world size, 1
//!   included, which is what a one-GPU machine can run) and for more
//!   ranks, which need an NCCL communicator of that size
//!   ([`CudaBackend::with_nccl`], feature `nccl`): each bucket is then one
//!   in-place `ncclAllReduce` on its stream ([`nccl`]); without one the plan
//!   is refused at load.
//! - **Reads, writes and feeds** ([`backend`], the [`Backend`](crate::Backend) impl):
//!   synchronous copies between device memory and the caller's host slice;
//!   feeds written in place go through pinned staging buffers ([`feeds`])
//!   whose copies the next `run` waits for on the GPU.
//!
//! This file holds the backend's state ([`CudaBackend`] and the loaded
//! `Program`s it owns); field order is drop order, so every handle is
//! released before the context it belongs to.

mod args;
mod backend;
mod contexts;
pub mod disk_cache;
mod driver;
mod feeds;
mod graph;
pub mod libs;
mod lower;
#[cfg(feature = "nccl")]
pub mod nccl;
mod part;
mod pinned;
mod prepare;
mod probe;
mod run;
mod trace;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaContext;
use towers_codegen::{BufRef, Plan};
use towers_vocab::DType;

use crate::backend::{BackendError, ProgramId};
#[cfg(feature = "nccl")]
use crate::comm::Comm;
use driver::{derr, Blas, DevMem, Event, Stream};
use feeds::Feeds;
use graph::GraphState;
pub use libs::{CudaLibrary, CudaUnavailable};
use lower::{Dev, Modules, Op};
pub use pinned::PinnedHost;
pub use probe::{probe, CudaStatus};
use trace::Tracer;

/// The cubin of a kernel family for `arch` (`sm_90`) through the disk cache
/// `disk` (the backend uses [`disk_cache::CubinCache::from_env`]): read from
/// it when it holds one for this source, architecture and NVRTC version,
/// else compiled by NVRTC and stored; and whether it came from disk. Needs
/// only NVRTC, no GPU (an error naming the library when it is missing).
pub fn compile_cubin(
    source: &towers_kernels::cuda::Source,
    arch: &str,
    disk: Option<&disk_cache::CubinCache>,
) -> Result<(Vec<u8>, bool), String> {
    libs::check(&[CudaLibrary::Nvrtc]).map_err(|e| e.to_string())?;
    driver::cubin_on_disk(source, arch, disk)
}

/// Whether the CUDA backend can start here: a driver with a GPU, NVRTC and
/// cuBLAS (what `--backend auto` asks).
pub fn available() -> Result<(), CudaUnavailable> {
    libs::check(&[CudaLibrary::Driver, CudaLibrary::Nvrtc, CudaLibrary::Cublas])?;
    match probe() {
        CudaStatus::Found { devices } if devices > 0 => Ok(()),
        CudaStatus::Found { .. } => Err(CudaUnavailable::NoDevice),
        CudaStatus::NotInstalled => Err(CudaUnavailable::MissingLibrary { library: CudaLibrary::Driver }),
        CudaStatus::Error(e) => Err(CudaUnavailable::Driver(e)),
    }
}

struct Var {
    mem: DevMem,
    dtype: DType,
    shape: Vec<usize>,
    len: usize,
}

/// One op of a stream with what names it in errors and profiles.
struct Item {
    /// The index of the plan step it lowers (a step may lower to several items).
    step: usize,
    op: Op,
    kernel: &'static str,
    node: String,
}

struct StreamRun {
    items: Vec<Item>,
    /// The context the stream, its handle and its items belong to.
    ctx: Arc<CudaContext>,
    /// Declared before `stream`: dropped first.
    blas: Option<Blas>,
    /// The convolutions' im2col workspace of this stream (see [`stream_workspace_bytes`]).
    _ws: Option<DevMem>,
    /// Scratch of this stream's fused tower products (`TowerMatMulApply`).
    _scratch: Vec<DevMem>,
    stream: Stream,
    name: String,
}

struct Program {
    /// Dropped first: the graph replays this program's buffers.
    graph: GraphState,
    /// Pinned staging of the fed buffers; dropped (its copies synchronized)
    /// before the arenas they write.
    feeds: Feeds,
    plan: Plan,
    /// `(stream, item)` in host enqueue order.
    order: Vec<(usize, usize)>,
    streams: Vec<StreamRun>,
    events: Vec<Event>,
    /// One arena per plan device; `None` for a device another part serves.
    arenas: Vec<Option<DevMem>>,
    /// One side buffer per context the program's launches run in.
    _side: Vec<DevMem>,
    /// Device addresses of the step number dropout reads (one per context
    /// whose launches read it).
    step_cells: Vec<(Arc<CudaContext>, u64)>,
    /// Every context the program's streams use (synchronized after a step).
    ctxs: Vec<Arc<CudaContext>>,
    runs: u64,
    profiling: bool,
    /// Timing events while tracing is on ([`trace`]).
    tracer: Option<Tracer>,
    tracing: bool,
    loaded: Instant,
    /// Nanoseconds per `(stream, item)` while profiling.
    profile: BTreeMap<(usize, usize), u64>,
    /// The flags of the bridged events this program's streams write and
    /// wait on (a mixed session's part): dropped last, after the streams.
    bridge: Option<Arc<crate::mixed::Bridge>>,
    /// Per plan stream: whether this backend runs it (a mixed session's
    /// part runs only its devices' streams; traces list only those).
    streams_on: Vec<bool>,
}

/// The CUDA backend; see the module docs.
pub struct CudaBackend {
    // Field order is drop order: programs and variables before the modules
    // and the context they live in.
    programs: Vec<Program>,
    /// Arenas reserved for a mixed session's load ([`part`]), until loaded.
    reserved: Vec<Option<part::Reserved>>,
    vars: BTreeMap<String, Var>,
    /// The contexts of logical GPUs ([`contexts`]), when each has its own.
    slots: Vec<contexts::Slot>,
    modules: Modules,
    /// The all-reduce across processes ([`CudaBackend::with_nccl`]).
    #[cfg(feature = "nccl")]
    nccl: Option<nccl::NcclComm>,
    ctx: Arc<CudaContext>,
    gpu_name: String,
    /// Capture steps as CUDA graphs where a program allows it ([`graph`]).
    graphs: bool,
    /// Whether this backend serves a mixed session's `gpu:*` devices
    /// ([`part`]): the host's devices are then not on the GPU.
    as_part: bool,
    /// One context per logical GPU ([`CudaBackend::with_context_per_gpu`]).
    per_gpu: bool,
}

// SAFETY: the raw handles (functions, streams, events, cuBLAS handles,
// argument pointers into this struct's own heap buffers) belong to `ctx` or
// to a slot's context, which every entry point binds to the calling thread
// before it uses them (a step binds each stream's context before enqueueing
// on it); the backend is used from one thread at a time (`Backend: Send`,
// not `Sync`).
unsafe impl Send for CudaBackend {}

impl CudaBackend {
    /// A backend on GPU 0, or why not (a missing library names itself and
    /// the `LD_LIBRARY_PATH` it needs).
    pub fn new() -> Result<CudaBackend, CudaUnavailable> {
        available()?;
        let ctx = std::panic::catch_unwind(|| CudaContext::new(0))
            .map_err(|_| CudaUnavailable::Driver("the CUDA driver panicked while creating a context".into()))?
            .map_err(|e| CudaUnavailable::Driver(format!("{e:?}")))?;
        let (major, minor) = ctx.compute_capability().map_err(|e| CudaUnavailable::Driver(format!("{e:?}")))?;
        let gpu_name = ctx.name().unwrap_or_else(|_| "a GPU".into());
        let arch = format!("sm_{major}{minor}");
        Ok(CudaBackend {
            programs: Vec::new(),
            reserved: Vec::new(),
            vars: BTreeMap::new(),
            slots: Vec::new(),
            modules: Modules::new(&ctx, arch),
            #[cfg(feature = "nccl")]
            nccl: None,
            ctx,
            gpu_name,
            graphs: true,
            as_part: false,
            per_gpu: false,
        })
    }

    /// This backend with CUDA graphs on (the default) or off: with them on,
    /// a program whose arguments never change between steps is captured
    /// after its first step and every later step replays the graph
    /// ([`graph`]); off, every step launches each item from the host.
    pub fn with_graphs(mut self, on: bool) -> CudaBackend {
        self.graphs = on;
        self
    }

    /// This backend with an NCCL communicator for plans of several
    /// processes: rank `comm.rank()` of `comm.world_size()` on this GPU,
    /// set up over `comm` (collective: every rank calls it). See [`nccl`].
    #[cfg(feature = "nccl")]
    pub fn with_nccl(mut self, comm: &dyn Comm) -> Result<CudaBackend, nccl::NcclFailure> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| nccl::NcclFailure::Unavailable(CudaUnavailable::Driver(derr("cuCtxSetCurrent", e))))?;
        self.nccl = Some(nccl::NcclComm::over(comm)?);
        Ok(self)
    }

    /// The NCCL communicator's world size, when there is one.
    fn nccl_world(&self) -> Option<usize> {
        #[cfg(feature = "nccl")]
        {
            self.nccl.as_ref().map(|n| n.world_size())
        }
        #[cfg(not(feature = "nccl"))]
        {
            None
        }
    }

    /// `NVIDIA H100 80GB HBM3 (sm_90)`.
    pub fn device(&self) -> String {
        format!("{} ({})", self.gpu_name, self.modules.arch())
    }

    /// Kernel families compiled and loaded so far.
    pub fn families(&self) -> Vec<&'static str> {
        self.modules.families()
    }

    fn bind(&self) -> Result<(), BackendError> {
        self.ctx.bind_to_thread().map_err(|e| BackendError::Device(derr("cuCtxSetCurrent", e)))
    }

    fn program(&self, id: ProgramId) -> Result<&Program, BackendError> {
        self.programs.get(id.0).ok_or_else(|| BackendError::Access(format!("no program {}", id.0)))
    }

    fn resolve(&self, plan: &Plan, arenas: &[Option<DevMem>], r: &BufRef) -> Result<Dev, String> {
        match r {
            BufRef::Arena { device, buffer } => {
                let b = plan.buffer(r).ok_or_else(|| format!("buffer {device}/{buffer} does not exist"))?;
                let a = arenas.get(*device).ok_or_else(|| format!("device {device} does not exist"))?;
                let a = a.as_ref().ok_or_else(|| {
                    let d =
                        plan.devices.get(*device).map_or_else(|| device.to_string(), |d| plan.device_name(d.device));
                    format!("buffer '{}' lies on {d}, which another part of the session serves", b.name)
                })?;
                if b.offset + b.bytes > a.bytes {
                    return Err(format!("buffer '{}' lies outside its arena", b.name));
                }
                Ok(Dev { ptr: a.ptr + b.offset as u64, len: b.len(), dtype: b.dtype })
            }
            BufRef::Variable(n) => {
                let v = self.vars.get(n).ok_or_else(|| format!("variable '{n}' does not exist on the GPU"))?;
                Ok(Dev { ptr: v.mem.ptr, len: v.len, dtype: v.dtype })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_libraries_the_backend_is_a_typed_error() {
        match CudaBackend::new() {
            Ok(b) => eprintln!("CUDA backend on {}", b.device()),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("LD_LIBRARY_PATH")
                        || matches!(e, CudaUnavailable::NoDevice | CudaUnavailable::Driver(_)),
                    "{msg}"
                );
                // bench/gpu.sh's runs must not pass here without the GPU.
                if let Err(failure) = towers_kernels::require_gpu::no_gpu("the CUDA backend's unit test", &msg) {
                    panic!("{failure}");
                }
            }
        }
    }
}
