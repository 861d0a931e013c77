//! The CUDA backend against the CPU backend (the interpreter it must agree
//! with): the seed MLP and convnet training programs, 1 and 2 towers (two
//! logical GPUs on the one physical GPU), same seed, same feeds, a few
//! steps; losses and every variable compared.
//!
//! Without a GPU (or without NVRTC/cuBLAS), asking for the CUDA backend is
//! a typed error naming the missing library and `LD_LIBRARY_PATH`, and the
//! GPU parts say SKIPPED, unless `TOWERS_REQUIRE_GPU` is set
//! (`bench/gpu_check.sh`, `bench/gpu.sh`): then each of them fails.
//!
//! Tolerance: 1e-4 relative (|a-b| / max(1, |b|)). The GPU sums in other
//! orders than the CPU (cuBLAS's GEMM blocking, the kernels' tree
//! reductions) and its `expf`/`logf` differ by an ulp, so a few ulps per
//! step are expected; a wrong argument or transpose gives errors of order 1.

mod common;

use std::collections::BTreeMap;
use std::time::Instant;

use std::collections::BTreeSet;

use common::seeds::{data, model};
use towers::compiler::{compile_eval, compile_train, CompileOptions};
use towers::models::{Model, ModelKind};
use towers::passes::VarPlacement;
use towers_codegen::{Plan, Step};
use towers_graph::{Device, Optimizer, F32};
use towers_runtime::cuda::{available, CudaBackend, CudaUnavailable};
use towers_runtime::{Backend, CpuBackend, Session};

const TOL: f32 = 1e-4;

/// Without a GPU: a loud skip, or a failure under `TOWERS_REQUIRE_GPU`.
fn skip(test: &str, why: &CudaUnavailable) {
    match towers_kernels::require_gpu::no_gpu(&format!("{test} (GPU parts)"), &why.to_string()) {
        Ok(skipped) => eprintln!("{skipped}"),
        Err(failure) => panic!("{failure}"),
    }
}

/// The variable works end to end: the first test of this file, run again in
/// a child process with `TOWERS_REQUIRE_GPU=1`, passes exactly where a GPU
/// is usable and fails everywhere else (as on CI, which has none).
#[test]
fn require_gpu_turns_a_missing_gpu_into_a_failure() {
    let out = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", "asking_for_cuda_without_it_is_a_typed_error", "--test-threads", "1"])
        .env(towers_kernels::require_gpu::VAR, "1")
        .output()
        .expect("the test binary runs");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(log.contains("1 passed") || log.contains("1 failed"), "the child ran the one test:\n{log}");
    let gpu = CudaBackend::new().is_ok();
    assert_eq!(out.status.success(), gpu, "GPU usable here: {gpu}; the child under TOWERS_REQUIRE_GPU=1:\n{log}");
    if !gpu {
        assert!(log.contains("TOWERS_REQUIRE_GPU is set"), "{log}");
    }
}

#[test]
fn asking_for_cuda_without_it_is_a_typed_error() {
    match (available(), CudaBackend::new()) {
        (Ok(()), Ok(b)) => eprintln!("CUDA backend on {}", b.device()),
        (Err(_), Err(e)) => {
            let msg = e.to_string();
            if let CudaUnavailable::MissingLibrary { .. } = e {
                assert!(msg.contains("LD_LIBRARY_PATH"), "{msg}");
            }
            eprintln!("CUDA backend unavailable, as expected here: {msg}");
            skip("asking_for_cuda_without_it_is_a_typed_error", &e);
        }
        (a, b) => panic!("available() and new() disagree: {a:?} / {:?}", b.err()),
    }
}

struct Trained {
    losses: Vec<f32>,
    vars: BTreeMap<String, Vec<f32>>,
    /// The eval program's predictions on the first batch, after training.
    predictions: Vec<f32>,
    note: String,
}

/// Kernel names a plan launches.
fn kernels(plan: &Plan, into: &mut BTreeSet<&'static str>) {
    for s in &plan.streams {
        for step in &s.steps {
            if let Step::Launch { kernel, .. } = step {
                into.insert(kernel.name());
                if let towers_kernels::Kernel::MeanApply { apply, .. } = kernel {
                    into.insert(apply.name());
                }
            }
        }
    }
}

