//! Pooling, the convolution's im2col/col2im (with the GEMM on the host),
//! concat, split and slices.

use towers_kernels::cuda::{grid_rows, ConvArgs, PoolArgs, BLOCK};

use crate::cpu;
use crate::harness::{d4, n, numel, Gpu, Report, Rng, Val, A};

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
        let ga = A::Pool(Val(PoolArgs::from(&p)));
        let x = rng.coarse(p.x_len());
        let dy = rng.vec(p.y_len(), -1.0, 1.0);
        let (dx, ddy) = (g.up(&x), g.up(&dy));
        let (dyo, dxo) = (g.up(&vec![0f32; p.y_len()]), g.up(&vec![0f32; p.x_len()]));
        let mut y = vec![0f32; p.y_len()];
        let mut gx = vec![0f32; p.x_len()];
        let ga2 = || A::Pool(Val(PoolArgs::from(&p)));

        g.ew("pool", "towers_max_pool_f32", p.y_len(), &[ga, dx.a(), dyo.a()]);
        pool::max_pool(&p, &x, &mut y);
        r.f32("max_pool", name, &g.down(&dyo, p.y_len()), &y, None);
        let dyy = g.up(&y);
        g.ew("pool", "towers_max_pool_grad_f32", p.x_len(), &[ga2(), dx.a(), dyy.a(), ddy.a(), dxo.a()]);
        pool::max_pool_grad(&p, &x, &y, &dy, &mut gx);
        r.f32("max_pool_grad", format!("{name}, ties"), &g.down(&dxo, p.x_len()), &gx, None);
        // The fused backward of activation -> pool: the pool gradient in dxo
        // (above), then the reduce family's activation and bias gradients in
        // place on it, as lowering launches them; x stands for the ReLU's output.
        let gdb = g.up(&vec![0f32; p.c]);
        let rows = p.x_len() / p.c;
        g.launch(
            "reduce",
            "towers_unary_grad_bias_grad_f32",
            grid_rows(p.c),
            BLOCK,
            &[A::I32(1), n(rows), n(p.c), dxo.a(), dx.a(), dxo.a(), gdb.a()],
        );
        let (mut fdx, mut fdb) = (vec![0f32; p.x_len()], vec![0f32; p.c]);
        let relu = towers_kernels::UnaryOp::Relu;
        pool::max_pool_grad_act_bias_grad(&p, &x, &y, &dy, relu, &x, &mut fdx, &mut fdb);
        r.f32("max_pool_grad_act_bias_grad", format!("{name} dx"), &g.down(&dxo, p.x_len()), &fdx, None);
        // A sum over every pooled pixel of the batch in another order: 1e-4, as the other long sums.
        r.f32("max_pool_grad_act_bias_grad", format!("{name} db"), &g.down(&gdb, p.c), &fdb, Some(1e-4));

        g.ew("pool", "towers_avg_pool_f32", p.y_len(), &[ga2(), dx.a(), dyo.a()]);
        pool::avg_pool(&p, &x, &mut y);
        r.f32("avg_pool", name, &g.down(&dyo, p.y_len()), &y, None);
        g.ew("pool", "towers_avg_pool_grad_f32", p.x_len(), &[ga2(), ddy.a(), dxo.a()]);
        pool::avg_pool_grad(&p, &dy, &mut gx);
        r.f32("avg_pool_grad", name, &g.down(&dxo, p.x_len()), &gx, None);
    }
}

