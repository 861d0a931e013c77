//! Load-time preparation: a [`Plan`]'s steps become [`Exec`]s whose
//! buffers are resolved to [`Slot`]s, with every scratch list reserved, so
//! that running a step allocates nothing. A collective step keeps the
//! communicator it runs through and a reserved list for its group's slices.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use towers_codegen::{BufRef, Kernel, Plan, Step};
use towers_vocab::DType;

use super::mem::{MutSliceList, Region, SliceList, Slot};
use super::store::Store;
use crate::comm::Comm;

/// A resolved buffer: its view and dtype.
#[derive(Debug, Clone, Copy)]
pub struct Buf {
    pub slot: Slot,
    pub dtype: DType,
}

/// One executable step.
pub enum Exec {
    Launch(Box<Launch>),
    AllReduce(Box<AllReduce>),
    Record(usize),
    Wait(usize),
    /// An elided copy (see [`copy_aliases`]): it does nothing but keep its
    /// place, for profiles and traces; named by its node.
    Copy(String),
    /// A real copy between this backend's memory and another part's of a
    /// mixed session (never elided: the two sides are different memory).
    Transfer(Box<Transfer>),
}

/// A copy across parts of a mixed session: 4-byte cells from one view to
/// another of the same length, never overlapping.
pub struct Transfer {
    pub from: Slot,
    pub to: Slot,
    pub node: String,
}

/// A kernel launch with resolved buffers and reserved scratch.
pub struct Launch {
    pub kernel: Kernel,
    pub ins: Vec<Buf>,
    pub outs: Vec<Buf>,
    pub ws: Option<Slot>,
    pub node: String,
    pub slices: SliceList<f32>,
    pub shapes: SliceList<usize>,
    pub mut_slices: MutSliceList<f32>,
}

/// Which collective a [`AllReduce`] step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// `Step::AllReduce`: the sums on every rank.
    AllReduce,
    /// `Step::Reduce`: the sums on this rank alone.
    Reduce(usize),
    /// `Step::Broadcast`: this rank's values to every rank.
    Broadcast(usize),
}

/// A collective step: its f32 buffers, summed in place over the ranks of
/// `comm` (`Step::AllReduce`), onto rank `root` alone (`Step::Reduce`), or
/// overwritten with rank `root`'s (`Step::Broadcast`).
pub struct AllReduce {
    pub bufs: Vec<Slot>,
    pub kind: Collective,
    pub comm: Arc<dyn Comm>,
    pub node: String,
    pub slices: MutSliceList<f32>,
}

/// Everything a program owns at run time.
pub struct Prepared {
    pub arenas: Vec<Arc<Region>>,
    /// Keeps the variables' regions alive while slots point into them.
    pub vars: Vec<Arc<Region>>,
    /// Per plan stream, one entry per plan step (taken by the threads at load).
    pub streams: Vec<Vec<Option<Exec>>>,
    /// Copy destination -> the buffer it reads instead (see [`copy_aliases`]).
    pub aliases: BTreeMap<BufRef, BufRef>,
    /// In a part of a mixed session: the other parts' buffers and variables
    /// this part's copies name, as lent to it (empty otherwise).
    pub foreign: BTreeMap<BufRef, Slot>,
}

