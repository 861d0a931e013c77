//! The kernel ABI: the closed set of kernels a plan launches, with every
//! parameter the kernel needs already computed (shapes, strides,
//! transposes, scalars), so a backend only dispatches. This enum is the
//! contract every backend honours: the CPU backend calls the body of the
//! same name in this crate, a CUDA backend its twin. Each variant's
//! operands (names, roles, dtypes, element counts) are declared once by
//! [`Kernel::signature`] (`crate::operands`); its docs name them too, `in:`
//! the `inputs` of the launch, `out:` its `outputs`, in order, and a test
//! holds those names to the signature's. Its parameter blocks are the kernels' own types
//! ([`ConvGeom`], [`PoolGeom`], [`UnaryOp`], [`BinaryOp`], [`DType`]).

use serde::{Deserialize, Serialize};

use crate::conv::ConvGeom;
use crate::dtype::DType;
use crate::elementwise::{BinaryOp, FusedExpr, UnaryOp};
use crate::family::Desc;
use crate::pool::PoolGeom;

/// One kernel with its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Kernel {
    /// in: a, b. out: c = op(a)·op(b), `c: [m, n]`.
    MatMul {
        m: usize,
        n: usize,
        k: usize,
        trans_a: bool,
        trans_b: bool,
    },
    /// in: a, b. out: c = one product per batch index, `c_i = op(a_i)·op(b_i)`,
    /// `c: [batch, m, n]` (`Op::BatchMatMul`). `a` holds `batch` matrices
    /// of `m*k`, or one read by every product when `shared_a` (a broadcast
    /// operand: stride 0); `b` likewise with `k*n` and `shared_b`. CPU: the
    /// `gemm` crate once per index; CUDA: one strided batched cuBLAS GEMM.
    BatchMatMul {
        batch: usize,
        m: usize,
        n: usize,
        k: usize,
        trans_a: bool,
        trans_b: bool,
        shared_a: bool,
        shared_b: bool,
    },
    /// in: a_0, b_0, a_1, b_1, ... (one pair per replica). out:
    /// c = Σ weights[i]·op(a_i)·op(b_i), `c: [m, n]`, pair i with k =
    /// `ks[i]` (`Op::TowerMatMul`: the replicas' weight gradients and their
    /// mean as one product over the whole batch). The CPU body always
    /// computes it as two row blocks, split at
    /// [`crate::gemm::tower_matmul_split`], so a backend may run the blocks
    /// on two threads with the bits of one.
    TowerMatMul {
        m: usize,
        n: usize,
        ks: Vec<usize>,
        trans_a: bool,
        trans_b: bool,
        weights: Vec<f32>,
    },
    /// A [`Kernel::TowerMatMul`] fused into the plain SGD or (non-Nesterov)
    /// momentum update that is its only consumer, so the weight gradient is
    /// never stored: in: the pairs as `TowerMatMul`, then the learning rate
    /// (f32[1]). out: the variable (and momentum's accumulator), in place.
    /// SGD: `w += Σ (-lr·weights[i])·op(a_i)·op(b_i)`, one accumulating GEMM
    /// per pair straight into `w`. Momentum: `acc = momentum·acc + Σ
    /// weights[i]·op(a_i)·op(b_i)` by GEMMs into `acc` (the first with beta =
    /// momentum), then `w -= lr·acc` row by row. Equal to the unfused update
    /// up to float reassociation. Rows split as `TowerMatMul`'s.
    TowerMatMulApply {
        m: usize,
        n: usize,
        ks: Vec<usize>,
        trans_a: bool,
        trans_b: bool,
        weights: Vec<f32>,
        apply: Box<Kernel>,
    },
    /// in: a, b, bias. out: y = `act(op(a) op(b) + bias)` (`act` None: the sum
    /// alone): a `MatMul`, the `BiasAdd` that is its only consumer and, when
    /// that bias add is fused with its activation, the activation, fused by
    /// lowering into one launch (the GEMM, then the bias and activation in
    /// place on its output).
    MatMulBiasAct {
        m: usize,
        n: usize,
        k: usize,
        trans_a: bool,
        trans_b: bool,
        act: Option<UnaryOp>,
    },
    /// in: a, b. out: c = a op b (broadcast).
    Binary {
        op: BinaryOp,
        a_shape: Vec<usize>,
        b_shape: Vec<usize>,
        out_shape: Vec<usize>,
    },
    /// in: `expr.inputs()` tensors, each broadcast to `out_shape`. out:
    /// `expr` of them: a chain of elementwise graph nodes fused by the
    /// compiler's equality saturation into one kernel generated from its
    /// expression (`elementwise::fused`).
    Fused {
        expr: FusedExpr,
        in_shapes: Vec<Vec<usize>>,
        out_shape: Vec<usize>,
    },
    /// in: n tensors. out: their sum.
    AddN {
        n: usize,
    },
    /// in: x, bias. out: y.
    BiasAdd {
        channels: usize,
    },
    /// in: x, bias. out: y = `act(x + bias)`: a `BiasAdd` and the activation
    /// that is its only consumer, fused by lowering into one launch.
    BiasAddAct {
        channels: usize,
        act: UnaryOp,
    },
    /// in: dy, y. out: dx, db: dx = grad(dy, y) of `act` (as `UnaryGrad`) and
    /// db the bias gradient of dx (as `BiasAddGrad`): an activation's gradient
    /// and the bias gradient reading it, fused by lowering into one launch.
    UnaryGradBiasGrad {
        channels: usize,
        act: UnaryOp,
    },
    /// in: dy. out: db.
    BiasAddGrad {
        channels: usize,
    },
    /// in: x. out: y.
    Unary {
        op: UnaryOp,
    },
    /// in: dy, y (the forward output). out: dx = the op's gradient from y.
    UnaryGrad {
        op: UnaryOp,
    },
    /// in: x, filter. out: y. Workspace: `workspace_len` f32.
    Conv2D {
        geom: ConvGeom,
        workspace_len: usize,
    },
    /// in: x, filter, bias. out: `act(conv(x, filter) + bias)`: a `Conv2D`,
    /// the `BiasAdd` that is its only consumer and the activation that is
    /// the bias add's, fused by lowering into one launch; the bias and the
    /// activation run on each block of output right after the convolution
    /// wrote it, while it is in cache. With `pool`, a max pool reading the
    /// activation joins too: out: y, then the pooled y (`pool` is its
    /// geometry), each group of images pooled right after it is computed.
    /// Workspace: `workspace_len` f32.
    Conv2DBiasAct {
        geom: ConvGeom,
        workspace_len: usize,
        act: UnaryOp,
        pool: Option<PoolGeom>,
    },
    /// in: dy, filter. out: dx.
    Conv2DBackpropInput {
        geom: ConvGeom,
        workspace_len: usize,
    },
    /// in: x, dy. out: dfilter.
    Conv2DBackpropFilter {
        geom: ConvGeom,
        workspace_len: usize,
    },
    /// in: x. out: y.
    MaxPool {
        geom: PoolGeom,
    },
    /// in: x, y, dy. out: dx.
    MaxPoolGrad {
        geom: PoolGeom,
    },
    /// in: x, y, dy, act_y. out: dx, db: a `MaxPoolGrad`, the activation
    /// gradient reading it (`act`, with `act_y` the activation's output) and
    /// that gradient's bias gradient, fused by lowering into one launch
    /// (the backward of conv -> bias -> activation -> max pool).
    MaxPoolGradActBiasGrad {
        geom: PoolGeom,
        act: UnaryOp,
    },
    /// in: x. out: y.
    AvgPool {
        geom: PoolGeom,
    },
    /// in: dy. out: dx.
    AvgPoolGrad {
        geom: PoolGeom,
    },
    /// in: n tensors. out: their concatenation.
    Concat {
        axis: usize,
        shapes: Vec<Vec<usize>>,
    },
    /// in: x. out: one tensor per size.
    Split {
        axis: usize,
        shape: Vec<usize>,
        sizes: Vec<usize>,
    },
    /// in: x. out: y, the window.
    Slice {
        shape: Vec<usize>,
        begin: Vec<usize>,
        size: Vec<usize>,
    },
    /// in: dy. out: dx (zeros outside the window).
    SliceGrad {
        shape: Vec<usize>,
        begin: Vec<usize>,
        size: Vec<usize>,
    },
    /// in: x. out: y, x broadcast to `out_shape`.
    BroadcastTo {
        x_shape: Vec<usize>,
        out_shape: Vec<usize>,
    },
    /// in: x. out: y, x summed down to `out_shape`.
    SumTo {
        x_shape: Vec<usize>,
        out_shape: Vec<usize>,
    },
    /// in: x. out: y (last axis of length `classes`).
    Softmax {
        classes: usize,
    },
    LogSoftmax {
        classes: usize,
    },
    /// in: dy, y. out: dx.
    SoftmaxGrad {
        classes: usize,
    },
    LogSoftmaxGrad {
        classes: usize,
    },
    /// in: logits, labels (i32), scale (a scalar). out: loss, mean (the
    /// loss's mean), dlogits (scale * backprop), db (dlogits' column sums): a
    /// `SparseSoftmaxXent`, the `ReduceMean` of its loss, the `Mul` scaling
    /// its backprop and the `BiasAddGrad` reading that, fused by lowering.
    SparseSoftmaxXentMeanGrad {
        classes: usize,
    },
    /// in: logits, labels (i32). out: loss, backprop.
    SparseSoftmaxXent {
        classes: usize,
    },
    /// in: logits, labels. out: loss, backprop.
    SoftmaxXent {
        classes: usize,
    },
    /// in: x. out: y, a scalar Σx²/2.
    L2Loss,
    /// in: x. out: y, the sum over `axes`.
    ReduceSum {
        shape: Vec<usize>,
        axes: Vec<usize>,
    },
    ReduceMean {
        shape: Vec<usize>,
        axes: Vec<usize>,
    },
    /// in: x. out: y, the maximum over `axes` (NaN wins; -inf when empty).
    ReduceMax {
        shape: Vec<usize>,
        axes: Vec<usize>,
    },
    /// in: x. out: y, the minimum over `axes` (NaN wins; +inf when empty).
    ReduceMin {
        shape: Vec<usize>,
        axes: Vec<usize>,
    },
    /// in: x. out: indices (i32).
    ArgMax {
        shape: Vec<usize>,
        axis: usize,
    },
    /// in: a, b (of `dtype`, one shape). out: equal (bool, i32 0/1).
    Equal {
        dtype: DType,
    },
    /// in: a, b (of `dtype`, f32 or i32, one shape). out: bool (i32 0/1), `a cmp b`.
    Compare {
        cmp: crate::Comparison,
        dtype: DType,
    },
    /// in: x, y (f32, one shape), cond (bool, one per `inner` elements of
    /// x: 1 elementwise, a row's length for a row-selecting vector). out:
    /// x where cond, else y (TF1's `Select`).
    Select {
        inner: usize,
    },
    /// in: x. out: y, x converted.
    Cast {
        from: DType,
        to: DType,
    },
    /// Train mode. in: x. out: y, mask. Element `i` draws its mask from
    /// `(seed, step, elem_offset + i)`; `step` is the program's run count.
    Dropout {
        keep_prob: f32,
        seed: u64,
        elem_offset: usize,
    },
    /// in: none. out: y, filled with `value` (eval-mode dropout masks).
    Fill {
        value: f32,
    },
    /// Train mode. in: x, gamma, beta. out: y, batch_mean, batch_inv_std, batch_var (unbiased).
    BatchNormTrain {
        channels: usize,
        epsilon: f32,
    },
    /// Eval mode. in: x, gamma, beta, moving_mean, moving_var. out: y, mean, inv_std, var
    /// (the moving statistics).
    BatchNormInfer {
        channels: usize,
        epsilon: f32,
    },
    /// in: dy, x, gamma, batch_mean, batch_inv_std. out: dx, dgamma, dbeta.
    BatchNormGrad {
        channels: usize,
    },
    /// in: value. out: moving (in place): `moving = moving*decay + value*(1-decay)`.
    AssignMovingAverage {
        decay: f32,
    },
    /// in: grad, lr (the learning rate, f32[1], read each step: schedules
    /// live in the plan, not in a recompilation). out: var (in place).
    ApplyGradientDescent {},
    /// in: grad, lr (f32[1]). out: var, accum (the variable and its accumulator, in place).
    ApplyMomentum {
        momentum: f32,
        nesterov: bool,
    },
    /// in: grad, global_step (i32; the update uses step = global_step + 1),
    /// lr (f32[1]). out: var, m, v (in place).
    ApplyAdam {
        beta1: f32,
        beta2: f32,
        epsilon: f32,
    },
    /// in: one tensor per tower. out: Σ weights[i]·in[i] (the tower reduction).
    WeightedSum {
        weights: Vec<f32>,
    },
    /// The tower reduction fused into the optimizer update that is its only
    /// consumer: in: one gradient per tower, then `apply`'s inputs after its
    /// gradient (Adam's global_step, then the learning rate). out: `apply`'s outputs, in place. One
    /// pass over memory instead of two: the reduced gradient is formed block
    /// by block in scratch and applied at once, never stored.
    MeanApply {
        weights: Vec<f32>,
        apply: Box<Kernel>,
    },
    /// `count` optimizer updates of one kind in one launch (multi-tensor
    /// apply): in: the `count` gradients, then `apply`'s inputs after its
    /// gradient, shared by every member (Adam's global_step, then the
    /// learning rate). out: each member's variable and slots, member after
    /// member. Each element is updated exactly as `apply` alone would.
    MultiApply {
        apply: Box<Kernel>,
        count: usize,
    },
    /// in: none. out: step (the i32 step variable, incremented in place).
    IncrementStep,
    // array ops (issue 22)
    /// in: indices (i32, n). out: y (f32 `[n, depth]`), `on` at each row's index
    /// and `off` elsewhere (an index outside `[0, depth)`: a row of `off`).
    OneHot {
        depth: usize,
        on: f32,
        off: f32,
    },
    /// in: x (`shape`, rank <= 4, any 4-byte dtype). out: y, x transposed,
    /// output axis k being input axis `perm[k]`.
    Transpose {
        shape: Vec<usize>,
        perm: Vec<usize>,
    },
    /// in: x (`shape`, rank <= 4). out: y (`out_shape`), `value` except the
    /// window at `before`, which holds x (constant padding).
    Pad {
        shape: Vec<usize>,
        before: Vec<usize>,
        out_shape: Vec<usize>,
        value: f32,
    },
    /// in: params (f32 viewed as `[outer, limit, inner]`), indices (i32,
    /// `count`). out: y (`[outer, count, inner]`), rows of params picked by the
    /// indices. An index outside `[0, limit)` is an error on the CPU.
    Gather {
        outer: usize,
        limit: usize,
        inner: usize,
        count: usize,
    },
    /// in: dy (`[outer, count, inner]`), indices (i32, `count`). out:
    /// dparams `[outer, limit, inner]`: zeros plus each dy row added at its
    /// index (an unsorted segment sum, in increasing index position).
    GatherGrad {
        outer: usize,
        limit: usize,
        inner: usize,
        count: usize,
    },
    /// in: x (`shape`, rank <= 4). out: y, x repeated `multiples[i]` times along axis i.
    Tile {
        shape: Vec<usize>,
        multiples: Vec<usize>,
    },
    /// in: dy (the tiled shape). out: dx (`shape`), the sum of dy over the copies.
    TileGrad {
        shape: Vec<usize>,
        multiples: Vec<usize>,
    },
    /// in: x (`[rows, cols]`). out: values (f32 `[rows, k]`), indices (i32
    /// `[rows, k]`): each row's k first columns, larger first, ties by lower
    /// column (TF's `TopKV2`; NaN above every number).
    TopK {
        rows: usize,
        cols: usize,
        k: usize,
    },
    /// in: predictions (`[rows, cols]`), targets (i32, rows). out: in_top_k
    /// (bool, rows), TF's `InTopK`: fewer than k strictly larger, a finite row.
    InTopK {
        rows: usize,
        cols: usize,
        k: usize,
    },
    /// in: dvalues (`[rows, k]`), indices (i32 `[rows, k]`). out: dx
    /// (`[rows, cols]`), zeros plus each dvalue added at its column.
    TopKGrad {
        rows: usize,
        cols: usize,
        k: usize,
    },
    // optimizers of issue 22
    /// TF1's `ApplyRMSProp` (not centered): in: grad, lr (f32[1]).
    /// out: var, ms, mom (in place).
    ApplyRmsProp {
        decay: f32,
        momentum: f32,
        epsilon: f32,
    },
    /// TF1's `ApplyAdagrad`: in: grad, lr (f32[1]). out: var, accum (the
    /// variable and its accumulator, in place).
    ApplyAdagrad {},
}

