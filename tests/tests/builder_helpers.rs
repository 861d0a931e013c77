//! The TF1 spellings a port reaches for first: `exp`, `log`, `sqrt`,
//! `rsqrt`, `reciprocal`, `clip_by_value`, `zeros_like`/`ones_like`, and
//! `reduce_sum` with an axis given twice (TF counts it once). Values against
//! their formulas, `clip_by_value`'s gradient (it passes inside the bounds
//! only), and a recurrent state started with `zeros_like` of an unknown
//! batch training at 2 towers as on one device.

use towers::prelude::*;

#[test]
fn the_unary_spellings_and_fills_compute_their_formulas() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(3)]).unwrap();
    let outs = [
        ("exp", b.exp(x).unwrap()),
        ("log", b.log(x).unwrap()),
        ("sqrt", b.sqrt(x).unwrap()),
        ("rsqrt", b.rsqrt(x).unwrap()),
        ("reciprocal", b.reciprocal(x).unwrap()),
        ("clip", b.clip_by_value(x, 0.5, 2.0).unwrap()),
        ("zeros", b.zeros_like(x).unwrap()),
        ("ones", b.ones_like(x).unwrap()),
        ("sum11", b.reduce_sum(x, &[1, 1], false).unwrap()),
    ];
    let mut fetches = Vec::new();
    for (name, t) in outs {
        let node = b.graph().node(t.node).name.clone();
        fetches.push((name.to_string(), node));
    }
    assert_eq!(fetches[5].1, "clip_by_value/Minimum", "TF's names");
    let g = b.finish();
    let f: Vec<(&str, &str)> = fetches.iter().map(|(a, n)| (a.as_str(), n.as_str())).collect();
    let mut s = Session::new(0);
    s.load("eval", compile_eval(&g, &f, 2).unwrap().plan).unwrap();
    let xs = [0.25f32, 1.0, 4.0, 0.5, 2.0, 9.0];
    s.feed("eval", "x", &xs).unwrap();
    s.run("eval").unwrap();
    let get = |s: &Session, n: &str| s.fetch::<f32>("eval", n).unwrap();
    let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-6 * y.abs().max(1.0));
    let map = |f: fn(f32) -> f32| xs.iter().map(|&v| f(v)).collect::<Vec<f32>>();
    assert!(close(&get(&s, "exp"), &map(f32::exp)));
    assert!(close(&get(&s, "log"), &map(f32::ln)));
    assert!(close(&get(&s, "sqrt"), &map(f32::sqrt)));
    assert!(close(&get(&s, "rsqrt"), &map(|v| 1.0 / v.sqrt())));
    assert!(close(&get(&s, "reciprocal"), &map(|v| 1.0 / v)));
    assert_eq!(get(&s, "clip"), [0.5, 1.0, 2.0, 0.5, 2.0, 2.0]);
    assert_eq!(get(&s, "zeros"), [0.0; 6]);
    assert_eq!(get(&s, "ones"), [1.0; 6]);
    assert_eq!(get(&s, "sum11"), [5.25, 11.5]);
}

#[test]
fn clip_bounds_that_cannot_hold_are_refused() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [2]).unwrap();
    let e = b.clip_by_value(x, 1.0, -1.0).unwrap_err().to_string();
    assert!(e.contains("clip_by_value") && e.contains("min <= max"), "{e}");
    assert!(b.clip_by_value(x, f32::NAN, 1.0).is_err());
}