/// Copies elided on the CPU backend: every device's arena and the variable
/// store are host memory, so a `Copy` step's destination is resolved to its
/// source and the step does nothing but keep its place between the events.
/// Sound because a copy's source is written at most once per step before the
/// copy (a variable's writer runs after every reader of its copies: the
/// `place` pass orders it so), its bytes are not reused by another buffer
/// until every reader of the copy's destination has run (memory planning
/// and the plan verifier count a destination's accesses as its source's:
/// `towers_codegen::liveness`), and a copy's destination is only read.
/// Chains of copies resolve to the first source. A copy with a `foreign`
/// side (another part's memory, in a mixed session) is a real copy and
/// ends a chain, and so is a copy whose destination has views (a split's
/// parts): a view is read at its own offset in its device's arena, so the
/// bytes must be there.
pub fn copy_aliases(plan: &Plan, foreign: &BTreeMap<BufRef, Slot>) -> BTreeMap<BufRef, BufRef> {
    let viewed = |r: &BufRef| match r {
        BufRef::Arena { device, buffer } => plan.devices.get(*device).is_some_and(|d| {
            d.buffers.iter().any(|b| matches!(b.kind, towers_codegen::BufferKind::View { of } if of == *buffer))
        }),
        _ => false,
    };
    let mut alias: BTreeMap<BufRef, BufRef> = BTreeMap::new();
    for s in &plan.streams {
        for step in &s.steps {
            if let Step::Copy { from, to, .. } = step {
                if foreign.contains_key(from) || foreign.contains_key(to) || viewed(to) {
                    continue;
                }
                alias.insert(to.clone(), from.clone());
            }
        }
    }
    let keys: Vec<BufRef> = alias.keys().cloned().collect();
    for k in keys {
        let mut r = alias[&k].clone();
        let mut hops = 0;
        while let Some(next) = alias.get(&r) {
            r = next.clone();
            hops += 1;
            if hops > alias.len() {
                break;
            }
        }
        alias.insert(k, r);
    }
    alias
}

/// Resolve a reference, following elided copies.
pub fn resolve_aliased(
    plan: &Plan,
    arenas: &[Arc<Region>],
    store: &Store,
    aliases: &BTreeMap<BufRef, BufRef>,
    foreign: &BTreeMap<BufRef, Slot>,
    r: &BufRef,
) -> Result<Buf, String> {
    resolve(plan, arenas, store, foreign, aliases.get(r).unwrap_or(r))
}

/// Resolve a reference to a buffer: this backend's arenas and store, or
/// memory another part lent (`foreign`, in a mixed session).
pub fn resolve(
    plan: &Plan,
    arenas: &[Arc<Region>],
    store: &Store,
    foreign: &BTreeMap<BufRef, Slot>,
    r: &BufRef,
) -> Result<Buf, String> {
    if let Some(slot) = foreign.get(r) {
        let dtype = match r {
            BufRef::Arena { .. } => plan.buffer(r).map(|b| b.dtype),
            BufRef::Variable(n) => plan.variables.iter().find(|v| &v.name == n).map(|v| v.dtype),
        };
        let dtype = dtype.ok_or_else(|| format!("{} is not a buffer of the plan", plan.ref_name(r)))?;
        return Ok(Buf { slot: *slot, dtype });
    }
    match r {
        BufRef::Arena { device, buffer } => {
            let b = plan.buffer(r).ok_or_else(|| format!("buffer {device}/{buffer} does not exist"))?;
            // The CPU arenas hold 4-byte cells: every dtype of a plan today.
            let elem = b.dtype.size_bytes();
            if elem != 4 || b.offset % elem != 0 {
                return Err(format!(
                    "buffer '{}' of {} at offset {} does not fit 4-byte cells",
                    b.name, b.dtype, b.offset
                ));
            }
            let arena = arenas.get(*device).ok_or_else(|| format!("device {device} does not exist"))?;
            let slot = arena
                .slot(b.offset / elem, b.len())
                .ok_or_else(|| format!("buffer '{}' lies outside its arena", b.name))?;
            Ok(Buf { slot, dtype: b.dtype })
        }
        BufRef::Variable(n) => {
            let v = store.vars.get(n).ok_or_else(|| format!("variable '{n}' is not in the store"))?;
            Ok(Buf { slot: v.region.all(), dtype: v.dtype })
        }
    }
}

/// Build the arenas and executable streams of `plan`; the store must hold
/// its variables. Collective steps run through `comm`.
pub fn prepare(plan: &Plan, store: &Store, comm: &Arc<dyn Comm>) -> Result<Prepared, String> {
    let arenas = arenas(plan, comm)?;
    prepare_in(plan, arenas, store, comm, BTreeMap::new(), None)
}

