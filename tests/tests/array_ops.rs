//! The array ops of issue 22 in training: a model whose labels are one-hot
//! encoded in the graph (`one_hot` + `softmax_cross_entropy_with_logits`)
//! and whose forward pass runs `expand_dims`, `tile`, `pad`, `transpose`,
//! `gather` (rows of an embedding picked by indices computed from each
//! example), `stack` and `squeeze`, trained through `compile_train` on one
//! device and on two towers. The one-hot labels are computed per tower from
//! the tower's rows, so the towers' update must equal the one device's
//! (exactness, up to float reassociation in the reductions). Also: an
//! index out of range is a run-time error in TF's words, not a panic.

use towers::prelude::*;
use towers_graph::GraphError;
use towers_tests::batches;

const BATCH: usize = 32;

/// The model and its loss's name.
fn model() -> Result<(Graph, String), GraphError> {
    let mut b = GraphBuilder::with_seed(11);
    let x = b.placeholder("images", DType::F32, [None, Some(8), Some(8), Some(1)])?;
    let y = b.placeholder("labels", DType::I32, [None])?;
    let logits = b.variable_scope("Net", Reuse::No, |b| {
        let flat = b.flatten(x)?;
        let h = layers::dense(b, "fc1", flat, 16, Activation::Relu)?;
        // [N,16] -> [N,1,16] -> [N,2,16] -> [N,3,16] (a zero row) -> [N,16,3] -> [N,16].
        let e = b.expand_dims(h, 1)?;
        let t = b.tile(e, &[1, 2, 1])?;
        let p = b.pad(t, &[[0, 0], [0, 1], [0, 0]], 0.0)?;
        let tr = b.transpose(p, &[0, 2, 1])?;
        let s = b.reduce_sum(tr, &[2], false)?;
        // An embedding row per example, picked by the brightest of its first 12 pixels.
        let head = b.slice(flat, &[0, 0], &[-1, 12])?;
        let idx = b.argmax(head, 1)?;
        let emb =
            b.get_variable("embedding", vec![12, 16], Initializer::RandomUniform { min: F32(-0.5), max: F32(0.5) })?;
        let g = b.gather(emb, idx, 0)?;
        // [N,2,16] -> mean over the pair -> [N,1,16] -> [N,16].
        let st = b.stack(&[s, g], 1)?;
        let m = b.reduce_mean(st, &[1], true)?;
        let q = b.squeeze(m, &[1])?;
        layers::dense(b, "logits", q, 10, Activation::None)
    })?;
    let onehot = b.one_hot(y, 10, 1.0, 0.0)?;
    let xent = b.softmax_cross_entropy_with_logits(logits, onehot)?;
    let loss = b.reduce_mean_all(xent)?;
    let g = b.finish();
    let l = g.node(loss.node).name.clone();
    Ok((g, l))
}

/// Train 3 steps on `towers` towers (0: one device); the losses and the variables after.
fn train(towers: usize) -> (Vec<f32>, Vec<(String, Vec<f32>)>) {
    let (g, loss) = model().expect("builds");
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.5) }, BATCH);
    o.towers = (0..towers as u32).map(Device::gpu).collect();
    let c = compile_train(&g, &loss, &o).expect("compiles");
    let text = c.plan.to_text();
    for k in ["one_hot", "transpose", "pad", "gather", "gather_grad", "tile", "tile_grad"] {
        assert!(text.contains(&format!("  {k} ")), "the plan launches {k}:\n{text}");
    }
    let mut s = Session::new(3);
    s.load("train", c.plan).expect("loads");
    let mut losses = Vec::new();
    for (x, y) in batches(BATCH, 3, 5) {
        s.feed("train", "images", &x).expect("feed");
        s.feed("train", "labels", &y).expect("feed");
        s.run("train").expect("runs");
        losses.push(s.fetch::<f32>("train", "loss").expect("loss")[0]);
    }
    let vars = ["Net/embedding", "Net/fc1/weights", "Net/logits/weights", "Net/logits/biases"]
        .iter()
        .map(|n| (n.to_string(), s.variable::<f32>(n).expect("variable")))
        .collect();
    (losses, vars)
}

#[test]
fn one_hot_labels_train_the_same_on_one_device_and_two_towers() {
    let (l1, v1) = train(0);
    let (l2, v2) = train(2);
    assert!(l1.iter().all(|l| l.is_finite()) && l1[2] < l1[0], "the loss falls: {l1:?}");
    for (step, (a, b)) in l1.iter().zip(&l2).enumerate() {
        assert!((a - b).abs() <= 2e-5 * a.abs().max(1.0), "step {step}: loss {b} at 2 towers vs {a}");
    }
    for ((name, a), (_, b)) in v1.iter().zip(&v2) {
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs() / x.abs().max(1.0)).fold(0f32, f32::max);
        assert!(worst <= 2e-5, "{name}: relative difference {worst} between 1 device and 2 towers");
    }
    // The embedding was trained only at the rows some example picked.
    let (_, init) = {
        let (g, loss) = model().expect("builds");
        let o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.0) }, BATCH);
        let c = compile_train(&g, &loss, &o).expect("compiles");
        let mut s = Session::new(3);
        s.load("train", c.plan).expect("loads");
        ((), s.variable::<f32>("Net/embedding").expect("variable"))
    };
    let moved = v1[0].1.iter().zip(&init).filter(|(a, b)| a != b).count();
    assert!(moved > 0 && moved % 16 == 0, "whole embedding rows move: {moved} elements");
}

#[test]
fn a_gather_index_out_of_range_is_tfs_error_at_run_time() {
    let mut b = GraphBuilder::new();
    let p = b.placeholder("params", DType::F32, [Some(10), Some(2)]).unwrap();
    let i = b.placeholder("indices", DType::I32, [Some(4)]).unwrap();
    let g = b.gather(p, i, 0).unwrap();
    let g = b.identity(g, "out").unwrap();
    let graph = b.finish();
    let name = graph.node(g.node).name.clone();
    let c = compile_eval(&graph, &[("out", name.as_str())], 4).expect("compiles");
    let mut s = Session::new(0);
    s.load("eval", c.plan).expect("loads");
    s.feed("eval", "params", &[0.5; 20]).expect("feed");
    s.feed("eval", "indices", &[1, 2, 3, 12]).expect("feed");
    let e = s.run("eval").unwrap_err().to_string();
    assert!(e.contains("indices[3] = 12 is not in [0, 10)"), "{e}");
    s.feed("eval", "indices", &[9, 0, 3, 3]).expect("feed");
    s.run("eval").expect("in range runs");
    assert_eq!(s.fetch::<f32>("eval", "out").expect("fetch"), vec![0.5; 8]);
}