pub(crate) fn convs(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    use cpu::conv::{self, ConvGeom};
    use towers_kernels::window::Padding;
    for (p, name) in [
        (
            ConvGeom {
                n: 2,
                h: 9,
                w: 7,
                c_in: 3,
                kh: 3,
                kw: 3,
                c_out: 4,
                stride_h: 2,
                stride_w: 2,
                padding: Padding::Same,
            },
            "3x3/2 SAME",
        ),
        (
            ConvGeom {
                n: 3,
                h: 8,
                w: 6,
                c_in: 2,
                kh: 5,
                kw: 3,
                c_out: 5,
                stride_h: 1,
                stride_w: 1,
                padding: Padding::Valid,
            },
            "5x3/1 VALID",
        ),
        (
            ConvGeom {
                n: 2,
                h: 28,
                w: 28,
                c_in: 1,
                kh: 5,
                kw: 5,
                c_out: 32,
                stride_h: 1,
                stride_w: 1,
                padding: Padding::Same,
            },
            "convnet conv1 5x5 SAME",
        ),
    ] {
        let ga = || A::Conv(Val(ConvArgs::from(&p)));
        let (rows, k, co) = (p.rows(), p.k(), p.c_out);
        let x = rng.vec(p.x_len(), -1.0, 1.0);
        let f = rng.vec(p.filter_len(), -1.0, 1.0);
        let dy = rng.vec(p.y_len(), -1.0, 1.0);
        let mut ws = vec![0f32; p.workspace_len().max(rows * k)];
        let dx = g.up(&x);
        // im2col in two chunks, as the plan's chunked workspace would run it.
        let split = rows / 3;
        let col = g.up(&vec![0f32; rows * k]);
        let col_b = g.up(&vec![0f32; (rows - split) * k]);
        g.ew("conv", "towers_im2col_f32", split * k, &[ga(), n(0), n(split), dx.a(), col.a()]);
        g.ew("conv", "towers_im2col_f32", (rows - split) * k, &[ga(), n(split), n(rows - split), dx.a(), col_b.a()]);
        let mut cols = g.down(&col, split * k);
        cols.extend(g.down(&col_b, (rows - split) * k));
        // conv2d = im2col, then the GEMM (here on the host).
        let mut y = vec![0f32; p.y_len()];
        cpu::matmul(rows, k, co, false, false, &cols, &f, &mut y);
        let mut want = vec![0f32; p.y_len()];
        conv::conv2d(&p, &x, &f, &mut want, &mut ws);
        r.f32("conv2d", format!("{name}: im2col + GEMM"), &y, &want, Some(1e-5));
        // conv2d_bias_act = the same, then the epilogue in place on y.
        let b = rng.vec(co, -1.0, 1.0);
        let (gy, gb) = (g.up(&y), g.up(&b));
        let act = towers_kernels::UnaryOp::Relu;
        g.ew(
            "elementwise",
            "towers_bias_act_in_place_f32",
            p.y_len(),
            &[A::I32(1), n(p.y_len()), n(co), gb.a(), gy.a()],
        );
        let mut want = vec![0f32; p.y_len()];
        conv::conv2d_bias_act(&p, &x, &f, &b, act, &mut want, &mut ws);
        r.f32(
            "conv2d_bias_act",
            format!("{name}: im2col + GEMM + epilogue"),
            &g.down(&gy, p.y_len()),
            &want,
            Some(1e-5),
        );
        // The same epilogue without an activation (op -1), as gemm_bias_act's.
        let gz = g.up(&y);
        g.ew(
            "elementwise",
            "towers_bias_act_in_place_f32",
            p.y_len(),
            &[A::I32(-1), n(p.y_len()), n(co), gb.a(), gz.a()],
        );
        let mut want = y.clone();
        towers_kernels::elementwise::bias_then_act_in_place(&mut want, &b, None);
        r.f32("gemm_bias_act", format!("{name}: the bias epilogue alone"), &g.down(&gz, p.y_len()), &want, Some(1e-6));
        // conv2d_backprop_filter = im2col, then col^T dy.
        let mut dw = vec![0f32; p.filter_len()];
        cpu::matmul(k, rows, co, true, false, &cols, &dy, &mut dw);
        let mut want = vec![0f32; p.filter_len()];
        conv::conv2d_backprop_filter(&p, &x, &dy, &mut want, &mut ws);
        // Both sums run over every output pixel of the batch (200K terms for
        // the convnet's first layer) in different orders (the CPU's blocked
        // kernel): 1e-4, as the other long sums.
        r.f32("conv2d_backprop_filter", format!("{name}: im2col + GEMM"), &dw, &want, Some(1e-4));
        // conv2d_backprop_input = dy W^T (host GEMM), then col2im in two chunks.
        let mut dcol = vec![0f32; rows * k];
        cpu::matmul(rows, co, k, false, true, &dy, &f, &mut dcol);
        let (d1, d2) = (g.up(&dcol[..split * k]), g.up(&dcol[split * k..]));
        let dxo = g.up(&vec![f32::NAN; p.x_len()]);
        g.ew("conv", "towers_col2im_f32", p.x_len(), &[ga(), n(0), n(split), A::I32(0), d1.a(), dxo.a()]);
        g.ew("conv", "towers_col2im_f32", p.x_len(), &[ga(), n(split), n(rows - split), A::I32(1), d2.a(), dxo.a()]);
        let mut want = vec![0f32; p.x_len()];
        conv::conv2d_backprop_input(&p, &dy, &f, &mut want, &mut ws);
        r.f32("conv2d_backprop_input", format!("{name}: GEMM + col2im"), &g.down(&dxo, p.x_len()), &want, Some(1e-5));
    }
}

