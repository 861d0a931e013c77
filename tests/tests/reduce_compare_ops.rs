//! reduce_max / reduce_min, the comparisons, `where` and `abs` end to end on the
//! CPU backend: a small network pooling over "time" with reduce_max
//! (max-over-time pooling), a stable logsumexp built on it (`m + log Σ
//! exp(x - m)`, m = reduce_max), an abs of a reduce_min term, a leaky gate built with
//! `where(h > 0, h, 0.1·h)` and a row-selecting `where` compiles through
//! `compile_train`, trains (the loss falls), and 2 towers compute the update
//! of 0 towers (one device). The comparisons' and `where`'s values (with a
//! NaN in the unselected branch) are checked through `compile_eval`.

use towers::compiler::CompileOptions;
use towers::models::Model;
use towers_graph::{DType, GraphBuilder, Initializer, Optimizer, Reuse, Shape, F32};
use towers_tests::{batches, max_rel_diff, run, towers, TOL};

/// images [N,8,8,1] -> h = flatten(x)·W1 [64, 32] -> [N, 4, 8] (4 steps
/// of 8 features) -> pooled = reduce_max over the steps [N, 8] ->
/// lse = logsumexp over the steps with m = reduce_max(keep_dims) [N, 8]
/// -> lo = |reduce_min over the steps| [N, 8] -> logits = [pooled, lse, lo]·W2 + b2
/// -> mean sparse xent.
fn pool_model(seed: u64) -> Model {
    let mut b = GraphBuilder::with_seed(seed);
    let x = b.placeholder("images", DType::F32, Shape(vec![None, Some(8), Some(8), Some(1)])).unwrap();
    let y = b.placeholder("labels", DType::I32, Shape(vec![None])).unwrap();
    let logits = b
        .variable_scope("Pool", Reuse::No, |b| {
            let f = b.flatten(x)?;
            let w1 = b.get_variable("w1", [64, 32], Initializer::he_normal())?;
            let h = b.matmul(f, w1)?;
            let zero = b.scalar(0.0)?;
            let pos = b.greater(h, zero)?;
            let tenth = b.scalar(0.1)?;
            let small = b.mul(h, tenth)?;
            let gated = b.where_(pos, h, small)?;
            let seq = b.reshape(gated, &[-1, 4, 8])?;
            let pooled = b.reduce_max(seq, &[1], false)?;
            let m = b.reduce_max(seq, &[1], true)?;
            let centered = b.sub(seq, m)?;
            let e = b.unary(towers_graph::UnaryOp::Exp, centered)?;
            let s = b.reduce_sum(e, &[1], false)?;
            let l = b.unary(towers_graph::UnaryOp::Log, s)?;
            let m2 = b.reshape(m, &[-1, 8])?;
            let lse = b.add(m2, l)?;
            let lo = b.reduce_min(seq, &[1], false)?;
            let lo = b.abs(lo)?;
            let mixed = b.concat(&[pooled, lse, lo], 1)?;
            // Rows whose first image pixel is at most 0.5 take -mixed: a
            // vector condition selecting whole rows.
            let first = b.slice(f, &[0, 0], &[-1, 1])?;
            let first = b.reshape(first, &[-1])?;
            let half = b.scalar(0.5)?;
            let low = b.less_equal(first, half)?;
            let neg = b.neg(mixed)?;
            let feats = b.where_(low, neg, mixed)?;
            let w2 = b.get_variable("w2", [24, 10], Initializer::RandomNormal { mean: F32(0.0), stddev: F32(0.1) })?;
            let b2 = b.get_variable("b2", [10], Initializer::Zeros)?;
            let l = b.matmul(feats, w2)?;
            b.bias_add(l, b2)
        })
        .unwrap();
    assert_eq!(b.graph().node(logits.node).op.type_name(), "BiasAdd");
    towers_tests::mean_xent_model(b, logits, y, seed)
}

const BATCH: usize = 24;

/// 2 towers give the variables of 0 towers (one device) after 3 steps, for
/// SGD and Adam (the equivalence tests' tolerance).
#[test]
fn reduce_max_min_where_abs_two_towers_match_one_device() {
    let model = pool_model(3);
    let data = batches(BATCH, 3, 8);
    for opt in [
        Optimizer::Sgd { lr: F32(0.1) },
        Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) },
    ] {
        let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
        assert!(single.losses.iter().all(|l| l.is_finite()), "{opt:?}: {:?}", single.losses);
        let mut o = CompileOptions::new(opt.clone(), BATCH);
        o.towers = towers(2);
        let r = run(&model, &o, &data);
        let (d, var) = max_rel_diff(&r, &single);
        assert!(d <= TOL, "{opt:?} towers=2: {var} differs by {d}");
    }
}

