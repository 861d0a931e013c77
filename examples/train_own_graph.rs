//! Train a model of your own with everything `towers train` has: build a
//! small convnet with the TF1-style builder, save it as a model file
//! (`towers train --graph target/own_graph.json` trains the same file from
//! the command line), and train it on the embedded digits through the
//! library's entry point, `towers::trainer::fit`, at two towers, printing
//! the loss and the training accuracy from an observer.
//!
//! ```sh
//! cargo run --release --example train_own_graph
//! ```

use std::path::Path;

use towers::graph::layers::{self, Activation};
use towers::graph::{DType, GraphBuilder, Padding, Reuse};
use towers::train::{LrScheduleKind, TrainConfig, TrainObserver};
use towers::trainer::{fit, Model};

/// The model: conv 8 3x3, max-pool, dense 10; softmax cross-entropy; the
/// predictions and the batch's accuracy.
fn build() -> Result<Model, towers::graph::GraphError> {
    let mut b = GraphBuilder::with_seed(3);
    let x = b.placeholder("images", DType::F32, [None, Some(8), Some(8), Some(1)])?;
    let y = b.placeholder("labels", DType::I32, [None])?;
    let logits = b.variable_scope("Small", Reuse::No, |b| {
        let h = layers::conv2d(b, "conv", x, 8, [3, 3], Padding::Same, Activation::Relu)?;
        let h = b.max_pool(h, [2, 2], [2, 2], Padding::Same)?;
        let h = b.flatten(h)?;
        layers::dense(b, "logits", h, 10, Activation::None)
    })?;
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y)?;
    let loss = b.reduce_mean_all(xent)?;
    b.identity(loss, "loss")?;
    let pred = b.argmax(logits, 1)?;
    b.identity(pred, "predictions")?;
    let hit = b.equal(pred, y)?;
    let hit = b.cast(hit, DType::F32)?;
    let acc = b.reduce_mean_all(hit)?;
    b.identity(acc, "accuracy")?;
    Ok(Model::new(b.finish(), "loss", "images", "labels", "predictions").with_accuracy("accuracy"))
}

/// Prints every 50th step's loss and training accuracy.
struct Lines {
    acc: f32,
}

impl TrainObserver for Lines {
    fn train_accuracy(&mut self, _step: usize, accuracy: f32) {
        self.acc = accuracy;
    }
    fn step(&mut self, step: usize, loss: f32, _examples_per_sec: f64) {
        if step.is_multiple_of(50) {
            println!("step {step} loss {loss:.4} train acc {:.4}", self.acc);
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = build()?;
    std::fs::create_dir_all("target")?;
    let file = Path::new("target/own_graph.json");
    model.save_json(file)?;
    println!("wrote {} (towers train --graph {} trains it)", file.display(), file.display());
    // The same file loads back as the same model.
    assert_eq!(Model::load_json(file)?.to_json()?, model.to_json()?);
    let cfg =
        TrainConfig::default().with_epochs(4).with_towers(2).with_lr(0.1).with_lr_schedule(LrScheduleKind::Cosine);
    let report = fit(&model, &cfg, &mut Lines { acc: 0.0 })?;
    println!("{} steps, test accuracy {:.4}", report.steps, report.test_accuracy);
    Ok(())
}
