//! # towers-kernels: the kernel ABI and its CPU bodies
//!
//! Above `towers_vocab` only. It defines, once, the kernel ABI every
//! backend speaks:
//! - [`Kernel`] ([`kernel`]): the closed set of kernels a plan can launch,
//!   each with its parameter block; the contract every backend honours;
//! - re-exported from `towers_vocab` (their definitions and the op tables
//!   live there; this crate expands the tables into its CPU loops):
//!   [`UnaryOp`], [`BinaryOp`], [`Padding`] (with TF's output-size rule),
//!   [`DType`], [`elementwise::FusedExpr`], [`init::FanMode`], [`init::Distribution`];
//! - the parameter blocks: [`ConvGeom`], [`PoolGeom`], shapes as `Vec<usize>`.
//! - each kernel's operands, declared once ([`operands`]): [`Kernel::signature`]
//!   gives every operand's name, role, dtype and element count, and the
//!   scalar parameters; the plan verifier and the CPU backend check launches
//!   against it generically.
//!
//! and it holds the CPU body of every kernel, one folder per kernel family
//! (`conv/`, `pool/`, `elementwise/`, ...), with room for the CUDA C twin
//! beside it. The CPU bodies are the reference ("interpreter") that the
//! CUDA twins must agree with.
//!
//! ## Invariants (every kernel)
//! - **Every kernel a plan can launch has its body here.** A backend
//!   dispatches one [`Kernel`] variant to one call; it does no math.
//! - Tensors are dense, row-major slices; shapes are passed as `&[usize]`
//!   or as a geometry struct. Activations are NHWC, conv filters HWIO.
//!   Element types are 4 bytes; labels, indices and bools are `i32`.
//! - Argument order: inputs, then scalar attributes, then outputs, then
//!   `workspace` last. Outputs are fully overwritten (never read) unless the
//!   doc says otherwise; optimizer and state kernels update in place.
//! - **No kernel allocates.** Scratch comes from the caller (a kernel that
//!   needs it has a `workspace_len`: [`ConvGeom::workspace_len`]) or is a
//!   fixed-size stack buffer ([`optim::mean_apply`]; the direct convolution's
//!   packed filter, 16 KiB).
//! - SIMD: the crate is built for the baseline x86-64 target; the hot
//!   bodies are chosen at run time per [`simd::SimdPath`] (one per process,
//!   `TOWERS_SIMD` forces a lower one). The convolutions' direct and blocked
//!   kernels (with their bias/ReLU/max-pool epilogues) are written once,
//!   generic over `pulp::Simd`, and give the same bits on every path
//!   (tested); their [`conv::Algorithm`] is a function of the geometry only,
//!   on every CPU. Bits still differ between CPUs where a GEMM runs (the
//!   `gemm` crate's micro-kernel follows the CPU, [`simd::gemm_path`]) and
//!   where a kernel's docs say so; on one machine every run gives the same
//!   bits.
//! - Slice lengths are the caller's contract: checked with `debug_assert!`
//!   only. Kernels do not panic on correctly sized inputs (including empty
//!   ones). Value- or shape-argument-dependent failures return
//!   `Result<(), KernelError>` ([`KernelError`]).
//! - Deterministic: same inputs give the same bits. Random kernels depend
//!   only on seeds, keys and counters, never on threads.
//! - Every unary op's gradient is a function of its output `y`
//!   ([`elementwise::unary`]): adding one is one table entry in
//!   `vocab/src/unary.rs`.
//!
//! ## Kernels by module
//! - [`gemm`]: `matmul(&MatMul { m, n, k, trans_a, trans_b, alpha, beta, threads }, a, b, c)`:
//!   `c[m,n] = alpha * op(a) op(b) + beta * c`; transposes are strides, never copies.
//! - [`window`]: `Padding::{Same, Valid}`, `Padding::out_and_pad(in, k, stride) -> Option<(out, pad_before)>`.
//! - [`conv`]: geometry `ConvGeom { n, h, w, c_in, kh, kw, c_out, stride_h, stride_w, padding }`;
//!   `conv2d(p, x, filter, y, ws)`, `conv2d_backprop_input(p, dy, filter, dx, ws)`,
//!   `conv2d_backprop_filter(p, x, dy, dfilter, ws)`, `ws: [p.workspace_len()]`.
//! - [`pool`]: geometry `PoolGeom { n, h, w, c, kh, kw, stride_h, stride_w, padding }`;
//!   `max_pool`, `avg_pool`, `max_pool_grad(p, x, y, dy, dx)`, `avg_pool_grad(p, dy, dx)`.
//! - [`elementwise`]: `binary(BinaryOp, a, a_shape, b, b_shape, out) -> Result`
//!   (NumPy broadcasting, rank <= 4); `broadcast_to`, `sum_to_shape` (its adjoint);
//!   `unary(UnaryOp, x, y)`, `unary_grad(UnaryOp, dy, y, dx)`;
//!   `bias_add(x, bias, y)`, `bias_add_grad(dy, db)`.
//! - [`reduce`]: `reduce_sum`, `reduce_mean` (`out` = kept axes), `argmax` (ties: first),
//!   `equal(a, b, out_bool)`, `cast(x, to, y)` between any dtypes.
//! - [`softmax`] (last axis, `[rows, c]`): `softmax`, `log_softmax`, their grads,
//!   `sparse_softmax_cross_entropy(logits, labels_i32, c, loss, backprop) -> Result`,
//!   `softmax_cross_entropy(logits, labels, c, loss, backprop)`.
//! - [`batchnorm`] (channels last, `[rows, C]`): `batch_norm_train` (unbiased
//!   batch variance out), `batch_norm_infer` (moving statistics out),
//!   `batch_norm_grad`, `assign_moving_average(moving, value, decay)`.
//! - [`dropout`]: `dropout(x, keep_prob, seed, step, offset, y, mask)` (Philox4x32-10 of
//!   `(seed, step, offset + i)`; its gradient is the graph's `dy * mask`).
//! - [`misc`]: `l2_loss`, `add_n`, `weighted_sum` (the tower reduction).
//! - [`layout`]: `concat`, `split`, `slice`, `slice_grad`; all `-> Result`.
//! - [`optim`] (in place): `apply_gradient_descent`, `apply_momentum`,
//!   `apply_adam` (`step` 1-based, [`optim::adam_step`]), `mean_apply` (the tower
//!   reduction fused into one of them), `increment_step`.
//! - [`init`]: `fill(x, value)`, `uniform`, `truncated_normal`, `glorot_uniform`, `fans`, `fnv1a64`.
//! - [`random`]: `philox4x32_10(counter, key)`, `philox_block(seed, step, block)`, `u32_to_unit(u)`.
//! - [`cuda`]: the CUDA C twin of every kernel (sources embedded, entry points,
//!   arguments, launch geometry, content hashes); data only, no CUDA dependency.
//! - [`topk`] (last axis, `[rows, cols]`): `top_k` (larger first, ties by
//!   lower column), `in_top_k` (TF's `InTopK`), `top_k_grad` (scatter-add).
//! - [`shape`]: `broadcast_shapes(op, a, b)`, `numel(shape)`, `MAX_RANK`.

pub mod array;
pub mod batchnorm;
pub mod conv;
pub mod cpu;
pub mod cuda;
pub mod dropout;
pub mod dtype;
pub mod elementwise;
pub mod error;
pub mod family;
pub mod gemm;
pub mod init;
pub mod kernel;
mod lanes;
pub mod launch;
pub mod layout;
pub mod misc;
pub mod operands;
pub mod optim;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod require_gpu;
pub mod shape;
pub mod simd;
pub mod softmax;
pub mod topk;
pub mod window;

#[cfg(test)]
mod testutil;

pub use conv::ConvGeom;
pub use dtype::DType;
pub use elementwise::{BinaryOp, UnaryOp};
pub use error::KernelError;
pub use kernel::{Family, Kernel};
pub use operands::{ParamError, Signature};
pub use pool::PoolGeom;
pub use simd::SimdPath;
pub use towers_vocab::Comparison;
pub use window::Padding;
