//! Folded tower products end to end: the towers' weight gradients and their
//! mean as one product over the whole batch (`tower_matmul` pass,
//! `gemm_tower_mean` kernel, split between the towers' threads by the CPU
//! backend) train to the numbers of the per-tower products and their mean,
//! up to float reassociation, for every optimizer and placement, and
//! repeat bit for bit (the split never changes the bits). With plain SGD and
//! non-Nesterov momentum the product goes straight into the update
//! (`gemm_tower_apply`): the weight gradient is never stored.

use towers::compiler::{compile_train, CompileOptions};
use towers::models::{build, Model, ModelKind, ModelSpec};
use towers_graph::{Device, Optimizer, F32};
use towers_passes::VarPlacement;
use towers_tests::{batches, max_rel_diff, optimizers, run};

/// An MLP on 8x8 inputs with a 64x256 first layer: at 32 rows a tower its
/// operands (32x64 + 32x256) are fewer than its gradient (64x256), so it
/// folds, and its product (2 MFLOP) is large enough to be split.
fn model() -> Model {
    let mut s = ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10);
    s.hidden = vec![256];
    s.seed = 5;
    build(&s).expect("the mlp builds")
}

fn opts(optimizer: &Optimizer, vars: VarPlacement, fold: bool) -> CompileOptions {
    let mut o = CompileOptions::new(optimizer.clone(), 64);
    o.towers = vec![Device::gpu(0), Device::gpu(1)];
    o.variables = vars;
    o.fold_tower_matmuls = fold;
    o
}

#[test]
fn folded_products_train_like_the_tower_means() {
    let m = model();
    let data = batches(64, 4, 3);
    for opt in optimizers() {
        for vars in [VarPlacement::Cpu, VarPlacement::Gpu0, VarPlacement::Greedy] {
            let (on, off) = (opts(&opt, vars, true), opts(&opt, vars, false));
            let plan = |o: &CompileOptions| compile_train(&m.graph, &m.loss, o).expect("compiles").plan.to_text();
            // Plain SGD and non-Nesterov momentum take the product into the
            // update itself (`gemm_tower_apply`); the others keep it apart.
            let into_update = matches!(opt, Optimizer::Sgd { .. } | Optimizer::Momentum { nesterov: false, .. });
            let (text_on, text_off) = (plan(&on), plan(&off));
            let (mean, apply) =
                (text_on.matches("gemm_tower_mean ").count(), text_on.matches("gemm_tower_apply ").count());
            assert_eq!((mean, apply), if into_update { (0, 1) } else { (1, 0) }, "{opt:?} {vars:?}: fc1 folds");
            assert_eq!(text_off.matches("gemm_tower_").count(), 0);
            let (a, b) = (run(&m, &on, &data), run(&m, &off, &data));
            for (x, y) in a.losses.iter().zip(&b.losses) {
                assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "{opt:?} {vars:?}: loss {x} against {y}");
            }
            let (d, at) = max_rel_diff(&a, &b);
            assert!(d <= 1e-5, "{opt:?} {vars:?}: {at} differs by {d}");
        }
    }
}

#[test]
fn folded_runs_repeat_bit_for_bit() {
    let m = model();
    let data = batches(64, 4, 9);
    let adam = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    let momentum = Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false };
    for (opt, vars) in [(&adam, VarPlacement::Cpu), (&adam, VarPlacement::Greedy), (&momentum, VarPlacement::Cpu)] {
        let o = opts(opt, vars, true);
        let first = run(&m, &o, &data);
        for _ in 0..3 {
            let again = run(&m, &o, &data);
            assert_eq!(first.losses, again.losses, "{vars:?}");
            assert_eq!(first.variables, again.variables, "{vars:?}");
        }
    }
}
