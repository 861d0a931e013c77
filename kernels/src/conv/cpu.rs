//! CPU implementation of the convolution kernels: the dispatch on
//! [`Algorithm`] (the direct and blocked kernels run on the selected SIMD
//! path, [`crate::simd::active`]), im2col/col2im and GEMM. See the parent
//! module for layouts.

use super::{blocked, direct, Algorithm, ConvGeom, CHUNK_ELEMS};
use crate::elementwise::{bias_add_act_in_place, UnaryOp};
use crate::gemm::{matmul, MatMul};
use crate::simd::active;
use crate::window::window;

/// Forward convolution: `y = conv(x, filter)`.
///
/// `x: [n, h, w, c_in]`, `filter: [kh, kw, c_in, c_out]`,
/// `y: [n, out_h, out_w, c_out]`, `workspace: [p.workspace_len()]`.
pub fn conv2d(p: &ConvGeom, x: &[f32], filter: &[f32], y: &mut [f32], workspace: &mut [f32]) {
    debug_assert_eq!(x.len(), p.x_len());
    debug_assert_eq!(filter.len(), p.filter_len());
    debug_assert_eq!(y.len(), p.y_len());
    debug_assert!(workspace.len() >= p.workspace_len());
    let (rows, k, co) = (p.rows(), p.k(), p.c_out);
    if rows == 0 || co == 0 {
        return;
    }
    match p.algorithm() {
        Algorithm::Pointwise => matmul(&MatMul::new(rows, k, co), x, filter, y),
        Algorithm::Direct => direct::conv2d_on(active(), p, x, filter, None, y),
        Algorithm::Blocked => blocked::conv2d_on(active(), p, x, filter, None, y, workspace),
        Algorithm::Im2col => im2col_conv2d(p, x, filter, y, workspace),
    }
}

/// Fused forward convolution, bias and activation:
/// `y = act(conv(x, filter) + bias)`, `bias: [c_out]`, other arguments as
/// [`conv2d`]. The convolution runs block by block (whole images for the
/// direct kernels, the im2col chunks, row blocks of the pointwise GEMM),
/// each block of output about [`CHUNK_ELEMS`] floats, and the bias and the
/// activation run on each block right after it is written, while it is in
/// cache: one pass over `y` instead of three (the direct kernels add the
/// bias and apply ReLU in registers, before the store). Every output element is
/// computed as [`conv2d`] then `bias_add_act` compute it (each output sums
/// its taps in the same order whatever the blocking).
pub fn conv2d_bias_act(
    p: &ConvGeom,
    x: &[f32],
    filter: &[f32],
    bias: &[f32],
    act: UnaryOp,
    y: &mut [f32],
    workspace: &mut [f32],
) {
    debug_assert_eq!(x.len(), p.x_len());
    debug_assert_eq!(filter.len(), p.filter_len());
    debug_assert_eq!(bias.len(), p.c_out);
    debug_assert_eq!(y.len(), p.y_len());
    debug_assert!(workspace.len() >= p.workspace_len());
    let (rows, k, co) = (p.rows(), p.k(), p.c_out);
    if rows == 0 || co == 0 {
        return;
    }
    let epilogue = |yb: &mut [f32]| bias_add_act_in_place(yb, bias, act);
    match p.algorithm() {
        Algorithm::Pointwise => {
            let step = (CHUNK_ELEMS / co).max(1);
            let mut r0 = 0;
            while r0 < rows {
                let r = step.min(rows - r0);
                let yb = &mut y[r0 * co..(r0 + r) * co];
                matmul(&MatMul::new(r, k, co), &x[r0 * k..(r0 + r) * k], filter, yb);
                epilogue(yb);
                r0 += r;
            }
        }
        alg @ (Algorithm::Direct | Algorithm::Blocked) => direct_bias_act(alg, p, x, filter, bias, act, y, workspace),
        Algorithm::Im2col => im2col_conv2d_then(p, x, filter, y, workspace, epilogue),
    }
}

