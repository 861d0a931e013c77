//! N towers equal one device for a loss that sums over the batch as well as
//! for one that averages it: `reduce_sum(xent)`, `reduce_sum(xent) / BATCH`
//! (a constant, as cifar10-era code wrote), `l2_loss(pred - target)`. The
//! replicas' sums are added (weight 1 each), their means weighted by their
//! shares of the batch; a loss that is neither (a sum plus a regularizer)
//! keeps the shares and says so in a diagnostic.
//!
//! Before the weights followed the loss, a sum loss at 2 even towers trained
//! with half one device's gradient (TF1's `average_gradients` did the same).

use towers::prelude::*;

const BATCH: usize = 12;

fn graph(kind: &str) -> Result<Graph, GraphError> {
    let mut b = GraphBuilder::with_seed(2);
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(3)]))?;
    let y = b.placeholder("y", DType::I32, Shape(vec![None]))?;
    let t = b.placeholder("t", DType::F32, Shape(vec![None, Some(2)]))?;
    let logits = layers::dense(&mut b, "fc", x, 2, Activation::None)?;
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y)?;
    let diff = b.sub(logits, t)?;
    let loss = match kind {
        "mean" => b.reduce_mean(xent, &[0], false)?,
        "sum" => b.reduce_sum(xent, &[0], false)?,
        "sum_div_const" => {
            let s = b.reduce_sum(xent, &[0], false)?;
            let c = b.scalar(BATCH as f32)?;
            b.div(s, c)?
        }
        "l2_loss" => b.l2_loss(diff)?,
        "mse_all" => {
            let sq = b.square(diff)?;
            b.reduce_mean_all(sq)?
        }
        "sum_plus_both" => {
            // A sum of two sums over the batch is a sum.
            let a = b.reduce_sum(xent, &[0], false)?;
            let l2 = b.l2_loss(diff)?;
            b.add(a, l2)?
        }
        "masked_sum" => {
            // The padding idiom: examples of class 0 are "padding", masked
            // out by a broadcast `equal` against a scalar.
            let pad = b.constant("pad", DType::I32, &[], &[0.0])?;
            let is_pad = b.equal(y, pad)?;
            let is_pad = b.cast(is_pad, DType::F32)?;
            let one = b.scalar(1.0)?;
            let mask = b.sub(one, is_pad)?;
            let masked = b.mul(xent, mask)?;
            b.reduce_sum(masked, &[0], false)?
        }
        "sum_with_zero_state" => {
            // A zero state of the batch's rows (an RNN's), added in.
            let zeros = b.zeros_like(logits)?;
            let z = b.reduce_sum(zeros, &[1], false)?;
            let x = b.add(xent, z)?;
            b.reduce_sum(x, &[0], false)?
        }
        "sum_plus_reg" => {
            let s = b.reduce_sum(xent, &[0], false)?;
            let w = b.graph().get("fc/weights").expect("the dense layer's weights");
            let w = b.tensor(w, 0);
            let reg = b.l2_loss(w)?;
            b.add(s, reg)?
        }
        other => panic!("no loss {other}"),
    };
    b.identity(loss, "total_loss")?;
    Ok(b.finish())
}

/// Two SGD steps; the losses and the weights after them, and the compile's diagnostics.
fn train(kind: &str, towers: u32, split: SplitPolicy, accumulate: usize) -> (Vec<f32>, Vec<f32>, Vec<String>) {
    let g = graph(kind).expect("builds");
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
    o.towers = (0..towers).map(Device::gpu).collect();
    o.split = split;
    o.accumulate = accumulate;
    let c = compile_train(&g, "total_loss", &o).expect("compiles");
    let diagnostics = c.state.diagnostics.iter().map(|d| d.message.clone()).collect();
    let mut s = Session::new(1);
    s.load("train", c.plan).expect("loads");
    let x: Vec<f32> = (0..BATCH * 3).map(|i| ((i * 37 % 11) as f32 - 5.0) / 5.0).collect();
    let y: Vec<i32> = (0..BATCH).map(|i| (i % 2) as i32).collect();
    let t: Vec<f32> = (0..BATCH * 2).map(|i| ((i * 13 % 7) as f32 - 3.0) / 3.0).collect();
    let mut losses = Vec::new();
    for _ in 0..2 {
        // A loss may not read every placeholder; feed the ones it does.
        let _ = s.feed("train", "x", &x);
        let _ = s.feed("train", "y", &y);
        let _ = s.feed("train", "t", &t);
        s.run("train").expect("runs");
        losses.push(s.fetch::<f32>("train", "total_loss").expect("the loss")[0]);
    }
    (losses, s.variable::<f32>("fc/weights").expect("weights"), diagnostics)
}

