//! TF ops a port reaches for, composed by the builder from existing ops
//! (`graph/src/builder_compose.rs`): `squared_difference`, `argmin`,
//! `reduce_logsumexp`, `split_n` / `split_sizes` (TF's `tf.split` by a
//! count or with a `-1` size), softmax and log-softmax over any axis,
//! BERT's tanh GELU, the rounding ops and `log1p`/`expm1` (unary kernels),
//! and `leaky_relu`'s refusal of a non-finite slope. Values on the CPU backend
//! against their formulas (the edge cases TF defines included), errors in
//! TF's words naming the node, and a model using them training at 2 towers
//! as on one device. Their gradients are checked by central differences in
//! `passes/src/autodiff/tests/rules_compose.rs`.

use towers::prelude::*;
use towers_tests::{batches, max_rel_diff, run, TOL};

/// Evaluate `outs` (fetch name, tensor) of `b`'s graph with `x` fed (each
/// through an identity of its own: a fetch names a node's first output,
/// and a split's parts are one node's outputs).
fn eval(mut b: GraphBuilder, outs: &[(&str, Tensor)], x: &[f32], batch: usize) -> Vec<Vec<f32>> {
    let mut names: Vec<(String, String)> = Vec::new();
    for (n, t) in outs {
        let id = b.identity(*t, &format!("out_{n}")).expect("identity");
        names.push((n.to_string(), b.graph().node(id.node).name.clone()));
    }
    let g = b.finish();
    let f: Vec<(&str, &str)> = names.iter().map(|(a, n)| (a.as_str(), n.as_str())).collect();
    let mut s = Session::new(0);
    s.load("eval", compile_eval(&g, &f, batch).expect("compiles").plan).expect("loads");
    s.feed("eval", "x", x).expect("feed");
    s.run("eval").expect("runs");
    outs.iter()
        .map(|(n, t)| match g.tensor_type(*t).expect("type").dtype {
            DType::F32 => s.fetch::<f32>("eval", n).expect("fetch"),
            _ => s.fetch::<i32>("eval", n).expect("fetch").into_iter().map(|v| v as f32).collect(),
        })
        .collect()
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x == y) || (x - y).abs() <= 2e-6 * y.abs().max(1.0) || (x.is_nan() && y.is_nan()))
}

#[test]
fn the_compositions_compute_tfs_values() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(4)]).unwrap();
    let y = b.constant("y", DType::F32, &[4], &[1.0, -1.0, 0.5, 0.0]).unwrap();
    let sqd = b.squared_difference(x, y).unwrap();
    let amin = b.argmin(x, -1).unwrap();
    let lse = b.reduce_logsumexp(x, &[1], false).unwrap();
    let lse_keep = b.reduce_logsumexp(x, &[-1], true).unwrap();
    let sm0 = b.softmax_axis(x, 0).unwrap();
    let lsm0 = b.log_softmax_axis(x, 0).unwrap();
    let sm_last = b.softmax_axis(x, -1).unwrap();
    let parts = b.split_n(x, 2, 1).unwrap();
    let sized = b.split_sizes(x, &[1, -1], 1).unwrap();
    assert_eq!(b.graph().node(sqd.node).name, "SquaredDifference/Square", "one name scope, TF's op name");
    let outs = [
        ("sqd", sqd),
        ("amin", amin),
        ("lse", lse),
        ("lse_keep", lse_keep),
        ("sm0", sm0),
        ("lsm0", lsm0),
        ("sm_last", sm_last),
        ("p0", parts[0]),
        ("p1", parts[1]),
        ("s0", sized[0]),
        ("s1", sized[1]),
    ];
    // Row 0: ties for the minimum (argmin takes the first); row 1: a row of
    // -inf (logsumexp -inf, not NaN, as TF's is_finite guard gives).
    let ninf = f32::NEG_INFINITY;
    let xs = [3.0f32, -2.0, -2.0, 0.5, ninf, ninf, ninf, ninf];
    let v = eval(b, &outs, &xs, 2);
    let want_sqd: Vec<f32> =
        xs.iter().zip([1.0f32, -1.0, 0.5, 0.0].iter().cycle()).map(|(a, c)| (a - c) * (a - c)).collect();
    assert!(close(&v[0], &want_sqd), "{:?}", v[0]);
    assert_eq!(v[1], [1.0, 0.0], "the first of tied minima; a row of -inf gives 0");
    let row0: f64 = xs[..4].iter().map(|&a| (a as f64).exp()).sum::<f64>().ln();
    assert!(close(&v[2][..1], &[row0 as f32]) && v[2][1] == ninf, "{:?}", v[2]);
    assert_eq!(v[3].len(), 2, "kept dims: [2, 1]");
    assert!(close(&v[3][..1], &[row0 as f32]), "{:?}", v[3]);
    // Softmax over the batch axis: each column normalized over the 2 rows;
    // a -inf entry gets 0 and its row-mate 1.
    assert!(close(&v[4], &[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]), "{:?}", v[4]);
    assert!(close(&v[5][..4], &[0.0; 4]) && v[5][4..].iter().all(|&l| l == ninf), "{:?}", v[5]);
    let e: Vec<f64> = xs[..4].iter().map(|&a| (a as f64).exp()).collect();
    let z: f64 = e.iter().sum();
    let want: Vec<f32> = e.iter().map(|v| (v / z) as f32).collect();
    assert!(close(&v[6][..4], &want), "{:?}", v[6]);
    assert_eq!(v[7], [3.0, -2.0, ninf, ninf]);
    assert_eq!(v[8], [-2.0, 0.5, ninf, ninf]);
    assert_eq!(v[9], [3.0, ninf]);
    assert_eq!(v[10], [-2.0, -2.0, 0.5, ninf, ninf, ninf]);
}