pub(crate) fn layout(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    use cpu::layout;
    // concat along axis 1 of rank-3 tensors, then split it back.
    let shapes: Vec<Vec<usize>> = vec![vec![4, 3, 5], vec![4, 1, 5], vec![4, 6, 5]];
    let axis = 1;
    let xs: Vec<Vec<f32>> = shapes.iter().map(|s| rng.vec(numel(s), -1.0, 1.0)).collect();
    let (outer, inner) = (4usize, 5usize);
    let total: usize = shapes.iter().map(|s| s[axis] * inner).sum();
    let out = g.up(&vec![0f32; outer * total]);
    let mut off = 0;
    for (x, s) in xs.iter().zip(&shapes) {
        let run = s[axis] * inner;
        let dx = g.up(x);
        g.ew("layout", "towers_concat_part_f32", outer * run, &[n(outer), n(run), n(total), n(off), dx.a(), out.a()]);
        off += run;
    }
    let mut want = vec![0f32; outer * total];
    let refs: Vec<&[f32]> = xs.iter().map(|v| v.as_slice()).collect();
    let srefs: Vec<&[usize]> = shapes.iter().map(|v| v.as_slice()).collect();
    layout::concat(&refs, &srefs, axis, &mut want).unwrap();
    r.f32("concat", "3 inputs, axis 1", &g.down(&out, outer * total), &want, None);
    let sizes = [3usize, 1, 6];
    let full = [4usize, 10, 5];
    let mut wants: Vec<Vec<f32>> = sizes.iter().map(|s| vec![0f32; outer * s * inner]).collect();
    {
        let mut outs: Vec<&mut [f32]> = wants.iter_mut().map(|v| v.as_mut_slice()).collect();
        layout::split(&want, &full, axis, &sizes, &mut outs).unwrap();
    }
    let mut off = 0;
    for (s, w) in sizes.iter().zip(&wants) {
        let run = s * inner;
        let dy = g.up(&vec![0f32; outer * run]);
        g.ew("layout", "towers_split_part_f32", outer * run, &[n(outer), n(run), n(total), n(off), out.a(), dy.a()]);
        r.f32("split", format!("size {s} of {full:?}, axis 1"), &g.down(&dy, outer * run), w, None);
        off += run;
    }
    // slice and slice_grad.
    for (shape, begin, size) in [
        (&[6usize, 7, 8][..], &[1usize, 2, 0][..], &[3usize, 4, 8][..]),
        (&[2, 3, 4, 5], &[1, 0, 1, 2], &[1, 3, 2, 3]),
        (&[9], &[4], &[5]),
    ] {
        let x = rng.vec(numel(shape), -1.0, 1.0);
        let (dx, out) = (g.up(&x), g.up(&vec![0f32; numel(size)]));
        let args = |a: A, b: A| vec![a, b, d4(shape, 1), d4(begin, 0), d4(size, 1)];
        let mut a = vec![n(numel(size))];
        a.extend(args(dx.a(), out.a()));
        g.ew("layout", "towers_slice_f32", numel(size), &a);
        let mut want = vec![0f32; numel(size)];
        layout::slice(&x, shape, begin, size, &mut want).unwrap();
        r.f32("slice", format!("{shape:?} at {begin:?} size {size:?}"), &g.down(&out, numel(size)), &want, None);
        let gy = rng.vec(numel(size), -1.0, 1.0);
        let (dgy, dgx) = (g.up(&gy), g.up(&vec![f32::NAN; numel(shape)]));
        let mut a = vec![n(numel(shape))];
        a.extend(args(dgy.a(), dgx.a()));
        g.ew("layout", "towers_slice_grad_f32", numel(shape), &a);
        let mut want = vec![0f32; numel(shape)];
        layout::slice_grad(&gy, shape, begin, size, &mut want).unwrap();
        r.f32("slice_grad", format!("{shape:?} at {begin:?} size {size:?}"), &g.down(&dgx, numel(shape)), &want, None);
    }
}
