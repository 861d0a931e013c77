//! Finite-difference checks of the gradients of the array ops of issue 22
//! (derivations in `super::super::array`'s module docs). Each graph is
//! `loss = Σ reduce_sum(op(vars) * W)` (see `check_grads` for the tolerance);
//! integer indices are fed.

use std::collections::BTreeMap;

use towers_graph::DType;

use super::interp::V;
use super::{case, case_fed, var};

fn indices(name: &str, shape: &[usize], values: &[f64]) -> BTreeMap<String, V> {
    BTreeMap::from([(name.to_string(), V::new(shape, values.to_vec()))])
}

#[test]
fn transpose_by_a_permutation_and_by_default() {
    case(|b| {
        let x = var(b, "x", &[2, 3, 4]);
        let y = b.transpose(x, &[2, 0, 1]).unwrap();
        let z = b.transpose(x, &[]).unwrap();
        (vec![x], vec![y, z])
    });
}

#[test]
fn expand_dims_squeeze_and_stack() {
    case(|b| {
        let x = var(b, "x", &[3, 1, 2]);
        let e = b.expand_dims(x, 0).unwrap();
        let s = b.squeeze(e, &[0, 2]).unwrap();
        let a = var(b, "a", &[3, 2]);
        let st = b.stack(&[a, s, a], -2).unwrap();
        (vec![x, a], vec![s, st])
    });
}

#[test]
fn pad_with_a_constant() {
    case(|b| {
        let x = var(b, "x", &[2, 3]);
        let y = b.pad(x, &[[1, 0], [2, 1]], 0.5).unwrap();
        (vec![x], vec![y])
    });
}

#[test]
fn gather_with_repeated_indices_along_two_axes() {
    let mut feeds = indices("i", &[4], &[3.0, 1.0, 3.0, 0.0]);
    feeds.extend(indices("j", &[2, 2], &[2.0, 0.0, 2.0, 2.0]));
    case_fed(feeds, |b| {
        let p = var(b, "p", &[5, 3]);
        let i = b.placeholder("i", DType::I32, [Some(4)]).unwrap();
        let j = b.placeholder("j", DType::I32, [Some(2), Some(2)]).unwrap();
        let y0 = b.gather(p, i, 0).unwrap();
        let y1 = b.gather(p, j, 1).unwrap();
        (vec![p], vec![y0, y1])
    });
}

#[test]
fn tile_sums_over_the_copies() {
    case(|b| {
        let x = var(b, "x", &[2, 3]);
        let y = b.tile(x, &[2, 2]).unwrap();
        let z = var(b, "z", &[1, 2, 1]);
        let w = b.tile(z, &[3, 1, 2]).unwrap();
        (vec![x, z], vec![y, w])
    });
}

#[test]
fn one_hot_labels_carry_no_gradient_but_the_loss_through_them_does() {
    case_fed(indices("labels", &[3], &[2.0, 0.0, 4.0]), |b| {
        let logits = var(b, "logits", &[3, 5]);
        let labels = b.placeholder("labels", DType::I32, [Some(3)]).unwrap();
        let y = b.one_hot(labels, 5, 0.9, 0.025).unwrap();
        let xent = b.softmax_cross_entropy_with_logits(logits, y).unwrap();
        let masked = b.mul(logits, y).unwrap();
        (vec![logits], vec![xent, masked])
    });
}
