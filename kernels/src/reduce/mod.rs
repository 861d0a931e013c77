//! Reductions, argmax, comparison and casts.
//!
//! Reductions take the input shape (rank <= 4) and a set of axes; the
//! output holds the kept axes in order (identical data with or without TF's
//! `keep_dims`). Adjacent axes with the same role are merged first, so the
//! loops see at most four alternating kept/reduced runs; a reduced innermost
//! run is summed with eight independent accumulators (vectorizes, and
//! bounds rounding error growth better than one running sum).
//!
//! `equal` writes a **bool** (`i32` 0/1), the output dtype of the graph's
//! `Equal` (a `Cast` to f32 then makes an accuracy); `argmax` writes **i32**
//! indices; `cast` converts between any two dtypes.
//!
//! SIMD: plain loops, compiled once for the crate's baseline target (the
//! eight partial sums of [`sum_slice`] are a fixed layout that the compiler
//! maps onto two SSE vectors), so they run the same instructions whatever
//! [`crate::simd`] path the process selected: **bit-identical on every
//! path**. Not rewritten over `pulp`: in the seed models they reduce the
//! loss and the accuracy (a few hundred floats a step); a wider body would
//! have to emulate the 8-sum layout on 16 lanes to keep the bits.

pub mod desc;
use crate::dtype::{DType, Slice, SliceMut};
use crate::shape::{merge_runs, pad4};
use crate::KernelError;

/// Sum of a contiguous slice with eight partial sums.
#[inline]
pub(crate) fn sum_slice(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] += c[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for v in rest {
        s += *v;
    }
    s
}

/// Sums `x` (padded shape `dims`) over the axes with `reduced[i]` set into
/// `out`, which holds the kept axes in order. `out` is overwritten.
pub(crate) fn sum_flags(x: &[f32], dims: [usize; 4], reduced: [bool; 4], out: &mut [f32]) {
    let (d, f) = merge_runs(dims, reduced);
    out.fill(0.0);
    if x.is_empty() {
        return;
    }
    // Strides of x (dense) and of out (0 along reduced axes).
    let mut os = [0usize; 4];
    let mut acc = 1;
    for i in (0..4).rev() {
        if !f[i] {
            os[i] = acc;
            acc *= d[i];
        }
    }
    let d3 = d[3];
    let mut xi = 0;
    for i0 in 0..d[0] {
        for i1 in 0..d[1] {
            for i2 in 0..d[2] {
                let ob = i0 * os[0] + i1 * os[1] + i2 * os[2];
                let row = &x[xi..xi + d3];
                if f[3] {
                    out[ob] += sum_slice(row);
                } else {
                    for (o, v) in out[ob..ob + d3].iter_mut().zip(row) {
                        *o += *v;
                    }
                }
                xi += d3;
            }
        }
    }
}

fn axis_flags(
    op: &'static str,
    shape: &[usize],
    axes: &[usize],
) -> Result<([usize; 4], [bool; 4], usize), KernelError> {
    let dims = pad4(op, shape)?;
    let off = 4 - shape.len();
    let mut flags = [false; 4];
    let mut count = 1;
    for &a in axes {
        if a >= shape.len() || flags[off + a] {
            return Err(KernelError::BadAxis { op, axis: a, rank: shape.len() });
        }
        flags[off + a] = true;
        count *= shape[a];
    }
    Ok((dims, flags, count))
}

/// `out = sum(x, axes)`; `x: shape`, `out`: the kept axes of `shape`.
/// Errors: an axis out of range or repeated, or rank > 4.
pub fn reduce_sum(x: &[f32], shape: &[usize], axes: &[usize], out: &mut [f32]) -> Result<(), KernelError> {
    let (dims, flags, count) = axis_flags("reduce_sum", shape, axes)?;
    debug_assert_eq!(x.len(), dims.iter().product::<usize>());
    debug_assert_eq!(out.len() * count, x.len());
    sum_flags(x, dims, flags, out);
    Ok(())
}

