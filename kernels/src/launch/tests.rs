//! The lowering's recorded argument lists (one kernel per family, a
//! snapshot in review), its errors, and its entry points against the
//! `.cu` sources.

use super::*;
use crate::reduce::desc::reduced_bits_to;
use crate::{BinaryOp, ConvGeom, DType, Padding, PoolGeom, UnaryOp};

fn conv_geom() -> ConvGeom {
    ConvGeom { n: 2, h: 8, w: 8, c_in: 3, kh: 3, kw: 3, c_out: 4, stride_h: 1, stride_w: 1, padding: Padding::Same }
}

fn pool_geom() -> PoolGeom {
    PoolGeom { n: 2, h: 8, w: 8, c: 4, kh: 2, kw: 2, stride_h: 2, stride_w: 2, padding: Padding::Valid }
}

/// (label, kernel, input counts, output counts, workspace): one per family
/// and per lowering shape (two-stage bias gradient, chunked convolution,
/// fused update through the workspace, side arrays).
fn samples() -> Vec<(&'static str, Kernel, Vec<usize>, Vec<usize>, Option<usize>)> {
    let momentum = Kernel::ApplyMomentum { momentum: 0.9, nesterov: false };
    vec![
        (
            "binary",
            Kernel::Binary { op: BinaryOp::Mul, a_shape: vec![10, 100], b_shape: vec![100], out_shape: vec![10, 100] },
            vec![1000, 100],
            vec![1000],
            None,
        ),
        ("unary", Kernel::Unary { op: UnaryOp::Relu }, vec![1000], vec![1000], None),
        ("add_n", Kernel::AddN { n: 3 }, vec![64, 64, 64], vec![64], None),
        (
            "gemm_bias_act",
            Kernel::MatMulBiasAct { m: 8, n: 4, k: 3, trans_a: false, trans_b: true, act: Some(UnaryOp::Relu) },
            vec![24, 12, 4],
            vec![32],
            None,
        ),
        (
            "conv2d_bias_act (im2col, fused pool)",
            Kernel::Conv2DBiasAct { geom: conv_geom(), workspace_len: 0, act: UnaryOp::Relu, pool: Some(pool_geom()) },
            vec![384, 108, 4],
            vec![512, 128],
            Some(27 * 128),
        ),
        (
            "conv2d_backprop_filter",
            Kernel::Conv2DBackpropFilter { geom: conv_geom(), workspace_len: 0 },
            vec![384, 512],
            vec![108],
            Some(27 * 128),
        ),
        ("max_pool", Kernel::MaxPool { geom: pool_geom() }, vec![512], vec![128], None),
        ("concat", Kernel::Concat { axis: 1, shapes: vec![vec![2, 3], vec![2, 5]] }, vec![6, 10], vec![16], None),
        ("softmax", Kernel::Softmax { classes: 10 }, vec![320], vec![320], None),
        (
            "unary_grad_bias_grad (two stages)",
            Kernel::UnaryGradBiasGrad { channels: 16, act: UnaryOp::Relu },
            vec![65536, 65536],
            vec![65536, 16],
            None,
        ),
        ("reduce_mean", Kernel::ReduceMean { shape: vec![4, 6], axes: vec![0] }, vec![24], vec![6], None),
        ("argmax", Kernel::ArgMax { shape: vec![32, 10], axis: 1 }, vec![320], vec![32], None),
        ("reduce_max", Kernel::ReduceMax { shape: vec![4, 6], axes: vec![1] }, vec![24], vec![4], None),
        (
            "compare (less, i32)",
            Kernel::Compare { cmp: crate::Comparison::Less, dtype: DType::I32 },
            vec![9, 9],
            vec![9],
            None,
        ),
        ("select (rows of 5)", Kernel::Select { inner: 5 }, vec![20, 20, 4], vec![20], None),
        ("cast", Kernel::Cast { from: DType::F32, to: DType::I32 }, vec![9], vec![9], None),
        (
            "batch_norm_train",
            Kernel::BatchNormTrain { channels: 4, epsilon: 1e-3 },
            vec![64, 4, 4],
            vec![64, 4, 4, 4],
            None,
        ),
        ("dropout", Kernel::Dropout { keep_prob: 0.5, seed: 7, elem_offset: 3 }, vec![100], vec![100, 100], None),
        (
            "apply_adam",
            Kernel::ApplyAdam { beta1: 0.9, beta2: 0.999, epsilon: 1e-8 },
            vec![10, 1, 1],
            vec![10, 10, 10],
            None,
        ),
        (
            "multi_apply momentum",
            Kernel::MultiApply { apply: Box::new(momentum.clone()), count: 2 },
            vec![10, 6, 1],
            vec![10, 10, 6, 6],
            None,
        ),
        (
            "gemm_tower_apply",
            Kernel::TowerMatMulApply {
                m: 4,
                n: 3,
                ks: vec![5, 5],
                trans_a: true,
                trans_b: false,
                weights: vec![0.5, 0.5],
                apply: Box::new(momentum),
            },
            vec![20, 15, 20, 15, 1],
            vec![12, 12],
            Some(12),
        ),
        ("one_hot", Kernel::OneHot { depth: 10, on: 1.0, off: 0.0 }, vec![32], vec![320], None),
        ("gather", Kernel::Gather { outer: 1, limit: 50, inner: 8, count: 4 }, vec![400, 4], vec![32], None),
        ("increment_step", Kernel::IncrementStep, vec![], vec![1], None),
        ("top_k", Kernel::TopK { rows: 32, cols: 10, k: 5 }, vec![320], vec![160, 160], None),
        ("in_top_k", Kernel::InTopK { rows: 32, cols: 10, k: 5 }, vec![320, 32], vec![32], None),
        ("top_k_grad", Kernel::TopKGrad { rows: 32, cols: 10, k: 5 }, vec![160, 160], vec![320], None),
    ]
}

