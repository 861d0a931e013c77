//! The reference interpreter's array ops of issue 22, and the batched
//! matrix product, written from their definitions with coordinates (naive
//! loops, f64), independently of the kernels' strided loops. The batched
//! product broadcasts its batch axes by NumPy's rules in full (a size-1
//! or missing axis repeats), wider than what the graph accepts.

use towers_graph::Op;

use super::interp::{ravel, V};

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

/// Evaluate one array op; panics (test code) on any other op.
pub(super) fn eval(op: &Op, x: &[V]) -> Vec<V> {
    let out = match op {
        Op::OneHot { depth, on_value, off_value } => {
            let mut shape = x[0].shape.clone();
            shape.push(*depth);
            let n = shape.iter().product();
            let data =
                (0..n).map(|i| if x[0].data[i / depth] == (i % depth) as f64 { on_value.0 } else { off_value.0 });
            V::new(&shape, data.map(f64::from).collect())
        }
        Op::Transpose { perm } => {
            let shape: Vec<usize> = perm.iter().map(|&a| x[0].shape[a]).collect();
            let n = shape.iter().product();
            let data = (0..n).map(|i| {
                let c = unravel(i, &shape);
                let mut src = vec![0; c.len()];
                for (k, &a) in perm.iter().enumerate() {
                    src[a] = c[k];
                }
                x[0].data[ravel(&src, &x[0].shape)]
            });
            V::new(&shape, data.collect())
        }
        Op::ExpandDims { axis } => {
            let mut shape = x[0].shape.clone();
            shape.insert(*axis, 1);
            V::new(&shape, x[0].data.clone())
        }
        Op::Squeeze { axes } => {
            let shape: Vec<usize> =
                x[0].shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
            V::new(&shape, x[0].data.clone())
        }
        Op::Pad { paddings, constant_value } => {
            let shape: Vec<usize> = x[0].shape.iter().zip(paddings).map(|(d, p)| d + p[0] + p[1]).collect();
            let n = shape.iter().product();
            let data = (0..n).map(|i| {
                let c = unravel(i, &shape);
                let inside = c.iter().zip(paddings).zip(&x[0].shape).all(|((&c, p), &d)| c >= p[0] && c < p[0] + d);
                if inside {
                    let src: Vec<usize> = c.iter().zip(paddings).map(|(c, p)| c - p[0]).collect();
                    x[0].data[ravel(&src, &x[0].shape)]
                } else {
                    constant_value.0 as f64
                }
            });
            V::new(&shape, data.collect())
        }
        Op::Gather { axis } => {
            let (p, idx) = (&x[0], &x[1]);
            let mut shape = p.shape[..*axis].to_vec();
            shape.extend_from_slice(&idx.shape);
            shape.extend_from_slice(&p.shape[axis + 1..]);
            let n = shape.iter().product();
            let r = idx.shape.len();
            let data = (0..n).map(|i| {
                let c = unravel(i, &shape);
                let j = ravel(&c[*axis..axis + r], &idx.shape);
                let mut src = c[..*axis].to_vec();
                src.push(idx.data[j] as usize);
                src.extend_from_slice(&c[axis + r..]);
                p.data[ravel(&src, &p.shape)]
            });
            V::new(&shape, data.collect())
        }
        Op::GatherGrad { axis } => {
            let (p, idx, dy) = (&x[0], &x[1], &x[2]);
            let r = idx.shape.len();
            let mut out = V::zeros(&p.shape);
            for i in 0..dy.data.len() {
                let c = unravel(i, &dy.shape);
                let j = ravel(&c[*axis..axis + r], &idx.shape);
                let mut dst = c[..*axis].to_vec();
                dst.push(idx.data[j] as usize);
                dst.extend_from_slice(&c[axis + r..]);
                out.data[ravel(&dst, &p.shape)] += dy.data[i];
            }
            out
        }
        Op::Tile { multiples } => {
            let shape: Vec<usize> = x[0].shape.iter().zip(multiples).map(|(d, m)| d * m).collect();
            let n = shape.iter().product();
            let data = (0..n).map(|i| {
                let c: Vec<usize> = unravel(i, &shape).iter().zip(&x[0].shape).map(|(c, d)| c % d).collect();
                x[0].data[ravel(&c, &x[0].shape)]
            });
            V::new(&shape, data.collect())
        }
        Op::TileGrad { .. } => {
            let (xv, dy) = (&x[0], &x[1]);
            let mut out = V::zeros(&xv.shape);
            for i in 0..dy.data.len() {
                let c: Vec<usize> = unravel(i, &dy.shape).iter().zip(&xv.shape).map(|(c, d)| c % d).collect();
                out.data[ravel(&c, &xv.shape)] += dy.data[i];
            }
            out
        }
        Op::BatchMatMul { transpose_a, transpose_b } => {
            let (a, b) = (&x[0], &x[1]);
            let (ba, bb) = (&a.shape[..a.shape.len() - 2], &b.shape[..b.shape.len() - 2]);
            let r = ba.len().max(bb.len());
            let dim = |s: &[usize], i: usize| if i < r - s.len() { 1 } else { s[i - (r - s.len())] };
            let batch: Vec<usize> = (0..r).map(|i| dim(ba, i).max(dim(bb, i))).collect();
            // The matrix of `v` (batch axes `lead`) at the output's batch index `idx`.
            let mat = |v: &V, lead: &[usize], idx: &[usize]| {
                let off = idx.len() - lead.len();
                let c: Vec<usize> =
                    lead.iter().enumerate().map(|(i, &d)| if d == 1 { 0 } else { idx[off + i] }).collect();
                let (rows, cols) = (v.shape[v.shape.len() - 2], v.shape[v.shape.len() - 1]);
                let at = ravel(&c, lead) * rows * cols;
                V::new(&[rows, cols], v.data[at..at + rows * cols].to_vec())
            };
            let mut data = Vec::new();
            let mut mn = [0, 0];
            for i in 0..batch.iter().product() {
                let idx = unravel(i, &batch);
                let p = super::interp::matmul(&mat(a, ba, &idx), &mat(b, bb, &idx), *transpose_a, *transpose_b);
                mn = [p.shape[0], p.shape[1]];
                data.extend(p.data);
            }
            let mut shape = batch;
            shape.extend(mn);
            V::new(&shape, data)
        }
        other => panic!("the reference interpreter has no rule for {other:?}"),
    };
    vec![out]
}