/// `out = mean(x, axes)`: [`reduce_sum`] divided by the number of reduced
/// elements (NaN when that number is 0, as TF).
pub fn reduce_mean(x: &[f32], shape: &[usize], axes: &[usize], out: &mut [f32]) -> Result<(), KernelError> {
    let (dims, flags, count) = axis_flags("reduce_mean", shape, axes)?;
    debug_assert_eq!(x.len(), dims.iter().product::<usize>());
    sum_flags(x, dims, flags, out);
    let inv = 1.0 / count as f32;
    out.iter_mut().for_each(|v| *v *= inv);
    Ok(())
}

/// `out = max(x, axes)` (`min` when `min`), TF's `Max`/`Min`: a NaN among
/// the reduced elements gives NaN (it propagates, as `tf.reduce_max` on
/// GPU); `+0.0` beats `-0.0` for the maximum (`-0.0` for the minimum), so
/// the result does not depend on the order of the elements and the CUDA
/// twin's tree gives the same bits; an empty reduction gives `-inf`
/// (`+inf` for the minimum), the identity, as TF. Errors as [`reduce_sum`].
pub fn reduce_extreme(
    x: &[f32],
    shape: &[usize],
    axes: &[usize],
    min: bool,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let op = if min { "reduce_min" } else { "reduce_max" };
    let (dims, flags, _) = axis_flags(op, shape, axes)?;
    debug_assert_eq!(x.len(), dims.iter().product::<usize>());
    // Strides of out over the padded axes: 0 along reduced ones.
    let mut os = [0usize; 4];
    let mut acc = 1;
    for i in (0..4).rev() {
        if !flags[i] {
            os[i] = acc;
            acc *= dims[i];
        }
    }
    debug_assert_eq!(out.len(), acc);
    out.fill(if min { f32::INFINITY } else { f32::NEG_INFINITY });
    let mut xi = 0;
    for i0 in 0..dims[0] {
        for i1 in 0..dims[1] {
            for i2 in 0..dims[2] {
                for i3 in 0..dims[3] {
                    let o = &mut out[i0 * os[0] + i1 * os[1] + i2 * os[2] + i3 * os[3]];
                    *o = extreme(*o, x[xi], min);
                    xi += 1;
                }
            }
        }
    }
    Ok(())
}

/// The maximum (minimum when `min`) of `a` and `b` as [`reduce_extreme`]
/// takes it: NaN wins, and a signed zero is ordered `-0.0 < +0.0`, so the
/// fold is commutative and associative bit for bit (the CUDA twin's
/// `extreme` in `reduce.cu` is the same expression).
#[inline]
pub(crate) fn extreme(a: f32, b: f32, min: bool) -> f32 {
    if a.is_nan() {
        return a;
    }
    if b.is_nan() {
        return b;
    }
    let b_wins = if a == b {
        // Only a pair of zeros of different signs tells apart.
        a.is_sign_negative() != min && b.is_sign_negative() == min
    } else {
        (b > a) != min
    };
    if b_wins {
        b
    } else {
        a
    }
}

/// `out[o, i] = argmax_j x[o, j, i]` over `axis` of `x: shape`, as i32.
/// Ties go to the first index; NaN is never chosen over a number.
/// `out` holds the shape without `axis`. Errors: bad axis, or an axis
/// longer than `i32::MAX`.
pub fn argmax(x: &[f32], shape: &[usize], axis: usize, out: &mut [i32]) -> Result<(), KernelError> {
    if axis >= shape.len() || shape[axis] > i32::MAX as usize {
        return Err(KernelError::BadAxis { op: "argmax", axis, rank: shape.len() });
    }
    let outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    debug_assert_eq!(x.len(), outer * len * inner);
    debug_assert_eq!(out.len(), outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let base = o * len * inner + i;
            let mut best = f32::NEG_INFINITY;
            let mut at = 0usize;
            for j in 0..len {
                let v = x[base + j * inner];
                if v > best {
                    best = v;
                    at = j;
                }
            }
            out[o * inner + i] = at as i32;
        }
    }
    Ok(())
}

/// `out[i] = (a[i] == b[i])` as a bool (`i32` 0 or 1), `Kernel::Equal`.
/// `a` and `b` have one storage type (f32 compares as floats: `NaN != NaN`,
/// `0.0 == -0.0`); mixed storage types compare as unequal everywhere.
pub fn equal(a: Slice<'_>, b: Slice<'_>, out: &mut [i32]) {
    debug_assert!(a.len() == b.len() && a.len() == out.len());
    match (a, b) {
        (Slice::F32(a), Slice::F32(b)) => {
            out.iter_mut().zip(a.iter().zip(b)).for_each(|(r, (x, y))| *r = (x == y) as i32)
        }
        (Slice::I32(a), Slice::I32(b)) => {
            out.iter_mut().zip(a.iter().zip(b)).for_each(|(r, (x, y))| *r = (x == y) as i32)
        }
        _ => out.fill(0),
    }
}

