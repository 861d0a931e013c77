//! `CompileOptions::clip_global_norm`, TF1's `tf.clip_by_global_norm` on
//! the averaged gradients: the update's direction is kept and its global
//! norm is `lr · clip` once the gradients' norm exceeds `clip`; N towers and
//! every placement clip what one device clips.

use towers::passes::ProcessGroup;
use towers::prelude::*;

const BATCH: usize = 8;

fn model() -> Graph {
    let mut b = GraphBuilder::with_seed(5);
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(6)])).unwrap();
    let y = b.placeholder("y", DType::I32, Shape(vec![None])).unwrap();
    let h = layers::dense(&mut b, "fc1", x, 5, Activation::Tanh).unwrap();
    let logits = layers::dense(&mut b, "fc2", h, 3, Activation::None).unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
    let mean = b.reduce_mean(xent, &[0], false).unwrap();
    b.identity(mean, "loss").unwrap();
    b.finish()
}

/// Every trainable variable's change over one SGD step (lr 1), concatenated
/// in declaration order.
fn update(clip: Option<f32>, towers: u32, variables: VarPlacement) -> Vec<f32> {
    let mut opts = CompileOptions::new(Optimizer::Sgd { lr: F32(1.0) }, BATCH);
    opts.towers = (0..towers).map(Device::gpu).collect();
    opts.variables = variables;
    opts.clip_global_norm = clip;
    let plan = compile_train(&model(), "loss", &opts).unwrap().plan;
    let mut names: Vec<String> = plan.variables.iter().filter(|v| v.trainable).map(|v| v.name.clone()).collect();
    names.sort();
    let mut s = Session::new(0);
    s.load("t", plan).unwrap();
    let before: Vec<f32> = names.iter().flat_map(|n| s.variable::<f32>(n).unwrap().to_vec()).collect();
    let xs: Vec<f32> = (0..BATCH * 6).map(|i| ((i * 7) % 11) as f32 * 0.3 - 1.5).collect();
    let ys: Vec<i32> = (0..BATCH).map(|i| (i % 3) as i32).collect();
    s.feed("t", "x", &xs).unwrap();
    s.feed("t", "y", &ys).unwrap();
    s.run("t").unwrap();
    let after: Vec<f32> = names.iter().flat_map(|n| s.variable::<f32>(n).unwrap().to_vec()).collect();
    after.iter().zip(&before).map(|(a, b)| a - b).collect()
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt()
}

#[test]
fn a_large_norm_is_clipped_to_the_bound_and_keeps_its_direction() {
    let free = update(None, 0, VarPlacement::Cpu);
    let n = norm(&free);
    assert!(n > 0.05, "the test needs a gradient norm above the bound: {n}");
    // Above the gradients' norm nothing changes, bit for bit (scale 1).
    assert_eq!(update(Some(1e6), 0, VarPlacement::Cpu), free);
    let clip = 0.01f32;
    let clipped = update(Some(clip), 0, VarPlacement::Cpu);
    assert!((norm(&clipped) - clip as f64).abs() <= 1e-5, "norm {} (bound {clip})", norm(&clipped));
    let ratio = clip as f64 / n;
    for (c, f) in clipped.iter().zip(&free) {
        assert!((*c as f64 - *f as f64 * ratio).abs() <= 1e-6 * (1.0 + (*f as f64).abs()), "{c} vs {f} * {ratio}");
    }
}

#[test]
fn towers_and_placements_clip_what_one_device_clips() {
    let one = update(Some(0.01), 0, VarPlacement::Cpu);
    let scale = one.iter().fold(0f32, |m, v| m.max(v.abs()));
    for towers in [2, 4] {
        for variables in [VarPlacement::Cpu, VarPlacement::Gpu0, VarPlacement::RoundRobin] {
            let got = update(Some(0.01), towers, variables);
            let diff = got.iter().zip(&one).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            // Reassociation across towers only (the update is about 1e-2).
            assert!(diff <= 1e-4 * scale, "{towers} towers, {variables:?}: max |diff| {diff} (scale {scale})");
        }
    }
}

#[test]
fn a_bound_that_cannot_clip_and_several_processes_are_refused() {
    let mut opts = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
    for bad in [0.0, -1.0, f32::NAN] {
        opts.clip_global_norm = Some(bad);
        let e = compile_train(&model(), "loss", &opts).expect_err("refused").to_string();
        assert!(e.contains("clip_global_norm"), "{e}");
    }
    opts.clip_global_norm = Some(5.0);
    opts.process = ProcessGroup::new(0, 2).unwrap();
    let e = compile_train(&model(), "loss", &opts).expect_err("refused").to_string();
    assert!(e.contains("several processes"), "{e}");
}
