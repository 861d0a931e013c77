//! The math ops, optimizers and initializers of issue 22 end to end on the
//! CPU backend: a small network using every new op (maximum, minimum, pow
//! with a trainable exponent, square, leaky_relu, relu6, softplus) with He
//! and random-normal weights compiles, fuses the new ops into elementwise
//! kernels, trains (the loss falls), and N towers compute the update of one
//! device for every optimizer, RMSProp and Adagrad included.

use towers::compiler::{compile_train, CompileOptions};
use towers::models::Model;
use towers_graph::{DType, GraphBuilder, Initializer, Optimizer, Reuse, Shape, F32};
use towers_passes::SplitPolicy;
use towers_tests::{batches, max_rel_diff, optimizers, run, towers, TOL};

/// images [N,8,8,1] -> h = x·W1 + b1 (W1 He normal) ->
/// m = max(leaky_relu(h), min(relu6(h), softplus(h))) ->
/// p = pow(m² + 1, e) (e a trainable scalar, so pow's exponent gradient
/// runs) -> logits = p·W2 + b2 (W2 random normal) -> mean sparse xent.
fn math_model(seed: u64) -> Model {
    let mut b = GraphBuilder::with_seed(seed);
    let x = b.placeholder("images", DType::F32, Shape(vec![None, Some(8), Some(8), Some(1)])).unwrap();
    let y = b.placeholder("labels", DType::I32, Shape(vec![None])).unwrap();
    let logits = b
        .variable_scope("Math", Reuse::No, |b| {
            let f = b.flatten(x)?;
            let w1 = b.get_variable("w1", [64, 16], Initializer::he_normal())?;
            let b1 = b.get_variable("b1", [16], Initializer::Zeros)?;
            let mm = b.matmul(f, w1)?;
            let h = b.bias_add(mm, b1)?;
            let lr = b.leaky_relu_default(h)?;
            let r6 = b.relu6(h)?;
            let sp = b.softplus(h)?;
            let lo = b.minimum(r6, sp)?;
            let m = b.maximum(lr, lo)?;
            let sq = b.square(m)?;
            let one = b.scalar(1.0)?;
            let base = b.add(sq, one)?;
            let e = b.get_variable("e", Shape(vec![]), Initializer::Constant(F32(0.5)))?;
            let p = b.pow(base, e)?;
            let w2 = b.get_variable("w2", [16, 10], Initializer::RandomNormal { mean: F32(0.0), stddev: F32(0.1) })?;
            let b2 = b.get_variable("b2", [10], Initializer::Zeros)?;
            let l = b.matmul(p, w2)?;
            b.bias_add(l, b2)
        })
        .unwrap();
    towers_tests::mean_xent_model(b, logits, y, seed)
}

const BATCH: usize = 24;

/// Two and three towers (one uneven) give the single device's variables
/// after 3 steps, for every optimizer (the equivalence tests' tolerance).
#[test]
fn towers_match_one_device_with_the_new_ops_for_every_optimizer() {
    let model = math_model(5);
    let data = batches(BATCH, 3, 8);
    for opt in optimizers() {
        let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
        assert!(single.losses.iter().all(|l| l.is_finite()), "{opt:?}: {:?}", single.losses);
        for (n, split) in [(2, SplitPolicy::Even), (3, SplitPolicy::Weighted(vec![1, 2, 3]))] {
            let mut o = CompileOptions::new(opt.clone(), BATCH);
            o.towers = towers(n);
            o.split = split.clone();
            let r = run(&model, &o, &data);
            let (d, var) = max_rel_diff(&r, &single);
            assert!(d <= TOL, "{opt:?} towers={n} {split:?}: {var} differs by {d}");
        }
    }
}

/// Overfitting one batch: 100 steps of RMSProp and of Adagrad on two towers
/// take the loss below 60% of its start, and the exponent e moves (its
/// gradient reaches it). (RMSProp's ms starts at 1, as TF1's, so its first
/// steps are small: 40 steps at lr 0.01 took the loss only from 2.34 to 2.14.)
#[test]
fn the_loss_falls_with_rmsprop_and_adagrad() {
    let model = math_model(6);
    let one = batches(BATCH, 1, 9);
    let data: Vec<_> = (0..100).map(|_| one[0].clone()).collect();
    for opt in [
        Optimizer::RmsProp { lr: F32(0.01), decay: F32(0.9), momentum: F32(0.0), epsilon: F32(1e-10) },
        Optimizer::Adagrad { lr: F32(0.1), initial_accumulator_value: F32(0.1) },
    ] {
        let mut o = CompileOptions::new(opt.clone(), BATCH);
        o.towers = towers(2);
        let r = run(&model, &o, &data);
        let (first, last) = (r.losses[0], *r.losses.last().unwrap());
        assert!(last < 0.6 * first, "{opt:?}: loss {first} -> {last}");
        assert_ne!(r.variables["Math/e"], vec![0.5], "{opt:?}: the exponent trains");
        assert!(r.variables.keys().any(|k| k.starts_with("Math/w1/")), "{opt:?}: slots are variables");
    }
}