fn rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) / scale
}

fn configs() -> Vec<(u32, SplitPolicy, usize)> {
    vec![
        (2, SplitPolicy::Even, 1),
        (3, SplitPolicy::Weighted(vec![1, 1, 2]), 1),
        (1, SplitPolicy::Even, 2),
        (2, SplitPolicy::Even, 3),
    ]
}

#[test]
fn sums_and_means_over_the_batch_train_as_one_device_at_every_tower_count() {
    for kind in
        ["mean", "sum", "sum_div_const", "l2_loss", "mse_all", "sum_plus_both", "masked_sum", "sum_with_zero_state"]
    {
        let (l0, w0, d0) = train(kind, 0, SplitPolicy::Even, 1);
        assert!(d0.is_empty(), "{kind}: {d0:?}");
        for (towers, split, acc) in configs() {
            let what = format!("{kind}, {towers} towers {split:?}, accumulate {acc}");
            let (l, w, d) = train(kind, towers, split, acc);
            assert!(d.is_empty(), "{what}: no diagnostic expected, got {d:?}");
            // Float reassociation only: far below the factor 1/N a wrong
            // weighting gives (0.5 at 2 towers).
            assert!(rel(&l, &l0) < 1e-5, "{what}: losses {l:?}, one device {l0:?}");
            assert!(rel(&w, &w0) < 1e-5, "{what}: weights {w:?}, one device {w0:?}");
        }
    }
}

#[test]
fn a_sum_plus_a_regularizer_keeps_the_shares_and_says_why() {
    let (_, _, d) = train("sum_plus_reg", 2, SplitPolicy::Even, 1);
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(d[0].contains("neither a mean nor a sum") && d[0].contains("total_loss"), "{}", d[0]);
    assert!(d[0].contains("reduce_mean"), "the fix is named: {}", d[0]);
    // One tower is one device: nothing to say.
    let (_, _, d) = train("sum_plus_reg", 1, SplitPolicy::Even, 1);
    assert!(d.is_empty(), "{d:?}");
}

/// Extra fetches are weighed as the loss is: a count of correct examples (a
/// sum) and an accuracy (a mean) fetched from a training program equal one
/// device's at uneven towers and with accumulation.
#[test]
fn extra_fetches_that_sum_or_average_the_batch_equal_one_device() {
    let run = |towers: u32, split: SplitPolicy, accumulate: usize| {
        let mut b = GraphBuilder::with_seed(2);
        let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(3)])).unwrap();
        let y = b.placeholder("y", DType::I32, Shape(vec![None])).unwrap();
        let logits = layers::dense(&mut b, "fc", x, 2, Activation::None).unwrap();
        let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
        let loss = b.reduce_mean(xent, &[0], false).unwrap();
        b.identity(loss, "loss").unwrap();
        let pred = b.argmax(logits, 1).unwrap();
        let hit = b.equal(pred, y).unwrap();
        let hit = b.cast(hit, DType::F32).unwrap();
        let correct = b.reduce_sum(hit, &[0], false).unwrap();
        b.identity(correct, "correct").unwrap();
        let accuracy = b.reduce_mean(hit, &[0], false).unwrap();
        b.identity(accuracy, "accuracy").unwrap();
        let g = b.finish();
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
        o.towers = (0..towers).map(Device::gpu).collect();
        o.split = split;
        o.accumulate = accumulate;
        o.fetches = vec![("correct".into(), "correct".into()), ("accuracy".into(), "accuracy".into())];
        let c = compile_train(&g, "loss", &o).expect("compiles");
        assert!(c.state.diagnostics.is_empty(), "{:?}", c.state.diagnostics);
        let mut s = Session::new(1);
        s.load("train", c.plan).unwrap();
        let xs: Vec<f32> = (0..BATCH * 3).map(|i| ((i * 37 % 11) as f32 - 5.0) / 5.0).collect();
        let ys: Vec<i32> = (0..BATCH).map(|i| (i % 3 == 0) as i32).collect();
        s.feed("train", "x", &xs).unwrap();
        s.feed("train", "y", &ys).unwrap();
        s.run("train").unwrap();
        let correct = s.fetch::<f32>("train", "correct").unwrap()[0];
        let accuracy = s.fetch::<f32>("train", "accuracy").unwrap()[0];
        (correct, accuracy)
    };
    let (c0, a0) = run(0, SplitPolicy::Even, 1);
    assert_eq!(c0.fract(), 0.0, "a count: {c0}");
    assert!((a0 - c0 / BATCH as f32).abs() < 1e-6);
    for (towers, split, acc) in configs() {
        let (c, a) = run(towers, split.clone(), acc);
        assert!((c - c0).abs() < 1e-4, "{towers} towers {split:?}, accumulate {acc}: {c} correct, one device {c0}");
        assert!((a - a0).abs() < 1e-6, "{towers} towers {split:?}, accumulate {acc}: accuracy {a}, one device {a0}");
    }
}

