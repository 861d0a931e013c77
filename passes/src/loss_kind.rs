//! How a loss reduces the batch: a mean over its rows, a sum, or neither.
//!
//! `grad_mean` combines the replicas' losses and gradients with weights
//! that make N towers compute one device's update on the whole batch. Which
//! weights do that depends on the loss:
//! - a **mean** over the rows (`reduce_mean(xent)`): replica `r` with `b_r`
//!   of the `B` rows is weighted `b_r / B` (its share);
//! - a **sum** over the rows (`reduce_sum(xent)`, `l2_loss(pred - y)`,
//!   `reduce_sum(xent) / BATCH` with a constant): every replica is
//!   weighted 1, since the sum of the replicas' sums is the whole sum;
//! - anything else (`sqrt(mean(..))`, a sum plus a regularizer, a batch
//!   statistic of the rows) has no weights that give one device's update;
//!   `grad_mean` keeps the shares (TF1's `average_gradients`, up to uneven
//!   splits) and says so in a diagnostic.
//!
//! The analysis is a forward data-flow over the graph in topological order.
//! Each node output gets a [`Kind`]: `Free` (no batch data reaches it),
//! `Rows` (per-row values with the batch as axis 0), `Mean`/`Sum` (the batch
//! reduced that way, then transformed linearly), or `Opaque`. Batch inputs
//! are the placeholders `bind_batch` bound and `split`'s axis-0 splits of
//! them. Ops that keep axis 0 as the rows (elementwise, convolutions,
//! pooling, softmax, cross entropies, gathers by per-row indices, a
//! batched matmul whose row operands keep their axis 0 as the output's)
//! keep `Rows`; batch norm couples the rows, but as towers normalize per tower
//! it is taken as per-row here (its exactness is documented apart). Every
//! rule is conservative: when in doubt the result is `Opaque`, which only
//! costs a diagnostic.

use std::collections::{BTreeMap, BTreeSet};

use towers_graph::{BinaryOp, Graph, NodeId, Op, Tensor, UnaryOp};

/// How a tensor depends on the batch's rows (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No batch data reaches it (variables, constants, other placeholders).
    Free,
    /// Per-row values, the batch on axis 0.
    Rows,
    /// A mean over the rows, transformed linearly since.
    Mean,
    /// A sum over the rows, transformed linearly since.
    Sum,
    /// Anything else: a nonlinear function of a reduction, a mixture, a
    /// reduction of rows moved off axis 0.
    Opaque,
}

use Kind::*;

/// The kind of output 0 of `loss`, where `batch_inputs` names the
/// placeholders whose axis 0 is the batch.
pub fn loss_kind(g: &Graph, loss: NodeId, batch_inputs: &[String]) -> Result<Kind, towers_graph::GraphError> {
    Ok(kinds(g, batch_inputs)?.get(&loss).copied().unwrap_or(Opaque))
}

/// The kind of every node's output 0 (of every output for `split`'s
/// divisions of the batch), in one pass over the graph.
pub fn kinds(g: &Graph, batch_inputs: &[String]) -> Result<BTreeMap<NodeId, Kind>, towers_graph::GraphError> {
    let batch: BTreeSet<&str> = batch_inputs.iter().map(String::as_str).collect();
    let mut kind: BTreeMap<NodeId, Kind> = BTreeMap::new();
    for id in g.topo_order()? {
        let ins: Vec<Kind> = g.inputs(id).iter().map(|t| kind.get(&t.node).copied().unwrap_or(Opaque)).collect();
        let n = g.node(id);
        let k = match &n.op {
            Op::Placeholder { .. } if batch.contains(n.name.as_str()) => Rows,
            // `split`'s division of a batch input among the replicas.
            Op::Split { axis: 0, .. } if ins == [Rows] && g.inputs(id).iter().all(|t| is_batch(g, t.node, &batch)) => {
                Rows
            }
            Op::BatchMatMul { .. } => batch_matmul(g, id, &ins),
            // top_k of a vector selects among the rows themselves.
            Op::TopK { .. }
                if g.inputs(id).first().map(|&t| g.tensor_type(t)).transpose()?.is_none_or(|t| t.shape.rank() < 2) =>
            {
                if free(&ins) {
                    Free
                } else {
                    Opaque
                }
            }
            op => rule(op, &ins),
        };
        kind.insert(id, k);
    }
    Ok(kind)
}

