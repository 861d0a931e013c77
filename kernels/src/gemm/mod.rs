//! Matrix products through the `gemm` crate (AVX-512/FMA microkernels via its
//! `x86-v4` feature, runtime-detected).
//!
//! Layout: every matrix is dense row-major in its *stored* form. A transposed
//! operand is read through swapped strides, never copied:
//! - `A` is stored `[m, k]`, or `[k, m]` when `trans_a`;
//! - `B` is stored `[k, n]`, or `[n, k]` when `trans_b`;
//! - `C` is `[m, n]`.
//!
//! `C = alpha * op(A) * op(B) + beta * C`. With `beta == 0` the old contents
//! of `C` are never read (so it may hold garbage, even NaN).
//!
//! `threads <= 1` runs on the calling thread (`Parallelism::None`); larger
//! values use `Parallelism::Rayon(threads)` on rayon's global pool.

pub mod desc;
use gemm::Parallelism;

/// Shape and scalars of one matrix product; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatMul {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
    pub threads: usize,
}

impl MatMul {
    /// `C = A * B` with `A: [m, k]`, `B: [k, n]`, single-threaded.
    pub fn new(m: usize, k: usize, n: usize) -> Self {
        MatMul { m, n, k, trans_a: false, trans_b: false, alpha: 1.0, beta: 0.0, threads: 1 }
    }
    /// Read `A` as stored `[k, m]`.
    pub fn trans_a(mut self, t: bool) -> Self {
        self.trans_a = t;
        self
    }
    /// Read `B` as stored `[n, k]`.
    pub fn trans_b(mut self, t: bool) -> Self {
        self.trans_b = t;
        self
    }
    /// Set `alpha` and `beta`.
    pub fn scale(mut self, alpha: f32, beta: f32) -> Self {
        self.alpha = alpha;
        self.beta = beta;
        self
    }
    /// Use `threads` rayon workers when `threads > 1`.
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }
}

/// `c = alpha * op(a) * op(b) + beta * c`; see [`MatMul`] and the module docs.
pub fn matmul(p: &MatMul, a: &[f32], b: &[f32], c: &mut [f32]) {
    matmul_rows(p, a, b, c, 0, p.m);
}

/// Rows `[lo, hi)` of [`matmul`]: `c_rows` holds those rows of `c` (`(hi -
/// lo) * n` elements); `a` and `b` are the whole operands. The `gemm`
/// crate picks its kernels by the row count too, so the bits of a row may
/// differ from [`matmul`]'s of all rows: a caller that needs one set of
/// bits always uses one split (as [`tower_matmul`] does).
pub fn matmul_rows(p: &MatMul, a: &[f32], b: &[f32], c_rows: &mut [f32], lo: usize, hi: usize) {
    let MatMul { m, n, k, .. } = *p;
    debug_assert!(lo <= hi && hi <= m, "matmul: rows {lo}..{hi} of {m}");
    debug_assert!(a.len() >= m * k, "matmul: a too short");
    debug_assert!(b.len() >= k * n, "matmul: b too short");
    let rows = hi - lo;
    debug_assert!(c_rows.len() >= rows * n, "matmul: c too short");
    if rows == 0 || n == 0 {
        return;
    }
    let c = &mut c_rows[..rows * n];
    if k == 0 {
        if p.beta == 0.0 {
            c.fill(0.0);
        } else {
            c.iter_mut().for_each(|v| *v *= p.beta);
        }
        return;
    }
    let (a_rs, a_cs) = if p.trans_a { (1, m as isize) } else { (k as isize, 1) };
    let (b_rs, b_cs) = if p.trans_b { (1, k as isize) } else { (n as isize, 1) };
    let par = parallelism(p.threads);
    // Row `lo` of op(a): element (lo, 0).
    let a = &a[lo * a_rs as usize..];
    // SAFETY: the pointers cover m*k (from row lo of op(a) on), k*n and
    // rows*n elements (asserted above in debug, the caller's contract in
    // release); strides address exactly those elements; `c` is a unique
    // borrow, not aliased by `a` or `b`.
    unsafe {
        gemm::gemm(
            rows,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            p.beta != 0.0,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            p.beta,
            p.alpha,
            false,
            false,
            false,
            par,
        );
    }
}

/// Shape of one [`batch_matmul`]: `batch` products of `mm`'s shape and
/// transposes; a `shared` operand is one matrix every product reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchGemm {
    pub batch: usize,
    pub mm: MatMul,
    pub shared_a: bool,
    pub shared_b: bool,
}

