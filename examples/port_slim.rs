//! Seed 003's slim convnet ported to towers (walked in `docs/porting.md`):
//! batch norm with decay 0.9 as every layer's normalizer, l2 weight decay
//! 5e-4, truncated-normal weights with stddev 0.01, SAME convolutions,
//! dropout; trained with 2 towers on the embedded mnist5k.
//!
//! ```text
//! cargo run --release --example port_slim [-- SEED [EPOCHS]]
//! ```
//! Prints the test accuracy and exits with status 1 below 0.97.

use std::error::Error;
use std::process::ExitCode;

use towers::prelude::*;

#[path = "common/mod.rs"]
mod common;
pub use common::{Run, BATCH};

/// The model. The TF1 it ports (seed 003):
///
/// ```text
/// with slim.arg_scope([slim.conv2d, slim.fully_connected],
///                     normalizer_fn=slim.batch_norm,
///                     normalizer_params={'decay': 0.9, 'is_training': is_training},
///                     weights_initializer=tf.truncated_normal_initializer(stddev=0.01),
///                     weights_regularizer=slim.l2_regularizer(5e-4)):
///     net = slim.conv2d(images, 16, [5, 5], scope='conv1')         # SAME, ReLU: slim's defaults
///     net = slim.max_pool2d(net, [2, 2], scope='pool1')
///     net = slim.conv2d(net, 32, [5, 5], scope='conv2')
///     net = slim.max_pool2d(net, [2, 2], scope='pool2')
///     net = slim.flatten(net)
///     net = slim.fully_connected(net, 256, scope='fc3')
///     net = slim.dropout(net, 0.5, is_training=is_training, scope='dropout3')
///     logits = slim.fully_connected(net, 10, activation_fn=None,
///                                   normalizer_fn=None, scope='fc4')
/// ```
pub fn model(b: &mut GraphBuilder, images: Tensor) -> Result<Tensor, GraphError> {
    let defaults = LayerDefaults::new()
        .normalizer(Normalizer::BatchNorm(BatchNormOptions::new().decay(0.9)))
        .weights_initializer(Initializer::TruncatedNormal { mean: F32(0.0), stddev: F32(0.01) })
        .weights_regularizer(Regularizer::L2(5e-4));
    b.arg_scope(defaults, |b| {
        let net = layers::conv2d_with(b, images, &Conv2dOptions::new(16, [5, 5]).name("conv1"))?;
        let net = layers::max_pool2d(b, net, &Pool2dOptions::new([2, 2], [2, 2]).name("pool1"))?;
        let net = layers::conv2d_with(b, net, &Conv2dOptions::new(32, [5, 5]).name("conv2"))?;
        let net = layers::max_pool2d(b, net, &Pool2dOptions::new([2, 2], [2, 2]).name("pool2"))?;
        let net = b.flatten(net)?;
        let net = layers::dense_with(b, net, &DenseOptions::new(256).name("fc3"))?;
        let net = layers::dropout_with(b, net, &DropoutOptions::new(0.5).name("dropout3"))?;
        let last = DenseOptions::new(10).name("fc4").activation(Activation::None).normalizer(Normalizer::None);
        layers::dense_with(b, net, &last)
    })
}

/// The whole graph: placeholders, the model, `tf.losses.get_total_loss()`
/// (mean cross-entropy plus the regularization losses) and the predictions.
pub fn graph(seed: u64) -> Result<Graph, GraphError> {
    let mut b = GraphBuilder::with_seed(seed);
    let images = b.placeholder("images", DType::F32, Shape(vec![None, Some(28), Some(28), Some(1)]))?;
    let labels = b.placeholder("labels", DType::I32, Shape(vec![None]))?;
    let logits = model(&mut b, images)?;
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, labels)?;
    let mut loss = b.reduce_mean(xent, &[0], false)?;
    if let Some(reg) = b.regularization_loss()? {
        loss = b.add(loss, reg)?;
    }
    b.identity(loss, "loss")?;
    let pred = b.argmax(logits, 1)?;
    b.identity(pred, "predictions")?;
    Ok(b.finish())
}

/// Train and return the test accuracy.
pub fn run(r: &Run) -> Result<f64, Box<dyn Error>> {
    let g = graph(r.seed)?;
    let mut opts =
        CompileOptions::new(Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false }, BATCH);
    opts.towers = (0..r.towers).map(Device::gpu).collect();
    let compiled = compile_train(&g, "loss", &opts)?;
    let eval = compile_eval(&g, &[("predictions", "predictions")], 500)?;
    common::train_and_test(r, compiled.plan, eval.plan)
}

fn main() -> ExitCode {
    common::main_of("port_slim", run)
}
