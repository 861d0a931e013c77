//! Finite-difference checks of `top_k`'s gradient (TF's `_TopKGrad`), its
//! value at ties, and `in_top_k`'s absence of one.

use std::collections::BTreeMap;

use towers_graph::{DType, GraphBuilder};

use super::interp::{self, V};
use super::{case, case_fed, var};
use crate::autodiff::gradients;
use crate::state::PassError;

/// values = top_k(x, k): away from ties the selection is locally constant,
/// so d values[r, j] / d x[r, c] = [c = indices[r, j]] and dx scatters the
/// values' gradient to the picked columns (zero elsewhere). Random values
/// have no ties. A matrix, a rank-3 input (rows over the leading axes),
/// k = C (a full sort) and k = 1.
#[test]
fn top_k_scatters_the_gradient_to_the_picked_columns() {
    case(|b| {
        let x = var(b, "x", &[3, 6]);
        let y = var(b, "y", &[2, 2, 5]);
        let (v3, _) = b.top_k(x, 3).unwrap();
        let (all, _) = b.top_k(y, 5).unwrap();
        let (one, _) = b.top_k(y, 1).unwrap();
        (vec![x, y], vec![v3, all, one])
    });
}

/// The indices feed a gather of another variable: they carry no gradient
/// (i32), the values do; both variables are checked.
#[test]
fn top_k_indices_select_without_a_gradient() {
    case(|b| {
        let x = var(b, "x", &[2, 4]);
        let table = var(b, "table", &[4, 3]);
        let (v, i) = b.top_k(x, 2).unwrap();
        let rows = b.gather(table, i, 0).unwrap();
        (vec![x, table], vec![v, rows])
    });
}

/// At ties TF's gradient goes to the picked columns: for x = [1, 3, 3],
/// top_k(x, 2) picks columns 1 and 2, top_k(x, 1) column 1 only, so
/// d sum(values) / dx is [0, 1, 1] and [0, 1, 0].
#[test]
fn at_ties_the_gradient_follows_the_picks_as_tf() {
    for (k, want) in [(2, vec![0.0, 1.0, 1.0]), (1, vec![0.0, 1.0, 0.0])] {
        let mut b = GraphBuilder::new();
        let x = var(&mut b, "x", &[1, 3]);
        let (v, _) = b.top_k(x, k).unwrap();
        let loss = b.reduce_sum_all(v).unwrap();
        let mut g = b.finish();
        let res = gradients(&mut g, loss, &[x.node]).unwrap();
        let mut vars = BTreeMap::from([("x".to_string(), V::new(&[1, 3], vec![1.0, 3.0, 3.0]))]);
        let out = interp::run(&g, &mut vars, &BTreeMap::new());
        let d = res.grads[0].1;
        assert_eq!(out[&d.node][d.slot].data, want, "k = {k}");
    }
}

/// `in_top_k` is not differentiable (a bool, as TF): a loss reached only
/// through it has no path to the variable, the typed `NoGradients` naming
/// the loss and the variable; a loss that also reaches the variable
/// otherwise differentiates that path only (checked by differences, with
/// the accuracy term adding a constant).
#[test]
fn in_top_k_has_no_gradient() {
    let mut b = GraphBuilder::new();
    let x = var(&mut b, "x", &[3, 4]);
    let labels = b.placeholder("labels", DType::I32, [Some(3)]).unwrap();
    let hit = b.in_top_k(x, labels, 2).unwrap();
    let f = b.cast(hit, DType::F32).unwrap();
    let loss = b.reduce_sum_all(f).unwrap();
    let mut g = b.finish();
    let e = gradients(&mut g, loss, &[x.node]).unwrap_err();
    assert!(matches!(&e, PassError::NoGradients { vars, .. } if vars == "x"), "{e}");
    assert!(e.to_string().ends_with("Every path stops at an op that has no gradient: 'InTopK' (InTopK)."), "{e}");

    let feeds = BTreeMap::from([("labels".to_string(), V::new(&[3], vec![0.0, 3.0, 9.0]))]);
    case_fed(feeds, |b| {
        let x = var(b, "x", &[3, 4]);
        let labels = b.placeholder("labels", DType::I32, [Some(3)]).unwrap();
        let hit = b.in_top_k(x, labels, 2).unwrap();
        let f = b.cast(hit, DType::F32).unwrap();
        let sq = b.mul(x, x).unwrap();
        let rows = b.reduce_sum(sq, &[1], false).unwrap();
        let y = b.add(rows, f).unwrap();
        (vec![x], vec![y])
    });
}
