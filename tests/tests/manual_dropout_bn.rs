//! Seed 000's hand-written tower loop with dropout and batch norm, compiled
//! by `compile_manual`, equals the compiler's automatic towers bit for bit:
//! every loss and every variable (moving averages included) after each
//! step. What makes it so: dropout's op seed derives from the graph seed and
//! the op's name without `tower_<i>/`, its rows from the batch split it is
//! built on; the towers' moving-average updates merge into one per variable
//! (their mean, as `BnUpdates::Mean`); both graphs' variables start from the
//! graph seed, whatever the sessions' seeds.

use towers::prelude::*;
use towers_graph::GraphError;
use towers_tests::batches;

const BATCH: usize = 24;
const SEED: u64 = 11;
const VARS: [&str; 8] = [
    "MLP/fc1/weights",
    "MLP/fc1/biases",
    "MLP/bn/beta",
    "MLP/bn/gamma",
    "MLP/bn/moving_mean",
    "MLP/bn/moving_variance",
    "MLP/logits/weights",
    "MLP/logits/biases",
];

/// The model of one tower (or of the whole batch): dense, batch norm, relu,
/// dropout, dense, mean cross-entropy.
fn tower(b: &mut GraphBuilder, images: Tensor, labels: Tensor) -> Result<Tensor, GraphError> {
    b.variable_scope("MLP", Reuse::Auto, |b| {
        let h = b.flatten(images)?;
        let w = b.get_variable("fc1/weights", [64, 16], Initializer::GlorotUniform)?;
        let bias = b.get_variable("fc1/biases", [16], Initializer::Zeros)?;
        let h = b.matmul(h, w)?;
        let h = b.bias_add(h, bias)?;
        let h = layers::batch_norm(b, "bn", h, 0.9, 1e-3)?;
        let h = b.relu(h)?;
        let h = b.dropout(h, 0.3)?;
        let w = b.get_variable("logits/weights", [16, 10], Initializer::GlorotUniform)?;
        let bias = b.get_variable("logits/biases", [10], Initializer::Zeros)?;
        let logits = b.matmul(h, w)?;
        let logits = b.bias_add(logits, bias)?;
        let xent = b.sparse_softmax_cross_entropy_with_logits(logits, labels)?;
        b.reduce_mean(xent, &[0], false)
    })
}

/// cifar10_multi_gpu_train.py's loop: split on the CPU, one `tower_i` name
/// scope and `/gpu:i` device per tower, variables reused after tower 0,
/// gradients per tower, averaged, applied once.
fn hand_built(opt: &Optimizer) -> Result<(Graph, String), Box<dyn std::error::Error>> {
    let mut b = GraphBuilder::with_seed(SEED);
    let (images, labels) = b.device("/cpu:0", |b| {
        let x = b.placeholder("images", DType::F32, Shape::known(&[BATCH, 8, 8, 1]))?;
        let y = b.placeholder("labels", DType::I32, Shape::known(&[BATCH]))?;
        Ok::<_, GraphError>((b.split(x, 0, &[BATCH / 2, BATCH / 2])?, b.split(y, 0, &[BATCH / 2, BATCH / 2])?))
    })?;
    let (mut tower_grads, mut tower_losses) = (Vec::new(), Vec::new());
    for i in 0..2 {
        let reuse = if i == 0 { Reuse::No } else { Reuse::Yes };
        let loss = b.reuse_scope(reuse, |b| {
            b.device(&format!("/gpu:{i}"), |b| b.name_scope(&format!("tower_{i}"), |b| tower(b, images[i], labels[i])))
        })?;
        let vars = b.graph().trainable_variables();
        tower_grads.push(gradients(b.graph_mut(), loss, &vars)?.grads);
        tower_losses.push(vec![("loss".to_string(), loss)]);
    }
    let g = b.graph_mut();
    let avg = average_gradients(g, &tower_grads, &[0.5, 0.5])?;
    let loss = average_gradients(g, &tower_losses, &[0.5, 0.5])?;
    apply_gradients(g, &avg, opt)?;
    let loss = g.node(loss[0].1.node).name.clone();
    Ok((b.finish(), loss))
}

/// The same model written once, for the compiler's towers.
fn automatic() -> Result<(Graph, String), GraphError> {
    let mut b = GraphBuilder::with_seed(SEED);
    let x = b.placeholder("images", DType::F32, [None, Some(8), Some(8), Some(1)])?;
    let y = b.placeholder("labels", DType::I32, [None])?;
    let loss = tower(&mut b, x, y)?;
    let g = b.finish();
    let name = g.node(loss.node).name.clone();
    Ok((g, name))
}

