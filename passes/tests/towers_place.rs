//! Placement invariants of the tower pipeline over 1..4 towers and every
//! variable strategy, uneven splits, and the user errors.

mod towers_util;

use std::collections::BTreeSet;

use towers_graph::{verify::verify, Device, Op};
use towers_passes::*;
use towers_util::*;

const STRATEGIES: [VarPlacement; 4] =
    [VarPlacement::Cpu, VarPlacement::Gpu0, VarPlacement::RoundRobin, VarPlacement::Greedy];

#[test]
fn placement_invariants_for_1_to_4_towers_and_every_strategy() {
    for n in 1..=4u32 {
        for strategy in STRATEGIES {
            let ctx = format!("{n} towers, {strategy:?}");
            let (g, st) = compile(n, 24, strategy).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            verify(&g, "place", true).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let devs = gpus(n);
            // One node per variable, never a copy per tower.
            let vars = ids_of(&g, |op| matches!(op, Op::Variable { .. }));
            let names: Vec<String> = vars.iter().map(|&v| g.node(v).name.clone()).collect();
            assert_eq!(
                names,
                ["fc1/weights", "fc1/biases", "fc2/weights", "fc2/biases", "global_step", "learning_rate"],
                "{ctx}"
            );
            // Trainable variables on the chosen devices.
            for (i, name) in names.iter().take(4).enumerate() {
                let n = g.node(g.get(name).unwrap());
                let d = n.device.unwrap();
                match strategy {
                    VarPlacement::Cpu => assert_eq!(d, Device::CPU0, "{ctx} {name}"),
                    VarPlacement::Gpu0 => assert_eq!(d, Device::gpu(0), "{ctx} {name}"),
                    VarPlacement::RoundRobin => assert_eq!(d, devs[i % devs.len()], "{ctx} {name}"),
                    VarPlacement::Greedy => assert!(devs.contains(&d), "{ctx} {name}"),
                    // Sharded over ps tasks (tests/towers_ps.rs): the values stay on the host.
                    VarPlacement::Ps { .. } => assert_eq!(d, Device::CPU0, "{ctx} {name}"),
                }
                assert_eq!(n.placement_reason.as_deref(), Some(format!("variables={}", strategy.name()).as_str()));
            }
            let step = g.node(g.get("global_step").unwrap());
            assert_eq!(step.device, Some(Device::CPU0), "{ctx}");
            assert_eq!(step.placement_reason.as_deref(), Some("host: global step"), "{ctx}");
            let lr = g.node(g.get("learning_rate").unwrap());
            assert_eq!(lr.device, Some(Device::CPU0), "{ctx}");
            assert_eq!(lr.placement_reason.as_deref(), Some("host: learning rate, set between steps"), "{ctx}");
            // Every tower node on its tower's device.
            for id in g.node_ids() {
                let node = g.node(id);
                if let Some(t) = node.tower {
                    assert_eq!(node.device, Some(devs[t]), "{ctx}: {}", node.name);
                    assert!(node.name.starts_with(&format!("tower_{t}/")), "{ctx}: {}", node.name);
                }
                // Writers and gradient means colocated with their variable.
                if matches!(node.op, Op::ApplyGradient { .. }) {
                    let var = g.inputs(id)[0].node;
                    assert_eq!(node.device, g.node(var).device, "{ctx}: {}", node.name);
                }
            }
            // A Copy exactly on crossing edges, one per (tensor, device).
            let mut seen = BTreeSet::new();
            for c in ids_of(&g, |op| matches!(op, Op::Copy)) {
                let src = g.inputs(c)[0];
                assert_ne!(g.node(src.node).device, g.node(c).device);
                assert!(seen.insert((src, g.node(c).device)), "{ctx}: duplicate copy {}", g.node(c).name);
                assert!(!g.consumers(c).is_empty(), "{ctx}: unused copy");
            }
            for id in g.node_ids() {
                for t in g.inputs(id) {
                    let crosses = g.node(t.node).device != g.node(id).device;
                    assert_eq!(
                        crosses,
                        matches!(g.node(id).op, Op::Copy),
                        "{ctx}: {} -> {}",
                        g.node(t.node).name,
                        g.node(id).name
                    );
                }
            }
            // Gradient means: one per variable, weights sum to 1 and match the split.
            for v in &names[..4] {
                let m = g.get(&format!("{v}/grad_mean")).unwrap_or_else(|| panic!("{ctx}: no mean for {v}"));
                let Op::TowerMean { weights } = &g.node(m).op else { panic!("not a TowerMean") };
                assert_eq!(weights.len(), n as usize);
                let sum: f32 = weights.iter().map(|w| w.0).sum();
                assert!((sum - 1.0).abs() < 1e-6, "{ctx}: {sum}");
                assert_eq!(
                    weights.iter().map(|w| w.0).collect::<Vec<_>>(),
                    st.tower_weights.iter().map(|&w| w as f32).collect::<Vec<_>>()
                );
                assert_eq!(g.node(m).device, g.node(g.get(v).unwrap()).device, "{ctx}");
            }
            assert_eq!(st.tower_batches, vec![24 / n as usize; n as usize]);
            assert_eq!(g.node(g.get("split/x").unwrap()).device, Some(Device::CPU0));
            assert_eq!(g.node(g.get("loss/tower_mean").unwrap()).device, Some(Device::CPU0));
        }
    }
}

