//! The layers' TF options: variable names in slim and tf.layers styles
//! (with reuse), `arg_scope` nesting, `use_bias`, normalizers, batch norm's
//! `center`/`scale`, the l2 regularizer's loss, and one typed error per bad
//! option naming the layer.

use towers_graph::layers::{
    self, Activation, BatchNormOptions, Conv2dOptions, DenseOptions, DropoutOptions, LayerDefaults, Naming, Normalizer,
    Pool2dOptions, Regularizer,
};
use towers_graph::{keys, DType, GraphBuilder, GraphError, Initializer, Op, Padding, Reuse, Shape, Tensor, F32};

fn images(b: &mut GraphBuilder) -> Tensor {
    b.placeholder("images", DType::F32, Shape(vec![None, Some(8), Some(8), Some(1)])).expect("placeholder")
}

fn vars(b: &GraphBuilder) -> Vec<String> {
    b.graph().collection(keys::GLOBAL_VARIABLES).to_vec()
}

fn op_of(b: &GraphBuilder, t: Tensor) -> String {
    b.graph().node(t.node).op.type_name().to_string()
}

#[test]
fn tf_layers_names_are_automatic_and_unique() {
    let mut b = GraphBuilder::new();
    let x = images(&mut b);
    b.arg_scope(LayerDefaults::new().naming(Naming::TfLayers).padding(Padding::Same), |b| {
        let h = layers::conv2d_with(b, x, &Conv2dOptions::new(4, [3, 3]))?;
        let h = layers::batch_norm_with(b, h, &BatchNormOptions::new())?;
        let h = layers::max_pool2d(b, h, &Pool2dOptions::new([2, 2], [2, 2]))?;
        let h = layers::conv2d_with(b, h, &Conv2dOptions::new(4, [3, 3]))?;
        let h = b.flatten(h)?;
        let h = layers::dense_with(b, h, &DenseOptions::new(5))?;
        let h = layers::dropout_with(b, h, &DropoutOptions::new(0.5))?;
        layers::dense_with(b, h, &DenseOptions::new(3))
    })
    .expect("builds");
    assert_eq!(
        vars(&b),
        [
            "conv2d/kernel",
            "conv2d/bias",
            "batch_normalization/gamma",
            "batch_normalization/beta",
            "batch_normalization/moving_mean",
            "batch_normalization/moving_variance",
            "conv2d_1/kernel",
            "conv2d_1/bias",
            "dense/kernel",
            "dense/bias",
            "dense_1/kernel",
            "dense_1/bias",
        ]
    );
    assert!(b.graph().get("max_pooling2d/MaxPool").is_some());
    assert!(b.graph().get("dropout/dropout").is_some());
    // tf.layers' defaults: VALID would have been the default padding, no activation.
    assert!(b.graph().get("dense_1/Relu").is_none());
}

#[test]
fn slim_names_default_scopes_and_normalizer_sub_scope() {
    let mut b = GraphBuilder::new();
    let x = images(&mut b);
    let bn = Normalizer::BatchNorm(BatchNormOptions::new().decay(0.9));
    b.variable_scope("net", Reuse::No, |b| {
        b.arg_scope(LayerDefaults::new().normalizer(bn), |b| {
            let h = layers::conv2d_with(b, x, &Conv2dOptions::new(4, [3, 3]).name("conv1"))?;
            let h = layers::conv2d_with(b, h, &Conv2dOptions::new(4, [3, 3]))?;
            let h = b.flatten(h)?;
            let h = layers::dense_with(b, h, &DenseOptions::new(5).normalizer(Normalizer::None))?;
            layers::dense_with(b, h, &DenseOptions::new(3).normalizer(Normalizer::None))
        })
    })
    .expect("builds");
    assert_eq!(
        vars(&b),
        [
            // slim: a normalizer replaces the bias; batch norm without `scale`.
            "net/conv1/weights",
            "net/conv1/BatchNorm/beta",
            "net/conv1/BatchNorm/moving_mean",
            "net/conv1/BatchNorm/moving_variance",
            "net/Conv/weights",
            "net/Conv/BatchNorm/beta",
            "net/Conv/BatchNorm/moving_mean",
            "net/Conv/BatchNorm/moving_variance",
            "net/fully_connected/weights",
            "net/fully_connected/biases",
            "net/fully_connected_1/weights",
            "net/fully_connected_1/biases",
        ]
    );
    // slim's default activation is ReLU, after the batch norm.
    let relu = b.graph().get("net/conv1/Relu").expect("relu");
    let input = b.graph().inputs(relu)[0].node;
    assert_eq!(b.graph().node(input).name, "net/conv1/BatchNorm/FusedBatchNorm");
    let decays: Vec<f32> = b
        .graph()
        .node_ids()
        .into_iter()
        .filter_map(|i| match b.graph().node(i).op {
            Op::AssignMovingAverage { decay } => Some(decay.0),
            _ => None,
        })
        .collect();
    assert_eq!(decays, [0.9; 4]);
}

