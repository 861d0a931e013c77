//! `top_k` and `in_top_k` end to end on the CPU backend, as a TF1 user
//! porting `cifar10_eval.py` (`top_k_op = tf.nn.in_top_k(logits, labels,
//! 1)`, precision @1 and @5) or a beam search (`tf.nn.top_k`) meets them:
//! - their values on hand-computed rows (ties, NaN, inf, a target out of
//!   range) through `compile_eval`;
//! - precision@1 and @5 of a digits MLP trained at 1 and at 2 towers: the
//!   same counts, equal to TF's rule applied to the fetched logits;
//! - an accuracy count and a precision fetched in a training step are one
//!   device's at 2 towers (even and uneven);
//! - a model pooling with `top_k` (k-max pooling) trains at 2 towers as on
//!   one device (its gradient, `TopKGrad`, through the plan);
//! - the mistakes TF refuses are refused where they are built, naming the node.

use towers::data::digits_split;
use towers::prelude::*;
use towers_graph::GraphError;
use towers_tests::{batches, max_rel_diff, mean_xent_model, run, towers, TOL};

/// TF's `InTopK` on one row (in_topk_op.h): a finite row, the target in
/// range, fewer than k strictly larger predictions.
fn in_top_k_by_hand(row: &[f32], target: i32, k: usize) -> bool {
    let t = target as usize;
    target >= 0 && t < row.len() && row.iter().all(|v| v.is_finite()) && row.iter().filter(|&&v| v > row[t]).count() < k
}