/// d/dw sum(clip(w, -1, 1)) is 1 inside the bounds and 0 outside: one SGD
/// step with lr 1 moves exactly the elements inside by -1.
#[test]
fn clip_by_value_passes_the_gradient_inside_its_bounds_only() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(4)]).unwrap();
    let w = b.get_variable("w", [4], Initializer::Zeros).unwrap();
    let c = b.clip_by_value(w, -1.0, 1.0).unwrap();
    let xw = b.mul(x, c).unwrap();
    let loss = b.reduce_sum_all(xw).unwrap();
    b.identity(loss, "loss").unwrap();
    let g = b.finish();
    let c = compile_train(&g, "loss", &CompileOptions::new(Optimizer::Sgd { lr: F32(1.0) }, 1)).unwrap();
    let mut s = Session::new(0);
    s.load("train", c.plan).unwrap();
    s.set_variable("w", &[-3.0f32, -0.5, 0.5, 3.0]).unwrap();
    s.feed("train", "x", &[1.0f32; 4]).unwrap();
    s.run("train").unwrap();
    assert_eq!(s.variable::<f32>("w").unwrap(), [-3.0, -1.5, -0.5, 3.0]);
}

/// An RNN's initial state as TF1 ports write it, `zeros_like` of a
/// projection of the batch (its rows unknown until the batch is split):
/// two towers train as one device.
#[test]
fn a_zero_state_of_an_unknown_batch_trains_at_two_towers_as_one_device() {
    let graph = || {
        let mut b = GraphBuilder::with_seed(5);
        let x = b.placeholder("x", DType::F32, [None, Some(3)]).unwrap();
        let y = b.placeholder("y", DType::I32, [None]).unwrap();
        let wx = b.get_variable("wx", [3, 4], Initializer::GlorotUniform).unwrap();
        let wh = b.get_variable("wh", [4, 4], Initializer::GlorotUniform).unwrap();
        let xw = b.matmul(x, wx).unwrap();
        let mut h = b.zeros_like(xw).unwrap();
        for _ in 0..2 {
            let hw = b.matmul(h, wh).unwrap();
            let pre = b.add(xw, hw).unwrap();
            h = b.tanh(pre).unwrap();
        }
        let logits = layers::dense(&mut b, "out", h, 2, Activation::None).unwrap();
        let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
        let loss = b.reduce_mean(xent, &[0], false).unwrap();
        b.identity(loss, "loss").unwrap();
        b.finish()
    };
    let train = |towers: u32| {
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.5) }, 8);
        o.towers = (0..towers).map(Device::gpu).collect();
        let mut s = Session::new(0);
        s.load("train", compile_train(&graph(), "loss", &o).unwrap().plan).unwrap();
        let xs: Vec<f32> = (0..24).map(|i| ((i * 7 % 5) as f32 - 2.0) / 2.0).collect();
        let ys: Vec<i32> = (0..8).map(|i| i % 2).collect();
        for _ in 0..3 {
            s.feed("train", "x", &xs).unwrap();
            s.feed("train", "y", &ys).unwrap();
            s.run("train").unwrap();
        }
        (s.variable::<f32>("wh").unwrap(), s.fetch::<f32>("train", "loss").unwrap()[0])
    };
    let (w0, l0) = train(0);
    let (w2, l2) = train(2);
    assert!(w0.iter().zip(&w2).all(|(a, b)| (a - b).abs() <= 1e-5 * a.abs().max(1e-2)), "{w0:?} vs {w2:?}");
    assert!((l0 - l2).abs() <= 1e-5 * l0.abs(), "{l0} vs {l2}");
    assert!(w0.iter().any(|&v| v != 0.0));
}

