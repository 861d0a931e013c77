//! The CUDA backend as a [`Part`] of a mixed session: it serves the `gpu:*`
//! devices of a plan, while the host's `cpu:*` devices are served by a CPU
//! backend whose memory is pinned ([`super::PinnedHost`]).
//!
//! What the part runs:
//! - **Its devices only.** [`Part::reserve`] allocates the arenas of the
//!   served devices (an unserved device has no arena here); load prepares
//!   the streams of served devices, and every other stream of the plan is
//!   an empty stream here. Constants and feeds of unserved devices belong
//!   to the other parts. Variables placed on served devices are created in
//!   this part; the others are foreign.
//! - **Copies with a foreign side** ([`copy_call`]): another part's memory
//!   is always host memory (the only other kind of part is the CPU
//!   backend). A copy from pinned host memory to this part's device memory
//!   is `cuMemcpyHtoDAsync` on the copy's own stream, the other way
//!   `cuMemcpyDtoHAsync`; pageable host memory, another GPU part's memory,
//!   or two foreign ends are [`BackendError::BadPlan`] naming the buffer.
//! - **Bridged events** ([`event_calls`]): a `Record` of an event another
//!   part waits on records the CUDA event and then writes 1 into the
//!   event's pinned flag with `cuStreamWriteValue32` (the default flags
//!   put a memory barrier before the write, and stream order puts it after
//!   every earlier operation of the stream, a copy into host memory
//!   included: the bridge's invariant). A `Wait` on an event recorded by
//!   another part is `cuStreamWaitValue32(flag, 1, GEQ)`. An event both
//!   recorded and waited here stays a CUDA event (its `Wait` is
//!   `cuStreamWaitEvent`), bridged or not.
//!
//! Why stream memory operations rather than `cuLaunchHostFunc`: a host
//! function runs on the driver's one callback thread, which serializes
//! every callback of the process, may not call CUDA, and costs a thread
//! hand-off per event in both directions; a host-function wait would also
//! block that thread while the CPU part computes. A `cuStreamWaitValue32`
//! is executed by the GPU's front end polling one word of mapped pinned
//! memory, and a `cuStreamWriteValue32` is one posted write: no host
//! thread sits in the path of a step, and the CPU part's waiters read the
//! flag with acquire loads (polling, since a GPU write rings nobody). The
//! flags take the same values every step (the mixed backend clears them
//! between steps), so the operations are the same in every step and a
//! CUDA graph may hold them: load captures the part's step like any other
//! program, and where the driver refuses to capture a stream memory
//! operation, the capture fails, the program stays eager, and
//! `program_note` gives the driver's reason (see `super::graph`). Both
//! claims (capture, and the cost per crossing) are unmeasured until a GPU
//! is lent; see docs/cuda.md.
//!
//! **Enqueue order.** A `cuStreamWaitValue32` blocks the hardware queue
//! its stream is mapped to (a GPU has few: streams share them), and CUDA
//! does not see the dependency it expresses (the driver's documentation
//! warns of exactly this deadlock). So a part's items are enqueued in the
//! whole plan's sequential order (`crate::cpu::global_order`, over every
//! part's streams), not in the standalone backend's round robin
//! ([`part_order`]): for every wait on a host record, each `Signal` the
//! host's record depends on comes earlier in that order, so in any queue
//! they share the write is ahead of the wait.
//!
//! Invariants: the lent addresses of this part are device addresses (only
//! this part ever addresses them); a reservation's arenas move into the
//! program at [`Part::load_part`], unmoved (their device addresses are
//! what was lent); a reservation is consumed once.

use std::collections::BTreeMap;
use std::sync::Arc;

use towers_codegen::{BufRef, Plan, Step};

use super::driver::DevMem;
use super::CudaBackend;
use crate::backend::{BackendError, ProgramId};
use crate::comm::Comm;
use crate::mixed::{Lent, Memory, Part, PartPlan, Reservation};

/// A plan's arenas reserved before load: `None` for unserved devices.
pub(crate) struct Reserved {
    pub plan: Plan,
    pub arenas: Vec<Option<DevMem>>,
}

/// Where one end of a copy lives, as this part resolves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// This part's device memory, at this device address.
    Own(u64),
    /// Another part's memory, as it lent it.
    Foreign(Lent),
}

/// Which driver call a plan copy becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyCall {
    DtoD { dst: u64, src: u64 },
    HtoD { dst: u64, src: usize },
    DtoH { dst: usize, src: u64 },
}