/// The direct or blocked forward (`alg`, the whole geometry's algorithm)
/// with the bias, and ReLU when `act` is ReLU, in registers before each
/// store; any other activation on the output after.
#[allow(clippy::too_many_arguments)]
fn direct_bias_act(
    alg: Algorithm,
    p: &ConvGeom,
    x: &[f32],
    filter: &[f32],
    bias: &[f32],
    act: UnaryOp,
    y: &mut [f32],
    workspace: &mut [f32],
) {
    let relu = act == UnaryOp::Relu;
    if alg == Algorithm::Blocked {
        blocked::conv2d_on(active(), p, x, filter, Some((bias, relu)), y, workspace);
    } else {
        direct::conv2d_on(active(), p, x, filter, Some((bias, relu)), y);
    }
    if !relu {
        crate::elementwise::unary::unary_in_place(act, y);
    }
}

/// [`conv2d_bias_act`], then a max pool of its output: `pool` is the pool's
/// geometry (input `y`: `pool.x_len() == y.len()`), `pooled` its output.
/// On the direct and blocked paths each group of whole images is pooled
/// right after it is computed, while it is in cache; elsewhere the pool
/// follows the whole output. The same values as the two kernels.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_bias_act_max_pool(
    p: &ConvGeom,
    x: &[f32],
    filter: &[f32],
    bias: &[f32],
    act: UnaryOp,
    pool: &crate::pool::PoolGeom,
    y: &mut [f32],
    pooled: &mut [f32],
    workspace: &mut [f32],
) {
    debug_assert_eq!(pool.x_len(), y.len());
    debug_assert_eq!(pool.n, p.n);
    let alg = p.algorithm();
    if p.n == 0 || !matches!(alg, Algorithm::Direct | Algorithm::Blocked) {
        conv2d_bias_act(p, x, filter, bias, act, y, workspace);
        crate::pool::max_pool(pool, y, pooled);
        return;
    }
    let (x_img, y_img, p_img) = (p.h * p.w * p.c_in, p.y_len() / p.n, pool.y_len() / p.n);
    let step = (CHUNK_ELEMS / y_img.max(1)).max(1);
    let mut n0 = 0;
    while n0 < p.n {
        let n = step.min(p.n - n0);
        let (sub, sub_pool) = (ConvGeom { n, ..*p }, crate::pool::PoolGeom { n, ..*pool });
        let yb = &mut y[n0 * y_img..(n0 + n) * y_img];
        let xb = &x[n0 * x_img..(n0 + n) * x_img];
        // The whole geometry's algorithm: the blocked kernels' workspace
        // need is per image, so what fits the whole fits the part.
        direct_bias_act(alg, &sub, xb, filter, bias, act, yb, workspace);
        crate::pool::max_pool(&sub_pool, yb, &mut pooled[n0 * p_img..(n0 + n) * p_img]);
        n0 += n;
    }
}

/// [`conv2d`] by im2col + GEMM, whatever the geometry's [`Algorithm`].
pub(super) fn im2col_conv2d(p: &ConvGeom, x: &[f32], filter: &[f32], y: &mut [f32], workspace: &mut [f32]) {
    im2col_conv2d_then(p, x, filter, y, workspace, |_| {})
}

/// [`im2col_conv2d`], calling `then` on each chunk of output rows once the
/// GEMM wrote it.
fn im2col_conv2d_then(
    p: &ConvGeom,
    x: &[f32],
    filter: &[f32],
    y: &mut [f32],
    workspace: &mut [f32],
    then: impl Fn(&mut [f32]),
) {
    let (rows, k, co) = (p.rows(), p.k(), p.c_out);
    if rows == 0 || co == 0 {
        return;
    }
    let step = p.chunk_rows();
    let mut r0 = 0;
    while r0 < rows {
        let r = step.min(rows - r0);
        let col = &mut workspace[..r * k];
        im2col(p, x, r0, r, col);
        let mm = MatMul::new(r, k, co);
        let yb = &mut y[r0 * co..(r0 + r) * co];
        matmul(&mm, col, filter, yb);
        then(yb);
        r0 += r;
    }
}

