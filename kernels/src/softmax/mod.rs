//! Softmax family over the last axis: every tensor is viewed as
//! `[rows, C]` with `C` passed explicitly (`C >= 1`).
//!
//! Numerical stability: each row is shifted by its maximum before `exp`,
//! and `log_softmax = (x - max) - log(sum(exp(x - max)))`.
//!
//! Cross-entropy kernels follow TF's `SoftmaxCrossEntropyWithLogits`: one
//! pass gives the per-example loss `[rows]` and the backprop
//! `[rows, C] = softmax(logits) - labels`. The sparse form validates every
//! label first and returns [`KernelError::LabelOutOfRange`] without writing
//! anything when one is outside `[0, C)`.
//!
//! SIMD: plain loops, compiled once for the crate's baseline target, so
//! they run the same instructions whatever [`crate::simd`] path the process
//! selected: **bit-identical on every path**. They stay plain on purpose:
//! `exp` and `ln` are `f32::exp` / `f32::ln` per element (no vector form
//! here gives libm's bits), the row sums run in index order, and the rows
//! are short (the seed models' logits are `[256, 10]`: the whole family is
//! a few microseconds a step).

pub mod desc;
use crate::KernelError;

/// Writes `row - max(row)` into `out` and returns `log(sum(exp(...)))`.
#[inline]
fn shifted_lse(row: &[f32], out: &mut [f32]) -> f32 {
    let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let m = if m.is_finite() { m } else { 0.0 };
    let mut s = 0.0f32;
    for (o, v) in out.iter_mut().zip(row) {
        *o = *v - m;
        s += o.exp();
    }
    s.ln()
}

/// `y = softmax(x)` row-wise; `x, y: [rows, c]`.
pub fn softmax(x: &[f32], c: usize, y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    debug_assert_eq!(x.len() % c.max(1), 0);
    for (xr, yr) in x.chunks_exact(c.max(1)).zip(y.chunks_exact_mut(c.max(1))) {
        let m = xr.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let m = if m.is_finite() { m } else { 0.0 };
        let mut s = 0.0f32;
        for (o, v) in yr.iter_mut().zip(xr) {
            *o = (*v - m).exp();
            s += *o;
        }
        let inv = 1.0 / s;
        yr.iter_mut().for_each(|v| *v *= inv);
    }
}

/// `y = log_softmax(x)` row-wise; `x, y: [rows, c]`.
pub fn log_softmax(x: &[f32], c: usize, y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    debug_assert_eq!(x.len() % c.max(1), 0);
    for (xr, yr) in x.chunks_exact(c.max(1)).zip(y.chunks_exact_mut(c.max(1))) {
        let lse = shifted_lse(xr, yr);
        yr.iter_mut().for_each(|v| *v -= lse);
    }
}

/// `dx = y * (dy - sum(dy * y))` row-wise, `y = softmax(x)`.
pub fn softmax_grad(dy: &[f32], y: &[f32], c: usize, dx: &mut [f32]) {
    debug_assert!(dy.len() == y.len() && dy.len() == dx.len());
    let c = c.max(1);
    for ((gr, yr), dr) in dy.chunks_exact(c).zip(y.chunks_exact(c)).zip(dx.chunks_exact_mut(c)) {
        let s: f32 = gr.iter().zip(yr).map(|(g, v)| g * v).sum();
        for ((o, g), v) in dr.iter_mut().zip(gr).zip(yr) {
            *o = *v * (*g - s);
        }
    }
}

/// `dx = dy - exp(y) * sum(dy)` row-wise, `y = log_softmax(x)`.
pub fn log_softmax_grad(dy: &[f32], y: &[f32], c: usize, dx: &mut [f32]) {
    debug_assert!(dy.len() == y.len() && dy.len() == dx.len());
    let c = c.max(1);
    for ((gr, yr), dr) in dy.chunks_exact(c).zip(y.chunks_exact(c)).zip(dx.chunks_exact_mut(c)) {
        let s: f32 = gr.iter().sum();
        for ((o, g), v) in dr.iter_mut().zip(gr).zip(yr) {
            *o = *g - v.exp() * s;
        }
    }
}

