//! The CUDA C twins of the kernels, as data: every `.cu` source embedded with
//! `include_str!`, the generated fused kernels, and the `#[repr(C)]` blocks
//! passed by value. How each plan kernel launches (entries, geometry,
//! arguments) is [`crate::launch`]. No CUDA dependency: a backend compiles these with NVRTC at load time and
//! caches the result by [`cache_key`] (source hash + architecture + NVRTC
//! version).
//!
//! ## Conventions of every source
//! - Entry points are `extern "C" __global__ void towers_<kernel>_<dtype>`;
//!   shapes, strides and scalars are arguments, so one compiled module serves
//!   every shape. Element counts and offsets are `long long` (`i64`).
//! - Elementwise kernels use 1-D grid-stride loops: block [`BLOCK`], grid
//!   [`grid_1d`] of the element count (any grid is correct).
//! - Reductions (row sums, per-channel statistics, `reduce_f32`, softmax
//!   rows) run one block per output with a fixed shared-memory tree: block
//!   [`BLOCK`] (a power of two <= 1024), grid `min(outputs, MAX_GRID)`. No
//!   atomics on floats anywhere: same inputs and geometry, same bits.
//! - Structs passed by value mirror [`Dims4`], [`PoolArgs`], [`ConvArgs`]
//!   (`#[repr(C)]`, field for field).
//! - Sources include nothing: only NVRTC's built-ins (`expf`, `logf`,
//!   `sqrtf`, `tanhf`, `__fmul_rn`, ...), so no CUDA toolkit is needed.
//! - Where the CPU twin's arithmetic is a plain sequence (optimizer updates,
//!   the tower reduction, pooling, dropout, copies), the CUDA form rounds
//!   every step the same way (`__fmul_rn`/`__fadd_rn`, no fused multiply-add)
//!   and matches bit for bit; tree reductions and transcendental functions
//!   differ from the CPU by rounding only.
//!
//! ## Libraries at run time
//! cudarc opens NVRTC and the driver by bare name (`libnvrtc.so`,
//! `libnvrtc.so.13`, `libcuda.so.1`, ...), so the folder holding
//! `libnvrtc.so.13` must be on `LD_LIBRARY_PATH`: the PyPI wheel's
//! `site-packages/nvidia/cu13/lib` (`pip install nvidia-cuda-nvrtc==13.0.88`,
//! as `.ci/run` does), or a toolkit's `lib` (on the lent H100:
//! `/usr/local/cuda-13.0/targets/x86_64-linux/lib`, or PyTorch's
//! `nvidia/cu13/lib`). Load cubins compiled for the device's own `sm_XY`:
//! the PTX of a newer NVRTC is refused by an older driver's JIT.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use crate::conv::ConvGeom;
use crate::elementwise::FusedExpr;
use crate::pool::PoolGeom;
use crate::{BinaryOp, UnaryOp};

/// Threads per block for every launch.
pub const BLOCK: u32 = 256;
/// Upper bound on the grid of a grid-stride launch.
pub const MAX_GRID: u32 = 65535;

/// Blocks for a grid-stride launch over `n` elements (at least 1).
pub fn grid_1d(n: usize) -> u32 {
    n.div_ceil(BLOCK as usize).clamp(1, MAX_GRID as usize) as u32
}

/// Blocks for a one-block-per-output reduction over `outputs` outputs (at least 1).
pub fn grid_rows(outputs: usize) -> u32 {
    outputs.clamp(1, MAX_GRID as usize) as u32
}

/// One `.cu` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The kernel family (the folder under `kernels/src`).
    pub family: &'static str,
    /// Path relative to `kernels/src`.
    pub path: &'static str,
    /// The CUDA C text.
    pub code: &'static str,
}

impl Source {
    /// FNV-1a 64 of the source text (stable across builds and platforms).
    pub const fn hash(&self) -> u64 {
        fnv1a64(self.code.as_bytes())
    }

