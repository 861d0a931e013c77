//! Kernel selection: one op (with its input and output types) to what the
//! plan does for it. Pure: no buffers, no graph, so each rule reads alone.

use towers_graph::{DType, Op, Optimizer};

use towers_kernels::{ConvGeom, Kernel, Padding, PoolGeom};

use crate::plan::Mode;

/// A tensor's dtype and fully known dimensions.
#[derive(Debug, Clone)]
pub(crate) struct Ty {
    pub dtype: DType,
    pub dims: Vec<usize>,
}

/// Where a launch writes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outs {
    /// The node's own output buffers.
    Own,
    /// In place on these node inputs (variables); the node's output 0 aliases input 0.
    InPlace(Vec<usize>),
}

// One transient value per node during lowering: the launch variant's size
// (the kernel's parameters) costs nothing worth a box.
/// What the plan does for one node.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Lowering {
    /// Buffers only, or ordering only.
    Nothing,
    /// Output 0 is input 0's buffer (no copy).
    Alias,
    /// Each output is a contiguous part of input 0's buffer (a split along
    /// an axis with only size-1 dimensions before it, e.g. the batch split).
    Views,
    /// Copy input 0 into output 0.
    CopyOut,
    /// Copy input 0 into output 0 and fill output 1 with ones (eval dropout).
    CopyAndOnes,
    /// A collective over the processes of the group: output i is input i's
    /// buffer, summed in place by one `Step::AllReduce` over all inputs.
    AllReduce,
    /// The variables (inputs) overwritten with the root's values: one
    /// `Step::Broadcast`; no outputs.
    Broadcast,
    /// One kernel launch; `inputs` are node input indices.
    Launch { kernel: Kernel, inputs: Vec<usize>, outs: Outs },
}

fn launch(kernel: Kernel, inputs: &[usize]) -> Result<Lowering, String> {
    Ok(Lowering::Launch { kernel, inputs: inputs.to_vec(), outs: Outs::Own })
}

/// `Split` as a kernel that copies each part out: where the parts cannot
/// be views of the input (their dims before `axis` are not all 1, or the
/// input is not an arena buffer: a variable).
pub(crate) fn split_launch(axis: usize, input: &Ty, sizes: &[usize]) -> Result<Lowering, String> {
    launch(Kernel::Split { axis, shape: input.dims.clone(), sizes: sizes.to_vec() }, &[0])
}

fn last(t: &Ty) -> usize {
    t.dims.last().copied().unwrap_or(1)
}

fn nhwc(t: &Ty, what: &str) -> Result<[usize; 4], String> {
    match t.dims[..] {
        [n, h, w, c] => Ok([n, h, w, c]),
        _ => Err(format!("{what} must be rank 4 (NHWC), got {:?}", t.dims)),
    }
}

fn conv(x: &Ty, f: &Ty, strides: [usize; 2], padding: Padding) -> Result<(ConvGeom, usize), String> {
    let [n, h, w, c_in] = nhwc(x, "input")?;
    let [kh, kw, _, c_out] = nhwc(f, "filter")?;
    let geom = ConvGeom { n, h, w, c_in, kh, kw, c_out, stride_h: strides[0], stride_w: strides[1], padding };
    Ok((geom, geom.workspace_len()))
}

fn pool(x: &Ty, ksize: [usize; 2], strides: [usize; 2], padding: Padding) -> Result<PoolGeom, String> {
    let [n, h, w, c] = nhwc(x, "input")?;
    Ok(PoolGeom { n, h, w, c, kh: ksize[0], kw: ksize[1], stride_h: strides[0], stride_w: strides[1], padding })
}

