//! The e-graph's elementwise fusion (`simplify::fuse`) changes no bit.
//!
//! Differential test: random small training graphs (a dense layer, then a
//! random chain of elementwise ops over its output, a trainable vector, a
//! broadcast row and constants, then the logits and the cross-entropy) are
//! trained for a few steps on the CPU backend with fusion on and off. A
//! fused kernel runs the same per-op loops in the same order as the
//! launches it replaces, so losses and variables must agree bit for bit,
//! at one device and at two towers. The fused runs must also have fused
//! something (forward and backward chains), so a fusion that silently stops
//! applying fails here. The swish MLP (`--activation swish`) is checked the
//! same way, with its launch counts.

use towers::compiler::{compile_train, CompileOptions};
use towers::models::{build, Model, ModelKind, ModelSpec};
use towers_graph::layers::{self, Activation};
use towers_graph::{DType, Device, GraphBuilder, Initializer, Optimizer, Reuse, Shape, Tensor, F32};
use towers_tests::{batches, run, Rng};

/// A random model on 8x8 inputs: dense 64-16, `ops` random elementwise ops
/// over the hidden activations, dense 16-10, cross-entropy.
fn random_model(seed: u64, ops: usize) -> Model {
    let mut rng = Rng(seed);
    let mut spec = ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10);
    spec.seed = seed;
    let mut b = GraphBuilder::with_seed(seed);
    let images = b.placeholder("images", DType::F32, Shape(vec![None, Some(8), Some(8), Some(1)])).unwrap();
    let labels = b.placeholder("labels", DType::I32, Shape(vec![None])).unwrap();
    let logits = b
        .variable_scope("Random", Reuse::No, |b| {
            let x = b.flatten(images)?;
            let h = layers::dense(b, "fc", x, 16, Activation::None)?;
            let v = b.get_variable("v", vec![16], Initializer::RandomUniform { min: F32(0.5), max: F32(1.5) })?;
            let row =
                b.constant("row", DType::F32, &[16], &(0..16).map(|i| 0.1 * i as f32 - 0.7).collect::<Vec<_>>())?;
            let mut pool: Vec<Tensor> = vec![h];
            for _ in 0..ops {
                let pick = |rng: &mut Rng, pool: &[Tensor]| pool[pool.len() - 1 - rng.below(pool.len().min(3))];
                let a = pick(&mut rng, &pool);
                let t = match rng.below(10) {
                    0 => b.relu(a)?,
                    1 => b.sigmoid(a)?,
                    2 => b.tanh(a)?,
                    3 => b.neg(a)?,
                    4 => {
                        let c = b.scalar(0.5 + rng.below(4) as f32 * 0.25)?;
                        b.mul(a, c)?
                    }
                    5 => b.add(a, v)?,
                    6 => b.mul(a, v)?,
                    7 => b.sub(a, row)?,
                    8 => {
                        let o = pick(&mut rng, &pool);
                        b.add(a, o)?
                    }
                    _ => {
                        let o = pick(&mut rng, &pool);
                        b.mul(a, o)?
                    }
                };
                pool.push(t);
            }
            layers::dense(b, "logits", *pool.last().unwrap(), 10, Activation::None)
        })
        .unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, labels).unwrap();
    let mean = b.reduce_mean(xent, &[0], false).unwrap();
    let loss = b.identity(mean, "loss").unwrap();
    let name = |b: &GraphBuilder, t: Tensor| b.graph().node(t.node).name.clone();
    Model {
        images: name(&b, images),
        labels: name(&b, labels),
        loss: name(&b, loss),
        logits: name(&b, logits),
        predictions: name(&b, logits),
        spec,
        graph: b.finish(),
    }
}

fn fused_launches(text: &str) -> usize {
    text.lines().filter(|l| l.trim_start().starts_with("fused_elementwise ")).count()
}

fn launches(text: &str) -> usize {
    text.lines().filter(|l| l.starts_with("  ") && !l.starts_with("   ") && l.contains(" ; ")).count()
}

#[test]
fn random_graphs_train_bit_for_bit_with_and_without_fusion() {
    let data = batches(8, 3, 11);
    let sgd = Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false };
    let (mut graphs_fused, mut saved) = (0, 0);
    for seed in 0..24u64 {
        let model = random_model(seed, 4 + (seed as usize % 7));
        for towers in [0u32, 2] {
            let mut o = CompileOptions::new(sgd.clone(), 8);
            o.towers = (0..towers).map(Device::gpu).collect();
            let text = compile_train(&model.graph, &model.loss, &o).expect("compiles").plan.to_text();
            let on = run(&model, &o, &data);
            let mut off_opts = o.clone();
            off_opts.fuse_kernels = false;
            let plain = compile_train(&model.graph, &model.loss, &off_opts).expect("compiles").plan.to_text();
            let off = run(&model, &off_opts, &data);
            let what = format!("seed {seed}, towers {towers}");
            assert_eq!(fused_launches(&plain), 0, "{what}: fused with fusion off");
            assert!(launches(&text) <= launches(&plain), "{what}: fusion added launches");
            if fused_launches(&text) > 0 {
                graphs_fused += 1;
                saved += launches(&plain) - launches(&text);
            }
            assert!(on.losses.iter().all(|l| l.is_finite()), "{what}: {:?}", on.losses);
            for (a, b) in on.losses.iter().zip(&off.losses) {
                assert_eq!(a.to_bits(), b.to_bits(), "{what}: losses {:?} vs {:?}", on.losses, off.losses);
            }
            for (name, v) in &off.variables {
                let f = &on.variables[name];
                assert!(f.iter().zip(v).all(|(x, y)| x.to_bits() == y.to_bits()), "{what}: variable {name} differs");
            }
        }
    }
    eprintln!("fused kernels in {graphs_fused} of 48 programs, {saved} launches saved in all");
    assert!(graphs_fused >= 30, "only {graphs_fused} of 48 random programs fused anything");
}

/// The swish MLP: per hidden layer, autodiff's four backward ops (two
/// products, the sigmoid gradient, the sum) become one fused kernel; the
/// forward `sigmoid` is read by the backward too, so it stays its own.
#[test]
fn swish_mlp_fuses_its_backward_and_trains_the_same() {
    let mut spec = ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10);
    spec.hidden = vec![16, 16];
    spec.activation = Activation::Swish;
    spec.seed = 3;
    let model = build(&spec).expect("builds");
    let data = batches(8, 3, 5);
    let adam = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    let o = CompileOptions::new(adam, 8);
    let text = compile_train(&model.graph, &model.loss, &o).expect("compiles").plan.to_text();
    let mut off = o.clone();
    off.fuse_kernels = false;
    let plain = compile_train(&model.graph, &model.loss, &off).expect("compiles").plan.to_text();
    assert_eq!(fused_launches(&text), 2, "{text}");
    assert!(
        text.contains("fused_elementwise (add (mul $0 $1) (sigmoid_grad (mul $2 $0) $1))"),
        "the backward of swish as one kernel:\n{text}"
    );
    assert!(launches(&text) + 6 <= launches(&plain), "{} vs {}", launches(&text), launches(&plain));
    let (a, b) = (run(&model, &o, &data), run(&model, &off, &data));
    assert_eq!(a.losses, b.losses);
    assert_eq!(a.variables, b.variables);
}
