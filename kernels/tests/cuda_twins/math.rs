//! Elementwise kernels, sums over axes, argmax, comparisons, casts and the
//! softmax family.

use towers_kernels::dtype::{Slice, SliceMut};
use towers_kernels::{DType, Kernel};

use crate::cpu;
use crate::harness::{numel, Dev, Gpu, Report, Rng};

/// The reductions' (shape, axes) cases: sums, means, maxima and minima.
const REDUCE_CASES: &[(&[usize], &[usize])] =
    &[(&[4, 5, 6, 7], &[1, 3]), (&[4, 5, 6, 7], &[0]), (&[256, 100], &[1]), (&[1000, 3], &[0]), (&[10, 20], &[0, 1])];

pub(crate) fn elementwise(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    let cases: &[(&[usize], &[usize])] =
        &[(&[3, 4], &[3, 4]), (&[2, 3, 4, 5], &[3, 1, 5]), (&[64, 10], &[10]), (&[], &[7, 5]), (&[5, 1], &[1, 6])];
    for &(sa, sb) in cases {
        let (od, _) = towers_kernels::shape::broadcast_shapes("t", sa, sb).unwrap();
        let rank = sa.len().max(sb.len());
        let out_shape: Vec<usize> = od[4 - rank..].to_vec();
        let a = rng.vec(numel(sa), -2.0, 2.0);
        let b: Vec<f32> = rng.vec(numel(sb), 0.5, 2.0);
        let (da, db) = (g.up(&a), g.up(&b));
        let len = numel(&out_shape);
        let dout = g.up(&vec![0f32; len]);
        for bop in towers_kernels::BinaryOp::ALL.iter().copied() {
            let op = bop.code();
            let k =
                Kernel::Binary { op: bop, a_shape: sa.to_vec(), b_shape: sb.to_vec(), out_shape: out_shape.clone() };
            g.run(&k, &[da.of(numel(sa)), db.of(numel(sb))], &[dout.of(len)], None);
            let mut want = vec![0f32; len];
            cpu::binary(op, &a, sa, &b, sb, &mut want);
            // powf and logf (pow, pow_grad_y) differ from Rust's libm by rounding.
            let transcendental =
                [towers_kernels::BinaryOp::Pow, towers_kernels::BinaryOp::PowGradY].iter().any(|b| b.code() == op);
            let tol = if transcendental { Some(2e-6) } else { None };
            r.f32("binary", format!("op {op} {sa:?} {sb:?}"), &g.down(&dout, len), &want, tol);
        }
    }
    // broadcast_to and its adjoint sum_to_shape.
    for (small, big) in [(&[3usize, 1, 5][..], &[2usize, 3, 4, 5][..]), (&[4], &[6, 4]), (&[6, 1], &[6, 300])] {
        let x = rng.vec(numel(small), -1.0, 1.0);
        let dx = g.up(&x);
        let dout = g.up(&vec![0f32; numel(big)]);
        let k = Kernel::BroadcastTo { x_shape: small.to_vec(), out_shape: big.to_vec() };
        g.run(&k, &[dx.of(numel(small))], &[dout.of(numel(big))], None);
        let mut want = vec![0f32; numel(big)];
        cpu::broadcast_to(&x, small, &mut want, big);
        r.f32("broadcast_to", format!("{small:?} -> {big:?}"), &g.down(&dout, numel(big)), &want, None);

        let y = rng.vec(numel(big), -1.0, 1.0);
        let dy = g.up(&y);
        let ds = g.up(&vec![0f32; numel(small)]);
        let k = Kernel::SumTo { x_shape: big.to_vec(), out_shape: small.to_vec() };
        g.run(&k, &[dy.of(numel(big))], &[ds.of(numel(small))], None);
        let mut want = vec![0f32; numel(small)];
        cpu::sum_to(&y, big, &mut want, small);
        r.f32("sum_to_shape", format!("{big:?} -> {small:?}"), &g.down(&ds, numel(small)), &want, Some(1e-4));
    }
    // bias_add and its gradient.
    for (rows, c) in [(7usize, 5usize), (512, 64), (3000, 10)] {
        let x = rng.vec(rows * c, -1.0, 1.0);
        let b = rng.vec(c, -1.0, 1.0);
        let (dx, db, dy) = (g.up(&x), g.up(&b), g.up(&vec![0f32; rows * c]));
        g.run(&Kernel::BiasAdd { channels: c }, &[dx.of(rows * c), db.of(c)], &[dy.of(rows * c)], None);
        let mut want = vec![0f32; rows * c];
        cpu::bias_add(&x, &b, &mut want);
        r.f32("bias_add", format!("[{rows}, {c}]"), &g.down(&dy, rows * c), &want, None);
        // The fused activation gradient + bias gradient (dy in [-1, 1], y = x + b as the forward output).
        for act in towers_kernels::UnaryOp::ALL.iter() {
            if ["log", "sqrt", "rsqrt", "reciprocal"].contains(&act.name()) {
                continue;
            }
            let yv: Vec<f32> = x.iter().zip(b.iter().cycle()).map(|(v, bb)| v + bb).collect();
            let (gy, gdx, gdb) = (g.up(&yv), g.up(&vec![0f32; rows * c]), g.up(&vec![0f32; c]));
            // Through the backend's lowering: one block per channel, or the
            // two-stage kernels for tall tensors (3000 rows).
            let k = Kernel::UnaryGradBiasGrad { channels: c, act: *act };
            g.run(&k, &[dx.of(rows * c), gy.of(rows * c)], &[gdx.of(rows * c), gdb.of(c)], None);
            let (mut want_dx, mut want_db) = (vec![0f32; rows * c], vec![0f32; c]);
            towers_kernels::elementwise::unary_grad_bias_grad(*act, &x, &yv, &mut want_dx, &mut want_db);
            // softplus' and log1p's gradients take exp(-y): CUDA's expf and
            // Rust's libm round differently (as `unary_grad` allows); the rest are exact.
            let tol = if ["softplus", "log1p"].contains(&act.name()) { Some(2e-6) } else { None };
            r.f32(
                "unary_grad_bias_grad dx",
                format!("[{rows}, {c}] {}", act.name()),
                &g.down(&gdx, rows * c),
                &want_dx,
                tol,
            );
            r.f32(
                "unary_grad_bias_grad db",
                format!("[{rows}, {c}] {}", act.name()),
                &g.down(&gdb, c),
                &want_db,
                Some(1e-4),
            );
        }
        // The fused bias add + activation, for the ops defined on every real
        // (log, sqrt, rsqrt and reciprocal of x + b in [-2, 2] are checked by `unary`).
        for act in towers_kernels::UnaryOp::ALL.iter() {
            if ["log", "sqrt", "rsqrt", "reciprocal"].contains(&act.name()) {
                continue;
            }
            let out = g.up(&vec![0f32; rows * c]);
            let k = Kernel::BiasAddAct { channels: c, act: *act };
            g.run(&k, &[dx.of(rows * c), db.of(c)], &[out.of(rows * c)], None);
            let mut want = vec![0f32; rows * c];
            towers_kernels::elementwise::bias_add_act(&x, &b, *act, &mut want);
            r.f32("bias_add_act", format!("[{rows}, {c}] {}", act.name()), &g.down(&out, rows * c), &want, Some(1e-6));
        }
        let dgb = g.up(&vec![0f32; c]);
        g.run(&Kernel::BiasAddGrad { channels: c }, &[dx.of(rows * c)], &[dgb.of(c)], None);
        let mut want = vec![0f32; c];
        cpu::bias_add_grad(&x, &mut want);
        r.f32("bias_add_grad", format!("[{rows}, {c}]"), &g.down(&dgb, c), &want, Some(1e-4));
    }
    // unary and unary_grad.
    let len = 10_007;
    let mut x = rng.vec(len, -6.0, 6.0);
    x[0] = 0.0;
    x[1] = -0.0;
    x[2] = -100.0;
    x[3] = 100.0;
    let gy = rng.vec(len, -1.0, 1.0);
    let (dxx, dgy, dy, ddx) = (g.up(&x), g.up(&gy), g.up(&vec![0f32; len]), g.up(&vec![0f32; len]));
    // Exp, Log, Sqrt, Rsqrt, Reciprocal, Log1p on positive inputs in [1e-3, 6].
    let xp: Vec<f32> = x.iter().map(|v| v.abs().max(1e-3)).collect();
    let dxp = g.up(&xp);
    // Every op of the table, by its code (the CUDA switch's case number).
    use towers_kernels::UnaryOp as U;
    for &uop in U::ALL {
        let (op, name) = (uop.code(), uop.tf_name());
        let positive = matches!(uop, U::Exp | U::Log | U::Sqrt | U::Rsqrt | U::Reciprocal | U::Log1p);
        let (xin, dxin) = if positive { (&xp, &dxp) } else { (&x, &dxx) };
        g.run(&Kernel::Unary { op: uop }, &[dxin.of(len)], &[dy.of(len)], None);
        let mut y = vec![0f32; len];
        cpu::unary(op, xin, &mut y);
        // Transcendentals differ from Rust's libm by rounding; sqrt and division are exact.
        let tol = if matches!(uop, U::Sigmoid | U::Tanh | U::Exp | U::Log | U::Elu | U::Softplus | U::Log1p | U::Expm1)
        {
            Some(2e-6)
        } else {
            None
        };
        r.f32("unary", name, &g.down(&dy, len), &y, tol);
        // The gradient from the CPU's forward output, so both sides see the same y.
        let dyy = g.up(&y);
        g.run(&Kernel::UnaryGrad { op: uop }, &[dgy.of(len), dyy.of(len)], &[ddx.of(len)], None);
        let mut want = vec![0f32; len];
        cpu::unary_grad(op, &gy, &y, &mut want);
        let tol = if matches!(uop, U::Log | U::Softplus | U::Log1p) { Some(2e-6) } else { None };
        r.f32("unary_grad", name, &g.down(&ddx, len), &want, tol);
    }
    // add_n, weighted_sum, fill.
    let len = 70_001;
    let xs: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(len, -1.0, 1.0)).collect();
    let devs: Vec<Dev<f32>> = xs.iter().map(|x| g.up(x)).collect();
    let out = g.up(&vec![0f32; len]);
    let cx: Vec<&[f32]> = xs.iter().map(|v| v.as_slice()).collect();
    let ins: Vec<(u64, usize)> = devs.iter().map(|d| d.of(len)).collect();
    g.run(&Kernel::AddN { n: 4 }, &ins, &[out.of(len)], None);
    let mut want = vec![0f32; len];
    cpu::misc::add_n(&cx, &mut want);
    r.f32("add_n", "4 x 70001", &g.down(&out, len), &want, None);
    let w = [0.5f32, 0.25, 0.125, 0.125];
    g.run(&Kernel::WeightedSum { weights: w.to_vec() }, &ins, &[out.of(len)], None);
    cpu::misc::weighted_sum(&cx, &w, &mut want);
    r.f32("weighted_sum", "4 towers x 70001", &g.down(&out, len), &want, None);
    let w3 = [0.3f32, 0.45, 0.25];
    g.run(&Kernel::WeightedSum { weights: w3.to_vec() }, &ins[..3], &[out.of(len)], None);
    cpu::misc::weighted_sum(&cx[..3], &w3, &mut want);
    r.f32("weighted_sum", "3 uneven towers", &g.down(&out, len), &want, None);
    g.run(&Kernel::Fill { value: 0.75 }, &[], &[out.of(len)], None);
    r.f32("fill", "0.75", &g.down(&out, len), &vec![0.75; len], None);
}

