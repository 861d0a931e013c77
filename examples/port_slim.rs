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
            println!("port_slim seed {} epochs {}: test accuracy {acc:.4}", r.seed, r.epochs);
            if acc >= TARGET {
                ExitCode::SUCCESS
            } else {
                eprintln!("port_slim: test accuracy {acc:.4} is below {TARGET}");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("port_slim: {e}");
            ExitCode::FAILURE
        }
    }
}
