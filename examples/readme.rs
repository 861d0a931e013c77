//! The README's example, compiled by `cargo test` (examples are built) and
//! runnable with `cargo run --release --example readme`.

use towers::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut b = GraphBuilder::with_seed(7);
    let x = b.placeholder("images", DType::F32, Shape(vec![None, Some(8), Some(8), Some(1)]))?;
    let y = b.placeholder("labels", DType::I32, Shape(vec![None]))?;
    let logits = b.variable_scope("MLP", Reuse::No, |b| {
        let h = b.flatten(x)?;
        let h = layers::dense(b, "fc1", h, 128, Activation::Relu)?;
        layers::dense(b, "logits", h, 10, Activation::None)
    })?;
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y)?;
    let mean = b.reduce_mean(xent, &[0], false)?;
    b.identity(mean, "loss")?;
    let graph = b.finish();

    // Two towers on /gpu:0 and /gpu:1, variables on the CPU, global batch 64.
    let mut opts = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 64);
    opts.towers = vec![Device::gpu(0), Device::gpu(1)];
    let compiled = compile_train(&graph, "loss", &opts)?;
    println!("{}", compiled.plan.to_text());

    let mut sess = Session::new(7);
    sess.load("train", compiled.plan)?;
    sess.feed("train", "images", &vec![0.5; 64 * 64])?;
    sess.feed("train", "labels", &vec![3; 64])?;
    sess.run("train")?;
    println!("loss {}", sess.fetch::<f32>("train", "loss")?[0]);
    Ok(())
}