pub(crate) fn reductions(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    // The activation gradient with its per-channel sum, as lowering launches
    // it (towers_kernels::launch, bias_grad): two stages for tall tensors (a
    // convolution's rows; a wide dense layer), one block per channel
    // otherwise; dx may be dy (in place: output 0 is input 0's buffer).
    let relu = towers_kernels::UnaryOp::Relu;
    for (rows, c, in_place) in
        [(256 * 28 * 28, 12usize, true), (256 * 14 * 14, 24, false), (5000, 1000, false), (256, 256, true)]
    {
        let len = rows * c;
        let dy = rng.vec(len, -1.0, 1.0);
        let y = rng.vec(len, -0.5, 1.0);
        let (gdy, gy, gdb) = (g.up(&dy), g.up(&y), g.up(&vec![f32::NAN; c]));
        let gdx = if in_place { g.up(&dy) } else { g.up(&vec![f32::NAN; len]) };
        let src = if in_place { gdx.of(len) } else { gdy.of(len) };
        let k = Kernel::UnaryGradBiasGrad { channels: c, act: relu };
        g.run(&k, &[src, gy.of(len)], &[gdx.of(len), gdb.of(c)], None);
        let (mut dx, mut db) = (vec![0f32; len], vec![0f32; c]);
        towers_kernels::elementwise::unary_grad_bias_grad(relu, &dy, &y, &mut dx, &mut db);
        let case = format!("[{rows}, {c}]{}", if in_place { " in place" } else { "" });
        r.f32("unary_grad_bias_grad", format!("{case}: dx"), &g.down(&gdx, len), &dx, None);
        r.f32("unary_grad_bias_grad", format!("{case}: db"), &g.down(&gdb, c), &db, Some(1e-4));
    }
    for &(shape, axes) in REDUCE_CASES {
        let x = rng.vec(numel(shape), -1.0, 1.0);
        let dx = g.up(&x);
        let kept: usize = (0..shape.len()).filter(|a| !axes.contains(a)).map(|a| shape[a]).product();
        let out = g.up(&vec![0f32; kept]);
        let (shape_v, axes_v) = (shape.to_vec(), axes.to_vec());
        for k in [
            Kernel::ReduceSum { shape: shape_v.clone(), axes: axes_v.clone() },
            Kernel::ReduceMean { shape: shape_v, axes: axes_v },
        ] {
            g.run(&k, &[dx.of(x.len())], &[out.of(kept)], None);
            let mut want = vec![0f32; kept];
            if matches!(k, Kernel::ReduceSum { .. }) {
                cpu::reduce::reduce_sum(&x, shape, axes, &mut want).unwrap();
            } else {
                cpu::reduce::reduce_mean(&x, shape, axes, &mut want).unwrap();
            }
            let first = g.down(&out, kept);
            r.f32(k.name(), format!("{shape:?} axes {axes:?}"), &first, &want, Some(1e-4));
            // Deterministic: a second launch gives the same bits.
            g.run(&k, &[dx.of(x.len())], &[out.of(kept)], None);
            r.f32(k.name(), format!("{shape:?} axes {axes:?}: run 2 = run 1"), &g.down(&out, kept), &first, None);
        }
    }
    // reduce_max / reduce_min: exact (a max is one of its inputs), NaN and
    // signed zeros included.
    for &(shape, axes) in REDUCE_CASES {
        let mut x = rng.coarse(numel(shape));
        if x.len() > 40 {
            x[3] = f32::NAN;
            x[17] = -0.0;
            x[18] = 0.0;
        }
        let dx = g.up(&x);
        let kept: usize = (0..shape.len()).filter(|a| !axes.contains(a)).map(|a| shape[a]).product();
        let out = g.up(&vec![0f32; kept]);
        for min in [false, true] {
            let (shape_v, axes_v) = (shape.to_vec(), axes.to_vec());
            let k = if min {
                Kernel::ReduceMin { shape: shape_v, axes: axes_v }
            } else {
                Kernel::ReduceMax { shape: shape_v, axes: axes_v }
            };
            g.run(&k, &[dx.of(x.len())], &[out.of(kept)], None);
            let mut want = vec![0f32; kept];
            cpu::reduce::reduce_extreme(&x, shape, axes, min, &mut want).unwrap();
            r.f32(k.name(), format!("{shape:?} axes {axes:?}"), &g.down(&out, kept), &want, None);
        }
    }
    // l2_loss
    for len in [1usize, 1000, 300_001] {
        let x = rng.vec(len, -1.0, 1.0);
        let (dx, out) = (g.up(&x), g.up(&[0f32]));
        g.run(&Kernel::L2Loss, &[dx.of(len)], &[out.of(1)], None);
        let first = g.down(&out, 1);
        r.f32("l2_loss", format!("{len}"), &first, &[cpu::misc::l2_loss(&x)], Some(1e-6));
        g.run(&Kernel::L2Loss, &[dx.of(len)], &[out.of(1)], None);
        r.f32("l2_loss", format!("{len}: run 2 = run 1"), &g.down(&out, 1), &first, None);
    }
    // argmax (ties: first)
    for (shape, axis) in [(&[3usize, 7, 5][..], 1usize), (&[64, 10], 1), (&[9, 4], 0)] {
        let x = rng.coarse(numel(shape));
        let m = numel(shape) / shape[axis];
        let (dx, out) = (g.up(&x), g.up(&vec![0i32; m]));
        g.run(&Kernel::ArgMax { shape: shape.to_vec(), axis }, &[dx.of(x.len())], &[out.of(m)], None);
        let mut want = vec![0i32; m];
        cpu::reduce::argmax(&x, shape, axis, &mut want).unwrap();
        r.i32("argmax", format!("{shape:?} axis {axis}"), &g.down(&out, m), &want);
    }
    // equal (exec.rs writes i32 0/1) and casts.
    let len = 5000;
    let a = rng.coarse(len);
    let b = rng.coarse(len);
    let (da, db, out) = (g.up(&a), g.up(&b), g.up(&vec![0i32; len]));
    g.run(&Kernel::Equal { dtype: DType::F32 }, &[da.of(len), db.of(len)], &[out.of(len)], None);
    let want: Vec<i32> = a.iter().zip(&b).map(|(x, y)| (x == y) as i32).collect();
    r.i32("equal", "f32", &g.down(&out, len), &want);
    let ai = rng.ints(len, 5);
    let bi = rng.ints(len, 5);
    let (dai, dbi) = (g.up(&ai), g.up(&bi));
    g.run(&Kernel::Equal { dtype: DType::I32 }, &[dai.of(len), dbi.of(len)], &[out.of(len)], None);
    let want: Vec<i32> = ai.iter().zip(&bi).map(|(x, y)| (x == y) as i32).collect();
    r.i32("equal", "i32", &g.down(&out, len), &want);
    // compare: every comparison on f32 (coarse values tie often; a NaN
    // compares false except !=) and on i32, against the CPU twin.
    let mut an = a.clone();
    an[..3].copy_from_slice(&[f32::NAN, -0.0, 0.0]);
    let mut bn = b.clone();
    bn[..3].copy_from_slice(&[1.0, 0.0, f32::NAN]);
    let (dan, dbn) = (g.up(&an), g.up(&bn));
    for &cmp in towers_kernels::Comparison::ALL {
        g.run(&Kernel::Compare { cmp, dtype: DType::F32 }, &[dan.of(len), dbn.of(len)], &[out.of(len)], None);
        let mut want = vec![0i32; len];
        cpu::reduce::compare(cmp, Slice::F32(&an), Slice::F32(&bn), &mut want);
        r.i32("compare", format!("{} f32", cmp.name()), &g.down(&out, len), &want);
        g.run(&Kernel::Compare { cmp, dtype: DType::I32 }, &[dai.of(len), dbi.of(len)], &[out.of(len)], None);
        cpu::reduce::compare(cmp, Slice::I32(&ai), Slice::I32(&bi), &mut want);
        r.i32("compare", format!("{} i32", cmp.name()), &g.down(&out, len), &want);
    }
    // select: elementwise and by rows of 10, NaN in the unselected operand.
    let mut y = rng.vec(len, -1.0, 1.0);
    y[0] = f32::NAN;
    let (dx, dy, sel) = (g.up(&a), g.up(&y), g.up(&vec![0f32; len]));
    for inner in [1usize, 10] {
        let cond: Vec<i32> = (0..len / inner).map(|i| (i % 3 != 0) as i32).collect();
        let dc = g.up(&cond);
        g.run(&Kernel::Select { inner }, &[dx.of(len), dy.of(len), dc.of(cond.len())], &[sel.of(len)], None);
        let mut want = vec![0f32; len];
        cpu::reduce::select(&cond, &a, &y, inner, &mut want);
        r.f32("select", format!("inner {inner}"), &g.down(&sel, len), &want, None);
    }
    let mut xf = rng.vec(len, -1e3, 1e3);
    xf[..6].copy_from_slice(&[f32::NAN, 3e9, -3e9, -0.0, 0.999, -2.5]);
    let xi: Vec<i32> = rng.ints(len, 2001).iter().map(|v| v - 1000).chain([i32::MAX, i32::MIN]).collect();
    let (dxf, dxi) = (g.up(&xf), g.up(&xi));
    let (oi, of) = (g.up(&vec![0i32; xi.len()]), g.up(&vec![0f32; xi.len()]));
    let cast = |from, to, x: (u64, usize), y: (u64, usize)| g.run(&Kernel::Cast { from, to }, &[x], &[y], None);
    cast(DType::F32, DType::I32, dxf.of(len), oi.of(len));
    let mut want = vec![0i32; len];
    cpu::reduce::cast(Slice::F32(&xf), DType::I32, SliceMut::I32(&mut want));
    r.i32("cast", "f32 -> i32", &g.down(&oi, len), &want);
    cast(DType::I32, DType::F32, dxi.of(xi.len()), of.of(xi.len()));
    let mut want = vec![0f32; xi.len()];
    cpu::reduce::cast(Slice::I32(&xi), DType::F32, SliceMut::F32(&mut want));
    r.f32("cast", "i32 -> f32", &g.down(&of, xi.len()), &want, None);
    cast(DType::F32, DType::Bool, dxf.of(len), oi.of(len));
    let want: Vec<i32> = xf.iter().map(|v| (*v != 0.0) as i32).collect();
    r.i32("cast", "f32 -> bool", &g.down(&oi, len), &want);
    cast(DType::I32, DType::Bool, dxi.of(xi.len()), oi.of(xi.len()));
    let want: Vec<i32> = xi.iter().map(|v| (*v != 0) as i32).collect();
    r.i32("cast", "i32 -> bool", &g.down(&oi, xi.len()), &want);
    cast(DType::F32, DType::F32, dxf.of(len), of.of(len));
    r.f32("cast", "f32 -> f32 (copy)", &g.down(&of, len), &xf, None);
}

