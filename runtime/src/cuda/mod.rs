//! # The CUDA backend
//!
//! Executes plans on one NVIDIA GPU through cudarc (driver API), NVRTC and
//! cuBLAS. Every library is probed before first use ([`libs`]): where one is
//! missing, [`CudaBackend::new`] returns [`CudaUnavailable`] naming it and
//! the `LD_LIBRARY_PATH` it needs, never a panic. [`probe`] still answers
//! "is there a driver" for the CLI.
//!
//! - **Devices.** One context on GPU 0. Every logical device of a plan,
//!   `/gpu:i` and, in this first version, `/cpu:0` too, maps onto that one
//!   GPU: a two-tower plan runs its towers as separate streams of the same
//!   GPU ([`Backend::device_note`] says so). Variables placed on `/cpu:0`
//!   therefore live in device memory as well (pinned host memory for them is
//!   not done; feeds written in place are staged in pinned host memory,
//!   [`feeds`]).
//! - **Load** does everything that allocates or compiles: one device
//!   allocation per plan device (`DevicePlan::arena_bytes`), every buffer
//!   and view at its plan offset; constants uploaded; one CUDA stream per
//!   plan stream, one CUDA event per plan event, one cuBLAS handle per
//!   stream that runs GEMMs; each kernel family compiled once per machine by
//!   NVRTC to a cubin for the device's own `sm_XY` (the PTX of a newer NVRTC
//!   is refused by an older driver's JIT), kept in memory for the process
//!   and on disk across processes ([`disk_cache`]), and loaded once per
//!   context; every
//!   launch's argument list built ([`args`], [`lower`]); one im2col
//!   workspace per stream, sized for whole convolutions rather than the
//!   plan's cache-sized chunks; pointer and weight
//!   arrays uploaded into one side buffer; and the order in which the host
//!   enqueues the streams' steps, chosen so that every `Record` is enqueued
//!   before the `Wait`s on it.
//! - **Run** walks that order: launches (`cuLaunchKernel`), cuBLAS SGEMMs,
//!   device-to-device `cuMemcpyAsync` copies, `cuEventRecord` /
//!   `cuStreamWaitEvent`; then the context is synchronized, so `run`
//!   returns with the step complete. Dropout reads the step number (the
//!   program's run count) from the side buffer's first word, written before
//!   the step; no argument list changes after load.
//! - **CUDA graphs** ([`graph`], on unless [`CudaBackend::with_graphs`]
//!   turns them off): after a program's first eager step, the same step is
//!   captured once and every later step is one `cuGraphLaunch` replaying
//!   it, bit for bit what the eager step computes. Programs with an
//!   all-reduce across processes stay eager; [`Backend::program_note`] says
//!   which way each program runs and why. `Step::AllReduce` with a
//!   communicator of world size 1 and no NCCL does nothing (the sum over
//!   one rank); with NCCL (any world size, 1 included, which is what a
//!   one-GPU machine can run) and for more ranks, which need an NCCL
//!   communicator of that size
//!   ([`CudaBackend::with_nccl`], feature `nccl`): each bucket is then one
//!   in-place `ncclAllReduce` on its stream ([`nccl`]); without one the plan
//!   is refused at load.
//! - **Reads and writes** of buffers and variables are synchronous copies
//!   between device memory and the caller's host slice; a buffer write
//!   also waits for its DMA (a copy from pageable memory may return before
//!   it lands, and the step's non-blocking streams are not ordered with the
//!   legacy stream it runs on).
//! - **Feeds written in place** ([`feeds`]): load makes one pinned host
//!   staging buffer per fed placeholder; `Backend::with_feed_buffer` lends
//!   it, then enqueues its asynchronous copy on the program's copy stream;
//!   the next `run` makes the streams it starts on wait for those copies
//!   on the GPU (the host does not block), and synchronous reads and writes
//!   of the program's buffers wait for them first.

mod args;
pub mod disk_cache;
mod driver;
mod feeds;
mod graph;
pub mod libs;
mod lower;
#[cfg(feature = "nccl")]
pub mod nccl;
mod probe;
mod trace;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result as drv, sys, CudaContext};
use towers_codegen::{BufRef, Plan, Step, VariableDecl};
use towers_graph::DType;
use towers_kernels::Kernel;

