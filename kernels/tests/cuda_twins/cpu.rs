//! The CPU bodies, called as the runtime's dispatch (runtime/src/exec.rs)
//! calls them: the one place to fix when their signatures move.

use towers_kernels::elementwise::{self as ew, BinaryOp, UnaryOp};
pub use towers_kernels::{batchnorm, conv, dropout, gemm, layout, misc, optim, pool, random, reduce, softmax};

pub fn binary(op: i32, a: &[f32], sa: &[usize], b: &[f32], sb: &[usize], out: &mut [f32]) {
    let op = BinaryOp::from_code(op).expect("a binary op code");
    ew::binary(op, a, sa, b, sb, out).unwrap();
}
pub fn broadcast_to(x: &[f32], xs: &[usize], out: &mut [f32], os: &[usize]) {
    ew::broadcast_to(x, xs, out, os).unwrap();
}
pub fn sum_to(x: &[f32], xs: &[usize], out: &mut [f32], os: &[usize]) {
    ew::sum_to_shape(x, xs, out, os).unwrap();
}
pub fn bias_add(x: &[f32], b: &[f32], y: &mut [f32]) {
    ew::bias_add(x, b, y);
}
pub fn bias_add_grad(dy: &[f32], db: &mut [f32]) {
    ew::bias_add_grad(dy, db);
}
pub fn unary(op: i32, x: &[f32], y: &mut [f32]) {
    ew::unary(UnaryOp::from_code(op).expect("a unary op code"), x, y);
}
pub fn unary_grad(op: i32, dy: &[f32], y: &[f32], dx: &mut [f32]) {
    ew::unary_grad(UnaryOp::from_code(op).expect("a unary op code"), dy, y, dx);
}
#[allow(clippy::too_many_arguments)]
pub fn matmul(m: usize, k: usize, n: usize, ta: bool, tb: bool, a: &[f32], b: &[f32], c: &mut [f32]) {
    gemm::matmul(&gemm::MatMul::new(m, k, n).trans_a(ta).trans_b(tb), a, b, c);
}
/// runtime/src/exec.rs `dropout_at`.
pub fn dropout_at(x: &[f32], keep: f32, seed: u64, step: u64, offset: usize, y: &mut [f32], mask: &mut [f32]) {
    let scale = if keep > 0.0 { 1.0 / keep.min(1.0) } else { 0.0 };
    for (k, (m, (o, v))) in mask.iter_mut().zip(y.iter_mut().zip(x)).enumerate() {
        let g = (offset + k) as u64;
        let r = random::philox_block(seed, step, g / 4);
        *m = if keep >= 1.0 || random::u32_to_unit(r[(g % 4) as usize]) < keep { scale } else { 0.0 };
        *o = *v * *m;
    }
}
/// BatchNormTrain: the kernel writes the unbiased variance itself.
pub fn batch_norm_train(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32, outs: &mut [Vec<f32>; 4]) {
    let [y, mean, inv_std, var] = outs;
    batchnorm::batch_norm_train(x, gamma, beta, eps, y, mean, var, inv_std);
}