fn train(
    backend: Box<dyn Backend>,
    m: &Model,
    opts: &CompileOptions,
    batches: &[(Vec<f32>, Vec<i32>)],
    seen: &mut BTreeSet<&'static str>,
) -> Trained {
    train_fed(backend, m, opts, batches, seen, false)
}

/// As [`train`], the feeds copied in (`feed`) or written in place
/// (`feed_with_*`, `in_place`).
fn train_fed(
    backend: Box<dyn Backend>,
    m: &Model,
    opts: &CompileOptions,
    batches: &[(Vec<f32>, Vec<i32>)],
    seen: &mut BTreeSet<&'static str>,
    in_place: bool,
) -> Trained {
    let c = compile_train(&m.graph, &m.loss, opts).expect("compiles");
    let e = compile_eval(&m.graph, &[("predictions", &m.predictions)], batches[0].1.len()).expect("compiles eval");
    kernels(&c.plan, seen);
    kernels(&e.plan, seen);
    let mut sess = Session::with_backend(m.spec.seed, backend);
    sess.load("train", c.plan).expect("loads");
    sess.load("eval", e.plan).expect("loads eval");
    let mut losses = Vec::new();
    for (x, y) in batches {
        if in_place {
            sess.feed_with("train", &m.images, |b| b.copy_from_slice(x)).unwrap();
            sess.feed_with("train", &m.labels, |b| b.copy_from_slice(y)).unwrap();
        } else {
            sess.feed("train", &m.images, x).unwrap();
            sess.feed("train", &m.labels, y).unwrap();
        }
        sess.run("train").expect("runs");
        losses.push(sess.fetch::<f32>("train", "loss").unwrap()[0]);
    }
    if in_place {
        sess.feed_with("eval", &m.images, |b| b.copy_from_slice(&batches[0].0)).unwrap();
    } else {
        sess.feed("eval", &m.images, &batches[0].0).unwrap();
    }
    sess.run("eval").expect("eval runs");
    // Predicted classes (i32).
    let predictions = sess.fetch::<i32>("eval", "predictions").unwrap().into_iter().map(|v| v as f32).collect();
    let mut vars = BTreeMap::new();
    for name in sess.variable_names() {
        let v = sess
            .variable::<f32>(&name)
            .unwrap_or_else(|_| sess.variable::<i32>(&name).unwrap().into_iter().map(|x| x as f32).collect());
        vars.insert(name, v);
    }
    Trained { losses, vars, predictions, note: sess.backend_note() }
}

fn rel(a: f32, b: f32) -> f32 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / b.abs().max(1.0)
    }
}

/// Largest relative difference over losses and variables, and where.
fn compare(gpu: &Trained, cpu: &Trained) -> (f32, String) {
    let mut worst = (0f32, String::from("-"));
    for (k, (a, b)) in gpu.losses.iter().zip(&cpu.losses).enumerate() {
        let d = rel(*a, *b);
        if d > worst.0 || d.is_nan() {
            worst = (d, format!("loss of step {k}"));
        }
    }
    for (a, b) in gpu.predictions.iter().zip(&cpu.predictions) {
        let d = rel(*a, *b);
        if d > worst.0 || d.is_nan() {
            worst = (d, "eval predictions".into());
        }
    }
    for (name, vb) in &cpu.vars {
        let Some(va) = gpu.vars.get(name) else { return (f32::INFINITY, format!("{name} missing")) };
        for (a, b) in va.iter().zip(vb) {
            let d = rel(*a, *b);
            if d > worst.0 || d.is_nan() {
                worst = (d, name.clone());
            }
        }
    }
    worst
}