/// The rounding ops and the stable logs (unary kernels of their own, CPU
/// and CUDA), and BERT's tanh GELU, against their formulas: TF's
/// half-to-even rounding, `sign(-0) = 0`, NaN kept, `log1p`/`expm1` exact
/// near 0 where `log(1 + x)` loses every digit.
#[test]
fn rounding_ops_stable_logs_and_gelu_compute_tfs_values() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(4)]).unwrap();
    let outs = [
        ("floor", b.floor(x).unwrap()),
        ("ceil", b.ceil(x).unwrap()),
        ("round", b.round(x).unwrap()),
        ("sign", b.sign(x).unwrap()),
        ("log1p", b.log1p(x).unwrap()),
        ("expm1", b.expm1(x).unwrap()),
        ("gelu", b.gelu_tanh(x).unwrap()),
    ];
    let xs = [0.5f32, 1.5, -2.5, -0.0, 1e-7, -1.7, 2.0, f32::NAN];
    let v = eval(b, &outs, &xs, 2);
    let same = |a: &[f32], w: &[f32]| a.iter().zip(w).all(|(p, q)| p == q || (p.is_nan() && q.is_nan()));
    assert!(same(&v[0], &[0.0, 1.0, -3.0, -0.0, 0.0, -2.0, 2.0, f32::NAN]), "{:?}", v[0]);
    assert!(same(&v[1], &[1.0, 2.0, -2.0, -0.0, 1.0, -1.0, 2.0, f32::NAN]), "{:?}", v[1]);
    assert!(same(&v[2], &[0.0, 2.0, -2.0, -0.0, 0.0, -2.0, 2.0, f32::NAN]), "half to even: {:?}", v[2]);
    assert!(same(&v[3], &[1.0, 1.0, -1.0, 0.0, 1.0, -1.0, 1.0, f32::NAN]), "{:?}", v[3]);
    assert!(v[3][3].to_bits() == 0.0f32.to_bits(), "sign(-0) is +0, as TF");
    // Near 0: log1p(1e-7) = 1e-7 - 5e-15, expm1(1e-7) = 1e-7 + 5e-15.
    assert!((v[4][4] - 1e-7).abs() <= 1e-13 && (v[5][4] - 1e-7).abs() <= 1e-13, "{} {}", v[4][4], v[5][4]);
    assert!(close(&v[4][..2], &[1.5f32.ln(), 2.5f32.ln()]) && v[4][2].is_nan(), "log1p(-2.5) is NaN: {:?}", v[4]);
    let gelu = |t: f64| 0.5 * t * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (t + 0.044715 * t * t * t)).tanh());
    let want: Vec<f32> = xs.iter().map(|&t| gelu(t as f64) as f32).collect();
    assert!(close(&v[6], &want), "{:?} vs {want:?}", v[6]);
}

