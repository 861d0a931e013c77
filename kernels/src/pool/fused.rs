//! `max_pool_grad_act_bias_grad`: a max pool's gradient, the gradient of
//! the activation before the pool, and the bias gradient of that, in one
//! launch (lowering fuses `MaxPoolGrad` -> `UnaryGrad` + `BiasAddGrad`, the
//! backward of conv -> bias -> activation -> max pool).
//!
//! Method: the batch in groups of whole images, each group's `dx` about
//! [`GROUP_ELEMS`] floats: the pool gradient of the group, then the
//! activation gradient in place and the group's bias-gradient column sums
//! while the group is in cache (one pass over `dx` instead of three), the
//! groups' sums added in group order. `dx` equals the three kernels' bit for
//! bit; `db` differs from them only by the association of its sum, and is
//! deterministic (the groups depend on the geometry alone). For a ReLU whose
//! output is the pool's input (the usual conv -> ReLU -> pool) and disjoint
//! windows, the ReLU's gradient is folded into the pool gradient's routing
//! and the bias gradient summed over the pool's output instead (see
//! `max_pool_grad_act_bias_grad`).
//!
//! SIMD paths: which of the two methods runs depends on the geometry and
//! the activation alone, never on the SIMD path, and both give the same
//! bits on every path (the pool gradient is `body.rs`'s generic body; the
//! sums' order is fixed by the channel count). Until the generic pool body,
//! the ReLU fold ran on AVX-512 only, so AVX2 and scalar runs' `db` now
//! takes the AVX-512 rounding (a reassociated sum) where it took the
//! grouped one.

use super::{max_pool_grad, max_pool_grad_routed, PoolGeom};
use crate::elementwise::{unary_grad_bias_grad_in_place, UnaryOp};

/// Target floats of `dx` per group of images (256 KiB).
const GROUP_ELEMS: usize = 1 << 16;

/// Channels whose partial sums fit the stack buffer; more run ungrouped.
const MAX_CHANNELS: usize = 1024;

/// `dx = act_grad(max_pool_grad(x, y, dy), act_y)` and `db[c] = sum dx[.., c]`.
///
/// `x: [n, h, w, c]` (the pool's input), `y, dy: [n, out_h, out_w, c]` (its
/// output and the output's gradient), `act_y: [n, h, w, c]` (the output of
/// the activation `act` whose gradient this is; usually `x` itself),
/// `dx: [n, h, w, c]`, `db: [c]` (both overwritten).
#[allow(clippy::too_many_arguments)]
pub fn max_pool_grad_act_bias_grad(
    p: &PoolGeom,
    x: &[f32],
    y: &[f32],
    dy: &[f32],
    act: UnaryOp,
    act_y: &[f32],
    dx: &mut [f32],
    db: &mut [f32],
) {
    debug_assert_eq!(act_y.len(), p.x_len());
    debug_assert_eq!(db.len(), p.c);
    let c = p.c;
    // ReLU whose output is the pool's input (conv -> bias -> ReLU -> pool):
    // the routed cell holds the window's maximum y, so its ReLU gradient is
    // `y > 0 ? dy : 0` and every other cell's is 0. The pool gradient routes
    // that masked dy directly, and the bias gradient is the masked dy's
    // column sums over the pool's output (each window routes to one cell):
    // one pass over dx instead of two.
    let disjoint = p.stride_h >= p.kh && p.stride_w >= p.kw;
    if act == UnaryOp::Relu && std::ptr::eq(x.as_ptr(), act_y.as_ptr()) && disjoint {
        max_pool_grad_routed(p, x, y, dy, dx, true);
        masked_column_sums(dy, y, db);
        return;
    }
    if p.n == 0 || c > MAX_CHANNELS {
        max_pool_grad(p, x, y, dy, dx);
        unary_grad_bias_grad_in_place(act, dx, act_y, db);
        return;
    }
    let (xi, yi) = (p.x_len() / p.n, p.y_len() / p.n);
    let step = (GROUP_ELEMS / xi.max(1)).max(1);
    db.fill(0.0);
    let mut part = [0f32; MAX_CHANNELS];
    let mut n0 = 0;
    while n0 < p.n {
        let n = step.min(p.n - n0);
        let sub = PoolGeom { n, ..*p };
        let (xs, ys) = (n0 * xi..(n0 + n) * xi, n0 * yi..(n0 + n) * yi);
        let dxb = &mut dx[xs.clone()];
        max_pool_grad(&sub, &x[xs.clone()], &y[ys.clone()], &dy[ys], dxb);
        unary_grad_bias_grad_in_place(act, dxb, &act_y[xs], &mut part[..c]);
        for (d, q) in db.iter_mut().zip(&part[..c]) {
            *d += *q;
        }
        n0 += n;
    }
}

