//! The trainer for your own graph: [`fit`] trains a [`Model`] (a user's
//! graph and the names of its loss, placeholders, predictions and optional
//! training accuracy) with everything `towers train` has: towers,
//! placement, learning-rate schedules, periodic checkpoints with exact
//! resume, periodic evaluation, TensorBoard and plots (through
//! [`crate::watch::Watch`]), traces, the guards and the backend choice.
//!
//! ```no_run
//! use towers::prelude::*;
//! use towers::trainer::{fit, Model};
//! use towers::train::{Quiet, TrainConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut b = GraphBuilder::with_seed(1);
//! let x = b.placeholder("images", DType::F32, [None, Some(8), Some(8), Some(1)])?;
//! let y = b.placeholder("labels", DType::I32, [None])?;
//! let h = b.flatten(x)?;
//! let logits = layers::dense(&mut b, "logits", h, 10, Activation::None)?;
//! let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y)?;
//! let loss = b.reduce_mean_all(xent)?;
//! let loss = b.identity(loss, "loss")?;
//! let pred = b.argmax(logits, 1)?;
//! let pred = b.identity(pred, "predictions")?;
//! let model = Model::new(b.finish(), "loss", "images", "labels", "predictions");
//! model.save_json(std::path::Path::new("model.json"))?; // for `towers train --graph model.json`
//! let cfg = TrainConfig::default().with_steps(100).with_towers(2);
//! let report = fit(&model, &cfg, &mut Quiet)?;
//! println!("test accuracy {:.3}", report.test_accuracy);
//! # Ok(()) }
//! ```
//!
//! Invariants: one training loop serves the CLI's seed models, `--graph`
//! files and library callers ([`fit`]); the library never prints (progress
//! goes to a [`crate::train::TrainObserver`]); a model is checked
//! ([`Model::check`], [`Model::check_data`]) before anything compiles.

mod async_compile;
mod async_fit;
mod file;
mod fit;
mod model;

pub use async_compile::GRAD_PREFIX;
pub use async_fit::{AsyncReport, NOT_EXACT, SLOW_WORKER_ENV};
pub use file::{ModelFileError, FORMAT, VERSION};
pub(crate) use fit::fit_seed_in;
pub use fit::{fit, fit_datasets, fit_in, TRAIN_ACCURACY};
pub use model::{Model, ModelError};
