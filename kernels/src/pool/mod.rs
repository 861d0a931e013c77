//! 2-D max and average pooling, NHWC, with TF's SAME/VALID rules
//! ([`crate::window`]).
//!
//! Layouts: `x`/`dx`: `[n, h, w, c]`; `y`/`dy`: `[n, out_h, out_w, c]`.
//! Invariants kept from TF:
//! - max pooling ignores padding (padded cells are never candidates);
//! - average pooling divides by the number of *non-padded* cells in the
//!   window (TF's `avg_pool` with SAME padding), and its gradient spreads
//!   `dy / count` evenly over those same cells;
//! - the max-pool gradient routes each `dy` to the *first* maximal input of
//!   its window in row-major window order (ties: first), as TF's CPU kernel.
//!
//! Every output window holds at least one input cell for valid geometry
//! (SAME windows start inside the input; VALID windows are fully inside).
//!
//! SIMD: every kernel here is one body generic over the vector width
//! (`body.rs`), run on the process's [`crate::simd`] path (AVX-512, AVX2,
//! NEON or scalar). Lanes are channels, so results are **bit-identical on
//! every path** and to the plain loops they replaced (kept as the tests'
//! references); see `body.rs` for the order of operations.

mod body;
pub mod desc;
mod fused;
#[cfg(test)]
mod tests;

pub use fused::max_pool_grad_act_bias_grad;

use serde::{Deserialize, Serialize};

use crate::window::{out_and_pad, Padding};

/// The geometry of one pooling op: the kernel's whole parameter block
/// (`Kernel::MaxPool { geom }`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolGeom {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride_h: usize,
    pub stride_w: usize,
    pub padding: Padding,
}

impl PoolGeom {
    /// `(out_h, pad_top)`.
    pub fn out_h(&self) -> (usize, usize) {
        out_and_pad(self.h, self.kh, self.stride_h, self.padding)
    }
    /// `(out_w, pad_left)`.
    pub fn out_w(&self) -> (usize, usize) {
        out_and_pad(self.w, self.kw, self.stride_w, self.padding)
    }
    /// `n * h * w * c`.
    pub fn x_len(&self) -> usize {
        self.n * self.h * self.w * self.c
    }
    /// `n * out_h * out_w * c`.
    pub fn y_len(&self) -> usize {
        self.n * self.out_h().0 * self.out_w().0 * self.c
    }

    /// Calls `f(b, oy, ox, (y_lo, y_hi), (x_lo, x_hi))` for every output pixel
    /// (the tests' reference loops).
    #[cfg(test)]
    fn for_each_window(&self, mut f: impl FnMut(usize, usize, usize, (usize, usize), (usize, usize))) {
        let (oh, pt) = self.out_h();
        let (ow, pl) = self.out_w();
        for b in 0..self.n {
            for oy in 0..oh {
                let (ylo, yhi, _) = crate::window::window(oy, self.stride_h, pt, self.kh, self.h);
                for ox in 0..ow {
                    let (xlo, xhi, _) = crate::window::window(ox, self.stride_w, pl, self.kw, self.w);
                    f(b, oy, ox, (ylo, yhi), (xlo, xhi));
                }
            }
        }
    }
}

/// `y = max_pool(x)`; `x: [n,h,w,c]`, `y: [n,out_h,out_w,c]`.
pub fn max_pool(p: &PoolGeom, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), p.x_len());
    debug_assert_eq!(y.len(), p.y_len());
    crate::simd::dispatch(body::MaxPool { p, x, y })
}

/// `y = avg_pool(x)`, dividing by the count of non-padded cells.
pub fn avg_pool(p: &PoolGeom, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), p.x_len());
    debug_assert_eq!(y.len(), p.y_len());
    crate::simd::dispatch(body::AvgPool { p, x, y })
}

/// `dx = max_pool_grad(x, y, dy)`: each `dy` goes to the first cell of its
/// window (in row-major window order) whose `x` equals the window's maximum
/// `y`, as TF's `MaxPoolGrad` does on ties. `y` must be the forward output of
/// this `x` (the plan guarantees it). `dx` is overwritten.
///
/// Branchless over channels: each cell is one masked vector compare per
/// block of channels (a per-channel argmax with branches mispredicted on
/// random data and ran 5x slower). Windows that never overlap (stride >=
/// window, as the usual 2x2 stride 2 pool) own their cells: each cell is
/// written once, never read back and added to; when they also cover the
/// input exactly, no cell is left for a zero fill either.
pub fn max_pool_grad(p: &PoolGeom, x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32]) {
    max_pool_grad_routed(p, x, y, dy, dx, false)
}

/// [`max_pool_grad`], routing `y > 0 ? dy : +0.0` instead of `dy` when
/// `relu` (the fused ReLU gradient of `fused.rs`; exact for disjoint
/// windows only, where each cell is routed from one window at most).
pub(crate) fn max_pool_grad_routed(p: &PoolGeom, x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32], relu: bool) {
    debug_assert_eq!(x.len(), p.x_len());
    debug_assert_eq!(y.len(), p.y_len());
    debug_assert_eq!(dy.len(), p.y_len());
    debug_assert_eq!(dx.len(), p.x_len());
    let disjoint = p.stride_h >= p.kh && p.stride_w >= p.kw;
    if !(disjoint && tiles(p)) {
        dx.fill(0.0);
    }
    crate::simd::dispatch(body::MaxPoolGrad { p, x, y, dy, dx, disjoint, relu })
}

/// Whether the windows cover the input exactly, each cell in one window.
fn tiles(p: &PoolGeom) -> bool {
    p.stride_h == p.kh
        && p.stride_w == p.kw
        && p.out_h() == (p.h / p.kh, 0)
        && p.out_w() == (p.w / p.kw, 0)
        && p.h.is_multiple_of(p.kh)
        && p.w.is_multiple_of(p.kw)
}

/// `dx = avg_pool_grad(dy)`: each `dy` is spread as `dy / count` over the
/// non-padded cells of its window. `dx` is overwritten.
pub fn avg_pool_grad(p: &PoolGeom, dy: &[f32], dx: &mut [f32]) {
    debug_assert_eq!(dy.len(), p.y_len());
    debug_assert_eq!(dx.len(), p.x_len());
    dx.fill(0.0);
    crate::simd::dispatch(body::AvgPoolGrad { p, dy, dx })
}
