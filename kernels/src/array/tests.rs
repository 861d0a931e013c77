//! The array kernels on small hand-checked cases (values from
//! `numpy`/TF semantics written out by hand in each test).

use super::*;

fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

#[test]
fn one_hot_marks_the_index_and_leaves_out_of_range_rows_off() {
    let mut out = vec![9.0; 4 * 3];
    one_hot(&[2, 0, -1, 3], 3, 5.0, -1.0, &mut out);
    #[rustfmt::skip]
    let want = [-1.0, -1.0, 5.0,
                5.0, -1.0, -1.0,
                -1.0, -1.0, -1.0,
                -1.0, -1.0, -1.0];
    assert_eq!(out, want);
}

#[test]
fn transpose_follows_the_permutation() {
    // x = arange(6).reshape(2, 3); x.T = [[0, 3], [1, 4], [2, 5]].
    let mut y = vec![0.0; 6];
    transpose(&iota(6), &[2, 3], &[1, 0], &mut y).unwrap();
    assert_eq!(y, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    // y = np.transpose(x = arange(24).reshape(2, 3, 4), (2, 0, 1)): y[k, i, j] = x[i, j, k], y of shape [4, 2, 3].
    let mut y = vec![0.0; 24];
    transpose(&iota(24), &[2, 3, 4], &[2, 0, 1], &mut y).unwrap();
    assert_eq!(y[3 + 2], 20.0); // y[0, 1, 2] = x[1, 2, 0] = 12 + 8
    assert_eq!(y[6 + 3 + 2], 21.0); // y[1, 1, 2] = x[1, 2, 1]
    let e = transpose(&iota(6), &[2, 3], &[0, 0], &mut [0.0; 6]).unwrap_err();
    assert!(matches!(e, KernelError::BadAxis { .. }), "{e}");
    let e = transpose(&iota(32), &[2; 5], &[0, 1, 2, 3, 4], &mut [0.0; 32]).unwrap_err();
    assert!(matches!(e, KernelError::RankTooLarge { .. }), "{e}");
}

#[test]
fn pad_places_the_input_inside_the_constant() {
    // tf.pad([[1, 2], [3, 4]], [[1, 0], [0, 2]], constant_values=7).
    let mut y = vec![0.0; 3 * 4];
    pad(&[1.0, 2.0, 3.0, 4.0], &[2, 2], &[1, 0], &[3, 4], 7.0, &mut y).unwrap();
    #[rustfmt::skip]
    let want = [7.0, 7.0, 7.0, 7.0,
                1.0, 2.0, 7.0, 7.0,
                3.0, 4.0, 7.0, 7.0];
    assert_eq!(y, want);
    assert!(pad(&[1.0; 4], &[2, 2], &[2, 0], &[3, 4], 0.0, &mut [0.0; 12]).is_err());
}

#[test]
fn gather_and_its_gradient_along_a_middle_axis() {
    // params [2, 3, 2] = arange(12); gather(params, [2, 0, 2], axis=1).
    let mut out = vec![0.0; 2 * 3 * 2];
    gather(&iota(12), &[2, 0, 2], 2, 3, 2, &mut out).unwrap();
    assert_eq!(out, [4.0, 5.0, 0.0, 1.0, 4.0, 5.0, 10.0, 11.0, 6.0, 7.0, 10.0, 11.0]);
    // The gradient sums the rows of a repeated index and leaves row 1 zero.
    let mut d = vec![9.0; 12];
    gather_grad(&iota(12), &[2, 0, 2], 2, 3, 2, &mut d).unwrap();
    assert_eq!(d, [2.0, 3.0, 0.0, 0.0, 4.0, 6.0, 8.0, 9.0, 0.0, 0.0, 16.0, 18.0]);
}

#[test]
fn an_index_out_of_range_is_tfs_error_and_writes_nothing() {
    let mut out = vec![-3.0; 8];
    let e = gather(&iota(10), &[1, 2, 3, 12], 1, 10, 1, &mut out[..4]).unwrap_err();
    assert_eq!(e.to_string(), "gather: indices[3] = 12 is not in [0, 10)");
    assert!(out.iter().all(|&v| v == -3.0));
    let e = gather_grad(&iota(2), &[-1, 0], 1, 10, 1, &mut out).unwrap_err();
    assert_eq!(e.to_string(), "gather_grad: indices[0] = -1 is not in [0, 10)");
}

#[test]
fn tile_repeats_and_its_gradient_sums_the_copies() {
    // tf.tile([[1, 2]], [2, 3]) = [[1, 2, 1, 2, 1, 2]] twice.
    let mut y = vec![0.0; 12];
    tile(&[1.0, 2.0], &[1, 2], &[2, 3], &mut y).unwrap();
    assert_eq!(y, [1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
    // dx[j] = Σ over the 6 copies: j=0 takes 0+2+4+6+8+10, j=1 takes 1+3+...+11.
    let mut dx = vec![0.0; 2];
    tile_grad(&iota(12), &[1, 2], &[2, 3], &mut dx).unwrap();
    assert_eq!(dx, [30.0, 36.0]);
    assert!(tile(&[1.0, 2.0], &[1, 2], &[2], &mut y).is_err());
}
