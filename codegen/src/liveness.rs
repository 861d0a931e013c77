//! Happens-before between a plan's steps, and each arena buffer's live
//! range in that order: what memory planning ([`crate::arena`]) shares bytes
//! by, and what the verifier ([`crate::verify`]) recomputes from the steps
//! to check that sharing.
//!
//! **The order.** Step `i` of a stream happens before step `i + 1` of the
//! same stream, and `Record(e)` happens before every `Wait(e)`;
//! happens-before is the transitive closure of these edges. Every stream is
//! a chain, so the closure is kept as vector clocks rather than as one
//! bitset of predecessors per step: for each step, per stream, how many of
//! that stream's steps happen before it or are it. Step `(t, j)` happens
//! before step `b` exactly when `b`'s clock counts more than `j` steps of
//! `t` (and `b` is not `(t, j)` itself): O(steps x streams) memory and time,
//! where a bitset closure is O(steps²).
//!
//! **Accesses.** Every arena operand of a step (a launch's inputs, outputs
//! and workspace, both sides of a copy, an all-reduce's group) is an access
//! to its buffer, with two folds that make the sets what every backend
//! needs:
//! - an access to a view is an access to the buffer it views;
//! - an access to a copy's destination is also an access to the copy's
//!   source (and to that source's own sources): the CPU backend elides
//!   copies between its host arenas and reads the source in place, so a
//!   source must keep its bytes until the last reader of every copy of it.
//!
//! **Live ranges.** A buffer's accesses are summarized by two clocks:
//! `last[t]`, how many steps of stream `t` up to its last access on `t`,
//! and `first[t]`, the fewest steps of `t` that strictly happen before any
//! of its accesses. [`Liveness::before`]`(a, b)` (every access of `a`
//! happens before every access of `b`) is then `last_a[t] <= first_b[t]` for
//! every stream `t`: O(streams) per pair. Two buffers may share bytes only
//! when one is before the other; a buffer without accesses is before and
//! after everything.
//!
//! Everything here is deterministic (vectors walked in order) and never
//! panics on a malformed plan: an event that cannot be replayed makes
//! [`Order::new`] return `None`, a reference to nothing is skipped.

use std::collections::BTreeMap;

use crate::plan::{BufRef, Step, StreamPlan};

/// Happens-before between the steps of a list of streams, as vector clocks.
#[derive(Debug, Clone)]
pub struct Order {
    streams: usize,
    /// Global index of each stream's step 0.
    start: Vec<usize>,
    /// Per global step, `streams` counters: steps of each stream that
    /// happen before this step or are it.
    clocks: Vec<u32>,
}

impl Order {
    /// The order of `streams`' steps, or None when their events cannot be
    /// replayed (an event out of range or recorded twice, a wait whose
    /// record never runs).
    pub fn new(streams: &[StreamPlan], num_events: usize) -> Option<Order> {
        let n = streams.len();
        let mut start = Vec::with_capacity(n);
        let mut total = 0usize;
        for s in streams {
            start.push(total);
            total = total.checked_add(s.steps.len())?;
        }
        // Counters are u32: a plan this size is far beyond any real one.
        if u32::try_from(total).is_err() {
            return None;
        }
        let mut recorded: BTreeMap<usize, usize> = BTreeMap::new();
        for (si, s) in streams.iter().enumerate() {
            for (i, step) in s.steps.iter().enumerate() {
                match step {
                    Step::Record(e) | Step::Wait(e) if *e >= num_events => return None,
                    Step::Record(e) if recorded.insert(*e, start[si] + i).is_some() => return None,
                    _ => {}
                }
            }
        }
        let mut clocks = vec![0u32; total.checked_mul(n)?];
        // Replay: a stream advances until it waits on an event whose record
        // has not run yet, and parks on that event until it does.
        let mut done = vec![false; num_events];
        let mut parked: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let mut pos = vec![0usize; n];
        let mut ready: Vec<usize> = (0..n).rev().collect();
        let mut ran = 0usize;
        while let Some(si) = ready.pop() {
            while let Some(step) = streams[si].steps.get(pos[si]) {
                let i = pos[si];
                let g = start[si] + i;
                if let Step::Wait(e) = step {
                    if !done[*e] {
                        parked.entry(*e).or_default().push(si);
                        break;
                    }
                }
                if i > 0 {
                    clocks.copy_within((g - 1) * n..g * n, g * n);
                }
                // A wait runs only after its record (`done`), so the record is known.
                if let Some(&r) = match step {
                    Step::Wait(e) => recorded.get(e),
                    _ => None,
                } {
                    for t in 0..n {
                        clocks[g * n + t] = clocks[g * n + t].max(clocks[r * n + t]);
                    }
                }
                clocks[g * n + si] = (i + 1) as u32;
                if let Step::Record(e) = step {
                    done[*e] = true;
                    if let Some(mut w) = parked.remove(e) {
                        ready.append(&mut w);
                    }
                }
                pos[si] += 1;
                ran += 1;
            }
        }
        (ran == total).then_some(Order { streams: n, start, clocks })
    }

    /// Number of streams.
    pub fn streams(&self) -> usize {
        self.streams
    }