/// Gradient with respect to the input: `dx = conv2d_backprop_input(dy, filter)`.
///
/// `dy: [n, out_h, out_w, c_out]`, `filter: [kh, kw, c_in, c_out]`,
/// `dx: [n, h, w, c_in]` (overwritten), `workspace: [p.workspace_len()]`.
pub fn conv2d_backprop_input(p: &ConvGeom, dy: &[f32], filter: &[f32], dx: &mut [f32], workspace: &mut [f32]) {
    debug_assert_eq!(dx.len(), p.x_len());
    debug_assert_eq!(filter.len(), p.filter_len());
    debug_assert_eq!(dy.len(), p.y_len());
    debug_assert!(workspace.len() >= p.workspace_len());
    let (rows, k, co) = (p.rows(), p.k(), p.c_out);
    if p.is_pointwise() {
        // dx[rows, c_in] = dy[rows, c_out] * W^T, W stored [c_in, c_out].
        matmul(&MatMul::new(rows, co, k).trans_b(true), dy, filter, dx);
        return;
    }
    if rows > 0 && p.algorithm() == Algorithm::Blocked {
        return blocked::conv2d_backprop_input_on(active(), p, dy, filter, dx, workspace);
    }
    dx.fill(0.0);
    if rows == 0 {
        return;
    }
    let step = p.chunk_rows();
    let mut r0 = 0;
    while r0 < rows {
        let r = step.min(rows - r0);
        let dcol = &mut workspace[..r * k];
        let mm = MatMul::new(r, co, k).trans_b(true);
        matmul(&mm, &dy[r0 * co..(r0 + r) * co], filter, dcol);
        col2im_add(p, dcol, r0, r, dx);
        r0 += r;
    }
}

/// Gradient with respect to the filter: `dfilter = x^T (im2col) * dy`.
///
/// `x: [n, h, w, c_in]`, `dy: [n, out_h, out_w, c_out]`,
/// `dfilter: [kh, kw, c_in, c_out]` (overwritten), `workspace: [p.workspace_len()]`.
pub fn conv2d_backprop_filter(p: &ConvGeom, x: &[f32], dy: &[f32], dfilter: &mut [f32], workspace: &mut [f32]) {
    debug_assert_eq!(x.len(), p.x_len());
    debug_assert_eq!(dfilter.len(), p.filter_len());
    debug_assert_eq!(dy.len(), p.y_len());
    debug_assert!(workspace.len() >= p.workspace_len());
    let (rows, k, co) = (p.rows(), p.k(), p.c_out);
    if rows == 0 {
        dfilter.fill(0.0);
        return;
    }
    match p.algorithm() {
        // dW[c_in, c_out] = x^T dy, x stored [rows, c_in].
        Algorithm::Pointwise => matmul(&MatMul::new(k, rows, co).trans_a(true), x, dy, dfilter),
        Algorithm::Direct => direct::conv2d_backprop_filter_on(active(), p, x, dy, dfilter),
        Algorithm::Blocked => blocked::conv2d_backprop_filter_on(active(), p, x, dy, dfilter, workspace),
        Algorithm::Im2col => im2col_conv2d_backprop_filter(p, x, dy, dfilter, workspace),
    }
}

/// [`conv2d_backprop_filter`] by im2col + GEMM, whatever the geometry's [`Algorithm`].
pub(super) fn im2col_conv2d_backprop_filter(
    p: &ConvGeom,
    x: &[f32],
    dy: &[f32],
    dfilter: &mut [f32],
    workspace: &mut [f32],
) {
    let (rows, k, co) = (p.rows(), p.k(), p.c_out);
    if rows == 0 {
        dfilter.fill(0.0);
        return;
    }
    let step = p.chunk_rows();
    let mut r0 = 0;
    while r0 < rows {
        let r = step.min(rows - r0);
        let col = &mut workspace[..r * k];
        im2col(p, x, r0, r, col);
        let beta = if r0 == 0 { 0.0 } else { 1.0 };
        let mm = MatMul::new(k, r, co).trans_a(true).scale(1.0, beta);
        matmul(&mm, col, &dy[r0 * co..(r0 + r) * co], dfilter);
        r0 += r;
    }
}