/// TF1: a second tower re-entering `model` with reuse gets `model/dense`
/// again (the sub-scope counts reset when `model` is left), so tf.layers'
/// automatic names are shared across towers.
#[test]
fn automatic_names_are_reused_across_towers() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(4)])).expect("x");
    let mut outs = Vec::new();
    for i in 0..2 {
        let reuse = if i == 0 { Reuse::No } else { Reuse::Yes };
        let y = b
            .reuse_scope(reuse, |b| {
                b.name_scope(&format!("tower_{i}"), |b| {
                    b.variable_scope("model", Reuse::No, |b| {
                        b.arg_scope(LayerDefaults::new().naming(Naming::TfLayers), |b| {
                            let h = layers::dense_with(b, x, &DenseOptions::new(3))?;
                            layers::dense_with(b, h, &DenseOptions::new(2))
                        })
                    })
                })
            })
            .expect("the second tower reuses the first's variables");
        outs.push(y);
    }
    assert_eq!(vars(&b), ["model/dense/kernel", "model/dense/bias", "model/dense_1/kernel", "model/dense_1/bias"]);
    assert_eq!(b.graph().node(outs[1].node).name, "tower_1/model/dense_1/BiasAdd");
}

#[test]
fn arg_scopes_nest_and_restore() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(4)])).expect("x");
    let stddev = Initializer::TruncatedNormal { mean: F32(0.0), stddev: F32(0.01) };
    let outer = LayerDefaults::new().activation(Activation::Tanh).weights_initializer(stddev.clone()).use_bias(false);
    let (a, c, d) = b
        .arg_scope(outer, |b| {
            let a = layers::dense_with(b, x, &DenseOptions::new(3).name("a"))?;
            let c = b.arg_scope(LayerDefaults::new().activation(Activation::Sigmoid).use_bias(true), |b| {
                layers::dense_with(b, x, &DenseOptions::new(3).name("c"))
            })?;
            // The call's own option beats every scope.
            let d = layers::dense_with(b, x, &DenseOptions::new(3).name("d").activation(Activation::None))?;
            Ok::<_, GraphError>((a, c, d))
        })
        .expect("builds");
    let e = layers::dense_with(&mut b, x, &DenseOptions::new(3).name("e")).expect("e");
    assert_eq!(op_of(&b, a), "Tanh");
    assert_eq!(op_of(&b, c), "Sigmoid", "the inner scope overrides the outer");
    assert_eq!(op_of(&b, d), "MatMul", "no activation, no bias");
    assert_eq!(op_of(&b, e), "Relu", "outside every scope: slim's default again");
    assert!(b.graph().get("a/biases").is_none() && b.graph().get("d/biases").is_none());
    assert!(b.graph().get("c/biases").is_some() && b.graph().get("e/biases").is_some());
    // The inner scope kept the outer's initializer; outside, glorot again.
    let init = |n: &str| match &b.graph().node(b.graph().get(n).expect(n)).op {
        Op::Variable { init, .. } => init.clone(),
        _ => panic!("{n} is not a variable"),
    };
    assert_eq!(init("c/weights"), stddev);
    assert_eq!(init("e/weights"), Initializer::GlorotUniform);
    assert_eq!(b.layer_defaults(), &LayerDefaults::default());
}

