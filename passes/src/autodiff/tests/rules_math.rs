//! Finite-difference checks of the math ops of issue 22 (see `check_grads`
//! for the tolerance), and TF's conventions where the derivative is not
//! defined (ties of `maximum`/`minimum`, `pow`'s exponent at a base <= 0).

use std::collections::BTreeMap;

use towers_graph::{BinaryOp, GraphBuilder, Tensor};

use super::interp::{self, V};
use super::{case, var};
use crate::autodiff::gradients;

/// z = max(a, b): dz/da = [a >= b], dz/db = [a < b]; min the other way
/// round. With broadcasting (a row and a scalar) the gradients sum back.
#[test]
fn maximum_and_minimum_with_broadcasting() {
    case(|b| {
        let x = var(b, "x", &[3, 4]);
        let r = var(b, "r", &[4]);
        let s = var(b, "s", &[]);
        let y = b.maximum(x, r).unwrap();
        let z = b.minimum(s, y).unwrap();
        let w = b.minimum(x, r).unwrap();
        let v = b.maximum(s, x).unwrap();
        (vec![x, r, s], vec![z, w, v])
    });
}

/// leaky_relu(x) = x (x > 0), alpha·x (x <= 0): dx = dy or alpha·dy, for
/// TF's default 0.2 (maximum) and an alpha above 1 (minimum). Values in
/// [-3, 3) cover both branches.
#[test]
fn leaky_relu_both_sides_of_one() {
    for alpha in [0.2, 3.0] {
        case(|b| {
            let x = var(b, "x", &[3, 5]);
            let three = b.scalar(3.0).unwrap();
            let wide = b.mul(x, three).unwrap();
            (vec![x], vec![b.leaky_relu(wide, alpha).unwrap()])
        });
    }
}

/// z = a^b: dz/da = b·a^(b-1), dz/db = z·ln(a). Bases kept in [0.5, 1]
/// (a = x²/2 + 0.5) so ln(a) exists; the exponent is a broadcast row and
/// a scalar. A signed base with a constant integer exponent (x³) checks
/// the base's gradient where ln would not exist.
#[test]
fn pow_base_and_exponent() {
    case(|b| {
        let x = var(b, "x", &[3, 4]);
        let r = var(b, "r", &[4]);
        let s = var(b, "s", &[]);
        let sq = b.square(x).unwrap();
        let half = b.scalar(0.5).unwrap();
        let h = b.mul(sq, half).unwrap();
        let pos = b.add(h, half).unwrap();
        let p = b.pow(pos, r).unwrap();
        let q = b.pow(pos, s).unwrap();
        let three = b.scalar(3.0).unwrap();
        let cube = b.pow(x, three).unwrap();
        (vec![x, r, s], vec![p, q, cube])
    });
}

/// square: dx = 2·x·dy; relu6: dy where 0 < x < 6 (inputs in [-8, 8) cover
/// all three pieces); softplus: dy·sigmoid(x).
#[test]
fn square_relu6_softplus() {
    case(|b| {
        let x = var(b, "x", &[3, 5]);
        let eight = b.scalar(8.0).unwrap();
        let wide = b.mul(x, eight).unwrap();
        let sq = b.square(x).unwrap();
        let r6 = b.relu6(wide).unwrap();
        let sp = b.softplus(wide).unwrap();
        (vec![x], vec![sq, r6, sp])
    });
}

/// The gradients of one binary op `op(a, b)` at given values, through the
/// f64 interpreter: (da, db) with dy = 1.
fn grads_at(op: BinaryOp, a: Vec<f64>, bv: Vec<f64>) -> (Vec<f64>, Vec<f64>) {
    let mut b = GraphBuilder::new();
    let (x, y) = (var(&mut b, "a", &[a.len()]), var(&mut b, "b", &[bv.len()]));
    let z = b.binary(op, x, y).unwrap();
    let loss = b.reduce_sum_all(z).unwrap();
    let mut g = b.finish();
    let res = gradients(&mut g, loss, &[x.node, y.node]).unwrap();
    let mut vars =
        BTreeMap::from([("a".to_string(), V::new(&[a.len()], a)), ("b".to_string(), V::new(&[bv.len()], bv))]);
    let out = interp::run(&g, &mut vars, &BTreeMap::new());
    let get = |t: Tensor| out[&t.node][t.slot].data.clone();
    (get(res.grads[0].1), get(res.grads[1].1))
}

/// TF's `_MaximumGrad`/`_MinimumGrad` send a tie's gradient to the first
/// operand (`x >= y` resp. `x <= y`), never half to each.
#[test]
fn ties_go_to_the_first_operand_as_tf() {
    let (a, b) = (vec![1.0, 2.0, 3.0], vec![1.0, 5.0, -1.0]);
    assert_eq!(grads_at(BinaryOp::Maximum, a.clone(), b.clone()), (vec![1.0, 0.0, 1.0], vec![0.0, 1.0, 0.0]));
    assert_eq!(grads_at(BinaryOp::Minimum, a, b), (vec![1.0, 1.0, 0.0], vec![0.0, 0.0, 1.0]));
}

