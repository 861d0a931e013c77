//! The array family of issue 22 (one_hot, transpose, pad, gather,
//! gather_grad, tile, tile_grad): every twin bit for bit against its CPU
//! body (copies, and gradients summed in the CPU's order with `__fadd_rn`),
//! with the argument lists of `runtime/src/cuda/lower/array.rs`.

use towers_kernels::array;
use towers_kernels::cuda::Dims4;

use crate::harness::{d4, n, numel, Gpu, Report, Rng, Val, A};

pub(crate) fn arrays(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    // one_hot with indices inside and outside [0, depth).
    let (rows, depth) = (37usize, 10usize);
    let mut idx = rng.ints(rows, 10);
    idx[3] = -1;
    idx[5] = 10;
    let (di, out) = (g.up(&idx), g.up(&vec![f32::NAN; rows * depth]));
    g.ew(
        "array",
        "towers_one_hot_f32",
        rows * depth,
        &[n(rows * depth), n(depth), A::F32(0.9), A::F32(0.01), di.a(), out.a()],
    );
    let mut want = vec![0f32; rows * depth];
    array::one_hot(&idx, depth, 0.9, 0.01, &mut want);
    r.f32("one_hot", "37 rows, depth 10, two out of range", &g.down(&out, rows * depth), &want, None);

    // transpose: the output dims and, per output axis, the input stride of axis perm[k].
    for (shape, perm) in
        [(&[3usize, 4, 5][..], &[2usize, 0, 1][..]), (&[2, 3, 4, 5], &[3, 1, 0, 2]), (&[7, 9], &[1, 0])]
    {
        let x = rng.vec(numel(shape), -1.0, 1.0);
        let s = Dims4::padded(shape, 1).unwrap().d;
        let st = [s[1] * s[2] * s[3], s[2] * s[3], s[3], 1];
        let off = 4 - shape.len();
        let (mut od, mut src) = ([1i64; 4], [0i64; 4]);
        for k in 0..4 {
            let from = if k < off { k } else { off + perm[k - off] };
            od[k] = s[from];
            src[k] = st[from];
        }
        let (dx, dy) = (g.up(&x), g.up(&vec![f32::NAN; x.len()]));
        let a = [n(x.len()), dx.a(), dy.a(), A::D4(Val(Dims4 { d: od })), A::D4(Val(Dims4 { d: src }))];
        g.ew("array", "towers_transpose_f32", x.len(), &a);
        let mut want = vec![0f32; x.len()];
        array::transpose(&x, shape, perm, &mut want).unwrap();
        r.f32("transpose", format!("{shape:?} by {perm:?}"), &g.down(&dy, x.len()), &want, None);
    }

    // pad.
    for (shape, before, after) in
        [(&[3usize, 4][..], &[1usize, 0][..], &[2usize, 3][..]), (&[2, 3, 4, 2], &[0, 1, 2, 0], &[1, 0, 1, 1])]
    {
        let x = rng.vec(numel(shape), -1.0, 1.0);
        let out_shape: Vec<usize> = (0..shape.len()).map(|i| shape[i] + before[i] + after[i]).collect();
        let m = numel(&out_shape);
        let (dx, dy) = (g.up(&x), g.up(&vec![f32::NAN; m]));
        let a = [n(m), dx.a(), dy.a(), d4(&out_shape, 1), d4(before, 0), d4(shape, 1), A::F32(-0.5)];
        g.ew("array", "towers_pad_f32", m, &a);
        let mut want = vec![0f32; m];
        array::pad(&x, shape, before, &out_shape, -0.5, &mut want).unwrap();
        r.f32("pad", format!("{shape:?} before {before:?} after {after:?}"), &g.down(&dy, m), &want, None);
    }

    // gather and its gradient along the middle of [outer, limit, inner], repeated indices.
    let (outer, limit, inner, count) = (3usize, 11usize, 5usize, 40usize);
    let params = rng.vec(outer * limit * inner, -1.0, 1.0);
    let idx = rng.ints(count, limit as u64);
    let (dp, di, out) = (g.up(&params), g.up(&idx), g.up(&vec![f32::NAN; outer * count * inner]));
    let m = outer * count * inner;
    g.ew("array", "towers_gather_f32", m, &[n(m), n(limit), n(inner), n(count), dp.a(), di.a(), out.a()]);
    let mut want = vec![0f32; m];
    array::gather(&params, &idx, outer, limit, inner, &mut want).unwrap();
    r.f32("gather", "[3, 11, 5] by 40 indices", &g.down(&out, m), &want, None);
    let dy = rng.vec(m, -1.0, 1.0);
    let p = outer * limit * inner;
    let (ddy, dgp) = (g.up(&dy), g.up(&vec![f32::NAN; p]));
    g.ew("array", "towers_gather_grad_f32", p, &[n(p), n(limit), n(inner), n(count), ddy.a(), di.a(), dgp.a()]);
    let mut want = vec![0f32; p];
    array::gather_grad(&dy, &idx, outer, limit, inner, &mut want).unwrap();
    r.f32("gather_grad", "[3, 11, 5] from 40 repeated indices", &g.down(&dgp, p), &want, None);

    // tile and its gradient.
    for (shape, multiples) in [(&[3usize, 4][..], &[2usize, 3][..]), (&[2, 1, 3, 2], &[1, 4, 2, 3])] {
        let x = rng.vec(numel(shape), -1.0, 1.0);
        let tiled: Vec<usize> = shape.iter().zip(multiples).map(|(d, m)| d * m).collect();
        let m = numel(&tiled);
        let (dx, dy) = (g.up(&x), g.up(&vec![f32::NAN; m]));
        g.ew("array", "towers_tile_f32", m, &[n(m), dx.a(), dy.a(), d4(&tiled, 1), d4(shape, 1)]);
        let mut want = vec![0f32; m];
        array::tile(&x, shape, multiples, &mut want).unwrap();
        r.f32("tile", format!("{shape:?} by {multiples:?}"), &g.down(&dy, m), &want, None);
        let gy = rng.vec(m, -1.0, 1.0);
        let (dgy, dgx) = (g.up(&gy), g.up(&vec![f32::NAN; x.len()]));
        g.ew("array", "towers_tile_grad_f32", x.len(), &[n(x.len()), dgy.a(), dgx.a(), d4(shape, 1), d4(multiples, 1)]);
        let mut want = vec![0f32; x.len()];
        array::tile_grad(&gy, shape, multiples, &mut want).unwrap();
        r.f32("tile_grad", format!("{shape:?} by {multiples:?}"), &g.down(&dgx, x.len()), &want, None);
    }
}