#[test]
fn cuda_matches_cpu_on_the_seed_models_with_one_and_two_towers() {
    if let Err(e) = available() {
        skip("cuda_matches_cpu_on_the_seed_models_with_one_and_two_towers", &e);
        return;
    }
    let adam = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    let momentum = Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: true };
    let cases = [
        ("mlp 784-256-256-10", model(ModelKind::Mlp, [28, 28, 1], vec![256, 256], false), adam.clone(), 64),
        ("mlp 64-16-10", model(ModelKind::Mlp, [8, 8, 1], vec![16], false), momentum.clone(), 24),
        ("mlp 64-16-10 sgd", model(ModelKind::Mlp, [8, 8, 1], vec![16], false), Optimizer::Sgd { lr: F32(0.1) }, 24),
        // Folded products updating their variables (gemm_tower_apply) with two towers.
        (
            "mlp 64-16-10 momentum",
            model(ModelKind::Mlp, [8, 8, 1], vec![16], false),
            Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false },
            24,
        ),
        ("convnet 28x28", model(ModelKind::Convnet, [28, 28, 1], vec![], false), adam.clone(), 16),
        ("convnet 8x8 + batch norm", model(ModelKind::Convnet, [8, 8, 1], vec![], true), momentum, 24),
    ];
    let mut failures = Vec::new();
    let mut seen = BTreeSet::new();
    let mut worst = 0f32;
    for (name, m, opt, batch) in &cases {
        let batches = data(m, *batch, 3);
        for (towers, vars) in [(1u32, VarPlacement::Cpu), (2, VarPlacement::Cpu), (2, VarPlacement::Gpu0)] {
            let mut o = CompileOptions::new(opt.clone(), *batch);
            o.towers = (0..towers).map(Device::gpu).collect();
            o.variables = vars;
            let cpu = train(Box::new(CpuBackend::new()), m, &o, &batches, &mut seen);
            let t = Instant::now();
            let gpu = train(Box::new(CudaBackend::new().expect("CUDA backend")), m, &o, &batches, &mut seen);
            let (d, at) = compare(&gpu, &cpu);
            worst = worst.max(d);
            eprintln!(
                "{name}, {towers} tower(s), variables on {vars:?}: max rel diff {d:.3e} at {at}; losses cpu {:?} cuda {:?} ({} ms incl. load)\n  {}",
                cpu.losses,
                gpu.losses,
                t.elapsed().as_millis(),
                gpu.note
            );
            if d.is_nan() || d > TOL {
                failures.push(format!("{name}, {towers} tower(s): {d:.3e} at {at}"));
            }
        }
    }
    eprintln!("MAX REL DIFF over every case: {worst:.3e}; {} kernels ran: {seen:?}", seen.len());
    assert!(failures.is_empty(), "CUDA differs from CPU beyond {TOL}: {failures:#?}");
}

fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Step times of one configuration: the median full step (feed, run, loss
/// fetch) and the median run alone, ms, three ways interleaved step by step
/// in the same session: the feeds copied from ready vectors (`feed`);
/// "gather + copy feed": the batch first copied into a vector of the loop's
/// own, then fed by `feed` (what `towers train` did before feeds in
/// place); "zero-copy feed": the batch copied straight into the memory
/// `feed_with_*` lends (what it does now). The last two do the same host
/// work apart from the feed itself.
fn time_steps(label: &str, backend: Box<dyn Backend>, m: &Model, opts: &CompileOptions, warm: usize, steps: usize) {
    let batch = opts.batch;
    let batches = data(m, batch, 4);
    let c = compile_train(&m.graph, &m.loss, opts).unwrap();
    let launches = c.plan.streams.iter().flat_map(|s| &s.steps).filter(|s| matches!(s, Step::Launch { .. })).count();
    let mut sess = Session::with_backend(1, backend);
    sess.load("train", c.plan).unwrap();
    // [ready vectors, gather + copy, in place]: full steps and runs alone.
    let mut full: [Vec<f64>; 3] = Default::default();
    let mut run_only: [Vec<f64>; 3] = Default::default();
    let mut loss = [0f32];
    let (mut gx, mut gy) = (vec![0f32; batches[0].0.len()], vec![0i32; batches[0].1.len()]);
    for i in 0..3 * (warm + steps) {
        let (x, y) = &batches[(i / 3) % batches.len()];
        let how = i % 3;
        let t = Instant::now();
        match how {
            0 => {
                sess.feed("train", &m.images, x).unwrap();
                sess.feed("train", &m.labels, y).unwrap();
            }
            1 => {
                gx.copy_from_slice(x);
                gy.copy_from_slice(y);
                sess.feed("train", &m.images, &gx).unwrap();
                sess.feed("train", &m.labels, &gy).unwrap();
            }
            _ => {
                sess.feed_with("train", &m.images, |b| b.copy_from_slice(x)).unwrap();
                sess.feed_with("train", &m.labels, |b| b.copy_from_slice(y)).unwrap();
            }
        }
        let t_run = Instant::now();
        sess.run("train").unwrap();
        let r = t_run.elapsed().as_secs_f64() * 1e3;
        sess.fetch_into("train", "loss", &mut loss).unwrap();
        if i / 3 >= warm {
            full[how].push(t.elapsed().as_secs_f64() * 1e3);
            run_only[how].push(r);
        }
    }
    let note = sess.backend_note().replace('\n', "; ");
    if label.starts_with("cuda") && label.contains("eager") && label.contains("fused") {
        // Where a step's time goes (profiling synchronizes after every item,
        // so these are launch + execution, host-timed).
        sess.set_profiling("train", true).unwrap();
        for _ in 0..20 {
            sess.run("train").unwrap();
        }
        let mut by_kernel: BTreeMap<&str, (u64, usize)> = BTreeMap::new();
        for p in sess.profile("train").unwrap() {
            let e = by_kernel.entry(p.kernel).or_default();
            e.0 += p.nanos;
            e.1 += 1;
        }
        let mut v: Vec<_> = by_kernel.into_iter().collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.1 .0));
        let top: Vec<String> =
            v.iter().take(6).map(|(k, (ns, n))| format!("{k} x{n}: {:.1} us", *ns as f64 / 20e3)).collect();
        eprintln!("PROFILE {label}, batch {batch}, per step, profiled: {}", top.join(", "));
    }
    let [full_copy, full_gather, full_lent] = full;
    let [run_copy, run_gather, run_lent] = run_only;
    eprintln!(
        "STEP TIME {label}, batch {batch}, {launches} launches: median {:.3} ms per step (feed + run + loss fetch), run alone {:.3} ms ({steps} steps after {warm}) [{note}]",
        median_ms(full_copy),
        median_ms(run_copy)
    );
    eprintln!(
        "STEP TIME {label} gather + copy feed, batch {batch}: median {:.3} ms per step (batch copied into a vector + feed + run + loss fetch), run alone {:.3} ms (interleaved with the line above)",
        median_ms(full_gather),
        median_ms(run_gather)
    );
    eprintln!(
        "STEP TIME {label} zero-copy feed, batch {batch}: median {:.3} ms per step (batch copied into the lent feed + run + loss fetch), run alone {:.3} ms (interleaved with the lines above)",
        median_ms(full_lent),
        median_ms(run_lent)
    );
}

/// Not an assertion: step times (median of 200 steps after 20 warm-up on
/// the GPU; of 20 after 3 on the CPU, for scale) of the MNIST MLP
/// 784-256-256-10 and the convnet, SGD: one device and two towers, every
/// fusion on and off, CUDA graphs on and off.
#[test]
fn time_the_mlp_step_at_batch_256() {
    if let Err(e) = available() {
        skip("time_the_mlp_step_at_batch_256", &e);
        return;
    }
    let mlp = model(ModelKind::Mlp, [28, 28, 1], vec![256, 256], false);
    let conv = model(ModelKind::Convnet, [28, 28, 1], vec![], false);
    let sgd = Optimizer::Sgd { lr: F32(0.05) };
    let cuda = |graphs: bool| Box::new(CudaBackend::new().unwrap().with_graphs(graphs)) as Box<dyn Backend>;
    let cpu = || Box::new(CpuBackend::new()) as Box<dyn Backend>;
    for (name, m, batch) in
        [("mlp 784-256-256-10", &mlp, 256), ("mlp 784-256-256-10", &mlp, 1024), ("convnet", &conv, 256)]
    {
        for towers in [1u32, 2] {
            for (fusion, fused) in [("fused", true), ("unfused", false)] {
                for (fold, folded) in [("", false), (" folded", true)] {
                    if folded && (towers == 1 || !fused) {
                        continue;
                    }
                    let mut opts = CompileOptions::new(sgd.clone(), batch);
                    if towers > 1 {
                        opts.towers = (0..towers).map(Device::gpu).collect();
                    }
                    opts.fuse_kernels = fused;
                    opts.fold_tower_matmuls = folded;
                    for (how, graphs) in [("graph", true), ("eager", false)] {
                        let label = format!("cuda {how} {name} x{towers} {fusion}{fold}");
                        time_steps(&label, cuda(graphs), m, &opts, 20, 200);
                    }
                }
            }
        }
        if batch == 256 {
            time_steps(&format!("cpu  {name}"), cpu(), m, &CompileOptions::new(sgd.clone(), batch), 3, 20);
        }
    }
}

