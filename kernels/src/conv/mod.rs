//! 2-D convolution, NHWC activations and TF's HWIO filters.
//!
//! Layouts (all dense row-major):
//! - `x`: `[n, h, w, c_in]`; `y`/`dy`: `[n, out_h, out_w, c_out]`;
//! - `filter`/`dfilter`: `[kh, kw, c_in, c_out]`, read as a `[K, c_out]`
//!   matrix with `K = kh * kw * c_in`, row index `(ky * kw + kx) * c_in + ci`.
//!
//! Output sizes and padding follow [`crate::window`] (TF's exact rules).
//!
//! Method: im2col into the caller's workspace, one chunk of output pixels at
//! a time (`rows` output pixels -> a `[rows, K]` matrix), then GEMM:
//! - forward: `y[rows, c_out] = col[rows, K] * W[K, c_out]`;
//! - backprop input: `dcol[rows, K] = dy[rows, c_out] * W^T`, then col2im
//!   scatters (adds) `dcol` into `dx` (zeroed first);
//! - backprop filter: `dW[K, c_out] += col^T * dy`, accumulated over chunks.
//!
//! Chunking keeps the workspace small (about [`CHUNK_ELEMS`] floats) and in
//! cache; the workspace length is [`ConvGeom::workspace_len`] for all three
//! kernels. A 1x1, stride-1 convolution needs no workspace (the input already
//! is the column matrix).

mod cpu;

pub use cpu::{conv2d, conv2d_backprop_filter, conv2d_backprop_input};

use serde::{Deserialize, Serialize};

use crate::window::{out_and_pad, Padding};

/// Target number of f32 elements in one im2col chunk (256 KiB: the chunk
/// and its GEMM panels stay in L2).
pub const CHUNK_ELEMS: usize = 1 << 16;

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
