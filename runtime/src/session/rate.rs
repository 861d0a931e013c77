//! The learning rates two programs of one session would share.
//!
//! Every training program reads a learning-rate variable: the one
//! `learning_rate` ([`towers_vocab::LEARNING_RATE`]) of every unnamed
//! optimizer, or its own optimizer's `<name>/learning_rate`
//! (`CompileOptions::optimizer_name`, [`towers_vocab::learning_rate_name`]).
//! Each is created by the first program that declares it, with that
//! program's compiled rate. A later program compiled with another rate for
//! the same variable would silently train at the first one's (as if TF1's
//! `GradientDescentOptimizer(0.01)` ran at 0.5): [`RateOwner::check`]
//! refuses it at load, naming both rates and the ways out (one rate
//! written each step, or an optimizer name per program).
//!
//! Invariant: each rate variable's owner is the first loaded program
//! declaring it with a constant initializer; it changes only by that load.

use std::collections::BTreeMap;

use towers_codegen::Plan;
use towers_vocab::{is_learning_rate, Initializer};

use crate::error::RuntimeError;

/// Per learning-rate variable: which program's compiled rate it holds.
#[derive(Debug, Default)]
pub(super) struct RateOwner(BTreeMap<String, (String, f32)>);

/// The rates `plan` was compiled with: (variable, rate) for each
/// non-trainable learning-rate variable it declares with a constant.
fn compiled_rates(plan: &Plan) -> impl Iterator<Item = (&str, f32)> {
    plan.variables.iter().filter(|v| is_learning_rate(&v.name) && !v.trainable).filter_map(|v| match v.init {
        Initializer::Constant(lr) => Some((v.name.as_str(), lr.0)),
        _ => None,
    })
}

impl RateOwner {
    /// Refuse `plan` (loading as `program`) when it was compiled with
    /// another learning rate than the program that owns the variable.
    pub(super) fn check(&self, program: &str, plan: &Plan) -> Result<(), RuntimeError> {
        for (name, declared) in compiled_rates(plan) {
            if let Some((owner, lr)) = self.0.get(name) {
                if lr.to_bits() != declared.to_bits() {
                    return Err(RuntimeError::LearningRateConflict {
                        program: program.into(),
                        variable: name.into(),
                        declared,
                        owner: owner.clone(),
                        owned: *lr,
                    });
                }
            }
        }
        Ok(())
    }

    /// Record `program` as the owner of each rate it is the first to declare.
    pub(super) fn loaded(&mut self, program: &str, plan: &Plan) {
        for (name, lr) in compiled_rates(plan) {
            self.0.entry(name.to_string()).or_insert_with(|| (program.to_string(), lr));
        }
    }
}
