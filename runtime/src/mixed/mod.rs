//! # Mixed sessions: one plan, each device served by the backend of its kind
//!
//! (Being built.) [`Part`] is the seam; [`Bridge`] the events crossing parts.

mod bridge;
mod part;

pub use bridge::{Bridge, Ringer};
pub use part::{Lent, Memory, Part, PartPlan, Reservation};