/// A batched product keeps the rows on axis 0 when every input is free or
/// rows whose axis 0 is the output's (its rank the output's: a rank-2
/// operand's axis 0 is a matrix row, and a lower-rank batch aligns with a
/// later output axis); each example's product then reads only its own
/// matrices and shared free ones (attention's `q·kᵀ`, a projection by a
/// shared `[D,E]`). Anything else (a reduction through it) is `Opaque`.
fn batch_matmul(g: &Graph, id: NodeId, ins: &[Kind]) -> Kind {
    if free(ins) {
        return Free;
    }
    let rank = |t: Tensor| g.tensor_type(t).map_or(usize::MAX, |t| t.shape.rank());
    let out = rank(Tensor::new(id, 0));
    let aligned = g.inputs(id).iter().zip(ins).all(|(&t, &k)| k == Free || (k == Rows && rank(t) == out));
    if aligned {
        Rows
    } else {
        Opaque
    }
}

fn is_batch(g: &Graph, id: NodeId, batch: &BTreeSet<&str>) -> bool {
    let n = g.node(id);
    matches!(n.op, Op::Placeholder { .. }) && batch.contains(n.name.as_str())
}

/// Whether every input is `Free`.
fn free(ins: &[Kind]) -> bool {
    ins.iter().all(|&k| k == Free)
}

/// The kind of a sum of terms of kinds `a` and `b` (also a difference).
fn add(a: Kind, b: Kind) -> Kind {
    match (a, b) {
        (Free, k) | (k, Free) if k != Sum => k,
        (Rows, Rows) => Rows,
        (Mean, Mean) => Mean,
        (Sum, Sum) => Sum,
        // A sum plus a term that does not grow with the rows (a
        // regularizer), means mixed with sums, rows broadcast against a
        // reduction (centering by the batch mean): no replica weights fit.
        _ => Opaque,
    }
}

/// The kind of `a * b`.
fn mul(a: Kind, b: Kind) -> Kind {
    match (a, b) {
        (Free, k) | (k, Free) => k,
        (Rows, Rows) => Rows,
        _ => Opaque,
    }
}

/// A reduction over `axes` of a tensor of kind `k`; `mean` for a mean.
fn reduce(k: Kind, axes: &[usize], mean: bool) -> Kind {
    match k {
        Rows if axes.contains(&0) => {
            if mean {
                Mean
            } else {
                Sum
            }
        }
        k => k,
    }
}

