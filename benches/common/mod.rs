//! The benchmark models, shared by the step and the multi-process
//! benchmarks: the MLP and the anchor convnet of
//! ../shared/bench/anchors/common.py on 28x28 inputs, with their forward
//! FLOPs per example as the anchors count them.

use towers::graph::layers::{self, Activation};
use towers::graph::{DType, Graph, GraphBuilder, Padding, Reuse, Shape};
use towers::models::{build, ModelKind, ModelSpec};
use towers::runtime::Session;

pub struct Model {
    pub graph: Graph,
    pub name: &'static str,
    /// Forward multiply-add FLOPs per example (2 per MAC), as the anchors count them.
    pub fwd_flops: f64,
}

pub fn mlp(hidden: &[usize], name: &'static str) -> Model {
    mlp_with(hidden, name, towers::graph::layers::Activation::Relu)
}

/// The MLP with another hidden activation (swish: the e-graph's fusion at work).
pub fn mlp_with(hidden: &[usize], name: &'static str, act: towers::graph::layers::Activation) -> Model {
    let mut s = ModelSpec::new(ModelKind::Mlp, [28, 28, 1], 10);
    s.hidden = hidden.to_vec();
    s.activation = act;
    let m = build(&s).expect("mlp builds");
    let mut dims = vec![784];
    dims.extend_from_slice(hidden);
    dims.push(10);
    let fwd = dims.windows(2).map(|w| 2.0 * (w[0] * w[1]) as f64).sum();
    Model { graph: m.graph, name, fwd_flops: fwd }
}

pub fn anchor_convnet() -> Model {
    let mut b = GraphBuilder::with_seed(0);
    let build = |b: &mut GraphBuilder| -> Result<(), towers::graph::GraphError> {
        let x = b.placeholder("images", DType::F32, Shape(vec![None, Some(28), Some(28), Some(1)]))?;
        let y = b.placeholder("labels", DType::I32, Shape(vec![None]))?;
        let logits = b.variable_scope("ConvNet", Reuse::No, |b| {
            let h = layers::conv2d(b, "conv_1", x, 12, [5, 5], Padding::Valid, Activation::Relu)?;
            let h = b.max_pool(h, [2, 2], [2, 2], Padding::Valid)?;
            let h = layers::conv2d(b, "conv_2", h, 24, [3, 3], Padding::Valid, Activation::Relu)?;
            let h = b.max_pool(h, [2, 2], [2, 2], Padding::Valid)?;
            let h = b.flatten(h)?;
            let h = layers::dense(b, "fc", h, 100, Activation::Relu)?;
            layers::dense(b, "logits", h, 10, Activation::None)
        })?;
        let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y)?;
        let mean = b.reduce_mean(xent, &[0], false)?;
        b.identity(mean, "loss")?;
        Ok(())
    };
    build(&mut b).expect("convnet builds");
    // conv1 24*24*12*25, conv2 10*10*24*108, fc 600*100, logits 100*10 MACs.
    let macs = 24.0 * 24.0 * 12.0 * 25.0 + 10.0 * 10.0 * 24.0 * 108.0 + 60000.0 + 1000.0;
    Model { graph: b.finish(), name: "conv", fwd_flops: 2.0 * macs }
}

/// Run the loaded, fed program "train" 10 times untimed, then `steps` times
/// with profiling on: each step's wall time in ms, in run order.
pub fn timed_steps(sess: &mut Session, steps: usize) -> Vec<f64> {
    for _ in 0..10 {
        sess.run("train").expect("step");
    }
    sess.set_profiling("train", true).expect("profiling");
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let t = std::time::Instant::now();
        sess.run("train").expect("step");
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times
}
