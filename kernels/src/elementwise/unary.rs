//! The CPU kernels of the elementwise unary ops. The ops themselves
//! ([`UnaryOp`], re-exported from `towers_vocab`) are one table,
//! `towers_vocab::unary_table!` in `vocab/src/unary.rs`; this file expands
//! the same rows into one loop per op (`unary_kernels!`), so the kernels
//! cannot miss an op. Shapes are irrelevant: every
//! kernel maps `x[i] -> y[i]` over equal-length slices.
//!
//! Invariant: every gradient is a function of the upstream gradient `dy`
//! and the forward *output* `y` only (`dx = grad(dy, y)`), so the forward
//! input need not be kept alive and one generic rule differentiates every
//! op (`UnaryGrad(op)(dy, y)`). An op whose derivative cannot be written
//! from its output (`square`, `abs`) does not belong here.
//!
//! Adding an op: one entry in the table of `vocab/src/unary.rs` (variant, names, its code,
//! forward and gradient from `y` on the CPU and in CUDA C), a builder
//! method, a test. Nothing else changes: the graph's `Op::Unary`/
//! `Op::UnaryGrad`, autodiff, simplify, codegen, the CPU backend and the
//! CUDA switches (generated from that table by [`UnaryOp::cuda_switches`])
//! handle every `UnaryOp` generically.
//!
//! CUDA links by name: an op's code is the table's `code` ([`UnaryOp::code`]),
//! never its position in [`UnaryOp::ALL`]; codes are distinct and never
//! reused. A code the switches do not know writes NaN, never another op's
//! value.

/// Re-export: the op enum is vocabulary (`towers_vocab::UnaryOp`).
pub use towers_vocab::UnaryOp;

/// Expands the vocabulary's table into the CPU kernels: each kernel's
/// `match` expands every closure into its own monomorphic (vectorizable)
/// loop. The table's other fields are the vocabulary's.
macro_rules! unary_kernels {
    ($( $(#[$doc:meta])* $v:ident { name: $name:literal, tf: $tf:literal, tf_grad: $tfg:literal, code: $code:literal,
        f: $f:expr, grad: $g:expr, cuda: $cuda:literal, cuda_grad: $cudag:literal $(,)? } )*) => {
        /// `y[i] = op(x[i])`.
        pub fn unary(op: UnaryOp, x: &[f32], y: &mut [f32]) {
            debug_assert_eq!(x.len(), y.len());
            match op {
                $(UnaryOp::$v => {
                    let f = $f;
                    for (o, v) in y.iter_mut().zip(x) { *o = f(*v); }
                })*
            }
        }

        /// `y[i] = op(y[i])`, in place (the epilogue of a fused launch).
        pub fn unary_in_place(op: UnaryOp, y: &mut [f32]) {
            match op {
                $(UnaryOp::$v => {
                    let f = $f;
                    for o in y.iter_mut() { *o = f(*o); }
                })*
            }
        }

        /// [`unary_grad`] with `dx` written over `dy` (lowering's in-place
        /// activation gradient, when `dy` has no other reader).
        pub fn unary_grad_in_place(op: UnaryOp, dy_dx: &mut [f32], y: &[f32]) {
            debug_assert_eq!(dy_dx.len(), y.len());
            match op {
                $(UnaryOp::$v => {
                    let g = $g;
                    for (o, v) in dy_dx.iter_mut().zip(y) { *o = g(*o, *v); }
                })*
            }
        }

        /// `dx[i] = grad_op(dy[i], y[i])` where `y = op(x)` (the graph's `UnaryGrad`).
        pub fn unary_grad(op: UnaryOp, dy: &[f32], y: &[f32], dx: &mut [f32]) {
            debug_assert!(dy.len() == y.len() && dy.len() == dx.len());
            match op {
                $(UnaryOp::$v => {
                    let g = $g;
                    for ((o, d), v) in dx.iter_mut().zip(dy).zip(y) { *o = g(*d, *v); }
                })*
            }
        }
    };
}