/// The arenas of the devices a part of a mixed session serves, from the
/// store's allocator (pinned where a GPU copies them); an unserved device
/// gets an empty region (its buffers are another part's).
pub fn part_arenas(plan: &Plan, store: &Store, served: &[bool]) -> Result<Vec<Arc<Region>>, String> {
    plan.devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let len = if served.get(i).copied().unwrap_or(false) { d.arena_bytes.div_ceil(4) } else { 0 };
            Region::new_in(&*store.memory, len)
                .map(Arc::new)
                .map_err(|e| format!("the arena of {} ({} B): {e}", d.device, len * 4))
        })
        .collect()
}

/// The arenas of a whole plan on this backend.
fn arenas(plan: &Plan, comm: &Arc<dyn Comm>) -> Result<Vec<Arc<Region>>, String> {
    // The arenas holding gradient buckets live in memory the other ranks of
    // this host can address, where the communicator lends it (collective:
    // every rank asks for the same devices in the same order).
    let bucket_devices: BTreeSet<usize> = plan
        .streams
        .iter()
        .flat_map(|s| &s.steps)
        .filter_map(|s| match s {
            Step::AllReduce { buffers, .. } => Some(buffers),
            _ => None,
        })
        .flatten()
        .filter_map(|r| match r {
            BufRef::Arena { device, .. } => Some(*device),
            BufRef::Variable(_) => None,
        })
        .collect();
    Ok(plan
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let len = d.arena_bytes.div_ceil(4);
            let lent = (comm.world_size() > 1 && bucket_devices.contains(&i))
                .then(|| comm.shared_memory(len * 4))
                .flatten()
                .and_then(|m| Region::lent(m, len, Arc::clone(comm)));
            Arc::new(lent.unwrap_or_else(|| Region::new(len)))
        })
        .collect())
}

