//! The CUDA lowering of every plan kernel, as data: for a [`Kernel`] and the
//! element counts of its operands, the list of [`LaunchOp`]s a GPU runs —
//! CUDA C launches (family, entry point, grid, block, dynamic shared
//! memory, argument list) and cuBLAS GEMMs. No CUDA dependency: the CUDA
//! backend resolves each [`Arg::Operand`] to a device address and packs the
//! bytes; the plan text prints each launch's entry and geometry; `--emit
//! cuda` lists them in the emitted files' headers; the twin tests build
//! their launches here, so the argument order is written once.
//!
//! ## Invariants
//! - Deterministic: the ops depend on the kernel and the counts only.
//! - Each kernel is lowered by its family (`lower` in
//!   `kernels/src/<family>/desc.rs`); this module holds the types and the
//!   context they fill.
//! - Every entry point is named once, in the `entries!` list of the family
//!   whose `.cu` defines it ([`entries::all`] collects them).
//! - Op codes come from the op tables (`op.code()`), never a position.
//! - Operand offsets ([`Operand::offset`]) count elements (4 bytes each:
//!   every launch operand is f32, i32 or bool-as-u32).
//! - A [`Arg::Scratch`] area belongs to this lowering alone (zeroed once at
//!   load); [`Lowering::scratch`] gives its size in f32.

use std::fmt;

use thiserror::Error;

use crate::cuda::{ConvArgs, Dims4, PoolArgs, BLOCK};
use crate::Kernel;

pub mod entries;
mod text;

#[cfg(test)]
mod tests;

pub use crate::conv::desc::{conv_workspace_floats, MAX_WORKSPACE_BYTES};
pub use entries::Entry;

/// Which operand of the plan launch an argument points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The launch's input `i`.
    In(usize),
    /// The launch's output `j`.
    Out(usize),
    /// The launch's workspace (the stream's column buffer for a
    /// convolution, the product's scratch for a fused tower update).
    Workspace,
}

/// A device address: an operand, `offset` elements in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    pub which: Which,
    pub offset: usize,
}

/// One argument of a CUDA launch, in parameter order.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    /// A device pointer to an operand.
    Operand(Operand),
    /// A null device pointer (an optional argument left out).
    Null,
    I32(i32),
    I64(i64),
    U64(u64),
    F32(f32),
    Dims4(Dims4),
    Pool(PoolArgs),
    Conv(ConvArgs),
    /// The device address of the step number (a `u64` the backend writes
    /// before each step).
    Step,
    /// The device address of an array of the listed operands' addresses.
    Operands(Vec<Which>),
    /// The device address of an array of these `f32`.
    F32s(Vec<f32>),
    /// The device address of an array of these `i64`.
    I64s(Vec<i64>),
    /// The device address of this lowering's scratch area `k`.
    Scratch(usize),
}

/// One CUDA C launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The family whose `.cu` defines the entry (`crate::cuda::source`), or
    /// a generated fused family (`crate::cuda::fused_source`).
    pub family: &'static str,
    /// The `extern "C" __global__` entry point.
    pub entry: &'static str,
    pub grid: u32,
    pub block: u32,
    /// Dynamic shared memory in bytes (every kernel today sizes its shared
    /// arrays statically: 0).
    pub shared_bytes: u32,
    pub args: Vec<Arg>,
}

/// A row-major GEMM `c[m, n] = alpha op(a) op(b) + beta c` (cuBLAS), or
/// `batch` of them: product `i` reads `a + i*stride_a`, `b + i*stride_b`
/// and writes `c + i*stride_c` (elements; a stride 0 shares that operand),
/// one strided batched cuBLAS call. `batch == 1`: one GEMM, strides unused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
    pub alpha: f32,
    pub beta: f32,
    pub batch: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
}

/// One GPU operation of a lowered kernel.
#[derive(Debug, Clone, PartialEq)]
pub enum LaunchOp {
    Launch(Launch),
    Gemm(Gemm),
}

/// Everything a plan kernel becomes on a GPU, in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Lowering {
    pub ops: Vec<LaunchOp>,
    /// Sizes in f32 of the scratch areas [`Arg::Scratch`] indexes.
    pub scratch: Vec<usize>,
}

impl Lowering {
    /// The CUDA C launches alone, in order.
    pub fn launches(&self) -> impl Iterator<Item = &Launch> {
        self.ops.iter().filter_map(|o| match o {
            LaunchOp::Launch(l) => Some(l),
            LaunchOp::Gemm(_) => None,
        })
    }
}