use crate::backend::{Backend, BackendError, HostSlice, HostSliceMut, Profiled, ProgramId};
use crate::comm::Comm;
use crate::trace::Trace;
use args::Side;
use driver::{derr, Blas, DevMem, Event, Stream};
use feeds::Feeds;
use graph::{GraphState, StepGraph};
pub use libs::{CudaLibrary, CudaUnavailable};
use lower::{lower_launch, Dev, Gemm, Modules, Op};
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
    arenas: Vec<DevMem>,
    _side: DevMem,
    /// Device address of the step number dropout reads, when a launch reads it.
    step_cell: Option<u64>,
    runs: u64,
    profiling: bool,
    /// Timing events while tracing is on ([`trace`]).
    tracer: Option<Tracer>,
    tracing: bool,
    loaded: Instant,
    /// Nanoseconds per `(stream, item)` while profiling.
    profile: BTreeMap<(usize, usize), u64>,
}

/// The CUDA backend; see the module docs.
pub struct CudaBackend {
    // Field order is drop order: programs and variables before the modules
    // and the context they live in.
    programs: Vec<Program>,
    vars: BTreeMap<String, Var>,
    modules: Modules,
    /// The all-reduce across processes ([`CudaBackend::with_nccl`]).
    #[cfg(feature = "nccl")]
    nccl: Option<nccl::NcclComm>,
    ctx: Arc<CudaContext>,
    gpu_name: String,
    /// Capture steps as CUDA graphs where a program allows it ([`graph`]).
    graphs: bool,
}

