//! Snapshots of what the compiler produces for the seed MLP and convnet at
//! 1, 2 and 4 towers, variables on the CPU and on GPU 0: the plan's text
//! form, the placement report and the dot of the placed graph. A snapshot of
//! a plan is a snapshot of what will run. Compilation is deterministic, so
//! these are stable byte for byte (checked by compiling twice).

use towers::compiler::{compile_train, CompileOptions};
use towers::models::{build, ModelKind, ModelSpec};
use towers::report::placement_report;
use towers_graph::{dot::to_dot, Device, Optimizer, F32};
use towers_passes::VarPlacement;

fn compile(kind: ModelKind, towers: u32, vars: VarPlacement) -> (String, String, String) {
    let model = build(&ModelSpec::new(kind, [8, 8, 1], 10)).expect("model");
    let mut o = CompileOptions::new(Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false }, 32);
    o.towers = (0..towers).map(Device::gpu).collect();
    o.variables = vars;
    let c = compile_train(&model.graph, &model.loss, &o).expect("compiles");
    (c.plan.to_text(), placement_report(&c.graph, &c.plan), to_dot(&c.graph).expect("dot"))
}

#[test]
fn plans_placements_and_dots_of_the_seed_models() {
    for (kind, kname) in [(ModelKind::Mlp, "mlp"), (ModelKind::Convnet, "convnet")] {
        for towers in [1u32, 2, 4] {
            for (vars, vname) in [(VarPlacement::Cpu, "cpu"), (VarPlacement::Gpu0, "gpu0")] {
                let (plan, placement, dot) = compile(kind, towers, vars);
                let again = compile(kind, towers, vars);
                assert_eq!((&plan, &placement, &dot), (&again.0, &again.1, &again.2), "compilation is deterministic");
                let id = format!("{kname}_{towers}towers_{vname}");
                insta::assert_snapshot!(format!("plan_{id}"), plan);
                insta::assert_snapshot!(format!("placement_{id}"), placement);
                insta::assert_snapshot!(format!("dot_{id}"), dot);
            }
        }
    }
}

#[test]
fn single_device_plans_of_the_seed_models() {
    for (kind, kname) in [(ModelKind::Mlp, "mlp"), (ModelKind::Convnet, "convnet")] {
        let model = build(&ModelSpec::new(kind, [8, 8, 1], 10)).expect("model");
        let o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 32);
        let c = compile_train(&model.graph, &model.loss, &o).expect("compiles");
        insta::assert_snapshot!(format!("plan_{kname}_single_device"), c.plan.to_text());
        let text = towers_graph::text::to_text(&c.graph).expect("text");
        insta::assert_snapshot!(format!("graph_{kname}_single_device"), text);
    }
}

#[test]
fn each_gradient_reduction_fuses_into_its_update_and_the_loss_mean_does_not() {
    // One n-ary TowerMean per variable in the graph; codegen fuses each into
    // the apply that is its only consumer (one pass over memory), while the
    // fetched loss mean stays a plain weighted_sum launch.
    let model = build(&ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10)).expect("model");
    let mut o = CompileOptions::new(
        Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) },
        33,
    );
    o.towers = vec![Device::gpu(0), Device::gpu(1), Device::gpu(2)];
    // The weights' means as means (not folded into products over the batch).
    o.fold_tower_matmuls = false;
    let c = compile_train(&model.graph, &model.loss, &o).expect("compiles");
    let means = c
        .graph
        .node_ids()
        .iter()
        .filter(|&&i| matches!(c.graph.node(i).op, towers_graph::Op::TowerMean { .. }))
        .count();
    let vars = c.graph.collection(towers_graph::keys::TRAINABLE_VARIABLES).len();
    assert_eq!(means, vars + 1, "one reduction per variable plus the loss");
    let text = c.plan.to_text();
    assert_eq!(text.matches("mean_apply ").count(), vars, "{text}");
    assert_eq!(text.matches("weighted_sum ").count(), 1, "{text}");
}

/// Rank 1 of 2 processes with 2 towers each, buckets of 64 KiB: the plan
/// names its devices `/job:worker/task:1/...`, feeds its 128 rows of the
/// global batch of 256, and all-reduces the buckets on the collective stream
/// in backward order (the logits layer's first), each right after its last
/// gradient; the placement report and dot name the devices alike.
#[test]
fn a_multi_process_plan() {
    let m = build(&ModelSpec::new(ModelKind::Mlp, [28, 28, 1], 10)).expect("model");
    let mut o = CompileOptions::new(Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false }, 256);
    o.towers = vec![Device::gpu(0), Device::gpu(1)];
    o.process = towers_passes::ProcessGroup::new(1, 2).unwrap();
    o.bucket_bytes = 64 * 1024;
    let c = compile_train(&m.graph, &m.loss, &o).unwrap();
    insta::assert_snapshot!("plan_mlp_rank1_of_2_x2_towers", c.plan.to_text());
    insta::assert_snapshot!("placement_mlp_rank1_of_2_x2_towers", placement_report(&c.graph, &c.plan));
    let dot = to_dot(&c.graph).unwrap();
    assert!(dot.contains("@/job:worker/task:1/device:GPU:1"), "the dot names rank 1's devices");
    let text = towers_graph::text::to_text(&c.graph).unwrap();
    assert!(text.contains("@/job:worker/task:1/device:CPU:0") && text.contains("task = /job:worker/task:1"), "{text}");
}