/// The call of copy `node` of `bytes` bytes from `from` (named
/// `from_name`) to `to` (named `to_name`); see the module docs.
pub(crate) fn copy_call(
    node: &str,
    (from, from_name): (End, &str),
    (to, to_name): (End, &str),
    bytes: usize,
) -> Result<CopyCall, String> {
    let foreign = |l: &Lent, name: &str| -> Result<usize, String> {
        match l.memory {
            Memory::Host { pinned: true } if l.bytes >= bytes => Ok(l.addr),
            Memory::Host { pinned: true } => {
                Err(format!("copy '{node}': {name} lends {} bytes, the copy moves {bytes}", l.bytes))
            }
            Memory::Host { pinned: false } => Err(format!(
                "copy '{node}': {name} is in pageable host memory, which a GPU's copy engines cannot read or write asynchronously; make the mixed session's host memory pinned (towers_runtime::mixed::MixedBackend::with_cuda allocates it with CudaBackend::pinned_host)"
            )),
            Memory::Device => Err(format!(
                "copy '{node}': {name} is in another GPU part's memory, which this CUDA part cannot address (one CUDA part serves every gpu:* device of a session)"
            )),
        }
    };
    match (from, to) {
        (End::Own(src), End::Own(dst)) => Ok(CopyCall::DtoD { dst, src }),
        (End::Foreign(l), End::Own(dst)) => Ok(CopyCall::HtoD { dst, src: foreign(&l, from_name)? }),
        (End::Own(src), End::Foreign(l)) => Ok(CopyCall::DtoH { dst: foreign(&l, to_name)?, src }),
        (End::Foreign(_), End::Foreign(_)) => Err(format!(
            "copy '{node}' from {from_name} to {to_name}: both ends are another part's memory, so it belongs to that part's streams, not to a GPU stream"
        )),
    }
}

/// What a plan's `Record` or `Wait` becomes in this part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventCall {
    /// `cuEventRecord`.
    Record(usize),
    /// `cuStreamWriteValue32(flag, 1)` (after the `Record`).
    Signal(usize),
    /// `cuStreamWaitEvent`.
    Wait(usize),
    /// `cuStreamWaitValue32(flag, 1, GEQ)`.
    WaitFlag(usize),
}

/// The calls of one event step; `bridged(e)`: whether another part waits
/// on or records `e`; `recorded_here[e]`: whether a stream this part runs
/// records `e`. Other steps give nothing.
pub(crate) fn event_calls(step: &Step, bridged: &dyn Fn(usize) -> bool, recorded_here: &[bool]) -> Vec<EventCall> {
    match *step {
        Step::Record(e) if bridged(e) => vec![EventCall::Record(e), EventCall::Signal(e)],
        Step::Record(e) => vec![EventCall::Record(e)],
        Step::Wait(e) if bridged(e) && !recorded_here.get(e).copied().unwrap_or(false) => {
            vec![EventCall::WaitFlag(e)]
        }
        Step::Wait(e) => vec![EventCall::Wait(e)],
        _ => Vec::new(),
    }
}

/// Per plan stream: whether its device is served (`served`, per plan
/// device). A stream of a device the plan does not list is not served.
pub(crate) fn served_streams(plan: &Plan, served: &[bool]) -> Vec<bool> {
    plan.streams
        .iter()
        .map(|s| {
            plan.devices.iter().position(|d| d.device == s.device).is_some_and(|i| served.get(i).copied() == Some(true))
        })
        .collect()
}

/// Per plan event: whether a served stream records it.
pub(crate) fn recorded_by(plan: &Plan, streams: &[bool]) -> Vec<bool> {
    let mut rec = vec![false; plan.num_events];
    for (s, _) in plan.streams.iter().zip(streams).filter(|(_, on)| **on) {
        for step in &s.steps {
            if let Step::Record(e) = step {
                if let Some(r) = rec.get_mut(*e) {
                    *r = true;
                }
            }
        }
    }
    rec
}

/// Whether plan buffer `r` lies on a served device (variables: never, as
/// buffers; see [`CudaBackend::lend`]).
pub(crate) fn on_served(r: &BufRef, served: &[bool]) -> bool {
    matches!(r, BufRef::Arena { device, .. } if served.get(*device).copied() == Some(true))
}

impl Part for CudaBackend {
    fn memory(&self) -> Memory {
        Memory::Device
    }

    fn reserve(&mut self, name: &str, plan: &Plan, served: &[bool]) -> Result<Reservation, BackendError> {
        crate::mixed::check_served(name, plan, served)?;
        let arenas = self.arenas(plan, served)?;
        self.as_part = true;
        self.reserved.push(Some(Reserved { plan: plan.clone(), arenas }));
        Ok(Reservation(self.reserved.len() - 1))
    }