/// A CUDA graph replays exactly what an eager step launches: five steps of
/// Adam on the MLP (two towers, variables on GPU 0) and of momentum on the
/// convnet give the same losses and variables bit for bit with graphs on
/// and off; and the graph is really used.
#[test]
fn cuda_graph_steps_equal_eager_steps_bit_for_bit() {
    if let Err(e) = available() {
        skip("cuda_graph_steps_equal_eager_steps_bit_for_bit", &e);
        return;
    }
    let adam = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    let momentum = Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false };
    let cases = [
        ("mlp 784-256-256-10", model(ModelKind::Mlp, [28, 28, 1], vec![256, 256], false), adam, 2u32),
        ("convnet 28x28", model(ModelKind::Convnet, [28, 28, 1], vec![], false), momentum, 1),
    ];
    let mut seen = BTreeSet::new();
    for (name, m, opt, towers) in &cases {
        let batches = data(m, 64, 5);
        let mut o = CompileOptions::new(opt.clone(), 64);
        if *towers > 1 {
            o.towers = (0..*towers).map(Device::gpu).collect();
            o.variables = VarPlacement::Gpu0;
        }
        let graph = train(Box::new(CudaBackend::new().unwrap()), m, &o, &batches, &mut seen);
        let eager = train(Box::new(CudaBackend::new().unwrap().with_graphs(false)), m, &o, &batches, &mut seen);
        eprintln!("{name}: graph run: {}\n  eager run: {}", graph.note, eager.note);
        assert!(graph.note.contains("train: steps replay a CUDA graph"), "{name}: {}", graph.note);
        assert!(eager.note.contains("CUDA graphs are turned off"), "{name}: {}", eager.note);
        assert_eq!(
            graph.losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
            eager.losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
            "{name}: losses {:?} vs {:?}",
            graph.losses,
            eager.losses
        );
        for (k, v) in &eager.vars {
            let g = &graph.vars[k];
            let same = g.iter().zip(v).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{name}: variable {k} differs between graph and eager steps");
        }
        assert_eq!(graph.predictions, eager.predictions, "{name}: predictions");
    }
}