/// Why a kernel has no CUDA lowering for these operands.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LaunchError {
    /// The launch has fewer operands than its kernel reads or writes.
    #[error("{kernel}: missing {which:?} (the plan launch has too few operands for this kernel)")]
    Missing { kernel: &'static str, which: Which },
    /// A shape of rank above 4.
    #[error("{kernel}: rank {rank} is above 4, the CUDA kernels' limit; reshape (merge contiguous axes) first")]
    Rank { kernel: &'static str, rank: usize },
    /// The workspace is too small for what the kernel stages in it.
    #[error("{kernel}: a workspace of {have} elements where {need} are needed; the plan must give this launch a larger workspace")]
    Workspace { kernel: &'static str, have: usize, need: usize },
    /// A fused kernel around an inner kernel it cannot run.
    #[error("{kernel} cannot fuse {inner}; only the optimizer updates it names")]
    CannotFuse { kernel: &'static str, inner: &'static str },
    /// A kernel its family does not lower (a new `Kernel` variant without
    /// its arm in the family's `lower`).
    #[error("{kernel} has no CUDA lowering in the {family} family; add its arm to the family's lower (kernels/src/{family}/desc.rs)")]
    NoLowering { kernel: &'static str, family: &'static str },
    /// A kernel with an empty operand list where it needs one.
    #[error("{kernel}: no inputs")]
    NoInputs { kernel: &'static str },
}

/// The element counts of one launch's operands.
#[derive(Debug, Clone, Copy)]
pub struct Counts<'a> {
    pub ins: &'a [usize],
    pub outs: &'a [usize],
    /// The workspace, if the launch has one.
    pub workspace: Option<usize>,
}

/// The workspace the CUDA backend gives `kernel` in place of the plan's,
/// in f32: a convolution stages its column matrix
/// ([`conv_workspace_floats`]; the backend's stream buffer is at least
/// this large, shared by the stream's convolutions), a fused tower update
/// its product (`m * n`), as the kernel's family declares (`Desc`).
/// `None`: the plan's workspace, if any.
pub fn backend_workspace(kernel: &Kernel) -> Option<usize> {
    (kernel.desc().backend_workspace)(kernel)
}

/// The CUDA lowering of `kernel` over operands of these element counts.
pub fn lower(kernel: &Kernel, counts: Counts<'_>) -> Result<Lowering, LaunchError> {
    let mut cx = Cx { name: kernel.name(), counts, low: Lowering::default() };
    lower_into(kernel, &mut cx)?;
    Ok(cx.low)
}

/// The lowering of `kernel` by its family (`<family>/desc.rs`).
fn lower_into(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    (kernel.desc().lower)(kernel, cx)
}

/// The lowering under way: the kernel's name (for errors), the counts, the ops so far.
pub(crate) struct Cx<'a> {
    pub(crate) name: &'static str,
    pub(crate) counts: Counts<'a>,
    pub(crate) low: Lowering,
}

/// A GEMM with alpha 1.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    (trans_a, trans_b): (bool, bool),
    a: Operand,
    b: Operand,
    c: Operand,
    beta: f32,
) -> Gemm {
    Gemm { m, n, k, trans_a, trans_b, a, b, c, alpha: 1.0, beta, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
}

/// Operand `which`, `offset` elements in.
pub(crate) fn at(which: Which, offset: usize) -> Operand {
    Operand { which, offset }
}

pub(crate) fn i64a(v: usize) -> Arg {
    Arg::I64(v as i64)
}

impl Cx<'_> {
    /// The element count of input `k`.
    pub(crate) fn i(&self, k: usize) -> Result<usize, LaunchError> {
        self.counts.ins.get(k).copied().ok_or(LaunchError::Missing { kernel: self.name, which: Which::In(k) })
    }
    /// The element count of output `k`.
    pub(crate) fn o(&self, k: usize) -> Result<usize, LaunchError> {
        self.counts.outs.get(k).copied().ok_or(LaunchError::Missing { kernel: self.name, which: Which::Out(k) })
    }
    /// Input `k` as a pointer argument.
    pub(crate) fn inp(&self, k: usize) -> Result<Arg, LaunchError> {
        self.i(k).map(|_| Arg::Operand(Operand { which: Which::In(k), offset: 0 }))
    }
    /// Output `k` as a pointer argument.
    pub(crate) fn out(&self, k: usize) -> Result<Arg, LaunchError> {
        self.o(k).map(|_| Arg::Operand(Operand { which: Which::Out(k), offset: 0 }))
    }
    pub(crate) fn operand(&self, which: Which, offset: usize) -> Result<Operand, LaunchError> {
        match which {
            Which::In(k) => self.i(k)?,
            Which::Out(k) => self.o(k)?,
            Which::Workspace => self.ws()?,
        };
        Ok(Operand { which, offset })
    }
    /// The workspace's element count.
    pub(crate) fn ws(&self) -> Result<usize, LaunchError> {
        self.counts.workspace.ok_or(LaunchError::Missing { kernel: self.name, which: Which::Workspace })
    }
    pub(crate) fn dims(&self, v: &[usize], fill: i64) -> Result<Dims4, LaunchError> {
        Dims4::padded(v, fill).ok_or(LaunchError::Rank { kernel: self.name, rank: v.len() })
    }
    pub(crate) fn d4(&self, v: &[usize], fill: i64) -> Result<Arg, LaunchError> {
        self.dims(v, fill).map(Arg::Dims4)
    }
    pub(crate) fn strides(&self, v: &[usize]) -> Result<Arg, LaunchError> {
        Dims4::broadcast_strides(v).map(Arg::Dims4).ok_or(LaunchError::Rank { kernel: self.name, rank: v.len() })
    }
    /// A launch of `entry` with block [`BLOCK`] and no dynamic shared memory.
    pub(crate) fn launch(&mut self, entry: Entry, grid: u32, args: Vec<Arg>) {
        self.launch_block(entry, grid, BLOCK, args)
    }
    pub(crate) fn launch_block(&mut self, entry: Entry, grid: u32, block: u32, args: Vec<Arg>) {
        let l = Launch { family: entry.family, entry: entry.name, grid, block, shared_bytes: 0, args };
        self.low.ops.push(LaunchOp::Launch(l));
    }
    pub(crate) fn gemm(&mut self, g: Gemm) {
        self.low.ops.push(LaunchOp::Gemm(g));
    }
    /// A new scratch area of `floats` f32; its index.
    pub(crate) fn scratch(&mut self, floats: usize) -> usize {
        self.low.scratch.push(floats);
        self.low.scratch.len() - 1
    }
}

impl fmt::Display for Which {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Which::In(i) => write!(f, "in{i}"),
            Which::Out(j) => write!(f, "out{j}"),
            Which::Workspace => write!(f, "ws"),
        }
    }
}