/// TF's `_PowGrad` takes log(x) as 0 where x <= 0, so the exponent's
/// gradient is 0 there (not NaN); the base's is y·x^(y-1) as everywhere.
#[test]
fn pow_exponent_gradient_is_zero_at_bases_up_to_zero() {
    let (da, db) = grads_at(BinaryOp::Pow, vec![-2.0, 0.0, 2.0], vec![2.0, 2.0, 2.0]);
    assert_eq!(da, vec![-4.0, 0.0, 4.0]);
    assert_eq!(db[..2], [0.0, 0.0]);
    assert!((db[2] - 4.0 * 2f64.ln()).abs() < 1e-12, "{db:?}");
}

/// The gradient helpers have no gradient of their own: a typed error.
#[test]
fn gradient_helpers_have_no_gradient() {
    for op in [BinaryOp::GreaterEqualMask, BinaryOp::PowGradY, BinaryOp::AbsGrad] {
        let mut b = GraphBuilder::new();
        let (x, y) = (var(&mut b, "a", &[2]), var(&mut b, "b", &[2]));
        let z = b.binary(op, x, y).unwrap();
        let loss = b.reduce_sum_all(z).unwrap();
        let mut g = b.finish();
        let e = gradients(&mut g, loss, &[x.node]).unwrap_err().to_string();
        assert!(e.contains(op.tf_name()), "{e}");
    }
}

/// LRN (TF's `local_response_normalization`), y = x / (bias + alpha·S)^beta
/// with S the sum of x² over a channel window: every input channel reaches
/// the outputs of its window, through the numerator and through S, so
/// dx_c = dy_c·D_c^-β − 2αβ·x_c·Σ_{|c'−c|<=r} dy_c'·x_c'·D_c'^(−β−1)
/// with D = bias + alpha·S. Checked at radius 1 (windows cut at the edges
/// of 5 channels) and radius 0 (one window).
#[test]
fn local_response_normalization_over_channels() {
    for (radius, bias, alpha, beta) in [(1, 1.0, 0.5, 0.75), (0, 2.0, 1.0, 0.5)] {
        case(|b| {
            let x = var(b, "x", &[2, 2, 1, 5]);
            (vec![x], vec![b.local_response_normalization(x, radius, bias, alpha, beta).unwrap()])
        });
    }
}

/// |x|: dx = dy·sign(x) (TF's `_AbsGrad`), built from x by `AbsGrad`
/// since y = |x| has lost the sign. Random values in [-1, 1) sit away
/// from the kink.
#[test]
fn abs_gradient_is_the_sign() {
    case(|b| {
        let x = var(b, "x", &[3, 5]);
        (vec![x], vec![b.abs(x).unwrap()])
    });
}

/// At the kink TF takes sign(0) = 0: `tf.gradients(tf.abs(x), x)` at
/// `[-2, 0, 3]` is `[-1, 0, 1]`.
#[test]
fn abs_gradient_is_zero_at_zero_as_tf() {
    let mut b = GraphBuilder::new();
    let x = var(&mut b, "x", &[3]);
    let y = b.abs(x).unwrap();
    assert_eq!(b.graph().node(y.node).op.type_name(), "Abs");
    let loss = b.reduce_sum_all(y).unwrap();
    let mut g = b.finish();
    let res = gradients(&mut g, loss, &[x.node]).unwrap();
    let mut vars = BTreeMap::from([("x".to_string(), V::new(&[3], vec![-2.0, 0.0, 3.0]))]);
    let out = interp::run(&g, &mut vars, &BTreeMap::new());
    let d = res.grads[0].1;
    assert_eq!(out[&d.node][d.slot].data, vec![-1.0, 0.0, 1.0]);
    assert!(matches!(g.node(d.node).op, towers_graph::Op::Binary(BinaryOp::AbsGrad)), "{:?}", g.node(d.node).op);
}

/// C = op(A)·op(B) per batch index (`BatchMatMul`): dA = dC·op(B)ᵀ and
/// dB = op(A)ᵀ·dC per index, with the transposes undone, for all four
/// transpose pairs at equal batches `[2,3,..]` (rank 4); a shared right
/// operand `[D,E]` (rank 2: `[B,T,D]·[D,E]`) and a shared left one with
/// size-1 batch axes (`[1,T,D]·[B,D,E]`) get the sum of their gradients
/// over the batch they were broadcast along.
#[test]
fn batched_matmul_every_transpose_and_shared_operands() {
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        case(|b| {
            let sa: &[usize] = if ta { &[2, 3, 4, 5] } else { &[2, 3, 5, 4] };
            let sb: &[usize] = if tb { &[2, 3, 6, 4] } else { &[2, 3, 4, 6] };
            let (x, y) = (var(b, "x", sa), var(b, "y", sb));
            let c = b.matmul_t(x, y, ta, tb).unwrap();
            assert_eq!(b.graph().tensor_type(c).unwrap().shape.dims(), Some(vec![2, 3, 5, 6]));
            (vec![x, y], vec![c])
        });
    }
    case(|b| {
        let (x, w) = (var(b, "x", &[3, 5, 4]), var(b, "w", &[4, 2]));
        let (l, r) = (var(b, "l", &[1, 5, 4]), var(b, "r", &[3, 2, 4]));
        let right = b.matmul(x, w).unwrap();
        let left = b.matmul_t(l, r, false, true).unwrap();
        (vec![x, w, l, r], vec![right, left])
    });
}
