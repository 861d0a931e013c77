//! Tests of the operand table and its generic check: every kernel has a
//! signature whose counts, names and rules are consistent; operands built
//! to fit it pass the check, and breaking any one of them (arity, a fixed
//! dtype, a fixed length) is reported at that operand.

use super::{Actual, DTypeRule, Len, Mismatch, ParamError, Ref, Role, Side, Signature};
use crate::conv::ConvGeom;
use crate::dtype::DType;
use crate::elementwise::{BinaryOp, FusedExpr, UnaryOp};
use crate::pool::PoolGeom;
use crate::window::Padding;
use crate::Kernel;

fn conv_geom() -> ConvGeom {
    ConvGeom { n: 2, h: 5, w: 5, c_in: 3, kh: 3, kw: 3, c_out: 4, stride_h: 1, stride_w: 1, padding: Padding::Same }
}

fn pool_geom() -> PoolGeom {
    PoolGeom { n: 2, h: 4, w: 4, c: 3, kh: 2, kw: 2, stride_h: 2, stride_w: 2, padding: Padding::Valid }
}

/// One kernel of every variant (the match in [`covered`] keeps the list whole).
pub(super) fn samples() -> Vec<Kernel> {
    let g = conv_geom();
    let p = pool_geom();
    let sgd = Box::new(Kernel::ApplyGradientDescent {});
    let momentum = Box::new(Kernel::ApplyMomentum { momentum: 0.9, nesterov: false });
    let adam = Box::new(Kernel::ApplyAdam { beta1: 0.9, beta2: 0.999, epsilon: 1e-8 });
    let expr: FusedExpr = "ew[$0;$1;add:0:1;relu:2]".parse().expect("a valid expression");
    let pool_after = PoolGeom { n: 2, h: 5, w: 5, c: 4, ..p };
    vec![
        Kernel::MatMul { m: 2, n: 3, k: 4, trans_a: false, trans_b: true },
        Kernel::BatchMatMul {
            batch: 3,
            m: 2,
            n: 3,
            k: 4,
            trans_a: false,
            trans_b: true,
            shared_a: false,
            shared_b: true,
        },
        Kernel::TowerMatMul { m: 2, n: 3, ks: vec![4, 5], trans_a: true, trans_b: false, weights: vec![0.5, 0.5] },
        Kernel::TowerMatMulApply {
            m: 2,
            n: 3,
            ks: vec![4, 5],
            trans_a: true,
            trans_b: false,
            weights: vec![0.5, 0.5],
            apply: momentum.clone(),
        },
        Kernel::MatMulBiasAct { m: 2, n: 3, k: 4, trans_a: false, trans_b: false, act: Some(UnaryOp::Relu) },
        Kernel::Binary { op: BinaryOp::Add, a_shape: vec![2, 3], b_shape: vec![3], out_shape: vec![2, 3] },
        Kernel::Fused { expr, in_shapes: vec![vec![2, 3], vec![3]], out_shape: vec![2, 3] },
        Kernel::AddN { n: 3 },
        Kernel::BiasAdd { channels: 3 },
        Kernel::BiasAddAct { channels: 3, act: UnaryOp::Relu },
        Kernel::UnaryGradBiasGrad { channels: 3, act: UnaryOp::Relu },
        Kernel::BiasAddGrad { channels: 3 },
        Kernel::Unary { op: UnaryOp::Tanh },
        Kernel::UnaryGrad { op: UnaryOp::Tanh },
        Kernel::Conv2D { geom: g, workspace_len: g.workspace_len() },
        Kernel::Conv2DBiasAct { geom: g, workspace_len: g.workspace_len(), act: UnaryOp::Relu, pool: Some(pool_after) },
        Kernel::Conv2DBackpropInput { geom: g, workspace_len: g.workspace_len() },
        Kernel::Conv2DBackpropFilter { geom: g, workspace_len: g.workspace_len() },
        Kernel::MaxPool { geom: p },
        Kernel::MaxPoolGrad { geom: p },
        Kernel::MaxPoolGradActBiasGrad { geom: p, act: UnaryOp::Relu },
        Kernel::AvgPool { geom: p },
        Kernel::AvgPoolGrad { geom: p },
        Kernel::Concat { axis: 1, shapes: vec![vec![2, 3], vec![2, 1]] },
        Kernel::Split { axis: 0, shape: vec![3, 2], sizes: vec![1, 2] },
        Kernel::Slice { shape: vec![3, 4], begin: vec![1, 0], size: vec![2, 2] },
        Kernel::SliceGrad { shape: vec![3, 4], begin: vec![1, 0], size: vec![2, 2] },
        Kernel::BroadcastTo { x_shape: vec![3], out_shape: vec![2, 3] },
        Kernel::SumTo { x_shape: vec![2, 3], out_shape: vec![3] },
        Kernel::Softmax { classes: 3 },
        Kernel::LogSoftmax { classes: 3 },
        Kernel::SoftmaxGrad { classes: 3 },
        Kernel::LogSoftmaxGrad { classes: 3 },
        Kernel::SparseSoftmaxXentMeanGrad { classes: 3 },
        Kernel::SparseSoftmaxXent { classes: 3 },
        Kernel::SoftmaxXent { classes: 3 },
        Kernel::L2Loss,
        Kernel::ReduceSum { shape: vec![2, 3], axes: vec![0] },
        Kernel::ReduceMean { shape: vec![2, 3], axes: vec![1] },
        Kernel::ReduceMax { shape: vec![2, 3], axes: vec![1] },
        Kernel::ReduceMin { shape: vec![2, 3], axes: vec![0] },
        Kernel::ArgMax { shape: vec![2, 3], axis: 1 },
        Kernel::Equal { dtype: DType::I32 },
        Kernel::Compare { cmp: crate::Comparison::Greater, dtype: DType::F32 },
        Kernel::Select { inner: 3 },
        Kernel::Cast { from: DType::Bool, to: DType::F32 },
        Kernel::Dropout { keep_prob: 0.5, seed: 7, elem_offset: 12 },
        Kernel::Fill { value: 1.0 },
        Kernel::BatchNormTrain { channels: 3, epsilon: 1e-3 },
        Kernel::BatchNormInfer { channels: 3, epsilon: 1e-3 },
        Kernel::BatchNormGrad { channels: 3 },
        Kernel::AssignMovingAverage { decay: 0.99 },
        Kernel::ApplyGradientDescent {},
        Kernel::ApplyMomentum { momentum: 0.9, nesterov: true },
        Kernel::ApplyAdam { beta1: 0.9, beta2: 0.999, epsilon: 1e-8 },
        Kernel::WeightedSum { weights: vec![0.25, 0.75] },
        Kernel::MeanApply { weights: vec![0.5, 0.5], apply: adam.clone() },
        Kernel::MultiApply { apply: adam, count: 3 },
        Kernel::IncrementStep,
        Kernel::OneHot { depth: 4, on: 1.0, off: 0.0 },
        Kernel::Transpose { shape: vec![2, 3], perm: vec![1, 0] },
        Kernel::Pad { shape: vec![2, 2], before: vec![1, 0], out_shape: vec![4, 3], value: 0.0 },
        Kernel::Gather { outer: 2, limit: 5, inner: 3, count: 4 },
        Kernel::GatherGrad { outer: 2, limit: 5, inner: 3, count: 4 },
        Kernel::Tile { shape: vec![2, 3], multiples: vec![2, 1] },
        Kernel::TileGrad { shape: vec![2, 3], multiples: vec![2, 1] },
        Kernel::ApplyRmsProp { decay: 0.9, momentum: 0.0, epsilon: 1e-10 },
        Kernel::ApplyAdagrad {},
        Kernel::MultiApply { apply: sgd, count: 2 },
        Kernel::TopK { rows: 3, cols: 5, k: 2 },
        Kernel::InTopK { rows: 3, cols: 5, k: 2 },
        Kernel::TopKGrad { rows: 3, cols: 5, k: 2 },
    ]
}

