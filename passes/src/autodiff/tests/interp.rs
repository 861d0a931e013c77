//! A plain f64 reference interpreter: the oracle of the gradient and optimizer
//! tests. It evaluates every node in topological order with naive loops and
//! follows TF's conventions (NHWC, HWIO filters, TF SAME padding, max-pool
//! gradient to the first maximum, average pools dividing by the in-bounds
//! count). Stateful ops write the variable map. Test code only: it panics on
//! graphs it does not understand.

use std::collections::BTreeMap;

use towers_graph::{BinaryOp, Graph, Initializer, NodeId, Op, UnaryOp};

use super::interp_nn::{apply, conv, pool};

/// A dense f64 tensor, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct V {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl V {
    pub fn new(shape: &[usize], data: Vec<f64>) -> V {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "shape {shape:?}");
        V { shape: shape.to_vec(), data }
    }
    pub fn zeros(shape: &[usize]) -> V {
        V::new(shape, vec![0.0; shape.iter().product()])
    }
    pub fn scalar(v: f64) -> V {
        V::new(&[], vec![v])
    }
    fn map(&self, f: impl Fn(f64) -> f64) -> V {
        V::new(&self.shape, self.data.iter().map(|&x| f(x)).collect())
    }
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

pub(super) fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// Index into `small` (right-aligned, size-1 dims broadcast) of a big index.
fn bcast_index(big: &[usize], small: &[usize]) -> usize {
    let off = big.len() - small.len();
    let idx: Vec<usize> = small.iter().enumerate().map(|(i, &d)| if d == 1 { 0 } else { big[off + i] }).collect();
    ravel(&idx, small)
}

fn bcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i < r - a.len() { 1 } else { a[i - (r - a.len())] };
            let db = if i < r - b.len() { 1 } else { b[i - (r - b.len())] };
            da.max(db)
        })
        .collect()
}

pub(super) fn binary(a: &V, b: &V, f: impl Fn(f64, f64) -> f64) -> V {
    let shape = bcast_shape(&a.shape, &b.shape);
    let n = shape.iter().product();
    let data = (0..n)
        .map(|i| {
            let idx = unravel(i, &shape);
            f(a.data[bcast_index(&idx, &a.shape)], b.data[bcast_index(&idx, &b.shape)])
        })
        .collect();
    V::new(&shape, data)
}

fn broadcast_to(x: &V, shape: &[usize]) -> V {
    let n = shape.iter().product();
    V::new(shape, (0..n).map(|i| x.data[bcast_index(&unravel(i, shape), &x.shape)]).collect())
}

fn sum_to(x: &V, shape: &[usize]) -> V {
    let mut out = V::zeros(shape);
    for i in 0..x.data.len() {
        out.data[bcast_index(&unravel(i, &x.shape), shape)] += x.data[i];
    }
    out
}

pub(super) fn matmul(a: &V, b: &V, ta: bool, tb: bool) -> V {
    let at = |i: usize, k: usize| {
        if ta {
            a.data[k * a.shape[1] + i]
        } else {
            a.data[i * a.shape[1] + k]
        }
    };
    let bt = |k: usize, j: usize| {
        if tb {
            b.data[j * b.shape[1] + k]
        } else {
            b.data[k * b.shape[1] + j]
        }
    };
    let (m, k) = if ta { (a.shape[1], a.shape[0]) } else { (a.shape[0], a.shape[1]) };
    let n = if tb { b.shape[0] } else { b.shape[1] };
    let mut out = V::zeros(&[m, n]);
    for i in 0..m {
        for j in 0..n {
            out.data[i * n + j] = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
        }
    }
    out
}

/// Rows of the last axis: (rows, width).
fn rows(x: &V) -> (usize, usize) {
    let w = *x.shape.last().unwrap_or(&1);
    (x.data.len() / w.max(1), w)
}

fn log_softmax(x: &V) -> V {
    let (r, w) = rows(x);
    let mut out = x.clone();
    for i in 0..r {
        let row = &x.data[i * w..(i + 1) * w];
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        for (o, v) in out.data[i * w..(i + 1) * w].iter_mut().zip(row) {
            *o = v - lse;
        }
    }
    out
}

