//! 2-D convolution, NHWC activations and TF's HWIO filters.
//!
//! Layouts (all dense row-major):
//! - `x`: `[n, h, w, c_in]`; `y`/`dy`: `[n, out_h, out_w, c_out]`;
//! - `filter`/`dfilter`: `[kh, kw, c_in, c_out]`, read as a `[K, c_out]`
//!   matrix with `K = kh * kw * c_in`, row index `(ky * kw + kx) * c_in + ci`.
//!
//! Output sizes and padding follow [`crate::window`] (TF's exact rules).
//!
//! Method, chosen per geometry by [`ConvGeom::algorithm`] (a function of the
//! geometry only, so every backend and every run picks the same):
//! - [`Algorithm::Pointwise`] (1x1, stride 1): one GEMM, no workspace;
//! - [`Algorithm::Direct`] (`1 <= c_in <= DIRECT_MAX_C_IN`, packed filter
//!   fits): the forward pass and the filter gradient by direct loops over
//!   output-channel vectors (`direct.rs`, `direct_fwd.rs`, `direct_dw.rs`)
//!   on every SIMD path; the input gradient by im2col. Measured (on
//!   AVX-512, with the intrinsics form these generic kernels replaced) at
//!   the seed's first layer (batch 256, 28x28x1, 5x5 -> 12 VALID, one
//!   thread, `cargo bench -p towers-kernels --bench kernels`): forward
//!   5.9 ms (15 GFLOP/s) by im2col -> 1.0 ms (87 GFLOP/s) direct, then
//!   0.76-0.94 ms (93-116 GFLOP/s; against 0.92-1.08 interleaved) with the
//!   unit-step rows (`kw` filter vectors in registers, each input load
//!   shared by the pixels it meets) and 64-byte aligned packed filters; filter
//!   gradient 7.0 ms -> 0.90-0.95 ms (93-98 GFLOP/s). Where they meet (batch 256,
//!   14x14, 3x3 -> 32 SAME): at `c_in = 2` direct 1.17 / 1.08 ms (forward /
//!   filter gradient) against im2col 1.52 / 1.51 ms; at `c_in = 4` direct
//!   1.99 / 2.33 ms against im2col 1.82 / 1.88 ms; hence
//!   `DIRECT_MAX_C_IN = 2` (3 unmeasured). At `c_in = 12` (the seed's second
//!   layer, 3x3 -> 24) im2col + GEMM runs at 62-70 GFLOP/s, direct at 59;
//! - [`Algorithm::Blocked`] (stride 1, `c_in` in [`BLOCKED_C_IN`], `c_out <=
//!   32`, packed filters and padded images fit): all three kernels by
//!   register-blocked direct loops (`blocked.rs`, `blocked_dw.rs`: a row of
//!   output pixels times all output channels in registers, or for the filter
//!   gradient one filter tap's input channels times all output channels) on
//!   every SIMD path. Measured (AVX-512, intrinsics form) at the seed's second
//!   layer (batch 256, 12x12x12, 3x3 -> 24 VALID, one thread, interleaved
//!   runs against the im2col build): forward 1.70-1.90 ms (70-78 GFLOP/s)
//!   by im2col -> 0.94-1.10 ms (120-142 GFLOP/s); input gradient
//!   1.67-1.87 ms (71-79) -> 1.26-1.41 ms (94-106); filter gradient
//!   1.75-1.97 ms (68-76) -> 1.00-1.12 ms (118-133). The lanes are output
//!   channels (24 of 32 used) and, for the SAME input gradient, input
//!   channels (12 of 16) over a zero-padded `dy` (about 17% of its taps
//!   read padding), which bounds them at 75% of the FMA peak. The VALID
//!   input gradient instead computes each `dy` pixel's column row
//!   (`kh * kw * c_in` lanes: 108 in 7 vectors at the seed) in registers and adds it
//!   into `dx` (`blocked_dx.rs`): at the seed 1.25-1.34 ms (99-106
//!   GFLOP/s) against 1.55-1.67 ms (80-86) for the padded correlation in
//!   the same interleaved runs (this machine ran 10-20% slower than when
//!   the figures above were taken; the forward then measured 1.07-1.16
//!   ms). Only `c_in = 12` is measured; below 12 the padded input gradient
//!   would use at most half its lanes, so the range starts there;
//! - [`Algorithm::Im2col`] otherwise: im2col into the caller's workspace,
//!   one chunk of output pixels at a time (`rows` output pixels -> a `[rows, K]` matrix), then GEMM:
//! - forward: `y[rows, c_out] = col[rows, K] * W[K, c_out]`;
//! - backprop input: `dcol[rows, K] = dy[rows, c_out] * W^T`, then col2im
//!   scatters (adds) `dcol` into `dx` (zeroed first);
//! - backprop filter: `dW[K, c_out] += col^T * dy`, accumulated over chunks.
//!
//! ## SIMD paths
//!
//! The direct and blocked kernels are written once, generic over
//! [`pulp::Simd`], and run on the process's path ([`crate::simd::active`]:
//! AVX-512, AVX2 + FMA, NEON or scalar, `TOWERS_SIMD` to force one); vector
//! lanes are output channels (columns of the column row for the VALID
//! blocked input gradient), the register blocks are sized per path from its
//! register count (`vec.rs`). Invariants:
//! - [`ConvGeom::algorithm`] is a function of the geometry only, the same on
//!   every path and every CPU (the geometry checks count 16-lane vectors);
//! - the direct and blocked kernels give **the same bits on every path**
//!   (each output sums its terms in one order fixed by the geometry, fused
//!   multiply-adds throughout; tested in `paths_tests.rs` on every path the
//!   CPU has). So a convolution's bits no longer depend on the CPU, except
//!   where the GEMM runs: [`Algorithm::Pointwise`], [`Algorithm::Im2col`] and
//!   the direct geometries' input gradient go through `gemm`, whose
//!   micro-kernel (and so its summation order) follows the CPU and the
//!   `avx512-gemm` feature, not `TOWERS_SIMD` ([`crate::simd::gemm_path`]);
//! - the scalar path runs the same bodies with one lane (`f32::mul_add`, a
//!   libm call on the baseline x86-64 target): slow, kept for its bits and
//!   for testing, not for speed. NEON builds and is tested only where an
//!   aarch64 machine runs the tests; its speed is unmeasured.
//!
//! Measured (2026-11-27, a shared 2-vCPU AMD EPYC Zen 5 with AVX-512, at a
//! quiet moment: FMA probe 266-271 / 133-135 GFLOP/s one thread at 512 /
//! 256 bits before and after; `cargo bench -p towers-kernels --bench kernels
//! -- conv_`, batch 256, one thread, best of two interleaved runs against
//! the intrinsics build, in microseconds):
//!
//! | kernel | AVX-512 intrinsics | AVX-512 generic | AVX2: im2col (AVX-512 GEMM) | AVX2 generic |
//! |---|---|---|---|---|
//! | conv_1 forward | 484 | 469 | 3050 | 1633 |
//! | conv_1 filter grad | 612 | 565 | 3173 | 2141 |
//! | conv_2 forward | 672 | 687 | 1025 | 1205 |
//! | conv_2 input grad | 708 | 921 | 1076 | 1348 |
//! | conv_2 filter grad | 705 | 668 | 1098 | 1118 |
//!
//! The generic column-row input gradient was 30% slower on AVX-512, so its
//! intrinsics form stays for that path (`blocked_dx_avx512.rs`, 723-734 us,
//! the same bits); every other AVX-512 kernel is generic. Under
//! `TOWERS_SIMD=avx2` the last column runs; its im2col comparison still had
//! the AVX-512 GEMM (the `avx512-gemm` feature), so the seed's second layer
//! there looks slower than im2col by 0-25%: against an AVX2 GEMM (an
//! AVX2-only CPU) that comparison is unmeasured.
//! The seed convnet's training step (`TOWERS_BENCH_QUICK=1 cargo bench
//! --bench step`, one thread, same hour, probe 263-265 / 133 GFLOP/s): with
//! AVX-512 7.20-7.77 ms before, 6.96-7.86 ms after (no slower); with
//! `TOWERS_SIMD=avx2` 15.5-15.6 ms (48-49 GFLOP/s, 37% of the AVX2 probe)
//! before, 11.7-11.9 ms (64-65 GFLOP/s, 48%) after; built without
//! `avx512-gemm` as well (an AVX2-only CPU's whole step, probe 128-131
//! GFLOP/s): 18.1-18.3 ms (41-42 GFLOP/s, 32%) before, 12.4-13.1 ms
//! (58-61 GFLOP/s, 44-47%) after.
//!
//! Chunking keeps the workspace small (about [`CHUNK_ELEMS`] floats) and in
//! cache; the workspace length is [`ConvGeom::workspace_len`] for all three
//! kernels. Direct geometries keep their im2col-sized workspace: their input
//! gradient uses it (plans keep their buffers; the direct kernels ignore it).
//! Blocked geometries keep it too: the blocked kernels put one zero-padded
//! image in it (`dy` for the input gradient; `x` under SAME), and are
//! selected only where that fits. A 1x1, stride-1 convolution needs no
//! workspace (the input already is the column matrix).