/// Which variant a kernel is: an exhaustive match, so a new variant without
/// a sample fails to compile here.
fn covered(k: &Kernel) -> &'static str {
    match k {
        Kernel::MatMul { .. }
        | Kernel::BatchMatMul { .. }
        | Kernel::TowerMatMul { .. }
        | Kernel::TowerMatMulApply { .. }
        | Kernel::MatMulBiasAct { .. }
        | Kernel::Binary { .. }
        | Kernel::Fused { .. }
        | Kernel::AddN { .. }
        | Kernel::BiasAdd { .. }
        | Kernel::BiasAddAct { .. }
        | Kernel::UnaryGradBiasGrad { .. }
        | Kernel::BiasAddGrad { .. }
        | Kernel::Unary { .. }
        | Kernel::UnaryGrad { .. }
        | Kernel::Conv2D { .. }
        | Kernel::Conv2DBiasAct { .. }
        | Kernel::Conv2DBackpropInput { .. }
        | Kernel::Conv2DBackpropFilter { .. }
        | Kernel::MaxPool { .. }
        | Kernel::MaxPoolGrad { .. }
        | Kernel::MaxPoolGradActBiasGrad { .. }
        | Kernel::AvgPool { .. }
        | Kernel::AvgPoolGrad { .. }
        | Kernel::Concat { .. }
        | Kernel::Split { .. }
        | Kernel::Slice { .. }
        | Kernel::SliceGrad { .. }
        | Kernel::BroadcastTo { .. }
        | Kernel::SumTo { .. }
        | Kernel::Softmax { .. }
        | Kernel::LogSoftmax { .. }
        | Kernel::SoftmaxGrad { .. }
        | Kernel::LogSoftmaxGrad { .. }
        | Kernel::SparseSoftmaxXentMeanGrad { .. }
        | Kernel::SparseSoftmaxXent { .. }
        | Kernel::SoftmaxXent { .. }
        | Kernel::L2Loss
        | Kernel::ReduceSum { .. }
        | Kernel::ReduceMean { .. }
        | Kernel::ReduceMax { .. }
        | Kernel::ReduceMin { .. }
        | Kernel::ArgMax { .. }
        | Kernel::Equal { .. }
        | Kernel::Compare { .. }
        | Kernel::Select { .. }
        | Kernel::Cast { .. }
        | Kernel::Dropout { .. }
        | Kernel::Fill { .. }
        | Kernel::BatchNormTrain { .. }
        | Kernel::BatchNormInfer { .. }
        | Kernel::BatchNormGrad { .. }
        | Kernel::AssignMovingAverage { .. }
        | Kernel::ApplyGradientDescent { .. }
        | Kernel::ApplyMomentum { .. }
        | Kernel::ApplyAdam { .. }
        | Kernel::WeightedSum { .. }
        | Kernel::MeanApply { .. }
        | Kernel::MultiApply { .. }
        | Kernel::IncrementStep
        | Kernel::OneHot { .. }
        | Kernel::Transpose { .. }
        | Kernel::Pad { .. }
        | Kernel::Gather { .. }
        | Kernel::GatherGrad { .. }
        | Kernel::Tile { .. }
        | Kernel::TileGrad { .. }
        | Kernel::ApplyRmsProp { .. }
        | Kernel::ApplyAdagrad { .. }
        | Kernel::TopK { .. }
        | Kernel::InTopK { .. }
        | Kernel::TopKGrad { .. } => k.name(),
    }
}

