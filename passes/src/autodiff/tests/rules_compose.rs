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
