//! `--variables ps`: variables sharded over parameter-server tasks, on a fake
//! device set (two or three `/gpu:i` towers, no device needed): owners by
//! strategy, slots with their primary, explicit `/job:ps/task:k` requests,
//! the owners in the program record, the text form and both dot views, and
//! the user errors.

mod towers_util;

use towers_graph::{verify::verify, Device, DeviceSpec, Graph, Op, F32};
use towers_passes::*;
use towers_util::*;

fn adam() -> towers_graph::Optimizer {
    towers_graph::Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) }
}

fn ps(tasks: u32, strategy: PsStrategy) -> VarPlacement {
    VarPlacement::Ps { tasks, strategy }
}

/// The MLP of `towers_util` (fc1 8x16, fc2 16x4) over `n` fake GPU towers
/// with Adam, after `requests` (variable name, device string) are set.
fn compile_ps(n: u32, vars: VarPlacement, requests: &[(&str, &str)]) -> Result<Graph, PassError> {
    let (mut g, mut st) = mlp(false, false);
    for (name, spec) in requests {
        let id = g.get(name).unwrap_or_else(|| panic!("no node {name}"));
        g.node_mut(id).requested_device = DeviceSpec::parse(spec).unwrap();
    }
    let towers = gpus(n);
    PassManager::new()
        .verify(true)
        .add(BindBatch::new(24))
        .add(Replicate { towers: towers.clone(), accumulate: 1, bn_updates: BnUpdates::Mean })
        .add(SplitBatch::new(SplitPolicy::Even))
        .add(GradMean)
        .add(ApplyOptimizer { optimizer: adam(), clip_global_norm: None, name: None })
        .add(Place { strategy: vars, devices: towers })
        .add(ScheduleStreams)
        .run(&mut g, &mut st)?;
    verify(&g, "place", true).unwrap();
    Ok(g)
}

fn owners(g: &Graph) -> Vec<(String, u32)> {
    g.program().ps.as_ref().unwrap().owners.iter().map(|(k, v)| (k.clone(), *v)).collect()
}

const PRIMARIES: [&str; 4] = ["fc1/weights", "fc1/biases", "fc2/weights", "fc2/biases"];

#[test]
fn round_robin_deals_variables_to_tasks_and_slots_follow() {
    for towers in [1, 2, 3] {
        let g = compile_ps(towers, ps(2, PsStrategy::RoundRobin), &[]).unwrap();
        let sharding = g.program().ps.clone().unwrap();
        assert_eq!(sharding.tasks, 2);
        for (i, name) in PRIMARIES.iter().enumerate() {
            let k = (i % 2) as u32;
            assert_eq!(sharding.owner(name), Some(k), "{towers} towers: {name}");
            let n = g.node(g.get(name).unwrap());
            // The value lives on this process's host; the owner holds the master copy.
            assert_eq!(n.device, Some(Device::CPU0), "{name}");
            assert_eq!(
                n.placement_reason.as_deref(),
                Some(format!("variables=ps round_robin: /job:ps/task:{k}").as_str())
            );
            for slot in ["Adam", "Adam_1"] {
                assert_eq!(sharding.owner(&format!("{name}/{slot}")), Some(k), "{name}/{slot}");
            }
        }
        // global_step and the learning rate stay on every worker's host, unowned.
        assert_eq!(sharding.owner("global_step"), None);
        assert_eq!(sharding.owner("learning_rate"), None);
        assert_eq!(sharding.owners.len(), 12, "4 variables and 8 Adam slots");
        // Every apply is colocated with its variable.
        for id in ids_of(&g, |op| matches!(op, Op::ApplyGradient { .. })) {
            assert_eq!(g.node(id).device, Some(Device::CPU0));
        }
    }
}

