//! A mixed session (issue 21, item 1, the half that runs without a GPU):
//! one plan whose `cpu:*` devices are served by one CPU backend and whose
//! `gpu:*` devices by another (`MixedBackend::cpu_pair`), with real copies
//! between their memories and events crossing them through the bridge —
//! the path a CUDA part takes beside the host part.
//!
//! What holds it:
//! - losses and variables equal one device's on the whole batch within the
//!   equivalence tests' tolerance (`TOL`, 2e-5 relative after 3 steps;
//!   1e-4 for the convnet), for 1, 2 and 4 towers, every variable
//!   placement and several optimizers;
//! - and equal, bit for bit, the same plan on one CPU backend: the parts run
//!   the same kernels on the same values, only in two memories;
//! - the copies are real: a tower's copy of a weight is its own memory,
//!   refreshed by the step and not by a write between steps (on one CPU
//!   backend the copy is elided and would show the write at once);
//! - a plan whose launch names another part's memory is refused at load,
//!   naming the node;
//! - an eval program of one device runs where the training program put
//!   the variables it reads (copying in those of other devices), and
//!   predicts as on one backend;
//! - ranks of a process group, each a mixed session, all-reduce through
//!   the host part and agree bit for bit; a launch failing in one part
//!   ends the step with its error, and the next step runs.

use towers::compiler::{compile_eval, compile_train, CompileOptions};
use towers::models::ModelKind;
use towers_graph::{Optimizer, F32};
use towers_passes::{SplitPolicy, VarPlacement};
use towers_runtime::mixed::MixedBackend;
use towers_runtime::{Backend, Session};
use towers_tests::{batches, max_rel_diff, run, run_on, small_model, towers, TOL};

const BATCH: usize = 24;
const STEPS: usize = 3;

/// The small MLP and its plan: SGD, batch 8, `n` towers, variables on the
/// host, with `tweak` applied to the options first.
fn small_plan(n: u32, tweak: impl FnOnce(&mut CompileOptions)) -> (towers::models::Model, towers_codegen::Plan) {
    let model = small_model(ModelKind::Mlp, false, 2);
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
    o.towers = towers(n);
    o.variables = VarPlacement::Cpu;
    tweak(&mut o);
    let plan = compile_train(&model.graph, &model.loss, &o).expect("compiles").plan;
    (model, plan)
}

/// Batch `BATCH` with `opt`, `n` towers, variables by `vars`.
fn tower_options(opt: &Optimizer, n: u32, vars: VarPlacement) -> CompileOptions {
    let mut o = CompileOptions::new(opt.clone(), BATCH);
    o.towers = towers(n);
    o.variables = vars;
    o
}

fn momentum() -> Optimizer {
    Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false }
}

fn mixed() -> Box<dyn Backend> {
    Box::new(MixedBackend::cpu_pair().expect("two CPU parts start"))
}

#[test]
fn a_mixed_session_matches_one_device_and_one_backend_for_every_placement() {
    let model = small_model(ModelKind::Mlp, false, 11);
    let data = batches(BATCH, STEPS, 5);
    let opts = [
        Optimizer::Sgd { lr: F32(0.1) },
        momentum(),
        Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) },
    ];
    for opt in opts {
        let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
        for n in [1u32, 2, 4] {
            for vars in [VarPlacement::Cpu, VarPlacement::Gpu0, VarPlacement::RoundRobin, VarPlacement::Greedy] {
                let o = tower_options(&opt, n, vars);
                let m = run_on(&model, &o, &data, mixed());
                let (d, var) = max_rel_diff(&m, &single);
                assert!(d <= TOL, "{opt:?} towers={n} {vars:?}: {var} differs from one device by {d}");
                for (a, b) in m.losses.iter().zip(&single.losses) {
                    assert!((a - b).abs() <= TOL * b.abs().max(1.0), "loss {a} vs {b} ({opt:?}, {n} towers, {vars:?})");
                }
                let cpu = run(&model, &o, &data);
                assert_eq!(m.losses, cpu.losses, "{opt:?} towers={n} {vars:?}: losses of the mixed session");
                assert_eq!(m.variables, cpu.variables, "{opt:?} towers={n} {vars:?}: variables of the mixed session");
            }
        }
    }
}