fn reduce(x: &V, axes: &[usize], keep: bool, mean: bool) -> V {
    let kshape: Vec<usize> = x.shape.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect();
    let mut out = sum_to(x, &kshape);
    if mean {
        let n: usize = axes.iter().map(|&a| x.shape[a]).product();
        out = out.map(|v| v / n as f64);
    }
    if !keep {
        out.shape = x.shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
    }
    out
}

/// The maximum (minimum when `min`) over `axes`, by a direct scan.
fn extreme(x: &V, axes: &[usize], keep: bool, min: bool) -> V {
    let kshape: Vec<usize> = x.shape.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect();
    let mut out = V::new(&kshape, vec![if min { f64::INFINITY } else { f64::NEG_INFINITY }; kshape.iter().product()]);
    for i in 0..x.data.len() {
        let mut idx = unravel(i, &x.shape);
        for &a in axes {
            idx[a] = 0;
        }
        let o = &mut out.data[ravel(&idx, &kshape)];
        *o = if min { o.min(x.data[i]) } else { o.max(x.data[i]) };
    }
    if !keep {
        out.shape = x.shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
    }
    out
}

/// (outer, axis, inner) sizes for an axis.
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product())
}

fn concat(xs: &[&V], axis: usize) -> V {
    let mut shape = xs[0].shape.clone();
    shape[axis] = xs.iter().map(|x| x.shape[axis]).sum();
    let (outer, _, inner) = around(&shape, axis);
    let mut data = Vec::new();
    for o in 0..outer {
        for x in xs {
            let a = x.shape[axis];
            data.extend_from_slice(&x.data[o * a * inner..(o + 1) * a * inner]);
        }
    }
    V::new(&shape, data)
}

fn dropout_mask(shape: &[usize], rate: f64, seed: u64) -> V {
    let n = shape.iter().product::<usize>();
    V::new(
        shape,
        (0..n as u64)
            .map(|i| {
                let mut z = seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                let u = (z >> 11) as f64 / (1u64 << 53) as f64;
                if u < rate {
                    0.0
                } else {
                    1.0 / (1.0 - rate)
                }
            })
            .collect(),
    )
}

fn init(op: &Op) -> V {
    let Op::Variable { shape, init, .. } = op else { unreachable!() };
    let v = match init {
        Initializer::Zeros => 0.0,
        Initializer::Ones => 1.0,
        Initializer::Constant(c) => c.0 as f64,
        other => panic!("interp: initializer {other:?} needs an explicit value"),
    };
    V::new(shape, vec![v; shape.iter().product()])
}

/// A binary op in f64, written independently of the kernels' f32 table.
fn binary_f64(op: BinaryOp) -> fn(f64, f64) -> f64 {
    match op {
        BinaryOp::Add => |p, q| p + q,
        BinaryOp::Sub => |p, q| p - q,
        BinaryOp::Mul => |p, q| p * q,
        BinaryOp::Div => |p, q| p / q,
        BinaryOp::Maximum => f64::max,
        BinaryOp::Minimum => f64::min,
        BinaryOp::Pow => f64::powf,
        BinaryOp::GreaterEqualMask => |p, q| if p >= q { 1.0 } else { 0.0 },
        BinaryOp::AbsGrad => |x, d| {
            if x > 0.0 {
                d
            } else if x < 0.0 {
                -d
            } else {
                0.0
            }
        },
        BinaryOp::PowGradY => |x, z| if x > 0.0 { z * x.ln() } else { 0.0 },
    }
}

/// A unary op in f64, written independently of the kernels' f32 table.
fn unary_f64(op: UnaryOp, v: f64) -> f64 {
    match op {
        UnaryOp::Neg => -v,
        UnaryOp::Relu => v.max(0.0),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-v).exp()),
        UnaryOp::Tanh => v.tanh(),
        UnaryOp::Exp => v.exp(),
        UnaryOp::Log => v.ln(),
        UnaryOp::Sqrt => v.sqrt(),
        UnaryOp::Rsqrt => 1.0 / v.sqrt(),
        UnaryOp::Reciprocal => 1.0 / v,
        UnaryOp::Elu => {
            if v > 0.0 {
                v
            } else {
                v.exp() - 1.0
            }
        }
        UnaryOp::Relu6 => v.clamp(0.0, 6.0),
        UnaryOp::Softplus => v.exp().ln_1p(),
        UnaryOp::Abs => v.abs(),
        UnaryOp::Floor => v.floor(),
        UnaryOp::Ceil => v.ceil(),
        UnaryOp::Round => v.round_ties_even(),
        UnaryOp::Sign => {
            if v.is_nan() {
                v
            } else if v > 0.0 {
                1.0
            } else if v < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        UnaryOp::Log1p => v.ln_1p(),
        UnaryOp::Expm1 => v.exp_m1(),
    }
}

