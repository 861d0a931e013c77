//! The session's step is one count for every training program, as TF1's
//! `global_step`: two training programs run in turn (one for the last
//! short batch, a warm-up program, a fine-tuning one) draw their dropout
//! masks from one sequence. Before, each program counted its own runs, so
//! alternating two programs repeated every mask twice.

use towers::prelude::*;

fn graph() -> Graph {
    let mut b = GraphBuilder::with_seed(3);
    let x = b.placeholder("x", DType::F32, [None, Some(16)]).unwrap();
    let y = b.placeholder("y", DType::I32, [None]).unwrap();
    let h = b.dropout(x, 0.5).unwrap();
    let logits = layers::dense(&mut b, "fc", h, 2, Activation::None).unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
    let loss = b.reduce_mean(xent, &[0], false).unwrap();
    b.identity(loss, "loss").unwrap();
    b.finish()
}

fn run(programs: &[&str], set_step: Option<u64>, lr: f32) -> Vec<f32> {
    let g = graph();
    let o = CompileOptions::new(Optimizer::Sgd { lr: F32(lr) }, 4);
    let mut s = Session::new(0);
    for p in ["a", "b"] {
        s.load(p, compile_train(&g, "loss", &o).unwrap().plan).unwrap();
    }
    if let Some(step) = set_step {
        s.set_step("b", step).unwrap();
    }
    let xs: Vec<f32> = (0..64).map(|i| ((i * 13 % 17) as f32 - 8.0) / 8.0).collect();
    let ys = [0i32, 1, 1, 0];
    programs
        .iter()
        .map(|p| {
            s.feed(p, "x", &xs).unwrap();
            s.feed(p, "y", &ys).unwrap();
            s.run(p).unwrap();
            s.fetch::<f32>(p, "loss").unwrap()[0]
        })
        .collect()
}

#[test]
fn two_training_programs_run_in_turn_continue_one_step_count() {
    let one = run(&["a", "a", "a", "a"], None, 0.1);
    let alternating = run(&["a", "b", "a", "b"], None, 0.1);
    assert_eq!(alternating, one, "the same masks in the same order");
    assert!(one.windows(2).all(|w| w[0] != w[1]), "each step draws new masks: {one:?}");
}

/// With a learning rate of 0 a step's loss depends on its mask only:
/// setting the step of one training program moves every training program
/// to it.
#[test]
fn setting_one_training_programs_step_sets_the_sessions() {
    let straight = run(&["a"; 9], None, 0.0);
    let resumed = run(&["a", "b"], Some(7), 0.0);
    assert_eq!(resumed, straight[7..9], "steps 7 and 8, whichever program runs them");
}

/// Dropout on a tensor whose axis 0 is not the examples' (attention heads
/// folded into it: `[batch * heads, d]`): each tower starts its masks at its
/// first example's elements, so towers draw one device's masks (before,
/// tower 1 re-drew tower 0's second half).
#[test]
fn dropout_over_folded_heads_draws_one_devices_masks_at_every_tower_count() {
    let graph = || {
        let mut b = GraphBuilder::with_seed(5);
        let x = b.placeholder("x", DType::F32, [None, Some(8)]).unwrap();
        let w = b.get_variable("w", [8], Initializer::Ones).unwrap();
        let h = b.mul(x, w).unwrap();
        let heads = b.reshape(h, &[-1, 4]).unwrap();
        let d = b.dropout(heads, 0.5).unwrap();
        let back = b.reshape(d, &[-1, 8]).unwrap();
        let sq = b.square(back).unwrap();
        let loss = b.reduce_mean_all(sq).unwrap();
        b.identity(loss, "loss").unwrap();
        b.finish()
    };
    let run = |towers: u32| {
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
        o.towers = (0..towers).map(Device::gpu).collect();
        let mut s = Session::new(0);
        s.load("train", compile_train(&graph(), "loss", &o).unwrap().plan).unwrap();
        s.feed("train", "x", &[1.0f32; 64]).unwrap();
        s.run("train").unwrap();
        (s.fetch::<f32>("train", "loss").unwrap()[0], s.variable::<f32>("w").unwrap())
    };
    let (l0, w0) = run(0);
    for towers in [2, 4] {
        let (l, w) = run(towers);
        assert!((l - l0).abs() <= 1e-6 * l0, "{towers} towers: loss {l}, one device {l0}");
        assert!(w.iter().zip(&w0).all(|(a, b)| (a - b).abs() <= 1e-6), "{towers} towers: {w:?} vs {w0:?}");
    }
}
