//! The CUDA C twins of the kernels, as data: every `.cu` source embedded with
//! `include_str!`, and for every kernel of the plan (`Kernel::name()` in
//! codegen) its source, entry points, arguments and launch geometry. No
//! CUDA dependency: a backend compiles these with NVRTC at load time and
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
/// `binary_op` ([`BinaryOp::cuda_switch`]): an op's CUDA case is found by
/// its code, never by its position in a list. Made once per process.
pub fn prelude() -> &'static str {
    static PRELUDE: OnceLock<String> = OnceLock::new();
    PRELUDE.get_or_init(|| {
        format!("{}{}{}", include_str!("prelude.cuh"), UnaryOp::cuda_switches(), BinaryOp::cuda_switch())
    })
}

/// FNV-1a, 64 bits.
pub const fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

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

/// (family, path under `kernels/src`, the family's own text).
macro_rules! family {
    ($family:literal, $file:literal) => {
        ($family, concat!($family, "/", $file), include_str!(concat!($family, "/", $file)))
    };
}

/// Every kernel family's `.cu`, embedded.
const FAMILIES: &[(&str, &str, &str)] = &[
    family!("elementwise", "elementwise.cu"),
    family!("reduce", "reduce.cu"),
    family!("misc", "misc.cu"),
    family!("pool", "pool.cu"),
    family!("softmax", "softmax.cu"),
    family!("conv", "conv.cu"),
    family!("layout", "layout.cu"),
    family!("batchnorm", "batchnorm.cu"),
    family!("dropout", "dropout.cu"),
    family!("optim", "optim.cu"),
    // array ops (issue 22)
    family!("array", "array.cu"),
];