pub(super) fn sig(k: &Kernel) -> Signature {
    k.signature().unwrap_or_else(|e| panic!("{}: {e}", k.name()))
}

/// Operands that fit `s`: every rule resolved (an `Any` length is 6, a
/// multiple of n is 2n), dtypes as declared (`Any`: f32).
pub(super) fn fit(s: &Signature) -> (Vec<Actual>, Vec<Actual>, Option<Actual>) {
    let n = [s.input_count(), s.output_count()];
    let mut lens: [Vec<Option<usize>>; 2] = [vec![None; n[0]], vec![None; n[1]]];
    let mut dts: [Vec<Option<DType>>; 2] = [vec![None; n[0]], vec![None; n[1]]];
    let get = |v: &[Vec<Option<usize>>; 2], x: Ref, r: usize| v[x.side as usize][x.index(r).expect("in range")];
    for _ in 0..4 {
        for side in [Side::In, Side::Out] {
            for i in 0..n[side as usize] {
                let (o, r, _) = s.operand(side, i).expect("in range");
                let len = match o.len {
                    Len::Exact(e) => Some(e),
                    Len::Like(x) => get(&lens, x, r),
                    Len::Rows { of, per_row } => get(&lens, of, r).map(|l| l / per_row),
                    Len::Times { of, factor } => get(&lens, of, r).map(|l| l * factor),
                    Len::Multiple(m) => Some(2 * m),
                    Len::AtMost(_) | Len::Any => Some(6),
                };
                lens[side as usize][i] = len;
                let dt = match o.dtype {
                    DTypeRule::Is(d) => Some(d),
                    DTypeRule::Any => Some(DType::F32),
                    DTypeRule::Like(x) => dts[x.side as usize][x.index(r).expect("in range")],
                };
                dts[side as usize][i] = dt;
            }
        }
    }
    let actual = |side: usize, i: usize| Actual {
        dtype: dts[side][i].expect("the dtype resolves"),
        elems: lens[side][i].expect("the length resolves"),
    };
    let ins = (0..n[0]).map(|i| actual(0, i)).collect();
    let outs = (0..n[1]).map(|i| actual(1, i)).collect();
    let ws = s.workspace.as_ref().map(|w| match w.len {
        Len::Exact(e) => Actual { dtype: DType::F32, elems: e },
        other => panic!("a workspace of {other}"),
    });
    (ins, outs, ws)
}

