//! Seed 000's hand-written tower loop ported to towers (walked in
//! `docs/porting.md`): `tf.split` of the batch, one `/gpu:i` device and
//! `tower_i` name scope per tower, variables reused after tower 0,
//! `compute_gradients` per tower, `average_gradients`, `apply_gradients`,
//! then `compile_manual` for what `sess.run` did; trained on the embedded
//! mnist5k.
//!
//! ```text
//! cargo run --release --example port_towers_loop [-- SEED [EPOCHS]]
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
    /// The graph seed (`tf.set_random_seed`): weights and data order.
    pub seed: u64,
    pub epochs: usize,
    /// Stop after this many steps (the unit-size tests); `None`: all epochs.
    pub max_steps: Option<usize>,
    /// Hand-built towers (`/gpu:0`, `/gpu:1`, ...; CPU devices on this machine).
    pub towers: u32,
}

impl Default for Run {
    fn default() -> Self {
        Run { seed: 0, epochs: 8, max_steps: None, towers: 2 }
    }
}

/// The global batch; each tower takes `BATCH / towers` rows.
pub const BATCH: usize = 64;

/// One tower's model (cifar10.py's `inference`, at MNIST's size):
///
/// ```text
/// def inference(images):
///   with tf.variable_scope('conv1') as scope:
///     kernel = _variable_with_weight_decay('weights', [5, 5, 1, 16], stddev=5e-2, wd=None)
///     conv = tf.nn.conv2d(images, kernel, [1, 1, 1, 1], padding='SAME')
///     biases = _variable_on_cpu('biases', [16], tf.constant_initializer(0.0))
///     conv1 = tf.nn.relu(tf.nn.bias_add(conv, biases), name=scope.name)
///   pool1 = tf.nn.max_pool(conv1, [1, 2, 2, 1], [1, 2, 2, 1], padding='SAME')
///   ... conv2 (32 filters), pool2 ...
///   with tf.variable_scope('local3'):  # weights with wd=5e-4
///     local3 = tf.nn.relu(tf.matmul(reshape, weights) + biases)
///   with tf.variable_scope('softmax_linear'):
///     softmax_linear = tf.add(tf.matmul(local3, weights), biases)
/// ```
pub fn inference(b: &mut GraphBuilder, images: Tensor) -> Result<Tensor, GraphError> {
    let net = layers::conv2d(b, "conv1", images, 16, [5, 5], Padding::Same, Activation::Relu)?;
    let net = b.max_pool(net, [2, 2], [2, 2], Padding::Same)?;
    let net = layers::conv2d(b, "conv2", net, 32, [5, 5], Padding::Same, Activation::Relu)?;
    let net = b.max_pool(net, [2, 2], [2, 2], Padding::Same)?;
    let net = b.flatten(net)?;
    let net = b.arg_scope(LayerDefaults::new().weights_regularizer(Regularizer::L2(5e-4)), |b| {
        layers::dense(b, "local3", net, 256, Activation::Relu)
    })?;
    layers::dense(b, "softmax_linear", net, 10, Activation::None)
}

/// cifar10_multi_gpu_train.py's `tower_loss`: the mean cross-entropy plus
/// the weight decay (`tf.add_n(tf.get_collection('losses', scope))`).
fn tower_loss(b: &mut GraphBuilder, images: Tensor, labels: Tensor) -> Result<Tensor, GraphError> {
    let logits = inference(b, images)?;
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, labels)?;
    let loss = b.reduce_mean(xent, &[0], false)?;
    match b.regularization_loss()? {
        Some(reg) => b.add(loss, reg),
        None => Ok(loss),
    }
}

