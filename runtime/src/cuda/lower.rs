//! Each plan launch as what the GPU runs, marshalled from the kernel's CUDA
//! lowering in `towers_kernels::launch` (which decides every entry, grid,
//! block and argument): here each [`launch::Arg::Operand`] becomes a device
//! address, pointer and weight arrays and scratch areas go into the side
//! buffer, and the bytes are packed. Built at load; `run` only walks the
//! result.
//!
//! GEMMs are row-major `c[m, n] = op(a) op(b)`; cuBLAS is column-major, so
//! each call computes `c^T = op(b)^T op(a)^T`: the operands swap places, the
//! transposes stay flags, nothing is copied.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};
use towers_kernels::launch::{self, Arg, Counts, LaunchOp, Operand, Which};
use towers_kernels::{DType, Kernel};

use super::args::{ArgPack, Side};
use super::driver::{cubin, Module};

/// One kernel launch.
pub(crate) struct KLaunch {
    pub f: sys::CUfunction,
    pub grid: u32,
    pub block: u32,
    /// Dynamic shared memory in bytes.
    pub smem: u32,
    pub args: ArgPack,
}

/// One row-major GEMM, `c = alpha op(a) op(b) + beta c`, or `batch` of
/// them at the element strides (0: a shared operand), one strided batched
/// cuBLAS call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub ta: bool,
    pub tb: bool,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub alpha: f32,
    pub beta: f32,
    pub batch: usize,
    pub strides: [usize; 3],
}

/// What one plan step becomes on its stream.
pub(crate) enum Op {
    Kernel(KLaunch),
    Gemm(Gemm),
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    /// A copy from another part's pinned host memory (`src`, a host
    /// address) into this part's device memory (`super::part`).
    CopyHtoD {
        dst: u64,
        src: usize,
        bytes: usize,
    },
    /// A copy from this part's device memory into another part's pinned
    /// host memory (`dst`, a host address).
    CopyDtoH {
        dst: usize,
        src: u64,
        bytes: usize,
    },
    /// A copy between two contexts' device memory (one per logical GPU):
    /// `cuMemcpyPeerAsync`.
    CopyPeer {
        dst: u64,
        dst_ctx: sys::CUcontext,
        src: u64,
        src_ctx: sys::CUcontext,
        bytes: usize,
    },
    Record(usize),
    Wait(usize),
    /// A bridged event recorded here: write 1 into its flag (device
    /// address of the bridge's pinned flag) once the stream's earlier work
    /// is done (`cuStreamWriteValue32`).
    Signal {
        event: usize,
        flag: u64,
    },
    /// A bridged event recorded by another part: the stream waits until
    /// its flag is at least 1 (`cuStreamWaitValue32`).
    WaitFlag(u64),
    /// `Step::AllReduce` with a world of one rank: the sum over one rank is
    /// the buffer itself, so nothing runs.
    Nothing,
    /// `Step::AllReduce` over several processes: NCCL's in-place sum of the
    /// `count` f32 at `ptr` (the backend's `NcclComm`).
    AllReduce {
        ptr: u64,
        count: usize,
    },
}

/// The compiled kernel families of one context.
pub(crate) struct Modules {
    ctx: Arc<CudaContext>,
    arch: String,
    loaded: HashMap<&'static str, Module>,
}

impl Modules {
    pub fn new(ctx: &Arc<CudaContext>, arch: String) -> Modules {
        Modules { ctx: Arc::clone(ctx), arch, loaded: HashMap::new() }
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Families compiled so far.
    pub fn families(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.loaded.keys().copied().collect();
        v.sort();
        v
    }

    /// The function `entry` of `family`, compiling and loading the family on first use.
    pub fn function(&mut self, family: &'static str, entry: &'static str) -> Result<sys::CUfunction, String> {
        if !self.loaded.contains_key(family) {
            let src =
                towers_kernels::cuda::source(family).ok_or_else(|| format!("no CUDA source for family {family}"))?;
            let image = cubin(src, &self.arch)?;
            self.loaded.insert(family, Module::load(&self.ctx, &image)?);
        }
        self.loaded.get_mut(family).ok_or("unreachable")?.function(entry)
    }
}

/// A resolved launch operand: device address and element count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dev {
    pub ptr: u64,
    pub len: usize,
    pub dtype: DType,
}

