//! Extra fetches in the training program (`CompileOptions::fetches`), TF1's
//! `sess.run([train_op, loss, acc])`: a training accuracy computed in every
//! tower is combined by each tower's share of the batch, like the loss, so
//! uneven towers fetch the accuracy one device computes on the whole batch.

use towers::prelude::*;
use towers_graph::GraphError;
use towers_tests::batches;

const BATCH: usize = 32;

/// An MLP with its loss and its training accuracy (names returned).
fn model() -> Result<(Graph, String, String), GraphError> {
    let mut b = GraphBuilder::with_seed(4);
    let x = b.placeholder("images", DType::F32, [None, Some(8), Some(8), Some(1)])?;
    let y = b.placeholder("labels", DType::I32, [None])?;
    let logits = b.variable_scope("MLP", Reuse::No, |b| {
        let h = b.flatten(x)?;
        let h = layers::dense(b, "fc1", h, 16, Activation::Relu)?;
        layers::dense(b, "logits", h, 10, Activation::None)
    })?;
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y)?;
    let loss = b.reduce_mean_all(xent)?;
    let pred = b.argmax(logits, 1)?;
    let hit = b.equal(pred, y)?;
    let hit = b.cast(hit, DType::F32)?;
    let acc = b.reduce_mean_all(hit)?;
    let acc = b.identity(acc, "accuracy")?;
    // A sum over the batch per class: neither a scalar nor rows.
    let sums = b.reduce_sum(logits, &[0], false)?;
    b.identity(sums, "logit_sums")?;
    let g = b.finish();
    let (l, a) = (g.node(loss.node).name.clone(), g.node(acc.node).name.clone());
    Ok((g, l, a))
}

/// Train 3 steps; each step's (loss, accuracy).
fn run(towers: usize, split: SplitPolicy) -> Vec<(f32, f32)> {
    let (g, loss, acc) = model().expect("builds");
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.5) }, BATCH);
    o.towers = (0..towers as u32).map(Device::gpu).collect();
    o.split = split;
    o.fetches = vec![("accuracy".into(), acc)];
    let c = compile_train(&g, &loss, &o).expect("compiles");
    let mut s = Session::new(0);
    s.load("train", c.plan).expect("loads");
    batches(BATCH, 3, 9)
        .iter()
        .map(|(x, y)| {
            s.feed("train", "images", x).expect("feed");
            s.feed("train", "labels", y).expect("feed");
            s.run("train").expect("runs");
            (
                s.fetch::<f32>("train", "loss").expect("loss")[0],
                s.fetch::<f32>("train", "accuracy").expect("accuracy")[0],
            )
        })
        .collect()
}

#[test]
fn a_training_accuracy_is_combined_across_towers_by_share() {
    let one = run(0, SplitPolicy::Even);
    for (towers, split) in [(2, SplitPolicy::Even), (2, SplitPolicy::Weighted(vec![3, 1]))] {
        let many = run(towers, split.clone());
        for (step, ((l1, a1), (l, a))) in one.iter().zip(&many).enumerate() {
            // The accuracy is a count over 32 rows: k/32, exact in f32 either way.
            assert!((a - a1).abs() < 1e-6, "{split:?} step {step}: accuracy {a} vs one device {a1}");
            assert!((l - l1).abs() <= 2e-5 * l1.abs().max(1.0), "{split:?} step {step}: loss {l} vs {l1}");
            assert!((0.0..=1.0).contains(a), "{a}");
        }
    }
    // Some accuracy is not all of it: the fetch is not a constant.
    assert!(one.iter().any(|(_, a)| *a > 0.0 && *a < 1.0), "{one:?}");
}

#[test]
fn a_fetch_the_towers_cannot_gather_is_an_error_naming_it() {
    let (g, loss, _) = model().expect("builds");
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.5) }, BATCH);
    o.towers = vec![Device::gpu(0), Device::gpu(1)];
    // f32 logits are rows: gathered in batch order (tests/tests/loss_reductions.rs).
    o.fetches = vec![("logits".into(), "MLP/logits/BiasAdd".into())];
    compile_train(&g, &loss, &o).expect("per-row f32 logits are gathered");
    // Per-class sums over each tower's rows are neither rows nor a scalar.
    o.fetches = vec![("sums".into(), "logit_sums".into())];
    let e = compile_train(&g, &loss, &o).unwrap_err().to_string();
    assert!(e.contains("fetch 'sums'") && e.contains("evaluation program"), "{e}");
    o.fetches = vec![("loss".into(), "accuracy".into())];
    let e = compile_train(&g, &loss, &o).unwrap_err().to_string();
    assert!(e.contains("'loss'") && e.contains("another name"), "{e}");
}