/// Train `data` under `plan`, in a session of `session_seed`; the losses
/// and the variables' bits after the last step.
fn train(plan: towers::codegen::Plan, session_seed: u64, data: &[(Vec<f32>, Vec<i32>)]) -> (Vec<u32>, Vec<Vec<u32>>) {
    let mut s = Session::new(session_seed);
    s.load("train", plan).expect("loads");
    let mut losses = Vec::new();
    for (x, y) in data {
        s.feed("train", "images", x).expect("feed");
        s.feed("train", "labels", y).expect("feed");
        s.run("train").expect("runs");
        losses.push(s.fetch::<f32>("train", "loss").expect("loss")[0].to_bits());
    }
    let vars = VARS.iter().map(|v| s.variable::<f32>(v).expect(v).iter().map(|x| x.to_bits()).collect()).collect();
    (losses, vars)
}

#[test]
fn seed_000_style_with_dropout_and_batch_norm_equals_the_automatic_towers_bit_for_bit() {
    let opt = Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false };
    let data = batches(BATCH, 4, 3);

    let (g, loss) = hand_built(&opt).expect("the hand-built towers build");
    let mut o = CompileOptions::new(opt.clone(), BATCH);
    o.bn_updates = BnUpdates::Mean;
    let manual = compile_manual(&g, &loss, &o).expect("compile_manual");
    // One moving-average update per variable, reading the towers' mean.
    let updates =
        manual.graph.node_ids().into_iter().filter(|&i| manual.graph.node(i).op.type_name() == "AssignMovingAvg");
    assert_eq!(updates.count(), 2, "one update per moving average");
    let (manual_losses, manual_vars) = train(manual.plan, 1, &data);

    let (model, loss) = automatic().expect("the model builds");
    o.towers = vec![Device::gpu(0), Device::gpu(1)];
    o.fold_tower_matmuls = false;
    o.merge_tower_duplicates = false;
    let auto = compile_train(&model, &loss, &o).expect("compile_train");
    // Another session seed: the graph seed decides the initial values.
    let (auto_losses, auto_vars) = train(auto.plan, 2, &data);

    assert_eq!(manual_losses, auto_losses, "losses (bits) per step");
    for ((name, m), a) in VARS.iter().zip(&manual_vars).zip(&auto_vars) {
        assert_eq!(m, a, "{name} (bits)");
    }
    // The masks differ between the towers (rows 0.. and 12.. of the batch).
    let ops = |g: &Graph| -> Vec<String> {
        let mut v: Vec<String> = g
            .node_ids()
            .into_iter()
            .filter(|&i| g.node(i).op.type_name() == "Dropout")
            .map(|i| format!("{:?}", g.node(i).op))
            .collect();
        v.sort();
        v
    };
    assert_eq!(ops(&manual.graph), ops(&auto.graph), "the same seeds and first rows");
    assert!(ops(&manual.graph)[1].contains("first_row: 12"), "{:?}", ops(&manual.graph));
}

/// TF1's choice for hand-built towers: the first tower's statistics alone
/// update the moving averages; the automatic towers' `BnUpdates::Tower0`.
#[test]
fn tower0_updates_match_too() {
    let opt = Optimizer::Sgd { lr: F32(0.1) };
    let data = batches(BATCH, 2, 5);
    let (g, loss) = hand_built(&opt).expect("builds");
    let mut o = CompileOptions::new(opt.clone(), BATCH);
    o.bn_updates = BnUpdates::Tower0;
    let (ml, mv) = train(compile_manual(&g, &loss, &o).expect("compile_manual").plan, 1, &data);
    let (model, loss) = automatic().expect("builds");
    o.towers = vec![Device::gpu(0), Device::gpu(1)];
    o.fold_tower_matmuls = false;
    o.merge_tower_duplicates = false;
    let (al, av) = train(compile_train(&model, &loss, &o).expect("compile_train").plan, 1, &data);
    assert_eq!(ml, al);
    assert_eq!(mv, av);
}

/// A hand-built graph without `apply_gradients` is an error saying so.
#[test]
fn compile_manual_without_a_train_op_says_what_is_missing() {
    let (model, loss) = automatic().expect("builds");
    let e = compile_manual(&model, &loss, &CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no train op") && e.contains("apply_gradients"), "{e}");
}
