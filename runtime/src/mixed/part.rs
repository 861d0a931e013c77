//! The seam between a mixed session and the backends serving its parts:
//! [`Part`], a [`Backend`] that can also load the share of a plan that
//! runs on some of its devices, lend its memory to the other parts' copies,
//! and cross events with them through a [`Bridge`].
//!
//! A load is two halves, so that every part's memory exists before any
//! part resolves the other parts' buffers:
//! 1. [`Part::reserve`]: allocate the arenas of the devices this part
//!    serves (and nothing else);
//! 2. the mixed backend asks each part to [`Part::lend`] the buffers and
//!    variables that another part's copies name;
//! 3. [`Part::load_part`]: prepare the served devices' streams, with the
//!    lent memory of the other parts in [`PartPlan::foreign`] and the
//!    bridge for every event recorded in one part and waited in another.
//!
//! Invariants a part keeps, on top of [`crate::backend`]'s:
//! - it runs the steps of the streams of served devices, and no others;
//! - a copy between its memory and a foreign buffer is a real copy (the
//!   CPU backend's elision stays within one part), executed by the stream
//!   it sits on;
//! - a `Record` of a bridged event sets the event's flag
//!   ([`Bridge::record`]) once every earlier step of its stream is
//!   complete and its writes are visible to the other parts; a `Wait` on
//!   a bridged event passes once the flag is set ([`Bridge::recorded`]);
//! - its `run` returns only when its share of the step is complete; the
//!   mixed backend clears the bridge's flags between steps, while no part
//!   runs.

use std::collections::BTreeMap;
use std::sync::Arc;

use towers_codegen::{BufRef, Plan};

use super::bridge::Bridge;
use crate::backend::{Backend, BackendError, ProgramId};
use crate::comm::Comm;

/// Where lent memory lives, as the part executing a copy must address it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Host memory; `pinned`: page-locked, so a GPU's copy engines read
    /// and write it directly (what a CUDA part needs of every host buffer
    /// it copies to or from).
    Host { pinned: bool },
    /// Memory of a GPU context, which only its own part can address.
    Device,
}

/// A buffer or variable of one part, lent to another part's copies:
/// `bytes` bytes at address `addr`, valid while the lending part holds the
/// program (or the variable) it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lent {
    pub addr: usize,
    pub bytes: usize,
    pub memory: Memory,
}

/// A reservation made by [`Part::reserve`], consumed by [`Part::load_part`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation(pub usize);

/// What one part is asked to run of a plan.
pub struct PartPlan<'a> {
    /// The whole plan: stream, buffer and event numbers are the plan's.
    pub plan: &'a Plan,
    /// Per plan device (`plan.devices` order): whether this part serves it.
    pub served: &'a [bool],
    /// Every buffer and variable held by another part that a step of a
    /// served stream names (always through a copy: the mixed backend
    /// refuses launches and collectives that name another part's memory).
    pub foreign: &'a BTreeMap<BufRef, Lent>,
    /// The events crossing parts ([`Bridge::is_bridged`]).
    pub bridge: &'a Arc<Bridge>,
}

/// Refuse a `served` list that does not have one flag per plan device
/// (what [`Part::reserve`] checks first).
pub fn check_served(name: &str, plan: &Plan, served: &[bool]) -> Result<(), BackendError> {
    if served.len() != plan.devices.len() {
        return Err(BackendError::BadPlan(format!(
            "a part of program '{name}' was given {} device flags for {} devices",
            served.len(),
            plan.devices.len()
        )));
    }
    Ok(())
}

/// A backend that can serve some of a plan's devices; see the module docs.
pub trait Part: Backend {
    /// The memory kind of this part's buffers and variables, as lent.
    fn memory(&self) -> Memory;

    /// Allocate the arenas of the served devices of `plan` (to be run as
    /// program `name`), before any part resolves another's memory.
    fn reserve(&mut self, name: &str, plan: &Plan, served: &[bool]) -> Result<Reservation, BackendError>;

    /// A served buffer of a reservation, or a variable this part holds, for
    /// another part's copies.
    fn lend(&self, reservation: Reservation, r: &BufRef) -> Result<Lent, BackendError>;

    /// Prepare the served devices' streams of a reserved plan; collectives
    /// across processes go through `comm`.
    fn load_part(
        &mut self,
        reservation: Reservation,
        part: &PartPlan<'_>,
        comm: Arc<dyn Comm>,
    ) -> Result<ProgramId, BackendError>;
}