/// A sequence model as TF1 ports write it: `tf.layers.dense` on `[B, T, D]`
/// applies to the last axis, and the cross entropies take `[B, T, C]`
/// logits with `[B, T]` labels. The same numbers as the hand-reshaped
/// model, and 2 towers train as one device.
#[test]
fn dense_and_cross_entropies_apply_to_the_last_axis_of_a_sequence() {
    const T: usize = 3;
    let graph = |by_hand: bool| {
        let mut b = GraphBuilder::with_seed(9);
        let x = b.placeholder("x", DType::F32, [None, Some(T), Some(4)]).unwrap();
        let y = b.placeholder("y", DType::I32, [None, Some(T)]).unwrap();
        let xent = if by_hand {
            let flat = b.reshape(x, &[-1, 4]).unwrap();
            let logits = layers::dense(&mut b, "dense", flat, 5, Activation::None).unwrap();
            let labels = b.reshape(y, &[-1]).unwrap();
            b.sparse_softmax_cross_entropy_with_logits(logits, labels).unwrap()
        } else {
            let logits = layers::dense(&mut b, "dense", x, 5, Activation::None).unwrap();
            assert_eq!(b.graph().tensor_type(logits).unwrap().shape.to_string(), "[?,3,5]");
            let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
            assert_eq!(b.graph().tensor_type(xent).unwrap().shape.to_string(), "[?,3]");
            // The dense-label form too: one-hot labels shaped as the logits.
            let one_hot = b.one_hot(y, 5, 1.0, 0.0).unwrap();
            let dense = b.softmax_cross_entropy_with_logits(logits, one_hot).unwrap();
            assert_eq!(b.graph().tensor_type(dense).unwrap().shape.to_string(), "[?,3]");
            xent
        };
        let loss = b.reduce_mean_all(xent).unwrap();
        b.identity(loss, "loss").unwrap();
        b.finish()
    };
    let g = graph(false);
    assert_eq!(g.tensor_type(g.tensor(g.find("dense/weights").unwrap(), 0)).unwrap().shape.to_string(), "[4,5]");
    let train = |g: &Graph, towers: u32| {
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.5) }, 4);
        o.towers = (0..towers).map(Device::gpu).collect();
        let mut s = Session::new(0);
        s.load("train", compile_train(g, "loss", &o).unwrap().plan).unwrap();
        let xs: Vec<f32> = (0..4 * T * 4).map(|i| ((i * 7 % 9) as f32 - 4.0) / 4.0).collect();
        let ys: Vec<i32> = (0..4 * T).map(|i| (i % 5) as i32).collect();
        let mut losses = Vec::new();
        for _ in 0..3 {
            s.feed("train", "x", &xs).unwrap();
            s.feed("train", "y", &ys).unwrap();
            s.run("train").unwrap();
            losses.push(s.fetch::<f32>("train", "loss").unwrap()[0]);
        }
        (losses, s.variable::<f32>("dense/weights").unwrap())
    };
    let (l_hand, w_hand) = train(&graph(true), 0);
    let (l0, w0) = train(&g, 0);
    let (l2, w2) = train(&g, 2);
    let near = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 * y.abs().max(1e-2));
    assert!(near(&l0, &l_hand) && near(&w0, &w_hand), "{l0:?} vs by hand {l_hand:?}");
    assert!(near(&l2, &l0) && near(&w2, &w0), "2 towers {l2:?} vs one device {l0:?}");
    assert!(l0[2] < l0[0], "it trains: {l0:?}");
}

