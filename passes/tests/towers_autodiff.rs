//! The tower pipeline with the real `autodiff` and `apply` passes.

mod towers_util;

use towers_graph::{text::to_text, verify::verify, Device, Op, Optimizer, F32};
use towers_passes::*;
use towers_util::*;

fn real(n: u32, bn: bool, vars: VarPlacement) -> (towers_graph::Graph, CompileState) {
    let (mut g, mut st) = mlp(true, bn);
    // Drop the hand-made gradients: autodiff computes the real ones.
    for v in st.grads.values() {
        let id = g.get(&v.node).unwrap();
        g.remove(id);
    }
    st.grads.clear();
    let opt = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    PassManager::new()
        .verify(true)
        .add(Autodiff)
        .add(BindBatch::new(24))
        .add(Replicate { towers: gpus(n), accumulate: 1, bn_updates: BnUpdates::Mean })
        .add(SplitBatch::new(SplitPolicy::Even))
        .add(GradMean)
        .add(ApplyOptimizer { optimizer: opt, clip_global_norm: None, name: None })
        .add(Place { strategy: vars, devices: gpus(n) })
        .add(ScheduleStreams)
        .run(&mut g, &mut st)
        .unwrap();
    (g, st)
}

#[test]
fn real_gradients_replicate_place_and_schedule() {
    for n in [1, 2, 4] {
        for bn in [false, true] {
            let (g, st) = real(n, bn, VarPlacement::Cpu);
            verify(&g, "schedule", true).unwrap();
            for v in &st.var_list {
                assert_eq!(g.node_ids().iter().filter(|&&i| g.node(i).name == *v).count(), 1);
                let slot = g.get(&format!("{v}/Adam")).unwrap();
                assert_eq!(g.node(slot).device, Some(Device::CPU0));
                assert_eq!(g.node(slot).placement_reason.as_deref(), Some(format!("colocated with {v}").as_str()));
                assert!(g.get(&format!("{v}/grad_mean")).is_some(), "{v}");
            }
            assert!(g.node_ids().iter().any(|&i| g.node(i).name.starts_with("tower_0/gradients/")));
            assert!(!g
                .node_ids()
                .iter()
                .any(|&i| g.node(i).tower.is_none() && g.node(i).name.starts_with("gradients/")));
            let ops = g.node_ids().into_iter().filter(|&i| matches!(g.node(i).op, Op::ApplyGradient { .. })).count();
            assert_eq!(ops, st.var_list.len());
            schedule::check_deadlock_free(g.program().schedule.as_ref().unwrap()).unwrap();
        }
    }
}

#[test]
fn real_pipeline_is_deterministic() {
    let (g1, _) = real(3, true, VarPlacement::Greedy);
    let (g2, _) = real(3, true, VarPlacement::Greedy);
    assert_eq!(to_text(&g1).unwrap(), to_text(&g2).unwrap());
}