towers_vocab::unary_table!(unary_kernels);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_close, numeric_grad, Lcg};

    #[test]
    fn unary_values() {
        let x = [-2.0f32, -0.5, 0.0, 0.25, 3.0];
        type Case = (UnaryOp, fn(f64) -> f64);
        let cases: [Case; 5] = [
            (UnaryOp::Neg, |v| -v),
            (UnaryOp::Relu, |v| v.max(0.0)),
            (UnaryOp::Sigmoid, |v| 1.0 / (1.0 + (-v).exp())),
            (UnaryOp::Tanh, |v| v.tanh()),
            (UnaryOp::Exp, |v| v.exp()),
        ];
        for (op, f) in cases {
            let want: Vec<f32> = x.iter().map(|v| f(*v as f64) as f32).collect();
            let mut y = [0.0; 5];
            unary(op, &x, &mut y);
            assert_close(&y, &want, 1e-6, &format!("{op:?}"));
            assert!(x.iter().zip(&y).all(|(v, w)| op.apply(*v) == *w));
        }
        let pos = [0.25f32, 1.0, 4.0];
        let mut y = [0.0; 3];
        unary(UnaryOp::Log, &pos, &mut y);
        assert_close(&y, &[0.25f32.ln(), 0.0, 4.0f32.ln()], 1e-6, "log");
        unary(UnaryOp::Rsqrt, &pos, &mut y);
        assert_close(&y, &[2.0, 1.0, 0.5], 1e-6, "rsqrt");
        unary(UnaryOp::Sqrt, &pos, &mut y);
        assert_close(&y, &[0.5, 1.0, 2.0], 1e-6, "sqrt");
        unary(UnaryOp::Reciprocal, &pos, &mut y);
        assert_close(&y, &[4.0, 1.0, 0.25], 1e-6, "reciprocal");
        unary(UnaryOp::Elu, &[-1.0, 0.0, 2.0], &mut y);
        assert_close(&y, &[(-1.0f32).exp() - 1.0, 0.0, 2.0], 1e-6, "elu");
        let mut y5 = [0.0; 5];
        unary(UnaryOp::Relu6, &[-1.0, 0.0, 3.5, 6.0, 9.0], &mut y5);
        assert_eq!(y5, [0.0, 0.0, 3.5, 6.0, 6.0]);
        // softplus(x) = ln(1 + e^x), in f64; stable far out on both tails.
        let sp = [-100.0f32, -3.0, 0.0, 2.0, 100.0];
        unary(UnaryOp::Softplus, &sp, &mut y5);
        let want: Vec<f32> = sp.iter().map(|&v| (v as f64).exp().ln_1p() as f32).collect();
        assert_close(&y5, &want, 1e-6, "softplus");
        assert_eq!(y5[4], 100.0);
        assert!(y5[0] > 0.0 && y5[0] < 1e-40);
        // Sigmoid is stable far out on both tails.
        unary(UnaryOp::Sigmoid, &[-200.0, 200.0, 0.0], &mut y);
        assert_eq!(y, [0.0, 1.0, 0.5]);
    }

    /// d/dx sum(f(x) * g) = g * f'(x), and `unary_grad` computes g * f'(x)
    /// from y = f(x) alone; compared with central differences for every op
    /// (inputs kept positive and away from 0 where the op's domain asks).
    #[test]
    fn grads_from_y_match_finite_differences() {
        let mut r = Lcg::new(41);
        let g = r.vec(20);
        let signed: Vec<f32> = r.vec(20).iter().map(|v| v * 3.0).collect();
        let positive: Vec<f32> = r.vec(20).iter().map(|v| 0.5 + v.abs() * 2.0).collect();
        for &op in UnaryOp::ALL {
            if op == UnaryOp::Abs {
                // Its gradient needs x (autodiff's `BinaryOp::AbsGrad`); the
                // column from y writes NaN, checked below.
                let (mut dx, y) = ([0.0f32; 2], [1.0f32, 0.0]);
                unary_grad(op, &g[..2], &y, &mut dx);
                assert!(dx.iter().all(|v| v.is_nan()), "{dx:?}");
                continue;
            }
            let x = match op {
                UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Reciprocal | UnaryOp::Log1p => &positive,
                _ => &signed,
            };
            let mut y = vec![0.0; 20];
            unary(op, x, &mut y);
            let mut dx = vec![0.0; 20];
            unary_grad(op, &g, &y, &mut dx);
            let want = numeric_grad(x, 1e-3, |x| {
                let mut y = vec![0.0; 20];
                unary(op, x, &mut y);
                y.iter().zip(&g).map(|(a, b)| *a as f64 * *b as f64).sum()
            });
            assert_close(&dx, &want, 5e-3, &format!("{op:?}"));
        }
    }

    /// TF's `Relu6Grad` passes dy only where `0 < x < 6`: 0 at both kinks
    /// (y = 0 and y = 6) and beyond them.
    #[test]
    fn relu6_grad_is_zero_at_the_kinks() {
        let mut dx = [f32::NAN; 5];
        unary_grad(UnaryOp::Relu6, &[1.0; 5], &[0.0, 1e-3, 3.0, 6.0, 5.999], &mut dx);
        assert_eq!(dx, [0.0, 1.0, 1.0, 0.0, 1.0]);
    }

    /// TF's `Relu` and `Relu6` keep a NaN (TF 1.15.3 fixed the GPU's 0):
    /// a NaN input must not become a finite loss over NaN weights.
    #[test]
    fn relu_and_relu6_keep_nan() {
        let x = [f32::NAN, -1.0, 2.0, 7.0];
        let mut y = [0.0; 4];
        unary(UnaryOp::Relu, &x, &mut y);
        assert!(y[0].is_nan() && y[1..] == [0.0, 2.0, 7.0], "{y:?}");
        unary(UnaryOp::Relu6, &x, &mut y);
        assert!(y[0].is_nan() && y[1..] == [0.0, 2.0, 6.0], "{y:?}");
    }

    #[test]
    fn relu_grad_at_zero_is_zero() {
        let mut dx = [1.0; 3];
        unary_grad(UnaryOp::Relu, &[1.0, 1.0, 1.0], &[0.0, -0.0, 2.0], &mut dx);
        assert_eq!(dx, [0.0, 0.0, 1.0]);
    }
}
