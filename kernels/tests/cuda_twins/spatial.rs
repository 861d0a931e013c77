//! Pooling, the convolutions (im2col/col2im around GEMMs, which the
//! harness runs on the host), the GEMM's bias epilogue, concat, split and
//! slices.

use towers_kernels::launch::backend_workspace;
use towers_kernels::{Kernel, UnaryOp};

use crate::cpu;
use crate::harness::{numel, Gpu, Report, Rng};

pub(crate) fn pools(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    use cpu::pool::{self, PoolGeom};
    use towers_kernels::window::Padding;
    for (p, name) in [
        (
            PoolGeom { n: 2, h: 9, w: 7, c: 5, kh: 3, kw: 3, stride_h: 2, stride_w: 2, padding: Padding::Same },
            "3x3/2 SAME",
        ),
        (
            PoolGeom { n: 3, h: 8, w: 8, c: 4, kh: 2, kw: 2, stride_h: 2, stride_w: 2, padding: Padding::Valid },
            "2x2/2 VALID",
        ),
        (
            PoolGeom { n: 2, h: 6, w: 5, c: 3, kh: 3, kw: 2, stride_h: 1, stride_w: 1, padding: Padding::Same },
            "3x2/1 SAME",
        ),
        (
            PoolGeom { n: 4, h: 28, w: 28, c: 32, kh: 2, kw: 2, stride_h: 2, stride_w: 2, padding: Padding::Same },
            "convnet 2x2/2",
        ),
    ] {
        let (xl, yl) = (p.x_len(), p.y_len());
        let x = rng.coarse(xl);
        let dy = rng.vec(yl, -1.0, 1.0);
        let (dx, ddy) = (g.up(&x), g.up(&dy));
        let (dyo, dxo) = (g.up(&vec![0f32; yl]), g.up(&vec![0f32; xl]));
        let mut y = vec![0f32; yl];
        let mut gx = vec![0f32; xl];

        g.run(&Kernel::MaxPool { geom: p }, &[dx.of(xl)], &[dyo.of(yl)], None);
        pool::max_pool(&p, &x, &mut y);
        r.f32("max_pool", name, &g.down(&dyo, yl), &y, None);
        let dyy = g.up(&y);
        g.run(&Kernel::MaxPoolGrad { geom: p }, &[dx.of(xl), dyy.of(yl), ddy.of(yl)], &[dxo.of(xl)], None);
        pool::max_pool_grad(&p, &x, &y, &dy, &mut gx);
        r.f32("max_pool_grad", format!("{name}, ties"), &g.down(&dxo, xl), &gx, None);
        // The fused backward of activation -> pool: the pool gradient, then
        // the activation and bias gradients in place on it (one block per
        // channel, or two stages for the convnet's 3136 rows); x stands for
        // the ReLU's output.
        let relu = UnaryOp::Relu;
        let (fdxo, gdb) = (g.up(&vec![f32::NAN; xl]), g.up(&vec![f32::NAN; p.c]));
        let k = Kernel::MaxPoolGradActBiasGrad { geom: p, act: relu };
        g.run(&k, &[dx.of(xl), dyy.of(yl), ddy.of(yl), dx.of(xl)], &[fdxo.of(xl), gdb.of(p.c)], None);
        let (mut fdx, mut fdb) = (vec![0f32; xl], vec![0f32; p.c]);
        pool::max_pool_grad_act_bias_grad(&p, &x, &y, &dy, relu, &x, &mut fdx, &mut fdb);
        r.f32("max_pool_grad_act_bias_grad", format!("{name} dx"), &g.down(&fdxo, xl), &fdx, None);
        // A sum over every pooled pixel of the batch in another order: 1e-4, as the other long sums.
        r.f32("max_pool_grad_act_bias_grad", format!("{name} db"), &g.down(&gdb, p.c), &fdb, Some(1e-4));

        g.run(&Kernel::AvgPool { geom: p }, &[dx.of(xl)], &[dyo.of(yl)], None);
        pool::avg_pool(&p, &x, &mut y);
        r.f32("avg_pool", name, &g.down(&dyo, yl), &y, None);
        g.run(&Kernel::AvgPoolGrad { geom: p }, &[ddy.of(yl)], &[dxo.of(xl)], None);
        pool::avg_pool_grad(&p, &dy, &mut gx);
        r.f32("avg_pool_grad", name, &g.down(&dxo, xl), &gx, None);
    }
}

