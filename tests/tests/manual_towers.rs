//! The manual TF1 style still works: a user builds the towers by hand as
//! cifar10_multi_gpu_train.py did (one global batch `split` on the CPU, a
//! `tower_i` name scope and `/gpu:i` device per tower, variables created on
//! `/cpu:0` by tower 0 and reused by the others, `gradients` per tower,
//! `average_gradients`, `apply_gradients` on the CPU), and the plan runs to
//! the same results as the compiler's towers and as one device.

use towers::compiler::{compile_train, CompileOptions};
use towers::models::{build, ModelKind, ModelSpec};
use towers_codegen::{lower, LowerOptions, Mode};
use towers_graph::layers::Activation;
use towers_graph::{
    keys, DType, Device, Graph, GraphBuilder, GraphError, Initializer, Optimizer, Reuse, Shape, Tensor, F32,
};
use towers_passes::{
    apply_gradients, average_gradients, gradients, BindBatch, CompileState, PassManager, Place, ScheduleStreams,
    TensorRef, VarPlacement,
};
use towers_runtime::Session;
use towers_tests::batches;

const BATCH: usize = 24;

/// `_variable_on_cpu`: the variable lives on the CPU whatever the tower scope.
fn dense_on_cpu(
    b: &mut GraphBuilder,
    name: &str,
    x: Tensor,
    units: usize,
    act: Activation,
) -> Result<Tensor, GraphError> {
    let in_dim = b.graph().tensor_type(x)?.shape.dim(1).unwrap_or(0);
    b.variable_scope(name, Reuse::No, |b| {
        let (w, bias) = b.device("/cpu:0", |b| {
            let w = b.get_variable("weights", [in_dim, units], Initializer::GlorotUniform)?;
            let bias = b.get_variable("biases", [units], Initializer::Zeros)?;
            Ok::<_, GraphError>((w, bias))
        })?;
        let y = b.matmul(x, w)?;
        let y = b.bias_add(y, bias)?;
        match act {
            Activation::Relu => b.relu(y),
            _ => Ok(y),
        }
    })
}

/// The towers, by hand. Returns the graph and the loss node's name.
fn manual_graph(seed: u64, opt: &Optimizer) -> Result<(Graph, String), Box<dyn std::error::Error>> {
    let mut b = GraphBuilder::with_seed(seed);
    let (images, labels) = b.device("/cpu:0", |b| {
        let x = b.placeholder("images", DType::F32, Shape::known(&[BATCH, 8, 8, 1]))?;
        let y = b.placeholder("labels", DType::I32, Shape::known(&[BATCH]))?;
        Ok::<_, GraphError>((b.split(x, 0, &[BATCH / 2, BATCH / 2])?, b.split(y, 0, &[BATCH / 2, BATCH / 2])?))
    })?;
    let mut tower_grads = Vec::new();
    let mut tower_losses = Vec::new();
    for i in 0..2 {
        let reuse = if i == 0 { Reuse::No } else { Reuse::Yes };
        let loss = b.reuse_scope(reuse, |b| {
            b.device(&format!("/gpu:{i}"), |b| {
                b.name_scope(&format!("tower_{i}"), |b| {
                    let logits = b.variable_scope("MLP", Reuse::No, |b| {
                        let h = b.flatten(images[i])?;
                        let h = dense_on_cpu(b, "fc1", h, 16, Activation::Relu)?;
                        dense_on_cpu(b, "logits", h, 10, Activation::None)
                    })?;
                    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, labels[i])?;
                    b.reduce_mean(xent, &[0], false)
                })
            })
        })?;
        let vars = b.graph().trainable_variables();
        let g = gradients(b.graph_mut(), loss, &vars)?;
        tower_grads.push(g.grads);
        tower_losses.push(vec![("loss".to_string(), loss)]);
    }
    let g = b.graph_mut();
    let avg = average_gradients(g, &tower_grads, &[0.5, 0.5])?;
    let loss = average_gradients(g, &tower_losses, &[0.5, 0.5])?;
    apply_gradients(g, &avg, opt)?;
    let loss_name = g.node(loss[0].1.node).name.clone();
    Ok((b.finish(), loss_name))
}