/// The training graph, built as seed 000's `train()`:
///
/// ```text
/// images, labels = ...                        # on /cpu:0
/// images_splits = tf.split(images, FLAGS.num_gpus)
/// labels_splits = tf.split(labels, FLAGS.num_gpus)
/// tower_grads = []
/// with tf.variable_scope(tf.get_variable_scope()):
///   for i in range(FLAGS.num_gpus):
///     with tf.device('/gpu:%d' % i):
///       with tf.name_scope('tower_%d' % i) as scope:
///         loss = tower_loss(scope, images_splits[i], labels_splits[i])
///         tf.get_variable_scope().reuse_variables()
///         grads = opt.compute_gradients(loss)
///         tower_grads.append(grads)
/// grads = average_gradients(tower_grads)
/// train_op = opt.apply_gradients(grads, global_step=global_step)
/// ```
///
/// Returns the graph and the name of the towers' mean loss.
pub fn train_graph(seed: u64, towers: u32, opt: &Optimizer) -> Result<(Graph, String), Box<dyn Error>> {
    let n = towers.max(1) as usize;
    if BATCH % n != 0 {
        return Err(format!("{n} towers do not divide the batch of {BATCH}").into());
    }
    let sizes = vec![BATCH / n; n];
    let mut b = GraphBuilder::with_seed(seed);
    let (images, labels) = b.device("/cpu:0", |b| {
        let x = b.placeholder("images", DType::F32, Shape::known(&[BATCH, 28, 28, 1]))?;
        let y = b.placeholder("labels", DType::I32, Shape::known(&[BATCH]))?;
        Ok::<_, GraphError>((b.split(x, 0, &sizes)?, b.split(y, 0, &sizes)?))
    })?;
    let (mut tower_grads, mut tower_losses) = (Vec::new(), Vec::new());
    for i in 0..n {
        // Tower 0 creates the variables, the others reuse them.
        let reuse = if i == 0 { Reuse::No } else { Reuse::Yes };
        let loss = b.reuse_scope(reuse, |b| {
            b.device(&format!("/gpu:{i}"), |b| {
                b.name_scope(&format!("tower_{i}"), |b| tower_loss(b, images[i], labels[i]))
            })
        })?;
        let vars = b.graph().trainable_variables();
        tower_grads.push(gradients(b.graph_mut(), loss, &vars)?.grads);
        tower_losses.push(vec![("loss".to_string(), loss)]);
    }
    let weights = vec![1.0 / n as f32; n];
    let g = b.graph_mut();
    let avg = average_gradients(g, &tower_grads, &weights)?;
    let loss = average_gradients(g, &tower_losses, &weights)?;
    apply_gradients(g, &avg, opt)?;
    let loss = g.node(loss[0].1.node).name.clone();
    Ok((b.finish(), loss))
}

/// The evaluation graph: the same `inference` on a batch of any size; its
/// variables are the training graph's, by name, in one session.
pub fn eval_graph(seed: u64) -> Result<Graph, GraphError> {
    let mut b = GraphBuilder::with_seed(seed);
    let images = b.placeholder("images", DType::F32, Shape(vec![None, Some(28), Some(28), Some(1)]))?;
    let logits = inference(&mut b, images)?;
    let pred = b.argmax(logits, 1)?;
    b.identity(pred, "predictions")?;
    Ok(b.finish())
}

/// Train and return the test accuracy.
pub fn run(r: &Run) -> Result<f64, Box<dyn Error>> {
    let (train, test) = mnist5k_split()?;
    let opt = Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false };
    let (g, loss) = train_graph(r.seed, r.towers, &opt)?;
    let compiled = compile_manual(&g, &loss, &CompileOptions::new(opt, BATCH))?;
    let eval = compile_eval(&eval_graph(r.seed)?, &[("predictions", "predictions")], 500)?;
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
            println!("port_towers_loop seed {} epochs {}: test accuracy {acc:.4}", r.seed, r.epochs);
            if acc >= TARGET {
                ExitCode::SUCCESS
            } else {
                eprintln!("port_towers_loop: test accuracy {acc:.4} is below {TARGET}");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("port_towers_loop: {e}");
            ExitCode::FAILURE
        }
    }
}