pub(crate) fn convs(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    use cpu::conv::{self, ConvGeom};
    use cpu::pool::PoolGeom;
    use towers_kernels::window::Padding;
    let geom = |n, h, w, c_in, kh, kw, c_out, s, padding| ConvGeom {
        n,
        h,
        w,
        c_in,
        kh,
        kw,
        c_out,
        stride_h: s,
        stride_w: s,
        padding,
    };
    for (p, name) in [
        (geom(2, 9, 7, 3, 3, 3, 4, 2, Padding::Same), "3x3/2 SAME"),
        (geom(3, 8, 6, 2, 5, 3, 5, 1, Padding::Valid), "5x3/1 VALID"),
        (geom(2, 28, 28, 1, 5, 5, 32, 1, Padding::Same), "convnet conv1 5x5 SAME"),
        (geom(2, 6, 5, 3, 1, 1, 4, 1, Padding::Valid), "1x1 pointwise (GEMM only)"),
    ] {
        let (xl, yl, fl, co) = (p.x_len(), p.y_len(), p.filter_len(), p.c_out);
        let x = rng.vec(xl, -1.0, 1.0);
        let f = rng.vec(fl, -1.0, 1.0);
        let dy = rng.vec(yl, -1.0, 1.0);
        let b = rng.vec(co, -1.0, 1.0);
        let mut cpu_ws = vec![0f32; p.workspace_len()];
        let (dx, df, ddy, db) = (g.up(&x), g.up(&f), g.up(&dy), g.up(&b));
        let workspace_len = p.workspace_len();
        // The workspace the CUDA backend gives a convolution (its column
        // matrix, whole here: no convolution of these reaches the cap).
        let k = Kernel::Conv2D { geom: p, workspace_len };
        let wl = backend_workspace(&k).expect("a convolution's workspace");
        let ws = g.up(&vec![f32::NAN; wl]);

        let gy = g.up(&vec![f32::NAN; yl]);
        g.run(&k, &[dx.of(xl), df.of(fl)], &[gy.of(yl)], Some(ws.of(wl)));
        let mut want = vec![0f32; yl];
        conv::conv2d(&p, &x, &f, &mut want, &mut cpu_ws);
        r.f32("conv2d", format!("{name}: im2col + GEMM"), &g.down(&gy, yl), &want, Some(1e-5));

        // conv2d_bias_act: the same, then the epilogue in place on y; and
        // with the max pool that reads it fused (2x2/2 SAME).
        let act = UnaryOp::Relu;
        let pg = PoolGeom {
            n: p.n,
            h: p.out_h().0,
            w: p.out_w().0,
            c: co,
            kh: 2,
            kw: 2,
            stride_h: 2,
            stride_w: 2,
            padding: Padding::Same,
        };
        let mut want = vec![0f32; yl];
        conv::conv2d_bias_act(&p, &x, &f, &b, act, &mut want, &mut cpu_ws);
        let mut pooled = vec![0f32; pg.y_len()];
        cpu::pool::max_pool(&pg, &want, &mut pooled);
        for pool in [None, Some(pg)] {
            let k = Kernel::Conv2DBiasAct { geom: p, workspace_len, act, pool };
            let (gy, gp) = (g.up(&vec![f32::NAN; yl]), g.up(&vec![f32::NAN; pg.y_len()]));
            let outs = if pool.is_some() { vec![gy.of(yl), gp.of(pg.y_len())] } else { vec![gy.of(yl)] };
            g.run(&k, &[dx.of(xl), df.of(fl), db.of(co)], &outs, Some(ws.of(wl)));
            let case = if pool.is_some() { "im2col + GEMM + epilogue + max pool" } else { "im2col + GEMM + epilogue" };
            r.f32("conv2d_bias_act", format!("{name}: {case}"), &g.down(&gy, yl), &want, Some(1e-5));
            if pool.is_some() {
                r.f32(
                    "conv2d_bias_act",
                    format!("{name}: the fused pool"),
                    &g.down(&gp, pg.y_len()),
                    &pooled,
                    Some(1e-5),
                );
            }
        }

        // conv2d_backprop_filter = im2col, then col^T dy.
        let gdw = g.up(&vec![f32::NAN; fl]);
        let k = Kernel::Conv2DBackpropFilter { geom: p, workspace_len };
        g.run(&k, &[dx.of(xl), ddy.of(yl)], &[gdw.of(fl)], Some(ws.of(wl)));
        let mut want = vec![0f32; fl];
        conv::conv2d_backprop_filter(&p, &x, &dy, &mut want, &mut cpu_ws);
        // Both sums run over every output pixel of the batch (200K terms for
        // the convnet's first layer) in different orders (the CPU's blocked
        // kernel): 1e-4, as the other long sums.
        r.f32("conv2d_backprop_filter", format!("{name}: im2col + GEMM"), &g.down(&gdw, fl), &want, Some(1e-4));

        // conv2d_backprop_input = dy W^T, then col2im.
        let gdx = g.up(&vec![f32::NAN; xl]);
        let k = Kernel::Conv2DBackpropInput { geom: p, workspace_len };
        g.run(&k, &[ddy.of(yl), df.of(fl)], &[gdx.of(xl)], Some(ws.of(wl)));
        let mut want = vec![0f32; xl];
        conv::conv2d_backprop_input(&p, &dy, &f, &mut want, &mut cpu_ws);
        r.f32("conv2d_backprop_input", format!("{name}: GEMM + col2im"), &g.down(&gdx, xl), &want, Some(1e-5));
    }
    // gemm_bias_act: the GEMM, then the bias (and activation) epilogue in
    // place on its output; `None`: the bias alone.
    let (m, k, n) = (37usize, 19usize, 10usize);
    let a = rng.vec(m * k, -1.0, 1.0);
    let w = rng.vec(k * n, -1.0, 1.0);
    let b = rng.vec(n, -1.0, 1.0);
    let (da, dw, db) = (g.up(&a), g.up(&w), g.up(&b));
    for act in [None, Some(UnaryOp::Relu), Some(UnaryOp::Tanh)] {
        let y = g.up(&vec![f32::NAN; m * n]);
        let kern = Kernel::MatMulBiasAct { m, n, k, trans_a: false, trans_b: false, act };
        g.run(&kern, &[da.of(m * k), dw.of(k * n), db.of(n)], &[y.of(m * n)], None);
        let mut want = vec![0f32; m * n];
        cpu::matmul(m, k, n, false, false, &a, &w, &mut want);
        towers_kernels::elementwise::bias_then_act_in_place(&mut want, &b, act);
        let name = act.map_or("bias alone", |a| a.name());
        r.f32("gemm_bias_act", format!("[{m}, {k}] x [{k}, {n}]: {name}"), &g.down(&y, m * n), &want, Some(1e-6));
    }
    // gemm_batched: attention's q·kᵀ ([batch, m, k]·[batch, n, k]ᵀ), then a
    // shared right operand ([batch, m, k]·[k, n], one strided batched GEMM
    // with stride 0): each index against the rank-2 product of its matrices.
    let batch = 3usize;
    let q = rng.vec(batch * m * k, -1.0, 1.0);
    let kk = rng.vec(batch * n * k, -1.0, 1.0);
    let (dq, dk) = (g.up(&q), g.up(&kk));
    for (shared_b, b_len) in [(false, batch * n * k), (true, k * n)] {
        let y = g.up(&vec![f32::NAN; batch * m * n]);
        let kern =
            Kernel::BatchMatMul { batch, m, n, k, trans_a: false, trans_b: !shared_b, shared_a: false, shared_b };
        let rhs = if shared_b { (dw.of(b_len), &w) } else { (dk.of(b_len), &kk) };
        g.run(&kern, &[dq.of(batch * m * k), rhs.0], &[y.of(batch * m * n)], None);
        let mut want = vec![0f32; batch * m * n];
        for i in 0..batch {
            let bi = if shared_b { &rhs.1[..] } else { &rhs.1[i * n * k..] };
            cpu::matmul(m, k, n, false, !shared_b, &q[i * m * k..], bi, &mut want[i * m * n..(i + 1) * m * n]);
        }
        let what = if shared_b { "shared [k, n]" } else { "q·kᵀ" };
        r.f32("gemm_batched", format!("{batch} x [{m}, {k}] x {what}"), &g.down(&y, batch * m * n), &want, Some(1e-6));
    }
}