/// Feeds written in place on the GPU (pinned staging, an asynchronous
/// copy, the next step waiting for it) train exactly as feeds copied in:
/// five steps of Adam on the MLP (two towers) and the convnet, CUDA graphs
/// on and off, losses, variables and predictions bit for bit. Then the
/// staging's ordering: two in-place feeds before a run (the second wins),
/// a copy after an in-place feed (the copy wins), a read of the feed right
/// after an in-place write (sees it).
#[test]
fn feeding_in_place_on_the_gpu_equals_feeding_a_copy_bit_for_bit() {
    if let Err(e) = available() {
        skip("feeding_in_place_on_the_gpu_equals_feeding_a_copy_bit_for_bit", &e);
        return;
    }
    let adam = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    let cases = [
        ("mlp 784-256-256-10", model(ModelKind::Mlp, [28, 28, 1], vec![256, 256], false), 2u32),
        ("convnet 28x28", model(ModelKind::Convnet, [28, 28, 1], vec![], false), 1),
    ];
    let mut seen = BTreeSet::new();
    for (name, m, towers) in &cases {
        let batches = data(m, 64, 5);
        let mut o = CompileOptions::new(adam.clone(), 64);
        if *towers > 1 {
            o.towers = (0..*towers).map(Device::gpu).collect();
        }
        for graphs in [true, false] {
            let cuda = || Box::new(CudaBackend::new().unwrap().with_graphs(graphs));
            let copied = train_fed(cuda(), m, &o, &batches, &mut seen, false);
            let lent = train_fed(cuda(), m, &o, &batches, &mut seen, true);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&lent.losses), bits(&copied.losses), "{name}, graphs {graphs}: losses");
            for (k, v) in &copied.vars {
                assert_eq!(bits(&lent.vars[k]), bits(v), "{name}, graphs {graphs}: variable {k}");
            }
            assert_eq!(lent.predictions, copied.predictions, "{name}, graphs {graphs}: predictions");
            eprintln!("{name}, graphs {graphs}: in-place feeds equal copied feeds bit for bit ({})", lent.note);
        }
    }
    let m = &cases[0].1;
    let c = compile_train(&m.graph, &m.loss, &CompileOptions::new(adam, 64)).unwrap();
    let mut s = Session::with_backend(1, Box::new(CudaBackend::new().unwrap()));
    s.load("train", c.plan).unwrap();
    let batches = data(m, 64, 3);
    let (a, b, x) = (&batches[0].0, &batches[1].0, &batches[2].0);
    // A step first: a step's tensor (the fed images) is fetched only after
    // one (`RuntimeError::FetchBeforeRun`).
    s.feed("train", &m.images, a).unwrap();
    s.feed_with("train", &m.labels, |v| v.copy_from_slice(&batches[0].1)).unwrap();
    s.run("train").unwrap();
    s.feed_with("train", &m.images, |v| v.copy_from_slice(a)).unwrap();
    s.feed_with("train", &m.images, |v| v.copy_from_slice(b)).unwrap();
    assert!(s.fetch::<f32>("train", &m.images).unwrap() == *b, "the second in-place feed wins");
    s.feed_with("train", &m.images, |v| v.copy_from_slice(a)).unwrap();
    s.feed("train", &m.images, x).unwrap();
    assert!(s.fetch::<f32>("train", &m.images).unwrap() == *x, "a copy after an in-place feed wins");
    // The staging holds the last value lent, not the copy.
    assert!(
        s.feed_with("train", &m.images, |v: &mut [f32]| v.to_vec()).unwrap() == *a,
        "the staging keeps what was lent"
    );
    s.feed_with("train", &m.labels, |v| v.copy_from_slice(&batches[0].1)).unwrap();
    s.run("train").unwrap();
    assert!(s.fetch::<f32>("train", "loss").unwrap()[0].is_finite());
}

/// A made-up training program that launches the kernels the seed models do
/// not: broadcast mul (and `sum_to_shape` in its gradient), avg pool and its
/// gradient, split, concat, slice and its gradient, exp and log, softmax,
/// log softmax and their gradients, dense-label cross entropy, reduce sum,
/// L2 loss, add_n; its eval program: argmax, equal, cast, reduce mean.
struct Zoo {
    graph: towers_graph::Graph,
    loss: String,
    accuracy: String,
}