/// [`prepare`] with the arenas made: of the whole plan, or of a part of a
/// mixed session (`served`: the plan devices whose constants this part
/// fills; `foreign`: the other parts' memory its copies name).
pub fn prepare_in(
    plan: &Plan,
    arenas: Vec<Arc<Region>>,
    store: &Store,
    comm: &Arc<dyn Comm>,
    foreign: BTreeMap<BufRef, Slot>,
    served: Option<&[bool]>,
) -> Result<Prepared, String> {
    let vars = plan.variables.iter().filter_map(|v| store.vars.get(&v.name).map(|x| Arc::clone(&x.region))).collect();
    for c in &plan.constants {
        if let (Some(served), BufRef::Arena { device, .. }) = (served, &c.buffer) {
            if !served.get(*device).copied().unwrap_or(false) {
                continue;
            }
        }
        let b = resolve(plan, &arenas, store, &foreign, &c.buffer)?;
        if b.slot.len() != c.data.len() {
            return Err(format!(
                "constant {} has {} values for {} elements",
                plan.ref_name(&c.buffer),
                c.data.len(),
                b.slot.len()
            ));
        }
        // SAFETY: the arenas are new and not shared with any thread yet.
        unsafe {
            match b.dtype {
                DType::F32 => b.slot.f32_mut().copy_from_slice(&c.data),
                _ => b.slot.i32_mut().iter_mut().zip(&c.data).for_each(|(o, v)| *o = *v as i32),
            }
        }
    }
    let aliases = copy_aliases(plan, &foreign);
    let resolve = |plan: &Plan, arenas: &[Arc<Region>], store: &Store, r: &BufRef| {
        resolve_aliased(plan, arenas, store, &aliases, &foreign, r)
    };
    let mut streams = Vec::new();
    for s in &plan.streams {
        let mut execs = Vec::new();
        for step in &s.steps {
            execs.push(Some(match step {
                Step::Record(e) | Step::Wait(e) if *e >= plan.num_events => {
                    return Err(format!("event {e} is out of range (the plan has {})", plan.num_events))
                }
                Step::Record(e) => Exec::Record(*e),
                Step::Wait(e) => Exec::Wait(*e),
                Step::Copy { from, to, bytes, node } => {
                    // Checked against the plan's own buffers, then elided
                    // (or, across parts of a mixed session, copied).
                    let (f, t) = (
                        resolve_aliased(plan, &arenas, store, &BTreeMap::new(), &foreign, from)?,
                        resolve_aliased(plan, &arenas, store, &BTreeMap::new(), &foreign, to)?,
                    );
                    if f.slot.len() != t.slot.len() || f.slot.len() * 4 != *bytes || f.slot.overlaps(&t.slot) {
                        return Err(format!("copy '{node}' has mismatched or overlapping buffers"));
                    }
                    if foreign.contains_key(from) || foreign.contains_key(to) || !aliases.contains_key(to) {
                        Exec::Transfer(Box::new(Transfer { from: f.slot, to: t.slot, node: node.clone() }))
                    } else {
                        Exec::Copy(node.clone())
                    }
                }
                Step::AllReduce { buffers, node }
                | Step::Reduce { buffers, node, .. }
                | Step::Broadcast { buffers, node, .. } => {
                    let kind = match step {
                        Step::Reduce { root, .. } | Step::Broadcast { root, .. } if *root >= comm.world_size() => {
                            return Err(format!(
                                "collective '{node}' names rank {root} as its root, but the communicator has {} rank(s); compile the program for this world size (--world-size)",
                                comm.world_size()
                            ));
                        }
                        Step::Reduce { root, .. } => Collective::Reduce(*root),
                        Step::Broadcast { root, .. } => Collective::Broadcast(*root),
                        _ => Collective::AllReduce,
                    };
                    let mut bufs: Vec<Slot> = Vec::with_capacity(buffers.len());
                    for r in buffers {
                        if aliases.contains_key(r) {
                            return Err(format!(
                                "all-reduce '{node}' writes {}, the destination of a copy (copies are elided on the CPU backend, so their destinations are read-only)",
                                plan.ref_name(r)
                            ));
                        }
                        let b = resolve(plan, &arenas, store, r)?;
                        if b.dtype != DType::F32 {
                            return Err(format!("all-reduce '{node}' sums f32 buffers; {} is {}", plan.ref_name(r), b.dtype));
                        }
                        if bufs.iter().any(|o| o.overlaps(&b.slot)) {
                            return Err(format!("all-reduce '{node}' names overlapping buffers ({})", plan.ref_name(r)));
                        }
                        bufs.push(b.slot);
                    }
                    let n = bufs.len();
                    Exec::AllReduce(Box::new(AllReduce {
                        bufs,
                        kind,
                        comm: Arc::clone(comm),
                        node: node.clone(),
                        slices: MutSliceList::with_capacity(n),
                    }))
                }
                Step::Launch { kernel, inputs, outputs, workspace, node } => {
                    let ins = inputs.iter().map(|r| resolve(plan, &arenas, store, r)).collect::<Result<Vec<_>, _>>()?;
                    let outs =
                        outputs.iter().map(|r| resolve(plan, &arenas, store, r)).collect::<Result<Vec<_>, _>>()?;
                    let ws = workspace.as_ref().map(|r| resolve(plan, &arenas, store, r)).transpose()?;
                    super::exec::check(kernel, &ins, &outs, ws.as_ref()).map_err(|e| format!("launch '{node}': {e}"))?;
                    let ws = ws.map(|b| b.slot);
                    for (k, o) in outs.iter().enumerate() {
                        // Output 0 may be input 0 itself for a kernel that works in place.
                        let aliased = |j: usize, i: &Buf| k == 0 && j == 0 && kernel.in_place_ok() && i.slot.same(&o.slot);
                        let reads = ins.iter().enumerate().any(|(j, i)| !aliased(j, i) && i.slot.overlaps(&o.slot));
                        if reads || ws.is_some_and(|w| w.overlaps(&o.slot)) {
                            return Err(format!("launch '{node}' writes a buffer it also reads"));
                        }
                    }
                    let n = ins.len().max(outs.len());
                    Exec::Launch(Box::new(Launch {
                        kernel: kernel.clone(),
                        ins,
                        outs,
                        ws,
                        node: node.clone(),
                        slices: SliceList::with_capacity(n),
                        shapes: SliceList::with_capacity(n),
                        mut_slices: MutSliceList::with_capacity(n),
                    }))
                }
            }));
        }
        streams.push(execs);
    }
    Ok(Prepared { arenas, vars, streams, aliases, foreign })
}