/// A unary op's gradient from its output y, in f64: d·f'(x) with x = f⁻¹(y).
fn unary_grad_f64(op: UnaryOp, d: f64, y: f64) -> f64 {
    match op {
        UnaryOp::Neg => -d,
        UnaryOp::Relu => {
            if y > 0.0 {
                d
            } else {
                0.0
            }
        }
        UnaryOp::Sigmoid => d * y * (1.0 - y),
        UnaryOp::Tanh => d * (1.0 - y * y),
        UnaryOp::Exp => d * y,
        UnaryOp::Log => d / y.exp(),
        UnaryOp::Sqrt => d / (2.0 * y),
        UnaryOp::Rsqrt => -0.5 * d * y * y * y,
        UnaryOp::Reciprocal => -d * y * y,
        // x <= 0: y = exp(x) - 1, so f'(x) = exp(x) = y + 1.
        UnaryOp::Elu => {
            if y > 0.0 {
                d
            } else {
                d * (y + 1.0)
            }
        }
        UnaryOp::Relu6 => {
            if y > 0.0 && y < 6.0 {
                d
            } else {
                0.0
            }
        }
        // y = ln(1 + e^x): f'(x) = e^x / (1 + e^x) = (e^y - 1) / e^y.
        UnaryOp::Softplus => d * (y.exp() - 1.0) / y.exp(),
        // Never built (autodiff uses AbsGrad from x), as the kernels' NaN.
        UnaryOp::Abs => f64::NAN,
        // Piecewise constant: TF passes zeros (or none).
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Sign => 0.0,
        // y = ln(1 + x): f'(x) = 1 / (1 + x) = e^-y.
        UnaryOp::Log1p => d * (-y).exp(),
        // y = e^x - 1: f'(x) = e^x = y + 1.
        UnaryOp::Expm1 => d * (y + 1.0),
    }
}

/// Evaluate every node of `g` once, in topological order. `vars` holds
/// variable values by name (missing ones take their constant initializer)
/// and is updated by stateful ops; `feeds` gives placeholders by name.
pub fn run(g: &Graph, vars: &mut BTreeMap<String, V>, feeds: &BTreeMap<String, V>) -> BTreeMap<NodeId, Vec<V>> {
    let mut vals: BTreeMap<NodeId, Vec<V>> = BTreeMap::new();
    for id in g.topo_order().expect("acyclic") {
        let node = g.node(id);
        let ins: Vec<V> = g.inputs(id).iter().map(|t| vals[&t.node][t.slot].clone()).collect();
        let name_of = |i: usize| g.node(g.inputs(id)[i].node).name.clone();
        let out = eval(&node.op, &ins, &node.name, vars, feeds, name_of);
        vals.insert(id, out);
    }
    vals
}

