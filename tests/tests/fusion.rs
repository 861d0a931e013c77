//! Lowering's fusions change no number beyond reassociation: a run with
//! fused kernels (bias + activation, convolution + bias + activation, max-pool
//! gradient + activation gradient + bias gradient, activation gradient + bias
//! gradient, matmul + bias (+ activation), the cross-entropy with its mean,
//! scale and bias gradient,
//! activation gradients in place, and the optimizer updates of one device as
//! one multi-tensor launch) against the same run with every op its own
//! launch (`fuse_kernels` off). The fusions compute the same operations in
//! the same order except the bias gradients' sums (block by block, per group
//! of images): this small MLP's bias gradients fit one block, so it trains
//! bit for bit; the convnet within `TOL`. Both plans also name what
//! was fused, so a fusion that silently stops applying fails here.

use towers::compiler::{compile_train, CompileOptions};
use towers::models::ModelKind;
use towers_graph::{Device, Optimizer, F32};
use towers_passes::VarPlacement;
use towers_tests::{batches, max_rel_diff, run, small_model, TOL};

#[test]
fn fused_and_unfused_runs_agree() {
    let data = batches(24, 3, 9);
    let adam = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    for kind in [ModelKind::Mlp, ModelKind::Convnet] {
        let model = small_model(kind, false, 5);
        for towers in [0u32, 2] {
            for vars in [VarPlacement::Cpu, VarPlacement::Gpu0] {
                let mut o = CompileOptions::new(adam.clone(), 24);
                o.towers = (0..towers).map(Device::gpu).collect();
                o.variables = vars;
                let text = compile_train(&model.graph, &model.loss, &o).expect("compiles").plan.to_text();
                let fused = run(&model, &o, &data);
                o.fuse_kernels = false;
                let plain_text = compile_train(&model.graph, &model.loss, &o).expect("compiles").plan.to_text();
                let plain = run(&model, &o, &data);
                let what = format!("{kind:?} towers={towers} vars={vars:?}");
                assert!(text.contains("sparse_softmax_xent_mean_grad"), "{what}: the cross-entropy is not fused");
                assert!(text.contains("gemm_bias_act"), "{what}: no matmul is fused with its bias");
                assert!(!plain_text.contains("sparse_softmax_xent_mean_grad"), "{what}: fused with fusion off");
                // One device: every update runs after the last gradient, as one multi-tensor launch.
                if towers == 0 {
                    assert!(text.contains("multi_apply n="), "{what}: the updates are not one launch");
                    assert_eq!(text.matches(" apply_adam ").count(), 1, "{what}");
                }
                assert!(!plain_text.contains("multi_apply"), "{what}: merged with fusion off");
                if kind == ModelKind::Convnet {
                    assert!(text.contains("conv2d_bias_act") && text.contains("max_pool_grad_act_bias_grad"), "{what}");
                    let (d, var) = max_rel_diff(&fused, &plain);
                    assert!(d <= TOL, "{what}: {var} differs by {d}");
                } else {
                    assert_eq!(fused.losses, plain.losses, "{what}");
                    assert_eq!(fused.variables, plain.variables, "{what}");
                }
            }
        }
    }
}

/// The fusion plan names every fused launch once, in node order, and agrees
/// with the plan: each group's kernel appears as many times as the plan
/// launches it, no node is in two groups, and fusion off means no group.
#[test]
fn fusion_plan_lists_each_fused_launch_once() {
    let adam = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    let model = small_model(ModelKind::Convnet, false, 5);
    let mut o = CompileOptions::new(adam, 24);
    o.towers = (0..2).map(Device::gpu).collect();
    let c = compile_train(&model.graph, &model.loss, &o).expect("compiles");
    let f = c.fusions(&o).expect("fusions");
    let groups = f.groups(&c.graph);
    let text = c.plan.to_text();
    for (kernel, launch) in [
        ("Conv2DBiasAct", " conv2d_bias_act"),
        ("MaxPoolGradActBiasGrad", " max_pool_grad_act_bias_grad"),
        ("SparseSoftmaxXentMeanGrad", " sparse_softmax_xent_mean_grad"),
    ] {
        let n = groups.iter().filter(|g| g.kernel == kernel).count();
        assert!(n >= 2, "{kernel}: {n} groups at 2 towers\n{}", f.to_text(&c.graph));
        assert_eq!(n, text.matches(launch).count(), "{kernel}: groups and launches differ");
    }
    let mut seen = std::collections::BTreeSet::new();
    for g in &groups {
        assert!(g.members.contains(&g.lead), "{g:?}: the lead is a member");
        for m in &g.members {
            assert!(seen.insert(m.clone()), "{m} is in two groups");
        }
    }
    assert_eq!(f.len(), groups.len());
    assert_eq!(f.to_text(&c.graph), c.fusions(&o).expect("again").to_text(&c.graph), "deterministic");
    o.fuse_kernels = false;
    o.fuse_reductions = false;
    let plain = compile_train(&model.graph, &model.loss, &o).expect("compiles");
    assert!(plain.fusions(&o).expect("fusions").is_empty());
}

/// A large fused reduction + update (`mean_apply` over at least
/// `SPLIT_MIN` elements) runs as two halves on two threads when a tower's
/// thread is idle; every element is computed by the same body either way,
/// so the run matches the unfused reduction (`weighted_sum`, then the
/// update) bit for bit, for every optimizer and placement.
#[test]
fn split_reductions_change_no_bit() {
    use towers::models::{build, ModelSpec};
    let mut spec = ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10);
    spec.hidden = vec![1536];
    spec.seed = 2;
    let model = build(&spec).expect("builds");
    let data = batches(16, 6, 4);
    for opt in towers_tests::optimizers() {
        for vars in [VarPlacement::Cpu, VarPlacement::Gpu0] {
            let mut o = CompileOptions::new(opt.clone(), 16);
            o.towers = vec![Device::gpu(0), Device::gpu(1)];
            o.variables = vars;
            // A folded product that updates its variable itself rounds in
            // another order (tests/tests/tower_matmul.rs holds it): keep it
            // apart here, where every bit must match.
            o.fuse_tower_updates = false;
            let text = compile_train(&model.graph, &model.loss, &o).expect("compiles").plan.to_text();
            assert!(text.contains("mean_apply"), "{text}");
            let fused = run(&model, &o, &data);
            o.fuse_reductions = false;
            let plain = run(&model, &o, &data);
            assert_eq!(fused.losses, plain.losses, "{opt:?} {vars:?}");
            assert_eq!(fused.variables, plain.variables, "{opt:?} {vars:?}");
        }
    }
}