impl BatchGemm {
    /// The elements between consecutive matrices of a, b and c (0 for a
    /// shared operand): what a strided batched GEMM takes.
    pub fn strides(&self) -> (usize, usize, usize) {
        let MatMul { m, n, k, .. } = self.mm;
        (if self.shared_a { 0 } else { m * k }, if self.shared_b { 0 } else { k * n }, m * n)
    }
}

/// `c_i = alpha·op(a_i)·op(b_i) + beta·c_i` for every batch index `i`
/// (`Kernel::BatchMatMul`): one [`matmul`] per index, each the `gemm`
/// crate's blocked product on that index's matrices (read in place at
/// its stride, never copied), so an index's bits are the rank-2
/// product's of the same matrices.
pub fn batch_matmul(p: &BatchGemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    let (sa, sb, sc) = p.strides();
    if sc == 0 {
        return;
    }
    for (i, ci) in c.chunks_exact_mut(sc).take(p.batch).enumerate() {
        matmul(&p.mm, &a[i * sa..], &b[i * sb..], ci);
    }
}

/// Shape and weights of one [`tower_matmul`]: pair `i` is `op(a_i)` `[m,
/// ks[i]]` times `op(b_i)` `[ks[i], n]`, weighted by `weights[i]`.
#[derive(Debug, Clone, Copy)]
pub struct TowerGemm<'a> {
    pub m: usize,
    pub n: usize,
    pub ks: &'a [usize],
    pub trans_a: bool,
    pub trans_b: bool,
    pub weights: &'a [f32],
}

/// The row at which [`tower_matmul`] splits its output: half of `m`,
/// rounded down to a multiple of 8.
pub fn tower_matmul_split(m: usize) -> usize {
    (m / 2) & !7
}

/// Rows `[lo, hi)` of `c = Σ weights[i]·op(a_i)·op(b_i)` (`Kernel::TowerMatMul`)
/// into `c_rows`; `input(2i)` and `input(2i + 1)` are pair i's whole
/// operands. Pair 0 overwrites, every later pair accumulates (one GEMM each,
/// alpha = its weight). Allocates nothing.
pub fn tower_matmul_rows<'x>(
    p: &TowerGemm<'_>,
    input: impl Fn(usize) -> &'x [f32],
    c_rows: &mut [f32],
    lo: usize,
    hi: usize,
) {
    for (i, (&k, &w)) in p.ks.iter().zip(p.weights).enumerate() {
        let mm =
            MatMul::new(p.m, k, p.n).trans_a(p.trans_a).trans_b(p.trans_b).scale(w, if i == 0 { 0.0 } else { 1.0 });
        matmul_rows(&mm, input(2 * i), input(2 * i + 1), c_rows, lo, hi);
    }
}

/// `c = Σ weights[i]·op(a_i)·op(b_i)`, as its two row blocks split at
/// [`tower_matmul_split`] (the bits of two threads running one block each).
pub fn tower_matmul<'x>(p: &TowerGemm<'_>, input: impl Fn(usize) -> &'x [f32] + Copy, c: &mut [f32]) {
    let h = tower_matmul_split(p.m);
    let (top, bottom) = c.split_at_mut(h * p.n);
    tower_matmul_rows(p, input, top, 0, h);
    tower_matmul_rows(p, input, bottom, h, p.m);
}

/// The update a [`tower_matmul_apply_rows`] fuses (`Kernel::TowerMatMulApply`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TowerUpdate {
    /// `w -= lr·g`.
    Sgd { lr: f32 },
    /// `acc = momentum·acc + g; w -= lr·acc`.
    Momentum { lr: f32, momentum: f32 },
}

