//! Kernel families: each folder under `kernels/src` that holds kernels
//! describes them in ONE place, its `desc.rs`, as a [`Desc`]: for its
//! [`Kernel`] variants, the operand signature ([`Kernel::signature`]), the
//! CUDA lowering ([`crate::launch::lower`]), the CUDA source and entry
//! points ([`crate::cuda::sources`], [`crate::launch::entries::all`]), the
//! plan text's parameters ([`Kernel::params_text`]) and the CPU dispatch
//! ([`Kernel::run_cpu`]). Everything else reads those descriptors through
//! [`Kernel::family`].
//!
//! ## Invariants
//! - Every variant belongs to exactly one family: [`Kernel::family`] is an
//!   exhaustive match (in `kernel.rs`, beside the variants), so a new
//!   variant does not compile until it names its family.
//! - A family's functions are only called with that family's kernels. Each
//!   family's matches end in one arm for foreign kernels that returns a
//!   typed error ([`Foreign`]); the tests `every_variant_is_described_by_its_family`
//!   and `every_variant_runs_through_its_family_on_the_cpu` (in
//!   `operands/tests_family.rs`) run every variant through its family's signature,
//!   lowering, text and CPU dispatch, so no such arm is reached.
//! - Adding a family: a folder with the CPU body (`mod.rs`), the `.cu`
//!   and `desc.rs`; one line in `families!` and the variants with their
//!   `family()` arms in `kernel.rs`; the module line in `lib.rs`; the
//!   graph op's selection in `towers_codegen::select`.

use thiserror::Error;

use crate::cpu::{CpuError, Io, Lists};
use crate::launch::{Cx, Entry, LaunchError};
use crate::operands::table::Builder;
use crate::operands::ParamError;
use crate::{ConvGeom, Kernel, Padding, PoolGeom};

/// A kernel family's `.cu` file: its path under `kernels/src` and its text
/// (without the shared prelude, which [`crate::cuda::sources`] puts in front).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaFile {
    pub path: &'static str,
    pub text: &'static str,
}

/// Everything one kernel family declares about its kernels (see the
/// module docs). One `static DESC` per family, in the family's `desc.rs`.
pub struct Desc {
    /// The family's name: its folder under `kernels/src`.
    pub name: &'static str,
    /// Its CUDA source, if it has one (the GEMMs run on cuBLAS).
    pub cuda: Option<CudaFile>,
    /// The `extern "C" __global__` entry points its `.cu` defines.
    pub entries: &'static [Entry],
    /// Declare a kernel's operands and parameters.
    pub(crate) declare: fn(&Kernel, &mut Builder) -> Result<(), ParamError>,
    /// Lower a kernel to CUDA launches.
    pub(crate) lower: for<'a, 'b> fn(&'a Kernel, &'b mut Cx<'_>) -> Result<(), LaunchError>,
    /// A kernel's parameters as the plan text shows them.
    pub(crate) text: fn(&Kernel) -> Result<String, Foreign>,
    /// Run a kernel's CPU body on a launch's operands ([`Kernel::run_cpu`]).
    pub(crate) run: unsafe fn(&Kernel, &dyn Io, &mut Lists<'_>, u64) -> Result<(), CpuError>,
    /// The workspace the CUDA backend gives a kernel in place of the
    /// plan's, in f32 ([`crate::launch::backend_workspace`]); [`no_workspace`]
    /// for a family that stages nothing.
    pub(crate) backend_workspace: fn(&Kernel) -> Option<usize>,
}

/// A family whose kernels take the plan's workspace, if any, on CUDA.
pub(crate) fn no_workspace(_: &Kernel) -> Option<usize> {
    None
}

/// A kernel handed to a family it does not belong to (a family's
/// impossible arm; a test runs every variant through its own family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("{kernel} is not a kernel of the {family} family")]
pub struct Foreign {
    pub kernel: &'static str,
    pub family: &'static str,
}

impl Foreign {
    pub(crate) fn of(kernel: &Kernel, family: &'static str) -> Foreign {
        Foreign { kernel: kernel.name(), family }
    }
}

impl From<Foreign> for ParamError {
    fn from(f: Foreign) -> Self {
        ParamError { reason: f.to_string() }
    }
}

impl From<Foreign> for LaunchError {
    fn from(f: Foreign) -> Self {
        LaunchError::NoLowering { kernel: f.kernel, family: f.family }
    }
}

impl Kernel {
    /// This kernel's family descriptor.
    pub fn desc(&self) -> &'static Desc {
        self.family().desc()
    }

    /// The parameters as the plan text shows them, designed per kernel by
    /// its family: shapes as `[a,b]`, NHWC geometry as `NxHxWxC`, flags by
    /// name (`trans_b`, `nesterov`) only when set, scalars as `key=value`.
    /// Empty for kernels without parameters. Deterministic.
    pub fn params_text(&self) -> String {
        (self.desc().text)(self).unwrap_or_else(|e| e.to_string())
    }
}

/// `1,2,3`.
pub(crate) fn list<T: std::fmt::Display>(v: &[T]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

/// `same` / `valid`.
pub(crate) fn padding(p: Padding) -> &'static str {
    match p {
        Padding::Same => "same",
        Padding::Valid => "valid",
    }
}

/// `128x28x28x1 k=5x5 s=1x1 valid -> 12`: input NHWC, window, strides, padding, output channels.
pub(crate) fn conv_text(g: &ConvGeom) -> String {
    format!(
        "{}x{}x{}x{} k={}x{} s={}x{} {} -> {}",
        g.n,
        g.h,
        g.w,
        g.c_in,
        g.kh,
        g.kw,
        g.stride_h,
        g.stride_w,
        padding(g.padding),
        g.c_out
    )
}

/// `32x8x8x16 k=2x2 s=2x2 same`: input NHWC, window, strides, padding.
pub(crate) fn pool_text(g: &PoolGeom) -> String {
    format!(
        "{}x{}x{}x{} k={}x{} s={}x{} {}",
        g.n,
        g.h,
        g.w,
        g.c,
        g.kh,
        g.kw,
        g.stride_h,
        g.stride_w,
        padding(g.padding)
    )
}

/// What every family's `desc.rs` uses (`use crate::family::prelude::*`).
pub(crate) mod prelude {
    pub(crate) use super::{conv_text, list, no_workspace, pool_text, CudaFile, Desc, Foreign};
    pub(crate) use crate::cpu::{view, view_mut, CpuError, Io, Lists};
    pub(crate) use crate::cuda::{grid_1d, grid_rows, ConvArgs, Dims4, PoolArgs, BLOCK};
    pub(crate) use crate::launch::entries::entries;
    pub(crate) use crate::launch::{
        at, i64a, sgemm, Arg, Counts, Cx, Entry, Gemm, LaunchError, LaunchOp, Lowering, Operand, Which,
    };
    pub(crate) use crate::operands::table::{
        broadcast, count, dims, ensure, mn, op, padding, positive, prod, window, Builder, F32, I32, IN0,
    };
    pub(crate) use crate::operands::{DTypeRule, Len, OperandSig, ParamError, Ref, Role, Side};
    pub(crate) use crate::{ConvGeom, DType, Kernel, PoolGeom};
}
