//! The closed set of operations: ops are data.
//!
//! Every op derives `Clone, Debug, PartialEq, Eq, Hash, Serialize,
//! Deserialize`, so hashing, CSE, serde and snapshots come free. Floating
//! attributes use [`F32`], which compares by bits. Input order is fixed per
//! op and documented on each variant ("in:"), as are the outputs ("out:").
//! Ops whose `is_stateful` is true write a variable and are never merged,
//! duplicated or removed by a rewrite.
//!
//! Elementwise arithmetic and activations are the kernels' own vocabulary:
//! `Op::Binary(BinaryOp)`, `Op::Unary(UnaryOp)` and `Op::UnaryGrad(UnaryOp)`
//! (every unary gradient is a function of the op's output y), so a new
//! unary op is one row of `towers_vocab`'s table. Their TF type names come
//! from those enums (`Relu`, `ReluGrad`, `RealDiv`, ...).

use serde::{Deserialize, Serialize};

use crate::types::{DType, F32};

/// Re-exports: the op vocabulary shared with the kernels and the plan, one
/// definition each, in `towers_vocab` (the op tables, padding, fused
/// expressions, initializers).
pub use towers_vocab::{
    BinaryOp, Comparison, Distribution, FanMode, FusedExpr, FusedStep, Initializer, Padding, UnaryOp,
};

/// A small constant tensor (scalars, learning rates, shapes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConstValue {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Values as f32 (integers are exact up to 2^24).
    pub data: Vec<F32>,
}

impl ConstValue {
    pub fn scalar(v: f32) -> ConstValue {
        ConstValue { dtype: DType::F32, shape: vec![], data: vec![F32(v)] }
    }
}

/// Which optimizer an apply node implements, with its hyper-parameters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Optimizer {
    /// Plain SGD: `w -= lr * g`.
    Sgd { lr: F32 },
    /// TF MomentumOptimizer: `a = m*a + g; w -= lr*a` (Nesterov: `w -= lr*(g + m*a)`).
    Momentum { lr: F32, momentum: F32, nesterov: bool },
    /// TF AdamOptimizer with bias correction from the step count.
    Adam { lr: F32, beta1: F32, beta2: F32, epsilon: F32 },
    // optimizers of issue 22
    /// TF1 `RMSPropOptimizer(lr, decay=0.9, momentum=0.0, epsilon=1e-10,
    /// centered=False)`: `ms += (g² - ms)(1 - decay)`; `mom = momentum·mom +
    /// lr·g / sqrt(ms + epsilon)`; `w -= mom`. Slots `RMSProp` (ms, starting
    /// at ones, as TF1) and `RMSProp_1` (mom, zeros). Not centered.
    RmsProp { lr: F32, decay: F32, momentum: F32, epsilon: F32 },
    /// TF1 `AdagradOptimizer(lr, initial_accumulator_value=0.1)`:
    /// `accum += g²`; `w -= lr·g / sqrt(accum)`. Slot `Adagrad`, starting at
    /// `initial_accumulator_value`.
    Adagrad { lr: F32, initial_accumulator_value: F32 },
}