#[test]
fn greedy_balances_bytes_in_creation_order() {
    // Bytes: fc1/weights 512, fc1/biases 64, fc2/weights 256, fc2/biases 16.
    // fc1/w -> t0 [512, 0]; fc1/b -> t1 [512, 64]; fc2/w -> t1 [512, 320]; fc2/b -> t1.
    let g = compile_ps(2, ps(2, PsStrategy::Greedy), &[]).unwrap();
    let got: Vec<u32> = PRIMARIES.iter().map(|v| g.program().ps.as_ref().unwrap().owner(v).unwrap()).collect();
    assert_eq!(got, [0, 1, 1, 1]);
    let r = g.node(g.get("fc2/weights").unwrap()).placement_reason.clone().unwrap();
    assert_eq!(r, "variables=ps greedy: /job:ps/task:1");
    // Three tasks: fc1/w t0, fc1/b t1, fc2/w t2, fc2/b t1 (64 < 256).
    let g = compile_ps(2, ps(3, PsStrategy::Greedy), &[]).unwrap();
    let got: Vec<u32> = PRIMARIES.iter().map(|v| g.program().ps.as_ref().unwrap().owner(v).unwrap()).collect();
    assert_eq!(got, [0, 1, 2, 1]);
}

#[test]
fn an_explicit_ps_task_names_the_owner() {
    let g = compile_ps(
        2,
        ps(3, PsStrategy::RoundRobin),
        &[("fc1/weights", "/job:ps/task:2"), ("fc2/biases", "/job:ps/task:0/cpu:0")],
    )
    .unwrap();
    let o = g.program().ps.clone().unwrap();
    // The round-robin counter still advances for a requested variable (TF's replica_device_setter).
    assert_eq!(PRIMARIES.map(|v| o.owner(v).unwrap()), [2, 1, 2, 0]);
    assert_eq!(o.owner("fc1/weights/Adam_1"), Some(2));
    let n = g.node(g.get("fc1/weights").unwrap());
    assert_eq!(
        (n.device, n.placement_reason.as_deref()),
        (Some(Device::CPU0), Some("variables=ps requested: /job:ps/task:2"))
    );
}

#[test]
fn owners_show_in_the_text_and_both_dot_views() {
    let g = compile_ps(2, ps(2, PsStrategy::RoundRobin), &[]).unwrap();
    let text = towers_graph::text::to_text(&g).unwrap();
    assert!(text.contains("ps tasks = 2\n"), "{text}");
    assert!(text.contains("owner fc1/biases = /job:ps/task:1\n"), "{text}");
    assert!(text.contains("owner fc2/weights/Adam = /job:ps/task:0\n"), "{text}");
    let dot = towers_graph::dot::to_dot(&g).unwrap();
    assert!(dot.contains("owner /job:ps/task:1"), "{dot}");
    let collapsed = towers_graph::dot_collapsed::to_dot_collapsed(&g).unwrap();
    assert!(collapsed.contains("variables of /job:ps/task:0\\n6 on cpu:0"), "{collapsed}");
    assert!(collapsed.contains("variables of /job:ps/task:1\\n6 on cpu:0"), "{collapsed}");
    // Deterministic: the same options give the same text, byte for byte.
    let again = compile_ps(2, ps(2, PsStrategy::RoundRobin), &[]).unwrap();
    assert_eq!(text, towers_graph::text::to_text(&again).unwrap());
    assert_eq!(owners(&g), owners(&again));
    // The owners round-trip through the graph's serial form.
    let back = Graph::from_serial(&g.to_serial().unwrap()).unwrap();
    assert_eq!(back.program().ps, g.program().ps);
}