#[test]
fn every_kernel_has_a_consistent_signature() {
    let all = samples();
    let mut names: Vec<&str> = all.iter().map(covered).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 71, "one sample per variant (MultiApply twice)");
    for k in &all {
        let s = sig(k);
        assert_eq!(s.kernel, k.name());
        for side in [Side::In, Side::Out] {
            let n = if side == Side::In { s.input_count() } else { s.output_count() };
            let labels: Vec<String> = (0..n).map(|i| s.name(side, i)).collect();
            let mut unique = labels.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), n, "{}: {} names {labels:?} are distinct", k.name(), side.word());
            assert!(s.operand(side, n).is_none(), "{}: nothing past the end", k.name());
            for i in 0..n {
                let (o, _, _) = s.operand(side, i).expect("in range");
                let ok_role = match side {
                    Side::In => o.role == Role::Read,
                    Side::Out => matches!(o.role, Role::Write | Role::Update),
                };
                assert!(ok_role, "{} {} {i}: role {:?}", k.name(), side.word(), o.role);
            }
        }
        // The text is deterministic and names every parameter it lists.
        assert_eq!(s.to_string(), sig(k).to_string());
        assert!(s.to_string().starts_with(&format!("{}(", k.name())), "{s}");
    }
}

#[test]
fn fitting_operands_pass_and_each_broken_one_is_named() {
    for k in &samples() {
        let s = sig(k);
        let (ins, outs, ws) = fit(&s);
        assert_eq!(s.check(&ins, &outs, ws), Ok(()), "{}: {s}", k.name());
        // One input or output too few.
        if let Some((_, fewer)) = ins.split_last() {
            let e = s.check(fewer, &outs, ws).expect_err("an input missing");
            assert_eq!(e, Mismatch::Arity { side: Side::In, expected: ins.len(), got: ins.len() - 1 });
            assert!(s.explain(&e).contains(&s.names(Side::In)), "{}", s.explain(&e));
        }
        let (_, fewer) = outs.split_last().expect("every kernel writes");
        let e = s.check(&ins, fewer, ws).expect_err("an output missing");
        assert!(matches!(e, Mismatch::Arity { side: Side::Out, .. }), "{e:?}");
        // Each fixed dtype and each exact length, broken alone.
        for (side, list) in [(Side::In, &ins), (Side::Out, &outs)] {
            for i in 0..list.len() {
                let (o, _, _) = s.operand(side, i).expect("in range");
                let broken = |f: &dyn Fn(&mut Actual)| {
                    let (mut a, mut b) = (ins.clone(), outs.clone());
                    f(if side == Side::In { &mut a[i] } else { &mut b[i] });
                    s.check(&a, &b, ws)
                };
                if let DTypeRule::Is(d) = o.dtype {
                    let other = if d == DType::F32 { DType::I32 } else { DType::F32 };
                    let e = broken(&|a| a.dtype = other).expect_err("a wrong dtype");
                    assert_eq!(e, Mismatch::Dtype { side, index: i, expected: d, got: other }, "{}", k.name());
                    assert!(s.explain(&e).contains(&format!("({})", s.name(side, i))), "{}", s.explain(&e));
                }
                if let Len::Exact(n) = o.len {
                    let e = broken(&|a| a.elems = n + 1).expect_err("a wrong length");
                    let (index, expected, got) = (i, n, n + 1);
                    assert_eq!(e, Mismatch::Size { side, index, expected, got }, "{}", k.name());
                }
            }
        }
    }
}

#[test]
fn workspaces_follow_the_geometry() {
    let g = conv_geom();
    assert!(g.workspace_len() > 0);
    let s = sig(&Kernel::Conv2D { geom: g, workspace_len: g.workspace_len() });
    let (ins, outs, ws) = fit(&s);
    let e = s.check(&ins, &outs, None).expect_err("no workspace");
    assert_eq!(e, Mismatch::Workspace { expected: g.workspace_len(), got: None });
    let i32_ws = ws.map(|w| Actual { dtype: DType::I32, ..w });
    assert!(matches!(s.check(&ins, &outs, i32_ws), Err(Mismatch::Workspace { .. })));
    // A kernel without one refuses one.
    let s = sig(&Kernel::L2Loss);
    let (ins, outs, _) = fit(&s);
    let e = s.check(&ins, &outs, ws).expect_err("a workspace for l2_loss");
    assert_eq!(e, Mismatch::Workspace { expected: 0, got: ws });
    // The declared length must be the geometry's.
    let e = Kernel::Conv2D { geom: g, workspace_len: 1 }.signature().expect_err("a wrong workspace_len");
    assert!(e.reason.contains("workspace_len 1"), "{e}");
}