/// Sparse softmax cross-entropy. `logits: [rows, c]`, `labels: [rows]`
/// (class indices), `loss: [rows]` with
/// `loss[r] = log(sum exp(logits[r])) - logits[r, labels[r]]`,
/// `backprop: [rows, c] = softmax(logits) - one_hot(labels)`.
pub fn sparse_softmax_cross_entropy(
    logits: &[f32],
    labels: &[i32],
    c: usize,
    loss: &mut [f32],
    backprop: &mut [f32],
) -> Result<(), KernelError> {
    debug_assert_eq!(logits.len(), labels.len() * c);
    debug_assert_eq!(loss.len(), labels.len());
    debug_assert_eq!(backprop.len(), logits.len());
    const OP: &str = "sparse_softmax_cross_entropy_with_logits";
    if let Some((example, &label)) = labels.iter().enumerate().find(|(_, &l)| l < 0 || l as usize >= c) {
        return Err(KernelError::LabelOutOfRange { op: OP, example, label, classes: c });
    }
    if labels.is_empty() {
        return Ok(());
    }
    for (((lr, br), l), label) in
        logits.chunks_exact(c).zip(backprop.chunks_exact_mut(c)).zip(loss.iter_mut()).zip(labels)
    {
        // br holds log_softmax first, then is turned into softmax - onehot.
        let lse = shifted_lse(lr, br);
        let k = *label as usize;
        *l = lse - br[k];
        for v in br.iter_mut() {
            *v = (*v - lse).exp();
        }
        br[k] -= 1.0;
    }
    Ok(())
}

/// The sparse cross-entropy with the readers of its outputs that lowering
/// fuses into it: `loss` as [`sparse_softmax_cross_entropy`], `mean[0]`
/// their mean (as `reduce_mean` computes it), `dlogits = scale * backprop`
/// (the backward pass's scaling of the gradient) and `db` the column sums
/// of `dlogits` (the logits' bias gradient, as `bias_add_grad`): one launch
/// for four kernels, bit for bit their results.
#[allow(clippy::too_many_arguments)]
pub fn sparse_softmax_xent_mean_grad(
    logits: &[f32],
    labels: &[i32],
    c: usize,
    scale: f32,
    loss: &mut [f32],
    mean: &mut [f32],
    dlogits: &mut [f32],
    db: &mut [f32],
) -> Result<(), KernelError> {
    sparse_softmax_cross_entropy(logits, labels, c, loss, dlogits)?;
    crate::reduce::reduce_mean(loss, &[loss.len()], &[0], mean)?;
    for v in dlogits.iter_mut() {
        *v *= scale;
    }
    crate::elementwise::bias_add_grad(dlogits, db);
    Ok(())
}