fn eval(
    op: &Op,
    x: &[V],
    name: &str,
    vars: &mut BTreeMap<String, V>,
    feeds: &BTreeMap<String, V>,
    input_name: impl Fn(usize) -> String,
) -> Vec<V> {
    let one = |v: V| vec![v];
    match op {
        Op::Placeholder { .. } => one(feeds.get(name).unwrap_or_else(|| panic!("feed {name}")).clone()),
        Op::Const { value } => one(V::new(&value.shape, value.data.iter().map(|v| v.0 as f64).collect())),
        Op::Variable { .. } => one(vars.entry(name.to_string()).or_insert_with(|| init(op)).clone()),
        Op::MatMul { transpose_a, transpose_b } => one(matmul(&x[0], &x[1], *transpose_a, *transpose_b)),
        Op::Binary(op) => one(binary(&x[0], &x[1], binary_f64(*op))),
        Op::Fused { expr } => {
            use towers_kernels::elementwise::FusedStep;
            let mut v: Vec<V> = Vec::new();
            for step in expr.steps() {
                let r = match *step {
                    FusedStep::Input(k) => x[k as usize].clone(),
                    FusedStep::Const(b) => V::new(&[], vec![f32::from_bits(b) as f64]),
                    FusedStep::Unary(u, a) => v[a as usize].map(|t| unary_f64(u, t)),
                    FusedStep::UnaryGrad(u, a, b) => {
                        binary(&v[a as usize], &v[b as usize], |d, y| unary_grad_f64(u, d, y))
                    }
                    FusedStep::Binary(op, a, b) => binary(&v[a as usize], &v[b as usize], binary_f64(op)),
                };
                v.push(r);
            }
            one(v.pop().expect("a fused expression has a step"))
        }
        Op::AddN => one(x[1..].iter().fold(x[0].clone(), |acc, v| binary(&acc, v, |a, b| a + b))),
        Op::BiasAdd => one(binary(&x[0], &x[1], |a, b| a + b)),
        Op::BiasAddGrad => one(sum_to(&x[0], &x[0].shape[x[0].shape.len() - 1..])),
        Op::Unary(u) => one(x[0].map(|v| unary_f64(*u, v))),
        Op::UnaryGrad(u) => one(binary(&x[0], &x[1], |d, y| unary_grad_f64(*u, d, y))),
        Op::Conv2D { strides, padding } => one(conv(&x[0], &x[1], None, *strides, *padding, 0)),
        Op::Conv2DBackpropInput { strides, padding } => one(conv(&x[0], &x[1], Some(&x[2]), *strides, *padding, 1)),
        Op::Conv2DBackpropFilter { strides, padding } => one(conv(&x[0], &x[1], Some(&x[2]), *strides, *padding, 2)),
        Op::MaxPool { ksize, strides, padding } => one(pool(&x[0], None, *ksize, *strides, *padding, true).0),
        Op::MaxPoolGrad { ksize, strides, padding } => {
            one(pool(&x[0], Some(&x[2]), *ksize, *strides, *padding, true).1)
        }
        Op::AvgPool { ksize, strides, padding } => one(pool(&x[0], None, *ksize, *strides, *padding, false).0),
        Op::AvgPoolGrad { ksize, strides, padding } => {
            one(pool(&x[0], Some(&x[1]), *ksize, *strides, *padding, false).1)
        }
        Op::Reshape { shape } => {
            let known: usize = shape.iter().filter(|&&d| d >= 0).map(|&d| d as usize).product();
            let dims: Vec<usize> =
                shape.iter().map(|&d| if d < 0 { x[0].data.len() / known } else { d as usize }).collect();
            one(V::new(&dims, x[0].data.clone()))
        }
        Op::Concat { axis } => one(concat(&x.iter().collect::<Vec<_>>(), *axis)),
        Op::Split { axis, sizes } => {
            let (outer, a, inner) = around(&x[0].shape, *axis);
            let mut start = 0;
            let mut outs = Vec::new();
            for &s in sizes {
                let mut shape = x[0].shape.clone();
                shape[*axis] = s;
                let mut data = Vec::new();
                for o in 0..outer {
                    data.extend_from_slice(&x[0].data[(o * a + start) * inner..(o * a + start + s) * inner]);
                }
                outs.push(V::new(&shape, data));
                start += s;
            }
            outs
        }
        Op::Slice { begin, size } => {
            let sh: Vec<usize> = size
                .iter()
                .enumerate()
                .map(|(i, &s)| if s < 0 { x[0].shape[i] - begin[i] } else { s as usize })
                .collect();
            let n = sh.iter().product();
            let data = (0..n)
                .map(|i| {
                    let idx: Vec<usize> = unravel(i, &sh).iter().zip(begin).map(|(a, b)| a + b).collect();
                    x[0].data[ravel(&idx, &x[0].shape)]
                })
                .collect();
            one(V::new(&sh, data))
        }
        Op::SliceGrad { begin } => {
            let mut out = V::zeros(&x[0].shape);
            for i in 0..x[1].data.len() {
                let idx: Vec<usize> = unravel(i, &x[1].shape).iter().zip(begin).map(|(a, b)| a + b).collect();
                out.data[ravel(&idx, &x[0].shape)] = x[1].data[i];
            }
            one(out)
        }
        Op::BroadcastLike => one(broadcast_to(&x[0], &x[1].shape)),
        Op::SumToLike => one(sum_to(&x[0], &x[1].shape)),
        Op::Softmax => one(log_softmax(&x[0]).map(f64::exp)),
        Op::LogSoftmax => one(log_softmax(&x[0])),
        Op::SoftmaxGrad | Op::LogSoftmaxGrad => {
            let (r, w) = rows(&x[0]);
            let (dy, y) = (&x[0].data, &x[1].data);
            let mut out = x[0].clone();
            for i in 0..r {
                let s = i * w..(i + 1) * w;
                let dot: f64 = if matches!(op, Op::SoftmaxGrad) {
                    s.clone().map(|j| dy[j] * y[j]).sum()
                } else {
                    s.clone().map(|j| dy[j]).sum()
                };
                for j in s {
                    out.data[j] =
                        if matches!(op, Op::SoftmaxGrad) { y[j] * (dy[j] - dot) } else { dy[j] - y[j].exp() * dot };
                }
            }
            one(out)
        }
        Op::SparseSoftmaxCrossEntropy | Op::SoftmaxCrossEntropy => {
            let ls = log_softmax(&x[0]);
            let (r, w) = rows(&x[0]);
            let labels = if matches!(op, Op::SoftmaxCrossEntropy) {
                x[1].clone()
            } else {
                let mut l = V::zeros(&x[0].shape);
                for i in 0..r {
                    l.data[i * w + x[1].data[i] as usize] = 1.0;
                }
                l
            };
            let loss =
                (0..r).map(|i| -(0..w).map(|j| labels.data[i * w + j] * ls.data[i * w + j]).sum::<f64>()).collect();
            let back = binary(&ls.map(f64::exp), &labels, |p, l| p - l);
            vec![V::new(&[r], loss), back]
        }
        Op::L2Loss => one(V::scalar(x[0].data.iter().map(|v| v * v).sum::<f64>() / 2.0)),
        Op::ReduceSum { axes, keep_dims } => one(reduce(&x[0], axes, *keep_dims, false)),
        Op::ReduceMean { axes, keep_dims } => one(reduce(&x[0], axes, *keep_dims, true)),
        Op::ReduceMax { axes, keep_dims } => one(extreme(&x[0], axes, *keep_dims, false)),
        Op::ReduceMin { axes, keep_dims } => one(extreme(&x[0], axes, *keep_dims, true)),
        Op::ArgMax { axis } => {
            let (outer, a, inner) = around(&x[0].shape, *axis);
            let mut out = Vec::new();
            for o in 0..outer {
                for i in 0..inner {
                    let at = |k: usize| x[0].data[(o * a + k) * inner + i];
                    out.push((0..a).fold(0, |b, k| if at(k) > at(b) { k } else { b }) as f64);
                }
            }
            let shape: Vec<usize> = x[0].shape.iter().enumerate().filter(|(i, _)| i != axis).map(|(_, &d)| d).collect();
            one(V::new(&shape, out))
        }
        Op::Equal => one(binary(&x[0], &x[1], |a, b| (a == b) as i32 as f64)),
        Op::Compare(c) => {
            let c = *c;
            one(binary(&x[0], &x[1], move |a, b| {
                let r = match c {
                    towers_graph::Comparison::Greater => a > b,
                    towers_graph::Comparison::GreaterEqual => a >= b,
                    towers_graph::Comparison::Less => a < b,
                    towers_graph::Comparison::LessEqual => a <= b,
                    towers_graph::Comparison::NotEqual => a != b,
                };
                r as i32 as f64
            }))
        }
        Op::Select => {
            // cond of x's shape, or a vector selecting rows.
            let inner = if x[0].data.len() == x[1].data.len() { 1 } else { x[1].data.len() / x[0].data.len().max(1) };
            let data =
                (0..x[1].data.len()).map(|i| if x[0].data[i / inner] != 0.0 { x[1].data[i] } else { x[2].data[i] });
            one(V::new(&x[1].shape, data.collect()))
        }
        Op::Cast { dtype } => one(if dtype.is_float() { x[0].clone() } else { x[0].map(f64::trunc) }),
        Op::Dropout { rate, seed, .. } => {
            let mask = dropout_mask(&x[0].shape, rate.0 as f64, *seed);
            vec![binary(&x[0], &mask, |a, b| a * b), mask]
        }
        Op::BatchNorm { epsilon } => {
            let (r, c) = rows(&x[0]);
            let col = |v: &V, j: usize| (0..r).map(|i| v.data[i * c + j]).collect::<Vec<f64>>();
            let mean: Vec<f64> = (0..c).map(|j| col(&x[0], j).iter().sum::<f64>() / r as f64).collect();
            let var: Vec<f64> =
                (0..c).map(|j| col(&x[0], j).iter().map(|v| (v - mean[j]).powi(2)).sum::<f64>() / r as f64).collect();
            let inv: Vec<f64> = var.iter().map(|v| 1.0 / (v + epsilon.0 as f64).sqrt()).collect();
            let y = (0..r * c).map(|k| x[1].data[k % c] * (x[0].data[k] - mean[k % c]) * inv[k % c] + x[2].data[k % c]);
            let unbiased = var.iter().map(|v| v * r as f64 / (r as f64 - 1.0).max(1.0)).collect();
            vec![V::new(&x[0].shape, y.collect()), V::new(&[c], mean), V::new(&[c], inv), V::new(&[c], unbiased)]
        }
        Op::BatchNormGrad => {
            let (dy, xv, gamma, mean, inv) = (&x[0], &x[1], &x[2], &x[3], &x[4]);
            let (r, c) = rows(xv);
            let xhat: Vec<f64> = (0..r * c).map(|k| (xv.data[k] - mean.data[k % c]) * inv.data[k % c]).collect();
            let mut db = vec![0.0; c];
            let mut dg = vec![0.0; c];
            for k in 0..r * c {
                db[k % c] += dy.data[k];
                dg[k % c] += dy.data[k] * xhat[k];
            }
            let m = r as f64;
            let dx = (0..r * c)
                .map(|k| {
                    let j = k % c;
                    gamma.data[j] * inv.data[j] / m * (m * dy.data[k] - db[j] - xhat[k] * dg[j])
                })
                .collect();
            vec![V::new(&xv.shape, dx), V::new(&[c], dg), V::new(&[c], db)]
        }
        Op::Identity | Op::StopGradient | Op::Copy => one(x[0].clone()),
        // One process: the sum over the ranks is this rank's value.
        Op::AllReduce { .. } => x.to_vec(),
        Op::TowerMatMul { weights, transpose_a, transpose_b } => {
            let mut out: Option<V> = None;
            for (ab, w) in x.chunks(2).zip(weights) {
                let p = matmul(&ab[0], &ab[1], *transpose_a, *transpose_b);
                out = Some(match out {
                    None => p.map(|v| w.0 as f64 * v),
                    Some(o) => binary(&o, &p, |a, b| a + w.0 as f64 * b),
                });
            }
            one(out.expect("at least one pair"))
        }
        Op::TowerMean { weights } => {
            let mut out = V::zeros(&x[0].shape);
            for (v, w) in x.iter().zip(weights) {
                out = binary(&out, v, |a, b| a + w.0 as f64 * b);
            }
            one(out)
        }
        Op::AssignMovingAverage { decay } => {
            let d = decay.0 as f64;
            let new = binary(&x[0], &x[1], |v, m| v * d + m * (1.0 - d));
            vars.insert(input_name(0), new.clone());
            one(new)
        }
        Op::IncrementStep => {
            let new = x[0].map(|v| v + 1.0);
            vars.insert(input_name(0), new.clone());
            one(new)
        }
        Op::ApplyGradient { optimizer } => {
            let n = x.len();
            // Inputs: variable, slots..., grad, global_step, learning_rate.
            let (g, t, lr) = (&x[n - 3], x[n - 2].data[0] + 1.0, x[n - 1].data[0]);
            let (w, slots) = apply(optimizer, &x[0], &x[1..n - 3], g, t, lr);
            for (i, s) in slots.into_iter().enumerate() {
                vars.insert(input_name(1 + i), s);
            }
            vars.insert(input_name(0), w.clone());
            one(w)
        }
        Op::NoOp | Op::Broadcast { .. } => vec![],
        // array ops (issue 22)
        Op::OneHot { .. }
        | Op::Transpose { .. }
        | Op::ExpandDims { .. }
        | Op::Squeeze { .. }
        | Op::Pad { .. }
        | Op::Gather { .. }
        | Op::GatherGrad { .. }
        | Op::Tile { .. }
        | Op::TileGrad { .. }
        | Op::BatchMatMul { .. } => super::interp_array::eval(op, x),
        Op::TopK { .. } | Op::TopKGrad | Op::InTopK { .. } => super::interp_array::eval_topk(op, x),
    }
}