pub(crate) fn softmax(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    for (rows, c) in [(37usize, 10usize), (16, 1000), (5, 1)] {
        let len = rows * c;
        let mut x = rng.vec(len, -5.0, 5.0);
        x[0] = 40.0;
        let gy = rng.vec(len, -1.0, 1.0);
        let (dx, dgy) = (g.up(&x), g.up(&gy));
        let (dy, dd) = (g.up(&vec![0f32; len]), g.up(&vec![0f32; len]));
        let case = format!("[{rows}, {c}]");
        for log in [false, true] {
            let (fwd, grad) = if log {
                (Kernel::LogSoftmax { classes: c }, Kernel::LogSoftmaxGrad { classes: c })
            } else {
                (Kernel::Softmax { classes: c }, Kernel::SoftmaxGrad { classes: c })
            };
            g.run(&fwd, &[dx.of(len)], &[dy.of(len)], None);
            let mut y = vec![0f32; len];
            let mut dxw = vec![0f32; len];
            if log {
                cpu::softmax::log_softmax(&x, c, &mut y);
            } else {
                cpu::softmax::softmax(&x, c, &mut y);
            }
            r.f32(fwd.name(), case.clone(), &g.down(&dy, len), &y, Some(1e-5));
            let dyy = g.up(&y);
            g.run(&grad, &[dgy.of(len), dyy.of(len)], &[dd.of(len)], None);
            if log {
                cpu::softmax::log_softmax_grad(&gy, &y, c, &mut dxw);
            } else {
                cpu::softmax::softmax_grad(&gy, &y, c, &mut dxw);
            }
            r.f32(grad.name(), case.clone(), &g.down(&dd, len), &dxw, Some(1e-5));
        }
        // Cross-entropies.
        let labels = rng.ints(rows, c as u64);
        let dl = g.up(&labels);
        let (loss, bp) = (g.up(&vec![0f32; rows]), g.up(&vec![0f32; len]));
        let k = Kernel::SparseSoftmaxXent { classes: c };
        g.run(&k, &[dx.of(len), dl.of(rows)], &[loss.of(rows), bp.of(len)], None);
        let (mut wl, mut wb) = (vec![0f32; rows], vec![0f32; len]);
        cpu::softmax::sparse_softmax_cross_entropy(&x, &labels, c, &mut wl, &mut wb).unwrap();
        r.f32("sparse_softmax_xent", format!("{case} loss"), &g.down(&loss, rows), &wl, Some(1e-5));
        r.f32("sparse_softmax_xent", format!("{case} backprop"), &g.down(&bp, len), &wb, Some(1e-5));
        // Fused with its loss's mean, the gradient's scale and the bias
        // gradient: the scaled xent, then two reductions, as lowering runs it.
        let scale = 1.0 / rows as f32;
        let (gs, gmean, gdb) = (g.up(&[scale]), g.up(&[0f32]), g.up(&vec![0f32; c]));
        let k = Kernel::SparseSoftmaxXentMeanGrad { classes: c };
        g.run(&k, &[dx.of(len), dl.of(rows), gs.of(1)], &[loss.of(rows), gmean.of(1), bp.of(len), gdb.of(c)], None);
        let (mut fl, mut fm, mut fd, mut fb) = (vec![0f32; rows], vec![0f32; 1], vec![0f32; len], vec![0f32; c]);
        cpu::softmax::sparse_softmax_xent_mean_grad(&x, &labels, c, scale, &mut fl, &mut fm, &mut fd, &mut fb).unwrap();
        let fused = "sparse_softmax_xent_mean_grad";
        r.f32(fused, format!("{case} mean"), &g.down(&gmean, 1), &fm, Some(1e-5));
        r.f32(fused, format!("{case} dlogits"), &g.down(&bp, len), &fd, Some(1e-5));
        r.f32(fused, format!("{case} db"), &g.down(&gdb, c), &fb, Some(1e-5));
        let mut soft = rng.vec(len, 0.0, 1.0);
        for row in soft.chunks_mut(c) {
            let s: f32 = row.iter().sum();
            row.iter_mut().for_each(|v| *v /= s);
        }
        let ds = g.up(&soft);
        g.run(&Kernel::SoftmaxXent { classes: c }, &[dx.of(len), ds.of(len)], &[loss.of(rows), bp.of(len)], None);
        cpu::softmax::softmax_cross_entropy(&x, &soft, c, &mut wl, &mut wb);
        r.f32("softmax_xent", format!("{case} loss"), &g.down(&loss, rows), &wl, Some(1e-5));
        r.f32("softmax_xent", format!("{case} backprop"), &g.down(&bp, len), &wb, Some(1e-5));
    }
}

