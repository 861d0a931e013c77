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