fn run_manual(opt: &Optimizer, seed: u64, data: &[(Vec<f32>, Vec<i32>)]) -> (Vec<f32>, Vec<(String, Vec<f32>)>) {
    let (mut g, loss) = manual_graph(seed, opt).expect("the manual towers build");
    assert!(g.collection(keys::TRAIN_OP).len() == 1);
    let mut st = CompileState::default();
    let train_op = g.collection(keys::TRAIN_OP).first().cloned();
    let program = g.program_mut();
    program.fetches.insert("loss".into(), TensorRef::new(loss, 0));
    program.train_op = train_op;
    let mut pm = PassManager::new()
        .verify(true)
        .add(BindBatch::new(BATCH))
        .add(Place { strategy: VarPlacement::Cpu, devices: vec![Device::gpu(0), Device::gpu(1)] })
        .add(ScheduleStreams);
    pm.run(&mut g, &mut st).expect("places and schedules");
    // Everything landed where the user's scopes put it.
    for id in g.node_ids() {
        let n = g.node(id);
        if n.name.starts_with("tower_1/") && !matches!(n.op, towers_graph::Op::Copy) {
            assert_eq!(n.device, Some(Device::gpu(1)), "{}", n.name);
        }
        if matches!(n.op, towers_graph::Op::Variable { .. }) {
            assert_eq!(n.device, Some(Device::CPU0), "{}", n.name);
        }
    }
    let plan = lower(&g, &LowerOptions::new(Mode::Train, "train")).expect("lowers");
    let mut sess = Session::new(seed);
    sess.load("train", plan).expect("loads");
    let mut losses = Vec::new();
    for (x, y) in data {
        sess.feed("train", "images", x).expect("feed");
        sess.feed("train", "labels", y).expect("feed");
        sess.run("train").expect("runs");
        losses.push(sess.fetch::<f32>("train", "loss").expect("loss")[0]);
    }
    let vars = ["MLP/fc1/weights", "MLP/fc1/biases", "MLP/logits/weights", "MLP/logits/biases"]
        .iter()
        .map(|v| (v.to_string(), sess.variable::<f32>(v).expect("variable")))
        .collect();
    (losses, vars)
}

#[test]
fn hand_built_towers_match_the_compiler_and_one_device() {
    let opt = Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false };
    let data = batches(BATCH, 3, 7);
    let (manual_losses, manual_vars) = run_manual(&opt, 5, &data);

    let mut spec = ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10);
    spec.hidden = vec![16];
    spec.seed = 5;
    let model = build(&spec).expect("model");
    for towers in [vec![], vec![Device::gpu(0), Device::gpu(1)]] {
        let mut o = CompileOptions::new(opt.clone(), BATCH);
        o.towers = towers.clone();
        let c = compile_train(&model.graph, &model.loss, &o).expect("compiles");
        let mut sess = Session::new(5);
        sess.load("train", c.plan).expect("loads");
        for (step, (x, y)) in data.iter().enumerate() {
            sess.feed("train", "images", x).expect("feed");
            sess.feed("train", "labels", y).expect("feed");
            sess.run("train").expect("runs");
            let l = sess.fetch::<f32>("train", "loss").expect("loss")[0];
            assert!((l - manual_losses[step]).abs() <= 2e-5 * l.abs().max(1.0), "{} towers step {step}", towers.len());
        }
        for (name, v) in &manual_vars {
            let w = sess.variable::<f32>(name).expect("variable");
            for (a, b) in v.iter().zip(&w) {
                assert!((a - b).abs() <= 2e-5 * b.abs().max(1.0), "{name}: manual {a} vs compiler {b}");
            }
        }
    }
}
