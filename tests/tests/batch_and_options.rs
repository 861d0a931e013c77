//! A TF1 port often declares the batch in its placeholders
//! (`tf.placeholder(tf.float32, [BATCH, 36])`). Such a graph must train as
//! one with an unknown batch: the same update at every tower count, the
//! gradients counting each tower's rows (a mean's divisor, a flatten's
//! reshape), not the global rows baked in at build time. And options the
//! compile would ignore (a batch no placeholder takes, accumulation or
//! weights without towers), and optimizer hyper-parameters no training can
//! mean, are refused, naming what to change.

use towers::prelude::*;

const BATCH: usize = 8;

/// conv 3x3 (4 filters) -> flatten -> dense 3, mean cross-entropy; the
/// images' dimension 0 is `rows` (None: unknown).
fn model(rows: Option<usize>) -> Graph {
    let mut b = GraphBuilder::with_seed(3);
    let x = b.placeholder("x", DType::F32, Shape(vec![rows, Some(6), Some(6), Some(1)])).unwrap();
    let y = b.placeholder("y", DType::I32, Shape(vec![rows])).unwrap();
    let h = layers::conv2d_with(&mut b, x, &Conv2dOptions::new(4, [3, 3]).strides([2, 2]).name("conv1")).unwrap();
    let h = b.flatten(h).unwrap();
    let logits = layers::dense(&mut b, "fc", h, 3, Activation::None).unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
    let mean = b.reduce_mean(xent, &[0], false).unwrap();
    b.identity(mean, "loss").unwrap();
    b.finish()
}

/// Every trainable variable after three momentum steps, by name.
fn train(g: &Graph, towers: u32) -> Vec<(String, Vec<f32>)> {
    let mut opts =
        CompileOptions::new(Optimizer::Momentum { lr: F32(0.5), momentum: F32(0.9), nesterov: false }, BATCH);
    opts.towers = (0..towers).map(Device::gpu).collect();
    let plan = compile_train(g, "loss", &opts).unwrap().plan;
    let names: Vec<String> = plan.variables.iter().filter(|v| v.trainable).map(|v| v.name.clone()).collect();
    let mut s = Session::new(0);
    s.load("t", plan).unwrap();
    let xs: Vec<f32> = (0..BATCH * 36).map(|i| ((i * 5) % 7) as f32 * 0.1 - 0.3).collect();
    let ys: Vec<i32> = (0..BATCH).map(|i| (i % 3) as i32).collect();
    for _ in 0..3 {
        s.feed("t", "x", &xs).unwrap();
        s.feed("t", "y", &ys).unwrap();
        s.run("t").unwrap();
    }
    names.into_iter().map(|n| (n.clone(), s.variable::<f32>(&n).unwrap())).collect()
}

#[test]
fn a_batch_declared_in_the_placeholders_trains_as_an_unknown_one_at_every_tower_count() {
    let reference = train(&model(None), 0);
    for towers in [0, 2, 4] {
        let got = train(&model(Some(BATCH)), towers);
        assert_eq!(got.len(), reference.len());
        for ((name, a), (_, r)) in got.iter().zip(&reference) {
            let scale = r.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
            let diff = a.iter().zip(r).fold(0f32, |m, (a, r)| m.max((a - r).abs()));
            // Reassociation across towers only: far below a lost 1/N factor.
            assert!(diff <= 1e-5 * scale, "{towers} towers, {name}: max |diff| {diff} (scale {scale})");
        }
    }
}