    /// Per stream, how many of its steps strictly happen before step
    /// `index` of stream `stream` (its own stream counts `index`).
    fn strict(&self, stream: usize, index: usize) -> impl Iterator<Item = u32> + '_ {
        let g = self.start[stream] + index;
        let c = &self.clocks[g * self.streams..(g + 1) * self.streams];
        c.iter().enumerate().map(move |(t, &k)| if t == stream { index as u32 } else { k })
    }

    /// Whether step `a` = (stream, index) strictly happens before step `b`.
    pub fn happens_before(&self, a: (usize, usize), b: (usize, usize)) -> bool {
        a != b && self.strict(b.0, b.1).nth(a.0).is_some_and(|k| k as usize > a.1)
    }

    /// How many steps of stream `t` strictly happen before step `b`.
    pub fn count_before(&self, b: (usize, usize), t: usize) -> u32 {
        self.strict(b.0, b.1).nth(t).unwrap_or(0)
    }
}

/// Every arena reference a step touches, in operand order.
pub fn step_refs(step: &Step) -> Vec<&BufRef> {
    match step {
        Step::Launch { inputs, outputs, workspace, .. } => {
            inputs.iter().chain(outputs).chain(workspace.iter()).filter(|r| matches!(r, BufRef::Arena { .. })).collect()
        }
        Step::Copy { from, to, .. } => [from, to].into_iter().filter(|r| matches!(r, BufRef::Arena { .. })).collect(),
        Step::AllReduce { buffers, .. } | Step::Reduce { buffers, .. } | Step::Broadcast { buffers, .. } => {
            buffers.iter().filter(|r| matches!(r, BufRef::Arena { .. })).collect()
        }
        Step::Record(_) | Step::Wait(_) => Vec::new(),
    }
}

/// A buffer of a device as `(device, buffer)`, views folded to their base.
pub type Key = (usize, usize);

/// The buffers whose accesses an access to each base buffer also is: the
/// buffer itself, then the sources of the copies into it, transitively
/// (see the module docs), each once, in discovery order.
pub struct Folds {
    sources: BTreeMap<Key, Vec<Key>>,
}

impl Folds {
    /// The copy sources of `streams`, with `base` mapping a reference to its
    /// base buffer (None for a reference to nothing).
    pub fn new(streams: &[StreamPlan], base: &impl Fn(&BufRef) -> Option<Key>) -> Folds {
        let mut direct: BTreeMap<Key, Vec<Key>> = BTreeMap::new();
        for s in streams {
            for step in &s.steps {
                if let Step::Copy { from, to, .. } = step {
                    if let (Some(f), Some(t)) = (base(from), base(to)) {
                        let v = direct.entry(t).or_default();
                        if !v.contains(&f) {
                            v.push(f);
                        }
                    }
                }
            }
        }
        // Close each destination over its sources' sources (cycles stop at a repeat).
        let mut sources = BTreeMap::new();
        for &d in direct.keys() {
            let mut seen: Vec<Key> = Vec::new();
            let mut stack: Vec<Key> = direct[&d].iter().rev().copied().collect();
            while let Some(k) = stack.pop() {
                if k == d || seen.contains(&k) {
                    continue;
                }
                seen.push(k);
                if let Some(more) = direct.get(&k) {
                    stack.extend(more.iter().rev().copied());
                }
            }
            sources.insert(d, seen);
        }
        Folds { sources }
    }

    /// The sources an access to `key` also touches.
    pub fn sources(&self, key: Key) -> &[Key] {
        self.sources.get(&key).map_or(&[], |v| v.as_slice())
    }
}

/// The live ranges of every buffer of every device (see the module docs).
/// Views have no range of their own: their accesses are their base's.
#[derive(Debug, Clone)]
pub struct Liveness {
    streams: usize,
    /// Per device, per buffer, `streams` counters each.
    last: Vec<Vec<u32>>,
    first: Vec<Vec<u32>>,
}

impl Liveness {
    /// Live ranges for devices of `buffers[d]` buffers each; `base` maps a
    /// reference to its base buffer (None for a reference to nothing), and
    /// `folds` are the copies of the same streams ([`Folds::new`]).
    pub fn new(
        streams: &[StreamPlan],
        order: &Order,
        buffers: &[usize],
        base: &impl Fn(&BufRef) -> Option<Key>,
        folds: &Folds,
    ) -> Liveness {
        let n = order.streams();
        let mut last: Vec<Vec<u32>> = buffers.iter().map(|&b| vec![0; b * n]).collect();
        let mut first: Vec<Vec<u32>> = buffers.iter().map(|&b| vec![u32::MAX; b * n]).collect();
        for (si, s) in streams.iter().enumerate() {
            for (i, step) in s.steps.iter().enumerate() {
                for r in step_refs(step) {
                    let Some(k) = base(r) else { continue };
                    for &(d, b) in std::iter::once(&k).chain(folds.sources(k)) {
                        let (Some(l), Some(f)) = (last.get_mut(d), first.get_mut(d)) else { continue };
                        if (b + 1) * n > l.len() {
                            continue;
                        }
                        l[b * n + si] = l[b * n + si].max((i + 1) as u32);
                        for (t, c) in order.strict(si, i).enumerate() {
                            f[b * n + t] = f[b * n + t].min(c);
                        }
                    }
                }
            }
        }
        Liveness { streams: n, last, first }
    }