/// Dense softmax cross-entropy. `logits, labels: [rows, c]` (each label
/// row a distribution, e.g. one-hot), `loss: [rows]` with
/// `loss[r] = -sum_j labels[r, j] * log_softmax(logits)[r, j]`,
/// `backprop: [rows, c] = softmax(logits) - labels`.
pub fn softmax_cross_entropy(logits: &[f32], labels: &[f32], c: usize, loss: &mut [f32], backprop: &mut [f32]) {
    debug_assert_eq!(logits.len(), labels.len());
    debug_assert_eq!(backprop.len(), logits.len());
    debug_assert_eq!(loss.len() * c, logits.len());
    let c = c.max(1);
    for (((lr, yr), br), l) in
        logits.chunks_exact(c).zip(labels.chunks_exact(c)).zip(backprop.chunks_exact_mut(c)).zip(loss.iter_mut())
    {
        let lse = shifted_lse(lr, br);
        let mut s = 0.0f32;
        for (b, y) in br.iter_mut().zip(yr) {
            let logp = *b - lse;
            // TF multiplies even zero labels: 0 * -inf would be NaN there too,
            // but logp is finite for finite logits, so keep the plain form.
            s -= *y * logp;
            *b = logp.exp() - *y;
        }
        *l = s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_close, numeric_grad, Lcg};

    fn naive_softmax(x: &[f32], c: usize) -> Vec<f64> {
        x.chunks(c)
            .flat_map(|r| {
                let s: f64 = r.iter().map(|v| (*v as f64).exp()).sum();
                r.iter().map(move |v| (*v as f64).exp() / s).collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn forward_values_and_stability() {
        let mut r = Lcg::new(71);
        let (rows, c) = (5, 7);
        let x: Vec<f32> = r.vec(rows * c).iter().map(|v| v * 4.0).collect();
        let want = naive_softmax(&x, c);
        let mut y = vec![0.0; rows * c];
        softmax(&x, c, &mut y);
        assert_close(&y, &want.iter().map(|v| *v as f32).collect::<Vec<_>>(), 1e-6, "softmax");
        log_softmax(&x, c, &mut y);
        assert_close(&y, &want.iter().map(|v| v.ln() as f32).collect::<Vec<_>>(), 1e-5, "log_softmax");
        // Huge logits: no overflow.
        let mut y = [0.0; 2];
        softmax(&[1000.0, 1000.0], 2, &mut y);
        assert_eq!(y, [0.5, 0.5]);
        log_softmax(&[1000.0, 0.0], 2, &mut y);
        assert_eq!(y, [0.0, -1000.0]);
    }

    /// With `L = sum(f(x) * g)`: softmax_grad(g, y) and log_softmax_grad(g, y)
    /// must equal dL/dx; compared with central differences in f64.
    #[test]
    fn grads_match_finite_differences() {
        let mut r = Lcg::new(72);
        let (rows, c) = (3, 5);
        let x = r.vec(rows * c);
        let g = r.vec(rows * c);
        for log in [false, true] {
            let f = |x: &[f32], y: &mut [f32]| {
                if log {
                    log_softmax(x, c, y)
                } else {
                    softmax(x, c, y)
                }
            };
            let mut y = vec![0.0; rows * c];
            f(&x, &mut y);
            let mut dx = vec![0.0; rows * c];
            if log {
                log_softmax_grad(&g, &y, c, &mut dx)
            } else {
                softmax_grad(&g, &y, c, &mut dx)
            }
            let want = numeric_grad(&x, 1e-3, |x| {
                let mut y = vec![0.0; rows * c];
                f(x, &mut y);
                y.iter().zip(&g).map(|(a, b)| *a as f64 * *b as f64).sum()
            });
            assert_close(&dx, &want, 2e-3, if log { "log_softmax grad" } else { "softmax grad" });
        }
    }

    /// loss = -sum(labels * log softmax(logits)); d loss / d logits =
    /// softmax - labels (labels summing to 1). Checked against finite
    /// differences of the returned loss, and sparse == dense with one-hot.
    #[test]
    fn cross_entropy() {
        let mut r = Lcg::new(73);
        let (rows, c) = (4, 6);
        let x: Vec<f32> = r.vec(rows * c).iter().map(|v| v * 3.0).collect();
        let labels = [2i32, 0, 5, 3];
        let mut onehot = vec![0.0; rows * c];
        for (i, l) in labels.iter().enumerate() {
            onehot[i * c + *l as usize] = 1.0;
        }
        let (mut l1, mut b1) = (vec![0.0; rows], vec![0.0; rows * c]);
        let (mut l2, mut b2) = (vec![0.0; rows], vec![0.0; rows * c]);
        sparse_softmax_cross_entropy(&x, &labels, c, &mut l1, &mut b1).unwrap();
        softmax_cross_entropy(&x, &onehot, c, &mut l2, &mut b2);
        assert_close(&l1, &l2, 1e-6, "loss sparse vs dense");
        assert_close(&b1, &b2, 1e-6, "backprop sparse vs dense");
        let sm = naive_softmax(&x, c);
        let want: Vec<f32> = (0..rows).map(|i| -(sm[i * c + labels[i] as usize].ln()) as f32).collect();
        assert_close(&l1, &want, 1e-5, "loss value");
        // Soft labels: finite differences of the total loss.
        let soft: Vec<f32> = naive_softmax(&r.vec(rows * c), c).iter().map(|v| *v as f32).collect();
        softmax_cross_entropy(&x, &soft, c, &mut l2, &mut b2);
        let want = numeric_grad(&x, 1e-3, |x| {
            let (mut l, mut b) = (vec![0.0; rows], vec![0.0; rows * c]);
            softmax_cross_entropy(x, &soft, c, &mut l, &mut b);
            l.iter().map(|v| *v as f64).sum()
        });
        assert_close(&b2, &want, 2e-3, "dense backprop");
    }

    #[test]
    fn bad_labels_are_errors() {
        let (mut l, mut b) = (vec![0.0; 2], vec![0.0; 6]);
        let e = sparse_softmax_cross_entropy(&[0.0; 6], &[1, 3], 3, &mut l, &mut b).unwrap_err();
        assert_eq!(
            e,
            KernelError::LabelOutOfRange {
                op: "sparse_softmax_cross_entropy_with_logits",
                example: 1,
                label: 3,
                classes: 3
            }
        );
        assert!(sparse_softmax_cross_entropy(&[0.0; 6], &[-1, 0], 3, &mut l, &mut b).is_err());
    }
}
