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

use towers::prelude::*;

#[path = "common/mod.rs"]
mod common;
pub use common::{Run, BATCH};

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
    if !BATCH.is_multiple_of(n) {
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
    let opt = Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false };
    let (g, loss) = train_graph(r.seed, r.towers, &opt)?;
    let compiled = compile_manual(&g, &loss, &CompileOptions::new(opt, BATCH))?;
    let eval = compile_eval(&eval_graph(r.seed)?, &[("predictions", "predictions")], 500)?;
    common::train_and_test(r, compiled.plan, eval.plan)
}

fn main() -> ExitCode {
    common::main_of("port_towers_loop", run)
}