/// `BatchMatMul` as one batched GEMM: the output's leading axes are the
/// batch (their product the count); an operand whose batch axes hold one
/// matrix is shared by every product (the broadcast `shape inference`
/// allowed), any other holds exactly `batch` of them.
fn batch_matmul(a: &Ty, b: &Ty, out: &Ty, trans_a: bool, trans_b: bool) -> Result<Lowering, String> {
    let (a, b, out) = (&a.dims, &b.dims, &out.dims);
    if a.len() < 2 || b.len() < 2 || out.len() < 2 {
        return Err(format!("a batched matmul needs operands of rank >= 2, got {a:?} and {b:?}"));
    }
    let count = |d: &[usize]| d[..d.len() - 2].iter().product::<usize>();
    let (ra, ca) = (a[a.len() - 2], a[a.len() - 1]);
    let (m, k) = if trans_a { (ca, ra) } else { (ra, ca) };
    let n = if trans_b { b[b.len() - 2] } else { b[b.len() - 1] };
    let batch = count(out);
    let (shared_a, shared_b) = (count(a) == 1, count(b) == 1);
    if (!shared_a && count(a) != batch) || (!shared_b && count(b) != batch) {
        return Err(format!("batched matmul operands {a:?} and {b:?} do not give {batch} products of {out:?}"));
    }
    launch(Kernel::BatchMatMul { batch, m, n, k, trans_a, trans_b, shared_a, shared_b }, &[0, 1])
}