/// Writes rows `r0..r0+r` of the column matrix into `col: [r, K]`.
///
/// For one `ky`, the in-range `kx` form a contiguous run both in `x` (one
/// image row) and in the column row, so each run is a single copy.
fn im2col(p: &ConvGeom, x: &[f32], r0: usize, r: usize, col: &mut [f32]) {
    let (oh, pt) = p.out_h();
    let (ow, pl) = p.out_w();
    let (k, ci) = (p.k(), p.c_in);
    let row_len = p.kw * ci;
    // Walk (b, oy, ox) incrementally: no division per row.
    let (mut b, rem) = (r0 / (oh * ow), r0 % (oh * ow));
    let (mut oy, mut ox) = (rem / ow, rem % ow);
    for dst in col[..r * k].chunks_exact_mut(k) {
        let (x_lo, x_hi, x_start) = window(ox, p.stride_w, pl, p.kw, p.w);
        let kx_lo = (x_lo as isize - x_start) as usize;
        let kx_hi = (x_hi as isize - x_start) as usize;
        let y_start = (oy * p.stride_h) as isize - pt as isize;
        for (ky, d) in dst.chunks_exact_mut(row_len).enumerate() {
            let iy = y_start + ky as isize;
            if iy < 0 || iy >= p.h as isize || x_lo >= x_hi {
                d.fill(0.0);
                continue;
            }
            d[..kx_lo * ci].fill(0.0);
            d[kx_hi * ci..].fill(0.0);
            let src = ((b * p.h + iy as usize) * p.w + x_lo) * ci;
            let n = (x_hi - x_lo) * ci;
            // Short runs (c_in = 1 filters) are cheaper as a plain loop than a memcpy call.
            for (o, v) in d[kx_lo * ci..kx_lo * ci + n].iter_mut().zip(&x[src..src + n]) {
                *o = *v;
            }
        }
        ox += 1;
        if ox == ow {
            ox = 0;
            oy += 1;
            if oy == oh {
                oy = 0;
                b += 1;
            }
        }
    }
}

