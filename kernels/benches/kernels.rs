//! Microbenchmarks of the hot CPU kernels: the MLP's GEMMs (784-256-256-10
//! at batch 256, each transpose) and the convnet's kernels at the seed
//! model's geometry (batch 256, 28x28x1 -> conv 5x5x12 VALID -> pool 2x2 ->
//! conv 3x3x24 VALID -> pool 2x2), one thread. Not a test: prints the best of 5
//! runs of ~0.1 s each, in microseconds per call:
//! `cargo bench -p towers-kernels --bench kernels [-- FILTER]`.
//! Repeat runs and compare ratios from the same run: the host is shared.
//! Prints the SIMD path first (`TOWERS_SIMD=avx2` etc. to force one).

use std::hint::black_box;
use std::time::Instant;

use towers_kernels::conv::{conv2d, conv2d_backprop_filter, conv2d_backprop_input, ConvGeom};
use towers_kernels::elementwise::{bias_add, bias_add_grad, unary, unary_grad, UnaryOp};
use towers_kernels::gemm::{matmul, MatMul};
use towers_kernels::kernel::Kernel;
use towers_kernels::optim::{apply_adam, apply_gradient_descent, apply_momentum, mean_apply};
use towers_kernels::pool::{max_pool, max_pool_grad, PoolGeom};
use towers_kernels::window::Padding;

fn time<F: FnMut()>(mut f: F) -> f64 {
    f();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let mut reps = 0;
        while t.elapsed().as_secs_f64() < 0.1 {
            f();
            reps += 1;
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    best * 1e6
}

/// Deterministic data in [-1, 1).
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

fn report(filter: &Option<String>, name: &str, us: impl FnOnce() -> f64, flops: f64) {
    if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
        return;
    }
    let us = us();
    if flops > 0.0 {
        println!("{name:<44} {us:>9.1} us  {:>6.1} GFLOP/s", flops / us / 1e3);
    } else {
        println!("{name:<44} {us:>9.1} us");
    }
}

fn conv(filter: &Option<String>, label: &str, p: ConvGeom) {
    let x = data(p.x_len(), 1);
    let f = data(p.filter_len(), 2);
    let dy = data(p.y_len(), 3);
    let mut y = vec![0.0f32; p.y_len()];
    let mut dx = vec![0.0f32; p.x_len()];
    let mut df = vec![0.0f32; p.filter_len()];
    let mut ws = vec![0.0f32; p.workspace_len()];
    let flops = 2.0 * (p.rows() * p.k() * p.c_out) as f64;
    report(filter, &format!("{label} conv2d"), || time(|| conv2d(&p, &x, &f, black_box(&mut y), &mut ws)), flops);
    report(
        filter,
        &format!("{label} conv2d_backprop_input"),
        || time(|| conv2d_backprop_input(&p, &dy, &f, black_box(&mut dx), &mut ws)),
        flops,
    );
    report(
        filter,
        &format!("{label} conv2d_backprop_filter"),
        || time(|| conv2d_backprop_filter(&p, &x, &dy, black_box(&mut df), &mut ws)),
        flops,
    );
}

fn pool(filter: &Option<String>, label: &str, p: PoolGeom) {
    let x = data(p.x_len(), 4);
    let mut y = vec![0.0f32; p.y_len()];
    max_pool(&p, &x, &mut y);
    let dy = data(p.y_len(), 5);
    let mut dx = vec![0.0f32; p.x_len()];
    let mut y2 = vec![0.0f32; p.y_len()];
    report(filter, &format!("{label} max_pool"), || time(|| max_pool(&p, &x, black_box(&mut y2))), 0.0);
    report(
        filter,
        &format!("{label} max_pool_grad"),
        || time(|| max_pool_grad(&p, &x, &y, &dy, black_box(&mut dx))),
        0.0,
    );
}

fn elementwise(filter: &Option<String>, label: &str, len: usize, c: usize) {
    let x = data(len, 6);
    let dy = data(len, 7);
    let b = data(c, 8);
    let mut y = vec![0.0f32; len];
    let mut db = vec![0.0f32; c];
    report(filter, &format!("{label} bias_add"), || time(|| bias_add(&x, &b, black_box(&mut y))), 0.0);
    report(filter, &format!("{label} bias_add_grad"), || time(|| bias_add_grad(&dy, black_box(&mut db))), 0.0);
    report(filter, &format!("{label} relu"), || time(|| unary(UnaryOp::Relu, &x, black_box(&mut y))), 0.0);
    report(
        filter,
        &format!("{label} relu_grad"),
        || time(|| unary_grad(UnaryOp::Relu, &dy, &x, black_box(&mut y))),
        0.0,
    );
    // The bandwidth yardstick: one read stream and one write stream.
    report(filter, &format!("{label} copy (yardstick)"), || time(|| black_box(&mut y).copy_from_slice(&x)), 0.0);
}