#[test]
fn greedy_balances_by_bytes_largest_first() {
    let (g, _) = compile(2, 24, VarPlacement::Greedy).unwrap();
    let dev = |n: &str| g.node(g.get(n).unwrap()).device.unwrap();
    // fc1/weights (8x16) is the largest: gpu:0; then fc2/weights (16x4) onto the lighter gpu:1,
    // fc1/biases (16) onto gpu:1 (64+16 < 128), fc2/biases (4) onto gpu:1 (80+4 < 128).
    assert_eq!(dev("fc1/weights"), Device::gpu(0));
    assert_eq!(dev("fc2/weights"), Device::gpu(1));
    assert_eq!(dev("fc1/biases"), Device::gpu(1));
    assert_eq!(dev("fc2/biases"), Device::gpu(1));
}

#[test]
fn uneven_split_3_to_1_weights_the_towers_by_examples() {
    let (mut g, mut st) = mlp(false, false);
    towers_pm(gpus(2), 1, 256, SplitPolicy::Weighted(vec![3, 1]), VarPlacement::Cpu, BnUpdates::Mean)
        .run(&mut g, &mut st)
        .unwrap();
    assert_eq!(st.tower_batches, vec![192, 64]);
    assert_eq!(st.tower_weights, vec![0.75, 0.25]);
    let m = g.get("fc1/weights/grad_mean").unwrap();
    assert_eq!(g.node(m).op, Op::TowerMean { weights: vec![towers_graph::F32(0.75), towers_graph::F32(0.25)] });
    let split = g.get("split/x").unwrap();
    assert_eq!(g.node(split).op, Op::Split { axis: 0, sizes: vec![192, 64] });
    let x1 = g.get("tower_1/fc1/MatMul").unwrap();
    assert_eq!(g.tensor_type(g.inputs(x1)[0]).unwrap().shape.dim(0), Some(64));
}

#[test]
fn errors_name_the_problem() {
    let run = |towers: Vec<Device>, batch: usize, split: SplitPolicy| {
        let (mut g, mut st) = mlp(false, false);
        towers_pm(towers, 1, batch, split, VarPlacement::Cpu, BnUpdates::Mean)
            .run(&mut g, &mut st)
            .unwrap_err()
            .to_string()
    };
    let e = run(vec![], 24, SplitPolicy::Even);
    assert!(e.contains("at least one tower"), "{e}");
    let e = run(vec![Device::gpu(0), Device::gpu(1), Device::gpu(0)], 24, SplitPolicy::Even);
    assert!(e.contains("duplicate tower devices [gpu:0]") && e.contains("gpu:0, gpu:1, gpu:0"), "{e}");
    let e = run(gpus(4), 250, SplitPolicy::Even);
    assert!(e.contains("global batch of 250 examples across 4 towers") && e.contains("248 or 252"), "{e}");
    let e = run(gpus(2), 250, SplitPolicy::Weighted(vec![3, 1]));
    assert!(e.contains("250") && e.contains("[3, 1]") && e.contains("multiple of 4"), "{e}");
    let e = run(gpus(2), 256, SplitPolicy::Weighted(vec![3]));
    assert!(e.contains("one weight per tower"), "{e}");
    // Fewer examples than towers: no weights can help; the way out is a
    // program with fewer towers for that batch, in the same session.
    let e = run(gpus(4), 3, SplitPolicy::Even);
    assert!(e.contains("3 < 4") && e.contains("3 tower(s)") && e.contains("same Session"), "{e}");
    assert!(!e.contains("Weighted"), "{e}");
}

#[test]
fn unknown_device_is_reported_in_tf_words() {
    let mut b = towers_graph::GraphBuilder::new();
    let x = b.placeholder("x", towers_graph::DType::F32, [None, Some(4)]).unwrap();
    b.device("/gpu:5", |b| b.relu(x)).unwrap();
    let mut g = b.finish();
    let mut st = CompileState::default();
    let mut pm = PassManager::new().add(BindBatch::new(8)).add(Place { strategy: VarPlacement::Cpu, devices: gpus(2) });
    let e = pm.run(&mut g, &mut st).unwrap_err().to_string();
    assert!(
        e.contains("'Relu' was explicitly assigned to /device:GPU:5 but available devices are [ /device:CPU:0, /device:GPU:0, /device:GPU:1 ]. Make sure the device specification refers to a valid device."),
        "{e}"
    );
}