/// Every CUDA source, one per kernel family: the [`prelude`], then the
/// family's `.cu`. Made once per process (the prelude's op switches are
/// generated), then fixed for its life, as the embedded text is.
pub fn sources() -> &'static [Source] {
    static SOURCES: OnceLock<Vec<Source>> = OnceLock::new();
    SOURCES.get_or_init(|| {
        FAMILIES
            .iter()
            .map(|&(family, path, text)| Source {
                family,
                path,
                code: Box::leak(format!("{}{text}", prelude()).into_boxed_str()),
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

/// How one plan kernel runs on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaKernel {
    /// `Kernel::name()` of the plan's kernel.
    pub kernel: &'static str,
    /// The family whose source holds the entry points; `None` for the GEMM (cuBLAS).
    pub family: Option<&'static str>,
    /// Entry points, in launch order where the kernel takes several.
    pub entries: &'static [&'static str],
    /// Entry points of other families launched after `entries`, as
    /// (family, entry): a fused kernel made of launches of two families.
    pub after: &'static [(&'static str, &'static str)],
    /// Arguments, in order, and how the plan's parameters map onto them.
    pub args: &'static str,
    /// Launch geometry.
    pub launch: &'static str,
}

impl CudaKernel {
    /// The CUDA source of this kernel (`None` for the GEMM).
    pub fn source(&self) -> Option<&'static Source> {
        self.family.and_then(source)
    }
}

const EW: &str = "block BLOCK, grid grid_1d(n)";
const ROWS: &str = "block BLOCK (power of two <= 1024), grid grid_rows(outputs)";

macro_rules! k {
    ($kernel:literal, $family:literal, [$($e:literal),+], then [$(($f:literal, $a:literal)),+], $args:expr, $launch:expr) => {
        CudaKernel {
            kernel: $kernel,
            family: Some($family),
            entries: &[$($e),+],
            after: &[$(($f, $a)),+],
            args: $args,
            launch: $launch,
        }
    };
    ($kernel:literal, $family:literal, [$($e:literal),+], $args:expr, $launch:expr) => {
        CudaKernel { kernel: $kernel, family: Some($family), entries: &[$($e),+], after: &[], args: $args, launch: $launch }
    };
}

/// Every kernel of the plan (the 63 variants of codegen's `Kernel`), in the
/// enum's order.
pub const KERNELS: &[CudaKernel] = &[
    CudaKernel {
        kernel: "gemm",
        family: None,
        entries: &[],
        after: &[],
        args: "cuBLAS sgemm: row-major c[m,n] = op(a) op(b) computed as column-major c^T = op(b)^T op(a)^T, transposes as flags",
        launch: "cublasSgemm on the launch's stream",
    },
    CudaKernel {
        kernel: "gemm_bias_act",
        family: None,
        entries: &[],
        after: &[("elementwise", "towers_bias_act_in_place_f32")],
        args: "cuBLAS sgemm as gemm, then the epilogue: op (i32: UnaryOp::code(), -1 none), n = m*n (i64), c = n (i64), bias, c (in place)",
        launch: "cublasSgemm on the launch's stream; epilogue block BLOCK, grid grid_1d(m*n)",
    },
    CudaKernel {
        kernel: "gemm_tower_mean",
        family: None,
        entries: &[],
        after: &[],
        args: "cuBLAS sgemm per pair as gemm: alpha = the pair's weight, beta 0 for the first pair and 1 after (the mean accumulates in c)",
        launch: "one cublasSgemm per pair on the launch's stream",
    },
    CudaKernel {
        kernel: "gemm_tower_apply",
        family: None,
        entries: &[],
        after: &[("optim", "towers_apply_gradient_descent_f32"), ("optim", "towers_apply_momentum_f32")],
        args: "cuBLAS sgemm per pair as gemm_tower_mean into the launch's scratch (m*n floats the backend allocates at load), then the fused update's own kernel (apply_gradient_descent or apply_momentum) reading the scratch as its gradient",
        launch: "one cublasSgemm per pair, then the update: block BLOCK, grid grid_1d(m*n)",
    },
    k!("binary", "elementwise", ["towers_binary_f32"],
       "op (i32: BinaryOp::code()), n = numel(out) (i64), a, b, out, od: Dims4 (output dims padded to rank 4), sa, sb: Dims4 (broadcast strides, Dims4::broadcast_strides)", EW),
    CudaKernel {
        kernel: "fused_elementwise",
        family: Some("elementwise"),
        entries: &[],
        after: &[],
        args: "generated per expression (cuda::fused_source: the elementwise family's source, then towers_fused_<hash>): n = numel(out) (i64), od: Dims4 (output dims), then per input its pointer and its broadcast strides (Dims4), then out",
        launch: EW,
    },
    k!("add_n", "misc", ["towers_add_n_f32"], "n (i64), count (i32), xs (device array of count input pointers), out", EW),
    k!("bias_add", "elementwise", ["towers_bias_add_f32"], "n (i64), c = channels (i64), x, bias, y", EW),
    k!("bias_add_act", "elementwise", ["towers_bias_add_act_f32"], "op (i32: UnaryOp::code()), n (i64), c = channels (i64), x, bias, y", EW),
    k!("unary_grad_bias_grad", "reduce", ["towers_unary_grad_bias_partial_f32", "towers_sum_partials_f32", "towers_unary_grad_bias_grad_f32"],
       "tall [rows, c] with c <= 1024 (rows >= 4 * 264), two stages: partial(op (i32: UnaryOp::code()), rows, c, rpb = rows per block (i64), dy, y, dx, partial = scratch[parts * c]), then sum_partials(parts, c (i64), partial, db); otherwise unary_grad_bias_grad(op, rows, c (i64), dy, y, dx, db)",
       "two stages: block (BLOCK / c) * c (or c above BLOCK), grid parts = ceil(rows / rpb) with rpb = ceil(rows / 264); then block BLOCK, grid grid_1d(c). One stage: block BLOCK, grid grid_rows(channels)"),
    k!("bias_add_grad", "reduce", ["towers_reduce_f32"],
       "n_out = channels, dy, db, xd = Dims4([1, 1, rows, channels]), reduced = 0b0100, scale = 1.0", ROWS),
    k!("unary", "elementwise", ["towers_unary_f32"], "op (i32: UnaryOp::code()), n (i64), x, y", EW),
    k!("unary_grad", "elementwise", ["towers_unary_grad_f32"], "op (i32, as unary), n (i64), dy, y, dx", EW),
    k!("conv2d", "conv", ["towers_im2col_f32"],
       "per chunk of rows [r0, r0 + r): im2col(g: ConvArgs, r0, r (i64), x, col = workspace), then GEMM y[r0..] = col * W; pointwise (1x1, stride 1): GEMM only",
       "block BLOCK, grid grid_1d(r * K)"),
    k!("conv2d_bias_act", "conv", ["towers_im2col_f32"], then [("elementwise", "towers_bias_act_in_place_f32"), ("pool", "towers_max_pool_f32")],
       "as conv2d, then one epilogue launch: op (i32: UnaryOp::code()), n = numel(y) (i64), c = c_out (i64), bias, y (in place); with a fused pool, then max_pool(g: PoolArgs, y, pooled)",
       "block BLOCK, grid grid_1d(r * K); epilogue grid_1d(numel(y)); pool grid_1d(numel(pooled))"),
    k!("conv2d_backprop_input", "conv", ["towers_col2im_f32"],
       "per chunk: GEMM dcol = dy[r0..] * W^T, then col2im(g: ConvArgs, r0, r (i64), accumulate (i32: 0 on the first chunk), dcol = workspace, dx); pointwise: GEMM only",
       "block BLOCK, grid grid_1d(n * h * w * c_in)"),
    k!("conv2d_backprop_filter", "conv", ["towers_im2col_f32"],
       "per chunk: im2col(g, r0, r, x, col = workspace), then GEMM dW (beta 0 on the first chunk, 1 after) += col^T * dy[r0..]; pointwise: GEMM only",
       "block BLOCK, grid grid_1d(r * K)"),
    k!("max_pool", "pool", ["towers_max_pool_f32"], "g: PoolArgs, x, y", "block BLOCK, grid grid_1d(numel(y))"),
    k!("max_pool_grad", "pool", ["towers_max_pool_grad_f32"], "g: PoolArgs, x, y, dy, dx", "block BLOCK, grid grid_1d(numel(x))"),
    k!("max_pool_grad_act_bias_grad", "pool", ["towers_max_pool_grad_f32"], then [("reduce", "towers_unary_grad_bias_partial_f32"), ("reduce", "towers_sum_partials_f32"), ("reduce", "towers_unary_grad_bias_grad_f32")],
       "max_pool_grad(g: PoolArgs, x, y, dy, dx), then unary_grad_bias_grad's launches (two stages or one, as that kernel) with dy = dx, y = act_y, in place on dx",
       "block BLOCK, grid grid_1d(numel(x)); then as unary_grad_bias_grad"),
    k!("avg_pool", "pool", ["towers_avg_pool_f32"], "g: PoolArgs, x, y", "block BLOCK, grid grid_1d(numel(y))"),
    k!("avg_pool_grad", "pool", ["towers_avg_pool_grad_f32"], "g: PoolArgs, dy, dx", "block BLOCK, grid grid_1d(numel(x))"),
    k!("concat", "layout", ["towers_concat_part_f32"],
       "one launch per input: outer, run = shape[axis] * inner, total = out[axis] * inner, off = runs before it (all i64), x, out",
       "block BLOCK, grid grid_1d(outer * run)"),
    k!("split", "layout", ["towers_split_part_f32"],
       "one launch per output: outer, run = size * inner, total = shape[axis] * inner, off (all i64), x, y",
       "block BLOCK, grid grid_1d(outer * run)"),
    k!("slice", "layout", ["towers_slice_f32"], "n = numel(size) (i64), x, out, shape, begin, size: Dims4 (padded: 1, 0, 1)", EW),
    k!("slice_grad", "layout", ["towers_slice_grad_f32"], "n = numel(shape) (i64), dy, dx, shape, begin, size: Dims4", EW),
    k!("broadcast_to", "elementwise", ["towers_broadcast_to_f32"], "n = numel(out) (i64), x, out, od: Dims4, sx: Dims4 (broadcast strides)", EW),
    k!("sum_to_shape", "reduce", ["towers_reduce_f32"],
       "n_out = numel(out_shape), x, out, xd = Dims4(x_shape), reduced = bits of axes where out is 1 and x is not, scale = 1.0", ROWS),
    k!("softmax", "softmax", ["towers_softmax_f32"], "rows (i64), c = classes (i32), x, y", ROWS),
    k!("log_softmax", "softmax", ["towers_log_softmax_f32"], "rows (i64), c (i32), x, y", ROWS),
    k!("softmax_grad", "softmax", ["towers_softmax_grad_f32"], "rows (i64), c (i32), dy, y, dx", ROWS),
    k!("log_softmax_grad", "softmax", ["towers_log_softmax_grad_f32"], "rows (i64), c (i32), dy, y, dx", ROWS),
    k!("sparse_softmax_xent", "softmax", ["towers_sparse_softmax_xent_f32"],
       "rows (i64), c (i32), logits, labels (i32, validated on the host), loss, backprop, scale (null: 1)", ROWS),
    k!("sparse_softmax_xent_mean_grad", "softmax", ["towers_sparse_softmax_xent_f32"], then [("reduce", "towers_reduce_f32"), ("reduce", "towers_reduce_f32")],
       "sparse_softmax_xent(rows, c, logits, labels, loss, dlogits, scale = the scalar input); then reduce(loss -> mean, scale 1/rows); then reduce(dlogits -> db over rows, as bias_add_grad)",
       "as sparse_softmax_xent; then block BLOCK, grid grid_rows(1) and grid_rows(c)"),
    k!("softmax_xent", "softmax", ["towers_softmax_xent_f32"], "rows (i64), c (i32), logits, labels, loss, backprop", ROWS),
    k!("l2_loss", "reduce", ["towers_l2_loss_f32"], "n (i64), x, out (one f32)", "block BLOCK, grid 1"),
    k!("reduce_sum", "reduce", ["towers_reduce_f32"],
       "n_out = numel(out), x, out, xd = Dims4(shape), reduced = bits of axes (padded), scale = 1.0", ROWS),
    k!("reduce_mean", "reduce", ["towers_reduce_f32"], "as reduce_sum with scale = 1 / (product of reduced dims) as f32", ROWS),
    k!("argmax", "reduce", ["towers_argmax_f32"],
       "outer, len = shape[axis], inner (i64), x, out (i32)", "block BLOCK, grid grid_1d(outer * inner)"),
    k!("equal", "reduce", ["towers_equal_f32", "towers_equal_i32"], "n (i64), a, b, out (i32 0/1); the entry by dtype (f32, else i32)", EW),
    k!("cast", "reduce",
       ["towers_cast_f32_i32", "towers_cast_i32_f32", "towers_cast_f32_bool", "towers_cast_i32_bool", "towers_copy_u32"],
       "n (i64), x, y; the entry by (from, to): f32->i32, i32|bool->f32, f32->bool, i32|bool->bool, same width (f32->f32, *->i32): copy_u32",
       EW),
    k!("dropout", "dropout", ["towers_dropout_f32"],
       "n (i64), keep_prob (f32), seed, step (the run count), elem_offset (u64), x, y, mask", EW),
    k!("fill", "misc", ["towers_fill_f32"], "n (i64), value (f32), out", EW),
    k!("batch_norm_train", "batchnorm", ["towers_batch_norm_stats_f32", "towers_batch_norm_apply_f32"],
       "stats(rows, c (i64), epsilon, x, mean, inv_std, var); apply(n, c (i64), x, gamma, beta, mean, inv_std, y)",
       "stats: block BLOCK, grid grid_rows(c); apply: block BLOCK, grid grid_1d(n)"),
    k!("batch_norm_infer", "batchnorm", ["towers_batch_norm_infer_f32"],
       "n, c (i64), epsilon, x, gamma, beta, moving_mean, moving_var, y, mean, inv_std, var", EW),
    k!("batch_norm_grad", "batchnorm", ["towers_batch_norm_grad_reduce_f32", "towers_batch_norm_grad_dx_f32"],
       "reduce(rows, c (i64), dy, x, mean, inv_std, dgamma, dbeta); dx(n, c (i64), dy, x, gamma, mean, inv_std, dgamma, dbeta, dx)",
       "reduce: block BLOCK, grid grid_rows(c); dx: block BLOCK, grid grid_1d(n)"),
    k!("assign_moving_average", "optim", ["towers_assign_moving_average_f32"], "n (i64), decay (f32), value, variable (in place)", EW),
    k!("apply_gradient_descent", "optim", ["towers_apply_gradient_descent_f32"], "n (i64), lr (device f32[1], the learning-rate input), grad, w (in place)", EW),
    k!("apply_momentum", "optim", ["towers_apply_momentum_f32"],
       "n (i64), lr (device f32[1]), momentum, nesterov (i32 0/1), grad, w, accum (in place)", EW),
    k!("apply_adam", "optim", ["towers_apply_adam_f32"],
       "n (i64), lr (device f32[1]), beta1, beta2, epsilon, grad, global_step (i32 buffer; t = step + 1), w, m, v (in place)", EW),
    k!("weighted_sum", "misc", ["towers_weighted_sum_f32"],
       "n (i64), count (i32), xs (device array of count pointers), weights (device f32[count]), out", EW),
    k!("mean_apply", "optim",
       ["towers_mean_apply_gradient_descent_f32", "towers_mean_apply_momentum_f32", "towers_mean_apply_adam_f32",
        "towers_mean_apply_rmsprop_f32", "towers_mean_apply_adagrad_f32"],
       "n (i64), count (i32), grads (device array of pointers), weights (device f32[count]), then the fused update's scalars, (adam: global_step), and its in-place buffers; the entry by `apply`",
       EW),
    k!("multi_apply", "optim",
       ["towers_multi_apply_gradient_descent_f32", "towers_multi_apply_momentum_f32", "towers_multi_apply_adam_f32",
        "towers_multi_apply_rmsprop_f32", "towers_multi_apply_adagrad_f32"],
       "total (i64: the members' elements), count (i32), offsets (device i64[count + 1], prefix sums of the lengths), grads, ws (device arrays of pointers), then by `apply`: accums (momentum, adagrad), ms, vs (adam) or ms, moms (rmsprop) arrays; lr (device f32[1]); momentum, nesterov (i32), beta1, beta2, epsilon, global_step (adam) or decay, momentum, epsilon (rmsprop)",
       "block BLOCK, grid grid_1d(total)"),
    k!("increment_step", "optim", ["towers_increment_step_i32"], "step (i32 buffer, in place)", "block 1, grid 1"),
    // array ops (issue 22)
    k!("one_hot", "array", ["towers_one_hot_f32"], "n = rows * depth, depth (i64), on, off (f32), indices (i32), out", EW),
    k!("transpose", "array", ["towers_transpose_f32"],
       "n (i64), x, y, od: Dims4 (output dims, padded with 1), src: Dims4 (for output axis k, the input stride of axis perm[k])", EW),
    k!("pad", "array", ["towers_pad_f32"], "n = numel(out) (i64), x, y, od, before, shape: Dims4 (padded: 1, 0, 1), value (f32)", EW),
    k!("gather", "array", ["towers_gather_f32"],
       "n = outer * count * inner, limit, inner, count (i64), params, indices (i32; outside [0, limit): 0 is written), out", EW),
    k!("gather_grad", "array", ["towers_gather_grad_f32"],
       "n = outer * limit * inner, limit, inner, count (i64), dy, indices (i32; outside [0, limit): dropped), dparams", EW),
    k!("tile", "array", ["towers_tile_f32"], "n = numel(out) (i64), x, y, od, shape: Dims4", EW),
    k!("tile_grad", "array", ["towers_tile_grad_f32"], "n = numel(shape) (i64), dy, dx, shape, multiples: Dims4", EW),
    // optimizers of issue 22
    k!("apply_rmsprop", "optim", ["towers_apply_rmsprop_f32"],
       "n (i64), lr (device f32[1]), decay, momentum, epsilon, grad, w, ms, mom (in place)", EW),
    k!("apply_adagrad", "optim", ["towers_apply_adagrad_f32"], "n (i64), lr (device f32[1]), grad, w, accum (in place)", EW),
];

/// The CUDA form of a plan kernel, by `Kernel::name()`.
pub fn kernel(name: &str) -> Option<&'static CudaKernel> {
    KERNELS.iter().find(|k| k.kernel == name)
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