/// Six rows of five classes against hand-computed answers:
/// - `[1, 3, 3, -1, 0]`, target 2: top 3 values 3, 3, 1 at 1, 2, 0 (equal
///   values by lower index); nothing above 3, so in the top 1;
/// - `[.5, .2, .9, .9, .1]`, target 0: two above .5, out of the top 2
///   although the third largest;
/// - `[NaN, 1, 2, 3, 4]`, target 4: NaN ranks first in top_k; a NaN in the
///   row makes in_top_k false (TF);
/// - `[5, 4, 3, 2, 1]`, target 7: out of range, false;
/// - `[2, 2, 2, 2, 2]`, target 4: five tied classes straddle the top-1
///   boundary, all count as in (TF);
/// - `[inf, 0, 0, 0, 0]`, target 1: inf is not finite, false.
#[test]
fn values_by_hand_with_ties_nan_and_out_of_range_targets() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(5)]).unwrap();
    let y = b.placeholder("y", DType::I32, [None]).unwrap();
    let (v, i) = b.top_k(x, 3).unwrap();
    let v = b.identity(v, "values").unwrap();
    let i = b.cast(i, DType::F32).unwrap();
    let i = b.identity(i, "indices").unwrap();
    let mut names = vec![("values".to_string(), v), ("indices".to_string(), i)];
    for k in [1, 2] {
        let hit = b.in_top_k(x, y, k).unwrap();
        let hit = b.cast(hit, DType::F32).unwrap();
        names.push((format!("in{k}"), b.identity(hit, &format!("in{k}")).unwrap()));
    }
    let g = b.finish();
    let fetches: Vec<(String, String)> = names.iter().map(|(u, t)| (u.clone(), g.node(t.node).name.clone())).collect();
    let pairs: Vec<(&str, &str)> = fetches.iter().map(|(u, n)| (u.as_str(), n.as_str())).collect();
    let c = compile_eval(&g, &pairs, 6).expect("compiles");
    let mut s = Session::new(0);
    s.load("eval", c.plan).expect("loads");
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    #[rustfmt::skip]
    let xs = [
        1.0, 3.0, 3.0, -1.0, 0.0,
        0.5, 0.2, 0.9, 0.9, 0.1,
        nan, 1.0, 2.0, 3.0, 4.0,
        5.0, 4.0, 3.0, 2.0, 1.0,
        2.0, 2.0, 2.0, 2.0, 2.0,
        inf, 0.0, 0.0, 0.0, 0.0,
    ];
    let ys = [2, 0, 4, 7, 4, 1];
    s.feed("eval", "x", &xs).unwrap();
    s.feed("eval", "y", &ys).unwrap();
    s.run("eval").unwrap();
    let get = |k: &str| s.fetch::<f32>("eval", k).unwrap();
    let values = get("values");
    #[rustfmt::skip]
    let want = [3.0, 3.0, 1.0, 0.9, 0.9, 0.5, nan, 4.0, 3.0, 5.0, 4.0, 3.0, 2.0, 2.0, 2.0, inf, 0.0, 0.0];
    assert!(values.iter().zip(&want).all(|(a, b)| a == b || (a.is_nan() && b.is_nan())), "{values:?}");
    assert_eq!(
        get("indices"),
        [1.0, 2.0, 0.0, 2.0, 3.0, 0.0, 0.0, 4.0, 3.0, 0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 0.0, 1.0, 2.0]
    );
    assert_eq!(get("in1"), [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
    assert_eq!(get("in2"), [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
    for (r, row) in xs.chunks(5).enumerate() {
        for (k, got) in [(1, get("in1")[r]), (2, get("in2")[r])] {
            assert_eq!(got == 1.0, in_top_k_by_hand(row, ys[r], k), "row {r} at k = {k}");
        }
    }
}

/// The digits MLP (64-32-10) with cifar10_eval.py's counts: `top1`/`top5`
/// are `reduce_sum(cast(in_top_k(logits, labels, k)))`, `precision5` the
/// mean of the top-5 hits; `loss` the mean cross entropy.
fn digits_mlp() -> (Graph, [String; 3]) {
    let mut b = GraphBuilder::with_seed(21);
    let x = b.placeholder("images", DType::F32, [None, Some(8), Some(8), Some(1)]).unwrap();
    let y = b.placeholder("labels", DType::I32, [None]).unwrap();
    let logits = b
        .variable_scope("MLP", Reuse::No, |b| {
            let h = b.flatten(x)?;
            let h = layers::dense(b, "fc1", h, 32, Activation::Relu)?;
            layers::dense(b, "logits", h, 10, Activation::None)
        })
        .unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
    let loss = b.reduce_mean_all(xent).unwrap();
    b.identity(loss, "loss").unwrap();
    for k in [1, 5] {
        let hit = b.in_top_k(logits, y, k).unwrap();
        let hit = b.cast(hit, DType::F32).unwrap();
        let count = b.reduce_sum_all(hit).unwrap();
        b.identity(count, &format!("top{k}")).unwrap();
        if k == 5 {
            let p = b.reduce_mean_all(hit).unwrap();
            b.identity(p, "precision5").unwrap();
        }
    }
    let g = b.finish();
    let logits = g.node(logits.node).name.clone();
    (g, [logits, "top1".into(), "top5".into()])
}

/// Train the digits MLP `steps` SGD steps of 32 on the digits' train set
/// at `n` towers, then run the evaluation program on the 360 test digits:
/// (top1 count, top5 count, logits).
fn train_then_eval(n: u32, steps: usize) -> (f32, f32, Vec<f32>) {
    let (g, [logits, top1, top5]) = digits_mlp();
    let (train, test) = digits_split().expect("the embedded digits");
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.3) }, 32);
    o.towers = towers(n);
    let c = compile_train(&g, "loss", &o).expect("compiles");
    let mut s = Session::new(21);
    s.load("train", c.plan).expect("loads");
    let per = train.len() / 32;
    for step in 0..steps {
        let at = step % per * 32;
        s.feed("train", "images", &train.images()[at * 64..(at + 32) * 64]).unwrap();
        s.feed("train", "labels", &train.labels()[at..at + 32]).unwrap();
        s.run("train").unwrap();
    }
    let eval = compile_eval(&g, &[("top1", &top1), ("top5", &top5), ("logits", &logits)], test.len()).unwrap();
    s.load("eval", eval.plan).expect("loads");
    s.feed("eval", "images", test.images()).unwrap();
    s.feed("eval", "labels", test.labels()).unwrap();
    s.run("eval").unwrap();
    let get = |k: &str| s.fetch::<f32>("eval", k).unwrap();
    (get("top1")[0], get("top5")[0], get("logits"))
}

