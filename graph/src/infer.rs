//! Shape and dtype inference, one rule per op.
//!
//! [`infer`] is the single source of truth for output types: the builder calls
//! it when a node is created, and passes call it again (through
//! `Graph::reinfer`) after they bind the batch size or split it across towers.
//! Unknown dimensions (`None`) propagate; a known dimension that contradicts
//! another is an error whose text names both shapes.

use crate::op::{Op, Padding};
use crate::types::{DType, Shape, TensorType};

/// Why inference failed; the graph adds the node's name and scope.
#[derive(Debug, Clone, PartialEq)]
pub enum InferError {
    Arity { expected: String, got: usize },
    Detail(String),
}

pub(crate) type R = Result<Vec<TensorType>, InferError>;

pub(crate) fn detail<T>(s: String) -> Result<T, InferError> {
    Err(InferError::Detail(s))
}

pub(crate) fn arity(inputs: &[TensorType], n: usize) -> Result<(), InferError> {
    if inputs.len() != n {
        return Err(InferError::Arity { expected: n.to_string(), got: inputs.len() });
    }
    Ok(())
}

pub(crate) fn want_float(t: &TensorType, what: &str) -> Result<(), InferError> {
    if t.dtype != DType::F32 {
        return detail(format!("{what} must be f32, got {t}"));
    }
    Ok(())
}

fn want_rank(t: &TensorType, r: usize, what: &str) -> Result<(), InferError> {
    if t.shape.rank() != r {
        return detail(format!("{what} must have rank {r}, got shape {}", t.shape));
    }
    Ok(())
}

/// Merge two dimensions that must agree (unknown matches anything).
pub(crate) fn merge_dim(a: Option<usize>, b: Option<usize>) -> Result<Option<usize>, ()> {
    match (a, b) {
        (Some(x), Some(y)) if x != y => Err(()),
        (Some(x), _) | (_, Some(x)) => Ok(Some(x)),
        (None, None) => Ok(None),
    }
}

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(a: &Shape, b: &Shape) -> Option<Shape> {
    let r = a.rank().max(b.rank());
    let mut out = vec![None; r];
    for (i, o) in out.iter_mut().enumerate() {
        let da = if i < r - a.rank() { Some(1) } else { a.0[i - (r - a.rank())] };
        let db = if i < r - b.rank() { Some(1) } else { b.0[i - (r - b.rank())] };
        *o = match (da, db) {
            (Some(1), d) | (d, Some(1)) => d,
            (Some(x), Some(y)) if x == y => Some(x),
            (Some(_), Some(_)) => return None,
            (Some(x), None) | (None, Some(x)) => Some(x),
            (None, None) => None,
        };
    }
    Some(Shape(out))
}

fn window(
    x: &TensorType,
    ksize: [usize; 2],
    strides: [usize; 2],
    padding: Padding,
    out_c: Option<usize>,
) -> Result<Shape, InferError> {
    want_rank(x, 4, "input")?;
    if strides.contains(&0) || ksize.contains(&0) {
        return detail(format!("strides {strides:?} and window {ksize:?} must be positive"));
    }
    let mut dims = vec![x.shape.0[0]];
    for i in 0..2 {
        match x.shape.0[1 + i] {
            Some(n) => match padding.out_and_pad(n, ksize[i], strides[i]) {
                Some((o, _)) => dims.push(Some(o)),
                None => {
                    return detail(format!(
                        "VALID window {ksize:?} does not fit input {} (spatial size {n} < {})",
                        x.shape, ksize[i]
                    ))
                }
            },
            None => dims.push(None),
        }
    }
    dims.push(out_c.or(x.shape.0[3]));
    Ok(Shape(dims))
}

pub(crate) fn normalize_axes(axes: &[usize], rank: usize) -> Result<(), InferError> {
    for &a in axes {
        if a >= rank {
            return detail(format!("axis {a} out of range for rank {rank}"));
        }
    }
    Ok(())
}

