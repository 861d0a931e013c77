//! The top-k bodies against hand-computed rows: ties, NaN, the boundary.

use super::*;

/// Row 0 `[1, 3, 3, -1]`: values 3, 3 at columns 1, 2 (ties by lower
/// column), then 1. Row 1 `[NaN, 2, inf, -0, 0]`: NaN first, then inf, 2,
/// then -0 at column 3 before +0 at column 4 (equal values).
#[test]
fn top_k_sorts_larger_first_ties_by_column_nan_first() {
    let x = [1.0, 3.0, 3.0, -1.0];
    let (mut v, mut i) = ([0.0; 3], [0; 3]);
    top_k(&x, 4, 3, &mut v, &mut i);
    assert_eq!((v, i), ([3.0, 3.0, 1.0], [1, 2, 0]));
    let x = [f32::NAN, 2.0, f32::INFINITY, -0.0, 0.0];
    let (mut v, mut i) = ([0.0; 5], [0; 5]);
    top_k(&x, 5, 5, &mut v, &mut i);
    assert_eq!(i, [0, 2, 1, 3, 4]);
    assert!(v[0].is_nan() && v[1] == f32::INFINITY && v[2] == 2.0);
    assert!(v[3].is_sign_negative() && v[4].is_sign_positive());
    // k = 1 is the argmax with the first maximum.
    let x = [0.5, 0.7, 0.7, 0.1, 9.0, 9.0];
    let (mut v, mut i) = ([0.0; 2], [0; 2]);
    top_k(&x, 3, 1, &mut v, &mut i);
    assert_eq!((v, i), ([0.7, 9.0], [1, 1]));
}

/// A random row's top k equals the first k of a full stable sort.
#[test]
fn top_k_is_the_first_k_of_a_stable_sort() {
    let mut s = 17u64;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        // Few distinct values, so ties are common.
        ((s >> 33) % 7) as f32 - 3.0
    };
    let (rows, cols, k) = (5, 23, 9);
    let x: Vec<f32> = (0..rows * cols).map(|_| next()).collect();
    let (mut v, mut i) = (vec![0.0; rows * k], vec![0; rows * k]);
    top_k(&x, cols, k, &mut v, &mut i);
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mut order: Vec<usize> = (0..cols).collect();
        order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap());
        let want: Vec<i32> = order[..k].iter().map(|&c| c as i32).collect();
        assert_eq!(&i[r * k..(r + 1) * k], &want[..], "row {r}");
    }
}

/// TF's `InTopK`: row `[0.1, 0.5, 0.5, 0.2]` has two classes at 0.5, so at
/// k = 1 target 1 and target 2 are both in (no class is strictly larger),
/// target 3 (two larger) is in at k = 3 only; a target outside [0, 4) and
/// a row holding NaN or inf are false whatever k.
#[test]
fn in_top_k_counts_strictly_larger_and_refuses_non_finite_rows() {
    let row = [0.1, 0.5, 0.5, 0.2];
    let at = |t: i32, k: usize, r: &[f32]| {
        let mut o = [7];
        in_top_k(r, &[t], 4, k, &mut o);
        o[0]
    };
    assert_eq!([at(1, 1, &row), at(2, 1, &row), at(3, 1, &row), at(0, 1, &row)], [1, 1, 0, 0]);
    assert_eq!([at(3, 2, &row), at(3, 3, &row), at(0, 3, &row), at(0, 4, &row)], [0, 1, 0, 1]);
    assert_eq!([at(-1, 4, &row), at(4, 4, &row), at(1, 0, &row)], [0, 0, 0]);
    let nan = [0.1, f32::NAN, 0.5, 0.2];
    let inf = [0.1, 0.2, 0.5, f32::NEG_INFINITY];
    assert_eq!([at(2, 4, &nan), at(1, 4, &nan), at(2, 4, &inf)], [0, 0, 0]);
    // Several rows at once.
    let mut o = [9; 2];
    in_top_k(&[1.0, 2.0, 3.0, 3.0, 2.0, 1.0], &[2, 2], 3, 1, &mut o);
    assert_eq!(o, [1, 0]);
}

/// dx is zero but at the picked columns, which get their dvalues.
#[test]
fn top_k_grad_scatters_to_the_indices() {
    let mut dx = [9.0; 6];
    top_k_grad(&[1.0, 2.0, 3.0, 4.0], &[2, 0, 1, 2], 3, 2, &mut dx).unwrap();
    assert_eq!(dx, [2.0, 0.0, 1.0, 0.0, 3.0, 4.0]);
    let e = top_k_grad(&[1.0, 2.0], &[3, 0], 3, 2, &mut dx).unwrap_err();
    assert_eq!(e.to_string(), "top_k_grad: indices[0] = 3 is not in [0, 3)");
}