#[test]
fn a_convnet_with_dropout_and_uneven_towers_is_exact_in_a_mixed_session() {
    let model = small_model(ModelKind::Convnet, false, 8);
    let data = batches(BATCH, STEPS, 1);
    let opt = momentum();
    let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
    for vars in [VarPlacement::Cpu, VarPlacement::Gpu0] {
        let mut o = tower_options(&opt, 2, vars);
        o.split = SplitPolicy::Weighted(vec![3, 1]);
        let m = run_on(&model, &o, &data, mixed());
        let (d, var) = max_rel_diff(&m, &single);
        assert!(d <= 1e-4, "convnet {vars:?}: {var} differs by {d}");
        assert_eq!(m.variables, run(&model, &o, &data).variables, "convnet {vars:?}: one CPU backend");
    }
}

/// The tower's copy of a weight lives in the GPU part's memory: written by
/// the step's copy, not by a write of the variable between steps.
#[test]
fn copies_between_parts_are_real_copies() {
    let data = batches(8, 1, 3);
    // Every buffer its own bytes, so the tower's copies can be read after the step.
    let (model, plan) = small_plan(1, |o| o.reuse_memory = false);
    // A weight's copy on the tower that memory planning keeps (fetchable).
    let fetchable = |name: &str| {
        let mut s = Session::new(1);
        s.load("train", plan.clone()).expect("loads");
        s.feed("train", &model.images, &data[0].0).expect("feed");
        s.feed("train", &model.labels, &data[0].1).expect("feed");
        s.run("train").expect("runs");
        s.fetch::<f32>("train", name).is_ok()
    };
    let (var, copy) = plan
        .variables
        .iter()
        .filter(|v| v.trainable)
        .map(|v| (v.name.clone(), format!("{}/read_gpu_0", v.name)))
        .find(|(_, c)| plan.tensors.iter().any(|(n, _)| n == c) && fetchable(c))
        .expect("a weight's tower copy that is not reused");
    let shown = |backend: Box<dyn Backend>| -> (Vec<f32>, Vec<f32>) {
        let mut s = Session::with_backend(1, backend);
        s.load("train", plan.clone()).expect("loads");
        s.feed("train", &model.images, &data[0].0).expect("feed");
        s.feed("train", &model.labels, &data[0].1).expect("feed");
        s.run("train").expect("runs");
        let n = s.variable::<f32>(&var).expect("variable").len();
        s.write_variable(&var, &vec![7.0f32; n]).expect("write");
        (s.fetch::<f32>("train", &copy).expect("the tower's copy"), s.variable::<f32>(&var).expect("variable"))
    };
    let (elided, _) = shown(Box::new(towers_runtime::CpuBackend::new()));
    assert!(elided.iter().all(|&x| x == 7.0), "one CPU backend elides the copy: it reads the variable itself");
    let (copied, now) = shown(mixed());
    assert!(now.iter().all(|&x| x == 7.0));
    assert!(copied.iter().all(|&x| x != 7.0), "the GPU part's copy holds the step's value, not the later write");
}

#[test]
fn a_launch_naming_another_parts_memory_is_refused_at_load() {
    let (_, mut plan) = small_plan(1, |_| ());
    // Make a tower launch read a host variable itself instead of the tower's copy of it.
    let copies: Vec<(towers_codegen::BufRef, String)> = plan
        .variables
        .iter()
        .filter_map(|v| {
            plan.tensors
                .iter()
                .find(|(n, _)| *n == format!("{}/read_gpu_0", v.name))
                .map(|(_, r)| (r.clone(), v.name.clone()))
        })
        .collect();
    let (node, stream, var) = plan
        .streams
        .iter_mut()
        .filter(|s| s.device.kind == towers_graph::DeviceKind::Gpu)
        .find_map(|s| {
            let name = s.name();
            s.steps.iter_mut().find_map(|st| match st {
                towers_codegen::Step::Launch { inputs, node, .. } => inputs.iter_mut().find_map(|i| {
                    let (_, var) = copies.iter().find(|(r, _)| r == i)?;
                    *i = towers_codegen::BufRef::Variable(var.clone());
                    Some((node.clone(), name.clone(), var.clone()))
                }),
                _ => None,
            })
        })
        .expect("a tower launch reading a weight's copy");
    let mut s = Session::with_backend(1, mixed());
    let e = s.load("train", plan).expect_err("refused");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("node '{node}' on stream {stream} names var:{var}"))
            && msg.contains("only copies cross parts"),
        "{msg}"
    );
}