pub(crate) fn layout(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    use cpu::layout;
    // concat along axis 1 of rank-3 tensors, then split it back.
    let shapes: Vec<Vec<usize>> = vec![vec![4, 3, 5], vec![4, 1, 5], vec![4, 6, 5]];
    let axis = 1;
    let xs: Vec<Vec<f32>> = shapes.iter().map(|s| rng.vec(numel(s), -1.0, 1.0)).collect();
    let full = [4usize, 10, 5];
    let total = numel(&full);
    let out = g.up(&vec![f32::NAN; total]);
    let dxs: Vec<_> = xs.iter().map(|x| g.up(x)).collect();
    let ins: Vec<(u64, usize)> = dxs.iter().zip(&xs).map(|(d, x)| d.of(x.len())).collect();
    g.run(&Kernel::Concat { axis, shapes: shapes.clone() }, &ins, &[out.of(total)], None);
    let mut want = vec![0f32; total];
    let refs: Vec<&[f32]> = xs.iter().map(|v| v.as_slice()).collect();
    let srefs: Vec<&[usize]> = shapes.iter().map(|v| v.as_slice()).collect();
    layout::concat(&refs, &srefs, axis, &mut want).unwrap();
    r.f32("concat", "3 inputs, axis 1", &g.down(&out, total), &want, None);
    let sizes = [3usize, 1, 6];
    let mut wants: Vec<Vec<f32>> = sizes.iter().map(|s| vec![0f32; 4 * s * 5]).collect();
    {
        let mut outs: Vec<&mut [f32]> = wants.iter_mut().map(|v| v.as_mut_slice()).collect();
        layout::split(&want, &full, axis, &sizes, &mut outs).unwrap();
    }
    let parts: Vec<_> = wants.iter().map(|w| g.up(&vec![f32::NAN; w.len()])).collect();
    let outs: Vec<(u64, usize)> = parts.iter().zip(&wants).map(|(d, w)| d.of(w.len())).collect();
    g.run(&Kernel::Split { axis, shape: full.to_vec(), sizes: sizes.to_vec() }, &[out.of(total)], &outs, None);
    for ((s, w), d) in sizes.iter().zip(&wants).zip(&parts) {
        r.f32("split", format!("size {s} of {full:?}, axis 1"), &g.down(d, w.len()), w, None);
    }
    // slice and slice_grad.
    for (shape, begin, size) in [
        (&[6usize, 7, 8][..], &[1usize, 2, 0][..], &[3usize, 4, 8][..]),
        (&[2, 3, 4, 5], &[1, 0, 1, 2], &[1, 3, 2, 3]),
        (&[9], &[4], &[5]),
    ] {
        let (xl, yl) = (numel(shape), numel(size));
        let x = rng.vec(xl, -1.0, 1.0);
        let (dx, out) = (g.up(&x), g.up(&vec![f32::NAN; yl]));
        let (shape_v, begin_v, size_v) = (shape.to_vec(), begin.to_vec(), size.to_vec());
        let k = Kernel::Slice { shape: shape_v.clone(), begin: begin_v.clone(), size: size_v.clone() };
        g.run(&k, &[dx.of(xl)], &[out.of(yl)], None);
        let mut want = vec![0f32; yl];
        layout::slice(&x, shape, begin, size, &mut want).unwrap();
        r.f32("slice", format!("{shape:?} at {begin:?} size {size:?}"), &g.down(&out, yl), &want, None);
        let gy = rng.vec(yl, -1.0, 1.0);
        let (dgy, dgx) = (g.up(&gy), g.up(&vec![f32::NAN; xl]));
        let k = Kernel::SliceGrad { shape: shape_v, begin: begin_v, size: size_v };
        g.run(&k, &[dgy.of(yl)], &[dgx.of(xl)], None);
        let mut want = vec![0f32; xl];
        layout::slice_grad(&gy, shape, begin, size, &mut want).unwrap();
        r.f32("slice_grad", format!("{shape:?} at {begin:?} size {size:?}"), &g.down(&dgx, xl), &want, None);
    }
}