fn error_of(r: Result<Compiled, CompileError>) -> String {
    match r {
        Ok(_) => panic!("compiled, expected a refusal"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_batch_no_placeholder_takes_is_refused() {
    let g = model(Some(12));
    let mut opts = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
    opts.towers = vec![Device::gpu(0), Device::gpu(1)];
    let e = error_of(compile_train(&g, "loss", &opts));
    assert!(e.contains("batch is 8 rows") && e.contains("'x'") && e.contains("12 rows"), "{e}");
    let e = error_of(compile_eval(&g, &[("loss", "loss")], 5));
    assert!(e.contains("batch is 5 rows") && e.contains("'y'"), "{e}");
    // The declared batch itself compiles.
    opts.batch = 12;
    compile_train(&g, "loss", &opts).unwrap();
}

#[test]
fn accumulation_and_weights_without_towers_are_refused() {
    let g = model(None);
    let mut opts = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
    opts.accumulate = 0;
    assert!(error_of(compile_train(&g, "loss", &opts)).contains("accumulate is 0"));
    opts.accumulate = 4;
    let e = error_of(compile_train(&g, "loss", &opts));
    assert!(e.contains("accumulate = 4") && e.contains("towers = vec![Device::gpu(0)]"), "{e}");
    opts.towers = vec![Device::gpu(0)];
    compile_train(&g, "loss", &opts).unwrap();
    opts.towers.clear();
    opts.accumulate = 1;
    opts.split = SplitPolicy::Weighted(vec![3, 1]);
    assert!(error_of(compile_train(&g, "loss", &opts)).contains("2 weights"));
}

/// Hyper-parameters no training can mean are refused, naming the field.
#[test]
fn hyperparameters_no_training_can_mean_are_refused() {
    let g = model(None);
    let adam = |beta1: f32, epsilon: f32| Optimizer::Adam {
        lr: F32(0.001),
        beta1: F32(beta1),
        beta2: F32(0.999),
        epsilon: F32(epsilon),
    };
    for (opt, field) in [
        (Optimizer::Sgd { lr: F32(f32::NAN) }, "lr"),
        (Optimizer::Sgd { lr: F32(-0.1) }, "lr"),
        (Optimizer::Momentum { lr: F32(0.1), momentum: F32(1.5), nesterov: false }, "momentum"),
        (adam(1.0, 1e-8), "beta1"),
        (adam(0.9, 0.0), "epsilon"),
        (Optimizer::Adagrad { lr: F32(0.1), initial_accumulator_value: F32(0.0) }, "initial_accumulator_value"),
    ] {
        let e = error_of(compile_train(&g, "loss", &CompileOptions::new(opt.clone(), BATCH)));
        assert!(e.contains(&format!("{{ {field}:")), "{opt:?}: {e}");
    }
    compile_train(&g, "loss", &CompileOptions::new(adam(0.9, 1e-8), BATCH)).unwrap();
    compile_train(&g, "loss", &CompileOptions::new(Optimizer::Sgd { lr: F32(0.0) }, BATCH)).unwrap();
}

/// The loss is fetched by the name the user compiled it with at every tower
/// count (with towers that node is per tower; the name means the mean).
#[test]
fn the_loss_is_fetched_by_its_own_name_at_every_tower_count() {
    let mut b = GraphBuilder::with_seed(3);
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(4)])).unwrap();
    let y = b.placeholder("y", DType::I32, Shape(vec![None])).unwrap();
    let logits = layers::dense(&mut b, "fc", x, 3, Activation::None).unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
    let mean = b.reduce_mean(xent, &[0], false).unwrap();
    b.identity(mean, "total_loss").unwrap();
    let g = b.finish();
    let xs: Vec<f32> = (0..16).map(|i| i as f32 * 0.1).collect();
    let ys = [0, 1, 2, 1];
    let mut losses = Vec::new();
    for towers in [0, 2] {
        let mut opts = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 4);
        opts.towers = (0..towers).map(Device::gpu).collect();
        let mut s = Session::new(0);
        s.load("t", compile_train(&g, "total_loss", &opts).unwrap().plan).unwrap();
        s.feed("t", "x", &xs).unwrap();
        s.feed("t", "y", &ys).unwrap();
        s.run("t").unwrap();
        let own = s.fetch::<f32>("t", "total_loss").unwrap().to_vec();
        assert_eq!(own, s.fetch::<f32>("t", "loss").unwrap(), "{towers} towers");
        losses.push(own[0]);
    }
    assert!((losses[0] - losses[1]).abs() <= 1e-6 * losses[0].abs(), "{losses:?}");
}

/// A port that keeps its hand-written tower loop and also asks for towers
/// would run every hand-built tower in every tower: refused, naming the
/// scopes and both ways out.
#[test]
fn a_graph_with_hand_built_towers_is_not_replicated_again() {
    let mut b = GraphBuilder::with_seed(1);
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(4)])).unwrap();
    let y = b.placeholder("y", DType::I32, Shape(vec![None])).unwrap();
    let mut losses = Vec::new();
    for i in 0..2 {
        let l = b
            .name_scope(&format!("tower_{i}"), |b| {
                b.variable_scope("net", if i == 0 { Reuse::No } else { Reuse::Yes }, |b| {
                    let logits = layers::dense(b, "fc", x, 3, Activation::None)?;
                    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y)?;
                    b.reduce_mean_all(xent)
                })
            })
            .unwrap();
        losses.push(l);
    }
    let sum = b.add_n(&losses).unwrap();
    b.identity(sum, "loss").unwrap();
    let g = b.finish();
    let mut opts = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 4);
    opts.towers = vec![Device::gpu(0), Device::gpu(1)];
    let e = error_of(compile_train(&g, "loss", &opts));
    assert!(e.contains("tower_0/, tower_1/") && e.contains("compile_manual"), "{e}");
    opts.towers.clear();
    compile_train(&g, "loss", &opts).unwrap();
}

