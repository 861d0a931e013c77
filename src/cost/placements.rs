//! Every placement of one model predicted: what `towers compile
//! --explain-cost` prints and `--variables auto` chooses from.
//!
//! Each candidate is compiled with the caller's options, only its tower
//! count and variable placement changed, calibrated (or its calibration
//! read from the cache directory the caller gives) and predicted on this
//! machine's cores. Candidates come in the order given, so a tie keeps the
//! first ([`super::choose`]).
//!
//! A [`Target`] says which backend: the CPU backend, or CUDA as a mixed
//! session (`cpu:*` on host threads, `gpu:*` on the GPU), opened by
//! [`crate::train::open_session`] as `towers train --backend cuda` opens
//! it: a CUDA context per logical GPU, so the calibration times the peer
//! copies between contexts and the eager launches a step spanning them
//! runs (each context's trace counts from its own origin: see
//! `towers_runtime::cuda`'s `trace` module).

use std::path::Path;

use towers_graph::{Device, Graph};
use towers_passes::{CompileOptions, VarPlacement};

use towers_runtime::{LocalComm, Session};

use super::explain::{choose, predict, Choice, Prediction};
use super::{cores, Calibration, CostError};
use crate::compiler::compile_train;

/// The placements `--explain-cost` and `--variables auto` compare, TF1's default first.
pub const PLACEMENTS: [VarPlacement; 4] =
    [VarPlacement::Cpu, VarPlacement::Gpu0, VarPlacement::RoundRobin, VarPlacement::Greedy];

/// Untraced steps before a calibration's traced ones, and traced steps.
pub const WARMUP: usize = 5;
pub const TRACED: usize = 15;

/// The backend candidates are calibrated and predicted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The CPU backend: every device a host thread.
    Cpu,
    /// A CUDA mixed session (`--backend cuda`).
    Cuda,
}

impl Target {
    /// A fresh session of this backend to calibrate in (graphs on; a CUDA
    /// context per logical GPU, as a run opens it); without
    /// CUDA, the error `--backend cuda` gives ([`crate::train::TrainError`]).
    pub fn session(self) -> Result<Session, CostError> {
        let comm: std::sync::Arc<dyn towers_runtime::Comm> = std::sync::Arc::new(LocalComm::single());
        let choice = match self {
            Target::Cpu => crate::train::BackendChoice::Cpu,
            Target::Cuda => crate::train::BackendChoice::Cuda,
        };
        crate::train::open_session(choice, 0, &comm, true, false)
            .map(|(s, _)| s)
            .map_err(|e| CostError::Session(e.to_string()))
    }
}

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
    candidate_on(Target::Cpu, model, loss, base, towers, placement, cache)
}

/// [`candidate`] calibrated and predicted on `target`.
pub fn candidate_on(
    target: Target,
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
    let (cal, cached) = Calibration::cached_in(cache, target.session()?, &c.plan, WARMUP, TRACED)?;
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
    auto_on(Target::Cpu, model, loss, base, towers, cache)
}

/// [`auto`] on `target`.
pub fn auto_on(
    target: Target,
    model: &Graph,
    loss: &str,
    base: &CompileOptions,
    towers: usize,
    cache: &Path,
) -> Result<Choice, CostError> {
    let mut preds = Vec::with_capacity(PLACEMENTS.len());
    for v in PLACEMENTS {
        preds.push((v, candidate_on(target, model, loss, base, towers, v, cache)?.prediction));
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
