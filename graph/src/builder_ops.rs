//! The builder's core TF ops (`tf.placeholder`, `tf.matmul`, `tf.nn.conv2d`,
//! the reductions, losses, `tf.group`, ...), each one thin method over
//! [`GraphBuilder::op1`], named as TF names the op.
//!
//! Invariants: no method here names, scopes or places a node itself; naming,
//! uniquifying, device scopes and control dependencies all happen in
//! `GraphBuilder::op` (`builder.rs`), and shapes in `infer.rs`, so an op
//! added here is one method with no rule of its own.

use crate::axis::{self, axis_error, AxisIndex};
use crate::builder::GraphBuilder;
use crate::error::{GraphError, Result};
use crate::graph::{NodeId, Tensor};
use crate::op::{BinaryOp, Comparison, ConstValue, Op, UnaryOp};
use crate::types::{DType, Shape, F32};

impl GraphBuilder {
    pub fn placeholder(&mut self, name: &str, dtype: DType, shape: impl Into<Shape>) -> Result<Tensor> {
        self.op1(name, Op::Placeholder { dtype, shape: shape.into() }, &[])
    }
    pub fn constant(&mut self, name: &str, dtype: DType, shape: &[usize], data: &[f32]) -> Result<Tensor> {
        let value = ConstValue { dtype, shape: shape.to_vec(), data: data.iter().map(|&v| F32(v)).collect() };
        self.op1(name, Op::Const { value }, &[])
    }
    pub fn scalar(&mut self, v: f32) -> Result<Tensor> {
        self.op1("Const", Op::Const { value: ConstValue::scalar(v) }, &[])
    }
    /// `tf.matmul(a, b)`: `MatMul` for two matrices; `BatchMatMulV2` (one
    /// product per batch index, `[B,T,D]·[B,D,S] -> [B,T,S]`) when either
    /// operand has rank 3 or more, its batch dimensions equal to the other's
    /// or absent (`[B,T,D]·[D,E]`) or all ones (see `Op::BatchMatMul`).
    pub fn matmul(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.matmul_t(a, b, false, false)
    }
    /// `tf.matmul(a, b, transpose_a, transpose_b)`: as [`GraphBuilder::matmul`],
    /// each flag swapping the last two axes of its operand (TF's `adj_x`,
    /// `adj_y` on a batch): attention's `q·kᵀ` is `matmul_t(q, k, false, true)`.
    pub fn matmul_t(&mut self, a: Tensor, b: Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
        // A tensor this graph does not hold reads as rank 0 here, so that
        // `op1` refuses it with its own error (ForeignTensor naming the node).
        let rank = |t: Tensor| self.graph().tensor_type(t).map_or(0, |t| t.shape.rank());
        let op = if rank(a) > 2 || rank(b) > 2 {
            Op::BatchMatMul { transpose_a, transpose_b }
        } else {
            Op::MatMul { transpose_a, transpose_b }
        };
        self.op1("MatMul", op, &[a, b])
    }
    pub fn add(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.op1("add", Op::Binary(BinaryOp::Add), &[a, b])
    }
    pub fn sub(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.op1("sub", Op::Binary(BinaryOp::Sub), &[a, b])
    }
    pub fn mul(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.op1("mul", Op::Binary(BinaryOp::Mul), &[a, b])
    }
    pub fn div(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.op1("truediv", Op::Binary(BinaryOp::Div), &[a, b])
    }
    pub fn add_n(&mut self, xs: &[Tensor]) -> Result<Tensor> {
        self.op1("AddN", Op::AddN, xs)
    }
    pub fn bias_add(&mut self, x: Tensor, b: Tensor) -> Result<Tensor> {
        self.op1("BiasAdd", Op::BiasAdd, &[x, b])
    }
    /// Any elementwise unary op, named by its TF type name (`Relu`, `Exp`, ...).
    pub fn unary(&mut self, op: UnaryOp, x: Tensor) -> Result<Tensor> {
        self.op1(op.tf_name(), Op::Unary(op), &[x])
    }
    pub fn neg(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Neg, x)
    }
    pub fn relu(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Relu, x)
    }
    pub fn sigmoid(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid, x)
    }
    pub fn tanh(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh, x)
    }
    /// `x` if `x > 0` else `exp(x) - 1` (TF's `tf.nn.elu`).
    pub fn elu(&mut self, x: Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Elu, x)
    }
    pub fn conv2d(
        &mut self,
        x: Tensor,
        filter: Tensor,
        strides: [usize; 2],
        padding: crate::op::Padding,
    ) -> Result<Tensor> {
        self.op1("Conv2D", Op::Conv2D { strides, padding }, &[x, filter])
    }
    pub fn max_pool(
        &mut self,
        x: Tensor,
        ksize: [usize; 2],
        strides: [usize; 2],
        padding: crate::op::Padding,
    ) -> Result<Tensor> {
        self.op1("MaxPool", Op::MaxPool { ksize, strides, padding }, &[x])
    }
    pub fn avg_pool(
        &mut self,
        x: Tensor,
        ksize: [usize; 2],
        strides: [usize; 2],
        padding: crate::op::Padding,
    ) -> Result<Tensor> {
        self.op1("AvgPool", Op::AvgPool { ksize, strides, padding }, &[x])
    }
    pub fn reshape(&mut self, x: Tensor, shape: &[i64]) -> Result<Tensor> {
        self.op1("Reshape", Op::Reshape { shape: shape.to_vec() }, &[x])
    }
    /// Keep the batch dimension, flatten the rest (`[N, ...] -> [N, prod]`).
    pub fn flatten(&mut self, x: Tensor) -> Result<Tensor> {
        let s = self.graph.tensor_type(x)?.shape.clone();
        let rest: Option<usize> = s.0[1..].iter().copied().try_fold(1usize, |a, d| d.and_then(|d| a.checked_mul(d)));
        let rest = rest.ok_or_else(|| GraphError::Shape {
            node: Self::join(&self.name_scope, "Flatten"),
            scope: self.name_scope.clone(),
            op: "Reshape".into(),
            detail: format!("flatten needs all but the batch dimension known, got {s}"),
        })?;
        self.name_scope("Flatten", |b| b.op1("Reshape", Op::Reshape { shape: vec![-1, rest as i64] }, &[x]))
    }
    /// TF `tf.concat(xs, axis)`; `axis` may be negative (`-1`: the last).
    pub fn concat(&mut self, xs: &[Tensor], axis: impl AxisIndex) -> Result<Tensor> {
        let axis = match xs.first() {
            Some(&x) => self.axis_of("concat", "ConcatV2", x, axis)?,
            None => axis.as_i64().max(0) as usize,
        };
        self.op1("concat", Op::Concat { axis }, xs)
    }
    /// TF `tf.split(x, sizes, axis)` (`SplitV`): one output per size, in
    /// order; `axis` may be negative.
    pub fn split(&mut self, x: Tensor, axis: impl AxisIndex, sizes: &[usize]) -> Result<Vec<Tensor>> {
        let axis = self.axis_of("split", "SplitV", x, axis)?;
        let id = self.op("split", Op::Split { axis, sizes: sizes.to_vec() }, &[x])?;
        Ok((0..sizes.len()).map(|i| self.graph.tensor(id, i)).collect())
    }
    pub fn slice(&mut self, x: Tensor, begin: &[usize], size: &[i64]) -> Result<Tensor> {
        self.op1("Slice", Op::Slice { begin: begin.to_vec(), size: size.to_vec() }, &[x])
    }
    pub fn softmax(&mut self, x: Tensor) -> Result<Tensor> {
        self.op1("Softmax", Op::Softmax, &[x])
    }
    pub fn log_softmax(&mut self, x: Tensor) -> Result<Tensor> {
        self.op1("LogSoftmax", Op::LogSoftmax, &[x])
    }
    /// Per-example loss `[N]` of logits `[N,C]` against i32 labels `[N]`.
    ///
    /// Logits of higher rank `[N, d1, ..., C]` with labels `[N, d1, ...]`
    /// (a sequence model's per-step classes) give `[N, d1, ...]`, as TF's:
    /// computed on rows reshaped to `[-1, C]`; every dimension but `N` must
    /// be known.
    pub fn sparse_softmax_cross_entropy_with_logits(&mut self, logits: Tensor, labels: Tensor) -> Result<Tensor> {
        const NAME: &str = "SparseSoftmaxCrossEntropyWithLogits";
        match self.leading(logits)? {
            None => self.op1(NAME, Op::SparseSoftmaxCrossEntropy, &[logits, labels]),
            Some((inner, classes)) => self.name_scope(NAME, |b| {
                let l = b.reshape(logits, &[-1, classes])?;
                let y = b.reshape(labels, &[-1])?;
                let x = b.op1(NAME, Op::SparseSoftmaxCrossEntropy, &[l, y])?;
                b.reshape(x, &inner)
            }),
        }
    }
    /// Per-example loss `[N]` of logits `[N,C]` against one-hot labels `[N,C]`
    /// (of higher rank as [`GraphBuilder::sparse_softmax_cross_entropy_with_logits`],
    /// labels shaped as the logits).
    pub fn softmax_cross_entropy_with_logits(&mut self, logits: Tensor, labels: Tensor) -> Result<Tensor> {
        const NAME: &str = "SoftmaxCrossEntropyWithLogits";
        match self.leading(logits)? {
            None => self.op1(NAME, Op::SoftmaxCrossEntropy, &[logits, labels]),
            Some((inner, classes)) => self.name_scope(NAME, |b| {
                let l = b.reshape(logits, &[-1, classes])?;
                let y = b.reshape(labels, &[-1, classes])?;
                let x = b.op1(NAME, Op::SoftmaxCrossEntropy, &[l, y])?;
                b.reshape(x, &inner)
            }),
        }
    }
    /// For logits of rank above 2 with every dimension but the first known:
    /// the shape of the per-row result (`[-1, d1, ...]`) and the classes.
    fn leading(&self, logits: Tensor) -> Result<Option<(Vec<i64>, i64)>> {
        let shape = &self.graph.tensor_type(logits)?.shape;
        let r = shape.rank();
        if r <= 2 {
            return Ok(None);
        }
        let dims: Option<Vec<usize>> = (1..r).map(|i| shape.dim(i)).collect();
        Ok(dims.map(|d| {
            let mut inner: Vec<i64> = vec![-1];
            inner.extend(d[..d.len() - 1].iter().map(|&n| n as i64));
            (inner, d[d.len() - 1] as i64)
        }))
    }
    /// Sum over `axes` (TF's `tf.reduce_sum`; an axis given twice counts once, as in TF).
    pub fn reduce_sum<A: AxisIndex>(&mut self, x: Tensor, axes: &[A], keep_dims: bool) -> Result<Tensor> {
        let axes = self.axes_of("Sum", "Sum", x, axes)?;
        self.op1("Sum", Op::ReduceSum { axes, keep_dims }, &[x])
    }
    /// Mean over `axes` (TF's `tf.reduce_mean`; an axis given twice counts once, as in TF).
    pub fn reduce_mean<A: AxisIndex>(&mut self, x: Tensor, axes: &[A], keep_dims: bool) -> Result<Tensor> {
        let axes = self.axes_of("Mean", "Mean", x, axes)?;
        self.op1("Mean", Op::ReduceMean { axes, keep_dims }, &[x])
    }
    /// Maximum over `axes` (TF's `tf.reduce_max`; an axis given twice counts
    /// once). f32 only; a NaN among the reduced elements gives NaN. The
    /// gradient is TF's `_MinOrMaxGrad`: dy goes to the elements equal to
    /// the maximum, divided equally among tied ones.
    ///
    /// ```ignore
    /// let pooled = b.reduce_max(h, &[1], false)?; // max over time: [N, T, C] -> [N, C]
    /// ```
    pub fn reduce_max<A: AxisIndex>(&mut self, x: Tensor, axes: &[A], keep_dims: bool) -> Result<Tensor> {
        let axes = self.axes_of("Max", "Max", x, axes)?;
        self.op1("Max", Op::ReduceMax { axes, keep_dims }, &[x])
    }
    /// Minimum over `axes` (TF's `tf.reduce_min`), as [`GraphBuilder::reduce_max`].
    pub fn reduce_min<A: AxisIndex>(&mut self, x: Tensor, axes: &[A], keep_dims: bool) -> Result<Tensor> {
        let axes = self.axes_of("Min", "Min", x, axes)?;
        self.op1("Min", Op::ReduceMin { axes, keep_dims }, &[x])
    }
    /// Mean over every axis.
    pub fn reduce_mean_all(&mut self, x: Tensor) -> Result<Tensor> {
        let r = self.graph.tensor_type(x)?.shape.rank();
        self.reduce_mean(x, &(0..r).collect::<Vec<_>>(), false)
    }
    pub fn reduce_sum_all(&mut self, x: Tensor) -> Result<Tensor> {
        let r = self.graph.tensor_type(x)?.shape.rank();
        self.reduce_sum(x, &(0..r).collect::<Vec<_>>(), false)
    }
    /// TF `tf.argmax(x, axis)` (i32); `axis` may be negative.
    pub fn argmax(&mut self, x: Tensor, axis: impl AxisIndex) -> Result<Tensor> {
        let axis = self.axis_of("ArgMax", "ArgMax", x, axis)?;
        self.op1("ArgMax", Op::ArgMax { axis }, &[x])
    }
    /// `a == b` elementwise, bool (TF's `tf.equal`), with broadcasting:
    /// `equal(ids, pad)` against a scalar builds a padding mask. Operands of
    /// one shape compare directly; otherwise both are brought to the
    /// broadcast shape first (as f32: exact for integers below 2^24).
    pub fn equal(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.comparison("Equal", Op::Equal, a, b)
    }
    /// `a > b` elementwise, bool (TF's `tf.greater`); f32 or i32 operands of
    /// one dtype, broadcast as [`GraphBuilder::equal`]. No gradient.
    pub fn greater(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.comparison("Greater", Op::Compare(Comparison::Greater), a, b)
    }
    /// `a >= b` elementwise, bool (TF's `tf.greater_equal`), as [`GraphBuilder::greater`].
    pub fn greater_equal(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.comparison("GreaterEqual", Op::Compare(Comparison::GreaterEqual), a, b)
    }
    /// `a < b` elementwise, bool (TF's `tf.less`), as [`GraphBuilder::greater`].
    pub fn less(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.comparison("Less", Op::Compare(Comparison::Less), a, b)
    }
    /// `a <= b` elementwise, bool (TF's `tf.less_equal`), as [`GraphBuilder::greater`].
    pub fn less_equal(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.comparison("LessEqual", Op::Compare(Comparison::LessEqual), a, b)
    }
    /// `a != b` elementwise, bool (TF's `tf.not_equal`; NaN != NaN), as
    /// [`GraphBuilder::greater`].
    pub fn not_equal(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.comparison("NotEqual", Op::Compare(Comparison::NotEqual), a, b)
    }
    /// A comparison node `name` with broadcasting: operands of one shape
    /// compare directly; otherwise both are brought to the broadcast shape
    /// first (as f32: exact for integers below 2^24).
    fn comparison(&mut self, name: &str, op: Op, a: Tensor, b: Tensor) -> Result<Tensor> {
        let (ta, tb) = (self.graph.tensor_type(a)?.clone(), self.graph.tensor_type(b)?.clone());
        if ta.shape == tb.shape || ta.dtype != tb.dtype {
            // Same shape, or an error the op's inference words.
            return self.op1(name, op, &[a, b]);
        }
        if crate::infer::broadcast_shapes(&ta.shape, &tb.shape).is_none() {
            return self.op1(name, op, &[a, b]);
        }
        self.name_scope(name, |b_| {
            let f32_of = |bl: &mut GraphBuilder, t: Tensor, dt: DType| {
                if dt == DType::F32 {
                    Ok(t)
                } else {
                    bl.cast(t, DType::F32)
                }
            };
            let fa = f32_of(b_, a, ta.dtype)?;
            let fb = f32_of(b_, b, tb.dtype)?;
            let za = b_.zeros_like(fa)?;
            let zb = b_.zeros_like(fb)?;
            let like = b_.add(za, zb)?;
            let wa = b_.op1("BroadcastLike", Op::BroadcastLike, &[fa, like])?;
            let wb = b_.op1("BroadcastLike", Op::BroadcastLike, &[fb, like])?;
            b_.op1(name, op, &[wa, wb])
        })
    }
    /// TF1's `tf.where(cond, x, y)` (op `Select`): `x` where `cond`, else
    /// `y`. `cond` is bool, of x's shape or a vector of x's first dimension
    /// (then it selects whole rows); `x` and `y` are f32 of one shape. The
    /// unselected branch never reaches the result, so `where_(x > 0,
    /// log(x), 0)` has no NaN. Gradients: dx = where(cond, dy, 0), dy =
    /// where(cond, 0, dy). (`where` is a Rust keyword, hence the `_`.)
    pub fn where_(&mut self, cond: Tensor, x: Tensor, y: Tensor) -> Result<Tensor> {
        self.op1("Select", Op::Select, &[cond, x, y])
    }
    /// TF1's `tf.select`, the old name of [`GraphBuilder::where_`].
    pub fn select(&mut self, cond: Tensor, x: Tensor, y: Tensor) -> Result<Tensor> {
        self.where_(cond, x, y)
    }
    /// TF's `tf.cast(x, dtype)`. A cast to the dtype `x` already has is an
    /// `Identity` named `Cast` (TF returns `x` itself), so the gradient
    /// flows through it; any other cast blocks the gradient (towers has one
    /// float type, and TF's `_CastGrad` passes nothing to or from integers).
    pub fn cast(&mut self, x: Tensor, dtype: DType) -> Result<Tensor> {
        if self.graph.tensor_type(x)?.dtype == dtype {
            return self.op1("Cast", Op::Identity, &[x]);
        }
        self.op1("Cast", Op::Cast { dtype }, &[x])
    }
    /// TF's `tf.nn.dropout(x, rate=rate)`: drop probability `rate`,
    /// identity when the program runs in eval mode. No seed is needed: the
    /// op seed derives from the graph seed and the op's name without its
    /// `tower_<i>/` scope ([`crate::seeds::op_seed`]), so every tower of a
    /// hand-built tower loop, and every replica the compiler makes, draws
    /// from one stream. The rows come from the tower it is built in: when
    /// `x` is computed from output `i` of a batch `split` (axis 0), the
    /// masks are those of the global rows that output holds, as on one
    /// device ([`Op::Dropout`]'s `first_row`).
    pub fn dropout(&mut self, x: Tensor, rate: f32) -> Result<Tensor> {
        let id = self.op("dropout", Op::Dropout { rate: F32(rate), seed: 0, first_row: 0, row_elems: 0 }, &[x])?;
        let seed = crate::seeds::op_seed(self.graph.seed, &self.graph.node(id).name);
        self.finish_dropout(id, seed)
    }

    /// TF's `tf.nn.dropout(x, rate=rate, seed=seed)`: as
    /// [`GraphBuilder::dropout`] with the op seed `seed`, used as given.
    pub fn dropout_with_seed(&mut self, x: Tensor, rate: f32, seed: u64) -> Result<Tensor> {
        let id = self.op("dropout", Op::Dropout { rate: F32(rate), seed, first_row: 0, row_elems: 0 }, &[x])?;
        self.finish_dropout(id, seed)
    }

    /// Set a new dropout node's seed and its first global row.
    fn finish_dropout(&mut self, id: NodeId, seed: u64) -> Result<Tensor> {
        let row = crate::seeds::split_row_of(&self.graph, id)?;
        // One axis-0 row's elements: `split` replaces it by one example's
        // when it divides the batch over towers.
        let x = self.graph.inputs(id)[0];
        let shape = &self.graph.tensor_type(x)?.shape;
        let per_row: Option<usize> = (1..shape.rank()).map(|i| shape.dim(i)).product();
        if let Op::Dropout { seed: s, first_row, row_elems, .. } = &mut self.graph.node_mut(id).op {
            *s = seed;
            *first_row = row;
            *row_elems = per_row.unwrap_or(0);
        }
        Ok(self.graph.tensor(id, 0))
    }
    pub fn l2_loss(&mut self, x: Tensor) -> Result<Tensor> {
        self.op1("L2Loss", Op::L2Loss, &[x])
    }
    pub fn identity(&mut self, x: Tensor, name: &str) -> Result<Tensor> {
        self.op1(name, Op::Identity, &[x])
    }
    pub fn stop_gradient(&mut self, x: Tensor) -> Result<Tensor> {
        self.op1("StopGradient", Op::StopGradient, &[x])
    }
    /// A group node with control inputs only (TF's `tf.group`).
    pub fn group(&mut self, name: &str, deps: &[NodeId]) -> Result<NodeId> {
        self.control_dependencies(deps, |b| b.op(name, Op::NoOp, &[]))
    }
}

/// `axes` without repeats, in first-seen order.
impl GraphBuilder {
    /// `axis` of the node `name` would be, resolved against `x`'s rank
    /// (see [`crate::axis`]).
    pub(crate) fn axis_of(&self, name: &str, op: &str, x: Tensor, axis: impl AxisIndex) -> Result<usize> {
        let rank = self.graph.tensor_type(x)?.shape.rank();
        axis::resolve(axis, rank)
            .map_err(|detail| axis_error(Self::join(&self.name_scope, name), self.name_scope.clone(), op, detail))
    }
    /// `axes` resolved as [`GraphBuilder::axis_of`]; an axis given twice
    /// (also as `1` and `-1` of a rank-2 input) counts once, as in TF.
    pub(crate) fn axes_of<A: AxisIndex>(&self, name: &str, op: &str, x: Tensor, axes: &[A]) -> Result<Vec<usize>> {
        let mut out: Vec<usize> = Vec::with_capacity(axes.len());
        for &a in axes {
            let a = self.axis_of(name, op, x, a)?;
            if !out.contains(&a) {
                out.push(a);
            }
        }
        Ok(out)
    }
}