/// `out[i] = a[i] cmp b[i]` as a bool (`i32` 0 or 1), `Kernel::Compare`
/// (f32 with IEEE rules: a NaN compares false, except `!=`); mixed storage
/// types write 0 everywhere, as [`equal`].
pub fn compare(cmp: crate::Comparison, a: Slice<'_>, b: Slice<'_>, out: &mut [i32]) {
    debug_assert!(a.len() == b.len() && a.len() == out.len());
    match (a, b) {
        (Slice::F32(a), Slice::F32(b)) => {
            out.iter_mut().zip(a.iter().zip(b)).for_each(|(r, (x, y))| *r = cmp.apply_f32(*x, *y) as i32)
        }
        (Slice::I32(a), Slice::I32(b)) => {
            out.iter_mut().zip(a.iter().zip(b)).for_each(|(r, (x, y))| *r = cmp.apply_i32(*x, *y) as i32)
        }
        _ => out.fill(0),
    }
}

/// `out[i] = x[i]` where `cond[i / inner]`, else `y[i]` (`Kernel::Select`,
/// TF1's `tf.where`): only the selected value is copied, so a NaN or inf in
/// the other operand never reaches `out`.
pub fn select(cond: &[i32], x: &[f32], y: &[f32], inner: usize, out: &mut [f32]) {
    debug_assert!(x.len() == y.len() && x.len() == out.len() && cond.len() * inner == x.len());
    for (i, o) in out.iter_mut().enumerate() {
        *o = if cond[i / inner] != 0 { x[i] } else { y[i] };
    }
}