/// A per-row fetch of the training step (PTB's final LSTM state, fed back
/// as the next batch's initial state) is the towers' rows concatenated in
/// batch order: one device's tensor, at even and uneven splits and with
/// micro-batches. A per-row i32 fetch is refused with the cast to write.
#[test]
fn a_per_row_fetch_is_the_towers_rows_in_batch_order() {
    let graph = || {
        let mut b = GraphBuilder::with_seed(3);
        let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(3)])).unwrap();
        let y = b.placeholder("y", DType::I32, Shape(vec![None])).unwrap();
        let h0 = b.placeholder("h0", DType::F32, Shape(vec![None, Some(2)])).unwrap();
        let wx = b.get_variable("wx", [3, 2], Initializer::GlorotUniform).unwrap();
        let xw = b.matmul(x, wx).unwrap();
        let pre = b.add(xw, h0).unwrap();
        let h = b.tanh(pre).unwrap();
        b.identity(h, "final_state").unwrap();
        let pred = b.argmax(h, 1).unwrap();
        b.identity(pred, "pred").unwrap();
        let xent = b.sparse_softmax_cross_entropy_with_logits(h, y).unwrap();
        let loss = b.reduce_mean(xent, &[0], false).unwrap();
        b.identity(loss, "loss").unwrap();
        b.finish()
    };
    let run = |towers: u32, split: SplitPolicy, accumulate: usize| {
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
        o.towers = (0..towers).map(Device::gpu).collect();
        o.split = split;
        o.accumulate = accumulate;
        o.fetches = vec![("final_state".into(), "final_state".into())];
        let mut s = Session::new(0);
        s.load("train", compile_train(&graph(), "loss", &o).unwrap().plan).unwrap();
        let xs: Vec<f32> = (0..BATCH * 3).map(|i| ((i * 5 % 9) as f32 - 4.0) / 4.0).collect();
        let ys: Vec<i32> = (0..BATCH).map(|i| (i % 2) as i32).collect();
        let mut state = vec![0.0f32; BATCH * 2];
        for _ in 0..2 {
            s.feed("train", "x", &xs).unwrap();
            s.feed("train", "y", &ys).unwrap();
            s.feed("train", "h0", &state).unwrap();
            s.run("train").unwrap();
            state = s.fetch::<f32>("train", "final_state").unwrap();
        }
        state
    };
    let one = run(0, SplitPolicy::Even, 1);
    assert_eq!(one.len(), BATCH * 2);
    for (towers, split, acc) in configs() {
        let got = run(towers, split.clone(), acc);
        assert!(rel(&got, &one) < 1e-5, "{towers} towers {split:?}, accumulate {acc}: {got:?} vs {one:?}");
    }
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
    o.towers = vec![Device::gpu(0), Device::gpu(1)];
    o.fetches = vec![("pred".into(), "pred".into())];
    // i32 rows are gathered too (checked against one device in train_fetches.rs).
    compile_train(&graph(), "loss", &o).expect("i32 per-row fetches are gathered");
}

/// A loss the optimizer cannot minimize is named: a per-example tensor is
/// not a loss (its shape, before anything about variables), and a scalar
/// that no trainable variable reaches gets TF1's "No variables to
/// optimize." with the loss's name and what to give instead.
#[test]
fn a_loss_no_variable_reaches_is_named() {
    let mut b = GraphBuilder::with_seed(2);
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(3)])).unwrap();
    let _ = layers::dense(&mut b, "fc", x, 2, Activation::None).unwrap();
    let mean = b.reduce_mean_all(x).unwrap();
    let g = b.finish();
    let o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
    let e = compile_train(&g, "x", &o).expect_err("a placeholder is no loss").to_string();
    assert!(e.contains("the loss 'x' must be a scalar f32"), "{e}");
    let name = g.node(mean.node).name.clone();
    let e = compile_train(&g, &name, &o).expect_err("no variable reaches it").to_string();
    assert!(
        e.contains(&format!("No variables to optimize: the loss '{name}' depends on no trainable variable")),
        "{e}"
    );
}
