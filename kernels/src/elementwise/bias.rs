//! `bias_add` over the last axis (NHWC `[N, H, W, C]` or `[N, C]`: any
//! tensor viewed as `[rows, C]`) and its gradient.
//!
//! SIMD: the add (`bias_add`, and in place in the fused epilogues) and the
//! gradient's column sums are bodies generic over the vector width
//! (`bias_simd.rs`), run on the process's [`crate::simd`] path. Both are
//! **bit-identical on every path** (AVX-512, AVX2, NEON, scalar) and to the
//! plain loops they replaced: the add is one rounding per element, and the
//! column sums keep the tile layout below (a fixed `m * C` floats, which
//! depends on `C` alone, never on the vector width). The activations
//! themselves are `unary.rs`'s.

#[path = "bias_simd.rs"]
pub(crate) mod simd;

/// Floats the bias is repeated to, at least, for short rows: a row of 12
/// channels is too short a loop to vectorize, 6 rows of it (72 floats) are
/// not (conv_1's bias add and ReLU, [256, 24, 24, 12]: 830 -> ~250 us).
const PATTERN: usize = 256;

/// The bias repeated over whole rows to at least [`PATTERN`] floats (the
/// bias itself for rows that long), in `buf`; the pattern's length is a
/// multiple of 16 floats where that fits `buf` (no partial vector inside a
/// pattern on any path).
fn pattern<'a>(bias: &'a [f32], buf: &'a mut [f32; 2 * PATTERN]) -> &'a [f32] {
    let c = bias.len();
    if c == 0 || c >= PATTERN {
        return bias;
    }
    let lcm = c / gcd(c, 16) * 16;
    let len = if lcm <= 2 * PATTERN { PATTERN.div_ceil(lcm) * lcm } else { PATTERN.div_ceil(c) * c };
    for chunk in buf[..len].chunks_exact_mut(c) {
        chunk.copy_from_slice(bias);
    }
    &buf[..len]
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `y[r, c] = x[r, c] + bias[c]`; `x, y: [rows, C]` with `C = bias.len()`.
pub fn bias_add(x: &[f32], bias: &[f32], y: &mut [f32]) {
    let c = bias.len();
    debug_assert_eq!(x.len(), y.len());
    debug_assert_eq!(x.len() % c.max(1), 0);
    if c == 0 {
        return;
    }
    let mut buf = [0f32; 2 * PATTERN];
    let pat = pattern(bias, &mut buf);
    crate::simd::dispatch(simd::AddPattern { x: Some(x), pat, y })
}

/// `y[r, c] += bias[c]`, in place, as [`bias_add`].
fn bias_add_in_place(y: &mut [f32], bias: &[f32]) {
    let mut buf = [0f32; 2 * PATTERN];
    let pat = pattern(bias, &mut buf);
    crate::simd::dispatch(simd::AddPattern { x: None, pat, y })
}

/// Floats per block of [`bias_add_act`] (16 KiB: the block stays in L1
/// between the add and the activation).
const ACT_BLOCK: usize = 4096;

/// `y = act(x + bias)`: a bias add and the activation after it, fused by
/// lowering into one launch. Per block of whole rows, the add then the
/// activation in place, while the block is in L1: one pass over memory
/// instead of two, and no buffer for the sum. Bit for bit
/// `unary(act, bias_add(x, bias))`.
pub fn bias_add_act(x: &[f32], bias: &[f32], act: super::UnaryOp, y: &mut [f32]) {
    let c = bias.len();
    debug_assert_eq!(x.len(), y.len());
    if c == 0 {
        return;
    }
    let rows = (ACT_BLOCK / c).max(1) * c;
    for (yb, xb) in y.chunks_mut(rows).zip(x.chunks(rows)) {
        bias_add(xb, bias, yb);
        super::unary::unary_in_place(act, yb);
    }
}

/// `y = act(y + bias)` in place, block by block as [`bias_add_act`]: the
/// epilogue of a fused convolution (`conv2d_bias_act`), run on each block
/// of output the convolution just wrote, while it is in cache. Bit for bit
/// [`bias_add_act`] of the same values.
pub fn bias_add_act_in_place(y: &mut [f32], bias: &[f32], act: super::UnaryOp) {
    let c = bias.len();
    debug_assert_eq!(y.len() % c.max(1), 0);
    if c == 0 {
        return;
    }
    let rows = (ACT_BLOCK / c).max(1) * c;
    for yb in y.chunks_mut(rows) {
        bias_add_in_place(yb, bias);
        super::unary::unary_in_place(act, yb);
    }
}

/// `y = y + bias` then, when given, `act` in place: a GEMM's fused epilogue
/// (`gemm_bias_act`), bit for bit `bias_add` (then the activation).
pub fn bias_then_act_in_place(y: &mut [f32], bias: &[f32], act: Option<super::UnaryOp>) {
    match act {
        Some(act) => bias_add_act_in_place(y, bias, act),
        None if !bias.is_empty() => bias_add_in_place(y, bias),
        None => {}
    }
}

/// Channels [`unary_grad_bias_grad`] keeps per-block partial sums of on the stack.
const GRAD_MAX_CHANNELS: usize = 1024;

/// `dx = unary_grad(act, dy, y)` and `db = bias_add_grad(dx)`: an
/// activation's gradient and the bias gradient that reads it, fused by
/// lowering into one launch. Per block of whole rows, the gradient then the
/// block's column sums while the block is in L1 (one pass over `dx` fewer),
/// the blocks' sums added in block order: deterministic, and equal to the
/// two launches up to the reassociation of `db`'s sum. More than
/// [`GRAD_MAX_CHANNELS`] channels run as the two kernels.
pub fn unary_grad_bias_grad(act: super::UnaryOp, dy: &[f32], y: &[f32], dx: &mut [f32], db: &mut [f32]) {
    let c = db.len();
    debug_assert!(dy.len() == y.len() && dy.len() == dx.len());
    if c == 0 || c > GRAD_MAX_CHANNELS {
        super::unary::unary_grad(act, dy, y, dx);
        bias_add_grad(dx, db);
        return;
    }
    db.fill(0.0);
    let mut part = [0f32; GRAD_MAX_CHANNELS];
    let rows = (ACT_BLOCK / c).max(1) * c;
    for ((xb, gb), yb) in dx.chunks_mut(rows).zip(dy.chunks(rows)).zip(y.chunks(rows)) {
        super::unary::unary_grad(act, gb, yb, xb);
        bias_add_grad(xb, &mut part[..c]);
        for (d, p) in db.iter_mut().zip(&part[..c]) {
            *d += *p;
        }
    }
}

/// [`unary_grad_bias_grad`] with `dx` written over `dy` (lowering's
/// in-place activation gradient, when `dy` has no other reader): the same
/// values, block by block in the same order.
pub fn unary_grad_bias_grad_in_place(act: super::UnaryOp, dy_dx: &mut [f32], y: &[f32], db: &mut [f32]) {
    let c = db.len();
    debug_assert_eq!(dy_dx.len(), y.len());
    if c == 0 || c > GRAD_MAX_CHANNELS {
        super::unary::unary_grad_in_place(act, dy_dx, y);
        bias_add_grad(dy_dx, db);
        return;
    }
    db.fill(0.0);
    let mut part = [0f32; GRAD_MAX_CHANNELS];
    let rows = (ACT_BLOCK / c).max(1) * c;
    for (xb, yb) in dy_dx.chunks_mut(rows).zip(y.chunks(rows)) {
        super::unary::unary_grad_in_place(act, xb, yb);
        bias_add_grad(xb, &mut part[..c]);
        for (d, p) in db.iter_mut().zip(&part[..c]) {
            *d += *p;
        }
    }
}

/// Floats in the tile [`bias_add_grad`] sums whole rows into.
const TILE: usize = 64;

/// `db[c] = sum_r dy[r, c]`; `dy: [rows, C]`, `db: [C]` (overwritten).
///
/// For `C <= TILE / 2`, `m = TILE / C` rows at a time are summed as one
/// tile of `m * C` floats (a loop the compiler vectorizes; one row of 12
/// channels is too short for that), then the tile's `m` partial sums are
/// folded per channel: 482 -> 270 us for a `[256, 24, 24, 12]` gradient.
/// The order depends only on `C` and the row count: deterministic.
pub fn bias_add_grad(dy: &[f32], db: &mut [f32]) {
    let c = db.len();
    debug_assert_eq!(dy.len() % c.max(1), 0);
    db.fill(0.0);
    if c == 0 {
        return;
    }
    let m = TILE / c;
    if m < 2 {
        // Row by row: the tile is one row, summed into `db` itself.
        crate::simd::dispatch(simd::TileSums { dy, relu_y: None, acc: db });
        return;
    }
    let mut acc = [0.0f32; TILE];
    let acc = &mut acc[..m * c];
    crate::simd::dispatch(simd::TileSums { dy, relu_y: None, acc });
    for part in acc.chunks_exact(c) {
        for (o, v) in db.iter_mut().zip(part) {
            *o += *v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_close, Lcg};

    /// Row counts around the tile (12 channels: 5 rows per tile) and
    /// channel counts on both sides of the tiled path.
    #[test]
    fn bias_grad_tiled_and_plain() {
        let mut r = Lcg::new(52);
        for (rows, c) in [(1, 12), (4, 12), (5, 12), (6, 12), (23, 12), (7, 1), (9, 32), (9, 33), (3, 100)] {
            let dy = r.vec(rows * c);
            let mut db = vec![f32::NAN; c];
            bias_add_grad(&dy, &mut db);
            let want: Vec<f32> = (0..c).map(|j| (0..rows).map(|i| dy[i * c + j] as f64).sum::<f64>() as f32).collect();
            assert_close(&db, &want, 1e-5, &format!("rows {rows} c {c}"));
        }
    }

    /// Every path this CPU has gives the plain loops' bits: the add, in
    /// place and not, and the tiled column sums (rows around the tile,
    /// channel counts on both sides of it and of every vector width, -0.0
    /// and NaN in the data, and no rows at all).
    #[test]
    fn every_path_matches_the_plain_loops_bit_for_bit() {
        use crate::simd::{dispatch_on, SimdPath};
        let mut r = Lcg::new(53);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (rows, c) in [
            (0, 12),
            (1, 12),
            (4, 12),
            (5, 12),
            (23, 12),
            (7, 1),
            (9, 10),
            (9, 24),
            (9, 32),
            (9, 33),
            (3, 100),
            (5, 255),
            (4, 300),
        ] {
            let mut dy = r.vec(rows * c);
            for (i, v) in dy.iter_mut().enumerate() {
                match i % 17 {
                    4 => *v = -0.0,
                    9 if i % 3 == 0 => *v = f32::NAN,
                    _ => {}
                }
            }
            let b = r.vec(c);
            let want_y: Vec<f32> = dy.iter().enumerate().map(|(i, v)| *v + b[i % c]).collect();
            // The plain loop before SIMD: tiles of m * c floats, then the fold.
            let m = TILE / c;
            let mut want_db = vec![0.0f32; c];
            if m < 2 {
                for row in dy.chunks_exact(c) {
                    for (o, v) in want_db.iter_mut().zip(row) {
                        *o += *v;
                    }
                }
            } else {
                let mut acc = vec![0.0f32; m * c];
                for t in dy.chunks(m * c) {
                    for (a, v) in acc.iter_mut().zip(t) {
                        *a += *v;
                    }
                }
                for part in acc.chunks_exact(c) {
                    for (o, v) in want_db.iter_mut().zip(part) {
                        *o += *v;
                    }
                }
            }
            let mut buf = [0f32; 2 * PATTERN];
            let pat = pattern(&b, &mut buf);
            for path in SimdPath::available() {
                let mut y = vec![f32::NAN; rows * c];
                dispatch_on(path, simd::AddPattern { x: Some(&dy), pat, y: &mut y });
                assert_eq!(bits(&y), bits(&want_y), "bias_add {path} [{rows}, {c}]");
                let mut y = dy.clone();
                dispatch_on(path, simd::AddPattern { x: None, pat, y: &mut y });
                assert_eq!(bits(&y), bits(&want_y), "in place {path} [{rows}, {c}]");
                let mut db = vec![0.0f32; c];
                if m < 2 {
                    dispatch_on(path, simd::TileSums { dy: &dy, relu_y: None, acc: &mut db });
                } else {
                    let mut acc = vec![0.0f32; m * c];
                    dispatch_on(path, simd::TileSums { dy: &dy, relu_y: None, acc: &mut acc });
                    for part in acc.chunks_exact(c) {
                        for (o, v) in db.iter_mut().zip(part) {
                            *o += *v;
                        }
                    }
                }
                assert_eq!(bits(&db), bits(&want_db), "bias_add_grad {path} [{rows}, {c}]");
            }
            let mut db = vec![f32::NAN; c];
            bias_add_grad(&dy, &mut db);
            assert_eq!(bits(&db), bits(&want_db), "bias_add_grad [{rows}, {c}]");
        }
    }

    #[test]
    fn bias_add_and_grad() {
        let mut r = Lcg::new(51);
        let (rows, c) = (7, 5);
        let x = r.vec(rows * c);
        let b = r.vec(c);
        let mut y = vec![0.0; rows * c];
        bias_add(&x, &b, &mut y);
        for i in 0..rows * c {
            assert_eq!(y[i], x[i] + b[i % c]);
        }
        let mut db = vec![f32::NAN; c];
        bias_add_grad(&x, &mut db);
        let want: Vec<f32> = (0..c).map(|j| (0..rows).map(|i| x[i * c + j] as f64).sum::<f64>() as f32).collect();
        assert_close(&db, &want, 1e-6, "bias grad");
    }
}

#[cfg(test)]
mod fused_tests {
    use super::*;
    use crate::elementwise::{unary, UnaryOp};

    #[test]
    fn bias_add_act_is_the_add_then_the_activation_bit_for_bit() {
        // Row counts around the block size, and channel counts that do and
        // do not divide it.
        for (rows, c) in [(1usize, 1usize), (7, 12), (341, 12), (1000, 24), (3, 5000)] {
            let x: Vec<f32> = (0..rows * c).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
            let b: Vec<f32> = (0..c).map(|i| ((i * 11 % 13) as f32 - 6.0) / 5.0).collect();
            for &act in UnaryOp::ALL {
                let mut sum = vec![0f32; rows * c];
                bias_add(&x, &b, &mut sum);
                let mut want = vec![0f32; rows * c];
                unary(act, &sum, &mut want);
                let mut got = vec![0f32; rows * c];
                bias_add_act(&x, &b, act, &mut got);
                let same = got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(same, "{} on [{rows}, {c}]", act.name());
            }
        }
    }

    #[test]
    fn unary_grad_bias_grad_is_the_gradient_then_its_column_sums() {
        use crate::elementwise::unary_grad;
        for (rows, c) in [(1usize, 1usize), (7, 12), (1000, 12), (700, 24), (3, 5000)] {
            let dy: Vec<f32> = (0..rows * c).map(|i| ((i * 29 % 97) as f32 - 48.0) / 31.0).collect();
            let y: Vec<f32> = (0..rows * c).map(|i| ((i * 13 % 89) as f32 - 30.0) / 40.0).collect();
            for &act in UnaryOp::ALL {
                let mut want_dx = vec![0f32; rows * c];
                unary_grad(act, &dy, &y, &mut want_dx);
                let mut want_db = vec![0f32; c];
                bias_add_grad(&want_dx, &mut want_db);
                let (mut dx, mut db) = (vec![0f32; rows * c], vec![7f32; c]);
                unary_grad_bias_grad(act, &dy, &y, &mut dx, &mut db);
                let same = dx.iter().zip(&want_dx).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{} dx on [{rows}, {c}]", act.name());
                for (a, b) in db.iter().zip(&want_db) {
                    let ok = a == b || (a - b).abs() <= 1e-4 * b.abs().max(1.0) || (a.is_nan() && b.is_nan());
                    assert!(ok, "{} db on [{rows}, {c}]: {a} vs {b}", act.name());
                }
            }
        }
    }
}