/// Ops that map each row to a row (axis 0 stays the batch) and are linear
/// in their input, or that map rows to rows in any way.
fn rule(op: &Op, ins: &[Kind]) -> Kind {
    if free(ins) {
        return Free;
    }
    let one = ins.first().copied().unwrap_or(Opaque);
    match op {
        Op::ReduceMean { axes, .. } => reduce(one, axes, true),
        Op::ReduceSum { axes, .. } => reduce(one, axes, false),
        Op::L2Loss => match one {
            Rows => Sum,
            _ => Opaque,
        },
        // Linear maps of one input keep every kind.
        Op::Identity | Op::StopGradient | Op::Cast { .. } | Op::Unary(UnaryOp::Neg) => one,
        Op::Reshape { shape } => match one {
            // Rows stay rows only with the batch still leading.
            Rows if shape.first() == Some(&-1) => Rows,
            Rows => Opaque,
            k => k,
        },
        Op::ExpandDims { axis } => match one {
            Rows if *axis == 0 => Opaque,
            k => k,
        },
        Op::Squeeze { axes } => match one {
            Rows if axes.contains(&0) => Opaque,
            k => k,
        },
        Op::Transpose { perm } => match one {
            Rows if perm.first() != Some(&0) => Opaque,
            k => k,
        },
        Op::Binary(BinaryOp::Add) | Op::Binary(BinaryOp::Sub) | Op::BiasAdd => add(ins[0], ins[1]),
        Op::AddN => ins.iter().copied().reduce(add).unwrap_or(Free),
        Op::Binary(BinaryOp::Mul) => mul(ins[0], ins[1]),
        Op::Binary(BinaryOp::Div) => match (ins[0], ins[1]) {
            (k, Free) => k,
            (Rows | Free, Rows) => Rows,
            _ => Opaque,
        },
        Op::MatMul { transpose_a, .. } => match (ins[0], ins[1]) {
            (Rows, Free) if !transpose_a => Rows,
            (Mean | Sum, Free) | (Free, Mean | Sum) => mul(ins[0], ins[1]),
            _ => Opaque,
        },
        Op::Concat { axis } | Op::Split { axis, .. } if *axis != 0 => rows_only(ins),
        Op::Slice { begin, size } => match one {
            Rows if begin.first().copied().unwrap_or(0) == 0 && size.first().copied().unwrap_or(-1) == -1 => Rows,
            Rows => Opaque,
            k => k,
        },
        Op::Tile { multiples } if multiples.first().copied().unwrap_or(1) == 1 => rows_only(ins),
        Op::Pad { paddings, .. } if paddings.first().is_none_or(|p| *p == [0, 0]) => rows_only(ins),
        // Gathering rows of a free table by per-row indices (embeddings).
        Op::Gather { axis } => match (ins[0], ins[1]) {
            (Free, Rows) => Rows,
            (Rows, Free) if *axis != 0 => Rows,
            _ => Opaque,
        },
        // Row-wise ops: every other input must be free (weights, biases)
        // or rows of the same batch.
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Conv2D { .. }
        | Op::MaxPool { .. }
        | Op::AvgPool { .. }
        | Op::Softmax
        | Op::LogSoftmax
        | Op::SparseSoftmaxCrossEntropy
        | Op::SoftmaxCrossEntropy
        | Op::OneHot { .. }
        | Op::ArgMax { .. }
        // Top-k along the last axis of a rank >= 2 tensor (see `kinds`).
        | Op::TopK { .. }
        | Op::TopKGrad
        | Op::InTopK { .. }
        | Op::Equal
        | Op::Compare(_)
        | Op::Select
        | Op::Dropout { .. }
        | Op::BatchNorm { .. }
        // A free value broadcast to the rows' shape (`equal`'s broadcast,
        // `zeros_like` of rows) is rows.
        | Op::BroadcastLike
        | Op::Fused { .. } => rows_only(ins),
        _ => Opaque,
    }
}