/// The product of the known dimensions; an error when it overflows (a
/// malformed serialized graph must not panic).
pub(crate) fn known_elements(mut dims: impl Iterator<Item = usize>, what: &str) -> Result<usize, InferError> {
    dims.try_fold(1usize, |a, d| a.checked_mul(d))
        .map_or_else(|| detail(format!("{what} has more elements than fit in memory")), Ok)
}

/// The output types of `op` applied to inputs of the given types.
pub fn infer(op: &Op, inputs: &[TensorType]) -> R {
    use Op::*;
    let same = |t: &TensorType| Ok(vec![t.clone()]);
    match op {
        Placeholder { dtype, shape } => {
            arity(inputs, 0)?;
            known_elements(shape.0.iter().flatten().copied(), &format!("shape {shape}"))?;
            Ok(vec![TensorType { dtype: *dtype, shape: shape.clone() }])
        }
        Const { value } => {
            arity(inputs, 0)?;
            let n = known_elements(value.shape.iter().copied(), &format!("constant shape {:?}", value.shape))?;
            if n != value.data.len() {
                return detail(format!("constant has {} values for shape {:?}", value.data.len(), value.shape));
            }
            Ok(vec![TensorType::new(value.dtype, Shape::known(&value.shape))])
        }
        Variable { dtype, shape, .. } => {
            arity(inputs, 0)?;
            known_elements(shape.iter().copied(), &format!("variable shape {shape:?}"))?;
            Ok(vec![TensorType::new(*dtype, Shape::known(shape))])
        }
        TowerMatMul { weights, transpose_a, transpose_b } => {
            if inputs.len() < 2 || inputs.len() != 2 * weights.len() {
                return Err(InferError::Arity {
                    expected: format!("two per weight ({} weights)", weights.len()),
                    got: inputs.len(),
                });
            }
            let pair = MatMul { transpose_a: *transpose_a, transpose_b: *transpose_b };
            let first = infer(&pair, &inputs[..2])?;
            for (i, ab) in inputs.chunks(2).enumerate().skip(1) {
                let t = infer(&pair, ab)?;
                if t[0].shape != first[0].shape {
                    return detail(format!(
                        "every pair's product must have one shape: pair 0 gives {}, pair {i} gives {}",
                        first[0].shape, t[0].shape
                    ));
                }
            }
            Ok(first)
        }
        MatMul { transpose_a, transpose_b } => {
            arity(inputs, 2)?;
            let (a, b) = (&inputs[0], &inputs[1]);
            want_float(a, "a")?;
            want_float(b, "b")?;
            if a.shape.rank() != 2 || b.shape.rank() != 2 {
                return detail(format!("both operands must be matrices, got {} and {}", a.shape, b.shape));
            }
            let (m, ka) = if *transpose_a { (a.shape.0[1], a.shape.0[0]) } else { (a.shape.0[0], a.shape.0[1]) };
            let (kb, n) = if *transpose_b { (b.shape.0[1], b.shape.0[0]) } else { (b.shape.0[0], b.shape.0[1]) };
            if merge_dim(ka, kb).is_err() {
                return detail(format!(
                    "Dimensions must be equal, but are {} and {}: shapes {} and {} (transpose_a={transpose_a}, transpose_b={transpose_b})",
                    ka.unwrap_or(0),
                    kb.unwrap_or(0),
                    a.shape,
                    b.shape
                ));
            }
            Ok(vec![TensorType::new(DType::F32, Shape(vec![m, n]))])
        }
        BatchMatMul { transpose_a, transpose_b } => crate::infer_matmul::infer(*transpose_a, *transpose_b, inputs),
        Binary(_) => {
            arity(inputs, 2)?;
            let (a, b) = (&inputs[0], &inputs[1]);
            if a.dtype != b.dtype {
                return detail(format!("operands have different dtypes: {a} and {b}"));
            }
            if a.dtype != DType::F32 {
                return detail(format!(
                    "elementwise arithmetic runs on f32 only, got {a}; cast the operands with cast(x, DType::F32) first (and the result back with cast(y, DType::I32))"
                ));
            }
            match broadcast_shapes(&a.shape, &b.shape) {
                Some(s) => Ok(vec![TensorType { dtype: a.dtype, shape: s }]),
                None => detail(format!("shapes {} and {} cannot be broadcast together", a.shape, b.shape)),
            }
        }
        Fused { expr } => {
            arity(inputs, expr.inputs())?;
            let mut shape = Shape::scalar();
            for (k, t) in inputs.iter().enumerate() {
                if t.dtype != DType::F32 {
                    return detail(format!("fused input {k} is {t}; fused kernels read f32 only"));
                }
                shape = match broadcast_shapes(&shape, &t.shape) {
                    Some(s) => s,
                    None => return detail(format!("fused input {k} ({}) does not broadcast with {shape}", t.shape)),
                };
            }
            Ok(vec![TensorType { dtype: DType::F32, shape }])
        }
        AddN | TowerMean { .. } => {
            if inputs.is_empty() {
                return Err(InferError::Arity { expected: "at least 1".into(), got: 0 });
            }
            if let TowerMean { weights } = op {
                if weights.len() != inputs.len() {
                    return detail(format!("{} weights for {} inputs", weights.len(), inputs.len()));
                }
            }
            let mut shape = inputs[0].shape.clone();
            for t in &inputs[1..] {
                if t.dtype != inputs[0].dtype || t.shape.rank() != shape.rank() {
                    return detail(format!("all inputs must have one type; got {} and {}", inputs[0], t));
                }
                for (i, d) in t.shape.0.iter().enumerate() {
                    shape.0[i] = merge_dim(shape.0[i], *d).or_else(|_| {
                        detail(format!("all inputs must have one shape; got {} and {}", inputs[0].shape, t.shape))
                    })?;
                }
            }
            Ok(vec![TensorType { dtype: inputs[0].dtype, shape }])
        }
        AllReduce { .. } => {
            if inputs.is_empty() {
                return Err(InferError::Arity { expected: "at least 1".into(), got: 0 });
            }
            if let Some(t) = inputs.iter().find(|t| t.dtype != DType::F32) {
                return detail(format!("all-reduce sums f32 tensors; got {t}"));
            }
            Ok(inputs.to_vec())
        }
        BiasAdd => {
            arity(inputs, 2)?;
            let (x, b) = (&inputs[0], &inputs[1]);
            want_float(x, "value")?;
            want_rank(b, 1, "bias")?;
            let c = x.shape.0.last().copied().flatten();
            if x.shape.rank() < 2 || merge_dim(c, b.shape.0[0]).is_err() {
                return detail(format!(
                    "bias {} must match the last dimension of value {} (rank >= 2)",
                    b.shape, x.shape
                ));
            }
            same(x)
        }
        BiasAddGrad => {
            arity(inputs, 1)?;
            let c = inputs[0].shape.0.last().copied().flatten();
            Ok(vec![TensorType::new(DType::F32, Shape(vec![c]))])
        }
        Unary(_) | Softmax | LogSoftmax | Identity | StopGradient => {
            arity(inputs, 1)?;
            if !matches!(op, Identity | StopGradient) && inputs[0].dtype != DType::F32 {
                return detail(format!(
                    "{} runs on f32 only, got {}; cast the input with cast(x, DType::F32) first",
                    op.type_name(),
                    inputs[0]
                ));
            }
            if matches!(op, Softmax | LogSoftmax) && inputs[0].shape.rank() < 1 {
                return detail("softmax needs rank >= 1".into());
            }
            same(&inputs[0])
        }
        UnaryGrad(_) | SoftmaxGrad | LogSoftmaxGrad => {
            arity(inputs, 2)?;
            if matches!(op, UnaryGrad(crate::op::UnaryOp::Abs)) {
                // |x|'s derivative needs x's sign, which y = |x| has lost.
                return detail("abs has no gradient from its output; its gradient is Binary(AbsGrad)(x, dy)".into());
            }
            if !inputs[0].shape.compatible(&inputs[1].shape) {
                return detail(format!("dy {} and y {} must have one shape", inputs[0].shape, inputs[1].shape));
            }
            same(&inputs[1])
        }
        Conv2D { strides, padding } => {
            arity(inputs, 2)?;
            let (x, f) = (&inputs[0], &inputs[1]);
            want_float(x, "input")?;
            want_rank(x, 4, "input (NHWC)")?;
            want_rank(f, 4, "filter (HWIO)")?;
            if merge_dim(x.shape.0[3], f.shape.0[2]).is_err() {
                return detail(format!(
                    "input channels of {} ({}) do not match filter {} in-channels ({})",
                    x.shape,
                    x.shape.0[3].unwrap_or(0),
                    f.shape,
                    f.shape.0[2].unwrap_or(0)
                ));
            }
            let (Some(kh), Some(kw)) = (f.shape.0[0], f.shape.0[1]) else {
                return detail(format!("filter shape {} must be known", f.shape));
            };
            Ok(vec![TensorType::new(DType::F32, window(x, [kh, kw], *strides, *padding, f.shape.0[3])?)])
        }
        Conv2DBackpropInput { .. } => {
            arity(inputs, 3)?;
            same(&inputs[0])
        }
        Conv2DBackpropFilter { .. } => {
            arity(inputs, 3)?;
            same(&inputs[1])
        }
        MaxPool { ksize, strides, padding } | AvgPool { ksize, strides, padding } => {
            arity(inputs, 1)?;
            want_float(&inputs[0], "input")?;
            Ok(vec![TensorType::new(DType::F32, window(&inputs[0], *ksize, *strides, *padding, None)?)])
        }
        MaxPoolGrad { .. } => {
            arity(inputs, 3)?;
            same(&inputs[0])
        }
        AvgPoolGrad { .. } => {
            arity(inputs, 2)?;
            same(&inputs[0])
        }
        Reshape { .. } | Concat { .. } | Split { .. } | Slice { .. } | SliceGrad { .. } | BroadcastLike | SumToLike => {
            crate::infer_layout::infer(op, inputs)
        }
        SparseSoftmaxCrossEntropy | SoftmaxCrossEntropy => {
            arity(inputs, 2)?;
            let (l, y) = (&inputs[0], &inputs[1]);
            want_float(l, "logits")?;
            want_rank(l, 2, "logits")?;
            let sparse = matches!(op, SparseSoftmaxCrossEntropy);
            if sparse {
                if y.dtype != DType::I32 || y.shape.rank() != 1 {
                    return detail(format!("sparse labels must be i32 of rank 1, got {y}"));
                }
                if merge_dim(l.shape.0[0], y.shape.0[0]).is_err() {
                    return detail(format!("logits {} and labels {} must have one batch size", l.shape, y.shape));
                }
            } else if y.dtype != DType::F32 && y.shape.rank() == 1 {
                return detail(format!(
                    "labels {y} are class indices, but softmax_cross_entropy_with_logits takes one-hot (or probability) labels of the logits' shape {}; use sparse_softmax_cross_entropy_with_logits for integer class labels",
                    l.shape
                ));
            } else if !l.shape.compatible(&y.shape) || y.dtype != DType::F32 {
                return detail(format!("logits {} and labels {} must have one shape", l, y));
            }
            let n = merge_dim(l.shape.0[0], y.shape.0[0]).unwrap_or(None);
            Ok(vec![TensorType::new(DType::F32, Shape(vec![n])), TensorType::new(DType::F32, l.shape.with_dim(0, n))])
        }
        L2Loss => {
            arity(inputs, 1)?;
            want_float(&inputs[0], "input")?;
            Ok(vec![TensorType::new(DType::F32, Shape::scalar())])
        }
        ReduceSum { axes, keep_dims }
        | ReduceMean { axes, keep_dims }
        | ReduceMax { axes, keep_dims }
        | ReduceMin { axes, keep_dims } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            if matches!(op, ReduceMax { .. } | ReduceMin { .. }) && x.dtype != DType::F32 {
                return detail(format!(
                    "reduce_max/reduce_min take f32, got {x}; cast the input first (b.cast(x, DType::F32))"
                ));
            }
            normalize_axes(axes, x.shape.rank())?;
            let mut out = Vec::new();
            for (i, d) in x.shape.0.iter().enumerate() {
                if axes.contains(&i) {
                    if *keep_dims {
                        out.push(Some(1));
                    }
                } else {
                    out.push(*d);
                }
            }
            Ok(vec![TensorType { dtype: x.dtype, shape: Shape(out) }])
        }
        ArgMax { axis } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            normalize_axes(&[*axis], x.shape.rank())?;
            let out: Vec<_> = x.shape.0.iter().enumerate().filter(|(i, _)| i != axis).map(|(_, d)| *d).collect();
            Ok(vec![TensorType::new(DType::I32, Shape(out))])
        }
        Equal => {
            arity(inputs, 2)?;
            let (a, b) = (&inputs[0], &inputs[1]);
            let s = broadcast_shapes(&a.shape, &b.shape)
                .ok_or_else(|| InferError::Detail(format!("shapes {} and {} cannot be compared", a.shape, b.shape)))?;
            if a.dtype != b.dtype {
                return detail(format!("cannot compare {a} with {b}"));
            }
            Ok(vec![TensorType::new(DType::Bool, s)])
        }
        Compare(c) => {
            arity(inputs, 2)?;
            let (a, b) = (&inputs[0], &inputs[1]);
            let s = broadcast_shapes(&a.shape, &b.shape)
                .ok_or_else(|| InferError::Detail(format!("shapes {} and {} cannot be compared", a.shape, b.shape)))?;
            if a.dtype != b.dtype {
                return detail(format!("cannot compare {a} with {b}; cast one operand to the other's dtype first"));
            }
            if !matches!(a.dtype, DType::F32 | DType::I32) {
                return detail(format!("{} compares f32 or i32, got {a}; cast the operands first", c.name()));
            }
            Ok(vec![TensorType::new(DType::Bool, s)])
        }
        Select => {
            arity(inputs, 3)?;
            let (c, x, y) = (&inputs[0], &inputs[1], &inputs[2]);
            if c.dtype != DType::Bool {
                return detail(format!("the condition must be bool, got {c}; build it with a comparison (b.greater(..)) or cast(c, DType::Bool)"));
            }
            if x.dtype != DType::F32 || y.dtype != DType::F32 {
                return detail(format!("x and y must be f32, got {x} and {y}"));
            }
            if !x.shape.compatible(&y.shape) {
                return detail(format!(
                    "x {} and y {} must have one shape (TF1's tf.where does not broadcast; for a constant branch pass b.zeros_like(x) or a filled tensor of x's shape)",
                    x.shape, y.shape
                ));
            }
            let rows = c.shape.rank() == 1 && x.shape.rank() > 1 && merge_dim(c.shape.0[0], x.shape.0[0]).is_ok();
            if !(c.shape.compatible(&x.shape) || rows) {
                return detail(format!(
                    "the condition {} must have the shape of x {} or be a vector of its first dimension (TF1's tf.where selects rows then); broadcast it with a comparison against x first",
                    c.shape, x.shape
                ));
            }
            Ok(vec![x.clone()])
        }
        Cast { dtype } => {
            arity(inputs, 1)?;
            Ok(vec![TensorType::new(*dtype, inputs[0].shape.clone())])
        }
        Dropout { rate, .. } => {
            arity(inputs, 1)?;
            want_float(&inputs[0], "input")?;
            if !(0.0..1.0).contains(&rate.0) {
                return detail(format!("rate {} must be in [0, 1)", rate.0));
            }
            Ok(vec![inputs[0].clone(), inputs[0].clone()])
        }
        BatchNorm { .. } => {
            arity(inputs, 5)?;
            let x = &inputs[0];
            want_float(x, "x")?;
            if x.shape.rank() != 2 && x.shape.rank() != 4 {
                return detail(format!("x must be [N,C] or NHWC, got {}", x.shape));
            }
            let c = x.shape.0[x.shape.rank() - 1];
            for (t, what) in inputs[1..].iter().zip(["gamma", "beta", "moving_mean", "moving_variance"]) {
                if t.shape.rank() != 1 || merge_dim(c, t.shape.0[0]).is_err() {
                    return detail(format!("{what} {} must be [C] with C = {}", t.shape, c.unwrap_or(0)));
                }
            }
            let stat = TensorType::new(DType::F32, Shape(vec![c]));
            Ok(vec![x.clone(), stat.clone(), stat.clone(), stat])
        }
        BatchNormGrad => {
            arity(inputs, 5)?;
            let c = inputs[2].clone();
            Ok(vec![inputs[1].clone(), c.clone(), c])
        }
        AssignMovingAverage { .. } => {
            arity(inputs, 2)?;
            if !inputs[0].shape.compatible(&inputs[1].shape) {
                return detail(format!(
                    "variable {} and value {} must have one shape",
                    inputs[0].shape, inputs[1].shape
                ));
            }
            same(&inputs[0])
        }
        ApplyGradient { optimizer } => {
            let n = 4 + optimizer.slot_names().len();
            arity(inputs, n)?;
            let var = &inputs[0];
            for t in &inputs[1..n - 2] {
                if !t.shape.compatible(&var.shape) {
                    return detail(format!("slot or gradient {} does not match variable {}", t.shape, var.shape));
                }
            }
            if inputs[n - 2].dtype != DType::I32 {
                return detail("the input before the learning rate must be the i32 global_step".into());
            }
            if inputs[n - 1].dtype != DType::F32 || inputs[n - 1].shape.rank() != 0 {
                return detail("the last input must be the f32 scalar learning rate".into());
            }
            same(var)
        }
        IncrementStep => {
            arity(inputs, 1)?;
            if inputs[0].dtype != DType::I32 {
                return detail(format!("global_step must be i32, got {}", inputs[0]));
            }
            same(&inputs[0])
        }
        Copy => {
            arity(inputs, 1)?;
            same(&inputs[0])
        }
        NoOp => {
            arity(inputs, 0)?;
            Ok(vec![])
        }
        Broadcast { variables, .. } => {
            arity(inputs, *variables)?;
            if let Some(t) = inputs.iter().find(|t| t.dtype != DType::F32) {
                return detail(format!("a broadcast carries f32 variables; got {t}"));
            }
            Ok(vec![])
        }
        // array ops (issue 22)
        OneHot { .. }
        | Transpose { .. }
        | ExpandDims { .. }
        | Squeeze { .. }
        | Pad { .. }
        | Gather { .. }
        | GatherGrad { .. }
        | Tile { .. }
        | TileGrad { .. } => crate::infer_array::infer(op, inputs),
        TopK { .. } | TopKGrad | InTopK { .. } => crate::infer_topk::infer(op, inputs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        let s = |v: &[Option<usize>]| Shape(v.to_vec());
        assert_eq!(broadcast_shapes(&s(&[None, Some(10)]), &s(&[Some(10)])), Some(s(&[None, Some(10)])));
        assert_eq!(broadcast_shapes(&s(&[Some(4), Some(1)]), &s(&[Some(3)])), Some(s(&[Some(4), Some(3)])));
        assert_eq!(broadcast_shapes(&s(&[Some(4), Some(2)]), &s(&[Some(3)])), None);
    }

    #[test]
    fn same_padding_matches_tf() {
        assert_eq!(Padding::Same.out_and_pad(28, 5, 1), Some((28, 2)));
        assert_eq!(Padding::Same.out_and_pad(28, 2, 2), Some((14, 0)));
        assert_eq!(Padding::Same.out_and_pad(7, 2, 2), Some((4, 0)));
        assert_eq!(Padding::Valid.out_and_pad(28, 5, 1), Some((24, 0)));
        assert_eq!(Padding::Valid.out_and_pad(3, 5, 1), None);
    }
}
