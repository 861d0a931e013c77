//! Quick timings of the hot kernels (not a test):
//! `cargo run -p towers-kernels --release --example bench`.

use std::time::Instant;
use towers_kernels::conv::{conv2d, conv2d_backprop_filter, conv2d_backprop_input, ConvGeom};
use towers_kernels::gemm::{matmul, MatMul};
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
    best
}

fn main() {
    for &(m, k, n, ta, tb) in &[
        (256, 784, 256, false, false),
        (256, 784, 256, true, false),
        (256, 784, 256, false, true),
        (256, 256, 10, false, false),
        (512, 512, 512, false, false),
        (1024, 25, 12, false, false),
        (1024, 108, 24, false, false),
    ] {
        let p = MatMul::new(m, k, n).trans_a(ta).trans_b(tb);
        let a = vec![0.5f32; m * k];
        let b = vec![0.25f32; k * n];
        let mut c = vec![0.0f32; m * n];
        let s = time(|| matmul(&p, &a, &b, &mut c));
        let gf = 2.0 * (m * k * n) as f64 / s / 1e9;
        println!("gemm {m}x{k} * {k}x{n} ta={ta} tb={tb}: {:.1} us, {gf:.1} GFLOP/s", s * 1e6);
    }
    for &(h, ci, k, co) in &[(28, 1, 5, 12), (14, 12, 3, 24), (8, 12, 3, 24)] {
        let p = ConvGeom {
            n: 256,
            h,
            w: h,
            c_in: ci,
            kh: k,
            kw: k,
            c_out: co,
            stride_h: 1,
            stride_w: 1,
            padding: Padding::Same,
        };
        let x = vec![0.5f32; p.x_len()];
        let f = vec![0.1f32; p.filter_len()];
        let mut y = vec![0.0f32; p.y_len()];
        let mut dx = vec![0.0f32; p.x_len()];
        let mut df = vec![0.0f32; p.filter_len()];
        let mut ws = vec![0.0f32; p.workspace_len()];
        let flops = 2.0 * (p.rows() * p.k() * co) as f64;
        let t1 = time(|| conv2d(&p, &x, &f, &mut y, &mut ws));
        let t2 = time(|| conv2d_backprop_input(&p, &y, &f, &mut dx, &mut ws));
        let t3 = time(|| conv2d_backprop_filter(&p, &x, &y, &mut df, &mut ws));
        println!(
            "conv n=256 {h}x{h}x{ci} k{k} -> {co} SAME: fwd {:.2} ms ({:.1} GF/s), bwd-input {:.2} ms, bwd-filter {:.2} ms",
            t1 * 1e3,
            flops / t1 / 1e9,
            t2 * 1e3,
            t3 * 1e3
        );
    }
}