    fn lend(&self, reservation: Reservation, r: &BufRef) -> Result<Lent, BackendError> {
        if let BufRef::Variable(n) = r {
            let v = self
                .vars
                .get(n)
                .ok_or_else(|| BackendError::Access(format!("variable '{n}' is not held by the CUDA part")))?;
            return Ok(Lent { addr: v.mem.ptr as usize, bytes: v.len * 4, memory: Memory::Device });
        }
        let res = self.reserved.get(reservation.0).and_then(|r| r.as_ref()).ok_or_else(|| {
            BackendError::Access(format!("reservation {} of the CUDA part is not pending", reservation.0))
        })?;
        let d = self.resolve(&res.plan, &res.arenas, r).map_err(BackendError::Access)?;
        Ok(Lent { addr: d.ptr as usize, bytes: d.len * 4, memory: Memory::Device })
    }

    fn load_part(
        &mut self,
        reservation: Reservation,
        part: &PartPlan<'_>,
        comm: Arc<dyn Comm>,
    ) -> Result<ProgramId, BackendError> {
        let res = self.reserved.get_mut(reservation.0).and_then(Option::take).ok_or_else(|| {
            BackendError::Access(format!("reservation {} of the CUDA part is not pending", reservation.0))
        })?;
        if res.plan.program != part.plan.program || res.arenas.len() != part.plan.devices.len() {
            return Err(BackendError::BadPlan(format!(
                "reservation {} was made for program '{}', not '{}'",
                reservation.0, res.plan.program, part.plan.program
            )));
        }
        let p = self.prepare(part.plan, &comm, res.arenas, Some(part))?;
        self.programs.push(p);
        Ok(ProgramId(self.programs.len() - 1))
    }
}

/// The device addresses of the bridged flags this part's streams use
/// (`None` for the others), from `flag_device(e)`.
pub(crate) fn flag_addresses(
    calls: impl Iterator<Item = EventCall>,
    num_events: usize,
    mut flag_device: impl FnMut(usize) -> Result<u64, String>,
) -> Result<BTreeMap<usize, u64>, String> {
    let mut flags = BTreeMap::new();
    for c in calls {
        if let EventCall::Signal(e) | EventCall::WaitFlag(e) = c {
            if e >= num_events {
                return Err(format!("event {e} is out of range (the plan has {num_events})"));
            }
            if let std::collections::btree_map::Entry::Vacant(v) = flags.entry(e) {
                v.insert(flag_device(e)?);
            }
        }
    }
    Ok(flags)
}

