//! Finite-difference checks of the builder's compositions of TF ops
//! (`graph/src/builder_compose.rs`): their gradients are those of the
//! parts, checked here through the f64 interpreter as every rule is.

use super::{case, var};

/// d/da (a - b)² = 2(a - b), d/db = -2(a - b); with b broadcast over rows.
#[test]
fn squared_difference_has_twice_the_difference() {
    case(|b| {
        let x = var(b, "x", &[3, 4]);
        let y = var(b, "y", &[4]);
        let d = b.squared_difference(x, y).unwrap();
        (vec![x, y], vec![d])
    });
}

/// d/dx logsumexp(x) over an axis is softmax(x) over that axis (the
/// stop-gradient maximum cancels): over the last axis, the first, both,
/// and with kept dimensions.
#[test]
fn reduce_logsumexp_has_softmax_for_a_gradient() {
    case(|b| {
        let x = var(b, "x", &[3, 4]);
        let last = b.reduce_logsumexp(x, &[-1], false).unwrap();
        let first = b.reduce_logsumexp(x, &[0], true).unwrap();
        let both = b.reduce_logsumexp(x, &[0, 1], false).unwrap();
        (vec![x], vec![last, first, both])
    });
}

/// Softmax and log-softmax over a middle axis of a rank-3 tensor and over
/// the first axis of a matrix: the transposes carry the gradient back.
#[test]
fn softmax_over_any_axis_has_softmax_gradients() {
    case(|b| {
        let x = var(b, "x", &[2, 3, 4]);
        let y = var(b, "y", &[3, 2]);
        let s = b.softmax_axis(x, 1).unwrap();
        let l = b.log_softmax_axis(x, -2).unwrap();
        let s0 = b.softmax_axis(y, 0).unwrap();
        (vec![x, y], vec![s, l, s0])
    });
}

/// Equal parts and a "-1" part: each part's gradient lands in its columns.
#[test]
fn split_by_count_and_by_sizes_route_the_gradient() {
    case(|b| {
        let x = var(b, "x", &[2, 6]);
        let parts = b.split_n(x, 3, 1).unwrap();
        let rest = b.split_sizes(x, &[1, -1, 2], -1).unwrap();
        let mut outs = parts;
        outs.extend(rest);
        (vec![x], outs)
    });
}

/// log1p: dy / (1 + x) (at x + 0.5 in [-0.5, 1.5), above -1);
/// expm1: dy·exp(x); floor, ceil, round, sign: zero (piecewise constant;
/// random values are away from the jumps, where differences are 0 too).
#[test]
fn log1p_expm1_and_the_rounding_ops() {
    case(|b| {
        let x = var(b, "x", &[3, 4]);
        let half = b.scalar(0.5).unwrap();
        let shifted = b.add(x, half).unwrap();
        let l = b.log1p(shifted).unwrap();
        let e = b.expm1(x).unwrap();
        let f = b.floor(x).unwrap();
        let c = b.ceil(x).unwrap();
        let r = b.round(x).unwrap();
        let s = b.sign(x).unwrap();
        let mixed = b.mul(r, x).unwrap();
        (vec![x], vec![l, e, f, c, s, mixed])
    });
}

/// BERT's tanh GELU: its derivative through the composition.
#[test]
fn gelu_tanh_gradient() {
    case(|b| {
        let x = var(b, "x", &[2, 5]);
        let three = b.scalar(3.0).unwrap();
        let wide = b.mul(x, three).unwrap();
        let g = b.gelu_tanh(wide).unwrap();
        (vec![x], vec![g])
    });
}