/// Why node `id` reads other examples' rows of a per-row input along the
/// batch's axis 0, if it does: a slice or gather of some of the batch's
/// rows, a max/min over the batch, a tile, pad or split of axis 0. With
/// several replicas each holds only its own rows, so such a node cannot
/// compute what one device computes; `replicate` refuses it (`kinds` from
/// [`kinds`] of the graph before replication). A reshape or transpose that
/// moves the batch off axis 0 (a time-major RNN) ends the analysis there
/// (`Opaque`), so nothing after it is refused.
pub fn cross_row_read(g: &Graph, id: NodeId, kinds: &BTreeMap<NodeId, Kind>) -> Option<String> {
    let ins = g.inputs(id);
    let rows = |i: usize| ins.get(i).is_some_and(|t| kinds.get(&t.node) == Some(&Rows));
    if !rows(0) {
        return None;
    }
    let batch = ins.first().and_then(|&t| g.tensor_type(t).ok()).and_then(|ty| ty.shape.dim(0));
    match &g.node(id).op {
        Op::Slice { begin, size } => {
            let (b0, s0) = (begin.first().copied().unwrap_or(0), size.first().copied().unwrap_or(-1));
            if b0 == 0 && s0 >= 0 && Some(s0 as usize) == batch {
                return Some(format!(
                    "it slices {s0} rows, the whole global batch, by number: write the size -1 (all rows)"
                ));
            }
            (b0 != 0 || s0 != -1).then(|| format!("it slices rows from {b0} ({s0} of them) of the batch"))
        }
        Op::Gather { axis: 0 } => Some("it gathers rows of the batch by index".into()),
        Op::ReduceMax { axes, .. } | Op::ReduceMin { axes, .. } if axes.contains(&0) => {
            Some("it takes a max or min over the batch's rows".into())
        }
        Op::Tile { multiples } if multiples.first().is_some_and(|&m| m != 1) => {
            Some("it tiles the batch's rows".into())
        }
        Op::Pad { paddings, .. } if paddings.first().is_some_and(|p| *p != [0, 0]) => {
            Some("it pads the batch's axis 0 with rows".into())
        }
        Op::Split { axis: 0, sizes } => Some(format!("it splits the batch's rows into parts of {sizes:?} rows")),
        _ => None,
    }
}