impl Optimizer {
    /// TF's slot names for this optimizer (`weights/Momentum`, `weights/Adam`,
    /// `weights/Adam_1`, `weights/RMSProp`, `weights/RMSProp_1`, `weights/Adagrad`).
    pub fn slot_names(&self) -> &'static [&'static str] {
        match self {
            Optimizer::Sgd { .. } => &[],
            Optimizer::Momentum { .. } => &["Momentum"],
            Optimizer::Adam { .. } => &["Adam", "Adam_1"],
            Optimizer::RmsProp { .. } => &["RMSProp", "RMSProp_1"],
            Optimizer::Adagrad { .. } => &["Adagrad"],
        }
    }

    /// How each slot of [`Optimizer::slot_names`] starts, as TF1 creates it:
    /// zeros, except RMSProp's mean square (`ones_initializer`, TF1's
    /// `rmsprop.py` `_create_slots`) and Adagrad's accumulator
    /// (`constant_initializer(initial_accumulator_value)`, `adagrad.py`).
    pub fn slot_initializers(&self) -> Vec<Initializer> {
        match self {
            Optimizer::RmsProp { .. } => vec![Initializer::Ones, Initializer::Zeros],
            Optimizer::Adagrad { initial_accumulator_value, .. } => {
                vec![Initializer::Constant(*initial_accumulator_value)]
            }
            other => vec![Initializer::Zeros; other.slot_names().len()],
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd { .. } => "GradientDescent",
            Optimizer::Momentum { .. } => "Momentum",
            Optimizer::Adam { .. } => "Adam",
            Optimizer::RmsProp { .. } => "RMSProp",
            Optimizer::Adagrad { .. } => "Adagrad",
        }
    }
}