impl Kernel {
    /// Whether output 0 may be input 0 itself (the same buffer, written in
    /// place): each element is read, then written, once. Lowering uses it
    /// for activation gradients whose incoming gradient has no other
    /// reader; the plan verifier allows exactly this overlap.
    pub fn in_place_ok(&self) -> bool {
        matches!(self, Kernel::UnaryGrad { .. } | Kernel::UnaryGradBiasGrad { .. })
    }

    /// The kernel's name, as the CUDA twin would be called.
    pub fn name(&self) -> &'static str {
        match self {
            Kernel::MatMul { .. } => "gemm",
            Kernel::BatchMatMul { .. } => "gemm_batched",
            Kernel::MatMulBiasAct { .. } => "gemm_bias_act",
            Kernel::TowerMatMul { .. } => "gemm_tower_mean",
            Kernel::TowerMatMulApply { .. } => "gemm_tower_apply",
            Kernel::Binary { .. } => "binary",
            Kernel::Fused { .. } => "fused_elementwise",
            Kernel::AddN { .. } => "add_n",
            Kernel::BiasAdd { .. } => "bias_add",
            Kernel::BiasAddAct { .. } => "bias_add_act",
            Kernel::UnaryGradBiasGrad { .. } => "unary_grad_bias_grad",
            Kernel::BiasAddGrad { .. } => "bias_add_grad",
            Kernel::Unary { .. } => "unary",
            Kernel::UnaryGrad { .. } => "unary_grad",
            Kernel::Conv2D { .. } => "conv2d",
            Kernel::Conv2DBiasAct { .. } => "conv2d_bias_act",
            Kernel::Conv2DBackpropInput { .. } => "conv2d_backprop_input",
            Kernel::Conv2DBackpropFilter { .. } => "conv2d_backprop_filter",
            Kernel::MaxPool { .. } => "max_pool",
            Kernel::MaxPoolGrad { .. } => "max_pool_grad",
            Kernel::MaxPoolGradActBiasGrad { .. } => "max_pool_grad_act_bias_grad",
            Kernel::AvgPool { .. } => "avg_pool",
            Kernel::AvgPoolGrad { .. } => "avg_pool_grad",
            Kernel::Concat { .. } => "concat",
            Kernel::Split { .. } => "split",
            Kernel::Slice { .. } => "slice",
            Kernel::SliceGrad { .. } => "slice_grad",
            Kernel::BroadcastTo { .. } => "broadcast_to",
            Kernel::SumTo { .. } => "sum_to_shape",
            Kernel::Softmax { .. } => "softmax",
            Kernel::LogSoftmax { .. } => "log_softmax",
            Kernel::SoftmaxGrad { .. } => "softmax_grad",
            Kernel::LogSoftmaxGrad { .. } => "log_softmax_grad",
            Kernel::SparseSoftmaxXent { .. } => "sparse_softmax_xent",
            Kernel::SparseSoftmaxXentMeanGrad { .. } => "sparse_softmax_xent_mean_grad",
            Kernel::SoftmaxXent { .. } => "softmax_xent",
            Kernel::L2Loss => "l2_loss",
            Kernel::ReduceSum { .. } => "reduce_sum",
            Kernel::ReduceMean { .. } => "reduce_mean",
            Kernel::ReduceMax { .. } => "reduce_max",
            Kernel::ReduceMin { .. } => "reduce_min",
            Kernel::ArgMax { .. } => "argmax",
            Kernel::Equal { .. } => "equal",
            Kernel::Compare { .. } => "compare",
            Kernel::Select { .. } => "select",
            Kernel::Cast { .. } => "cast",
            Kernel::Dropout { .. } => "dropout",
            Kernel::Fill { .. } => "fill",
            Kernel::BatchNormTrain { .. } => "batch_norm_train",
            Kernel::BatchNormInfer { .. } => "batch_norm_infer",
            Kernel::BatchNormGrad { .. } => "batch_norm_grad",
            Kernel::AssignMovingAverage { .. } => "assign_moving_average",
            Kernel::ApplyGradientDescent { .. } => "apply_gradient_descent",
            Kernel::ApplyMomentum { .. } => "apply_momentum",
            Kernel::ApplyAdam { .. } => "apply_adam",
            Kernel::WeightedSum { .. } => "weighted_sum",
            Kernel::MeanApply { .. } => "mean_apply",
            Kernel::MultiApply { .. } => "multi_apply",
            Kernel::IncrementStep => "increment_step",
            // array ops (issue 22)
            Kernel::OneHot { .. } => "one_hot",
            Kernel::Transpose { .. } => "transpose",
            Kernel::Pad { .. } => "pad",
            Kernel::Gather { .. } => "gather",
            Kernel::GatherGrad { .. } => "gather_grad",
            Kernel::Tile { .. } => "tile",
            Kernel::TileGrad { .. } => "tile_grad",
            Kernel::TopK { .. } => "top_k",
            Kernel::InTopK { .. } => "in_top_k",
            Kernel::TopKGrad { .. } => "top_k_grad",
            Kernel::ApplyRmsProp { .. } => "apply_rmsprop",
            Kernel::ApplyAdagrad { .. } => "apply_adagrad",
        }
    }
}