fn zoo() -> Zoo {
    use towers_graph::{DType, GraphBuilder, Initializer, Padding, Shape, UnaryOp};
    let mut b = GraphBuilder::with_seed(5);
    let name = |b: &GraphBuilder, t: towers_graph::Tensor| b.graph().node(t.node).name.clone();
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(6), Some(6), Some(2)])).unwrap();
    let soft = b.placeholder("soft", DType::F32, Shape(vec![None, Some(5)])).unwrap();
    let labels = b.placeholder("labels", DType::I32, Shape(vec![None])).unwrap();
    let v1 = b.get_variable("zoo/scale", [2], Initializer::RandomUniform { min: F32(0.5), max: F32(1.5) }).unwrap();
    let w = b.get_variable("zoo/w", [12, 5], Initializer::GlorotUniform).unwrap();
    let h = b.mul(x, v1).unwrap();
    let p = b.avg_pool(h, [2, 2], [2, 2], Padding::Same).unwrap();
    let f = b.reshape(p, &[-1, 18]).unwrap();
    let parts = b.split(f, 1, &[10, 8]).unwrap();
    let c = b.concat(&[parts[1], parts[0]], 1).unwrap();
    let s = b.slice(c, &[0, 2], &[-1, 12]).unwrap();
    let e = b.unary(UnaryOp::Exp, s).unwrap();
    let l = b.unary(UnaryOp::Log, e).unwrap();
    let logits = b.matmul(l, w).unwrap();
    let xent = b.softmax_cross_entropy_with_logits(logits, soft).unwrap();
    let sm = b.softmax(logits).unwrap();
    let ls = b.log_softmax(logits).unwrap();
    let ent = b.mul(sm, ls).unwrap();
    let ent = b.reduce_sum(ent, &[1], false).unwrap();
    let l1 = b.reduce_mean_all(xent).unwrap();
    let l2 = b.reduce_mean_all(ent).unwrap();
    let reg = b.l2_loss(w).unwrap();
    let k = b.scalar(0.01).unwrap();
    let reg = b.mul(reg, k).unwrap();
    let loss = b.add_n(&[l1, l2, reg]).unwrap();
    let am = b.argmax(logits, 1).unwrap();
    let eq = b.equal(am, labels).unwrap();
    let eqf = b.cast(eq, DType::F32).unwrap();
    let acc = b.reduce_mean_all(eqf).unwrap();
    let (loss, accuracy) = (name(&b, loss), name(&b, acc));
    Zoo { graph: b.finish(), loss, accuracy }
}

#[test]
fn cuda_matches_cpu_on_the_other_kernels() {
    // Without a GPU the CPU half still runs: the program compiles and trains.
    let gpu = available();
    if let Err(e) = &gpu {
        skip("cuda_matches_cpu_on_the_other_kernels", e);
    }
    let z = zoo();
    let batch = 8;
    let mut seen = BTreeSet::new();
    let mut rng = 1u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 40) as f32 / (1u64 << 24) as f32
    };
    let xs: Vec<f32> = (0..batch * 72).map(|_| next() * 2.0 - 1.0).collect();
    let mut soft: Vec<f32> = (0..batch * 5).map(|_| next()).collect();
    for row in soft.chunks_mut(5) {
        let t: f32 = row.iter().sum();
        row.iter_mut().for_each(|v| *v /= t);
    }
    let labels: Vec<i32> = (0..batch).map(|i| (i % 5) as i32).collect();
    let mut worst = 0f32;
    for towers in [1u32, 2] {
        let mut o = CompileOptions::new(
            Optimizer::Adam { lr: F32(0.05), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) },
            batch,
        );
        o.towers = (0..towers).map(Device::gpu).collect();
        let mut results = Vec::new();
        for cuda in [false, true] {
            if cuda && gpu.is_err() {
                continue;
            }
            let c = compile_train(&z.graph, &z.loss, &o).expect("zoo compiles");
            let ev = compile_eval(&z.graph, &[("accuracy", &z.accuracy)], batch).expect("zoo eval compiles");
            kernels(&c.plan, &mut seen);
            kernels(&ev.plan, &mut seen);
            let backend: Box<dyn Backend> =
                if cuda { Box::new(CudaBackend::new().unwrap()) } else { Box::new(CpuBackend::new()) };
            let mut sess = Session::with_backend(3, backend);
            sess.load("train", c.plan).unwrap();
            sess.load("eval", ev.plan).unwrap();
            let mut out = Vec::new();
            for _ in 0..3 {
                sess.feed("train", "x", &xs).unwrap();
                sess.feed("train", "soft", &soft).unwrap();
                sess.run("train").unwrap();
                out.push(sess.fetch::<f32>("train", "loss").unwrap()[0]);
            }
            sess.feed("eval", "x", &xs).unwrap();
            sess.feed("eval", "labels", &labels).unwrap();
            sess.run("eval").unwrap();
            out.extend(sess.fetch::<f32>("eval", "accuracy").unwrap());
            for v in ["zoo/scale", "zoo/w"] {
                out.extend(sess.variable::<f32>(v).unwrap());
            }
            results.push(out);
        }
        if results.len() < 2 {
            eprintln!("zoo, {towers} tower(s), CPU only: losses + accuracy {:?}", &results[0][..4]);
            continue;
        }
        let d = results[0].iter().zip(&results[1]).map(|(c, g)| rel(*g, *c)).fold(0f32, |a, b| {
            if b.is_nan() {
                f32::NAN
            } else {
                a.max(b)
            }
        });
        eprintln!(
            "zoo, {towers} tower(s): max rel diff {d:.3e}; losses + accuracy cpu {:?} cuda {:?}",
            &results[0][..4],
            &results[1][..4]
        );
        assert!(!d.is_nan() && d <= TOL, "zoo, {towers} tower(s): {d}");
        worst = worst.max(d);
    }
    eprintln!("ZOO MAX REL DIFF {worst:.3e}; {} kernels ran: {seen:?}", seen.len());
}