/// Kernels generated from fused expressions (`cuda::fused_source`), with
/// full, broadcast and scalar inputs: arithmetic only is bit for bit (every
/// step rounded on its own, as the CPU), with transcendental functions
/// within their rounding.
pub(crate) fn fused(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    use towers_kernels::elementwise::{fused, FusedExpr};
    let out_shape = vec![7usize, 33, 65];
    type Case = (&'static str, Vec<Vec<usize>>, Option<f64>);
    let cases: [Case; 3] = [
        (
            "ew[$0;$1;add:0:1;$2;mul:2:3;c3f000000;sub:4:5;relu:6]",
            vec![out_shape.clone(), vec![65], vec![7, 1, 1]],
            None,
        ),
        ("ew[$0;$1;mul:0:1;$2;mul:0:3;sigmoid_grad:4:1;add:2:5]", vec![out_shape.clone(); 3], Some(2e-6)),
        ("ew[$0;$1;div:0:1;tanh:2;tanh_grad:0:3]", vec![out_shape.clone(), vec![]], Some(2e-6)),
    ];
    for (text, shapes, tol) in cases {
        let e: FusedExpr = text.parse().unwrap();
        let xs: Vec<Vec<f32>> = shapes.iter().map(|s| rng.vec(numel(s), 0.5, 2.0)).collect();
        let ds: Vec<_> = xs.iter().map(|x| g.up(x)).collect();
        let len = numel(&out_shape);
        let dout = g.up(&vec![0f32; len]);
        let ins: Vec<(u64, usize)> = ds.iter().zip(&xs).map(|(d, x)| d.of(x.len())).collect();
        let k = Kernel::Fused { expr: e.clone(), in_shapes: shapes.clone(), out_shape: out_shape.clone() };
        g.run(&k, &ins, &[dout.of(len)], None);
        let mut want = vec![0f32; len];
        let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
        fused(&e, &refs, &shapes, &out_shape, &mut want).unwrap();
        r.f32("fused_elementwise", e.tree(), &g.down(&dout, len), &want, tol);
    }
}