/// A padding mask as sequence models build it, `equal(ids, PAD)` against a
/// scalar, and a comparison of a column with a row, broadcast as TF's
/// `tf.equal` does.
#[test]
fn equal_broadcasts_a_scalar_and_a_row_against_a_column() {
    let mut b = GraphBuilder::new();
    let ids = b.placeholder("ids", DType::I32, [None, Some(3)]).unwrap();
    let pad = b.constant("pad", DType::I32, &[], &[0.0]).unwrap();
    let is_pad = b.equal(ids, pad).unwrap();
    let mask = b.cast(is_pad, DType::F32).unwrap();
    b.identity(mask, "mask").unwrap();
    let col = b.placeholder("col", DType::F32, [None, Some(1)]).unwrap();
    let row = b.constant("row", DType::F32, &[1, 3], &[1.0, 2.0, 3.0]).unwrap();
    let eq = b.equal(col, row).unwrap();
    assert_eq!(b.graph().tensor_type(eq).unwrap().shape.to_string(), "[?,3]");
    let eq = b.cast(eq, DType::F32).unwrap();
    b.identity(eq, "eq").unwrap();
    let g = b.finish();
    let mut s = Session::new(0);
    s.load("eval", compile_eval(&g, &[("mask", "mask"), ("eq", "eq")], 2).unwrap().plan).unwrap();
    s.feed("eval", "ids", &[5i32, 0, 0, 7, 8, 0]).unwrap();
    s.feed("eval", "col", &[2.0f32, 9.0]).unwrap();
    s.run("eval").unwrap();
    assert_eq!(s.fetch::<f32>("eval", "mask").unwrap(), [0.0, 1.0, 1.0, 0.0, 0.0, 1.0]);
    assert_eq!(s.fetch::<f32>("eval", "eq").unwrap(), [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
}

/// The kernels compute in f32: integer arithmetic is refused where it is
/// written, naming the node and the cast to write, not at compile time.
#[test]
fn integer_arithmetic_is_refused_at_the_line_that_builds_it() {
    let mut b = GraphBuilder::new();
    let labels = b.placeholder("labels", DType::I32, [None]).unwrap();
    let one = b.constant("one", DType::I32, &[], &[1.0]).unwrap();
    let e = b.sub(labels, one).unwrap_err().to_string();
    assert!(e.contains("'sub'") && e.contains("f32 only") && e.contains("cast"), "{e}");
    let e = b.neg(labels).unwrap_err().to_string();
    assert!(e.contains("Neg") && e.contains("f32 only"), "{e}");
}

/// Layer norm (TF1's `tf.contrib.layers.layer_norm`) over the last axis of
/// a sequence: each row has mean 0 and variance 1 before gamma and beta,
/// its variables have TF's names, its gradient equals central differences,
/// and 2 towers train as one device (it reads no other example).
#[test]
fn layer_norm_normalizes_each_row_and_trains_as_one_device_at_two_towers() {
    let graph = || {
        let mut b = GraphBuilder::with_seed(4);
        let x = b.placeholder("x", DType::F32, [None, Some(2), Some(4)]).unwrap();
        let y = b.placeholder("y", DType::I32, [None, Some(2)]).unwrap();
        let h = layers::dense(&mut b, "proj", x, 4, Activation::None).unwrap();
        let n = layers::layer_norm(&mut b, None, h, -1).unwrap();
        b.identity(n, "normed").unwrap();
        let logits = layers::dense(&mut b, "out", n, 3, Activation::None).unwrap();
        let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
        let loss = b.reduce_mean_all(xent).unwrap();
        b.identity(loss, "loss").unwrap();
        b.finish()
    };
    let g = graph();
    assert!(g.get("LayerNorm/beta").is_some() && g.get("LayerNorm/gamma").is_some());
    let xs: Vec<f32> = (0..4 * 2 * 4).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
    let ys: Vec<i32> = (0..8).map(|i| i % 3).collect();
    // Rows of mean 0 and variance 1 (gamma 1, beta 0 at the start).
    let mut e = Session::new(0);
    e.load("eval", compile_eval(&g, &[("normed", "normed"), ("loss", "loss")], 4).unwrap().plan).unwrap();
    e.feed("eval", "x", &xs).unwrap();
    e.feed("eval", "y", &ys).unwrap();
    e.run("eval").unwrap();
    for row in e.fetch::<f32>("eval", "normed").unwrap().chunks(4) {
        let m = row.iter().sum::<f32>() / 4.0;
        let v = row.iter().map(|x| (x - m) * (x - m)).sum::<f32>() / 4.0;
        assert!(m.abs() < 1e-5 && (v - 1.0).abs() < 1e-4, "{row:?}: mean {m}, variance {v}");
    }
    let train = |towers: u32| {
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(1.0) }, 4);
        o.towers = (0..towers).map(Device::gpu).collect();
        let mut s = Session::new(0);
        s.load("train", compile_train(&graph(), "loss", &o).unwrap().plan).unwrap();
        s.feed("train", "x", &xs).unwrap();
        s.feed("train", "y", &ys).unwrap();
        s.run("train").unwrap();
        (s.variable::<f32>("proj/weights").unwrap(), s.variable::<f32>("LayerNorm/gamma").unwrap())
    };
    let (w0, gamma0) = train(0);
    let (w2, gamma2) = train(2);
    let near = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 * y.abs().max(1e-2));
    assert!(near(&w2, &w0) && near(&gamma2, &gamma0), "2 towers {gamma2:?} vs one device {gamma0:?}");
    // d loss / d gamma[j] by central differences (the step with lr 1 moved gamma by -grad).
    let start = e.variable::<f32>("LayerNorm/gamma").unwrap();
    for j in 0..4 {
        let mut at = |d: f32| {
            let mut gm = start.clone();
            gm[j] += d;
            e.set_variable("LayerNorm/gamma", &gm).unwrap();
            e.run("eval").unwrap();
            e.fetch::<f32>("eval", "loss").unwrap()[0] as f64
        };
        let numeric = ((at(1e-2) - at(-1e-2)) / 2e-2) as f32;
        let autodiff = start[j] - gamma0[j];
        assert!((autodiff - numeric).abs() <= 2e-3 * numeric.abs().max(0.05), "gamma[{j}]: {autodiff} vs {numeric}");
    }
}

