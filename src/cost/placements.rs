//! Every placement of one model predicted: what `towers compile
//! --explain-cost` prints and `--variables auto` chooses from.
//!
//! Each candidate is compiled with the caller's options, only its tower
//! count and variable placement changed, calibrated (or its calibration
//! read from the cache directory the caller gives) and predicted on this
//! machine's cores. Candidates come in the order given, so a tie keeps the
//! first ([`super::choose`]).

use std::path::Path;

use towers_graph::{Device, Graph};
use towers_passes::{CompileOptions, VarPlacement};

use super::explain::{choose, predict, Choice, Prediction};
use super::{cores, Calibration, CostError};
use crate::compiler::compile_train;

/// The placements `--explain-cost` and `--variables auto` compare, TF1's default first.
pub const PLACEMENTS: [VarPlacement; 4] =
    [VarPlacement::Cpu, VarPlacement::Gpu0, VarPlacement::RoundRobin, VarPlacement::Greedy];

/// Untraced steps before a calibration's traced ones, and traced steps.
pub const WARMUP: usize = 5;
pub const TRACED: usize = 15;

/// One predicted candidate.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub towers: usize,
    pub placement: VarPlacement,
    pub prediction: Prediction,
    /// Whether its calibration came from the cache.
    pub cached: bool,
}

/// Compile, calibrate (through the cache in `cache`) and predict `model`
/// (loss node `loss`) at `towers` towers (0: one device, no towers) with
/// `placement`, other options from `base`.
pub fn candidate(
    model: &Graph,
    loss: &str,
    base: &CompileOptions,
    towers: usize,
    placement: VarPlacement,
    cache: &Path,
) -> Result<Candidate, CostError> {
    let mut o = base.clone();
    o.towers = (0..towers as u32).map(Device::gpu).collect();
    o.variables = placement;
    let c = compile_train(model, loss, &o)?;
    let (cal, cached) = Calibration::cached(cache, &c.plan, WARMUP, TRACED)?;
    let prediction = predict(&c.plan, &cal, cores(), 5)?;
    Ok(Candidate { towers, placement, prediction, cached })
}

/// Every placement of [`PLACEMENTS`] at `towers` towers, predicted, and the
/// fastest with its reason.
pub fn auto(
    model: &Graph,
    loss: &str,
    base: &CompileOptions,
    towers: usize,
    cache: &Path,
) -> Result<Choice, CostError> {
    let mut preds = Vec::with_capacity(PLACEMENTS.len());
    for v in PLACEMENTS {
        preds.push((v, candidate(model, loss, base, towers, v, cache)?.prediction));
    }
    choose(&preds).ok_or_else(|| CostError::Shape("no placement to choose from".into()))
}

/// Input geometry and classes of a data set without loading it: the
/// embedded digits are 8x8x1, MNIST (embedded or IDX files) 28x28x1; both
/// have 10 classes.
pub fn geometry(data: &crate::data::DataSpec) -> ([usize; 3], usize) {
    match data {
        crate::data::DataSpec::Digits => ([8, 8, 1], 10),
        crate::data::DataSpec::Mnist5k | crate::data::DataSpec::Mnist(_) => ([28, 28, 1], 10),
    }
}

/// The model a training configuration builds, at this input geometry
/// (what [`crate::train::TrainConfig::model_spec`] builds from the loaded data).
pub fn model_spec(cfg: &crate::train::TrainConfig, input: [usize; 3], classes: usize) -> crate::models::ModelSpec {
    let mut s = crate::models::ModelSpec::new(cfg.model, input, classes);
    s.hidden = cfg.hidden.clone();
    s.activation = cfg.activation;
    s.batch_norm = cfg.batch_norm;
    s.seed = cfg.seed;
    s
}