mod blocked;
mod blocked_dw;
mod blocked_dx;
#[cfg(target_arch = "x86_64")]
mod blocked_dx_avx512;
mod cpu;
pub mod desc;
mod direct;
mod direct_dw;
mod direct_fwd;
#[cfg(test)]
mod paths_tests;
mod vec;

pub use cpu::{conv2d, conv2d_backprop_filter, conv2d_backprop_input, conv2d_bias_act, conv2d_bias_act_max_pool};

use serde::{Deserialize, Serialize};

use crate::window::{out_and_pad, Padding};

/// Target number of f32 elements in one im2col chunk (256 KiB: the chunk
/// and its GEMM panels stay in L2).
pub const CHUNK_ELEMS: usize = 1 << 16;

/// Input channels up to which the direct kernels beat im2col + GEMM (see
/// the module docs for the measurements).
pub const DIRECT_MAX_C_IN: usize = 2;

/// Input channels the blocked kernels take (see the module docs).
pub const BLOCKED_C_IN: std::ops::RangeInclusive<usize> = 12..=16;

/// How a convolution is computed; a function of the geometry only
/// ([`ConvGeom::algorithm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// 1x1 stride 1: `x` is the column matrix; one GEMM.
    Pointwise,
    /// Few input channels: direct loops over output-channel vectors ([`direct`]).
    Direct,
    /// Stride 1, moderate channel counts: register-blocked direct loops for
    /// all three kernels (`blocked.rs`).
    Blocked,
    /// im2col into the workspace, chunk by chunk, then GEMM.
    Im2col,
}