    /// The family's own text: [`Source::code`] without the shared
    /// [`prelude`] in front. Two families in one translation unit (a
    /// kernel launching entry points of both, as `--emit cuda` writes it)
    /// take the prelude once and then each body: the prelude twice would
    /// define `block_sum` twice.
    pub fn body(&self) -> &'static str {
        self.code.strip_prefix(prelude()).unwrap_or(self.code)
    }
}

/// The text every family's [`Source::code`] starts with:
/// `kernels/src/prelude.cuh` (the integer types, `GRID_STRIDE`, the block
/// reductions, `sigmoid`), then the op switches generated from the Rust
/// tables, `unary_op`/`unary_grad_op` ([`UnaryOp::cuda_switches`]) and
/// `binary_op` ([`BinaryOp::cuda_switch`]) and `compare_op`
/// ([`towers_vocab::Comparison::cuda_switch`]): an op's CUDA case is found by
/// its code, never by its position in a list. Made once per process.
pub fn prelude() -> &'static str {
    static PRELUDE: OnceLock<String> = OnceLock::new();
    PRELUDE.get_or_init(|| {
        format!(
            "{}{}{}{}",
            include_str!("prelude.cuh"),
            UnaryOp::cuda_switches(),
            BinaryOp::cuda_switch(),
            towers_vocab::Comparison::cuda_switch()
        )
    })
}

/// FNV-1a, 64 bits (the one in `towers_vocab`).
pub use towers_vocab::fnv1a64;

/// The key of a compiled module in a cache: source text, target
/// architecture (`"sm_90"`) and NVRTC version (`(13, 0)`).
pub fn cache_key(source: &Source, arch: &str, nvrtc_version: (i32, i32)) -> u64 {
    let mut bytes = source.hash().to_le_bytes().to_vec();
    bytes.extend_from_slice(arch.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(&nvrtc_version.0.to_le_bytes());
    bytes.extend_from_slice(&nvrtc_version.1.to_le_bytes());
    fnv1a64(&bytes)
}

/// Every CUDA source, one per kernel family that has one (its descriptor's
/// [`crate::family::Desc::cuda`], in [`crate::Family::ALL`] order): the
/// [`prelude`], then the family's `.cu`. Made once per process (the prelude's op switches are
/// generated), then fixed for its life, as the embedded text is.
pub fn sources() -> &'static [Source] {
    static SOURCES: OnceLock<Vec<Source>> = OnceLock::new();
    SOURCES.get_or_init(|| {
        crate::Family::ALL
            .iter()
            .filter_map(|f| {
                let d = f.desc();
                d.cuda.map(|c| Source {
                    family: d.name,
                    path: c.path,
                    code: Box::leak(format!("{}{}", prelude(), c.text).into_boxed_str()),
                })
            })
            .collect()
    })
}

/// The source of a family, or of a generated fused kernel by its family
/// name (`fused_<hash>`, once [`fused_source`] has made it).
pub fn source(family: &str) -> Option<&'static Source> {
    sources().iter().find(|s| s.family == family).or_else(|| {
        let made = generated().lock().ok()?;
        made.values().find(|g| g.source.family == family).map(|g| &g.source)
    })
}

/// The CUDA form of a generated fused elementwise kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generated {
    /// Family `fused_<hash>`, path `generated/fused_<hash>.cu`, code: the
    /// elementwise family's source, then the generated entry point.
    pub source: Source,
    /// The entry point, [`FusedExpr::entry`].
    pub entry: &'static str,
}

fn generated() -> &'static Mutex<BTreeMap<FusedExpr, &'static Generated>> {
    static MADE: OnceLock<Mutex<BTreeMap<FusedExpr, &'static Generated>>> = OnceLock::new();
    MADE.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// The CUDA source of the fused kernel of `expr`
/// ([`crate::elementwise::fused::cuda_kernel`] after the elementwise
/// family's source), made once per distinct expression and kept for the life
/// of the process (interned, as the compiled modules that use it are), so
/// it has the `'static` lifetime of the embedded sources and goes through
/// the same NVRTC cache ([`cache_key`]: a hash of the text).
pub fn fused_source(expr: &FusedExpr) -> &'static Generated {
    let mut made = generated().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(g) = made.get(expr) {
        return g;
    }
    let base = source("elementwise").map_or("", |s| s.code);
    let name = format!("fused_{:016x}", expr.hash());
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let g: &'static Generated = Box::leak(Box::new(Generated {
        source: Source {
            family: leak(name.clone()),
            path: leak(format!("generated/{name}.cu")),
            code: leak(format!("{base}{}", crate::elementwise::fused::cuda_kernel(expr))),
        },
        entry: leak(expr.entry()),
    }));
    made.insert(expr.clone(), g);
    g
}