#[test]
fn l2_normalize_and_moments_compute_tfs_formulas() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(2)]).unwrap();
    let n = b.l2_normalize(x, 1).unwrap();
    let (mean, var) = b.moments(x, &[0], false).unwrap();
    assert_eq!(b.graph().tensor_type(mean).unwrap().shape.to_string(), "[2]");
    let names: Vec<String> = [n, mean, var].iter().map(|t| b.graph().node(t.node).name.clone()).collect();
    let g = b.finish();
    let f = [("n", names[0].as_str()), ("mean", names[1].as_str()), ("var", names[2].as_str())];
    let mut s = Session::new(0);
    s.load("eval", compile_eval(&g, &f, 2).unwrap().plan).unwrap();
    s.feed("eval", "x", &[3.0f32, 4.0, 1.0, 0.0]).unwrap();
    s.run("eval").unwrap();
    assert_eq!(s.fetch::<f32>("eval", "n").unwrap(), [0.6, 0.8, 1.0, 0.0]);
    assert_eq!(s.fetch::<f32>("eval", "mean").unwrap(), [2.0, 2.0]);
    assert_eq!(s.fetch::<f32>("eval", "var").unwrap(), [1.0, 4.0]);
}

/// `cast(x, F32)` of an f32 tensor, as TF1 code writes defensively
/// (`tf.cast(images, tf.float32)`), is the identity: the gradient flows
/// through it. loss = mean(c * (x + w)²) with and without the cast give
/// the same update of w (before, the cast stopped the gradient: w froze).
#[test]
fn a_cast_to_the_same_dtype_passes_the_gradient() {
    let train = |cast: bool| -> Vec<f32> {
        let mut b = GraphBuilder::with_seed(1);
        let x = b.placeholder("x", DType::F32, [None, Some(3)]).unwrap();
        let w = b.get_variable("w", [3], Initializer::Constant(F32(0.1))).unwrap();
        let z = b.add(x, w).unwrap();
        let z = if cast { b.cast(z, DType::F32).unwrap() } else { z };
        let q = b.square(z).unwrap();
        let loss = b.reduce_mean_all(q).unwrap();
        let g = b.finish();
        let name = g.node(loss.node).name.clone();
        let c = compile_train(&g, &name, &CompileOptions::new(Optimizer::Sgd { lr: F32(1.0) }, 2)).unwrap();
        let mut s = Session::new(0);
        s.load("train", c.plan).unwrap();
        s.feed("train", "x", &[0.5, -1.0, 2.0, 1.5, 0.0, -0.5]).unwrap();
        s.run("train").unwrap();
        s.variable::<f32>("w").unwrap()
    };
    let (with, without) = (train(true), train(false));
    // d/dw mean((x+w)²) over 6 elements = (2/6)·Σ_rows (x+w): w moves.
    assert!((without[0] - 0.1).abs() > 0.1, "{without:?}");
    assert_eq!(with, without);
}