/// The kernel families, one per folder of kernels (`kernels/src/<module>`),
/// each described once by its `desc.rs` ([`crate::family::Desc`]). The
/// order is the order of [`crate::cuda::sources`].
macro_rules! families {
    ($($variant:ident => $module:ident,)*) => {
        /// A kernel family (see [`crate::family`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Family {
            $($variant,)*
        }

        impl Family {
            /// Every family, in source order.
            pub const ALL: &'static [Family] = &[$(Family::$variant,)*];

            /// The family's descriptor.
            pub fn desc(self) -> &'static Desc {
                match self {
                    $(Family::$variant => &crate::$module::desc::DESC,)*
                }
            }
        }
    };
}

families! {
    Gemm => gemm,
    Elementwise => elementwise,
    Reduce => reduce,
    Misc => misc,
    Pool => pool,
    Softmax => softmax,
    Conv => conv,
    Layout => layout,
    BatchNorm => batchnorm,
    Dropout => dropout,
    Optim => optim,
    Array => array,
    TopK => topk,
}

impl Kernel {
    /// The family that describes this kernel (exhaustive: a new variant
    /// names its family here).
    pub fn family(&self) -> Family {
        use Kernel::*;
        match self {
            MatMul { .. }
            | BatchMatMul { .. }
            | TowerMatMul { .. }
            | TowerMatMulApply { .. }
            | MatMulBiasAct { .. } => Family::Gemm,
            Binary { .. }
            | Fused { .. }
            | BiasAdd { .. }
            | BiasAddAct { .. }
            | UnaryGradBiasGrad { .. }
            | BiasAddGrad { .. }
            | Unary { .. }
            | UnaryGrad { .. }
            | BroadcastTo { .. }
            | SumTo { .. } => Family::Elementwise,
            ReduceSum { .. }
            | ReduceMean { .. }
            | ReduceMax { .. }
            | ReduceMin { .. }
            | ArgMax { .. }
            | Equal { .. }
            | Compare { .. }
            | Select { .. }
            | Cast { .. } => Family::Reduce,
            AddN { .. } | WeightedSum { .. } | L2Loss | Fill { .. } => Family::Misc,
            MaxPool { .. }
            | MaxPoolGrad { .. }
            | MaxPoolGradActBiasGrad { .. }
            | AvgPool { .. }
            | AvgPoolGrad { .. } => Family::Pool,
            Softmax { .. }
            | LogSoftmax { .. }
            | SoftmaxGrad { .. }
            | LogSoftmaxGrad { .. }
            | SparseSoftmaxXent { .. }
            | SparseSoftmaxXentMeanGrad { .. }
            | SoftmaxXent { .. } => Family::Softmax,
            Conv2D { .. } | Conv2DBiasAct { .. } | Conv2DBackpropInput { .. } | Conv2DBackpropFilter { .. } => {
                Family::Conv
            }
            Concat { .. } | Split { .. } | Slice { .. } | SliceGrad { .. } => Family::Layout,
            BatchNormTrain { .. } | BatchNormInfer { .. } | BatchNormGrad { .. } => Family::BatchNorm,
            Dropout { .. } => Family::Dropout,
            AssignMovingAverage { .. }
            | ApplyGradientDescent { .. }
            | ApplyMomentum { .. }
            | ApplyAdam { .. }
            | ApplyRmsProp { .. }
            | ApplyAdagrad { .. }
            | MeanApply { .. }
            | MultiApply { .. }
            | IncrementStep => Family::Optim,
            OneHot { .. }
            | Transpose { .. }
            | Pad { .. }
            | Gather { .. }
            | GatherGrad { .. }
            | Tile { .. }
            | TileGrad { .. } => Family::Array,
            TopK { .. } | InTopK { .. } | TopKGrad { .. } => Family::TopK,
        }
    }
}