/// Adds rows `r0..r0+r` of a column-shaped gradient `dcol: [r, K]` into `dx`.
fn col2im_add(p: &ConvGeom, dcol: &[f32], r0: usize, r: usize, dx: &mut [f32]) {
    let (oh, pt) = p.out_h();
    let (ow, pl) = p.out_w();
    let (k, ci) = (p.k(), p.c_in);
    for i in 0..r {
        let row = r0 + i;
        let (b, rem) = (row / (oh * ow), row % (oh * ow));
        let (oy, ox) = (rem / ow, rem % ow);
        let src = &dcol[i * k..(i + 1) * k];
        let (x_lo, x_hi, x_start) = window(ox, p.stride_w, pl, p.kw, p.w);
        if x_lo >= x_hi {
            continue;
        }
        let kx_lo = (x_lo as isize - x_start) as usize;
        let (_, _, y_start) = window(oy, p.stride_h, pt, p.kh, p.h);
        for ky in 0..p.kh {
            let iy = y_start + ky as isize;
            if iy < 0 || iy >= p.h as isize {
                continue;
            }
            let s0 = (ky * p.kw + kx_lo) * ci;
            let len = (x_hi - x_lo) * ci;
            let d0 = ((b * p.h + iy as usize) * p.w + x_lo) * ci;
            for (d, s) in dx[d0..d0 + len].iter_mut().zip(&src[s0..s0 + len]) {
                *d += *s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_close, Lcg};
    use crate::window::Padding;

    /// Direct convolution straight from the definition, in f64:
    /// `y[b,oy,ox,o] = sum_{ky,kx,c} x[b, oy*s-pt+ky, ox*s-pl+kx, c] * W[ky,kx,c,o]`
    /// with out-of-range inputs read as zero.
    fn naive(p: &ConvGeom, x: &[f32], f: &[f32]) -> Vec<f32> {
        let (oh, pt) = p.out_h();
        let (ow, pl) = p.out_w();
        let mut y = vec![0.0; p.y_len()];
        for b in 0..p.n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for o in 0..p.c_out {
                        let mut s = 0.0f64;
                        for ky in 0..p.kh {
                            for kx in 0..p.kw {
                                let iy = (oy * p.stride_h + ky) as isize - pt as isize;
                                let ix = (ox * p.stride_w + kx) as isize - pl as isize;
                                if iy < 0 || ix < 0 || iy >= p.h as isize || ix >= p.w as isize {
                                    continue;
                                }
                                for c in 0..p.c_in {
                                    let xv = x[((b * p.h + iy as usize) * p.w + ix as usize) * p.c_in + c];
                                    let fv = f[((ky * p.kw + kx) * p.c_in + c) * p.c_out + o];
                                    s += xv as f64 * fv as f64;
                                }
                            }
                        }
                        y[((b * oh + oy) * ow + ox) * p.c_out + o] = s as f32;
                    }
                }
            }
        }
        y
    }

    fn cases() -> Vec<ConvGeom> {
        let mut v = Vec::new();
        for padding in [Padding::Same, Padding::Valid] {
            for &(n, h, w, ci, kh, kw, co, sh, sw) in &[
                (2, 7, 6, 3, 3, 3, 4, 1, 1),
                (2, 7, 6, 3, 3, 3, 4, 2, 2),
                (1, 8, 8, 2, 5, 5, 3, 2, 1),
                (3, 5, 5, 1, 2, 3, 2, 1, 2),
                (2, 4, 5, 3, 1, 1, 2, 1, 1),
                (1, 5, 5, 2, 1, 1, 3, 2, 2),
                (1, 3, 3, 2, 5, 5, 2, 1, 1),
            ] {
                v.push(ConvGeom { n, h, w, c_in: ci, kh, kw, c_out: co, stride_h: sh, stride_w: sw, padding });
            }
        }
        v
    }

    #[test]
    fn forward_matches_direct() {
        let mut r = Lcg::new(11);
        for p in cases() {
            let x = r.vec(p.x_len());
            let f = r.vec(p.filter_len());
            let mut y = vec![f32::NAN; p.y_len()];
            let mut ws = vec![f32::NAN; p.workspace_len()];
            conv2d(&p, &x, &f, &mut y, &mut ws);
            assert_close(&y, &naive(&p, &x, &f), 1e-5, &format!("{p:?}"));
        }
    }

    /// The fused forward equals `conv2d` then `bias_add_act` bit for bit, on
    /// every path (direct, im2col, pointwise), including geometries whose
    /// output spans several epilogue blocks.
    #[test]
    fn fused_bias_and_activation_equal_the_three_kernels() {
        let mut r = Lcg::new(14);
        let mut geoms = cases();
        let big = |n, h, ci, k, co, padding| ConvGeom {
            n,
            h,
            w: h,
            c_in: ci,
            kh: k,
            kw: k,
            c_out: co,
            stride_h: 1,
            stride_w: 1,
            padding,
        };
        geoms.push(big(40, 28, 1, 5, 12, Padding::Valid)); // direct, 9 images per block
        geoms.push(big(6, 14, 12, 3, 24, Padding::Same)); // im2col, several chunks
        geoms.push(big(30, 16, 8, 1, 24, Padding::Same)); // pointwise, several row blocks
        for (k, p) in geoms.into_iter().enumerate() {
            let mut x = r.vec(p.x_len());
            // One NaN pixel in every other geometry: ReLU keeps it NaN in
            // the fused epilogue as in the separate kernel (TF's `Relu`).
            if k % 2 == 0 {
                x[p.x_len() / 2] = f32::NAN;
            }
            let f = r.vec(p.filter_len());
            let b = r.vec(p.c_out);
            for act in [UnaryOp::Relu, UnaryOp::Tanh] {
                let mut ws = vec![f32::NAN; p.workspace_len()];
                let mut conv = vec![f32::NAN; p.y_len()];
                conv2d(&p, &x, &f, &mut conv, &mut ws);
                let mut want = vec![f32::NAN; p.y_len()];
                crate::elementwise::bias_add_act(&conv, &b, act, &mut want);
                let mut y = vec![f32::NAN; p.y_len()];
                conv2d_bias_act(&p, &x, &f, &b, act, &mut y, &mut ws);
                let same = y.iter().zip(&want).all(|(a, w)| a.to_bits() == w.to_bits() || (a.is_nan() && w.is_nan()));
                assert!(same, "{p:?} {act:?} ({:?})", p.algorithm());
                assert_eq!(y.iter().any(|v| v.is_nan()), k % 2 == 0, "{p:?} {act:?}: a NaN input stays NaN");
            }
        }
    }

    /// With a max pool after it: the same values as the separate kernels, on
    /// the direct path (pooled per group of images) and on im2col.
    #[test]
    fn fused_max_pool_equals_the_kernels() {
        let mut r = Lcg::new(15);
        for (p, k) in [
            (
                ConvGeom {
                    n: 20,
                    h: 28,
                    w: 28,
                    c_in: 1,
                    kh: 5,
                    kw: 5,
                    c_out: 12,
                    stride_h: 1,
                    stride_w: 1,
                    padding: Padding::Valid,
                },
                2,
            ),
            (
                ConvGeom {
                    n: 3,
                    h: 12,
                    w: 12,
                    c_in: 12,
                    kh: 3,
                    kw: 3,
                    c_out: 24,
                    stride_h: 1,
                    stride_w: 1,
                    padding: Padding::Valid,
                },
                2,
            ),
        ] {
            let (oh, ow) = (p.out_h().0, p.out_w().0);
            let pool = crate::pool::PoolGeom {
                n: p.n,
                h: oh,
                w: ow,
                c: p.c_out,
                kh: k,
                kw: k,
                stride_h: k,
                stride_w: k,
                padding: Padding::Valid,
            };
            let (x, f, b) = (r.vec(p.x_len()), r.vec(p.filter_len()), r.vec(p.c_out));
            let mut ws = vec![0.0; p.workspace_len()];
            let mut want_y = vec![0.0; p.y_len()];
            conv2d_bias_act(&p, &x, &f, &b, UnaryOp::Relu, &mut want_y, &mut ws);
            let mut want_p = vec![0.0; pool.y_len()];
            crate::pool::max_pool(&pool, &want_y, &mut want_p);
            let (mut y, mut pooled) = (vec![f32::NAN; p.y_len()], vec![f32::NAN; pool.y_len()]);
            conv2d_bias_act_max_pool(&p, &x, &f, &b, UnaryOp::Relu, &pool, &mut y, &mut pooled, &mut ws);
            assert_eq!(y, want_y, "{p:?}");
            assert_eq!(pooled, want_p, "{p:?}");
        }
    }

    /// With `L = sum(y * g)` for fixed `g`, `dL/dx = conv2d_backprop_input(g, W)`
    /// and `dL/dW = conv2d_backprop_filter(x, g)`. L is linear in x and W, so
    /// central differences are exact up to rounding; we compare against them.
    #[test]
    fn gradients_match_finite_differences() {
        let mut r = Lcg::new(12);
        for p in cases() {
            let x = r.vec(p.x_len());
            let f = r.vec(p.filter_len());
            let g = r.vec(p.y_len());
            let loss = |x: &[f32], f: &[f32]| -> f64 {
                naive(&p, x, f).iter().zip(&g).map(|(a, b)| *a as f64 * *b as f64).sum()
            };
            let mut ws = vec![f32::NAN; p.workspace_len()];
            let mut dx = vec![f32::NAN; p.x_len()];
            conv2d_backprop_input(&p, &g, &f, &mut dx, &mut ws);
            let want = crate::testutil::numeric_grad(&x, 1e-2, |x| loss(x, &f));
            assert_close(&dx, &want, 1e-3, &format!("dx {p:?}"));
            let mut df = vec![f32::NAN; p.filter_len()];
            conv2d_backprop_filter(&p, &x, &g, &mut df, &mut ws);
            let want = crate::testutil::numeric_grad(&f, 1e-2, |f| loss(&x, f));
            assert_close(&df, &want, 1e-3, &format!("dW {p:?}"));
        }
    }

    #[test]
    fn chunking_is_exercised() {
        // Rows exceed one chunk; 5 input channels take the im2col path.
        let p = ConvGeom {
            n: 3,
            h: 160,
            w: 200,
            c_in: 5,
            kh: 3,
            kw: 3,
            c_out: 2,
            stride_h: 1,
            stride_w: 1,
            padding: Padding::Same,
        };
        assert!(p.chunk_rows() < p.rows());
        assert_eq!(p.algorithm(), super::super::Algorithm::Im2col);
        let mut r = Lcg::new(13);
        let x = r.vec(p.x_len());
        let f = r.vec(p.filter_len());
        let mut y = vec![0.0; p.y_len()];
        let mut ws = vec![0.0; p.workspace_len()];
        conv2d(&p, &x, &f, &mut y, &mut ws);
        assert_close(&y, &naive(&p, &x, &f), 1e-5, "chunked forward");
        // Filter gradient across chunks against a direct sum.
        let g = r.vec(p.y_len());
        let mut df = vec![0.0; p.filter_len()];
        conv2d_backprop_filter(&p, &x, &g, &mut df, &mut ws);
        let mut want = vec![0.0f32; p.filter_len()];
        for (j, w) in want.iter_mut().enumerate() {
            let mut e = vec![0.0; p.filter_len()];
            e[j] = 1.0;
            *w = naive(&p, &x, &e).iter().zip(&g).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() as f32;
        }
        assert_close(&df, &want, 1e-3, "chunked dW");
    }
}
