//! A short fuzz run over mutated plan JSON: the plans of the seed MLP (and its
//! swish variant, with generated fused kernels and a multi-tensor update) and
//! convnet at 1 and 2 towers (and the convnet with batch norm), each mutated a few hundred times in
//! deterministic random ways, half of them in kernel parameters (numbers to 0 / huge / ±1, array elements
//! deleted, duplicated or swapped, strings swapped for other strings of the
//! plan). Each mutant is parsed, verified and, when it verifies, loaded in a
//! `Session` and run for one step (feeds zero-filled) under `catch_unwind`,
//! on a helper thread with a deadline. A plan the verifier accepts must never
//! panic (on any thread) nor hang: a panic here is a verifier rule missing.
//!
//! `cargo test -p towers-tests --test plan_fuzz -- --nocapture` prints the counts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use towers::compiler::{compile_train, CompileOptions};
use towers::models::{build, ModelKind, ModelSpec};
use towers_codegen::{verify, Plan};
use towers_graph::{DType, Device, Optimizer, F32};
use towers_passes::VarPlacement;
use towers_runtime::Session;
use towers_tests::Rng;

/// Mutants per seed plan; `TOWERS_FUZZ_MUTANTS` and `TOWERS_FUZZ_SEED` set
/// a longer or different run.
const MUTANTS_PER_PLAN: usize = 600;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Panics seen by the hook, on any thread.
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn plan(kind: ModelKind, towers: u32, optimizer: Optimizer, vars: VarPlacement, batch_norm: bool) -> Plan {
    plan_with(kind, towers, optimizer, vars, batch_norm, towers_graph::layers::Activation::Relu)
}

fn plan_with(
    kind: ModelKind,
    towers: u32,
    optimizer: Optimizer,
    vars: VarPlacement,
    batch_norm: bool,
    activation: towers_graph::layers::Activation,
) -> Plan {
    let mut spec = ModelSpec::new(kind, [8, 8, 1], 10);
    spec.batch_norm = batch_norm;
    spec.activation = activation;
    let model = build(&spec).expect("model");
    let mut o = CompileOptions::new(optimizer, 4);
    o.towers = (0..towers).map(Device::gpu).collect();
    o.variables = vars;
    compile_train(&model.graph, &model.loss, &o).expect("compiles").plan
}

#[derive(Clone)]
enum Seg {
    Key(String),
    Idx(usize),
}

/// Paths of every number, string and array in `v`, and every distinct string.
fn targets(v: &Value, path: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>, strings: &mut Vec<String>) {
    match v {
        Value::Number(_) => out.push(path.clone()),
        Value::String(s) => {
            out.push(path.clone());
            strings.push(s.clone());
        }
        Value::Array(a) => {
            out.push(path.clone());
            for (i, x) in a.iter().enumerate() {
                path.push(Seg::Idx(i));
                targets(x, path, out, strings);
                path.pop();
            }
        }
        Value::Object(m) => {
            for (k, x) in m {
                path.push(Seg::Key(k.clone()));
                targets(x, path, out, strings);
                path.pop();
            }
        }
        _ => {}
    }
}

fn at<'v>(v: &'v mut Value, path: &[Seg]) -> Option<&'v mut Value> {
    path.iter().try_fold(v, |v, s| match s {
        Seg::Key(k) => v.get_mut(k.as_str()),
        Seg::Idx(i) => v.get_mut(*i),
    })
}

fn mutate(v: &mut Value, path: &[Seg], strings: &[String], rng: &mut Rng) {
    let Some(x) = at(v, path) else { return };
    match x {
        Value::Number(n) => {
            *x = if let Some(u) = n.as_u64() {
                let u = match rng.below(5) {
                    0 => 0,
                    1 => u32::MAX as u64,
                    2 => u64::MAX,
                    3 => u.wrapping_add(1),
                    _ => u.saturating_sub(1),
                };
                Value::from(u)
            } else {
                let f = n.as_f64().unwrap_or(0.0);
                Value::from([0.0, 1e30, f + 1.0, -f][rng.below(4)])
            }
        }
        Value::String(_) => *x = Value::String(strings[rng.below(strings.len())].clone()),
        Value::Array(a) if !a.is_empty() => {
            let i = rng.below(a.len());
            match rng.below(3) {
                0 => {
                    a.remove(i);
                }
                1 => {
                    let e = a[i].clone();
                    a.insert(i, e);
                }
                _ => {
                    let j = rng.below(a.len());
                    a.swap(i, j);
                }
            }
        }
        _ => {}
    }
}

#[derive(Debug)]
enum Outcome {
    LoadError,
    RunError,
    Ran,
    Panicked,
}