/// A traced step on the GPU: one event per plan step but the records, in
/// step order and never overlapping within a stream, launches with a
/// duration, inside the step's wall time; the traced step computes what an
/// untraced one does (losses bit for bit), and turning tracing off goes
/// back to graph replays.
#[test]
fn a_traced_gpu_step_is_a_timeline_of_every_plan_step() {
    if let Err(e) = available() {
        skip("a_traced_gpu_step_is_a_timeline_of_every_plan_step", &e);
        return;
    }
    let m = model(ModelKind::Convnet, [28, 28, 1], vec![], false);
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.05) }, 64);
    o.towers = vec![Device::gpu(0), Device::gpu(1)];
    let batches = data(&m, 64, 3);
    let c = compile_train(&m.graph, &m.loss, &o).unwrap();
    let plan = c.plan.clone();
    let mut losses = Vec::new();
    for traced in [false, true] {
        let mut sess = Session::with_backend(3, Box::new(CudaBackend::new().unwrap()));
        sess.load("train", c.plan.clone()).unwrap();
        let mut l = Vec::new();
        for (i, (x, y)) in batches.iter().enumerate() {
            if traced && i == 1 {
                sess.set_tracing("train", true).unwrap();
            }
            sess.feed("train", &m.images, x).unwrap();
            sess.feed("train", &m.labels, y).unwrap();
            sess.run("train").unwrap();
            l.push(sess.fetch::<f32>("train", "loss").unwrap()[0].to_bits());
        }
        losses.push(l);
        if !traced {
            continue;
        }
        let t = sess.trace("train").unwrap();
        assert_eq!(t.step, 2);
        let want: usize = plan.streams.iter().flat_map(|s| &s.steps).filter(|s| !matches!(s, Step::Record(_))).count();
        assert_eq!(t.events.len(), want, "one event per plan step but the records");
        for (s, _) in plan.streams.iter().enumerate() {
            let ev: Vec<_> = t.events.iter().filter(|e| e.stream == s).collect();
            for w in ev.windows(2) {
                assert!(w[0].index < w[1].index, "stream {s}: step order");
                assert!(
                    w[0].start_ns + w[0].dur_ns <= w[1].start_ns + 1_000,
                    "stream {s}: {:?} overlaps {:?}",
                    w[0],
                    w[1]
                );
            }
        }
        let launches: Vec<_> = t.events.iter().filter(|e| !matches!(e.kind, "wait" | "copy" | "all_reduce")).collect();
        assert!(launches.iter().all(|e| e.start_ns + e.dur_ns <= t.dur_ns), "inside the step's wall time");
        assert!(launches.iter().map(|e| e.dur_ns).sum::<u64>() > 0);
        let mut by_kind: BTreeMap<&str, u64> = BTreeMap::new();
        for e in &t.events {
            *by_kind.entry(e.kind).or_default() += e.dur_ns;
        }
        let mut v: Vec<_> = by_kind.into_iter().collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.1));
        let top: Vec<String> = v.iter().take(8).map(|(k, ns)| format!("{k} {:.1} us", *ns as f64 / 1e3)).collect();
        eprintln!("TRACE convnet x2 batch 64, step {:.1} us on the host: {}", t.dur_ns as f64 / 1e3, top.join(", "));
        sess.set_tracing("train", false).unwrap();
        sess.run("train").unwrap();
        assert!(sess.backend_note().contains("train: steps replay a CUDA graph"), "{}", sess.backend_note());
    }
    assert_eq!(losses[0], losses[1], "tracing changes no bit");
}