/// An eval program (`compile_eval` puts a model without device scopes on
/// `cpu:0`) loaded after a training program that holds the variables on
/// the GPUs runs where they live: on one CPU backend that is a label, in a
/// mixed session a launch on `cpu:0` could not read the GPU part's memory
/// (the first GPU run refused it at load). Its predictions equal the same
/// programs' on one CPU backend bit for bit, for every placement; an eval
/// whose variables are on its own device stays there.
#[test]
fn an_eval_program_runs_where_the_training_program_put_the_variables() {
    let model = small_model(ModelKind::Mlp, false, 3);
    let data = batches(BATCH, 2, 9);
    for (vars, n, runs_on) in [
        (VarPlacement::Cpu, 2, "cpu:0"),
        (VarPlacement::Gpu0, 1, "gpu:0"),
        (VarPlacement::Gpu0, 2, "gpu:0"),
        (VarPlacement::RoundRobin, 2, "gpu:0"),
    ] {
        let o = tower_options(&momentum(), n, vars);
        let train = compile_train(&model.graph, &model.loss, &o).expect("compiles").plan;
        let eval = compile_eval(&model.graph, &[("predictions", &model.predictions)], BATCH).expect("eval").plan;
        assert_eq!(eval.devices.len(), 1, "a one-device eval program");
        let mut got = Vec::new();
        for backend in [mixed(), Box::new(towers_runtime::CpuBackend::new()) as Box<dyn Backend>] {
            let mut s = Session::with_backend(1, backend);
            s.load("train", train.clone()).expect("train loads");
            s.load("eval", eval.clone()).unwrap_or_else(|e| panic!("{vars:?}, {n} towers: eval loads: {e}"));
            let loaded = s.plan("eval").expect("loaded");
            assert_eq!(loaded.devices[0].device.to_string(), runs_on, "{vars:?}, {n} towers: where the eval runs");
            // Round-robin leaves some variables on gpu:1: they come in by copies.
            let copies = loaded
                .streams
                .iter()
                .flat_map(|st| &st.steps)
                .filter(|st| matches!(st, towers_codegen::Step::Copy { node, .. } if node.ends_with("/colocated")))
                .count();
            assert_eq!(copies > 0, vars == VarPlacement::RoundRobin, "{vars:?}, {n} towers: {copies} copies in");
            for (x, y) in &data {
                s.feed("train", &model.images, x).expect("feed");
                s.feed("train", &model.labels, y).expect("feed");
                s.run("train").expect("train runs");
            }
            s.feed("eval", &model.images, &data[0].0).expect("feed eval");
            s.run("eval").expect("eval runs");
            got.push(s.fetch::<i32>("eval", "predictions").expect("predictions"));
        }
        assert_eq!(got[0], got[1], "{vars:?}, {n} towers: mixed and one CPU backend predict alike");
    }
}

/// Traces, profiles, the step counter and the backend's notes work across parts.
#[test]
fn a_mixed_session_traces_profiles_and_says_how_it_runs() {
    let data = batches(8, 1, 3);
    let (model, plan) = small_plan(2, |_| ());
    let mut s = Session::with_backend(1, mixed());
    s.load("train", plan.clone()).expect("loads");
    s.feed("train", &model.images, &data[0].0).expect("feed");
    s.feed("train", &model.labels, &data[0].1).expect("feed");
    s.set_tracing("train", true).expect("tracing");
    s.set_profiling("train", true).expect("profiling");
    s.run("train").expect("runs");
    let t = s.trace("train").expect("a trace");
    let streams: std::collections::BTreeSet<usize> = t.events.iter().map(|e| e.stream).collect();
    let host = plan.streams.iter().position(|st| st.device.kind == towers_graph::DeviceKind::Cpu).expect("host");
    let tower = plan.streams.iter().position(|st| st.device.kind == towers_graph::DeviceKind::Gpu).expect("tower");
    assert!(streams.contains(&host) && streams.contains(&tower), "both parts' streams are traced: {streams:?}");
    let profile = s.profile("train").expect("profile");
    assert!(
        profile.iter().any(|p| p.stream.starts_with("gpu:1")) && profile.iter().any(|p| p.stream.starts_with("cpu:0"))
    );
    assert_eq!(s.steps_run("train").expect("steps"), 1);
    let note = s.backend_note();
    assert!(note.contains("mixed session") && note.contains("event(s) cross parts"), "{note}");
}