/// `db[k] = sum over rows of (y > 0 ? dy : 0)[row, k]`, rows of `db.len()`
/// channels, summed a tile of whole rows at a time (a multiple of 16
/// floats, at least 64: several vectors of independent columns on every
/// path) and the tile's rows folded in order: deterministic, and the same
/// bits on every SIMD path (the tile depends on the channel count alone).
fn masked_column_sums(dy: &[f32], y: &[f32], db: &mut [f32]) {
    use crate::elementwise::bias::simd::TileSums;
    let c = db.len();
    db.fill(0.0);
    if c == 0 {
        return;
    }
    let lcm = c / gcd(c, 16) * 16;
    let width = lcm * 64usize.div_ceil(lcm);
    if width > TILE_MAX {
        // Long rows: row by row, into `db` itself.
        crate::simd::dispatch(TileSums { dy, relu_y: Some(y), acc: db });
        return;
    }
    let mut acc = [0f32; TILE_MAX];
    let acc = &mut acc[..width];
    crate::simd::dispatch(TileSums { dy, relu_y: Some(y), acc });
    for row in acc.chunks_exact(c) {
        for (d, a) in db.iter_mut().zip(row) {
            *d += *a;
        }
    }
}

/// Floats of [`masked_column_sums`]' tile at most.
const TILE_MAX: usize = 1024;

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elementwise::{bias_add_grad, unary_grad};
    use crate::testutil::{assert_close, Lcg};
    use crate::window::Padding;

    /// Against the three kernels: `dx` bit for bit, `db` to rounding; with
    /// several groups of images, and overlapping windows (zero-filled `dx`).
    #[test]
    fn equals_the_three_kernels() {
        let mut r = Lcg::new(21);
        let geoms = [
            PoolGeom { n: 40, h: 24, w: 24, c: 12, kh: 2, kw: 2, stride_h: 2, stride_w: 2, padding: Padding::Valid },
            PoolGeom { n: 3, h: 7, w: 6, c: 5, kh: 3, kw: 3, stride_h: 2, stride_w: 1, padding: Padding::Same },
        ];
        for p in geoms {
            // x holds ReLU outputs: zeros and positives, and y its pool.
            let x: Vec<f32> = r.vec(p.x_len()).iter().map(|v| v.max(0.0)).collect();
            let mut y = vec![0.0; p.y_len()];
            super::super::max_pool(&p, &x, &mut y);
            let dy = r.vec(p.y_len());
            let mut pooled = vec![f32::NAN; p.x_len()];
            max_pool_grad(&p, &x, &y, &dy, &mut pooled);
            let mut want = vec![f32::NAN; p.x_len()];
            unary_grad(UnaryOp::Relu, &pooled, &x, &mut want);
            let mut want_db = vec![f32::NAN; p.c];
            bias_add_grad(&want, &mut want_db);
            // act_y is x itself (the fast path where AVX-512 runs it), then a
            // copy of x (the general path): the same values.
            let copy = x.clone();
            for act_y in [&x, &copy] {
                let (mut dx, mut db) = (vec![f32::NAN; p.x_len()], vec![f32::NAN; p.c]);
                max_pool_grad_act_bias_grad(&p, &x, &y, &dy, UnaryOp::Relu, act_y, &mut dx, &mut db);
                assert!(dx.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{p:?}");
                assert_close(&db, &want_db, 1e-5, &format!("{p:?}"));
            }
        }
    }

    /// The ReLU-masked column sums on every path this CPU has equal the
    /// plain loop bit for bit (tile widths that fit the registers and that
    /// do not, a short last tile, rows longer than the tile limit).
    #[test]
    fn masked_sums_match_the_plain_loop_on_every_path() {
        use crate::elementwise::bias::simd::TileSums;
        use crate::simd::{dispatch_on, SimdPath};
        let mut r = Lcg::new(22);
        for (rows, c) in [(0usize, 12usize), (1, 12), (37, 12), (50, 24), (9, 5), (7, 100), (5, 1500)] {
            let dy = r.vec(rows * c);
            let y: Vec<f32> = r.vec(rows * c).iter().map(|v| if *v < -0.5 { 0.0 } else { *v }).collect();
            let lcm = c / gcd(c, 16) * 16;
            let width = if lcm * 64usize.div_ceil(lcm) > TILE_MAX { c } else { lcm * 64usize.div_ceil(lcm) };
            let mut want = vec![0.0f32; width];
            for (t, ty) in dy.chunks(width).zip(y.chunks(width)) {
                for ((a, g), v) in want.iter_mut().zip(t).zip(ty) {
                    *a += if *v > 0.0 { *g } else { 0.0 };
                }
            }
            for path in SimdPath::available() {
                let mut acc = vec![0.0f32; width];
                dispatch_on(path, TileSums { dy: &dy, relu_y: Some(&y), acc: &mut acc });
                let same = acc.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{path} [{rows}, {c}]");
            }
        }
    }
}
