//! A [`Session`]'s per-program step count (what step-dependent kernels,
//! dropout, draw from) and its instrumentation: profiles and traces.
//!
//! Invariant: every training program's next run takes the session's step
//! (`Session::train_step`, TF1's `global_step`), whatever program ran last;
//! `set_step` on a training program sets it for all of them.

use super::Session;
use crate::backend::Profiled;
use crate::error::RuntimeError;
use crate::trace::Trace;

impl Session {
    /// Turn per-item timing of `program` on (totals restart) or off.
    pub fn set_profiling(&mut self, program: &str, on: bool) -> Result<(), RuntimeError> {
        let id = self.program(program)?.id;
        self.backend.set_profiling(id, on);
        Ok(())
    }

    /// Time spent in each launch, copy, wait and collective of `program`
    /// while profiling was on, with the stream's name.
    pub fn profile(&self, program: &str) -> Result<Vec<Profiled>, RuntimeError> {
        Ok(self.backend.profile(self.program(program)?.id))
    }

    /// Record the timeline of each run of `program` from now on (`on`), or
    /// stop; a traced run still allocates nothing. The CUDA backend refuses
    /// ([`RuntimeError::Unsupported`]).
    pub fn set_tracing(&mut self, program: &str, on: bool) -> Result<(), RuntimeError> {
        let id = self.program(program)?.id;
        self.backend.set_tracing(id, on).map_err(|e| RuntimeError::from_backend(program, e))
    }

    /// The timeline of `program`'s last run while tracing was on.
    pub fn trace(&self, program: &str) -> Result<Trace, RuntimeError> {
        self.backend.trace(self.program(program)?.id).map_err(|e| RuntimeError::from_backend(program, e))
    }

    /// How many steps `program` has run.
    pub fn steps_run(&self, program: &str) -> Result<u64, RuntimeError> {
        Ok(self.backend.steps_run(self.program(program)?.id))
    }

    /// Make `program`'s next run step `step` (0-based) for step-dependent
    /// kernels (dropout), as after `step` runs: how a resumed run continues
    /// the random streams it would have drawn without stopping.
    ///
    /// For a training program this is the session's step, which every
    /// training program's next run takes (see [`Session::run`]).
    pub fn set_step(&mut self, program: &str, step: u64) -> Result<(), RuntimeError> {
        let p = self.program(program)?;
        let (id, train) = (p.id, p.plan.mode == towers_codegen::Mode::Train);
        self.backend.set_step(id, step);
        if train {
            self.train_step = Some(step);
        }
        Ok(())
    }
}