#[test]
fn rules_between_operands_are_checked() {
    // Labels: one per row of logits.
    let s = sig(&Kernel::SparseSoftmaxXent { classes: 3 });
    let (mut ins, outs, _) = fit(&s);
    ins[0].elems = 9;
    assert_eq!(s.check(&ins, &outs, None), Err(Mismatch::Size { side: Side::In, index: 1, expected: 3, got: 2 }));
    ins[0].elems = 7;
    assert_eq!(s.check(&ins, &outs, None), Err(Mismatch::Multiple { side: Side::In, index: 0, of: 3, got: 7 }));
    // A multi-tensor update: member 1's gradient is as long as member 1's variable.
    let s = sig(&Kernel::MultiApply {
        apply: Box::new(Kernel::ApplyMomentum { momentum: 0.9, nesterov: false }),
        count: 2,
    });
    let (ins, mut outs, _) = fit(&s);
    outs[2].elems = 5;
    let e = s.check(&ins, &outs, None).expect_err("member 1's grad is too short");
    assert_eq!(e, Mismatch::Size { side: Side::In, index: 1, expected: 5, got: 6 });
    assert_eq!(
        s.explain(&e),
        "multi_apply input 1 (grad_1) has 6 elements, but the parameters need 5 (the length of output 2 (var_1))"
    );
    // Layout kernels move any 4-byte element, all of one dtype.
    let s = sig(&Kernel::Transpose { shape: vec![2, 3], perm: vec![1, 0] });
    let i32s = Actual { dtype: DType::I32, elems: 6 };
    assert_eq!(s.check(&[i32s], &[i32s], None), Ok(()));
    let e = s.check(&[i32s], &[Actual { dtype: DType::F32, elems: 6 }], None).expect_err("mixed dtypes");
    assert_eq!(e, Mismatch::Dtype { side: Side::Out, index: 0, expected: DType::I32, got: DType::F32 });
    // One-hot: depth values per index, with the product checked.
    let s = sig(&Kernel::OneHot { depth: usize::MAX, on: 1.0, off: 0.0 });
    let e = s.check(&[i32s], &[Actual { dtype: DType::F32, elems: 1 }], None).expect_err("overflow");
    assert_eq!(e, Mismatch::Overflow { side: Side::Out, index: 0 });
    // Dropout's counter offset plus the length must not overflow.
    let s = sig(&Kernel::Dropout { keep_prob: 0.5, seed: 1, elem_offset: usize::MAX - 2 });
    let x = Actual { dtype: DType::F32, elems: 3 };
    assert!(matches!(s.check(&[x], &[x, x], None), Err(Mismatch::TooLong { limit: 2, .. })));
}

#[test]
fn inconsistent_parameters_are_param_errors() {
    let bad = |k: Kernel| k.signature().expect_err("invalid parameters").reason;
    assert_eq!(bad(Kernel::Softmax { classes: 0 }), "classes is 0");
    assert_eq!(
        bad(Kernel::Binary { op: BinaryOp::Add, a_shape: vec![2, 3], b_shape: vec![2], out_shape: vec![2, 3] }),
        "[2,3] and [2] do not broadcast to [2,3]"
    );
    assert_eq!(bad(Kernel::MatMul { m: usize::MAX, n: 2, k: 2, trans_a: false, trans_b: false }), "m*k overflows");
    let adam = Box::new(Kernel::ApplyAdam { beta1: 0.9, beta2: 0.999, epsilon: 1e-8 });
    assert_eq!(bad(Kernel::MultiApply { apply: adam.clone(), count: usize::MAX }), "count + shared inputs overflows");
    assert_eq!(
        bad(Kernel::MeanApply { weights: vec![1.0], apply: Box::new(Kernel::L2Loss) }),
        "l2_loss is not an optimizer update"
    );
    // A huge member count costs one run, not one entry per member.
    let s = sig(&Kernel::MultiApply { apply: adam, count: 1 << 40 });
    assert_eq!((s.input_count(), s.output_count()), ((1 << 40) + 2, 3 << 40));
    assert_eq!(s.name(Side::Out, (3 << 40) - 1), format!("v_{}", (1u64 << 40) - 1));
    let e: ParamError = Kernel::Concat { axis: 2, shapes: vec![vec![2, 3]] }.signature().expect_err("axis");
    assert_eq!(e.to_string(), "axis 2 is out of range for rank 2");
}