#[test]
fn use_bias_false_creates_no_bias() {
    let mut b = GraphBuilder::new();
    let x = images(&mut b);
    let y = layers::conv2d_with(
        &mut b,
        x,
        &Conv2dOptions::new(2, [3, 3]).name("c").use_bias(false).activation(Activation::None),
    )
    .expect("conv");
    assert_eq!(vars(&b), ["c/weights"]);
    assert_eq!(op_of(&b, y), "Conv2D");
}

#[test]
fn conv_strides_and_padding_reach_the_op() {
    let mut b = GraphBuilder::new();
    let x = images(&mut b);
    let opts = Conv2dOptions::new(2, [3, 3]).name("c").strides([2, 2]).padding(Padding::Valid);
    let y = layers::conv2d_with(&mut b, x, &opts).expect("conv");
    // VALID, stride 2: (8 - 3) / 2 + 1 = 3.
    assert_eq!(b.graph().tensor_type(y).expect("type").shape, Shape(vec![None, Some(3), Some(3), Some(2)]));
}

#[test]
fn batch_norm_center_and_scale_variants() {
    for (center, scale, expect) in [
        (true, true, vec!["bn/beta", "bn/gamma"]),
        (true, false, vec!["bn/beta"]),
        (false, true, vec!["bn/gamma"]),
        (false, false, vec![]),
    ] {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(3)])).expect("x");
        let opts = BatchNormOptions::new().name("bn").center(center).scale(scale).epsilon(1e-5);
        let y = layers::batch_norm_with(&mut b, x, &opts).expect("bn");
        let trainable = b.graph().collection(keys::TRAINABLE_VARIABLES).to_vec();
        assert_eq!(trainable, expect, "center {center} scale {scale}");
        assert_eq!(vars(&b).len(), expect.len() + 2, "the moving statistics are always there");
        // The missing ones are constants of ones (gamma) and zeros (beta).
        let inputs = b.graph().inputs(y.node);
        for (slot, value) in [(1, 1.0), (2, 0.0)] {
            match &b.graph().node(inputs[slot].node).op {
                Op::Const { value: c } => assert!(c.data.iter().all(|v| v.0 == value)),
                Op::Variable { .. } => {}
                o => panic!("input {slot} is {o:?}"),
            }
        }
        assert_eq!(b.graph().collection(keys::UPDATE_OPS).len(), 2);
    }
}

/// `l2_regularizer(scale)` on the weights: one `scale * l2_loss(w)` term per
/// variable in `regularization_losses`, built once (not on reuse).
#[test]
fn l2_regularizer_adds_one_term_per_weight() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(4)])).expect("x");
    b.arg_scope(LayerDefaults::new().weights_regularizer(Regularizer::L2(5e-4)), |b| {
        let h = layers::dense_with(b, x, &DenseOptions::new(3).name("fc1"))?;
        b.reuse_scope(Reuse::Auto, |b| layers::dense_with(b, x, &DenseOptions::new(3).name("fc1")))?;
        layers::dense_with(b, h, &DenseOptions::new(2).name("fc2").weights_regularizer(Regularizer::None))
    })
    .expect("builds");
    let regs = b.graph().collection(keys::REGULARIZATION_LOSSES).to_vec();
    assert_eq!(regs, ["fc1/weights/Regularizer/l2_regularizer"]);
    let reg = b.graph().get(&regs[0]).expect("term");
    let scale = b.graph().node(b.graph().inputs(reg)[0].node).op.clone();
    match scale {
        Op::Const { value } => assert_eq!(value.data[0].0, 5e-4),
        o => panic!("{o:?}"),
    }
    assert!(b.regularization_loss().expect("sum").is_some());
}

fn err(r: Result<Tensor, GraphError>) -> String {
    match r {
        Err(e @ GraphError::LayerOption { .. }) => e.to_string(),
        other => panic!("expected a LayerOption error, got {other:?}"),
    }
}