// SAFETY: the raw handles (functions, streams, events, cuBLAS handles,
// argument pointers into this struct's own heap buffers) belong to `ctx`,
// which every entry point binds to the calling thread before use; the
// backend is used from one thread at a time (`Backend: Send`, not `Sync`).
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
            vars: BTreeMap::new(),
            modules: Modules::new(&ctx, arch),
            #[cfg(feature = "nccl")]
            nccl: None,
            ctx,
            gpu_name,
            graphs: true,
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

    fn resolve(&self, plan: &Plan, arenas: &[DevMem], r: &BufRef) -> Result<Dev, String> {
        match r {
            BufRef::Arena { device, buffer } => {
                let b = plan.buffer(r).ok_or_else(|| format!("buffer {device}/{buffer} does not exist"))?;
                let a = arenas.get(*device).ok_or_else(|| format!("device {device} does not exist"))?;
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

    fn prepare(&mut self, plan: &Plan, comm: &Arc<dyn Comm>) -> Result<Program, BackendError> {
        let bad = BackendError::BadPlan;
        let dev = BackendError::Device;
        self.bind()?;
        for v in &plan.variables {
            if !self.vars.contains_key(&v.name) {
                return Err(bad(format!("variable '{}' was not created before load", v.name)));
            }
        }
        let arenas = plan
            .devices
            .iter()
            .map(|d| DevMem::zeroed(&self.ctx, d.arena_bytes))
            .collect::<Result<Vec<_>, _>>()
            .map_err(dev)?;
        for c in &plan.constants {
            let d = self.resolve(plan, &arenas, &c.buffer).map_err(bad)?;
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
        let events = (0..plan.num_events).map(|_| Event::new(&self.ctx)).collect::<Result<Vec<_>, _>>().map_err(dev)?;
        let mut side = Side::default();
        let mut streams = Vec::new();
        for s in &plan.streams {
            let ws_mem = match stream_workspace_bytes(s) {
                0 => None,
                n => Some(DevMem::zeroed(&self.ctx, n).map_err(dev)?),
            };
            let ws_dev = ws_mem.as_ref().map(|m| Dev { ptr: m.ptr, len: m.bytes / 4, dtype: DType::F32 });
            let mut items: Vec<Item> = Vec::new();
            let mut scratch = Vec::new();
            for (j, step) in s.steps.iter().enumerate() {
                match step {
                    Step::Record(e) | Step::Wait(e) if *e >= plan.num_events => {
                        return Err(bad(format!("event {e} is out of range (the plan has {})", plan.num_events)))
                    }
                    Step::Record(e) => {
                        items.push(Item { step: j, op: Op::Record(*e), kernel: "record", node: String::new() })
                    }
                    Step::Wait(e) => {
                        items.push(Item { step: j, op: Op::Wait(*e), kernel: "wait", node: String::new() })
                    }
                    Step::Copy { from, to, bytes, node } => {
                        let f = self.resolve(plan, &arenas, from).map_err(bad)?;
                        let t = self.resolve(plan, &arenas, to).map_err(bad)?;
                        if f.len != t.len || f.len * 4 != *bytes {
                            return Err(bad(format!("copy '{node}' has mismatched buffers")));
                        }
                        let op = Op::Copy { dst: t.ptr, src: f.ptr, bytes: *bytes };
                        items.push(Item { step: j, op, kernel: "copy", node: node.clone() });
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
                            let mem = DevMem::zeroed(&self.ctx, m * n * 4).map_err(dev)?;
                            ws = Some(Dev { ptr: mem.ptr, len: m * n, dtype: DType::F32 });
                            scratch.push(mem);
                        }
                        let mut ops = Vec::new();
                        lower_launch(kernel, &ins, &outs, ws, &mut self.modules, &mut side, &mut ops).map_err(|e| {
                            if e.starts_with("NVRTC") || e.starts_with("cu") {
                                dev(format!("node '{node}' ({}): {e}", kernel.name()))
                            } else {
                                bad(format!("node '{node}': the CUDA backend cannot run kernel {}: {e}", kernel.name()))
                            }
                        })?;
                        items.extend(ops.into_iter().map(|op| Item {
                            step: j,
                            op,
                            kernel: kernel.name(),
                            node: node.clone(),
                        }));
                    }
                }
            }
            let stream = Stream::new(&self.ctx).map_err(dev)?;
            let blas = if items.iter().any(|i| matches!(i.op, Op::Gemm(_))) {
                Some(Blas::new(&self.ctx, stream.raw).map_err(dev)?)
            } else {
                None
            };
            streams.push(StreamRun { items, blas, _ws: ws_mem, _scratch: scratch, stream, name: s.name() });
        }
        // Never empty: its first word is the step number (`args::STEP_CELL`).
        let side_mem = DevMem::zeroed(&self.ctx, side.bytes.len()).map_err(dev)?;
        // SAFETY: `side_mem` holds `side.bytes.len()` bytes.
        unsafe { drv::memcpy_htod_sync(side_mem.ptr, &side.bytes) }
            .map_err(|e| dev(derr("uploading launch tables", e)))?;
        for s in &mut streams {
            for it in &mut s.items {
                if let Op::Kernel(k) = &mut it.op {
                    k.args.patch_side(side_mem.ptr);
                }
            }
        }
        let feeds = Feeds::new(&self.ctx, plan, |r| self.resolve(plan, &arenas, r)).map_err(dev)?;
        let order = enqueue_order(&streams, plan.num_events).map_err(bad)?;
        let graph = graph_state(self.graphs, &streams);
        let uses_step =
            streams.iter().flat_map(|s| &s.items).any(|i| matches!(&i.op, Op::Kernel(l) if l.args.uses_step));
        let step_cell = uses_step.then_some(side_mem.ptr + args::STEP_CELL as u64);
        Ok(Program {
            graph,
            feeds,
            plan: plan.clone(),
            order,
            streams,
            events,
            arenas,
            _side: side_mem,
            step_cell,
            runs: 0,
            profiling: false,
            tracer: None,
            tracing: false,
            loaded: Instant::now(),
            profile: BTreeMap::new(),
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
        if let Step::Launch { kernel, .. } = step {
            if let Kernel::Conv2D { geom, .. }
            | Kernel::Conv2DBiasAct { geom, .. }
            | Kernel::Conv2DBackpropInput { geom, .. }
            | Kernel::Conv2DBackpropFilter { geom, .. } = kernel
            {
                bytes = bytes.max(towers_kernels::launch::conv_workspace_floats(geom) * 4);
            }
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

/// A row-major GEMM as cuBLAS's column-major `c^T = op(b)^T op(a)^T`.
///
/// # Safety
/// The handle and every pointer are live; the sizes match the buffers.
unsafe fn gemm(h: blas_sys::cublasHandle_t, g: &Gemm) -> Result<(), String> {
    use blas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
    let (op_a, lda) = if g.ta { (CUBLAS_OP_T, g.m) } else { (CUBLAS_OP_N, g.k) };
    let (op_b, ldb) = if g.tb { (CUBLAS_OP_T, g.k) } else { (CUBLAS_OP_N, g.n) };
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

/// Whether a program's steps can replay a graph ([`graph`]'s invariants):
/// graphs wanted and no all-reduce across processes (argument lists never
/// change after load: dropout reads its step from device memory).
fn graph_state(wanted: bool, streams: &[StreamRun]) -> GraphState {
    if !wanted {
        return GraphState::Eager("CUDA graphs are turned off".into());
    }
    for it in streams.iter().flat_map(|s| &s.items) {
        match &it.op {
            Op::AllReduce { .. } => {
                return GraphState::Eager(format!("'{}' is an all-reduce across processes", it.node))
            }
            _ => {}
        }
    }
    GraphState::Pending
}

/// Enqueue one step: every item in the program's host order, on its
/// stream. With `profile`, each item is synchronized and timed on the host.
fn enqueue(
    streams: &mut [StreamRun],
    events: &[Event],
    order: &[(usize, usize)],
    #[cfg(feature = "nccl")] nccl: Option<&nccl::NcclComm>,
    mut profile: Option<&mut BTreeMap<(usize, usize), u64>>,
    tracer: Option<&Tracer>,
) -> Result<(), BackendError> {
    for &(s, k) in order {
        let st = &mut streams[s];
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
    Ok(())
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    /// Free device memory of the one GPU (every logical device maps onto it).
    fn memory_available(&self) -> Option<u64> {
        self.ctx.mem_get_info().ok().map(|(free, _total)| free as u64)
    }

    fn create_variable(&mut self, decl: &VariableDecl, init: HostSlice<'_>) -> Result<(), BackendError> {
        if self.vars.contains_key(&decl.name) {
            return Err(BackendError::Access(format!("variable '{}' already exists", decl.name)));
        }
        let len: usize = decl.shape.iter().product();
        if init.len() != len || !init.fits(decl.dtype) {
            return Err(BackendError::Access(format!(
                "variable '{}' is {}{:?}; the initial value has another dtype or {} elements",
                decl.name,
                decl.dtype,
                decl.shape,
                init.len()
            )));
        }
        let mem = DevMem::zeroed(&self.ctx, len * 4).map_err(BackendError::Device)?;
        // SAFETY: `mem` holds `len` 4-byte elements.
        let r = match init {
            HostSlice::F32(s) => unsafe { drv::memcpy_htod_sync(mem.ptr, s) },
            HostSlice::I32(s) => unsafe { drv::memcpy_htod_sync(mem.ptr, s) },
        };
        r.map_err(|e| BackendError::Device(derr("uploading a variable", e)))?;
        self.vars.insert(decl.name.clone(), Var { mem, dtype: decl.dtype, shape: decl.shape.clone(), len });
        Ok(())
    }

    fn load(&mut self, _name: &str, plan: &Plan, comm: Arc<dyn Comm>) -> Result<ProgramId, BackendError> {
        let p = self.prepare(plan, &comm)?;
        self.programs.push(p);
        Ok(ProgramId(self.programs.len() - 1))
    }

    fn run(&mut self, id: ProgramId) -> Result<(), BackendError> {
        self.bind()?;
        let ctx = Arc::clone(&self.ctx);
        #[cfg(feature = "nccl")]
        let nccl = self.nccl.as_ref();
        let p = self.programs.get_mut(id.0).ok_or_else(|| BackendError::Access(format!("no program {}", id.0)))?;
        let sync = |ctx: &CudaContext| {
            ctx.synchronize()
                .map_err(|e| BackendError::Device(derr("the step failed on the GPU (cuCtxSynchronize)", e)))
        };
        if let Some(cell) = p.step_cell {
            // SAFETY: the side buffer's first 8 bytes; the previous step has completed.
            unsafe { drv::memcpy_htod_sync(cell, &[p.runs]) }
                .map_err(|e| BackendError::Device(derr("writing the step number", e)))?;
        }
        let eager = p.profiling || p.tracing;
        if let (GraphState::Ready(g), false) = (&p.graph, eager) {
            // The replay starts on the graph's origin stream: it waits there for the staged feeds.
            p.feeds.order_before_step(std::iter::once(g.origin.raw)).map_err(BackendError::Device)?;
            g.launch().map_err(BackendError::Device)?;
            sync(&ctx)?;
            p.feeds.completed();
            p.runs += 1;
            return Ok(());
        }
        p.feeds.order_before_step(p.streams.iter().map(|s| s.stream.raw)).map_err(BackendError::Device)?;
        let started = Instant::now();
        let tracer = if p.tracing { p.tracer.as_ref() } else { None };
        if let (Some(t), Some(first)) = (tracer, p.streams.first()) {
            // SAFETY: a live stream of this context.
            unsafe { t.start(first.stream.raw) }.map_err(BackendError::Device)?;
        }
        let profile = if p.profiling { Some(&mut p.profile) } else { None };
        enqueue(
            &mut p.streams,
            &p.events,
            &p.order,
            #[cfg(feature = "nccl")]
            nccl,
            profile,
            tracer,
        )?;
        sync(&ctx)?;
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
            let raw: Vec<sys::CUstream> = p.streams.iter().map(|s| s.stream.raw).collect();
            let (streams, events, order) = (&mut p.streams, &p.events, &p.order);
            let captured = StepGraph::capture(&ctx, &raw, || {
                enqueue(
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

    fn write_buffer(&mut self, id: ProgramId, r: &BufRef, data: HostSlice<'_>) -> Result<(), BackendError> {
        self.bind()?;
        let p = self.program(id)?;
        let d = self.resolve(&p.plan, &p.arenas, r).map_err(BackendError::Access)?;
        if d.len != data.len() || !data.fits(d.dtype) {
            return Err(BackendError::Access(format!(
                "{} is {} with {} elements; the host data has another dtype or {} elements",
                p.plan.ref_name(r),
                d.dtype,
                d.len,
                data.len()
            )));
        }
        // An older staged copy to this buffer must not land after this one.
        p.feeds.settle().map_err(BackendError::Device)?;
        // SAFETY: `d` is a live device range of `d.len` 4-byte elements; no step is running.
        let res = match data {
            HostSlice::F32(s) => unsafe { drv::memcpy_htod_sync(d.ptr, s) },
            HostSlice::I32(s) => unsafe { drv::memcpy_htod_sync(d.ptr, s) },
        };
        res.map_err(|e| BackendError::Device(derr("cuMemcpyHtoD", e)))?;
        // From pageable memory the synchronous copy may return before its
        // last DMA lands (CUDA's documented behaviour), and the step's
        // non-blocking streams are not ordered with the legacy stream it
        // ran on: wait for it, so the next step (or a later staged copy of
        // this buffer) comes after it.
        // SAFETY: the null handle names the context's legacy stream.
        unsafe { drv::stream::synchronize(std::ptr::null_mut()) }
            .map_err(|e| BackendError::Device(derr("cuStreamSynchronize (legacy stream)", e)))
    }

    /// The feed's pinned staging buffer (made at load), copied to the GPU
    /// asynchronously when `fill` returns; the next `run` waits for it.
    fn with_feed_buffer(
        &mut self,
        id: ProgramId,
        r: &BufRef,
        fill: &mut dyn FnMut(HostSliceMut<'_>),
    ) -> Result<bool, BackendError> {
        self.bind()?;
        let p = self.programs.get_mut(id.0).ok_or_else(|| BackendError::Access(format!("no program {}", id.0)))?;
        p.feeds.lend(&p.plan, r, fill)?;
        Ok(true)
    }

    fn read_buffer(&self, id: ProgramId, r: &BufRef, out: HostSliceMut<'_>) -> Result<(), BackendError> {
        self.bind()?;
        let p = self.program(id)?;
        let d = self.resolve(&p.plan, &p.arenas, r).map_err(BackendError::Access)?;
        if d.len != out.len() || !out.fits(d.dtype) {
            return Err(BackendError::Access(format!(
                "{} is {} with {} elements; the host memory has another dtype or {} elements",
                p.plan.ref_name(r),
                d.dtype,
                d.len,
                out.len()
            )));
        }
        // A feed written in place may still be crossing the bus.
        p.feeds.settle().map_err(BackendError::Device)?;
        // SAFETY: as `write_buffer`.
        let res = match out {
            HostSliceMut::F32(s) => unsafe { drv::memcpy_dtoh_sync(s, d.ptr) },
            HostSliceMut::I32(s) => unsafe { drv::memcpy_dtoh_sync(s, d.ptr) },
        };
        res.map_err(|e| BackendError::Device(derr("cuMemcpyDtoH", e)))
    }

    fn write_variable(&mut self, name: &str, data: HostSlice<'_>) -> Result<(), BackendError> {
        self.bind()?;
        let v = self.vars.get(name).ok_or_else(|| BackendError::Access(format!("variable '{name}' does not exist")))?;
        if v.len != data.len() || !data.fits(v.dtype) {
            return Err(BackendError::Access(format!(
                "variable '{name}' is {}{:?}; the host data has another dtype or {} elements",
                v.dtype,
                v.shape,
                data.len()
            )));
        }
        // SAFETY: the variable's allocation holds `v.len` elements; no step is running.
        let res = match data {
            HostSlice::F32(s) => unsafe { drv::memcpy_htod_sync(v.mem.ptr, s) },
            HostSlice::I32(s) => unsafe { drv::memcpy_htod_sync(v.mem.ptr, s) },
        };
        res.map_err(|e| BackendError::Device(derr("cuMemcpyHtoD", e)))
    }

    fn read_variable(&self, name: &str, out: HostSliceMut<'_>) -> Result<(), BackendError> {
        self.bind()?;
        let v = self.vars.get(name).ok_or_else(|| BackendError::Access(format!("variable '{name}' does not exist")))?;
        if v.len != out.len() || !out.fits(v.dtype) {
            return Err(BackendError::Access(format!(
                "variable '{name}' is {}{:?}; the host memory has another dtype or {} elements",
                v.dtype,
                v.shape,
                out.len()
            )));
        }
        // SAFETY: as `write_variable`.
        let res = match out {
            HostSliceMut::F32(s) => unsafe { drv::memcpy_dtoh_sync(s, v.mem.ptr) },
            HostSliceMut::I32(s) => unsafe { drv::memcpy_dtoh_sync(s, v.mem.ptr) },
        };
        res.map_err(|e| BackendError::Device(derr("cuMemcpyDtoH", e)))
    }

    /// Profiling synchronizes after every item and times it on the host
    /// (launch and execution together): slower steps, exact attribution.
    fn set_profiling(&mut self, id: ProgramId, on: bool) {
        if let Some(p) = self.programs.get_mut(id.0) {
            p.profiling = on;
            p.profile.clear();
        }
    }

    fn profile(&self, id: ProgramId) -> Vec<Profiled> {
        let Some(p) = self.programs.get(id.0) else { return Vec::new() };
        p.profile
            .iter()
            .map(|(&(s, k), &nanos)| {
                let it = &p.streams[s].items[k];
                Profiled { stream: p.streams[s].name.clone(), kernel: it.kernel, node: it.node.clone(), nanos }
            })
            .collect()
    }

    /// Traced steps launch eagerly with timing events around every plan
    /// step ([`trace`]); the events are created the first time tracing is
    /// turned on, so a traced run allocates nothing.
    fn set_tracing(&mut self, id: ProgramId, on: bool) -> Result<(), BackendError> {
        self.bind()?;
        let ctx = Arc::clone(&self.ctx);
        let p = self.programs.get_mut(id.0).ok_or_else(|| BackendError::Access(format!("no program {}", id.0)))?;
        if on && p.tracer.is_none() {
            let steps: Vec<usize> = p.plan.streams.iter().map(|s| s.steps.len()).collect();
            p.tracer = Some(Tracer::new(&ctx, &steps).map_err(BackendError::Device)?);
        }
        p.tracing = on;
        Ok(())
    }

    fn trace(&self, id: ProgramId) -> Result<Trace, BackendError> {
        let p = self.program(id)?;
        let label = |s: usize, j: usize| -> Option<(&'static str, String)> {
            let step = p.plan.streams.get(s)?.steps.get(j)?;
            match step {
                Step::Record(_) => None,
                Step::Wait(e) => Some(("wait", format!("event {e}"))),
                Step::Copy { node, .. } => Some(("copy", node.clone())),
                Step::AllReduce { node, .. } => Some(("all_reduce", node.clone())),
                Step::Launch { kernel, node, .. } => Some((kernel.name(), node.clone())),
            }
        };
        p.tracer
            .as_ref()
            .and_then(|t| t.trace(label))
            .ok_or_else(|| BackendError::Access("no step of this program has run with tracing on".into()))
    }

    fn steps_run(&self, id: ProgramId) -> u64 {
        self.programs.get(id.0).map_or(0, |p| p.runs)
    }

    /// `runs` is the step dropout sees (`let step = p.runs` in `run`).
    fn set_step(&mut self, id: ProgramId, step: u64) {
        if let Some(p) = self.programs.get_mut(id.0) {
            p.runs = step;
        }
    }

    fn program_note(&self, id: ProgramId) -> Option<String> {
        self.programs.get(id.0).map(|p| p.graph.describe())
    }

    fn device_note(&self, gpus: &[String]) -> String {
        if gpus.is_empty() {
            return format!("cpu:0 runs on the one CUDA device {}", self.device());
        }
        let names = match gpus.len() {
            0 | 1 => gpus.concat(),
            n => format!("{} and {}", gpus[..n - 1].join(", "), gpus[n - 1]),
        };
        let how = if gpus.len() > 1 { ", as separate streams" } else { "" };
        format!("{names} run on the one CUDA device {}{how}; cpu:0's steps and variables run on it too", self.device())
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