/// `Rows` when every input is rows or free, else `Opaque`.
fn rows_only(ins: &[Kind]) -> Kind {
    if ins.iter().all(|&k| k == Rows || k == Free) {
        Rows
    } else {
        Opaque
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use towers_graph::{DType, GraphBuilder, Initializer, Tensor};

    /// Logits of a dense layer on a batch input, and labels.
    fn model(b: &mut GraphBuilder) -> (Tensor, Tensor) {
        let x = b.placeholder("x", DType::F32, [None, Some(3)]).unwrap();
        let y = b.placeholder("y", DType::I32, [None]).unwrap();
        let w = b.get_variable("w", [3, 2], Initializer::Zeros).unwrap();
        (b.matmul(x, w).unwrap(), y)
    }

    fn kind_of(b: GraphBuilder, loss: Tensor) -> Kind {
        let g = b.finish();
        loss_kind(&g, loss.node, &["x".into(), "y".into()]).unwrap()
    }

    #[test]
    fn means_and_sums_of_the_rows_are_told_apart() {
        let mut b = GraphBuilder::new();
        let (logits, y) = model(&mut b);
        let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
        let mean = b.reduce_mean(xent, &[0], false).unwrap();
        let sum = b.reduce_sum(xent, &[0], false).unwrap();
        let twelve = b.scalar(12.0).unwrap();
        let sum_div = b.div(sum, twelve).unwrap();
        let l2 = b.l2_loss(logits).unwrap();
        let reg = b.get_variable("r", [0usize; 0], Initializer::Zeros).unwrap();
        let mean_reg = b.add(mean, reg).unwrap();
        let sum_reg = b.add(sum, reg).unwrap();
        let root = b.unary(UnaryOp::Sqrt, mean).unwrap();
        let g = b.finish();
        let k = |t: Tensor| loss_kind(&g, t.node, &["x".into(), "y".into()]).unwrap();
        assert_eq!(k(xent), Rows);
        assert_eq!(k(mean), Mean);
        assert_eq!(k(sum), Sum);
        assert_eq!(k(sum_div), Sum, "a sum divided by a constant batch size is still a sum");
        assert_eq!(k(l2), Sum);
        assert_eq!(k(mean_reg), Mean, "a regularizer adds the same term to every replica's mean");
        assert_eq!(k(sum_reg), Opaque, "a sum plus a regularizer has no replica weights");
        assert_eq!(k(root), Opaque);
    }

    #[test]
    fn reductions_over_other_axes_keep_the_rows() {
        let mut b = GraphBuilder::new();
        let (logits, _) = model(&mut b);
        let sq = b.square(logits).unwrap();
        let per_row = b.reduce_sum(sq, &[1], false).unwrap();
        let mean_all = b.reduce_mean_all(sq).unwrap();
        let then_sum = b.reduce_mean(sq, &[0], false).unwrap();
        let then_sum = b.reduce_sum(then_sum, &[0], false).unwrap();
        let g = b.finish();
        let k = |t: Tensor| loss_kind(&g, t.node, &["x".into(), "y".into()]).unwrap();
        assert_eq!(k(per_row), Rows);
        assert_eq!(k(mean_all), Mean);
        assert_eq!(k(then_sum), Mean, "a sum over features of a batch mean is a batch mean");
    }

    #[test]
    fn a_batch_statistic_broadcast_back_over_the_rows_is_opaque() {
        let mut b = GraphBuilder::new();
        let (logits, _) = model(&mut b);
        let mean = b.reduce_mean(logits, &[0], true).unwrap();
        let centred = b.sub(logits, mean).unwrap();
        let sq = b.square(centred).unwrap();
        let loss = b.reduce_mean_all(sq).unwrap();
        assert_eq!(kind_of(b, loss), Opaque);
    }

    /// Attention's products keep the rows (`q·kᵀ` of two row tensors, a
    /// projection by a shared weight); a row tensor of lower rank than the
    /// product (its axis 0 lands on a later output axis) does not.
    #[test]
    fn batched_products_of_rows_are_rows_when_axis_0_stays_the_examples() {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, [None, Some(4), Some(3)]).unwrap();
        let r = b.placeholder("r", DType::F32, [None, Some(3)]).unwrap();
        let w = b.get_variable("w", [3, 3], Initializer::Zeros).unwrap();
        let heads = b.get_variable("heads", [2, 3, 5], Initializer::Zeros).unwrap();
        let q = b.matmul(x, w).unwrap();
        let scores = b.matmul_t(q, x, false, true).unwrap();
        let mean = b.reduce_mean_all(scores).unwrap();
        let moved = b.matmul(r, heads).unwrap();
        let g = b.finish();
        let k = |t: Tensor| loss_kind(&g, t.node, &["x".into(), "r".into()]).unwrap();
        assert_eq!(k(q), Rows);
        assert_eq!(k(scores), Rows);
        assert_eq!(k(mean), Mean);
        assert_eq!(k(moved), Opaque, "[N,3]·[2,3,5] is [2,N,5]: the rows on axis 1");
    }

    /// cifar10_eval.py's precision: in_top_k of per-row logits and labels is
    /// rows, so its count is a sum and its mean a mean; top_k along the
    /// classes keeps the rows, top_k of a vector of the rows selects among
    /// them (opaque).
    #[test]
    fn top_k_selections_along_the_classes_keep_the_rows() {
        let mut b = GraphBuilder::new();
        let (logits, y) = model(&mut b);
        let hit = b.in_top_k(logits, y, 1).unwrap();
        let hit = b.cast(hit, DType::F32).unwrap();
        let count = b.reduce_sum_all(hit).unwrap();
        let precision = b.reduce_mean_all(hit).unwrap();
        let (values, _) = b.top_k(logits, 2).unwrap();
        let best = b.reduce_sum(values, &[1], false).unwrap();
        let (of_rows, _) = b.top_k(best, 3).unwrap();
        let picked = b.reduce_sum_all(of_rows).unwrap();
        let g = b.finish();
        let k = |t: Tensor| loss_kind(&g, t.node, &["x".into(), "y".into()]).unwrap();
        assert_eq!((k(hit), k(count), k(precision)), (Rows, Sum, Mean));
        assert_eq!((k(values), k(best)), (Rows, Rows));
        assert_eq!((k(of_rows), k(picked)), (Opaque, Opaque));
    }
}