#[test]
fn bad_options_are_typed_errors_naming_the_layer() {
    let mut b = GraphBuilder::new();
    let x = images(&mut b);
    let v = b.placeholder("v", DType::F32, Shape(vec![None, Some(4)])).expect("v");
    // A sequence of unknown length: dense applies to the last axis only
    // where every other dimension but the batch is known.
    let ragged = b.placeholder("ragged", DType::F32, Shape(vec![None, None, Some(4)])).expect("ragged");
    let cases = [
        (err(layers::conv2d_with(&mut b, x, &Conv2dOptions::new(0, [3, 3]).name("c0"))), "c0", "filters"),
        (err(layers::conv2d_with(&mut b, x, &Conv2dOptions::new(2, [0, 3]).name("c1"))), "c1", "kernel_size"),
        (
            err(layers::conv2d_with(&mut b, x, &Conv2dOptions::new(2, [3, 3]).strides([1, 0]).name("c2"))),
            "c2",
            "strides",
        ),
        (err(layers::conv2d_with(&mut b, v, &Conv2dOptions::new(2, [3, 3]).name("c3"))), "c3", "NHWC"),
        (err(layers::dense_with(&mut b, v, &DenseOptions::new(0).name("d0"))), "d0", "units"),
        (err(layers::dense_with(&mut b, ragged, &DenseOptions::new(2).name("d1"))), "d1", "but the batch known"),
        (
            err(layers::dense_with(
                &mut b,
                v,
                &DenseOptions::new(2).name("d2").weights_regularizer(Regularizer::L2(-1.0)),
            )),
            "d2",
            "weights_regularizer",
        ),
        (
            err(layers::dense_with(
                &mut b,
                v,
                &DenseOptions::new(2)
                    .name("d3")
                    .weights_initializer(Initializer::TruncatedNormal { mean: F32(0.0), stddev: F32(-0.1) }),
            )),
            "d3",
            "weights_initializer",
        ),
        (
            err(layers::dense_with(
                &mut b,
                v,
                &DenseOptions::new(2)
                    .name("d4")
                    .weights_initializer(Initializer::RandomNormal { mean: F32(0.0), stddev: F32(0.0) }),
            )),
            "d4",
            "random normal needs",
        ),
        (
            err(layers::dense_with(
                &mut b,
                v,
                &DenseOptions::new(2).name("d5").weights_initializer(Initializer::VarianceScaling {
                    scale: F32(-2.0),
                    mode: towers_graph::FanMode::FanIn,
                    distribution: towers_graph::Distribution::TruncatedNormal,
                }),
            )),
            "d5",
            "variance scaling needs",
        ),
        (err(layers::batch_norm_with(&mut b, v, &BatchNormOptions::new().name("bn0").decay(1.5))), "bn0", "decay"),
        (err(layers::batch_norm_with(&mut b, v, &BatchNormOptions::new().name("bn1").epsilon(0.0))), "bn1", "epsilon"),
        (err(layers::max_pool2d(&mut b, x, &Pool2dOptions::new([0, 2], [2, 2]).name("p0"))), "p0", "pool_size"),
        (err(layers::dropout_with(&mut b, v, &DropoutOptions::new(1.0).name("dr0"))), "dr0", "rate"),
    ];
    for (msg, layer, option) in cases {
        assert!(msg.contains(&format!("layer '{layer}'")) && msg.contains(option), "{msg}");
    }
    // Nothing was added to the graph by a refused layer.
    assert!(vars(&b).is_empty(), "{:?}", vars(&b));
    // The error names the full path inside scopes.
    let e = b
        .variable_scope("net", Reuse::No, |b| layers::dense_with(b, v, &DenseOptions::new(0)))
        .expect_err("zero units");
    assert!(e.to_string().contains("layer 'net/fully_connected'"), "{e}");
}

#[test]
fn short_forms_keep_their_names() {
    let mut b = GraphBuilder::new();
    let x = images(&mut b);
    let h = layers::conv2d(&mut b, "conv", x, 2, [3, 3], Padding::Same, Activation::Relu).expect("conv");
    let h = layers::batch_norm(&mut b, "bn", h, 0.9, 1e-3).expect("bn");
    let h = b.flatten(h).expect("flatten");
    layers::dense(&mut b, "fc", h, 3, Activation::None).expect("dense");
    assert_eq!(
        vars(&b),
        [
            "conv/weights",
            "conv/biases",
            "bn/beta",
            "bn/gamma",
            "bn/moving_mean",
            "bn/moving_variance",
            "fc/weights",
            "fc/biases"
        ]
    );
}