/// The new ops are table rows, so the e-graph fuses them into elementwise
/// kernels like any other: in this model the pow gradient's `pow_grad_y`
/// row is fused with its product (the activations, which share their input
/// with several consumers, stay single launches by the cost model); and a
/// fused expression of every new row runs on the CPU as the rows one by one.
/// The plan is the same text twice.
#[test]
fn the_new_ops_fuse_into_elementwise_kernels() {
    use towers::codegen::Step;
    use towers::kernels::Kernel;
    let model = math_model(7);
    let opts = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
    let plan = compile_train(&model.graph, &model.loss, &opts).unwrap().plan;
    assert_eq!(plan.to_text(), compile_train(&model.graph, &model.loss, &opts).unwrap().plan.to_text());
    let mut fused = Vec::new();
    for s in &plan.streams {
        for step in &s.steps {
            if let Step::Launch { kernel: Kernel::Fused { expr, .. }, .. } = step {
                fused.push(expr.to_string());
            }
        }
    }
    assert!(fused.iter().any(|e| e.contains("pow_grad_y:")), "pow_grad_y in no fused kernel:\n{}", fused.join("\n"));

    use towers::kernels::elementwise::{binary, fused as run_fused, unary, FusedExpr};
    use towers::kernels::{BinaryOp, UnaryOp};
    // maximum(relu6(x), softplus(y)) ^ minimum(x, y), with ge_mask of the two: one kernel.
    let e: FusedExpr =
        "ew[$0;relu6:0;$1;softplus:2;maximum:1:3;minimum:0:2;pow:4:5;ge_mask:0:2;mul:6:7]".parse().unwrap();
    let x: Vec<f32> = (0..12).map(|i| i as f32 * 0.7 - 3.0).collect();
    let y: Vec<f32> = (0..12).map(|i| 2.0 - i as f32 * 0.3).collect();
    let mut got = vec![0.0; 12];
    run_fused(&e, &[&x, &y], &[vec![12], vec![12]], &[12], &mut got).unwrap();
    let (mut r6, mut sp, mut mx, mut mn, mut p, mut ge, mut want) =
        (vec![0.0; 12], vec![0.0; 12], vec![0.0; 12], vec![0.0; 12], vec![0.0; 12], vec![0.0; 12], vec![0.0; 12]);
    unary(UnaryOp::Relu6, &x, &mut r6);
    unary(UnaryOp::Softplus, &y, &mut sp);
    binary(BinaryOp::Maximum, &r6, &[12], &sp, &[12], &mut mx).unwrap();
    binary(BinaryOp::Minimum, &x, &[12], &y, &[12], &mut mn).unwrap();
    binary(BinaryOp::Pow, &mx, &[12], &mn, &[12], &mut p).unwrap();
    binary(BinaryOp::GreaterEqualMask, &x, &[12], &y, &[12], &mut ge).unwrap();
    binary(BinaryOp::Mul, &p, &[12], &ge, &[12], &mut want).unwrap();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&want));
}

/// LRN on the CPU backend against TF's formula in f64 (tf.nn.lrn's
/// reference: sqr_sum over the clipped channel window, x / (bias +
/// alpha·sqr_sum)^beta), with TF's defaults (radius 5 over 7 channels: the
/// window is cut at both edges) and with radius 1; within 1e-5 relative,
/// a margin every SIMD path's rounding holds.
#[test]
fn local_response_normalization_matches_tfs_formula() {
    use towers::runtime::Session;
    for (radius, bias, alpha, beta) in [(5usize, 1.0f32, 1.0f32, 0.5f32), (1, 2.0, 0.3, 0.75)] {
        let (n, h, w, c) = (2, 3, 2, 7);
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, [Some(n), Some(h), Some(w), Some(c)]).unwrap();
        let y = b.local_response_normalization(x, radius, bias, alpha, beta).unwrap();
        let y = b.identity(y, "out").unwrap();
        let graph = b.finish();
        let name = graph.node(y.node).name.clone();
        let comp = towers::compiler::compile_eval(&graph, &[("out", name.as_str())], n).expect("compiles");
        let xs: Vec<f32> = (0..n * h * w * c).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect();
        let mut s = Session::new(0);
        s.load("eval", comp.plan).expect("loads");
        s.feed("eval", "x", &xs).expect("feed");
        s.run("eval").expect("runs");
        let got = s.fetch::<f32>("eval", "out").expect("fetch");
        for (p, &g) in got.iter().enumerate() {
            let (row, ch) = (p / c, p % c);
            let lo = ch.saturating_sub(radius);
            let hi = (ch + radius).min(c - 1);
            let sqr: f64 = (lo..=hi).map(|k| (xs[row * c + k] as f64).powi(2)).sum();
            let want = xs[p] as f64 / (bias as f64 + alpha as f64 * sqr).powf(beta as f64);
            assert!((g as f64 - want).abs() <= 1e-5 * want.abs().max(1e-3), "radius {radius} at {p}: {g} vs {want}");
        }
    }
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [Some(2), Some(3)]).unwrap();
    let e = b.local_response_normalization(x, 5, 1.0, 1.0, 0.5).unwrap_err().to_string();
    assert!(e.contains("input must be 4-dimensional"), "{e}");
}
