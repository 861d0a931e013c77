//! The learning rate two programs of one session would share.
//!
//! Every training program reads the one `learning_rate` variable
//! ([`towers_vocab::LEARNING_RATE`]), created by the first program that
//! declares it with that program's compiled rate. A later program compiled
//! with another rate would silently train at the first one's (as if TF1's
//! `GradientDescentOptimizer(0.01)` ran at 0.5): [`RateOwner::check`]
//! refuses it at load, naming both rates and both ways out.
//!
//! Invariant: the owner is the first loaded program declaring the learning
//! rate with a constant initializer; it changes only by that load.

use towers_codegen::Plan;
use towers_vocab::{Initializer, LEARNING_RATE};

use crate::error::RuntimeError;

/// Which program's compiled rate the session's `learning_rate` holds.
#[derive(Debug, Default)]
pub(super) struct RateOwner(Option<(String, f32)>);

/// The rate `plan` was compiled with, where it declares one.
fn compiled_rate(plan: &Plan) -> Option<f32> {
    plan.variables.iter().find(|v| v.name == LEARNING_RATE).and_then(|v| match v.init {
        Initializer::Constant(lr) => Some(lr.0),
        _ => None,
    })
}

impl RateOwner {
    /// Refuse `plan` (loading as `program`) when it was compiled with
    /// another learning rate than the program that owns the variable.
    pub(super) fn check(&self, program: &str, plan: &Plan) -> Result<(), RuntimeError> {
        match (&self.0, compiled_rate(plan)) {
            (Some((owner, lr)), Some(declared)) if lr.to_bits() != declared.to_bits() => {
                Err(RuntimeError::LearningRateConflict {
                    program: program.into(),
                    declared,
                    owner: owner.clone(),
                    owned: *lr,
                })
            }
            _ => Ok(()),
        }
    }

    /// Record `program` as the owner if it is the first to declare a rate.
    pub(super) fn loaded(&mut self, program: &str, plan: &Plan) {
        if self.0.is_none() {
            self.0 = compiled_rate(plan).map(|lr| (program.to_string(), lr));
        }
    }
}