#[test]
fn what_tf_refuses_is_refused_naming_the_node() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(5)]).unwrap();
    let e = b.split_n(x, 2, 1).unwrap_err().to_string();
    assert!(e.contains("'split'") && e.contains("evenly divide the split dimension") && e.contains("size = 5"), "{e}");
    let e = b.split_n(x, 2, 0).unwrap_err().to_string();
    assert!(e.contains("unknown"), "{e}");
    let e = b.split_n(x, 0, 1).unwrap_err().to_string();
    assert!(e.contains("at least 1"), "{e}");
    let e = b.split_sizes(x, &[-1, -1], 1).unwrap_err().to_string();
    assert!(e.contains("at most one size may be -1"), "{e}");
    let e = b.split_sizes(x, &[4, 3, -1], 1).unwrap_err().to_string();
    assert!(e.contains("take 7") && e.contains("has 5"), "{e}");
    let e = b.split_sizes(x, &[1, -1], 0).unwrap_err().to_string();
    assert!(e.contains("-1 needs the split dimension 0 known"), "{e}");
    let e = b.softmax_axis(x, 2).unwrap_err().to_string();
    assert!(e.contains("Softmax"), "{e}");
    let e = b.argmin(x, -3).unwrap_err().to_string();
    assert!(e.contains("ArgMin"), "{e}");
    for alpha in [f32::NAN, f32::INFINITY] {
        let e = b.leaky_relu(x, alpha).unwrap_err().to_string();
        assert!(e.contains("LeakyRelu") && e.contains("alpha") && e.contains("finite"), "{e}");
    }
    b.leaky_relu(x, 0.1).expect("a finite slope");
}

/// A model whose loss uses the compositions (an attention-style softmax over
/// a non-last axis, a logsumexp loss, squared differences, split by count)
/// trains at 2 and 3 towers as one device, and its loss falls.
#[test]
fn a_model_of_compositions_trains_at_towers_as_one_device() {
    let mut b = GraphBuilder::with_seed(3);
    let x = b.placeholder("images", DType::F32, [None, Some(8), Some(8), Some(1)]).unwrap();
    let labels = b.placeholder("labels", DType::I32, [None]).unwrap();
    let logits = b
        .variable_scope("net", Reuse::No, |b| {
            let f = b.reshape(x, &[-1, 8, 8])?;
            let w = b.get_variable("w", [8, 8], Initializer::GlorotUniform)?;
            let h = b.matmul(f, w)?;
            let h = b.gelu_tanh(h)?;
            // Attention weights over the rows (axis 1 of [N, 8, 8]).
            let a = b.softmax_axis(h, 1)?;
            let pooled = b.mul(a, h)?;
            let cols = b.reduce_sum(pooled, &[1], false)?;
            let halves = b.split_n(cols, 2, -1)?;
            let d = b.squared_difference(halves[0], halves[1])?;
            let both = b.concat(&[d, halves[0]], -1)?;
            let w2 = b.get_variable("w2", [8, 10], Initializer::GlorotUniform)?;
            b.matmul(both, w2)
        })
        .unwrap();
    // Mean cross entropy written as logsumexp(logits) - logit[label].
    let lse = b.reduce_logsumexp(logits, &[-1], false).unwrap();
    let onehot = b.one_hot(labels, 10, 1.0, 0.0).unwrap();
    let picked = b.mul(logits, onehot).unwrap();
    let true_logit = b.reduce_sum(picked, &[-1], false).unwrap();
    let per = b.sub(lse, true_logit).unwrap();
    let mean = b.reduce_mean(per, &[0], false).unwrap();
    b.identity(mean, "loss").unwrap();
    let model = towers_tests::digits_model(b, logits, 3);
    // One batch, six steps: the loss must fall on it.
    let data = vec![batches(12, 1, 5).remove(0); 6];
    let opt = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    let single = run(&model, &CompileOptions::new(opt.clone(), 12), &data);
    assert!(single.losses.last() < single.losses.first(), "{:?}", single.losses);
    for n in [2u32, 3] {
        let mut o = CompileOptions::new(opt.clone(), 12);
        o.towers = (0..n).map(Device::gpu).collect();
        let t = run(&model, &o, &data);
        let (d, at) = max_rel_diff(&t, &single);
        assert!(d <= TOL, "{n} towers: {at} differs from one device by {d}");
    }
}