/// An evaluation program fetches something, each under its own name.
#[test]
fn an_eval_program_without_fetches_or_with_a_name_twice_is_refused() {
    let g = model(None);
    assert!(error_of(compile_eval(&g, &[], 4)).contains("at least one fetch"));
    let e = error_of(compile_eval(&g, &[("out", "loss"), ("out", "fc/BiasAdd")], 4));
    assert!(e.contains("fetch name 'out'") && e.contains("given twice"), "{e}");
}

/// Names a fetch or a dump could not address are refused at build time.
#[test]
fn node_names_that_cannot_be_addressed_are_refused() {
    for bad in ["", "logits:0", "a//b", "/a", "a\nb"] {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(2)])).unwrap();
        let e = b.identity(x, bad).unwrap_err();
        assert!(matches!(e, GraphError::BadNodeName { .. }), "{bad:?}: {e}");
    }
}

/// cifar10's single-GPU pattern: variables under `/cpu:0`
/// (`_variable_on_cpu`), the model under `/gpu:0`. Without towers the
/// program is one device, so the compile says which nodes ask for which
/// device and what to set; with one tower it compiles and trains, the
/// variables where they were asked for.
#[test]
fn device_scopes_without_towers_name_the_nodes_and_the_option_to_set() {
    let mut b = GraphBuilder::with_seed(1);
    let x = b.placeholder("x", DType::F32, [None, Some(3)]).unwrap();
    let w = b.device("/cpu:0", |b| b.get_variable("local/weights", [3, 2], Initializer::GlorotUniform)).unwrap();
    let loss = b
        .device("/gpu:0", |b| {
            let h = b.matmul(x, w)?;
            b.reduce_mean_all(h)
        })
        .unwrap();
    b.identity(loss, "loss").unwrap();
    let g = b.finish();
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 4);
    let e = error_of(compile_train(&g, "loss", &o));
    assert!(e.contains("'local/weights' requests /cpu:0 and 'MatMul' requests /gpu:0"), "{e}");
    assert!(e.contains("CompileOptions::towers = vec![Device::gpu(0)]") && e.contains("--towers 1"), "{e}");
    o.towers = vec![Device::gpu(0)];
    let c = compile_train(&g, "loss", &o).expect("one tower");
    let report = placement_report(&c.graph, &c.plan);
    assert!(report.contains("local/weights") && report.contains("cpu:0"), "{report}");
}

