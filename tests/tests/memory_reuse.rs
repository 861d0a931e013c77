//! Memory planning by liveness, end to end: buffers that share arena bytes
//! change no number (a run with reuse is bit for bit the run without), and
//! the seed models at batch 256 need at most half the bytes of all their
//! buffers on every tower device (the goal).

use towers::compiler::{compile_train, CompileOptions};
use towers::models::{build, ModelKind, ModelSpec};
use towers_graph::{Device, DeviceKind, Optimizer, F32};
use towers_passes::VarPlacement;
use towers_tests::{batches, run, small_model};

/// Reuse on and off train to the same bits: losses and every variable, for
/// both seed models (with batch norm, whose statistics and moving averages
/// add buffers), 1 and 3 towers, variables on the CPU and on GPU 0.
#[test]
fn reusing_memory_changes_no_number() {
    let data = batches(24, 3, 7);
    let adam = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    for (kind, bn) in [(ModelKind::Mlp, false), (ModelKind::Convnet, true)] {
        let model = small_model(kind, bn, 3);
        for towers in [1u32, 3] {
            for vars in [VarPlacement::Cpu, VarPlacement::Gpu0] {
                let mut o = CompileOptions::new(adam.clone(), 24);
                o.towers = (0..towers).map(Device::gpu).collect();
                o.variables = vars;
                let reused = compile_train(&model.graph, &model.loss, &o).expect("compiles").plan;
                let shared = reused.devices.iter().any(|d| d.arena_bytes < d.bytes_without_reuse());
                assert!(shared, "{kind:?} towers={towers}: no buffer shares bytes");
                let with = run(&model, &o, &data);
                o.reuse_memory = false;
                let without = run(&model, &o, &data);
                let what = format!("{kind:?} towers={towers} vars={vars:?}");
                assert_eq!(with.losses, without.losses, "{what}");
                assert_eq!(with.variables, without.variables, "{what}");
            }
        }
    }
}

/// Peak arena per tower device against the sum of all the program's
/// intermediates (every tensor the unfused program computes, each in bytes of
/// its own: the plan with kernel and reduction fusion, folded tower products
/// and memory reuse all off), for the seed models on 28x28 inputs at batch 256 and 1, 2, 4
/// towers: at most 0.5. (Fusion and in-place gradients remove buffers
/// altogether, so the fused plan's own buffers are not the measure.)
#[test]
fn seed_models_at_batch_256_need_at_most_half_their_buffers_per_tower() {
    for kind in [ModelKind::Mlp, ModelKind::Convnet] {
        let model = build(&ModelSpec::new(kind, [28, 28, 1], 10)).expect("model");
        for towers in [1u32, 2, 4] {
            let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 256);
            o.towers = (0..towers).map(Device::gpu).collect();
            let plan = compile_train(&model.graph, &model.loss, &o).expect("compiles").plan;
            let (mut bare, mut fused_only) = (o.clone(), o.clone());
            (bare.fuse_kernels, bare.fuse_reductions, bare.reuse_memory) = (false, false, false);
            bare.fold_tower_matmuls = false;
            fused_only.reuse_memory = false;
            let before = compile_train(&model.graph, &model.loss, &bare).expect("compiles").plan;
            let fused = compile_train(&model.graph, &model.loss, &fused_only).expect("compiles").plan;
            for (d, b) in plan.devices.iter().zip(&before.devices) {
                // Fusion alone never needs more bytes than the bare program.
                let f = fused.devices.iter().find(|f| f.device == d.device).expect("the same devices");
                assert!(f.arena_bytes <= b.arena_bytes, "{kind:?} towers={towers} {}: fusion added bytes", d.device);
            }
            for d in plan.devices.iter().filter(|d| d.device.kind == DeviceKind::Gpu) {
                let b = before.devices.iter().find(|b| b.device == d.device).expect("the same devices");
                let all = b.bytes_without_reuse();
                assert!(
                    2 * d.arena_bytes <= all,
                    "{kind:?} towers={towers} {}: arena {} B of {all} B",
                    d.device,
                    d.arena_bytes
                );
            }
        }
    }
}
