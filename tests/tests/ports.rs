//! The TF1 ports in `examples/` at unit size: each graph builds with TF's
//! names, compiles at 2 towers and trains 3 steps with a finite loss, and its
//! evaluation runs; the full training (>= 0.97 on mnist5k) runs in CI
//! (`.ci/run`). The examples are included as modules, so the code tested
//! is the code a user reads.

#[allow(dead_code)] // main and its helpers
#[path = "../../examples/port_slim.rs"]
mod port_slim;
#[allow(dead_code)] // main and its helpers
#[path = "../../examples/port_tf_layers.rs"]
mod port_tf_layers;
#[allow(dead_code)] // main and its helpers
#[path = "../../examples/port_towers_loop.rs"]
mod port_towers_loop;

use towers::prelude::*;

fn trainable(g: &Graph) -> Vec<String> {
    g.collection(keys::TRAINABLE_VARIABLES).to_vec()
}

#[test]
fn slim_port_has_slim_names_and_trains_at_two_towers() {
    let g = port_slim::graph(0).expect("builds");
    assert_eq!(
        trainable(&g),
        [
            "conv1/weights",
            "conv1/BatchNorm/beta",
            "conv2/weights",
            "conv2/BatchNorm/beta",
            "fc3/weights",
            "fc3/BatchNorm/beta",
            "fc4/weights",
            "fc4/biases",
        ]
    );
    // l2 5e-4 on every weight: four terms.
    assert_eq!(g.collection(keys::REGULARIZATION_LOSSES).len(), 4);
    let r = port_slim::Run { max_steps: Some(3), ..Default::default() };
    let acc = port_slim::run(&r).expect("trains");
    assert!((0.0..=1.0).contains(&acc), "{acc}");
}

#[test]
fn tf_layers_port_has_automatic_names_and_trains_at_two_towers() {
    let g = port_tf_layers::graph(0).expect("builds");
    assert_eq!(
        trainable(&g),
        [
            "conv2d/kernel",
            "batch_normalization/gamma",
            "batch_normalization/beta",
            "conv2d_1/kernel",
            "batch_normalization_1/gamma",
            "batch_normalization_1/beta",
            "dense/kernel",
            "dense/bias",
            "dense_1/kernel",
            "dense_1/bias",
        ]
    );
    assert!(g.get("dropout/dropout").is_some() && g.get("max_pooling2d_1/MaxPool").is_some());
    let r = port_tf_layers::Run { max_steps: Some(3), ..Default::default() };
    let acc = port_tf_layers::run(&r).expect("trains");
    assert!((0.0..=1.0).contains(&acc), "{acc}");
}

#[test]
fn towers_loop_port_builds_two_towers_and_trains() {
    let opt = Optimizer::Sgd { lr: F32(0.1) };
    let (g, loss) = port_towers_loop::train_graph(0, 2, &opt).expect("builds");
    assert!(g.get("tower_1/softmax_linear/BiasAdd").is_some(), "the second tower's ops");
    assert_eq!(trainable(&g).len(), 8, "variables shared by the towers: {:?}", trainable(&g));
    compile_manual(&g, &loss, &CompileOptions::new(opt, port_towers_loop::BATCH)).expect("compile_manual");
    let r = port_towers_loop::Run { max_steps: Some(3), ..Default::default() };
    let acc = port_towers_loop::run(&r).expect("trains");
    assert!((0.0..=1.0).contains(&acc), "{acc}");
}

/// `Regularizer::L2(s)` adds `s * sum(w²) / 2` per regularized weight
/// (`tf.contrib.layers.l2_regularizer(s)`), computed by the runtime and
/// compared with the sum taken here from the session's variables.
#[test]
fn l2_regularizer_adds_scale_times_half_the_sum_of_squares() {
    let mut b = GraphBuilder::with_seed(3);
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(5)])).expect("x");
    b.arg_scope(LayerDefaults::new().weights_regularizer(Regularizer::L2(0.25)), |b| {
        let h = layers::dense_with(b, x, &DenseOptions::new(4).name("fc1"))?;
        let fc2 = DenseOptions::new(3)
            .name("fc2")
            .biases_initializer(Initializer::Constant(F32(0.5)))
            .biases_regularizer(Regularizer::L2(2.0));
        layers::dense_with(b, h, &fc2)
    })
    .expect("builds");
    let reg = b.regularization_loss().expect("sum").expect("terms");
    let reg = b.identity(reg, "reg").expect("reg");
    let g = b.finish();
    let eval = compile_eval(&g, &[("reg", &g.node(reg.node).name)], 1).expect("compiles");
    let mut sess = Session::new(1);
    sess.load("eval", eval.plan).expect("loads");
    sess.run("eval").expect("runs");
    let got = sess.fetch::<f32>("eval", "reg").expect("fetch")[0] as f64;
    let half_sq = |v: &str| sess.variable::<f32>(v).expect(v).iter().map(|&w| (w as f64).powi(2)).sum::<f64>() / 2.0;
    // fc2's biases start at 0.5: 2.0 * 3 * 0.25 / 2 = 0.75 of it.
    let want = 0.25 * (half_sq("fc1/weights") + half_sq("fc2/weights")) + 2.0 * half_sq("fc2/biases");
    assert!(want > 0.01, "glorot weights are not all zero: {want}");
    assert!((got - want).abs() <= 1e-5 * want, "regularization loss {got}, expected {want}");
}

/// The ports' losses (a batch mean of the cross entropy plus the
/// regularizers) and the seed models' are recognised as batch means: no
/// compile at 2 or 3 towers warns that its towers cannot equal one device.
#[test]
fn the_ports_and_seed_models_losses_are_batch_means() {
    let mut graphs = vec![
        ("slim", port_slim::graph(0).expect("builds"), "loss".to_string()),
        ("tf.layers", port_tf_layers::graph(0).expect("builds"), "loss".to_string()),
    ];
    for kind in [towers::models::ModelKind::Mlp, towers::models::ModelKind::Convnet] {
        for bn in [false, true] {
            let mut spec = towers::models::ModelSpec::new(kind, [28, 28, 1], 10);
            spec.batch_norm = bn;
            let m = towers::models::build(&spec).expect("builds");
            graphs.push(("seed", m.graph, m.loss));
        }
    }
    for (what, g, loss) in graphs {
        for towers in [2u32, 3] {
            let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 60);
            o.towers = (0..towers).map(Device::gpu).collect();
            let c = compile_train(&g, &loss, &o).expect("compiles");
            let d: Vec<&str> = c.state.diagnostics.iter().map(|d| d.message.as_str()).collect();
            assert!(d.iter().all(|m| !m.contains("neither a mean nor a sum")), "{what} at {towers} towers: {d:?}");
        }
    }
}
