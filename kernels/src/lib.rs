//! # towers-kernels: the CPU kernel library
//!
//! Pure slice-level f32 kernels (labels and indices are i32) that the
//! runtime's CPU backend calls when it executes a compiled plan. They are
//! also the reference ("interpreter") that the CUDA twins must agree with.
//!
//! ## Conventions (all kernels)
//! - Tensors are dense, row-major slices; shapes are passed as `&[usize]`
//!   or as a geometry struct. Activations are NHWC, conv filters HWIO.
//! - Argument order: inputs, then scalar attributes, then outputs, then
//!   `workspace` last. Outputs are fully overwritten (never read) unless the
//!   doc says otherwise; optimizer kernels update their buffers in place.
//! - No kernel allocates. Scratch comes from the caller: a kernel that needs
//!   it has a `workspace_len` (only [`conv::Conv2d::workspace_len`] today).
//! - Slice lengths are the caller's contract: checked with `debug_assert!`
//!   only. Kernels do not panic on correctly sized inputs (including empty
//!   ones). Value- or shape-argument-dependent failures return
//!   `Result<(), KernelError>` ([`KernelError`]).
//! - Deterministic: same inputs give the same bits. Random kernels depend
//!   only on seeds, keys and counters, never on threads. Bitwise equality
//!   across different GEMM `threads` settings is not promised (that is up
//!   to the `gemm` crate's blocking); single-threaded runs are reproducible.
//!
//! ## Kernels by module
//! - [`gemm`]: `matmul(&MatMul { m, n, k, trans_a, trans_b, alpha, beta, threads }, a, b, c)`:
//!   `c[m,n] = alpha * op(a) op(b) + beta * c`; `a` stored `[m,k]` (`[k,m]`
//!   if `trans_a`), `b` stored `[k,n]` (`[n,k]` if `trans_b`); transposes are
//!   strides, never copies. `threads > 1` uses rayon.
//! - [`window`]: `Padding::{Same, Valid}`, `out_and_pad(in, k, stride, padding) -> (out, pad_before)` (TF rules).
//! - [`conv`]: geometry `Conv2d { n, h, w, c_in, kh, kw, c_out, stride_h, stride_w, padding, threads }`;
//!   `conv2d(p, x, filter, y, ws)`, `conv2d_backprop_input(p, dy, filter, dx, ws)`,
//!   `conv2d_backprop_filter(p, x, dy, dfilter, ws)` with `x: [n,h,w,c_in]`,
//!   `filter: [kh,kw,c_in,c_out]`, `y: [n,out_h,out_w,c_out]`,
//!   `ws: [p.workspace_len()]` (same length for all three).
//! - [`pool`]: geometry `Pool2d { n, h, w, c, kh, kw, stride_h, stride_w, padding }`;
//!   `max_pool(p, x, y)`, `avg_pool(p, x, y)`, `max_pool_grad(p, x, y, dy, dx)`,
//!   `avg_pool_grad(p, dy, dx)`.
//! - [`elementwise`]:
//!   `binary(BinaryOp::{Add,Sub,Mul,Div}, a, a_shape, b, b_shape, out) -> Result`
//!   (NumPy broadcasting, rank <= 4, `out` has the broadcast shape);
//!   `broadcast_to(x, x_shape, out, out_shape) -> Result`;
//!   `sum_to_shape(x, x_shape, out, out_shape) -> Result` (gradient of a broadcast);
//!   `unary(UnaryOp, x, y)`, `unary_inplace(UnaryOp, x)` for
//!   Neg, Relu, Sigmoid, Tanh, Exp, Log, Sqrt, Rsqrt, Square, Abs, Reciprocal;
//!   `relu_grad(dy, x_or_y, dx)`, `sigmoid_grad(dy, y, dx)`, `tanh_grad(dy, y, dx)`;
//!   `scale(x, s, y)`, `scale_inplace(x, s)`;
//!   `bias_add(x, bias, y)` (`x: [rows, C]`, `bias: [C]`), `bias_add_grad(dy, db)`.
//! - [`reduce`]: `reduce_sum(x, shape, axes, out) -> Result`,
//!   `reduce_mean(x, shape, axes, out) -> Result` (`out` = kept axes),
//!   `argmax(x, shape, axis, out_i32) -> Result` (ties: first),
//!   `equal(a, b, out_f32)`, `equal_i32(a, b, out_f32)` (write 1.0/0.0 as **f32**),
//!   `cast_i32_to_f32(x, out)`, `cast_f32_to_i32(x, out)` (truncation).
//! - [`softmax`] (last axis, `[rows, c]`): `softmax(x, c, y)`, `log_softmax(x, c, y)`,
//!   `softmax_grad(dy, y, c, dx)`, `log_softmax_grad(dy, y, c, dx)`,
//!   `sparse_softmax_cross_entropy(logits, labels_i32, c, loss, backprop) -> Result`,
//!   `softmax_cross_entropy(logits, labels, c, loss, backprop)`;
//!   `loss: [rows]`, `backprop: [rows, c] = softmax - labels`.
//! - [`batchnorm`] (channels last, `[rows, C]`):
//!   `batch_norm_train(x, gamma, beta, eps, y, mean, var, inv_std)`,
//!   `batch_norm_infer(x, gamma, beta, moving_mean, moving_var, eps, y)`,
//!   `batch_norm_grad(dy, x, gamma, mean, inv_std, dx, dgamma, dbeta)`,
//!   `batch_norm_update_moving(moving_mean, moving_var, mean, var, rows, decay)`
//!   (moving variance uses the unbiased `var * rows / (rows - 1)`).
//! - [`dropout`]: `dropout(x, keep_prob, seed, step, y, mask)` (mask = 0 or
//!   `1/keep_prob`, from Philox4x32-10 of `(seed, step, index)`), `dropout_grad(dy, mask, dx)`.
//! - [`misc`]: `l2_loss(x) -> f32`, `l2_loss_grad(x, dy, dx)`, `add_n(inputs, out)`,
//!   `weighted_sum(inputs, weights, out)` (one pass), `copy(src, dst)`.
//! - [`layout`]: `concat(inputs, shapes, axis, out)`, `split(x, shape, axis, sizes, outs)`,
//!   `slice(x, shape, begin, size, out)`, `slice_grad(dy, shape, begin, size, dx)`; all `-> Result`.
//! - [`optim`] (in place): `apply_gradient_descent(w, g, lr)`,
//!   `apply_momentum(w, accum, g, lr, momentum, use_nesterov)`,
//!   `apply_adam(w, m, v, g, lr, beta1, beta2, epsilon, step)` (`step` 1-based).
//! - [`init`]: `fill(x, value)`, `uniform(x, lo, hi, seed, key)`,
//!   `truncated_normal(x, mean, stddev, seed, key)`, `glorot_uniform(x, shape, seed, key)`,
//!   `fans(shape)`, `fnv1a64(key)`; ChaCha8 seeded from `(seed, fnv1a64(key))`.
//! - [`random`]: `philox4x32_10(counter, key)`, `philox_block(seed, step, block)`, `u32_to_unit(u)`.
//! - [`cuda`]: the CUDA C twin of every kernel (sources embedded, entry points,
//!   arguments, launch geometry, content hashes); data only, no CUDA dependency.
//! - [`shape`]: `broadcast_shapes(op, a, b)`, `numel(shape)`, `MAX_RANK`.

pub mod batchnorm;
pub mod conv;
pub mod cuda;
pub mod dropout;
pub mod elementwise;
pub mod error;
pub mod gemm;
pub mod init;
pub mod layout;
pub mod misc;
pub mod optim;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod shape;
pub mod softmax;
pub mod window;

#[cfg(test)]
mod testutil;

pub use error::KernelError;
