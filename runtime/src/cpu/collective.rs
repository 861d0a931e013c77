//! The plan's collective step on the CPU backend: the group's buffers are
//! handed to the communicator as one list of slices (reserved at load, so a
//! step allocates nothing), on the thread of the stream that holds the step.

use super::prepare::{AllReduce, Collective};
use crate::comm::CommError;

/// Sum the group's buffers in place over the ranks of its communicator:
/// on every rank, or on the root alone (the others only send); or
/// overwrite them with the root's (a broadcast).
///
/// # Safety
/// The module invariant of [`super::mem`]: no other thread touches the
/// group's buffers while the step runs (they are distinct: checked at load).
pub unsafe fn all_reduce(a: &mut AllReduce) -> Result<(), CommError> {
    let AllReduce { bufs, kind, comm, slices, .. } = a;
    slices.with(bufs.iter().map(|s| s.f32_mut()), |group| match *kind {
        Collective::AllReduce => comm.all_reduce_sum(group),
        Collective::Reduce(root) => comm.reduce_to(root, group),
        Collective::Broadcast(root) => comm.broadcast(root, group),
    })
}
