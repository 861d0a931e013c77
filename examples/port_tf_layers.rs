//! Seed 003's `tf.layers` convnet ported to towers (walked in
//! `docs/porting.md`): the slim model's twin with `tf.layers`' automatic
//! names (`conv2d`, `conv2d_1`, `batch_normalization`, `dense`, ... with
//! `kernel`/`bias`), batch norm with momentum 0.9 after bias-free
//! convolutions, l2 5e-4, truncated-normal weights with stddev 0.01, SAME
//! convolutions, dropout; trained with 2 towers on the embedded mnist5k.
//!
//! ```text
//! cargo run --release --example port_tf_layers [-- SEED [EPOCHS]]
//! ```
//! Prints the test accuracy and exits with status 1 below 0.97.

use std::error::Error;
use std::process::ExitCode;

use towers::prelude::*;

#[path = "common/mod.rs"]
mod common;
pub use common::{Run, BATCH};

/// The model. The TF1 it ports (seed 003's `tf.layers` variant; TF1 repeats
/// the initializer and regularizer in every call, towers takes them once
/// from an `arg_scope`):
///
/// ```text
/// init = tf.truncated_normal_initializer(stddev=0.01)
/// reg = tf.contrib.layers.l2_regularizer(5e-4)
/// net = tf.layers.conv2d(images, 16, 5, padding='same', use_bias=False,
///                        kernel_initializer=init, kernel_regularizer=reg)      # conv2d/kernel
/// net = tf.nn.relu(tf.layers.batch_normalization(net, momentum=0.9, training=training))
/// net = tf.layers.max_pooling2d(net, 2, 2)
/// net = tf.layers.conv2d(net, 32, 5, padding='same', use_bias=False,
///                        kernel_initializer=init, kernel_regularizer=reg)      # conv2d_1/kernel
/// net = tf.nn.relu(tf.layers.batch_normalization(net, momentum=0.9, training=training))
/// net = tf.layers.max_pooling2d(net, 2, 2)
/// net = tf.layers.flatten(net)
/// net = tf.layers.dense(net, 256, activation=tf.nn.relu,
///                       kernel_initializer=init, kernel_regularizer=reg)       # dense/kernel
/// net = tf.layers.dropout(net, rate=0.5, training=training)
/// logits = tf.layers.dense(net, 10, kernel_initializer=init,
///                          kernel_regularizer=reg)                             # dense_1/kernel
/// ```
pub fn model(b: &mut GraphBuilder, images: Tensor) -> Result<Tensor, GraphError> {
    let defaults = LayerDefaults::new()
        .naming(Naming::TfLayers)
        .padding(Padding::Same)
        .weights_initializer(Initializer::TruncatedNormal { mean: F32(0.0), stddev: F32(0.01) })
        .weights_regularizer(Regularizer::L2(5e-4))
        .batch_norm(BatchNormOptions::new().decay(0.9));
    b.arg_scope(defaults, |b| {
        let mut net = images;
        for filters in [16, 32] {
            net = layers::conv2d_with(b, net, &Conv2dOptions::new(filters, [5, 5]).use_bias(false))?;
            net = layers::batch_norm_with(b, net, &BatchNormOptions::new())?;
            net = b.relu(net)?;
            net = layers::max_pool2d(b, net, &Pool2dOptions::new([2, 2], [2, 2]))?;
        }
        let net = b.flatten(net)?;
        let net = layers::dense_with(b, net, &DenseOptions::new(256).activation(Activation::Relu))?;
        let net = layers::dropout_with(b, net, &DropoutOptions::new(0.5))?;
        layers::dense_with(b, net, &DenseOptions::new(10))
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
    common::main_of("port_tf_layers", run)
}