/// Select the lowering of `op` given its input and output types.
/// The error string is the reason, wrapped by the caller with the node name.
pub(crate) fn select(op: &Op, ins: &[Ty], outs: &[Ty], mode: Mode) -> Result<Lowering, String> {
    use Op::*;
    let all: Vec<usize> = (0..ins.len()).collect();
    match op {
        Placeholder { .. } | Const { .. } | Variable { .. } | NoOp => Ok(Lowering::Nothing),
        Reshape { .. } | Identity | StopGradient => Ok(Lowering::Alias),
        Copy => Ok(Lowering::CopyOut),
        AllReduce { .. } => Ok(Lowering::AllReduce),
        Broadcast { .. } => Ok(Lowering::Broadcast),
        MatMul { transpose_a, transpose_b } => {
            let (a, b) = (&ins[0].dims, &ins[1].dims);
            if a.len() != 2 || b.len() != 2 {
                return Err(format!("matmul needs rank-2 inputs, got {a:?} and {b:?}"));
            }
            let (m, k) = if *transpose_a { (a[1], a[0]) } else { (a[0], a[1]) };
            let n = if *transpose_b { b[0] } else { b[1] };
            launch(Kernel::MatMul { m, n, k, trans_a: *transpose_a, trans_b: *transpose_b }, &[0, 1])
        }
        BatchMatMul { transpose_a, transpose_b } => {
            batch_matmul(&ins[0], &ins[1], &outs[0], *transpose_a, *transpose_b)
        }
        TowerMatMul { weights, transpose_a, transpose_b } => {
            let pairs: Vec<(&Ty, &Ty)> = ins.chunks(2).filter_map(|p| Some((p.first()?, p.get(1)?))).collect();
            let (m, n) = (outs[0].dims.first().copied().unwrap_or(1), last(&outs[0]));
            let ks = pairs
                .iter()
                .map(|(a, _)| match a.dims[..] {
                    [r, c] => Ok(if *transpose_a { r } else { c }),
                    _ => Err(format!("tower matmul needs rank-2 operands, got {:?}", a.dims)),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let weights = weights.iter().map(|w| w.0).collect();
            launch(Kernel::TowerMatMul { m, n, ks, trans_a: *transpose_a, trans_b: *transpose_b, weights }, &all)
        }
        Binary(bop) => {
            if ins[0].dtype != DType::F32 {
                return Err(format!("elementwise arithmetic runs on f32 only, got {}", ins[0].dtype));
            }
            let k = Kernel::Binary {
                op: *bop,
                a_shape: ins[0].dims.clone(),
                b_shape: ins[1].dims.clone(),
                out_shape: outs[0].dims.clone(),
            };
            launch(k, &[0, 1])
        }
        Fused { expr } => {
            let k = Kernel::Fused {
                expr: expr.clone(),
                in_shapes: ins.iter().map(|t| t.dims.clone()).collect(),
                out_shape: outs[0].dims.clone(),
            };
            launch(k, &all)
        }
        AddN => launch(Kernel::AddN { n: ins.len() }, &all),
        BiasAdd => launch(Kernel::BiasAdd { channels: last(&ins[1]) }, &[0, 1]),
        BiasAddGrad => launch(Kernel::BiasAddGrad { channels: last(&ins[0]) }, &[0]),
        Unary(u) => {
            if ins[0].dtype != DType::F32 {
                return Err(format!("{} runs on f32 only, got {}", u.name(), ins[0].dtype));
            }
            launch(Kernel::Unary { op: *u }, &[0])
        }
        UnaryGrad(u) => launch(Kernel::UnaryGrad { op: *u }, &[0, 1]),
        Conv2D { strides, padding } => {
            let (geom, workspace_len) = conv(&ins[0], &ins[1], *strides, *padding)?;
            launch(Kernel::Conv2D { geom, workspace_len }, &[0, 1])
        }
        Conv2DBackpropInput { strides, padding } => {
            let (geom, workspace_len) = conv(&ins[0], &ins[1], *strides, *padding)?;
            launch(Kernel::Conv2DBackpropInput { geom, workspace_len }, &[2, 1])
        }
        Conv2DBackpropFilter { strides, padding } => {
            let (geom, workspace_len) = conv(&ins[0], &ins[1], *strides, *padding)?;
            launch(Kernel::Conv2DBackpropFilter { geom, workspace_len }, &[0, 2])
        }
        MaxPool { ksize, strides, padding } => {
            launch(Kernel::MaxPool { geom: pool(&ins[0], *ksize, *strides, *padding)? }, &[0])
        }
        MaxPoolGrad { ksize, strides, padding } => {
            launch(Kernel::MaxPoolGrad { geom: pool(&ins[0], *ksize, *strides, *padding)? }, &[0, 1, 2])
        }
        AvgPool { ksize, strides, padding } => {
            launch(Kernel::AvgPool { geom: pool(&ins[0], *ksize, *strides, *padding)? }, &[0])
        }
        AvgPoolGrad { ksize, strides, padding } => {
            launch(Kernel::AvgPoolGrad { geom: pool(&ins[0], *ksize, *strides, *padding)? }, &[1])
        }
        Concat { axis } => {
            launch(Kernel::Concat { axis: *axis, shapes: ins.iter().map(|t| t.dims.clone()).collect() }, &all)
        }
        Split { axis, .. } if ins[0].dims[..*axis].iter().all(|&d| d == 1) => Ok(Lowering::Views),
        Split { axis, sizes } => split_launch(*axis, &ins[0], sizes),
        Slice { begin, .. } => {
            launch(Kernel::Slice { shape: ins[0].dims.clone(), begin: begin.clone(), size: outs[0].dims.clone() }, &[0])
        }
        SliceGrad { begin } => launch(
            Kernel::SliceGrad { shape: ins[0].dims.clone(), begin: begin.clone(), size: ins[1].dims.clone() },
            &[1],
        ),
        BroadcastLike => {
            launch(Kernel::BroadcastTo { x_shape: ins[0].dims.clone(), out_shape: outs[0].dims.clone() }, &[0])
        }
        SumToLike => launch(Kernel::SumTo { x_shape: ins[0].dims.clone(), out_shape: outs[0].dims.clone() }, &[0]),
        Softmax => launch(Kernel::Softmax { classes: last(&ins[0]) }, &[0]),
        LogSoftmax => launch(Kernel::LogSoftmax { classes: last(&ins[0]) }, &[0]),
        SoftmaxGrad => launch(Kernel::SoftmaxGrad { classes: last(&ins[0]) }, &[0, 1]),
        LogSoftmaxGrad => launch(Kernel::LogSoftmaxGrad { classes: last(&ins[0]) }, &[0, 1]),
        SparseSoftmaxCrossEntropy => launch(Kernel::SparseSoftmaxXent { classes: last(&ins[0]) }, &[0, 1]),
        SoftmaxCrossEntropy => launch(Kernel::SoftmaxXent { classes: last(&ins[0]) }, &[0, 1]),
        L2Loss => launch(Kernel::L2Loss, &[0]),
        ReduceSum { axes, .. } => launch(Kernel::ReduceSum { shape: ins[0].dims.clone(), axes: axes.clone() }, &[0]),
        ReduceMean { axes, .. } => launch(Kernel::ReduceMean { shape: ins[0].dims.clone(), axes: axes.clone() }, &[0]),
        ReduceMax { axes, .. } => launch(Kernel::ReduceMax { shape: ins[0].dims.clone(), axes: axes.clone() }, &[0]),
        ReduceMin { axes, .. } => launch(Kernel::ReduceMin { shape: ins[0].dims.clone(), axes: axes.clone() }, &[0]),
        ArgMax { axis } => launch(Kernel::ArgMax { shape: ins[0].dims.clone(), axis: *axis }, &[0]),
        Equal => {
            if ins[0].dims != ins[1].dims {
                return Err(format!(
                    "equal without broadcasting needs one shape, got {:?} and {:?}",
                    ins[0].dims, ins[1].dims
                ));
            }
            launch(Kernel::Equal { dtype: ins[0].dtype }, &[0, 1])
        }
        Compare(cmp) => {
            if ins[0].dims != ins[1].dims {
                return Err(format!(
                    "{} without broadcasting needs one shape, got {:?} and {:?}",
                    cmp.name(),
                    ins[0].dims,
                    ins[1].dims
                ));
            }
            launch(Kernel::Compare { cmp: *cmp, dtype: ins[0].dtype }, &[0, 1])
        }
        Select => {
            // cond of x's shape (inner 1) or a vector selecting rows.
            let n: usize = ins[1].dims.iter().product();
            let c: usize = ins[0].dims.iter().product();
            let rows = ins[1].dims.first().copied().unwrap_or(1);
            let inner = if c == n {
                1
            } else if ins[0].dims.len() == 1 && c == rows {
                n / rows
            } else {
                return Err(format!(
                    "where's condition {:?} is neither x's shape {:?} nor one per row of it",
                    ins[0].dims, ins[1].dims
                ));
            };
            launch(Kernel::Select { inner }, &[1, 2, 0])
        }
        Cast { dtype } => launch(Kernel::Cast { from: ins[0].dtype, to: *dtype }, &[0]),
        Dropout { rate, seed, first_row, row_elems } => match mode {
            Mode::Eval => Ok(Lowering::CopyAndOnes),
            Mode::Train => {
                let d = &ins[0].dims;
                let row: usize = if *row_elems > 0 { *row_elems } else { d.iter().skip(1).product() };
                let k = Kernel::Dropout { keep_prob: 1.0 - rate.0, seed: *seed, elem_offset: first_row * row };
                launch(k, &[0])
            }
        },
        BatchNorm { epsilon } => {
            let channels = last(&ins[0]);
            match mode {
                Mode::Train => launch(Kernel::BatchNormTrain { channels, epsilon: epsilon.0 }, &[0, 1, 2]),
                Mode::Eval => launch(Kernel::BatchNormInfer { channels, epsilon: epsilon.0 }, &[0, 1, 2, 3, 4]),
            }
        }
        BatchNormGrad => launch(Kernel::BatchNormGrad { channels: last(&ins[1]) }, &[0, 1, 2, 3, 4]),
        AssignMovingAverage { decay } => Ok(Lowering::Launch {
            kernel: Kernel::AssignMovingAverage { decay: decay.0 },
            inputs: vec![1],
            outs: Outs::InPlace(vec![0]),
        }),
        ApplyGradient { optimizer } => {
            // Node inputs: variable, slots..., grad, global_step, learning_rate.
            let n = ins.len();
            let (grad, step, lr) = (n - 3, n - 2, n - 1);
            let (kernel, inputs) = match optimizer {
                Optimizer::Sgd { .. } => (Kernel::ApplyGradientDescent {}, vec![grad, lr]),
                Optimizer::Momentum { momentum, nesterov, .. } => {
                    (Kernel::ApplyMomentum { momentum: momentum.0, nesterov: *nesterov }, vec![grad, lr])
                }
                Optimizer::Adam { beta1, beta2, epsilon, .. } => {
                    (Kernel::ApplyAdam { beta1: beta1.0, beta2: beta2.0, epsilon: epsilon.0 }, vec![grad, step, lr])
                }
                Optimizer::RmsProp { decay, momentum, epsilon, .. } => {
                    (Kernel::ApplyRmsProp { decay: decay.0, momentum: momentum.0, epsilon: epsilon.0 }, vec![grad, lr])
                }
                Optimizer::Adagrad { .. } => (Kernel::ApplyAdagrad {}, vec![grad, lr]),
            };
            Ok(Lowering::Launch { kernel, inputs, outs: Outs::InPlace((0..n - 3).collect()) })
        }
        IncrementStep => {
            Ok(Lowering::Launch { kernel: Kernel::IncrementStep, inputs: vec![], outs: Outs::InPlace(vec![0]) })
        }
        TowerMean { weights } => launch(Kernel::WeightedSum { weights: weights.iter().map(|w| w.0).collect() }, &all),
        // array ops (issue 22)
        OneHot { .. } | Transpose { .. } | ExpandDims { .. } | Squeeze { .. } => select_array(op, ins, outs),
        Pad { .. } | Gather { .. } | GatherGrad { .. } | Tile { .. } | TileGrad { .. } => select_array(op, ins, outs),
        // top-k selection along the last axis, the leading axes as rows.
        TopK { k } => {
            let cols = last(&ins[0]);
            launch(Kernel::TopK { rows: ins[0].dims.iter().product::<usize>() / cols.max(1), cols, k: *k }, &[0])
        }
        TopKGrad => {
            let (cols, k) = (last(&ins[0]), last(&ins[1]));
            launch(Kernel::TopKGrad { rows: ins[0].dims.iter().product::<usize>() / cols.max(1), cols, k }, &[1, 2])
        }
        InTopK { k } => {
            launch(Kernel::InTopK { rows: ins[1].dims.iter().product(), cols: last(&ins[0]), k: *k }, &[0, 1])
        }
    }
}

/// The array ops of issue 22. `ExpandDims` and `Squeeze` are views (as
/// `Reshape`); transpose, pad and tile take rank <= 4, as the layout kernels.
fn select_array(op: &Op, ins: &[Ty], outs: &[Ty]) -> Result<Lowering, String> {
    use Op::*;
    let rank4 = |t: &Ty| {
        if t.dims.len() > 4 {
            return Err(format!("{} supports rank <= 4, got {:?}; reshape (merge axes) first", op.type_name(), t.dims));
        }
        Ok(())
    };
    // params viewed as [outer, limit, inner] around `axis`.
    let around = |p: &Ty, axis: usize, count: usize| {
        let outer = p.dims[..axis].iter().product();
        let inner = p.dims[axis + 1..].iter().product();
        Kernel::Gather { outer, limit: p.dims[axis], inner, count }
    };
    match op {
        ExpandDims { .. } | Squeeze { .. } => Ok(Lowering::Alias),
        OneHot { depth, on_value, off_value } => {
            launch(Kernel::OneHot { depth: *depth, on: on_value.0, off: off_value.0 }, &[0])
        }
        Transpose { perm } => {
            rank4(&ins[0])?;
            launch(Kernel::Transpose { shape: ins[0].dims.clone(), perm: perm.clone() }, &[0])
        }
        Pad { paddings, constant_value } => {
            rank4(&ins[0])?;
            let k = Kernel::Pad {
                shape: ins[0].dims.clone(),
                before: paddings.iter().map(|p| p[0]).collect(),
                out_shape: outs[0].dims.clone(),
                value: constant_value.0,
            };
            launch(k, &[0])
        }
        Gather { axis } => launch(around(&ins[0], *axis, ins[1].dims.iter().product()), &[0, 1]),
        GatherGrad { axis } => match around(&ins[0], *axis, ins[1].dims.iter().product()) {
            Kernel::Gather { outer, limit, inner, count } => {
                launch(Kernel::GatherGrad { outer, limit, inner, count }, &[2, 1])
            }
            _ => Err("unreachable: around makes a gather".into()),
        },
        Tile { multiples } => {
            rank4(&ins[0])?;
            launch(Kernel::Tile { shape: ins[0].dims.clone(), multiples: multiples.clone() }, &[0])
        }
        TileGrad { multiples } => {
            rank4(&ins[0])?;
            launch(Kernel::TileGrad { shape: ins[0].dims.clone(), multiples: multiples.clone() }, &[1])
        }
        other => Err(format!("{} is not an array op", other.type_name())),
    }
}