fn lowered(kernel: &Kernel, ins: &[usize], outs: &[usize], ws: Option<usize>) -> Result<Lowering, LaunchError> {
    lower(kernel, Counts { ins, outs, workspace: ws })
}

#[test]
fn recorded_argument_lists() {
    let mut text = String::new();
    for (label, k, ins, outs, ws) in samples() {
        let low = lowered(&k, &ins, &outs, ws).unwrap_or_else(|e| panic!("{label}: {e}"));
        text.push_str(&format!("# {label}\n{low}"));
        // Deterministic: the same kernel and counts, the same ops.
        assert_eq!(lowered(&k, &ins, &outs, ws).as_ref(), Ok(&low), "{label}");
    }
    insta::assert_snapshot!(text);
}

#[test]
fn every_entry_is_defined_in_its_family_source() {
    for e in entries::all() {
        let src = crate::cuda::source(e.family).unwrap_or_else(|| panic!("{}: no family {}", e.name, e.family));
        assert!(src.code.contains(&format!("void {}(", e.name)), "{} is not defined in {}", e.name, src.path);
    }
    let mut names: Vec<_> = entries::all().map(|e| e.name).collect();
    assert_eq!(names.len(), 76, "every family's entries");
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), entries::all().count(), "an entry is named twice");
}

#[test]
fn a_launch_with_too_few_operands_is_a_typed_error() {
    let k = Kernel::Binary { op: BinaryOp::Add, a_shape: vec![4], b_shape: vec![4], out_shape: vec![4] };
    let e = lowered(&k, &[4], &[4], None).unwrap_err();
    assert_eq!(e, LaunchError::Missing { kernel: "binary", which: Which::In(1) });
    assert!(e.to_string().contains("binary"), "{e}");
}

#[test]
fn rank_above_four_and_small_workspaces_are_typed_errors() {
    let k = Kernel::ReduceSum { shape: vec![2; 5], axes: vec![0] };
    assert_eq!(lowered(&k, &[32], &[16], None).unwrap_err(), LaunchError::Rank { kernel: "reduce_sum", rank: 5 });
    let k = Kernel::Conv2D { geom: conv_geom(), workspace_len: 0 };
    let e = lowered(&k, &[384, 108], &[512], Some(26)).unwrap_err();
    assert_eq!(e, LaunchError::Workspace { kernel: k.name(), have: 26, need: conv_workspace_floats(&conv_geom()) });
    let k = Kernel::MeanApply { weights: vec![0.5, 0.5], apply: Box::new(Kernel::Fill { value: 0.0 }) };
    assert!(matches!(lowered(&k, &[4, 4, 1], &[4], None), Err(LaunchError::CannotFuse { .. })));
}

#[test]
fn conv_workspace_holds_the_column_matrix_up_to_the_cap() {
    let g = conv_geom();
    assert_eq!(conv_workspace_floats(&g), g.rows() * g.k());
    let pointwise = ConvGeom { kh: 1, kw: 1, ..g };
    assert_eq!(conv_workspace_floats(&pointwise), 0);
    let huge = ConvGeom { n: 4096, h: 64, w: 64, c_in: 64, ..g };
    assert_eq!(conv_workspace_floats(&huge), MAX_WORKSPACE_BYTES / 4);
}

#[test]
fn reduced_axes_of_sum_to_shape() {
    // [N, C] -> [C]: rows (padded axis 2).
    assert_eq!(reduced_bits_to(&[8, 3], &[3]), 0b0100);
    // [N, H, W, C] -> [1, 1, 1, C].
    assert_eq!(reduced_bits_to(&[2, 4, 4, 3], &[1, 1, 1, 3]), 0b0111);
    // [2, 3] -> [] (a scalar).
    assert_eq!(reduced_bits_to(&[2, 3], &[]), 0b1100);
    // Nothing reduced where x is already 1.
    assert_eq!(reduced_bits_to(&[1, 3], &[3]), 0);
}