#[test]
fn the_signature_text_lists_operands_and_parameters() {
    let s = sig(&Kernel::MatMul { m: 2, n: 3, k: 4, trans_a: false, trans_b: true });
    assert_eq!(
        s.to_string(),
        "gemm(input a: f32[8] read, input b: f32[12] read, output c: f32[6] written; \
         m=2, n=3, trans_a=false, trans_b=true, k=4)"
    );
    let s = sig(&Kernel::ApplyMomentum { momentum: 0.9, nesterov: false });
    assert_eq!(
        s.to_string(),
        "apply_momentum(input grad: f32[=len(out0)] read, input lr: f32[1] read, \
         output var: f32[any] read-written, output accum: f32[=len(out0)] read-written; \
         momentum=0.9, nesterov=false)"
    );
    assert_eq!(s.names(Side::Out), "var, accum");
}

/// The names a doc segment lists (`a, b (f32), c = ...`), or None when an
/// item is prose rather than a name. `none` lists nothing.
fn doc_names(segment: &str) -> Option<Vec<String>> {
    let segment = segment.trim();
    if segment == "none" {
        return Some(Vec::new());
    }
    let mut items = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, ch) in segment.char_indices() {
        match ch {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&segment[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&segment[start..]);
    items
        .iter()
        .map(|item| {
            let item = item.trim();
            let end = item.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
            let (name, rest) = item.split_at(end.unwrap_or(item.len()));
            let named = !name.is_empty() && (rest.is_empty() || rest.starts_with(" (") || rest.starts_with(" ="));
            named.then(|| name.to_string())
        })
        .collect()
}

/// The segment after `key` (`in: `, `out: `) up to the first `.`, `:` or
/// `;` outside brackets and backquotes.
fn doc_segment<'a>(doc: &'a str, key: &str) -> Option<&'a str> {
    let from = doc.find(key)? + key.len();
    let rest = &doc[from..];
    let (mut depth, mut quoted) = (0i32, false);
    for (i, ch) in rest.char_indices() {
        match ch {
            '`' => quoted = !quoted,
            '(' | '[' if !quoted => depth += 1,
            ')' | ']' if !quoted => depth -= 1,
            '.' | ':' | ';' if depth == 0 && !quoted => return Some(&rest[..i]),
            _ => {}
        }
    }
    Some(rest)
}

/// Each variant's docs name its operands as its signature does, wherever
/// the docs list them by name (prose such as "n tensors" is left alone).
#[test]
fn the_variant_docs_name_the_signature_operands() {
    let source = include_str!("../kernel.rs");
    // Variant name -> its doc text (the `///` lines just above it).
    let mut docs: Vec<(String, String)> = Vec::new();
    let mut doc = String::new();
    for line in source.lines() {
        let t = line.trim_start();
        if let Some(d) = t.strip_prefix("///") {
            doc.push_str(d.trim());
            doc.push(' ');
        } else if line.starts_with("    ") && !line.starts_with("     ") && t.starts_with(char::is_uppercase) {
            let name: String = t.chars().take_while(|c| c.is_alphanumeric()).collect();
            docs.push((name, std::mem::take(&mut doc)));
        } else {
            doc.clear();
        }
    }
    let (mut checked, mut wrong) = (0, Vec::new());
    for k in &samples() {
        let variant: String = format!("{k:?}").chars().take_while(|c| c.is_alphanumeric()).collect();
        let Some((_, doc)) = docs.iter().find(|(n, _)| *n == variant) else { continue };
        let s = sig(k);
        for (key, side, n) in [("in: ", Side::In, s.input_count()), ("out: ", Side::Out, s.output_count())] {
            let Some(listed) = doc_segment(doc, key).and_then(doc_names) else { continue };
            let names: Vec<String> = (0..n).map(|i| s.name(side, i)).collect();
            if listed != names {
                wrong.push(format!("{variant} {key}docs {listed:?}, signature {names:?}"));
            }
            checked += 1;
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(checked >= 80, "only {checked} operand lists are checked against the docs");
}