/// Every operation of the IR.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Op {
    // ---- sources -------------------------------------------------------
    /// A fed input. out: the fed tensor.
    Placeholder {
        dtype: DType,
        shape: crate::types::Shape,
    },
    /// A constant. out: the value.
    Const {
        value: ConstValue,
    },
    /// A variable; the node's name is the variable's full name. out: its value.
    Variable {
        dtype: DType,
        shape: Vec<usize>,
        init: Initializer,
        trainable: bool,
    },

    // ---- dense math ----------------------------------------------------
    /// in: a, b (rank 2). out: a·b with optional transposes.
    MatMul {
        transpose_a: bool,
        transpose_b: bool,
    },
    /// in: a `[..., m, k]`, b `[..., k, n]` (rank >= 2, at least one >= 3;
    /// the transposes swap the last two axes of their operand). out:
    /// `[..., m, n]`, one product per batch index (TF's `BatchMatMulV2`,
    /// `adj_x`/`adj_y` as `transpose_a`/`transpose_b`; made by
    /// `GraphBuilder::matmul` when an operand has rank 3 or more). The batch
    /// dimensions (all but the last two) are equal, or one operand has none
    /// (rank 2) or only size-1 ones and is shared by every product: the
    /// broadcasting a strided batched GEMM (stride 0) computes. Mixed
    /// broadcasting (`[B,1,..]` against `[1,H,..]`) is refused.
    BatchMatMul {
        transpose_a: bool,
        transpose_b: bool,
    },
    /// in: a, b (broadcasting, one dtype). out: a op b.
    Binary(BinaryOp),
    /// in: n tensors of one type. out: their sum.
    AddN,
    /// in: x [..., C], bias [C]. out: x + bias.
    BiasAdd,
    /// in: dy [..., C]. out: sum over all but the last axis, [C].
    BiasAddGrad,
    /// in: x (f32; Neg takes any dtype). out: op(x).
    Unary(UnaryOp),
    /// in: dy, y (the op's output). out: dx, the op's gradient from y
    /// (e.g. Relu: dy where y > 0; Tanh: dy*(1-y²)).
    UnaryGrad(UnaryOp),
    /// in: `expr.inputs()` f32 tensors. out: `expr` of them, every input
    /// broadcast to their common shape. Made by the compiler's equality
    /// saturation from a chain of `Binary`/`Unary`/`UnaryGrad` nodes after
    /// autodiff (never by the builder; it has no gradient).
    Fused {
        expr: FusedExpr,
    },

    // ---- convolution and pooling (NHWC; filters HWIO) -------------------
    /// in: x [N,H,W,C], filter [KH,KW,C,O]. out: [N,OH,OW,O].
    Conv2D {
        strides: [usize; 2],
        padding: Padding,
    },
    /// in: x (for its shape only), filter, dy. out: dx.
    Conv2DBackpropInput {
        strides: [usize; 2],
        padding: Padding,
    },
    /// in: x, filter (for its shape only), dy. out: dfilter.
    Conv2DBackpropFilter {
        strides: [usize; 2],
        padding: Padding,
    },
    /// in: x. out: pooled.
    MaxPool {
        ksize: [usize; 2],
        strides: [usize; 2],
        padding: Padding,
    },
    /// in: x, y, dy. out: dx.
    MaxPoolGrad {
        ksize: [usize; 2],
        strides: [usize; 2],
        padding: Padding,
    },
    AvgPool {
        ksize: [usize; 2],
        strides: [usize; 2],
        padding: Padding,
    },
    /// in: x (for its shape only), dy. out: dx.
    AvgPoolGrad {
        ksize: [usize; 2],
        strides: [usize; 2],
        padding: Padding,
    },

    // ---- shapes ----------------------------------------------------------
    /// in: x. out: x with a new shape; one dimension may be -1 (inferred).
    Reshape {
        shape: Vec<i64>,
    },
    /// in: n tensors. out: their concatenation along `axis`.
    Concat {
        axis: usize,
    },
    /// in: x. out: one tensor per entry of `sizes`, along `axis`.
    Split {
        axis: usize,
        sizes: Vec<usize>,
    },
    /// in: x. out: x[begin .. begin+size]; size -1 means "to the end".
    Slice {
        begin: Vec<usize>,
        size: Vec<i64>,
    },
    /// in: x (for its shape only), dy. out: zeros shaped like x with dy at `begin`.
    SliceGrad {
        begin: Vec<usize>,
    },
    /// in: x, like. out: x broadcast to like's shape.
    BroadcastLike,
    /// in: x, like. out: x summed down to like's shape (gradient of broadcasting).
    SumToLike,

    // ---- softmax and losses ----------------------------------------------
    Softmax,
    LogSoftmax,
    /// in: dy, y (softmax output). out: y*(dy - Σ dy*y).
    SoftmaxGrad,
    /// in: dy, y (log-softmax output). out: dy - exp(y)*Σ dy.
    LogSoftmaxGrad,
    /// in: logits [N,C], labels i32 [N]. out: loss [N], backprop [N,C].
    SparseSoftmaxCrossEntropy,
    /// in: logits [N,C], labels [N,C]. out: loss [N], backprop [N,C].
    SoftmaxCrossEntropy,
    /// in: x. out: Σx²/2, a scalar.
    L2Loss,

    // ---- reductions and comparisons --------------------------------------
    ReduceSum {
        axes: Vec<usize>,
        keep_dims: bool,
    },
    ReduceMean {
        axes: Vec<usize>,
        keep_dims: bool,
    },
    /// in: x (f32). out: the maximum over `axes` (TF's `Max`); a NaN
    /// propagates, an empty reduction gives -inf.
    ReduceMax {
        axes: Vec<usize>,
        keep_dims: bool,
    },
    /// in: x (f32). out: the minimum over `axes` (TF's `Min`).
    ReduceMin {
        axes: Vec<usize>,
        keep_dims: bool,
    },
    /// in: x. out: i32 index of the maximum along `axis` (first on ties).
    ArgMax {
        axis: usize,
    },
    /// in: a, b. out: bool.
    Equal,
    /// in: a, b (one dtype, f32 or i32; one shape once the builder has
    /// broadcast them). out: bool, `a cmp b` (TF's `Greater`, `Less`, ...).
    /// No gradient.
    Compare(Comparison),
    /// in: cond (bool), x, y (f32, one shape; cond of x's shape, or a vector
    /// of x's first dimension selecting rows). out: x where cond, else y
    /// (TF1's `tf.where(cond, x, y)`, op `Select`): the unselected value is
    /// never read into the result, so a NaN or inf there does not leak.
    Select,
    Cast {
        dtype: DType,
    },

    // ---- regularization and normalization --------------------------------
    /// in: x. out: y, mask (0 or 1/keep). Identity with an all-ones mask in
    /// eval mode. The mask of the example r is drawn from (seed, step,
    /// first_row + r), so a tower holding rows `first_row..` of the global
    /// batch draws exactly the mask one device would draw for those rows.
    /// `row_elems` is the elements of one example in `x` (set by `split`;
    /// 0: one axis-0 row), so a tensor whose axis 0 is not the examples'
    /// (attention heads folded into it, `[batch * heads, T, T]`) starts its
    /// tower's masks at its first example, not inside another tower's.
    Dropout {
        rate: F32,
        seed: u64,
        first_row: usize,
        #[serde(default, skip_serializing_if = "is_zero")]
        row_elems: usize,
    },
    /// in: x, gamma, beta, moving_mean, moving_var. out: y, batch_mean,
    /// batch_inv_std, batch_var (unbiased). Eval mode normalizes with the
    /// moving statistics.
    BatchNorm {
        epsilon: F32,
    },
    /// in: dy, x, gamma, batch_mean, batch_inv_std. out: dx, dgamma, dbeta.
    BatchNormGrad,
    Identity,
    /// Identity whose gradient is zero.
    StopGradient,

    // ---- state ------------------------------------------------------------
    /// in: variable, value. Writes var = var*decay + value*(1-decay). out: the variable.
    AssignMovingAverage {
        decay: F32,
    },
    /// in: variable, slots..., grad, global_step, learning_rate (f32 scalar,
    /// read each step). Writes the variable and its slots.
    /// Reads global_step *before* this step's increment (the `IncrementStep`
    /// node has a control edge from every apply), so Adam's bias correction
    /// uses t = global_step + 1 (TF's beta powers after t updates).
    ApplyGradient {
        optimizer: Optimizer,
    },
    /// in: global_step (i32 scalar variable). Writes step += 1.
    IncrementStep,

    // ---- towers -----------------------------------------------------------
    /// in: one gradient per tower. out: Σ weights[i]*in[i], the cross-tower
    /// reduction as one n-ary node (the weights are the towers' shares of the batch).
    TowerMean {
        weights: Vec<F32>,
    },
    /// in: a_0, b_0, a_1, b_1, ... (one pair per replica). out:
    /// Σ weights[i]·op(a_i)·op(b_i), the weighted mean of the replicas'
    /// matrix products as one product over the whole batch (the
    /// `tower_matmul` pass folds a `TowerMean` of the replicas' weight
    /// gradients into it: the reduction becomes the product's sum over the
    /// batch). Every pair gives the same [m, n]; k (a replica's batch) may
    /// differ. No gradient: it only appears after autodiff.
    TowerMatMul {
        weights: Vec<F32>,
        transpose_a: bool,
        transpose_b: bool,
    },
    /// in: n tensors of this process (a gradient bucket: the ranks' partial
    /// sums, weighted by their shares of the global batch). out: n tensors,
    /// output i the sum of input i over every process of the group (the
    /// plan's collective step, in place). `bucket` numbers the buckets of a
    /// device in the order their all-reduces start. With `root: Some(k)`
    /// (`--variables ps`: every gradient of the bucket is read only by the
    /// update of a variable rank `k` owns) the sums go to rank `k` alone, a
    /// reduce instead of an all-reduce: on every other rank the outputs are
    /// unspecified and must not be read.
    AllReduce {
        bucket: usize,
        root: Option<usize>,
    },
    /// in: `variables` variables of one parameter-server owner (`root`).
    /// Writes every input with rank `root`'s values (a broadcast across
    /// processes, `--variables ps`: the owner's new values after its
    /// updates). No outputs.
    Broadcast {
        root: usize,
        variables: usize,
    },
    /// in: x on another device. out: x on this node's device.
    Copy,
    /// Groups control inputs; no data.
    NoOp,

    // array ops (issue 22)
    /// in: indices (i32). out: f32 `indices.shape + [depth]`, `on_value`
    /// at each index, `off_value` elsewhere (TF `one_hot`, axis -1; an index
    /// outside `[0, depth)` gives a row of `off_value`). No gradient.
    OneHot {
        depth: usize,
        on_value: F32,
        off_value: F32,
    },
    /// in: x. out: x with output axis k being input axis `perm[k]`.
    Transpose {
        perm: Vec<usize>,
    },
    /// in: x. out: x with a size-1 axis inserted at `axis` (in `0..=rank`).
    /// Lowered as a view of x's buffer (no copy), as `Reshape`.
    ExpandDims {
        axis: usize,
    },
    /// in: x. out: x without the size-1 axes `axes` (sorted, distinct).
    /// Lowered as a view, as `Reshape`.
    Squeeze {
        axes: Vec<usize>,
    },
    /// in: x (f32). out: x padded with `constant_value`, `paddings[i] =
    /// [before, after]` along axis i (TF `pad`, mode CONSTANT).
    Pad {
        paddings: Vec<[usize; 2]>,
        constant_value: F32,
    },
    /// in: params (f32), indices (i32). out: `params.shape[..axis] +
    /// indices.shape + params.shape[axis+1..]` (TF `gather`/`GatherV2`).
    Gather {
        axis: usize,
    },
    /// in: params (for its shape only), indices, dy. out: dparams, zeros
    /// with each dy slice added at its index (TF's `UnsortedSegmentSum`).
    GatherGrad {
        axis: usize,
    },
    /// in: x. out: x repeated `multiples[i]` times along axis i (TF `tile`).
    Tile {
        multiples: Vec<usize>,
    },
    /// in: x (for its shape only), dy. out: dx, dy summed over the copies.
    TileGrad {
        multiples: Vec<usize>,
    },

    // top-k selection (towers_kernels::topk)
    /// in: x (f32 `[..., C]`, `k <= C`). out: values (f32 `[..., k]`),
    /// indices (i32 `[..., k]`): each row's k largest, sorted descending,
    /// equal values by lower index (TF's `TopKV2`, sorted=True; a NaN ranks
    /// above every number).
    TopK {
        k: usize,
    },
    /// in: x (for its shape only), dvalues, indices (TopK's outputs). out:
    /// dx, zeros with each dvalue added at its index (TF's `_TopKGrad`).
    TopKGrad,
    /// in: predictions (f32 `[N, C]`), targets (i32 `[N]`). out: bool `[N]`,
    /// TF's `InTopK`: true iff fewer than k predictions of the row are
    /// strictly larger than the target's, the target is in `[0, C)` and the
    /// row is finite. No gradient.
    InTopK {
        k: usize,
    },
}