/// A fetch name means one tensor: an empty name, a name given twice, and a
/// name of another tensor of the program (a feed, a variable, the
/// optimizer's `global_step`) are refused, naming the fetch, in training
/// and evaluation programs; a fetch named as its own node is fine.
#[test]
fn a_fetch_name_that_would_hide_another_tensor_is_refused() {
    let (g, loss, acc) = model().expect("builds");
    let cases: [(&[(&str, &str)], &str); 6] = [
        (&[("", "accuracy")], "is empty"),
        (&[("a", "accuracy"), ("a", "MLP/fc1/Relu")], "given twice"),
        (&[("images", "accuracy")], "another tensor"),
        (&[("MLP/fc1/weights", "accuracy")], "another tensor"),
        (&[("global_step", "accuracy")], "another tensor"),
        (&[("loss", "accuracy")], "hide the training loss"),
    ];
    for (fetches, words) in cases {
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.5) }, BATCH);
        o.towers = vec![Device::gpu(0), Device::gpu(1)];
        o.fetches = fetches.iter().map(|(u, n)| (u.to_string(), n.to_string())).collect();
        let e = compile_train(&g, &loss, &o).err().unwrap_or_else(|| panic!("{fetches:?} is refused")).to_string();
        assert!(e.contains(words) && e.contains(&format!("'{}'", fetches[fetches.len() - 1].0)), "{fetches:?}: {e}");
        if words != "hide the training loss" {
            let e = compile_eval(&g, fetches, BATCH).err().unwrap_or_else(|| panic!("eval {fetches:?}")).to_string();
            assert!(e.contains(words), "eval {fetches:?}: {e}");
        }
    }
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.5) }, BATCH);
    o.fetches = vec![("accuracy".into(), acc.clone()), ("images".into(), "images".into())];
    compile_train(&g, &loss, &o).expect("a fetch named as its own node");
    // A fetch of a node the graph lacks names the fetch, not only the node.
    o.fetches = vec![("acc".into(), "nope".into())];
    let e = compile_train(&g, &loss, &o).expect_err("no node 'nope'").to_string();
    assert!(e.contains("fetch 'acc' of CompileOptions::fetches") && e.contains("'nope'"), "{e}");
}

/// With towers, a model tensor exists once per tower: fetching it by its
/// model name says so and names the way to the whole batch's rows.
#[test]
fn fetching_a_replicated_tensor_by_its_model_name_names_the_replicas() {
    let (g, loss, _) = model().expect("builds");
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.5) }, BATCH);
    o.towers = vec![Device::gpu(0), Device::gpu(1)];
    let c = compile_train(&g, &loss, &o).expect("compiles");
    let mut s = Session::new(0);
    s.load("train", c.plan).expect("loads");
    let (x, y) = &batches(BATCH, 1, 3)[0];
    s.feed("train", "images", x).expect("feed");
    s.feed("train", "labels", y).expect("feed");
    s.run("train").expect("runs");
    let e = s.fetch::<f32>("train", "MLP/logits/BiasAdd").expect_err("replicated").to_string();
    assert!(e.contains("tower_0/MLP/logits/BiasAdd") && e.contains("CompileOptions::fetches"), "{e}");
}

/// Per-row i32 predictions (`argmax`) fetched in a training step are the
/// towers' rows in batch order: one device's predictions, also with
/// uneven towers.
#[test]
fn per_row_i32_predictions_are_gathered_across_towers() {
    let (g, loss, _) = model().expect("builds");
    let data = batches(BATCH, 2, 5);
    let preds = |towers: usize, split: SplitPolicy| -> Vec<Vec<i32>> {
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.5) }, BATCH);
        o.towers = (0..towers as u32).map(Device::gpu).collect();
        o.split = split;
        o.fetches = vec![("pred".into(), "ArgMax".into())];
        let c = compile_train(&g, &loss, &o).expect("compiles");
        let mut s = Session::new(0);
        s.load("train", c.plan).expect("loads");
        data.iter()
            .map(|(x, y)| {
                s.feed("train", "images", x).expect("feed");
                s.feed("train", "labels", y).expect("feed");
                s.run("train").expect("runs");
                s.fetch::<i32>("train", "pred").expect("pred")
            })
            .collect()
    };
    let one = preds(0, SplitPolicy::Even);
    assert_eq!(one[0].len(), BATCH);
    // Not one class everywhere, so a shuffled order would show.
    assert!(one.iter().flatten().any(|&p| p != one[0][0]), "{one:?}");
    assert_eq!(preds(2, SplitPolicy::Even), one);
    assert_eq!(preds(3, SplitPolicy::Weighted(vec![1, 2, 1])), one);
}