/// A placeholder whose declared rows happen to equal the batch but whose
/// axis 0 is not the examples' (TF1's fed embedding table
/// `tf.placeholder([VOCAB, DIM])`, a `[CLASSES]` scale broadcast over the
/// logits) is fed whole to every tower, not split: at batch == VOCAB ==
/// CLASSES = 10, 2 towers train as one device.
#[test]
fn a_fed_table_with_as_many_rows_as_the_batch_is_not_split() {
    let graph = || {
        let mut b = GraphBuilder::with_seed(2);
        let ids = b.placeholder("ids", DType::I32, [None, Some(3)]).unwrap();
        let y = b.placeholder("y", DType::I32, [None]).unwrap();
        let table = b.placeholder("table", DType::F32, [10, 4]).unwrap();
        let scale = b.placeholder("class_scale", DType::F32, [10]).unwrap();
        let emb = b.gather(table, ids, 0).unwrap();
        let pooled = b.reduce_mean(emb, &[1], false).unwrap();
        let logits = layers::dense(&mut b, "fc", pooled, 10, Activation::None).unwrap();
        let logits = b.mul(logits, scale).unwrap();
        let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
        let loss = b.reduce_mean(xent, &[0], false).unwrap();
        b.identity(loss, "loss").unwrap();
        b.finish()
    };
    let train = |towers: u32| {
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.5) }, 10);
        o.towers = (0..towers).map(Device::gpu).collect();
        let c = compile_train(&graph(), "loss", &o).expect("compiles");
        assert_eq!(c.state.batch_inputs, ["ids", "y"], "only the examples are split");
        let mut s = Session::new(0);
        s.load("train", c.plan).unwrap();
        let ids: Vec<i32> = (0..30).map(|i| (i * 7 % 10) as i32).collect();
        let ys: Vec<i32> = (0..10).map(|i| (i * 3 % 10) as i32).collect();
        let table: Vec<f32> = (0..40).map(|i| ((i * 5 % 13) as f32 - 6.0) / 6.0).collect();
        let scale: Vec<f32> = (0..10).map(|i| 0.5 + i as f32 / 10.0).collect();
        for _ in 0..2 {
            s.feed("train", "ids", &ids).unwrap();
            s.feed("train", "y", &ys).unwrap();
            s.feed("train", "table", &table).unwrap();
            s.feed("train", "class_scale", &scale).unwrap();
            s.run("train").unwrap();
        }
        (s.fetch::<f32>("train", "loss").unwrap()[0], s.variable::<f32>("fc/weights").unwrap())
    };
    let (l0, w0) = train(0);
    let (l2, w2) = train(2);
    assert!((l0 - l2).abs() <= 1e-5 * l0.abs(), "{l2} vs one device {l0}");
    assert!(w0.iter().zip(&w2).all(|(a, b)| (a - b).abs() <= 1e-5 * a.abs().max(1e-2)));
}

/// A batch that does not divide over the towers: the error offers the
/// nearest even weighted split, which then compiles.
#[test]
fn an_uneven_batch_is_refused_with_the_weights_that_split_it() {
    let g = model(None);
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 10);
    o.towers = (0..4).map(Device::gpu).collect();
    let e = error_of(compile_train(&g, "loss", &o));
    assert!(e.contains("SplitPolicy::Weighted(vec![3, 3, 2, 2])") && e.contains("--split-weights 3,3,2,2"), "{e}");
    o.split = SplitPolicy::Weighted(vec![3, 3, 2, 2]);
    compile_train(&g, "loss", &o).expect("the offered split compiles");
}

/// A `/cpu:1` scope without towers is refused by the compile (as with
/// towers), not first by `Session::load`.
#[test]
fn a_second_host_device_is_refused_at_compile_without_towers() {
    let mut b = GraphBuilder::with_seed(1);
    let x = b.placeholder("x", DType::F32, [None, Some(3)]).unwrap();
    let loss = b.device("/cpu:1", |b| b.reduce_mean_all(x)).unwrap();
    b.identity(loss, "loss").unwrap();
    let e = error_of(compile_eval(&b.finish(), &[("loss", "loss")], 4));
    assert!(e.contains("device cpu:1 was asked for") && e.contains("/cpu:0"), "{e}");
}

/// A `ProcessGroup` written as a literal (its fields are public) gets the
/// checks of `ProcessGroup::new`: rank 5 of 2, world 0, no worker left.
#[test]
fn a_process_group_literal_that_cannot_be_is_refused_first() {
    let g = model(None);
    for (rank, world, ps_ranks) in [(5, 2, 0), (0, 0, 0), (0, 2, 2)] {
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
        o.process = ProcessGroup { rank, world, ps_ranks };
        let e = error_of(compile_train(&g, "loss", &o));
        assert!(e.contains("ProcessGroup::new") && e.contains(&format!("rank: {rank}, world: {world}")), "{e}");
    }
}

/// Batch norm with several towers normalizes each tower's rows by that
/// tower's statistics (TF1's towers did too): allowed, and said in a
/// diagnostic naming the node; one tower (the whole batch) says nothing.
#[test]
fn batch_norm_over_several_towers_is_said() {
    let model = towers_tests::small_model(towers::models::ModelKind::Convnet, true, 4);
    let bn_warnings = |n: u32| {
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
        o.towers = (0..n).map(Device::gpu).collect();
        let c = compile_train(&model.graph, &model.loss, &o).expect("compiles");
        c.state
            .diagnostics
            .iter()
            .filter(|d| d.message.contains("batch norm"))
            .map(|d| d.message.clone())
            .collect::<Vec<_>>()
    };
    assert!(bn_warnings(1).is_empty(), "{:?}", bn_warnings(1));
    let w = bn_warnings(2);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("own batch statistics") && w[0].contains("2 replica(s)"), "{w:?}");
}