/// `y = x` converted to `to` (`Kernel::Cast`), TF's `Cast`:
/// - to f32: exact for integers up to 2^24, then round-to-nearest;
/// - f32 to i32: truncation toward zero; out-of-range values saturate and
///   NaN gives 0 (Rust `as` semantics; TF leaves those cases implementation-defined);
/// - to bool: `x != 0`; i32 and bool to i32: the value.
///
/// `y`'s storage type is `to`'s (`I32` for bool); a mismatch writes nothing.
pub fn cast(x: Slice<'_>, to: DType, y: SliceMut<'_>) {
    debug_assert_eq!(
        x.len(),
        match &y {
            SliceMut::F32(y) => y.len(),
            SliceMut::I32(y) => y.len(),
        }
    );
    match (x, to, y) {
        (Slice::F32(x), DType::F32, SliceMut::F32(y)) => y.copy_from_slice(x),
        (Slice::F32(x), DType::I32, SliceMut::I32(y)) => y.iter_mut().zip(x).for_each(|(o, v)| *o = *v as i32),
        (Slice::F32(x), DType::Bool, SliceMut::I32(y)) => {
            y.iter_mut().zip(x).for_each(|(o, v)| *o = (*v != 0.0) as i32)
        }
        (Slice::I32(x), DType::F32, SliceMut::F32(y)) => y.iter_mut().zip(x).for_each(|(o, v)| *o = *v as f32),
        (Slice::I32(x), DType::I32, SliceMut::I32(y)) => y.copy_from_slice(x),
        (Slice::I32(x), DType::Bool, SliceMut::I32(y)) => y.iter_mut().zip(x).for_each(|(o, v)| *o = (*v != 0) as i32),
        _ => debug_assert!(false, "cast: output storage does not match {to}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::numel;
    use crate::testutil::{assert_close, Lcg};

    /// Reference: walk every multi-index, drop the reduced coordinates to
    /// get the output index, accumulate in f64.
    fn naive_sum(x: &[f32], shape: &[usize], axes: &[usize]) -> Vec<f32> {
        let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
        let on: usize = kept.iter().map(|&a| shape[a]).product();
        let mut out = vec![0.0f64; on];
        for (flat, v) in x.iter().enumerate() {
            let mut rem = flat;
            let mut idx = vec![0; shape.len()];
            for a in (0..shape.len()).rev() {
                idx[a] = rem % shape[a];
                rem /= shape[a];
            }
            let mut o = 0;
            for &a in &kept {
                o = o * shape[a] + idx[a];
            }
            out[o] += *v as f64;
        }
        out.into_iter().map(|v| v as f32).collect()
    }

    #[test]
    fn reductions_match_reference() {
        let mut r = Lcg::new(61);
        let cases: &[(&[usize], &[usize])] = &[
            (&[3, 4], &[0]),
            (&[3, 4], &[1]),
            (&[3, 4], &[0, 1]),
            (&[2, 3, 4, 5], &[0, 1, 2]),
            (&[2, 3, 4, 5], &[1, 3]),
            (&[2, 3, 4, 5], &[0, 2]),
            (&[2, 3, 4, 5], &[3, 0]),
            (&[2, 1, 4, 37], &[1, 3]),
            (&[7], &[0]),
            (&[5, 6], &[]),
        ];
        for &(shape, axes) in cases {
            let x = r.vec(numel(shape));
            let want = naive_sum(&x, shape, axes);
            let mut out = vec![f32::NAN; want.len()];
            reduce_sum(&x, shape, axes, &mut out).unwrap();
            assert_close(&out, &want, 1e-5, &format!("sum {shape:?} {axes:?}"));
            let count = x.len() / want.len();
            reduce_mean(&x, shape, axes, &mut out).unwrap();
            let want: Vec<f32> = want.iter().map(|v| v / count as f32).collect();
            assert_close(&out, &want, 1e-5, &format!("mean {shape:?} {axes:?}"));
        }
        let mut out = vec![0.0; 4];
        assert!(reduce_sum(&[0.0; 12], &[3, 4], &[2], &mut out).is_err());
        assert!(reduce_sum(&[0.0; 12], &[3, 4], &[0, 0], &mut out).is_err());
    }

    #[test]
    fn compare_and_select() {
        use crate::Comparison::*;
        let a = [1.0, 2.0, f32::NAN, -0.0];
        let b = [2.0, 2.0, 1.0, 0.0];
        let mut out = [9; 4];
        for (cmp, want) in [
            (Greater, [0, 0, 0, 0]),
            (GreaterEqual, [0, 1, 0, 1]),
            (Less, [1, 0, 0, 0]),
            (LessEqual, [1, 1, 0, 1]),
            (NotEqual, [1, 0, 1, 0]),
        ] {
            compare(cmp, Slice::F32(&a), Slice::F32(&b), &mut out);
            assert_eq!(out, want, "{cmp:?}");
        }
        compare(Greater, Slice::I32(&[3, -1]), Slice::I32(&[2, 0]), &mut out[..2]);
        assert_eq!(out[..2], [1, 0]);
        // Elementwise, and rows of 2 selected by a vector; the NaN and inf
        // of the unselected side never show.
        let (x, y) = ([1.0, f32::NAN, 3.0, 4.0], [f32::INFINITY, 20.0, 30.0, 40.0]);
        let mut o = [0.0; 4];
        select(&[1, 0, 1, 1], &x, &y, 1, &mut o);
        assert_eq!(o, [1.0, 20.0, 3.0, 4.0]);
        select(&[0, 1], &x, &y, 2, &mut o);
        assert_eq!(o, [f32::INFINITY, 20.0, 3.0, 4.0]);
    }

    #[test]
    fn reduce_max_and_min_over_axes() {
        // [2, 3]: rows [1, 5, -2] and [0, -0.0, 3].
        let x = [1.0, 5.0, -2.0, 0.0, -0.0, 3.0];
        let mut out = [9.0; 2];
        reduce_extreme(&x, &[2, 3], &[1], false, &mut out).unwrap();
        assert_eq!(out, [5.0, 3.0]);
        reduce_extreme(&x, &[2, 3], &[1], true, &mut out).unwrap();
        assert_eq!(out, [-2.0, -0.0]);
        let mut out = [9.0; 3];
        reduce_extreme(&x, &[2, 3], &[0], false, &mut out).unwrap();
        assert_eq!(out, [1.0, 5.0, 3.0]);
        // Signed zeros: the max is +0 and the min -0 in either order.
        for pair in [[0.0f32, -0.0], [-0.0, 0.0]] {
            let mut o = [9.0];
            reduce_extreme(&pair, &[2], &[0], false, &mut o).unwrap();
            assert!(o[0] == 0.0 && o[0].is_sign_positive());
            reduce_extreme(&pair, &[2], &[0], true, &mut o).unwrap();
            assert!(o[0] == 0.0 && o[0].is_sign_negative());
        }
        // NaN propagates; an empty reduction is the identity.
        let mut o = [0.0];
        reduce_extreme(&[1.0, f32::NAN, 2.0], &[3], &[0], false, &mut o).unwrap();
        assert!(o[0].is_nan());
        reduce_extreme(&[], &[0], &[0], false, &mut o).unwrap();
        assert_eq!(o[0], f32::NEG_INFINITY);
        reduce_extreme(&[], &[0], &[0], true, &mut o).unwrap();
        assert_eq!(o[0], f32::INFINITY);
        // Random [3, 4, 5] over axes {0, 2} against a direct scan.
        let mut r = Lcg::new(7);
        let x = r.vec(60);
        let mut out = vec![0.0; 4];
        reduce_extreme(&x, &[3, 4, 5], &[2, 0], false, &mut out).unwrap();
        for j in 0..4 {
            let m = (0..3).flat_map(|a| (0..5).map(move |c| (a, c))).map(|(a, c)| x[a * 20 + j * 5 + c]);
            assert_eq!(out[j], m.fold(f32::NEG_INFINITY, f32::max));
        }
        assert!(reduce_extreme(&x, &[3, 4, 5], &[1, 1], false, &mut out).is_err());
    }

    #[test]
    fn argmax_first_on_ties_and_axes() {
        // [2, 3]: axis 1.
        let x = [1.0, 3.0, 3.0, -1.0, -2.0, -1.0];
        let mut out = [9; 2];
        argmax(&x, &[2, 3], 1, &mut out).unwrap();
        assert_eq!(out, [1, 0]);
        // axis 0 of [2, 3].
        let mut out = [9; 3];
        argmax(&x, &[2, 3], 0, &mut out).unwrap();
        assert_eq!(out, [0, 0, 0]);
        // Random [3, 4, 5] along axis 1 against a direct scan.
        let mut r = Lcg::new(62);
        let x = r.vec(60);
        let mut out = vec![0; 15];
        argmax(&x, &[3, 4, 5], 1, &mut out).unwrap();
        for o in 0..3 {
            for i in 0..5 {
                let col: Vec<f32> = (0..4).map(|j| x[o * 20 + j * 5 + i]).collect();
                let m = col.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                assert_eq!(out[o * 5 + i], col.iter().position(|v| *v == m).unwrap() as i32);
            }
        }
        assert!(argmax(&x, &[3, 4, 5], 3, &mut out).is_err());
    }

    #[test]
    fn equal_and_casts() {
        let mut b = [7; 3];
        equal(Slice::F32(&[1.0, 2.0, 3.0]), Slice::F32(&[1.0, 0.0, 3.0]), &mut b);
        assert_eq!(b, [1, 0, 1]);
        equal(Slice::I32(&[1, 2, 3]), Slice::I32(&[0, 2, 3]), &mut b);
        assert_eq!(b, [0, 1, 1]);
        let mut o = [0.0; 3];
        cast(Slice::I32(&[-4, 0, 7]), DType::F32, SliceMut::F32(&mut o));
        assert_eq!(o, [-4.0, 0.0, 7.0]);
        let mut i = [0; 3];
        cast(Slice::F32(&[-1.7, 0.5, 2.9]), DType::I32, SliceMut::I32(&mut i));
        assert_eq!(i, [-1, 0, 2]);
        cast(Slice::F32(&[-1.7, 0.0, 2.9]), DType::Bool, SliceMut::I32(&mut i));
        assert_eq!(i, [1, 0, 1]);
        cast(Slice::I32(&[-4, 0, 7]), DType::Bool, SliceMut::I32(&mut i));
        assert_eq!(i, [1, 0, 1]);
        cast(Slice::F32(&[1.5, -2.0, 0.0]), DType::F32, SliceMut::F32(&mut o));
        assert_eq!(o, [1.5, -2.0, 0.0]);
    }
}