/// The geometry of one convolution: the kernel's whole parameter block
/// (`Kernel::Conv2D { geom, .. }`). The kernels run on the calling thread;
/// parallelism across launches is the backend's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvGeom {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c_in: usize,
    pub kh: usize,
    pub kw: usize,
    pub c_out: usize,
    pub stride_h: usize,
    pub stride_w: usize,
    pub padding: Padding,
}

impl ConvGeom {
    /// `(out_h, pad_top)`.
    pub fn out_h(&self) -> (usize, usize) {
        out_and_pad(self.h, self.kh, self.stride_h, self.padding)
    }
    /// `(out_w, pad_left)`.
    pub fn out_w(&self) -> (usize, usize) {
        out_and_pad(self.w, self.kw, self.stride_w, self.padding)
    }
    /// `n * h * w * c_in`.
    pub fn x_len(&self) -> usize {
        self.n * self.h * self.w * self.c_in
    }
    /// `n * out_h * out_w * c_out`.
    pub fn y_len(&self) -> usize {
        self.rows() * self.c_out
    }
    /// `kh * kw * c_in * c_out`.
    pub fn filter_len(&self) -> usize {
        self.k() * self.c_out
    }
    /// Rows of the column matrix: `n * out_h * out_w`.
    pub fn rows(&self) -> usize {
        self.n * self.out_h().0 * self.out_w().0
    }
    /// Columns of the column matrix: `kh * kw * c_in`.
    pub fn k(&self) -> usize {
        self.kh * self.kw * self.c_in
    }
    /// True when `x` viewed as `[n*h*w, c_in]` already is the column matrix.
    pub(crate) fn is_pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.stride_h == 1 && self.stride_w == 1
    }
    /// The method [`conv2d`] and [`conv2d_backprop_filter`] use for this
    /// geometry ([`conv2d_backprop_input`] uses im2col unless pointwise).
    pub fn algorithm(&self) -> Algorithm {
        if self.is_pointwise() {
            Algorithm::Pointwise
        } else if self.c_in >= 1 && self.c_in <= DIRECT_MAX_C_IN && direct::fits(self) {
            Algorithm::Direct
        } else if self.blocked_fits() {
            Algorithm::Blocked
        } else {
            Algorithm::Im2col
        }
    }
    /// True when the blocked kernels handle `p` (and beat im2col; see the
    /// module docs): stride 1, `BLOCKED_C_IN` input channels, at most 32
    /// output channels, the packed filters fit on the stack and the padded
    /// images in the workspace.
    pub(crate) fn blocked_fits(&self) -> bool {
        let k = self.k();
        self.stride_h == 1
            && self.stride_w == 1
            && !self.is_pointwise()
            && BLOCKED_C_IN.contains(&self.c_in)
            && (1..=32).contains(&self.c_out)
            && self.rows() > 0
            && k * self.c_out.div_ceil(vec::MAX_LANES) <= vec::MAX_PACKED
            && self.kh * self.kw * self.c_out * self.c_in.div_ceil(vec::MAX_LANES) <= vec::MAX_PACKED
            && blocked::workspace_need(self) <= self.workspace_len()
    }
    /// Output pixels per im2col chunk.
    pub(crate) fn chunk_rows(&self) -> usize {
        (CHUNK_ELEMS / self.k().max(1)).clamp(1, self.rows().max(1))
    }
    /// Workspace (f32 elements) needed by [`conv2d`],
    /// [`conv2d_backprop_input`] and [`conv2d_backprop_filter`].
    pub fn workspace_len(&self) -> usize {
        if self.is_pointwise() || self.rows() == 0 {
            0
        } else {
            self.chunk_rows() * self.k()
        }
    }
}