    /// Whether every access of buffer `a` of `device` happens before every
    /// access of its buffer `b` (vacuously true when either has none).
    pub fn before(&self, device: usize, a: usize, b: usize) -> bool {
        let n = self.streams;
        let (l, f) = (&self.last[device], &self.first[device]);
        (0..n).all(|t| l[a * n + t] <= f[b * n + t])
    }

    /// Whether buffer `b` of `device` is accessed by any step.
    pub fn accessed(&self, device: usize, b: usize) -> bool {
        let n = self.streams;
        self.last[device][b * n..(b + 1) * n].iter().any(|&c| c > 0)
    }

    /// A stream `t` where `a`'s last access is not before all of `b`'s
    /// accesses, with the index of `a`'s last access on `t` and the count
    /// `b`'s accesses need (`before` is false exactly when one exists).
    pub fn witness(&self, device: usize, a: usize, b: usize) -> Option<(usize, usize, u32)> {
        let n = self.streams;
        let (l, f) = (&self.last[device], &self.first[device]);
        (0..n).find(|&t| l[a * n + t] > f[b * n + t]).map(|t| (t, l[a * n + t] as usize - 1, l[a * n + t]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use towers_kernels::{Kernel, UnaryOp};
    use towers_vocab::{Device, StreamKind};

    fn relu(i: usize, o: usize) -> Step {
        Step::Launch {
            kernel: Kernel::Unary { op: UnaryOp::Relu },
            inputs: vec![BufRef::Arena { device: 0, buffer: i }],
            outputs: vec![BufRef::Arena { device: 0, buffer: o }],
            workspace: None,
            node: format!("relu{o}"),
        }
    }

    fn stream(kind: StreamKind, steps: Vec<Step>) -> StreamPlan {
        StreamPlan { device: Device::gpu(0), kind, steps }
    }

    fn base(r: &BufRef) -> Option<Key> {
        match r {
            BufRef::Arena { device, buffer } => Some((*device, *buffer)),
            BufRef::Variable(_) => None,
        }
    }

    /// compute: 0 -> 1, record e0, 1 -> 2; copy: wait e0, 1 -> 3.
    /// Buffer 0 is done before 2 and 3 are written; 1 is read on both
    /// streams; 2 and 3 are written on different streams with no event
    /// between them.
    #[test]
    fn ranges_follow_streams_and_events() {
        let streams = vec![
            stream(StreamKind::Compute, vec![relu(0, 1), Step::Record(0), relu(1, 2)]),
            stream(StreamKind::Copy, vec![Step::Wait(0), relu(1, 3)]),
        ];
        let order = Order::new(&streams, 1).expect("replays");
        assert!(order.happens_before((0, 0), (1, 1)));
        assert!(!order.happens_before((0, 2), (1, 1)));
        assert!(!order.happens_before((1, 1), (0, 2)));
        assert!(!order.happens_before((0, 0), (0, 0)));
        let live = Liveness::new(&streams, &order, &[4], &base, &Folds::new(&streams, &base));
        assert!(live.before(0, 0, 2) && live.before(0, 0, 3));
        assert!(!live.before(0, 1, 2) && !live.before(0, 2, 3) && !live.before(0, 3, 2));
        assert!(!live.before(0, 2, 0), "0 is read before 2 is written");
        assert_eq!(live.witness(0, 2, 3), Some((0, 2, 3)));
        assert!(live.accessed(0, 3));
    }

    /// A copy's destination keeps its source alive: 0 is copied to 1 on the
    /// copy stream, 1 is read on compute after the event; 0's range reaches
    /// that read, so 2 (written after it) may share 0's bytes, 3 (written
    /// before it) may not.
    #[test]
    fn copy_destinations_extend_their_sources() {
        let copy = Step::Copy {
            from: BufRef::Arena { device: 0, buffer: 0 },
            to: BufRef::Arena { device: 0, buffer: 1 },
            bytes: 4,
            node: "c".into(),
        };
        let streams = vec![
            stream(StreamKind::Copy, vec![copy, Step::Record(0)]),
            stream(StreamKind::Compute, vec![relu(4, 3), Step::Wait(0), relu(1, 5), relu(5, 2)]),
        ];
        let order = Order::new(&streams, 1).expect("replays");
        let live = Liveness::new(&streams, &order, &[6], &base, &Folds::new(&streams, &base));
        assert!(live.before(0, 0, 2));
        assert!(!live.before(0, 0, 3) && !live.before(0, 3, 0));
    }

    #[test]
    fn unreplayable_events_give_no_order() {
        let streams = vec![stream(StreamKind::Compute, vec![Step::Wait(0), Step::Record(0)])];
        assert!(Order::new(&streams, 1).is_none());
        assert!(Order::new(&[stream(StreamKind::Compute, vec![Step::Record(1)])], 1).is_none());
    }
}
