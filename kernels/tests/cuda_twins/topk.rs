//! The top-k family (top_k, in_top_k, top_k_grad): every twin bit for bit
//! against its CPU body, on rows full of ties (coarse values), NaN and inf,
//! and targets outside the classes.

use towers_kernels::{topk, Kernel};

use crate::harness::{Gpu, Report, Rng};

pub(crate) fn topk(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    // (rows, cols, k): fewer columns than a block, more (strided), k = cols.
    for (rows, cols, k) in [(37usize, 10usize, 5usize), (5, 700, 9), (3, 6, 6), (64, 10, 1)] {
        let mut x = rng.coarse(rows * cols);
        x[3] = f32::NAN;
        x[cols + 1] = f32::INFINITY;
        x[2 * cols] = -0.0;
        let n = rows * k;
        let (dx, dv, di) = (g.up(&x), g.up(&vec![f32::NAN; n]), g.up(&vec![-7i32; n]));
        g.run(&Kernel::TopK { rows, cols, k }, &[dx.of(x.len())], &[dv.of(n), di.of(n)], None);
        let (mut want_v, mut want_i) = (vec![0f32; n], vec![0i32; n]);
        topk::top_k(&x, cols, k, &mut want_v, &mut want_i);
        let case = format!("[{rows}, {cols}] k={k}, ties, NaN, inf");
        r.f32("top_k", case.clone(), &g.down(&dv, n), &want_v, None);
        r.i32("top_k", case, &g.down(&di, n), &want_i);

        // The gradient of those picks.
        let dvalues = rng.vec(n, -1.0, 1.0);
        let (ddv, out) = (g.up(&dvalues), g.up(&vec![f32::NAN; x.len()]));
        g.run(&Kernel::TopKGrad { rows, cols, k }, &[ddv.of(n), di.of(n)], &[out.of(x.len())], None);
        let mut want = vec![0f32; x.len()];
        topk::top_k_grad(&dvalues, &want_i, cols, k, &mut want).unwrap();
        r.f32("top_k_grad", format!("[{rows}, {cols}] k={k}"), &g.down(&out, x.len()), &want, None);

        // in_top_k against targets in and out of range, at this k.
        let mut targets = rng.ints(rows, cols as u64);
        targets[1] = -1;
        targets[2] = cols as i32;
        let (dt, o) = (g.up(&targets), g.up(&vec![-7i32; rows]));
        g.run(&Kernel::InTopK { rows, cols, k }, &[dx.of(x.len()), dt.of(rows)], &[o.of(rows)], None);
        let mut want = vec![0i32; rows];
        topk::in_top_k(&x, &targets, cols, k, &mut want);
        r.i32("in_top_k", format!("[{rows}, {cols}] k={k}, targets out of range"), &g.down(&o, rows), &want);
    }
}
