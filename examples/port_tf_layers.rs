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

use towers::data::{mnist5k_split, Batcher};
use towers::prelude::*;
use towers::schedule::{Decay, Schedule};
use towers::train::evaluate;

/// The accuracy every port must reach on the mnist5k test split.
pub const TARGET: f64 = 0.97;

/// One training run.
#[derive(Debug, Clone)]
pub struct Run {
    /// The graph seed (`tf.set_random_seed`): weights, dropout, data order.
    pub seed: u64,
    pub epochs: usize,
    /// Stop after this many steps (the unit-size tests); `None`: all epochs.
    pub max_steps: Option<usize>,
    /// Compiled towers (`/gpu:0`, `/gpu:1`, ...; CPU devices on this machine).
    pub towers: u32,
}

impl Default for Run {
    fn default() -> Self {
        Run { seed: 0, epochs: 8, max_steps: None, towers: 2 }
    }
}

pub const BATCH: usize = 64;

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
    let (train, test) = mnist5k_split()?;
    let g = graph(r.seed)?;
    let mut opts =
        CompileOptions::new(Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false }, BATCH);
    opts.towers = (0..r.towers).map(Device::gpu).collect();
    let compiled = compile_train(&g, "loss", &opts)?;
    let eval = compile_eval(&g, &[("predictions", "predictions")], 500)?;
    let mut sess = Session::new(r.seed);
    sess.load("train", compiled.plan)?;
    sess.load("eval", eval.plan)?;
    let mut batcher = Batcher::new(&train, BATCH, r.seed)?;
    let total = r.epochs * batcher.batches_per_epoch();
    let total = r.max_steps.map_or(total, |m| m.min(total));
    let schedule = Schedule { base: 0.05, decay: Decay::Cosine { total, min: 0.0 }, warmup: 0 };
    for step in 0..total {
        sess.feed_with_f32("train", "images", |x| batcher.fill_images(x))??;
        sess.feed_with_i32("train", "labels", |y| batcher.fill_labels(y))??;
        batcher.advance();
        sess.write_variable("learning_rate", &[schedule.at(step)])?;
        sess.run("train")?;
        let loss = sess.fetch_f32("train", "loss")?[0];
        if !loss.is_finite() {
            return Err(format!("step {step}: loss {loss}").into());
        }
    }
    Ok(evaluate(&mut sess, &test, 500, "images", "labels")?)
}

/// `SEED [EPOCHS]` from the command line.
pub fn run_from_args() -> Result<Run, Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut r = Run::default();
    if let Some(s) = args.first() {
        r.seed = s.parse().map_err(|e| format!("SEED '{s}': {e}"))?;
    }
    if let Some(e) = args.get(1) {
        r.epochs = e.parse().map_err(|err| format!("EPOCHS '{e}': {err}"))?;
    }
    Ok(r)
}

fn main() -> ExitCode {
    let result = run_from_args().and_then(|r| run(&r).map(|acc| (r, acc)));
    match result {
        Ok((r, acc)) => {
            println!("port_tf_layers seed {} epochs {}: test accuracy {acc:.4}", r.seed, r.epochs);
            if acc >= TARGET {
                ExitCode::SUCCESS
            } else {
                eprintln!("port_tf_layers: test accuracy {acc:.4} is below {TARGET}");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("port_tf_layers: {e}");
            ExitCode::FAILURE
        }
    }
}