/// Load `plan` in a fresh session and run one step with zero feeds.
fn run(plan: Plan) -> Outcome {
    let r = std::panic::catch_unwind(move || {
        let mut s = Session::new(1);
        let feeds = plan.feeds.clone();
        let types: Vec<_> = feeds.iter().map(|(_, r)| plan.buffer(r).map(|b| (b.dtype, b.len()))).collect();
        if s.load("train", plan).is_err() {
            return Outcome::LoadError;
        }
        for ((name, _), ty) in feeds.iter().zip(types) {
            let _ = match ty {
                Some((DType::F32, n)) => s.feed("train", name, &vec![0.0; n]),
                Some((_, n)) => s.feed("train", name, &vec![0; n]),
                None => Ok(()),
            };
        }
        match s.run("train") {
            Ok(()) => Outcome::Ran,
            Err(_) => Outcome::RunError,
        }
    });
    r.unwrap_or(Outcome::Panicked)
}

#[test]
fn mutated_plans_are_rejected_or_run_without_panicking() {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        hook(info);
    }));
    let momentum = Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false };
    let adam = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    let seeds = [
        plan(ModelKind::Mlp, 1, momentum.clone(), VarPlacement::Cpu, false),
        plan(ModelKind::Mlp, 2, adam.clone(), VarPlacement::Gpu0, false),
        // Swish: generated fused kernels (expressions, shapes) and one multi-tensor update.
        plan_with(
            ModelKind::Mlp,
            0,
            momentum.clone(),
            VarPlacement::Cpu,
            false,
            towers_graph::layers::Activation::Swish,
        ),
        plan(ModelKind::Convnet, 1, adam.clone(), VarPlacement::Cpu, false),
        plan(ModelKind::Convnet, 2, momentum, VarPlacement::Cpu, false),
        // Batch norm adds its kernels and the moving averages' updates.
        plan(ModelKind::Convnet, 2, adam, VarPlacement::Cpu, true),
    ];
    let mut rng = Rng(env("TOWERS_FUZZ_SEED", 0x7077_e125));
    let per_plan = env("TOWERS_FUZZ_MUTANTS", MUTANTS_PER_PLAN as u64);
    let (mut mutations, mut parse, mut rejected, mut load, mut run_err, mut ran, mut hung) = (0, 0, 0, 0, 0, 0, 0);
    let mut panicked: Vec<String> = Vec::new();
    for seed in &seeds {
        let t = std::time::Instant::now();
        verify(seed).expect("the seed plan verifies");
        let steps: usize = seed.streams.iter().map(|s| s.steps.len()).sum();
        println!("verify: {steps} steps in {:?}", t.elapsed());
        let json = serde_json::to_value(seed).expect("json");
        let (mut paths, mut strings) = (Vec::new(), Vec::new());
        targets(&json, &mut Vec::new(), &mut paths, &mut strings);
        let kernel_paths: Vec<Vec<Seg>> =
            paths.iter().filter(|p| p.iter().any(|s| matches!(s, Seg::Key(k) if k == "kernel"))).cloned().collect();
        strings.sort();
        strings.dedup();
        for _ in 0..per_plan {
            mutations += 1;
            let mut v = json.clone();
            for _ in 0..1 + rng.below(3) {
                // Half of the mutations hit a launch's kernel parameters,
                // where most rules live; the rest anything in the plan.
                let p = if rng.below(2) == 0 {
                    &kernel_paths[rng.below(kernel_paths.len())]
                } else {
                    &paths[rng.below(paths.len())]
                };
                mutate(&mut v, p, &strings, &mut rng);
            }
            let Ok(plan) = serde_json::from_value::<Plan>(v) else {
                parse += 1;
                continue;
            };
            if verify(&plan).is_err() {
                rejected += 1;
                continue;
            }
            let text = plan.to_text();
            let before = PANICS.load(Ordering::SeqCst);
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(run(plan));
            });
            let outcome = rx.recv_timeout(Duration::from_secs(20));
            // A worker thread's panic does not reach catch_unwind; the hook counts it.
            let mut bad = PANICS.load(Ordering::SeqCst) > before;
            match outcome {
                Ok(Outcome::LoadError) => load += 1,
                Ok(Outcome::RunError) => run_err += 1,
                Ok(Outcome::Ran) => ran += 1,
                Ok(Outcome::Panicked) => bad = true,
                Err(_) => {
                    hung += 1;
                    bad = true;
                }
            }
            if bad {
                panicked.push(text);
            }
        }
    }
    println!(
        "plan fuzz: {mutations} mutations: {parse} rejected by parse, {rejected} rejected by verify, \
         {} verified: {ran} ran, {run_err} run errors, {load} load errors, {} panics, {hung} hangs",
        mutations - parse - rejected,
        panicked.len()
    );
    assert!(panicked.is_empty(), "{} verified plans panicked or hung; the first:\n{}", panicked.len(), panicked[0]);
}