/// The host's enqueue order of a part's items (`(stream, item)`), from
/// the whole plan's sequential order `global` (`(stream, step)`) and, per
/// plan stream, the plan step of each of its items here (in stream
/// order; unserved streams have none): each step's items where the step
/// falls. An item the order never reaches is an error.
pub(crate) fn part_order(global: &[(usize, usize)], item_steps: &[Vec<usize>]) -> Result<Vec<(usize, usize)>, String> {
    let mut pos = vec![0usize; item_steps.len()];
    let mut order = Vec::with_capacity(item_steps.iter().map(Vec::len).sum());
    for &(s, j) in global {
        let Some(steps) = item_steps.get(s) else { continue };
        while steps.get(pos[s]) == Some(&j) {
            order.push((s, pos[s]));
            pos[s] += 1;
        }
    }
    match pos.iter().zip(item_steps).position(|(p, steps)| *p < steps.len()) {
        Some(s) => Err(format!("stream {s}'s step {} is not in the plan's order", item_steps[s][pos[s]])),
        None => Ok(order),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(addr: usize, pinned: bool) -> End {
        End::Foreign(Lent { addr, bytes: 64, memory: Memory::Host { pinned } })
    }

    #[test]
    fn copies_become_the_call_of_their_ends() {
        let c = |f, t| copy_call("n", (f, "a"), (t, "b"), 64);
        assert_eq!(c(End::Own(1), End::Own(2)), Ok(CopyCall::DtoD { dst: 2, src: 1 }));
        assert_eq!(c(host(100, true), End::Own(2)), Ok(CopyCall::HtoD { dst: 2, src: 100 }));
        assert_eq!(c(End::Own(1), host(200, true)), Ok(CopyCall::DtoH { dst: 200, src: 1 }));
        let pageable = c(host(100, false), End::Own(2)).unwrap_err();
        assert!(pageable.contains("'n'") && pageable.contains("a is in pageable") && pageable.contains("with_cuda"));
        let back = c(End::Own(1), host(200, false)).unwrap_err();
        assert!(back.contains("b is in pageable"), "{back}");
        let dev = End::Foreign(Lent { addr: 9, bytes: 64, memory: Memory::Device });
        assert!(c(dev, End::Own(2)).unwrap_err().contains("another GPU part"));
        assert!(c(host(1, true), host(2, true)).unwrap_err().contains("both ends"));
        let short = copy_call("n", (host(100, true), "a"), (End::Own(2), "b"), 128).unwrap_err();
        assert!(short.contains("lends 64 bytes") && short.contains("moves 128"), "{short}");
    }

    #[test]
    fn bridged_events_become_flag_operations() {
        let bridged = |e: usize| e == 1 || e == 2;
        // Event 1 is recorded here (and waited elsewhere, maybe here too); 2 elsewhere.
        let here = [true, true, false];
        use EventCall::*;
        assert_eq!(event_calls(&Step::Record(0), &bridged, &here), vec![Record(0)]);
        assert_eq!(event_calls(&Step::Record(1), &bridged, &here), vec![Record(1), Signal(1)]);
        assert_eq!(event_calls(&Step::Wait(0), &bridged, &here), vec![Wait(0)]);
        assert_eq!(event_calls(&Step::Wait(1), &bridged, &here), vec![Wait(1)]);
        assert_eq!(event_calls(&Step::Wait(2), &bridged, &here), vec![WaitFlag(2)]);
        let calls = [Record(1), Signal(1), WaitFlag(2), WaitFlag(2), Wait(0)];
        let mut asked = Vec::new();
        let flags = flag_addresses(calls.into_iter(), 3, |e| {
            asked.push(e);
            Ok(1000 + 4 * e as u64)
        })
        .expect("flags");
        assert_eq!(flags.into_iter().collect::<Vec<_>>(), vec![(1, 1004), (2, 1008)]);
        assert_eq!(asked, vec![1, 2]);
        assert!(flag_addresses([Signal(5)].into_iter(), 3, |_| Ok(0)).unwrap_err().contains("out of range"));
        assert!(flag_addresses([WaitFlag(0)].into_iter(), 3, |_| Err("pageable".into())).is_err());
    }

    #[test]
    fn a_part_enqueues_in_the_whole_plans_order() {
        // Stream 0 is the host's (no items here); stream 1 has a step lowered to two items.
        let global = [(1, 0), (0, 0), (2, 0), (1, 1), (0, 1), (2, 1)];
        let items = vec![vec![], vec![0, 1, 1], vec![0, 1]];
        let order = part_order(&global, &items).expect("order");
        assert_eq!(order, vec![(1, 0), (2, 0), (1, 1), (1, 2), (2, 1)]);
        let missing = part_order(&global[..3], &items).unwrap_err();
        assert!(missing.contains("stream 1's step 1"), "{missing}");
    }

    #[test]
    fn served_streams_and_their_records() {
        use towers_codegen::{DevicePlan, Mode, StreamPlan};
        use towers_vocab::{Device, StreamKind};
        let dev = |d: Device| DevicePlan { device: d, buffers: Vec::new(), arena_bytes: 0 };
        let stream = |d: Device, steps| StreamPlan { device: d, kind: StreamKind::Compute, steps };
        let (cpu, g0, g1) = (Device::cpu(0), Device::gpu(0), Device::gpu(1));
        let plan = Plan {
            program: "p".into(),
            mode: Mode::Train,
            devices: vec![dev(cpu), dev(g0), dev(g1)],
            variables: Vec::new(),
            constants: Vec::new(),
            feeds: Vec::new(),
            fetches: Vec::new(),
            tensors: Vec::new(),
            streams: vec![
                stream(cpu, vec![Step::Record(0), Step::Wait(1)]),
                stream(g0, vec![Step::Wait(0), Step::Record(1)]),
                stream(g1, vec![Step::Record(2)]),
            ],
            num_events: 3,
            task: None,
            unread_feeds: Vec::new(),
        };
        let s = served_streams(&plan, &[false, true, true]);
        assert_eq!(s, vec![false, true, true]);
        assert_eq!(recorded_by(&plan, &s), vec![false, true, true]);
        assert!(on_served(&BufRef::Arena { device: 1, buffer: 0 }, &[false, true, true]));
        assert!(!on_served(&BufRef::Arena { device: 0, buffer: 0 }, &[false, true, true]));
        assert!(!on_served(&BufRef::Variable("w".into()), &[true, true, true]));
    }
}
