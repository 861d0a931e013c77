//! Finite-difference checks of the selecting ops (`reduce_max`,
//! `reduce_min`), and TF's conventions where the derivative is not defined
//! (tied extremes).

use std::collections::BTreeMap;

use towers_graph::GraphBuilder;

use super::interp::{self, V};
use super::{case, var};
use crate::autodiff::gradients;

/// y = max over axes of x: away from ties, dy/dx is 1 at the (unique)
/// maximum and 0 elsewhere, so dx = dy scattered to the argmax positions;
/// min the same at the minimum. Random values have no ties. One axis
/// without keep_dims, two with, every axis, and an empty axis list (y = x).
#[test]
fn reduce_max_and_min_over_axes() {
    case(|b| {
        let x = var(b, "x", &[2, 3, 4]);
        let a = b.reduce_max(x, &[1], false).unwrap();
        let m = b.reduce_min(x, &[0, 2], true).unwrap();
        let all = b.reduce_max(x, &[0, 1, 2], false).unwrap();
        let none = b.reduce_min(x, &[0usize; 0], false).unwrap();
        (vec![x], vec![a, m, all, none])
    });
}

/// The gradient of `sum(reduce(x, axes))` at given values, through the f64
/// interpreter (dy = 1).
fn grad_at(min: bool, shape: &[usize], x: Vec<f64>, axes: &[usize]) -> Vec<f64> {
    let mut b = GraphBuilder::new();
    let t = var(&mut b, "x", shape);
    let y = if min { b.reduce_min(t, axes, false) } else { b.reduce_max(t, axes, false) }.unwrap();
    let loss = b.reduce_sum_all(y).unwrap();
    let mut g = b.finish();
    let res = gradients(&mut g, loss, &[t.node]).unwrap();
    let mut vars = BTreeMap::from([("x".to_string(), V::new(shape, x))]);
    let out = interp::run(&g, &mut vars, &BTreeMap::new());
    let d = res.grads[0].1;
    out[&d.node][d.slot].data.clone()
}

/// TF's `_MinOrMaxGrad` divides dy equally among tied extremes:
/// `tf.gradients(tf.reduce_max([[1., 3., 3.], [2., 2., 2.]], 1), x)` is
/// `[[0, .5, .5], [1/3, 1/3, 1/3]]`.
#[test]
fn ties_share_the_gradient_equally_as_tf() {
    let x = vec![1.0, 3.0, 3.0, 2.0, 2.0, 2.0];
    let third = 1.0 / 3.0;
    assert_eq!(grad_at(false, &[2, 3], x.clone(), &[1]), vec![0.0, 0.5, 0.5, third, third, third]);
    // Min over axis 0 of [[1, 3, 3], [2, 2, 2]]: 1, 2, 2 (no ties).
    assert_eq!(grad_at(true, &[2, 3], x, &[0]), vec![1.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
}

/// z = where(c, x, y) (TF1's `tf.where`): dz/dx = [c], dz/dy = [not c];
/// the condition (a comparison, here of x against a broadcast constant row
/// and of y against a scalar) gets none. A row-selecting vector condition routes
/// whole rows. Random values sit away from the comparisons' edges.
#[test]
fn where_routes_the_gradient_to_the_selected_branch() {
    case(|b| {
        let x = var(b, "x", &[3, 4]);
        let y = var(b, "y", &[3, 4]);
        let r = b.constant("r", towers_graph::DType::F32, &[4], &[0.1, -0.2, 0.3, -0.4]).unwrap();
        let c = b.greater(x, r).unwrap();
        let z = b.where_(c, x, y).unwrap();
        let zero = b.scalar(0.0).unwrap();
        let c2 = b.less_equal(y, zero).unwrap();
        let w = b.where_(c2, y, x).unwrap();
        let col = b.reduce_sum(x, &[1], false).unwrap();
        let rows = b.greater_equal(col, zero).unwrap();
        let v = b.select(rows, y, x).unwrap();
        (vec![x, y], vec![z, w, v])
    });
}

/// Comparisons have no gradient (as TF): a loss reached only through one
/// has no differentiable path to the variable, the typed error
/// `NoGradients` (TF's `None` for every variable).
#[test]
fn comparisons_have_no_gradient() {
    let mut b = GraphBuilder::new();
    let x = var(&mut b, "x", &[3]);
    let zero = b.scalar(0.0).unwrap();
    let c = b.not_equal(x, zero).unwrap();
    let f = b.cast(c, towers_graph::DType::F32).unwrap();
    let loss = b.reduce_sum_all(f).unwrap();
    let mut g = b.finish();
    let e = gradients(&mut g, loss, &[x.node]).unwrap_err();
    assert!(matches!(e, crate::state::PassError::NoGradients { .. }), "{e}");
}