/// The top-k ops from their definitions (a full sort of each row by value,
/// descending, equal values by lower column; no NaN in the tests' values).
pub(super) fn eval_topk(op: &Op, x: &[V]) -> Vec<V> {
    let cols = |v: &V| *v.shape.last().expect("rank >= 1");
    match op {
        Op::TopK { k } => {
            let c = cols(&x[0]);
            let mut shape = x[0].shape.clone();
            *shape.last_mut().expect("rank >= 1") = *k;
            let (mut values, mut indices) = (Vec::new(), Vec::new());
            for row in x[0].data.chunks(c) {
                let mut order: Vec<usize> = (0..c).collect();
                order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).expect("no NaN").then(a.cmp(&b)));
                values.extend(order[..*k].iter().map(|&j| row[j]));
                indices.extend(order[..*k].iter().map(|&j| j as f64));
            }
            vec![V::new(&shape, values), V::new(&shape, indices)]
        }
        Op::TopKGrad => {
            let (xv, dv, ix) = (&x[0], &x[1], &x[2]);
            let (c, k) = (cols(xv), cols(dv));
            let mut out = V::zeros(&xv.shape);
            for (r, (d, i)) in dv.data.chunks(k).zip(ix.data.chunks(k)).enumerate() {
                for (g, j) in d.iter().zip(i) {
                    out.data[r * c + *j as usize] += g;
                }
            }
            vec![out]
        }
        Op::InTopK { k } => {
            let c = cols(&x[0]);
            let data = x[0].data.chunks(c).zip(&x[1].data).map(|(row, &t)| {
                let inside = t >= 0.0 && (t as usize) < c && row.iter().all(|v| v.is_finite());
                (inside && row.iter().filter(|&&v| v > row[t as usize]).count() < *k) as i32 as f64
            });
            vec![V::new(&x[1].shape, data.collect())]
        }
        other => panic!("the reference interpreter has no top-k rule for {other:?}"),
    }
}
