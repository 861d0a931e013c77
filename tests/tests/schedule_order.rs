//! With towers, each variable's reduction and update runs as soon as its
//! last gradient is written: the host's updates come in the order the
//! backward pass writes the gradients (logits first, the first layer last),
//! not in variable order, for every placement; one device keeps its order.

use towers::compiler::{compile_train, CompileOptions};
use towers::models::ModelKind;
use towers_codegen::Step;
use towers_graph::{Device, Optimizer, F32};
use towers_passes::VarPlacement;
use towers_tests::small_model;

/// The variables updated on `device`'s compute stream, in stream order.
fn updates(plan: &towers_codegen::Plan) -> Vec<String> {
    let mut out = Vec::new();
    for s in &plan.streams {
        for step in &s.steps {
            if let Step::Launch { kernel, node, .. } = step {
                if matches!(kernel.name(), "mean_apply" | "apply_momentum" | "multi_apply" | "gemm_tower_apply") {
                    out.push(node.split("update_").nth(1).unwrap_or(node).to_string());
                }
            }
        }
    }
    out
}

#[test]
fn updates_follow_the_backward_pass() {
    let model = small_model(ModelKind::Mlp, false, 1);
    let sgd = Optimizer::Momentum { lr: F32(0.1), momentum: F32(0.9), nesterov: false };
    for vars in [VarPlacement::Cpu, VarPlacement::Gpu0] {
        let mut o = CompileOptions::new(sgd.clone(), 8);
        o.towers = vec![Device::gpu(0), Device::gpu(1)];
        o.variables = vars;
        let order = updates(&compile_train(&model.graph, &model.loss, &o).expect("compiles").plan);
        let at = |v: &str| order.iter().position(|u| u.starts_with(v)).unwrap_or_else(|| panic!("{v} in {order:?}"));
        assert!(at("MLP/logits/biases") < at("MLP/fc1/biases"), "{vars:?}: {order:?}");
        assert!(at("MLP/logits/weights") < at("MLP/fc1/weights"), "{vars:?}: {order:?}");
        assert_eq!(order.last().map(|s| s.starts_with("MLP/fc1/weights")), Some(true), "{vars:?}: {order:?}");
    }
}