#[test]
fn ps_requests_are_checked_with_tf_words() {
    // A task that does not exist.
    let e = compile_ps(2, ps(2, PsStrategy::RoundRobin), &[("fc2/weights", "/job:ps/task:5")]).unwrap_err().to_string();
    assert!(
        e.contains("'fc2/weights' was explicitly assigned to /job:ps/task:5 but available devices are [ /job:ps/task:0, /job:ps/task:1 ]. Make sure the device specification refers to a valid device"),
        "{e}"
    );
    // A ps device without --variables ps.
    let e = compile_ps(2, VarPlacement::Cpu, &[("fc1/weights", "/job:ps/task:0")]).unwrap_err().to_string();
    assert!(e.contains("'fc1/weights' was explicitly assigned to /job:ps/task:0 but available devices are"), "{e}");
    assert!(e.contains("--variables ps --ps-tasks K"), "{e}");
    // An op on a ps task (one device, no towers: the op keeps its name).
    let (mut g, mut st) = mlp(false, false);
    let id = g.get("loss").unwrap_or_else(|| g.get(&st.loss.clone().unwrap().node).unwrap());
    let name = g.node(id).name.clone();
    g.node_mut(id).requested_device = DeviceSpec::parse("/job:ps/task:0").unwrap();
    let e = PassManager::new()
        .add(BindBatch::new(8))
        .add(ApplyOptimizer { optimizer: sgd(), clip_global_norm: None, name: None })
        .add(Place { strategy: ps(2, PsStrategy::RoundRobin), devices: vec![] })
        .run(&mut g, &mut st)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("'{name}' (")), "{e}");
    assert!(
        e.contains("was explicitly assigned to /job:ps/task:0, but a parameter-server task holds only variables"),
        "{e}"
    );
    // A ps variable on a GPU.
    let e = compile_ps(2, ps(2, PsStrategy::RoundRobin), &[("fc1/biases", "/job:ps/task:1/gpu:0")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("keeps its variables in host memory; use /job:ps/task:1"), "{e}");
    // No task at all.
    let e = compile_ps(2, ps(0, PsStrategy::Greedy), &[]).unwrap_err().to_string();
    assert!(e.contains("VarPlacement::Ps { tasks: 0, .. }") && e.contains("CLI: --ps-tasks"), "{e}");
}

/// cifar10's `_variable_on_cpu` pins every variable to `/cpu:0`; TF1's
/// replica_device_setter merges `/job:ps/task:k` under such a job-less spec,
/// so the variables are sharded all the same (before, they kept cpu:0 with
/// no owner, unsharded, with no word said). A task the user names still wins.
#[test]
fn variables_pinned_to_the_host_are_sharded_as_replica_device_setter_does() {
    let pinned: Vec<(&str, &str)> = PRIMARIES.iter().map(|n| (*n, "/cpu:0")).collect();
    let plain = compile_ps(2, ps(2, PsStrategy::RoundRobin), &[]).unwrap();
    let g = compile_ps(2, ps(2, PsStrategy::RoundRobin), &pinned).unwrap();
    assert_eq!(owners(&g), owners(&plain), "the same owners as unpinned variables");
    for (i, name) in PRIMARIES.iter().enumerate() {
        let n = g.node(g.get(name).unwrap());
        assert_eq!(n.device, Some(Device::CPU0), "{name}");
        let want = format!("variables=ps round_robin: /job:ps/task:{}", i % 2);
        assert_eq!(n.placement_reason.as_deref(), Some(want.as_str()), "{name}");
    }
    let mut with_task = pinned.clone();
    with_task[0] = ("fc1/weights", "/job:ps/task:1");
    let g = compile_ps(2, ps(2, PsStrategy::RoundRobin), &with_task).unwrap();
    assert_eq!(g.program().ps.as_ref().unwrap().owner("fc1/weights"), Some(1));
}

#[test]
fn one_device_without_towers_still_records_the_owners() {
    let (mut g, mut st) = mlp(false, false);
    PassManager::new()
        .verify(true)
        .add(BindBatch::new(8))
        .add(ApplyOptimizer { optimizer: sgd(), clip_global_norm: None, name: None })
        .add(Place { strategy: ps(2, PsStrategy::RoundRobin), devices: vec![] })
        .run(&mut g, &mut st)
        .unwrap();
    let n = g.node(g.get("fc2/weights").unwrap());
    assert_eq!(n.device, Some(Device::CPU0));
    assert_eq!(n.placement_reason.as_deref(), Some("variables=ps round_robin: /job:ps/task:0"));
    assert_eq!(g.program().ps.as_ref().unwrap().owner("fc2/biases"), Some(1));
}
