//! The array family of issue 22 (one_hot, transpose, pad, gather,
//! gather_grad, tile, tile_grad): every twin bit for bit against its CPU
//! body (copies, and gradients summed in the CPU's order with `__fadd_rn`),
//! launched as the CUDA backend lowers them.

use towers_kernels::{array, Kernel};

use crate::harness::{numel, Gpu, Report, Rng};

pub(crate) fn arrays(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    // one_hot with indices inside and outside [0, depth).
    let (rows, depth) = (37usize, 10usize);
    let mut idx = rng.ints(rows, 10);
    idx[3] = -1;
    idx[5] = 10;
    let (di, out) = (g.up(&idx), g.up(&vec![f32::NAN; rows * depth]));
    let k = Kernel::OneHot { depth, on: 0.9, off: 0.01 };
    g.run(&k, &[di.of(rows)], &[out.of(rows * depth)], None);
    let mut want = vec![0f32; rows * depth];
    array::one_hot(&idx, depth, 0.9, 0.01, &mut want);
    r.f32("one_hot", "37 rows, depth 10, two out of range", &g.down(&out, rows * depth), &want, None);

    // transpose: output axis k is input axis perm[k].
    for (shape, perm) in
        [(&[3usize, 4, 5][..], &[2usize, 0, 1][..]), (&[2, 3, 4, 5], &[3, 1, 0, 2]), (&[7, 9], &[1, 0])]
    {
        let x = rng.vec(numel(shape), -1.0, 1.0);
        let (dx, dy) = (g.up(&x), g.up(&vec![f32::NAN; x.len()]));
        let k = Kernel::Transpose { shape: shape.to_vec(), perm: perm.to_vec() };
        g.run(&k, &[dx.of(x.len())], &[dy.of(x.len())], None);
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
        let k =
            Kernel::Pad { shape: shape.to_vec(), before: before.to_vec(), out_shape: out_shape.clone(), value: -0.5 };
        g.run(&k, &[dx.of(x.len())], &[dy.of(m)], None);
        let mut want = vec![0f32; m];
        array::pad(&x, shape, before, &out_shape, -0.5, &mut want).unwrap();
        r.f32("pad", format!("{shape:?} before {before:?} after {after:?}"), &g.down(&dy, m), &want, None);
    }

    // gather and its gradient along the middle of [outer, limit, inner], repeated indices.
    let (outer, limit, inner, count) = (3usize, 11usize, 5usize, 40usize);
    let params = rng.vec(outer * limit * inner, -1.0, 1.0);
    let idx = rng.ints(count, limit as u64);
    let (m, p) = (outer * count * inner, outer * limit * inner);
    let (dp, di, out) = (g.up(&params), g.up(&idx), g.up(&vec![f32::NAN; m]));
    g.run(&Kernel::Gather { outer, limit, inner, count }, &[dp.of(p), di.of(count)], &[out.of(m)], None);
    let mut want = vec![0f32; m];
    array::gather(&params, &idx, outer, limit, inner, &mut want).unwrap();
    r.f32("gather", "[3, 11, 5] by 40 indices", &g.down(&out, m), &want, None);
    let dy = rng.vec(m, -1.0, 1.0);
    let (ddy, dgp) = (g.up(&dy), g.up(&vec![f32::NAN; p]));
    g.run(&Kernel::GatherGrad { outer, limit, inner, count }, &[ddy.of(m), di.of(count)], &[dgp.of(p)], None);
    let mut want = vec![0f32; p];
    array::gather_grad(&dy, &idx, outer, limit, inner, &mut want).unwrap();
    r.f32("gather_grad", "[3, 11, 5] from 40 repeated indices", &g.down(&dgp, p), &want, None);

    // tile and its gradient.
    for (shape, multiples) in [(&[3usize, 4][..], &[2usize, 3][..]), (&[2, 1, 3, 2], &[1, 4, 2, 3])] {
        let x = rng.vec(numel(shape), -1.0, 1.0);
        let tiled: Vec<usize> = shape.iter().zip(multiples).map(|(d, m)| d * m).collect();
        let m = numel(&tiled);
        let (dx, dy) = (g.up(&x), g.up(&vec![f32::NAN; m]));
        let k = Kernel::Tile { shape: shape.to_vec(), multiples: multiples.to_vec() };
        g.run(&k, &[dx.of(x.len())], &[dy.of(m)], None);
        let mut want = vec![0f32; m];
        array::tile(&x, shape, multiples, &mut want).unwrap();
        r.f32("tile", format!("{shape:?} by {multiples:?}"), &g.down(&dy, m), &want, None);
        let gy = rng.vec(m, -1.0, 1.0);
        let (dgy, dgx) = (g.up(&gy), g.up(&vec![f32::NAN; x.len()]));
        let k = Kernel::TileGrad { shape: shape.to_vec(), multiples: multiples.to_vec() };
        g.run(&k, &[dgy.of(m)], &[dgx.of(x.len())], None);
        let mut want = vec![0f32; x.len()];
        array::tile_grad(&gy, shape, multiples, &mut want).unwrap();
        r.f32("tile_grad", format!("{shape:?} by {multiples:?}"), &g.down(&dgx, x.len()), &want, None);
    }
}