impl Op {
    /// The op's type name, as in TF where one exists.
    pub fn type_name(&self) -> &'static str {
        match self {
            Op::Placeholder { .. } => "Placeholder",
            Op::Const { .. } => "Const",
            Op::Variable { .. } => "VariableV2",
            Op::MatMul { .. } => "MatMul",
            Op::BatchMatMul { .. } => "BatchMatMulV2",
            Op::Binary(op) => op.tf_name(),
            Op::AddN => "AddN",
            Op::BiasAdd => "BiasAdd",
            Op::BiasAddGrad => "BiasAddGrad",
            Op::Unary(op) => op.tf_name(),
            Op::UnaryGrad(op) => op.tf_grad_name(),
            Op::Fused { .. } => "_FusedElementwise",
            Op::Conv2D { .. } => "Conv2D",
            Op::Conv2DBackpropInput { .. } => "Conv2DBackpropInput",
            Op::Conv2DBackpropFilter { .. } => "Conv2DBackpropFilter",
            Op::MaxPool { .. } => "MaxPool",
            Op::MaxPoolGrad { .. } => "MaxPoolGrad",
            Op::AvgPool { .. } => "AvgPool",
            Op::AvgPoolGrad { .. } => "AvgPoolGrad",
            Op::Reshape { .. } => "Reshape",
            Op::Concat { .. } => "ConcatV2",
            Op::Split { .. } => "SplitV",
            Op::Slice { .. } => "Slice",
            Op::SliceGrad { .. } => "SliceGrad",
            Op::BroadcastLike => "BroadcastLike",
            Op::SumToLike => "SumToLike",
            Op::Softmax => "Softmax",
            Op::LogSoftmax => "LogSoftmax",
            Op::SoftmaxGrad => "SoftmaxGrad",
            Op::LogSoftmaxGrad => "LogSoftmaxGrad",
            Op::SparseSoftmaxCrossEntropy => "SparseSoftmaxCrossEntropyWithLogits",
            Op::SoftmaxCrossEntropy => "SoftmaxCrossEntropyWithLogits",
            Op::L2Loss => "L2Loss",
            Op::ReduceSum { .. } => "Sum",
            Op::ReduceMean { .. } => "Mean",
            Op::ReduceMax { .. } => "Max",
            Op::ReduceMin { .. } => "Min",
            Op::ArgMax { .. } => "ArgMax",
            Op::Equal => "Equal",
            Op::Compare(c) => c.tf_name(),
            Op::Select => "Select",
            Op::Cast { .. } => "Cast",
            Op::Dropout { .. } => "Dropout",
            Op::BatchNorm { .. } => "FusedBatchNorm",
            Op::BatchNormGrad => "FusedBatchNormGrad",
            Op::Identity => "Identity",
            Op::StopGradient => "StopGradient",
            Op::AssignMovingAverage { .. } => "AssignMovingAvg",
            Op::ApplyGradient { optimizer } => match optimizer {
                Optimizer::Sgd { .. } => "ApplyGradientDescent",
                Optimizer::Momentum { .. } => "ApplyMomentum",
                Optimizer::Adam { .. } => "ApplyAdam",
                Optimizer::RmsProp { .. } => "ApplyRMSProp",
                Optimizer::Adagrad { .. } => "ApplyAdagrad",
            },
            Op::IncrementStep => "AssignAdd",
            Op::TowerMean { .. } => "TowerMean",
            Op::TowerMatMul { .. } => "TowerMatMul",
            Op::AllReduce { .. } => "AllReduce",
            Op::Copy => "Copy",
            Op::NoOp => "NoOp",
            Op::Broadcast { .. } => "Broadcast",
            // array ops (issue 22)
            Op::OneHot { .. } => "OneHot",
            Op::Transpose { .. } => "Transpose",
            Op::ExpandDims { .. } => "ExpandDims",
            Op::Squeeze { .. } => "Squeeze",
            Op::Pad { .. } => "PadV2",
            Op::Gather { .. } => "GatherV2",
            Op::GatherGrad { .. } => "GatherGrad",
            Op::Tile { .. } => "Tile",
            Op::TileGrad { .. } => "TileGrad",
            Op::TopK { .. } => "TopKV2",
            Op::TopKGrad => "TopKGrad",
            Op::InTopK { .. } => "InTopK",
        }
    }

    /// Writes a variable (or is one): never merged, duplicated or removed.
    pub fn is_stateful(&self) -> bool {
        matches!(
            self,
            Op::Variable { .. }
                | Op::AssignMovingAverage { .. }
                | Op::ApplyGradient { .. }
                | Op::IncrementStep
                | Op::Placeholder { .. }
                | Op::Dropout { .. }
        )
    }

    /// Which inputs the op writes in place (variables and optimizer slots).
    pub fn mutated_inputs(&self) -> std::ops::Range<usize> {
        match self {
            Op::AssignMovingAverage { .. } | Op::IncrementStep => 0..1,
            Op::Broadcast { variables, .. } => 0..*variables,
            Op::ApplyGradient { optimizer } => 0..1 + optimizer.slot_names().len(),
            _ => 0..0,
        }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