/// How a two-tower plan with host variables divides: every device to the
/// part of its kind, the towers' copies naming the host's variables and
/// buffers (the host part's copies none), events crossing both ways; an
/// event recorded in both parts is refused.
#[test]
fn a_plan_divides_by_device_kind_with_bridged_events_and_foreign_copies() {
    use std::collections::BTreeMap;
    use towers_graph::DeviceKind;
    use towers_runtime::mixed::split::split;
    let (_, mut plan) = small_plan(2, |_| ());
    let vars: BTreeMap<String, usize> = plan.variables.iter().map(|v| (v.name.clone(), 0)).collect();
    let s = split(&plan, &[DeviceKind::Cpu, DeviceKind::Gpu], &vars).expect("divides");
    for (d, p) in plan.devices.iter().zip(&s.device_part) {
        assert_eq!(*p, usize::from(d.device.kind == DeviceKind::Gpu), "{}", d.device);
    }
    assert!(s.foreign[0].is_empty(), "the host part's streams copy nothing: {:?}", s.foreign[0]);
    let trainable = plan.variables.iter().filter(|v| v.trainable).count();
    let named_vars = s.foreign[1].keys().filter(|r| matches!(r, towers_codegen::BufRef::Variable(_))).count();
    assert_eq!(named_vars, trainable, "the towers copy every weight from the host");
    let bridged: Vec<usize> = (0..plan.num_events).filter(|&e| s.bridged[e]).collect();
    assert!(!bridged.is_empty());
    // Recorded on a tower's stream and also on the host's: refused.
    let on_tower = |e: usize| {
        plan.streams
            .iter()
            .any(|st| st.device.kind == DeviceKind::Gpu && st.steps.contains(&towers_codegen::Step::Record(e)))
    };
    let e = *bridged.iter().find(|&&e| on_tower(e)).expect("a tower records an event the host waits for");
    let host = plan.streams.iter().position(|st| st.device.kind == DeviceKind::Cpu).expect("host stream");
    plan.streams[host].steps.push(towers_codegen::Step::Record(e));
    let err = split(&plan, &[DeviceKind::Cpu, DeviceKind::Gpu], &vars).expect_err("refused");
    assert!(err.contains(&format!("event {e} is recorded in two parts")), "{err}");
}

/// Two ranks of one process group (in-process communicator), each a mixed
/// session: the gradient buckets' all-reduce runs in the host part, through
/// the communicator, and both ranks end with one device's variables.
#[test]
fn ranks_of_mixed_sessions_all_reduce_through_the_host_part() {
    use towers_runtime::LocalComm;
    let model = small_model(ModelKind::Mlp, false, 11);
    let data = batches(BATCH, STEPS, 5);
    let opt = momentum();
    let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
    for vars in [VarPlacement::Cpu, VarPlacement::Gpu0] {
        let o = tower_options(&opt, 2, vars);
        let results: Vec<towers_tests::RunResult> = std::thread::scope(|s| {
            let handles: Vec<_> = LocalComm::group(2)
                .into_iter()
                .map(|comm| {
                    let (model, o, data) = (&model, o.clone(), &data);
                    s.spawn(move || towers_tests::run_with(model, &o, data, std::sync::Arc::new(comm), mixed()))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a rank")).collect()
        });
        assert_eq!(results[0].variables, results[1].variables, "{vars:?}: the ranks agree bit for bit");
        let (d, var) = max_rel_diff(&results[0], &single);
        assert!(d <= TOL, "{vars:?}: {var} differs from one device by {d}");
    }
}

/// A launch that fails in one part ends the step with its error in both
/// parts (the failing part still sets its bridged flags, so the other part
/// does not wait for ever), and the next step runs.
#[test]
fn a_failed_launch_in_one_part_ends_the_step_and_the_next_runs() {
    let data = batches(8, 1, 3);
    let (model, plan) = small_plan(2, |_| ());
    let mut s = Session::with_backend(1, mixed());
    s.load("train", plan).expect("loads");
    s.feed("train", &model.images, &data[0].0).expect("feed");
    // A label out of range: the towers' cross-entropy (the GPU part) fails.
    s.feed("train", &model.labels, &[99; 8]).expect("feed");
    let e = s.run("train").expect_err("the step fails").to_string();
    assert!(e.contains("SparseSoftmaxCrossEntropyWithLogits"), "{e}");
    s.feed("train", &model.labels, &data[0].1).expect("feed");
    s.run("train").expect("the next step runs");
    assert!(s.fetch::<f32>("train", "loss").expect("loss")[0].is_finite());
}
