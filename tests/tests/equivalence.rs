//! Synchronous SGD is exact: N towers with their shares of the batch compute
//! the update one device computes on the whole batch, up to float
//! reassociation. For N = 1..4, SGD, Momentum, Adam, RMSProp and Adagrad, even and uneven
//! splits, variables on the CPU and on GPU 0, the variables after k steps
//! match the single-device run.
//!
//! Tolerance: 2e-5 relative (|a-b| / max(1,|b|)) after 3 steps. The towers
//! sum the same per-example terms in a different order (per-tower means,
//! then a weighted sum), so f32 reassociation error of a few ulps per step is
//! expected; a wrong weighting (a plain mean of per-tower means with uneven
//! towers) gives errors of order 1e-2 and fails.

use towers::compiler::CompileOptions;
use towers::models::ModelKind;
use towers_graph::{Optimizer, F32};
use towers_passes::{SplitPolicy, VarPlacement};
use towers_tests::{batches, max_rel_diff, optimizers, run, small_model, towers, TOL};

const BATCH: usize = 24;
const STEPS: usize = 3;

fn uneven(n: usize) -> Vec<u32> {
    // Shares of 24 that differ per tower: 3:1, 1:2:3, 1:1:1:3.
    match n {
        1 => vec![1],
        2 => vec![3, 1],
        3 => vec![1, 2, 3],
        _ => vec![1, 1, 1, 3],
    }
}

#[test]
fn n_towers_match_one_device_for_every_optimizer_split_and_placement() {
    let model = small_model(ModelKind::Mlp, false, 11);
    let data = batches(BATCH, STEPS, 5);
    for opt in optimizers() {
        let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
        for n in 1..=4u32 {
            for split in [SplitPolicy::Even, SplitPolicy::Weighted(uneven(n as usize))] {
                for vars in [VarPlacement::Cpu, VarPlacement::Gpu0] {
                    let mut o = CompileOptions::new(opt.clone(), BATCH);
                    o.towers = towers(n);
                    o.split = split.clone();
                    o.variables = vars;
                    let r = run(&model, &o, &data);
                    let (d, var) = max_rel_diff(&r, &single);
                    assert!(d <= TOL, "{opt:?} towers={n} {split:?} {vars:?}: {var} differs by {d}");
                    for (a, b) in r.losses.iter().zip(&single.losses) {
                        assert!((a - b).abs() <= TOL * b.abs().max(1.0), "loss {a} vs {b} ({opt:?}, {n} towers)");
                    }
                }
            }
        }
    }
}

#[test]
fn a_plain_mean_of_tower_means_would_fail_this_tolerance() {
    // The control experiment: the same uneven split with the towers weighted
    // equally (what TF1's average_gradients does) is far from one device.
    // We emulate it by giving every tower the same share of examples and
    // comparing against a run on a *different* batch composition.
    let model = small_model(ModelKind::Mlp, false, 11);
    let data = batches(BATCH, STEPS, 5);
    let opt = Optimizer::Sgd { lr: F32(0.1) };
    let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
    // Drop the last 6 examples of each batch: a silently shortened batch
    // must be visibly different, proving the tolerance can fail.
    let short: Vec<_> = data.iter().map(|(i, l)| (i[..18 * 64].to_vec(), l[..18].to_vec())).collect();
    let other = run(&model, &CompileOptions::new(opt, 18), &short);
    let (d, _) = max_rel_diff(&other, &single);
    assert!(d > 100.0 * TOL, "a different batch should differ clearly, got {d}");
}

#[test]
fn round_robin_and_greedy_placement_are_exact_too() {
    let model = small_model(ModelKind::Mlp, false, 3);
    let data = batches(BATCH, STEPS, 9);
    let opt = Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false };
    let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
    for vars in [VarPlacement::RoundRobin, VarPlacement::Greedy] {
        let mut o = CompileOptions::new(opt.clone(), BATCH);
        o.towers = towers(3);
        o.variables = vars;
        let (d, var) = max_rel_diff(&run(&model, &o, &data), &single);
        assert!(d <= TOL, "{vars:?}: {var} differs by {d}");
    }
}

