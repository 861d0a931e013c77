//! `bias_add` over the last axis (NHWC `[N, H, W, C]` or `[N, C]`: any
//! tensor viewed as `[rows, C]`) and its gradient.

/// `y[r, c] = x[r, c] + bias[c]`; `x, y: [rows, C]` with `C = bias.len()`.
pub fn bias_add(x: &[f32], bias: &[f32], y: &mut [f32]) {
    let c = bias.len();
    debug_assert_eq!(x.len(), y.len());
    debug_assert_eq!(x.len() % c.max(1), 0);
    if c == 0 {
        return;
    }
    for (orow, xrow) in y.chunks_exact_mut(c).zip(x.chunks_exact(c)) {
        for ((o, v), b) in orow.iter_mut().zip(xrow).zip(bias) {
            *o = *v + *b;
        }
    }
}

/// `db[c] = sum_r dy[r, c]`; `dy: [rows, C]`, `db: [C]` (overwritten).
pub fn bias_add_grad(dy: &[f32], db: &mut [f32]) {
    let c = db.len();
    debug_assert_eq!(dy.len() % c.max(1), 0);
    db.fill(0.0);
    if c == 0 {
        return;
    }
    for row in dy.chunks_exact(c) {
        for (o, v) in db.iter_mut().zip(row) {
            *o += *v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_close, Lcg};

    #[test]
    fn bias_add_and_grad() {
        let mut r = Lcg::new(51);
        let (rows, c) = (7, 5);
        let x = r.vec(rows * c);
        let b = r.vec(c);
        let mut y = vec![0.0; rows * c];
        bias_add(&x, &b, &mut y);
        for i in 0..rows * c {
            assert_eq!(y[i], x[i] + b[i % c]);
        }
        let mut db = vec![f32::NAN; c];
        bias_add_grad(&x, &mut db);
        let want: Vec<f32> = (0..c).map(|j| (0..rows).map(|i| x[i * c + j] as f64).sum::<f64>() as f32).collect();
        assert_close(&db, &want, 1e-6, "bias grad");
    }
}