/// cifar10_eval.py's precision @1 and @5 of a trained model: the counts of
/// the evaluation program equal TF's rule applied to its logits; a model
/// trained at 2 towers (one device's update, up to float reassociation)
/// gives the same counts; the model learned (precision@1 well above
/// chance) and @5 >= @1.
#[test]
fn precision_at_1_and_5_of_a_trained_digits_model_at_1_and_2_towers() {
    let (_, test) = digits_split().unwrap();
    let labels = test.labels();
    let mut counts = Vec::new();
    for n in [0, 2] {
        let (top1, top5, logits) = train_then_eval(n, 120);
        for (k, got) in [(1, top1), (5, top5)] {
            let want = logits.chunks(10).zip(labels).filter(|(row, &t)| in_top_k_by_hand(row, t, k)).count();
            assert_eq!(got, want as f32, "{n} towers: precision@{k} count");
        }
        counts.push((top1, top5));
    }
    assert_eq!(counts[0], counts[1], "1 tower vs 2 towers");
    let (top1, top5) = counts[0];
    let n = labels.len() as f32;
    eprintln!("precision@1 = {:.4} ({top1}/{n}), precision@5 = {:.4} ({top5}/{n})", top1 / n, top5 / n);
    assert!(top1 / n > 0.8, "a trained model: precision@1 {}", top1 / n);
    assert!(top5 >= top1 && top5 < n + 1.0, "{top5} >= {top1}");
}

/// Per step at 32 rows: (loss, top-1 count, top-5 precision, logits)
/// fetched from the training program itself, 3 steps on synthetic digits.
fn training_fetches(towers_n: u32, split: SplitPolicy) -> Vec<(f32, f32, f32, Vec<f32>)> {
    let (g, [logits, top1, _]) = digits_mlp();
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.5) }, 32);
    o.towers = towers(towers_n);
    o.split = split;
    o.fetches = vec![("top1".into(), top1), ("precision5".into(), "precision5".into()), ("logits".into(), logits)];
    let c = compile_train(&g, "loss", &o).expect("compiles");
    assert!(c.state.diagnostics.is_empty(), "{:?}", c.state.diagnostics);
    let mut s = Session::new(0);
    s.load("train", c.plan).expect("loads");
    batches(32, 3, 5)
        .iter()
        .map(|(x, y)| {
            s.feed("train", "images", x).unwrap();
            s.feed("train", "labels", y).unwrap();
            s.run("train").unwrap();
            let get = |k: &str| s.fetch::<f32>("train", k).unwrap();
            (get("loss")[0], get("top1")[0], get("precision5")[0], get("logits"))
        })
        .collect()
}

/// An in_top_k count (a sum over the batch: the towers' counts added) and
/// a precision (a mean: weighted by the towers' shares) fetched in a
/// training step are one device's on the whole batch, at 2 even and 2
/// uneven towers; and they are TF's rule on the step's logits.
#[test]
fn training_fetches_of_in_top_k_are_one_devices_at_2_towers() {
    let one = training_fetches(0, SplitPolicy::Even);
    let labels: Vec<Vec<i32>> = batches(32, 3, 5).into_iter().map(|(_, y)| y).collect();
    for (step, (_, top1, p5, logits)) in one.iter().enumerate() {
        let rule = |k| logits.chunks(10).zip(&labels[step]).filter(|(r, &t)| in_top_k_by_hand(r, t, k)).count() as f32;
        assert_eq!(*top1, rule(1), "step {step}: the top-1 count");
        assert_eq!(*p5, rule(5) / 32.0, "step {step}: precision@5");
    }
    assert!(one.iter().any(|(_, t, _, _)| *t > 0.0 && *t < 32.0), "counts that are not constant: {one:?}");
    for split in [SplitPolicy::Even, SplitPolicy::Weighted(vec![3, 1])] {
        for (step, (a, b)) in one.iter().zip(training_fetches(2, split.clone())).enumerate() {
            assert!((a.0 - b.0).abs() <= 2e-5 * a.0.abs().max(1.0), "{split:?} step {step}: loss {} vs {}", b.0, a.0);
            assert_eq!((a.1, a.2), (b.1, b.2), "{split:?} step {step}: (top-1 count, precision@5)");
        }
    }
}

/// images -> dense 64x32 -> [N, 4, 8] -> the 3 largest of each group of 8
/// (k-max pooling, `top_k` values) -> [N, 12] -> dense -> logits.
fn kmax_model(seed: u64) -> towers::models::Model {
    let mut b = GraphBuilder::with_seed(seed);
    let x = b.placeholder("images", DType::F32, [None, Some(8), Some(8), Some(1)]).unwrap();
    let y = b.placeholder("labels", DType::I32, [None]).unwrap();
    let logits = b
        .variable_scope("KMax", Reuse::No, |b| {
            let f = b.flatten(x)?;
            let h = layers::dense(b, "fc1", f, 32, Activation::None)?;
            let groups = b.reshape(h, &[-1, 4, 8])?;
            let (best, _) = b.top_k(groups, 3)?;
            let pooled = b.reshape(best, &[-1, 12])?;
            layers::dense(b, "logits", pooled, 10, Activation::None)
        })
        .unwrap();
    mean_xent_model(b, logits, y, seed)
}