/// Overfitting one batch: 60 steps of Adam on 0 and on 2 towers lower the
/// loss (the gradients through the maxima and minima point downhill).
#[test]
fn the_loss_falls_through_reduce_max_min_where_abs() {
    let model = pool_model(4);
    let one = batches(BATCH, 1, 9);
    let data: Vec<_> = (0..60).map(|_| one[0].clone()).collect();
    for n in [0, 2] {
        let mut o = CompileOptions::new(
            Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) },
            BATCH,
        );
        o.towers = towers(n);
        let r = run(&model, &o, &data);
        let (first, last) = (r.losses[0], *r.losses.last().unwrap());
        assert!(last < 0.7 * first, "towers={n}: loss {first} -> {last}");
    }
}

/// The comparisons against a scalar and a row (broadcast), on f32 and i32,
/// and `where` elementwise and by rows: the unselected branch holds NaN and
/// inf (log of negatives, 1/0) and none of it reaches the output.
#[test]
fn comparisons_and_where_values() {
    use towers::runtime::Session;
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [Some(2), Some(3)]).unwrap();
    let ids = b.placeholder("ids", DType::I32, [Some(2), Some(3)]).unwrap();
    let zero = b.scalar(0.0).unwrap();
    let row = b.constant("row", DType::F32, &[3], &[0.0, 1.0, -1.0]).unwrap();
    let two = b.constant("two", DType::I32, &[], &[2.0]).unwrap();
    let mut outs = Vec::new();
    let gt = b.greater(x, zero).unwrap();
    outs.push(gt);
    outs.push(b.greater_equal(x, row).unwrap());
    outs.push(b.less(x, row).unwrap());
    outs.push(b.less_equal(ids, two).unwrap());
    outs.push(b.not_equal(ids, two).unwrap());
    let lg = b.unary(towers_graph::UnaryOp::Log, x).unwrap();
    let safe = b.where_(gt, lg, zero).unwrap_err().to_string();
    assert!(safe.contains("Select") && safe.contains("must have one shape"), "{safe}");
    let zeros = b.zeros_like(x).unwrap();
    let w = b.where_(gt, lg, zeros).unwrap();
    let inv = b.unary(towers_graph::UnaryOp::Reciprocal, zeros).unwrap();
    let rows = b.constant("rows", DType::I32, &[2], &[1.0, 0.0]).unwrap();
    let rows = b.cast(rows, DType::Bool).unwrap();
    let r = b.select(rows, x, inv).unwrap();
    let mut fetch = Vec::new();
    for (i, t) in outs.iter().enumerate() {
        let f = b.cast(*t, DType::F32).unwrap();
        fetch.push((format!("c{i}"), b.identity(f, &format!("c{i}")).unwrap()));
    }
    fetch.push(("w".into(), b.identity(w, "w").unwrap()));
    fetch.push(("r".into(), b.identity(r, "r").unwrap()));
    let a = b.abs(x).unwrap();
    fetch.push(("a".into(), b.identity(a, "a").unwrap()));
    assert_eq!(b.graph().node(outs[4].node).op.type_name(), "NotEqual");
    let graph = b.finish();
    let names: Vec<(String, String)> =
        fetch.iter().map(|(k, t)| (k.clone(), graph.node(t.node).name.clone())).collect();
    let pairs: Vec<(&str, &str)> = names.iter().map(|(k, n)| (k.as_str(), n.as_str())).collect();
    let comp = towers::compiler::compile_eval(&graph, &pairs, 2).expect("compiles");
    let mut s = Session::new(0);
    s.load("eval", comp.plan).expect("loads");
    let xs = [1.0f32, -2.0, 0.0, 0.5, 1.0, -1.0];
    s.feed("eval", "x", &xs).unwrap();
    s.feed("eval", "ids", &[1i32, 2, 3, 2, 0, 5]).unwrap();
    s.run("eval").unwrap();
    let get = |k: &str| s.fetch::<f32>("eval", k).unwrap();
    assert_eq!(get("c0"), [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]);
    assert_eq!(get("c1"), [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
    assert_eq!(get("c2"), [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(get("c3"), [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]);
    assert_eq!(get("c4"), [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]);
    let w = get("w");
    let want_w = [0.0, 0.0, 0.0, 0.5f32.ln(), 0.0, 0.0];
    assert!(w.iter().zip(&want_w).all(|(a, b)| (a - b).abs() < 1e-6), "{w:?}");
    assert_eq!(get("r"), [1.0, -2.0, 0.0, f32::INFINITY, f32::INFINITY, f32::INFINITY]);
    assert_eq!(get("a"), [1.0, 2.0, 0.0, 0.5, 1.0, 1.0]);
}