/// Rows `[lo, hi)` of the tower product `g = Σ weights[i]·op(a_i)·op(b_i)`
/// applied at once (`Kernel::TowerMatMulApply`): `w_rows` (and, for
/// momentum, `acc_rows`) are those rows of the variable (and its
/// accumulator). SGD accumulates each pair into `w` with alpha =
/// `-lr·weights[i]`; momentum accumulates into `acc` (the first pair with
/// beta = momentum), then `w -= lr·acc`. The gradient is never stored.
/// Allocates nothing; pairs without one weight each are an error.
pub fn tower_matmul_apply_rows<'x>(
    p: &TowerGemm<'_>,
    update: TowerUpdate,
    input: impl Fn(usize) -> &'x [f32],
    w_rows: &mut [f32],
    acc_rows: Option<&mut [f32]>,
    lo: usize,
    hi: usize,
) -> Result<(), crate::KernelError> {
    let pairs = p.ks.len();
    if pairs != p.weights.len() {
        return Err(crate::KernelError::TowerPairs { op: "gemm_tower_apply", pairs, weights: p.weights.len() });
    }
    let rows = (hi - lo) * p.n;
    match (update, acc_rows) {
        (TowerUpdate::Sgd { lr }, _) => {
            for (i, (&k, &wt)) in p.ks.iter().zip(p.weights).enumerate() {
                let mm = MatMul::new(p.m, k, p.n).trans_a(p.trans_a).trans_b(p.trans_b).scale(-lr * wt, 1.0);
                matmul_rows(&mm, input(2 * i), input(2 * i + 1), &mut w_rows[..rows], lo, hi);
            }
        }
        (TowerUpdate::Momentum { lr, momentum }, Some(acc)) => {
            for (i, (&k, &wt)) in p.ks.iter().zip(p.weights).enumerate() {
                let beta = if i == 0 { momentum } else { 1.0 };
                let mm = MatMul::new(p.m, k, p.n).trans_a(p.trans_a).trans_b(p.trans_b).scale(wt, beta);
                matmul_rows(&mm, input(2 * i), input(2 * i + 1), &mut acc[..rows], lo, hi);
            }
            for (w, a) in w_rows[..rows].iter_mut().zip(&acc[..rows]) {
                *w -= lr * *a;
            }
        }
        (TowerUpdate::Momentum { .. }, None) => {
            return Err(crate::KernelError::CannotFuse { op: "gemm_tower_apply", into: "apply_momentum" })
        }
    }
    Ok(())
}

/// The whole [`tower_matmul_apply_rows`], as its two row blocks split at
/// [`tower_matmul_split`] (the bits of two threads running one block each).
pub fn tower_matmul_apply<'x>(
    p: &TowerGemm<'_>,
    update: TowerUpdate,
    input: impl Fn(usize) -> &'x [f32] + Copy,
    w: &mut [f32],
    acc: Option<&mut [f32]>,
) -> Result<(), crate::KernelError> {
    let h = tower_matmul_split(p.m) * p.n;
    let (w_top, w_bottom) = w.split_at_mut(h);
    match acc {
        Some(acc) => {
            let (a_top, a_bottom) = acc.split_at_mut(h);
            tower_matmul_apply_rows(p, update, input, w_top, Some(a_top), 0, tower_matmul_split(p.m))?;
            tower_matmul_apply_rows(p, update, input, w_bottom, Some(a_bottom), tower_matmul_split(p.m), p.m)
        }
        None => {
            tower_matmul_apply_rows(p, update, input, w_top, None, 0, tower_matmul_split(p.m))?;
            tower_matmul_apply_rows(p, update, input, w_bottom, None, tower_matmul_split(p.m), p.m)
        }
    }
}