/// Build the ops of one launch. `ins`, `outs`, `ws` are resolved operands.
pub(crate) fn lower_launch(
    kernel: &Kernel,
    ins: &[Dev],
    outs: &[Dev],
    ws: Option<Dev>,
    mods: &mut Modules,
    side: &mut Side,
    ops: &mut Vec<Op>,
) -> Result<(), String> {
    let lens = |v: &[Dev]| v.iter().map(|d| d.len).collect::<Vec<_>>();
    let (in_lens, out_lens) = (lens(ins), lens(outs));
    let counts = Counts { ins: &in_lens, outs: &out_lens, workspace: ws.map(|w| w.len) };
    let low = launch::lower(kernel, counts).map_err(|e| e.to_string())?;
    let addr = |o: Operand| -> Result<u64, String> {
        let d = match o.which {
            Which::In(i) => ins.get(i),
            Which::Out(j) => outs.get(j),
            Which::Workspace => ws.as_ref(),
        };
        let d = d.ok_or_else(|| format!("{}: no operand {} in this launch", kernel.name(), o.which))?;
        if o.offset > d.len {
            return Err(format!("{}: offset {} past the {} elements of {}", kernel.name(), o.offset, d.len, o.which));
        }
        Ok(d.ptr + (o.offset * 4) as u64)
    };
    // Each scratch area of this lowering: zeroed side data it alone uses.
    let scratch: Vec<usize> = low.scratch.iter().map(|&n| side.push(&vec![0f32; n])).collect();
    for op in &low.ops {
        match op {
            LaunchOp::Gemm(g) => ops.push(Op::Gemm(Gemm {
                m: g.m,
                n: g.n,
                k: g.k,
                ta: g.trans_a,
                tb: g.trans_b,
                a: addr(g.a)?,
                b: addr(g.b)?,
                c: addr(g.c)?,
                alpha: g.alpha,
                beta: g.beta,
                batch: g.batch,
                strides: [g.stride_a, g.stride_b, g.stride_c],
            })),
            LaunchOp::Launch(l) => {
                let mut a = ArgPack::new();
                for arg in &l.args {
                    match arg {
                        Arg::Operand(o) => a.ptr(addr(*o)?),
                        Arg::Null => a.ptr(0),
                        Arg::I32(v) => a.i32(*v),
                        Arg::I64(v) => a.i64(*v),
                        Arg::U64(v) => a.u64(*v),
                        Arg::F32(v) => a.f32(*v),
                        Arg::Dims4(d) => a.push(*d),
                        Arg::Pool(p) => a.push(*p),
                        Arg::Conv(c) => a.push(*c),
                        Arg::Step => a.step(),
                        Arg::Operands(v) => {
                            let p = v
                                .iter()
                                .map(|&which| addr(Operand { which, offset: 0 }))
                                .collect::<Result<Vec<_>, _>>()?;
                            a.side_ptr(side.push(&p))
                        }
                        Arg::F32s(v) => a.side_ptr(side.push(v)),
                        Arg::I64s(v) => a.side_ptr(side.push(v)),
                        Arg::Scratch(k) => {
                            let off =
                                scratch.get(*k).ok_or_else(|| format!("{}: no scratch area {k}", kernel.name()))?;
                            a.side_ptr(*off)
                        }
                    };
                }
                let f = mods.function(l.family, l.entry)?;
                a.finish();
                ops.push(Op::Kernel(KLaunch { f, grid: l.grid, block: l.block, smem: l.shared_bytes, args: a }));
            }
        }
    }
    Ok(())
}