/// A model whose loss reaches the weights through top_k's values trains
/// (the loss falls) and 2 towers compute one device's update: the gradient
/// scattered by `TopKGrad` per row is one device's rows.
#[test]
fn a_k_max_pooling_model_trains_at_2_towers_as_on_one_device() {
    let model = kmax_model(3);
    let data = batches(32, 3, 11);
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.2) }, 32);
    let one = run(&model, &o, &data);
    let grads = compile_train(&model.graph, &model.loss, &o).unwrap();
    let text = towers_graph::text::to_text(&grads.graph).unwrap();
    assert!(text.contains("TopKGrad"), "the gradient goes through TopKGrad");
    let long = run(&model, &o, &vec![batches(32, 1, 11).remove(0); 20]);
    assert!(long.losses[19] < long.losses[0], "the loss falls: {:?}", long.losses);
    o.towers = towers(2);
    let two = run(&model, &o, &data);
    let (d, name) = max_rel_diff(&two, &one);
    assert!(d <= TOL, "2 towers vs one device: {name} differs by {d}");
}

/// What TF refuses is refused where it is built, naming the node, in TF's words.
#[test]
fn mistakes_are_errors_naming_the_node() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(5)]).unwrap();
    let y = b.placeholder("y", DType::I32, [None]).unwrap();
    let f = b.placeholder("f", DType::F32, [None]).unwrap();
    let v = b.placeholder("v", DType::F32, [Some(5)]).unwrap();
    let shape = |e: GraphError| match e {
        GraphError::Shape { node, detail, .. } => (node, detail),
        other => panic!("{other:?}"),
    };
    let e = b.name_scope("beam", |b| b.top_k(x, 6)).unwrap_err();
    assert_eq!(shape(e), ("beam/TopKV2".into(), "input must have at least k columns. Had 5, needed 6".into()));
    let (node, detail) = shape(b.top_k(x, 0).unwrap_err());
    assert!(node == "TopKV2" && detail.starts_with("k must be at least 1"), "{detail}");
    let (node, detail) = shape(b.in_top_k(x, f, 1).unwrap_err());
    assert!(node == "InTopK" && detail.contains("targets must be i32"), "{detail}");
    let (_, detail) = shape(b.in_top_k(v, y, 1).unwrap_err());
    assert_eq!(detail, "predictions must be 2-dimensional, got shape [5]");
    let three = b.placeholder("three", DType::I32, [Some(3)]).unwrap();
    let four = b.placeholder("four", DType::F32, [Some(4), Some(5)]).unwrap();
    let (_, detail) = shape(b.in_top_k(four, three, 1).unwrap_err());
    assert_eq!(detail, "First dimension of predictions 4 must match length of targets 3");
    // top_k of a vector works (k <= its length); its k is checked against it.
    assert!(b.top_k(v, 5).is_ok());
    let (_, detail) = shape(b.top_k(v, 6).unwrap_err());
    assert_eq!(detail, "input must have at least k columns. Had 5, needed 6");
}

/// A loss that reaches the weights only through in_top_k has no gradient
/// (TF: no gradient for a bool): the compile names the loss, the variables
/// and the InTopK node where the paths stop.
#[test]
fn a_loss_only_through_in_top_k_is_refused() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("images", DType::F32, [None, Some(4)]).unwrap();
    let y = b.placeholder("labels", DType::I32, [None]).unwrap();
    let w = b.get_variable("w", [4, 3], Initializer::Zeros).unwrap();
    let logits = b.matmul(x, w).unwrap();
    let hit = b.in_top_k(logits, y, 1).unwrap();
    let hit = b.cast(hit, DType::F32).unwrap();
    let acc = b.reduce_mean_all(hit).unwrap();
    b.identity(acc, "loss").unwrap();
    let g = b.finish();
    let e = compile_train(&g, "loss", &CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8)).unwrap_err();
    let e = e.to_string();
    assert!(e.contains("the loss 'loss'") && e.contains("[w]"), "{e}");
    assert!(e.contains("Every path stops at an op that has no gradient: 'InTopK' (InTopK)."), "{e}");
}
