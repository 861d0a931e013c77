//! A plan asking for a device the machine cannot serve is refused at load
//! with an error naming the device, what the machine has and how to map it
//! (issue 21, item 7): a host device other than `cpu:0`.

use towers::compiler::{compile_train, CompileOptions};
use towers::models::{build, ModelKind, ModelSpec};
use towers_graph::{Device, DeviceKind, Optimizer, F32};
use towers_runtime::{RuntimeError, Session};

#[test]
fn a_second_host_device_is_refused_at_load_naming_it() {
    let model = build(&ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10)).expect("model");
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
    o.towers = vec![Device::gpu(0)];
    let plan = compile_train(&model.graph, &model.loss, &o).expect("compiles").plan;
    Session::new(0).load("train", plan.clone()).expect("the plan as compiled loads");
    // The same plan with its host device renamed /cpu:1.
    let mut moved = plan;
    let to_cpu1 = |d: &mut Device| {
        if d.kind == DeviceKind::Cpu {
            *d = Device::cpu(1);
        }
    };
    moved.devices.iter_mut().for_each(|d| to_cpu1(&mut d.device));
    moved.streams.iter_mut().for_each(|s| to_cpu1(&mut s.device));
    moved.variables.iter_mut().for_each(|v| to_cpu1(&mut v.device));
    let e = Session::new(0).load("train", moved).expect_err("cpu:1 is refused");
    assert!(matches!(e, RuntimeError::UnservableDevice { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "program 'train' asks for device cpu:1, but a process has one host device, cpu:0: place what is on \
         /cpu:1 on /cpu:0, or on a tower device /gpu:N (the CPU backend runs /gpu:N as CPU devices of their own)"
    );
}

/// Towers on a second host device are refused when compiling, not first
/// by the session that loads the plan.
#[test]
fn towers_on_a_second_host_device_are_refused_at_compile() {
    let model = build(&ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10)).expect("model");
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
    o.towers = vec![Device::cpu(1), Device::cpu(2)];
    let e = compile_train(&model.graph, &model.loss, &o).expect_err("cpu:1 refused").to_string();
    assert!(e.contains("CompileOptions::towers names cpu:1") && e.contains("one host device"), "{e}");
}

/// The device map of compiled plans at 1, 2 and 4 towers on fake machines
/// (no CUDA, 1, 2 and 8 GPUs): a line per plan device, the CPU backend's
/// threads as `thread_plans` deals them, one context per logical GPU on a
/// mixed session (`gpu:i` on GPU `i mod n`).
#[test]
fn compiled_plans_map_each_device_on_fake_machines() {
    use towers_runtime::devices::{plan_map, BackendKind, Cuda, Machine};
    let model = build(&ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10)).expect("model");
    for towers in [1u32, 2, 4] {
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
        o.towers = (0..towers).map(Device::gpu).collect();
        let plan = compile_train(&model.graph, &model.loss, &o).expect("compiles").plan;
        for cores in [2, 8] {
            let m = Machine { cuda: Cuda::Absent("no CUDA driver found".into()), cores };
            let map = plan_map(&plan, BackendKind::Cpu, &m).expect("the CPU backend serves any GPU count");
            assert_eq!(map.lines.len(), towers as usize + 1, "{map}");
            let threads = towers_runtime::cpu::thread_plans(&plan, cores).expect("threads");
            for (i, t) in threads.iter().enumerate() {
                for d in &t.devices {
                    let line = map
                        .to_string()
                        .lines()
                        .find(|l| l.starts_with(&format!("{d} -> ")))
                        .expect("a line")
                        .to_string();
                    assert!(line.contains(&format!("thread {} of {}", i + 1, threads.len())), "{line}");
                }
            }
            let refused = plan_map(&plan, BackendKind::Mixed { pinned: true }, &m).expect_err("no CUDA");
            assert!(refused.to_string().starts_with("device gpu:0 was asked for"), "{refused}");
        }
        for gpus in [1usize, 2, 8] {
            let m = Machine { cuda: Cuda::Gpus(gpus), cores: 2 };
            let text = plan_map(&plan, BackendKind::Mixed { pinned: true }, &m).expect("served").to_string();
            assert!(text.starts_with("cpu:0 -> host (pinned arena "), "{text}");
            for i in 0..towers as usize {
                let of = (0..towers as usize).filter(|j| j % gpus == i % gpus).count();
                let ctx = (0..i).filter(|j| j % gpus == i % gpus).count() + 1;
                let want = format!("gpu:{i} -> GPU {} context {ctx} of {of} (arena ", i % gpus);
                assert!(text.contains(&want), "{want}: {text}");
                assert_eq!(text.contains("logical GPUs)"), towers as usize > gpus, "{text}");
            }
        }
    }
}