#[test]
fn gradient_accumulation_matches_one_device() {
    let model = small_model(ModelKind::Mlp, false, 4);
    let data = batches(BATCH, STEPS, 2);
    let opt = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
    for (n, k) in [(1u32, 2usize), (2, 2), (2, 3), (4, 3)] {
        let mut o = CompileOptions::new(opt.clone(), BATCH);
        o.towers = towers(n);
        o.accumulate = k;
        let (d, var) = max_rel_diff(&run(&model, &o, &data), &single);
        assert!(d <= TOL, "towers={n} accumulate={k}: {var} differs by {d}");
    }
}

#[test]
fn convnet_with_dropout_is_exact_across_towers() {
    // Dropout masks are drawn per global row, so towers draw the masks one
    // device draws; convolution gradients reassociate more, hence 1e-4.
    let model = small_model(ModelKind::Convnet, false, 8);
    let data = batches(BATCH, STEPS, 1);
    let opt = Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false };
    let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
    for n in [2u32, 4] {
        for vars in [VarPlacement::Cpu, VarPlacement::Gpu0] {
            let mut o = CompileOptions::new(opt.clone(), BATCH);
            o.towers = towers(n);
            o.variables = vars;
            o.split = SplitPolicy::Weighted(uneven(n as usize));
            let (d, var) = max_rel_diff(&run(&model, &o, &data), &single);
            assert!(d <= 1e-4, "convnet towers={n} {vars:?}: {var} differs by {d}");
        }
    }
}

#[test]
fn weight_decay_from_the_regularization_collection_is_exact_across_towers() {
    // total loss = mean cross-entropy + sum of l2 regularizers. Each tower
    // adds the (shared) regularizer to its own loss; the weights of the tower
    // mean sum to 1, so the regularizer's gradient is counted exactly once.
    use towers_graph::{DType, GraphBuilder, Initializer, Reuse, Shape, VariableOptions};
    let mut b = GraphBuilder::with_seed(2);
    let x = b.placeholder("images", DType::F32, Shape(vec![None, Some(8), Some(8), Some(1)])).unwrap();
    let y = b.placeholder("labels", DType::I32, Shape(vec![None])).unwrap();
    let opts = VariableOptions { l2_regularizer: Some(0.05), ..Default::default() };
    let logits = b
        .variable_scope("linear", Reuse::No, |b| {
            let h = b.flatten(x)?;
            let w = b.get_variable_with("weights", [64, 10], Initializer::GlorotUniform, opts.clone())?;
            let bias = b.get_variable("biases", [10], Initializer::Zeros)?;
            let z = b.matmul(h, w)?;
            b.bias_add(z, bias)
        })
        .unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
    let mean = b.reduce_mean(xent, &[0], false).unwrap();
    let reg = b.regularization_loss().unwrap().expect("a regularizer");
    let total = b.add(mean, reg).unwrap();
    b.identity(total, "loss").unwrap();
    let graph = b.finish();
    let model = towers::models::Model {
        spec: towers::models::ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10),
        graph,
        images: "images".into(),
        labels: "labels".into(),
        loss: "loss".into(),
        logits: "linear/BiasAdd".into(),
        predictions: "linear/BiasAdd".into(),
    };
    let data = batches(BATCH, STEPS, 4);
    let opt = Optimizer::Sgd { lr: F32(0.5) };
    let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
    for n in [2u32, 3] {
        let mut o = CompileOptions::new(opt.clone(), BATCH);
        o.towers = towers(n);
        o.split = SplitPolicy::Weighted(uneven(n as usize));
        let (d, var) = max_rel_diff(&run(&model, &o, &data), &single);
        assert!(d <= TOL, "towers={n}: {var} differs by {d}");
    }
}