/// Two devices asked for in a program of one device: the advice names the
/// towers to set, and the CLI's `--towers N` only where it means the same
/// devices (it runs /gpu:0 to /gpu:N-1).
#[test]
fn the_one_device_advice_gives_the_cli_flag_only_where_it_fits() {
    let advice = |gpu: &str| {
        let mut b = towers_graph::GraphBuilder::new();
        let x = b.placeholder("x", towers_graph::DType::F32, [None, Some(4)]).unwrap();
        let y = b.device("/cpu:0", |b| b.relu(x)).unwrap();
        b.device(gpu, |b| b.sigmoid(y)).unwrap();
        let mut g = b.finish();
        let mut st = CompileState::default();
        let mut pm =
            PassManager::new().add(BindBatch::new(8)).add(Place { strategy: VarPlacement::Cpu, devices: vec![] });
        pm.run(&mut g, &mut st).unwrap_err().to_string()
    };
    let e = advice("/gpu:0");
    assert!(e.contains("CompileOptions::towers = vec![Device::gpu(0)] (CLI: --towers 1)"), "{e}");
    let e = advice("/gpu:1");
    assert!(
        e.contains("vec![Device::gpu(1)]") && !e.contains("CLI: --towers") && e.contains("/gpu:0 to /gpu:N-1"),
        "{e}"
    );
}

#[test]
fn single_device_mode_puts_everything_on_one_device_without_copies() {
    let (mut g, mut st) = mlp(false, false);
    PassManager::new()
        .verify(true)
        .add(BindBatch::new(8))
        .add(ApplyOptimizer { optimizer: sgd(), clip_global_norm: None, name: None })
        .add(Place { strategy: VarPlacement::Gpu0, devices: vec![] })
        .add(ScheduleStreams)
        .run(&mut g, &mut st)
        .unwrap();
    assert!(ids_of(&g, |op| matches!(op, Op::Copy)).is_empty());
    assert!(g.node_ids().iter().all(|&i| g.node(i).device == Some(Device::CPU0)));
    let s = g.program().schedule.clone().unwrap();
    assert_eq!(s.streams.len(), 1);
    assert_eq!(s.num_events, 0);
}

#[test]
fn explicit_device_on_a_non_tower_node_wins() {
    let mut b = towers_graph::GraphBuilder::new();
    let x = b.placeholder("x", towers_graph::DType::F32, [None, Some(4)]).unwrap();
    b.device("/gpu:1", |b| b.relu(x)).unwrap();
    let mut g = b.finish();
    let mut st = CompileState::default();
    PassManager::new()
        .verify(true)
        .add(BindBatch::new(8))
        .add(Place { strategy: VarPlacement::Cpu, devices: gpus(2) })
        .run(&mut g, &mut st)
        .unwrap();
    let r = g.node(g.get("Relu").unwrap());
    assert_eq!(r.device, Some(Device::gpu(1)));
    assert_eq!(r.placement_reason.as_deref(), Some("requested /device:GPU:1"));
    assert!(g.get("x/read_gpu_1").is_some());
}

/// `/gpu:*` asks for any GPU: the reason says what was asked and where it
/// went, not an index the user never wrote.
#[test]
fn a_request_without_an_index_says_where_it_was_placed() {
    let mut b = towers_graph::GraphBuilder::new();
    let x = b.placeholder("x", towers_graph::DType::F32, [None, Some(4)]).unwrap();
    b.device("/gpu:*", |b| b.relu(x)).unwrap();
    let mut g = b.finish();
    let mut st = CompileState::default();
    PassManager::new()
        .add(BindBatch::new(8))
        .add(Place { strategy: VarPlacement::Cpu, devices: gpus(2) })
        .run(&mut g, &mut st)
        .unwrap();
    let r = g.node(g.get("Relu").unwrap());
    assert_eq!(r.device, Some(Device::gpu(0)));
    let why = r.placement_reason.as_deref().unwrap_or_default();
    assert!(why.starts_with("requested ") && why.contains('*') && why.ends_with("placed on /device:GPU:0"), "{why}");
}

/// A placement asked for where every variable is pinned by its device scope
/// (the porting guide's hand-built tower loop) does nothing, as in TF1
/// (explicit devices win), and a diagnostic says so; with the variables
/// unpinned it places them and says nothing.
#[test]
fn a_placement_that_places_nothing_is_said() {
    let warnings = |pinned: bool| {
        let mut b = towers_graph::GraphBuilder::new();
        let x = b.placeholder("x", towers_graph::DType::F32, [None, Some(4)]).unwrap();
        let make = |b: &mut towers_graph::GraphBuilder| {
            let w = b.get_variable("w", [4, 2], towers_graph::Initializer::GlorotUniform)?;
            b.matmul(x, w)
        };
        if pinned {
            b.device("/gpu:0", make).unwrap();
        } else {
            make(&mut b).unwrap();
        }
        let mut g = b.finish();
        let mut st = CompileState::default();
        PassManager::new()
            .add(BindBatch::new(8))
            .add(Place { strategy: VarPlacement::RoundRobin, devices: gpus(2) })
            .run(&mut g, &mut st)
            .unwrap();
        st.diagnostics.iter().map(|d| d.message.clone()).collect::<Vec<_>>()
    };
    let w = warnings(true);
    assert!(w.iter().any(|m| m.contains("variables=round_robin places no variable") && m.contains("'w'")), "{w:?}");
    assert!(warnings(false).is_empty(), "{:?}", warnings(false));
}