/// `struct Dims4 { long long d[4]; }`: a shape, strides or offsets padded to rank 4.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dims4 {
    pub d: [i64; 4],
}

impl Dims4 {
    /// `v` right-aligned, padded on the left with `fill` (1 for shapes, 0 for offsets).
    /// `None` above rank 4.
    pub fn padded(v: &[usize], fill: i64) -> Option<Self> {
        if v.len() > 4 {
            return None;
        }
        let mut d = [fill; 4];
        for (o, x) in d[4 - v.len()..].iter_mut().zip(v) {
            *o = *x as i64;
        }
        Some(Dims4 { d })
    }

    /// Strides of a dense tensor of shape `shape` read as the broadcast
    /// `out` (0 along axes where `shape` is 1), both padded to rank 4.
    pub fn broadcast_strides(shape: &[usize]) -> Option<Self> {
        let p = Self::padded(shape, 1)?;
        let mut d = [0i64; 4];
        let mut acc = 1;
        for i in (0..4).rev() {
            d[i] = if p.d[i] == 1 { 0 } else { acc };
            acc *= p.d[i];
        }
        Some(Dims4 { d })
    }
}

/// `struct PoolGeom` of pool.cu; the host resolves the padding to `out_*`
/// and `pad_*` with TF's rules (`window::out_and_pad`), as the CPU does.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolArgs {
    pub n: i32,
    pub h: i32,
    pub w: i32,
    pub c: i32,
    pub kh: i32,
    pub kw: i32,
    pub stride_h: i32,
    pub stride_w: i32,
    pub out_h: i32,
    pub out_w: i32,
    pub pad_top: i32,
    pub pad_left: i32,
}

impl From<&PoolGeom> for PoolArgs {
    fn from(p: &PoolGeom) -> Self {
        let ((out_h, pad_top), (out_w, pad_left)) = (p.out_h(), p.out_w());
        PoolArgs {
            n: p.n as i32,
            h: p.h as i32,
            w: p.w as i32,
            c: p.c as i32,
            kh: p.kh as i32,
            kw: p.kw as i32,
            stride_h: p.stride_h as i32,
            stride_w: p.stride_w as i32,
            out_h: out_h as i32,
            out_w: out_w as i32,
            pad_top: pad_top as i32,
            pad_left: pad_left as i32,
        }
    }
}

/// `struct ConvGeom` of conv.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvArgs {
    pub n: i32,
    pub h: i32,
    pub w: i32,
    pub c_in: i32,
    pub kh: i32,
    pub kw: i32,
    pub c_out: i32,
    pub stride_h: i32,
    pub stride_w: i32,
    pub out_h: i32,
    pub out_w: i32,
    pub pad_top: i32,
    pub pad_left: i32,
}

impl From<&ConvGeom> for ConvArgs {
    fn from(p: &ConvGeom) -> Self {
        let ((out_h, pad_top), (out_w, pad_left)) = (p.out_h(), p.out_w());
        ConvArgs {
            n: p.n as i32,
            h: p.h as i32,
            w: p.w as i32,
            c_in: p.c_in as i32,
            kh: p.kh as i32,
            kw: p.kw as i32,
            c_out: p.c_out as i32,
            stride_h: p.stride_h as i32,
            stride_w: p.stride_w as i32,
            out_h: out_h as i32,
            out_w: out_w as i32,
            pad_top: pad_top as i32,
            pad_left: pad_left as i32,
        }
    }
}

#[cfg(test)]
mod tests;
