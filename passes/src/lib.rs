//! towers-passes: every transformation of a [`Graph`].
//!
//! A pass is one file, one type implementing [`Pass`]; the [`PassManager`]
//! runs a list of them over a graph and a [`CompileState`] (the facts passes
//! hand on to each other: the loss, the gradients, the towers, the schedule),
//! times each pass, runs the verifier after each one in debug builds, and can
//! dump the graph (text and dot) after a named pass into a caller-chosen
//! folder. Passes refer to nodes by name ([`TensorRef`]), never by index held
//! across passes.

pub mod manager;
pub mod state;

pub use manager::{Pass, PassManager, PassTiming};
pub use state::{CompileState, Diagnostic, PassError, Schedule, ScheduleItem, ScheduledStream, StreamKind, TensorRef};