/// The optimizer updates on `len` parameters (fc1's 784x256 weights), and
/// the two-tower reduction fused into momentum (`mean_apply`).
fn optim(filter: &Option<String>, label: &str, len: usize) {
    let g = data(len, 9);
    let g1 = data(len, 10);
    let (mut w, mut a, mut v) = (data(len, 11), data(len, 12), data(len, 13));
    v.iter_mut().for_each(|x| *x = x.abs());
    report(filter, &format!("{label} sgd"), || time(|| apply_gradient_descent(black_box(&mut w), &g, 1e-9)), 0.0);
    report(
        filter,
        &format!("{label} momentum"),
        || time(|| apply_momentum(black_box(&mut w), &mut a, &g, 1e-9, 0.9, false)),
        0.0,
    );
    report(
        filter,
        &format!("{label} adam"),
        || time(|| apply_adam(black_box(&mut w), &mut a, &mut v, &g, 1e-9, 0.9, 0.999, 1e-8, 3)),
        0.0,
    );
    let k = Kernel::ApplyMomentum { momentum: 0.9, nesterov: false };
    report(
        filter,
        &format!("{label} mean_apply momentum 2 towers"),
        || time(|| mean_apply(&[&g, &g1], &[0.5, 0.5], &k, 1, 1e-9, &mut [black_box(&mut w), &mut a]).unwrap()),
        0.0,
    );
}

fn gemm(filter: &Option<String>, m: usize, k: usize, n: usize, ta: bool, tb: bool) {
    let p = MatMul::new(m, k, n).trans_a(ta).trans_b(tb);
    let (a, b) = (data(m * k, 6), data(k * n, 7));
    let mut c = vec![0.0f32; m * n];
    let name = format!("gemm {m}x{k} * {k}x{n} ta={ta} tb={tb}");
    report(filter, &name, || time(|| matmul(&p, &a, &b, black_box(&mut c))), 2.0 * (m * k * n) as f64);
}

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    // Which SIMD path the hand-vectorized kernels (convolutions, pools) ran
    // on (`TOWERS_SIMD` forces a lower one), and the GEMM's micro-kernel.
    match towers_kernels::simd::selected() {
        Ok(p) => println!("simd path: {p} (gemm: {})", towers_kernels::simd::gemm_path()),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
    for (m, k, n, ta, tb) in [
        (256, 784, 256, false, false),
        (256, 784, 256, true, false),
        (256, 784, 256, false, true),
        (256, 256, 10, false, false),
        (512, 512, 512, false, false),
    ] {
        gemm(&filter, m, k, n, ta, tb);
    }
    let n = 256;
    let conv_geom = |h, c_in, k, c_out, padding| ConvGeom {
        n,
        h,
        w: h,
        c_in,
        kh: k,
        kw: k,
        c_out,
        stride_h: 1,
        stride_w: 1,
        padding,
    };
    conv(&filter, "conv_1 28x28x1 k5 ->12 VALID", conv_geom(28, 1, 5, 12, Padding::Valid));
    conv(&filter, "conv_2 12x12x12 k3 ->24 VALID", conv_geom(12, 12, 3, 24, Padding::Valid));
    conv(&filter, "same 28x28x1 k5 ->12 SAME", conv_geom(28, 1, 5, 12, Padding::Same));
    // Where direct and im2col meet (the threshold `DIRECT_MAX_C_IN`).
    conv(&filter, "edge 14x14x2 k3 ->32 SAME", conv_geom(14, 2, 3, 32, Padding::Same));
    conv(&filter, "edge 14x14x4 k3 ->32 SAME", conv_geom(14, 4, 3, 32, Padding::Same));
    let pool_geom = |h, c| PoolGeom { n, h, w: h, c, kh: 2, kw: 2, stride_h: 2, stride_w: 2, padding: Padding::Valid };
    pool(&filter, "pool_1 24x24x12", pool_geom(24, 12));
    pool(&filter, "pool_2 10x10x24", pool_geom(10, 24));
    elementwise(&filter, "act_1 [256,24,24,12]", n * 24 * 24 * 12, 12);
    elementwise(&filter, "act_2 [256,10,10,24]", n * 10 * 10 * 24, 24);
    elementwise(&filter, "dense [256,256]", n * 256, 256);
    optim(&filter, "optim 784x256", 784 * 256);
}