fn parallelism(threads: usize) -> Parallelism {
    if threads > 1 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_close, Lcg};

    fn naive(p: &MatMul, a: &[f32], b: &[f32], c: &mut [f32]) {
        for i in 0..p.m {
            for j in 0..p.n {
                let mut s = 0.0f64;
                for q in 0..p.k {
                    let av = if p.trans_a { a[q * p.m + i] } else { a[i * p.k + q] };
                    let bv = if p.trans_b { b[j * p.k + q] } else { b[q * p.n + j] };
                    s += av as f64 * bv as f64;
                }
                let old = if p.beta == 0.0 { 0.0 } else { p.beta * c[i * p.n + j] };
                c[i * p.n + j] = (p.alpha as f64 * s) as f32 + old;
            }
        }
    }

    #[test]
    fn matches_naive_all_transposes() {
        let mut r = Lcg::new(1);
        for &(m, k, n) in &[(1, 1, 1), (3, 5, 7), (17, 33, 9), (64, 10, 65), (5, 0, 4)] {
            for ta in [false, true] {
                for tb in [false, true] {
                    for (alpha, beta) in [(1.0, 0.0), (0.5, 1.0), (2.0, -0.5)] {
                        let p = MatMul::new(m, k, n).trans_a(ta).trans_b(tb).scale(alpha, beta);
                        let a = r.vec(m * k);
                        let b = r.vec(k * n);
                        let c0 = r.vec(m * n);
                        let mut c1 = c0.clone();
                        let mut c2 = c0.clone();
                        matmul(&p, &a, &b, &mut c1);
                        naive(&p, &a, &b, &mut c2);
                        assert_close(&c1, &c2, 1e-4, "matmul");
                    }
                }
            }
        }
    }

    /// A batch of two 2x2 products by hand, then every transpose and
    /// shared operand against the naive product of each index's matrices
    /// (a shared operand is the same matrix at every index).
    #[test]
    fn batched_products_by_hand_and_per_index() {
        // c_0 = [1 2; 3 4]·[1 0; 0 1] = [1 2; 3 4]; c_1 = [1 1; 0 1]·[2 0; 1 3] = [3 3; 1 3].
        let a = [1.0, 2.0, 3.0, 4.0, 1.0, 1.0, 0.0, 1.0];
        let b = [1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 1.0, 3.0];
        let mut c = [0.0; 8];
        let p = BatchGemm { batch: 2, mm: MatMul::new(2, 2, 2), shared_a: false, shared_b: false };
        batch_matmul(&p, &a, &b, &mut c);
        assert_eq!(c, [1.0, 2.0, 3.0, 4.0, 3.0, 3.0, 1.0, 3.0]);
        let mut r = Lcg::new(11);
        let (batch, m, k, n) = (3, 5, 4, 6);
        for ta in [false, true] {
            for tb in [false, true] {
                for (sa, sb) in [(false, false), (false, true), (true, false)] {
                    let mm = MatMul::new(m, k, n).trans_a(ta).trans_b(tb);
                    let p = BatchGemm { batch, mm, shared_a: sa, shared_b: sb };
                    let a = r.vec(if sa { 1 } else { batch } * m * k);
                    let b = r.vec(if sb { 1 } else { batch } * k * n);
                    let mut c = vec![f32::NAN; batch * m * n];
                    batch_matmul(&p, &a, &b, &mut c);
                    for i in 0..batch {
                        let ai = if sa { &a[..] } else { &a[i * m * k..] };
                        let bi = if sb { &b[..] } else { &b[i * k * n..] };
                        let mut want = vec![0.0; m * n];
                        naive(&mm, ai, bi, &mut want);
                        assert_close(&c[i * m * n..(i + 1) * m * n], &want, 1e-5, "batch_matmul");
                    }
                }
            }
        }
    }

    /// Rows of a product, every transpose, against the whole product's rows
    /// (close, not always the same bits: hence `tower_matmul`'s fixed
    /// split), and the tower mean
    /// Σ w_i op(a_i) op(b_i) against the naive sum, with pairs of different k.
    #[test]
    fn rows_and_tower_means() {
        let mut r = Lcg::new(3);
        for ta in [false, true] {
            for tb in [false, true] {
                let (m, n) = (37, 19);
                let ks = [13usize, 7];
                let w = [0.75f32, 0.25];
                let ops: Vec<(Vec<f32>, Vec<f32>)> = ks.iter().map(|&k| (r.vec(m * k), r.vec(k * n))).collect();
                let p0 = MatMul::new(m, ks[0], n).trans_a(ta).trans_b(tb);
                let mut whole = vec![0.0; m * n];
                matmul(&p0, &ops[0].0, &ops[0].1, &mut whole);
                let mut rows = vec![f32::NAN; 10 * n];
                matmul_rows(&p0, &ops[0].0, &ops[0].1, &mut rows, 20, 30);
                // Not always the same bits: the GEMM's kernels depend on the row count.
                assert_close(&rows, &whole[20 * n..30 * n], 1e-5, "rows 20..30");
                let mut want = vec![0.0; m * n];
                for (i, (a, b)) in ops.iter().enumerate() {
                    let mut c = vec![0.0; m * n];
                    naive(&MatMul::new(m, ks[i], n).trans_a(ta).trans_b(tb), a, b, &mut c);
                    want.iter_mut().zip(&c).for_each(|(o, v)| *o += w[i] * v);
                }
                let tg = TowerGemm { m, n, ks: &ks, trans_a: ta, trans_b: tb, weights: &w };
                let flat: Vec<&[f32]> = ops.iter().flat_map(|(a, b)| [a.as_slice(), b.as_slice()]).collect();
                let mut got = vec![f32::NAN; m * n];
                tower_matmul(&tg, |i| flat[i], &mut got);
                assert_close(&got, &want, 1e-4, "tower mean");
                let h = tower_matmul_split(m);
                let mut halves = vec![f32::NAN; m * n];
                let (top, bottom) = halves.split_at_mut(h * n);
                tower_matmul_rows(&tg, |i| flat[i], bottom, h, m);
                tower_matmul_rows(&tg, |i| flat[i], top, 0, h);
                assert_eq!(halves, got, "the two blocks, in any order, are the whole");
            }
        }
    }

    /// The tower product applied at once: SGD and momentum against the
    /// stored gradient's update (within float reassociation), the two row
    /// blocks in either order equal to the whole bit for bit, and pairs
    /// without one weight each refused.
    #[test]
    fn tower_products_apply_as_the_stored_gradient_would() {
        let mut r = Lcg::new(5);
        let (m, n, ks, wts) = (41usize, 23usize, [11usize, 6], [0.625f32, 0.375]);
        for ta in [false, true] {
            let ops: Vec<(Vec<f32>, Vec<f32>)> = ks.iter().map(|&k| (r.vec(m * k), r.vec(k * n))).collect();
            let flat: Vec<&[f32]> = ops.iter().flat_map(|(a, b)| [a.as_slice(), b.as_slice()]).collect();
            let tg = TowerGemm { m, n, ks: &ks, trans_a: ta, trans_b: false, weights: &wts };
            let mut g = vec![0.0; m * n];
            tower_matmul(&tg, |i| flat[i], &mut g);
            let (w0, acc0) = (r.vec(m * n), r.vec(m * n));
            let (lr, mom) = (0.05f32, 0.9f32);
            for update in [TowerUpdate::Sgd { lr }, TowerUpdate::Momentum { lr, momentum: mom }] {
                let (mut want_w, mut want_acc) = (w0.clone(), acc0.clone());
                for j in 0..m * n {
                    match update {
                        TowerUpdate::Sgd { .. } => want_w[j] -= lr * g[j],
                        TowerUpdate::Momentum { .. } => {
                            want_acc[j] = want_acc[j] * mom + g[j];
                            want_w[j] -= lr * want_acc[j];
                        }
                    }
                }
                let momentum = matches!(update, TowerUpdate::Momentum { .. });
                let (mut w, mut acc) = (w0.clone(), acc0.clone());
                tower_matmul_apply(&tg, update, |i| flat[i], &mut w, momentum.then_some(&mut acc[..])).unwrap();
                assert_close(&w, &want_w, 1e-5, "variable");
                if momentum {
                    assert_close(&acc, &want_acc, 1e-5, "accumulator");
                }
                let h = tower_matmul_split(m);
                let (mut w2, mut acc2) = (w0.clone(), acc0.clone());
                let (wt, wb) = w2.split_at_mut(h * n);
                let (at, ab) = acc2.split_at_mut(h * n);
                tower_matmul_apply_rows(&tg, update, |i| flat[i], wb, momentum.then_some(ab), h, m).unwrap();
                tower_matmul_apply_rows(&tg, update, |i| flat[i], wt, momentum.then_some(at), 0, h).unwrap();
                assert_eq!(w2, w, "the two blocks, in any order, are the whole");
            }
            let bad = TowerGemm { weights: &wts[..1], ..tg };
            let e = tower_matmul_apply(&bad, TowerUpdate::Sgd { lr: 0.1 }, |i| flat[i], &mut g, None).unwrap_err();
            assert!(e.to_string().contains("one weight per pair"), "{e}");
            let e =
                tower_matmul_apply(&tg, TowerUpdate::Momentum { lr: 0.1, momentum: 0.9 }, |i| flat[i], &mut g, None)
                    .unwrap_err();
            assert!(e.to_string().contains("apply_momentum"), "{e}");
        }
    }

    #[test]
    fn beta_zero_ignores_nan_in_c() {
        let p = MatMul::new(2, 2, 2);
        let mut c = vec![f32::NAN; 4];
        matmul(&p, &[1.0, 2.0, 3.0, 4.0], &[1.0, 0.0, 0.0, 1.0], &mut c);
        assert_eq!(c, vec![1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn threaded_matches_single() {
        let mut r = Lcg::new(2);
        let (m, k, n) = (70, 90, 50);
        let a = r.vec(m * k);
        let b = r.vec(k * n);
        let mut c1 = vec![0.0; m * n];
        let mut c2 = vec![0.0; m * n];
        matmul(&MatMul::new(m, k, n), &a, &b, &mut c1);
        matmul(&MatMul::new(m, k, n).threads(2), &a, &b, &mut c2);
        assert_close(&c1, &c2, 1e-5, "threads");
    }
}
