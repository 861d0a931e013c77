//! The seed models and deterministic batches the GPU tests train on
//! (`cuda_backend`, `cuda_mixed`).

use towers::data::Dataset;
use towers::models::{build, Model, ModelKind, ModelSpec};

/// A seed model with seed 7, on `input` (HxWxC), 10 classes.
pub fn model(kind: ModelKind, input: [usize; 3], hidden: Vec<usize>, batch_norm: bool) -> Model {
    let mut s = ModelSpec::new(kind, input, 10);
    s.hidden = hidden;
    s.batch_norm = batch_norm;
    s.seed = 7;
    build(&s).expect("the seed models build")
}

/// `steps` synthetic batches of `batch` examples for `m`'s input.
pub fn data(m: &Model, batch: usize, steps: usize) -> Vec<(Vec<f32>, Vec<i32>)> {
    let [h, w, c] = m.spec.input;
    let d = Dataset::synthetic(batch * steps, h, w, c, 10, 3).expect("synthetic data");
    let px = h * w * c;
    (0..steps)
        .map(|s| {
            (d.images()[s * batch * px..(s + 1) * batch * px].to_vec(), d.labels()[s * batch..(s + 1) * batch].to_vec())
        })
        .collect()
}
