//! Rule 6 of the verifier: buffers that share arena bytes are never live at
//! once.
//!
//! Two buffers of their own on one device whose bytes overlap are allowed
//! only when neither is pinned (a feed, a constant, a fetched buffer or a
//! buffer a fetched one is copied from: those keep their bytes for the
//! whole step) and every access of one happens before every access of the
//! other. Happens-before and the accesses (views folded into their base,
//! copy destinations into their sources) are recomputed from the steps by
//! [`crate::liveness`]; nothing the memory planner decided is trusted.
//!
//! Runs after the events rule (so the streams replay) and the buffer rule
//! (so views name a base inside the arena). Cost: a sort of each device's
//! buffers by offset, then O(streams) per overlapping pair; a plan without
//! overlapping buffers computes no live ranges at all.

use std::collections::BTreeMap;

use super::{PlanError, Site, Text};
use crate::liveness::{step_refs, Folds, Key, Liveness, Order};
use crate::plan::{BufRef, BufferKind, Plan};

/// The base buffer of a reference (views folded), or None for a variable or a dangling reference.
fn base_of(plan: &Plan, r: &BufRef) -> Option<Key> {
    let BufRef::Arena { device, buffer } = r else { return None };
    let b = plan.devices.get(*device)?.buffers.get(*buffer)?;
    Some(match b.kind {
        BufferKind::View { of } => (*device, of),
        _ => (*device, *buffer),
    })
}

/// Why a buffer keeps its bytes for the whole step, if it does.
fn pinned(plan: &Plan, folds: &Folds) -> BTreeMap<Key, String> {
    let mut why: BTreeMap<Key, String> = BTreeMap::new();
    for (d, dev) in plan.devices.iter().enumerate() {
        for (i, b) in dev.buffers.iter().enumerate() {
            match b.kind {
                BufferKind::Feed => why.insert((d, i), "a feed".into()),
                BufferKind::Constant => why.insert((d, i), "a constant".into()),
                _ => None,
            };
        }
    }
    for (name, r) in &plan.fetches {
        if let Some(k) = base_of(plan, r) {
            why.entry(k).or_insert_with(|| format!("fetched as '{name}'"));
            for &s in folds.sources(k) {
                why.entry(s).or_insert_with(|| format!("copied to the fetch '{name}'"));
            }
        }
    }
    why
}

/// A step that touches buffer `key` and has fewer than `need` steps of
/// stream `t` strictly before it: the witness that an access on `t` does
/// not happen before it.
fn access_before<'p>(plan: &'p Plan, order: &Order, folds: &Folds, key: Key, t: usize, need: u32) -> Option<Site<'p>> {
    for (si, s) in plan.streams.iter().enumerate() {
        for (index, step) in s.steps.iter().enumerate() {
            let touches = step_refs(step)
                .into_iter()
                .filter_map(|r| base_of(plan, r))
                .any(|k| k == key || folds.sources(k).contains(&key));
            if touches && order.count_before((si, index), t) < need {
                return Some(Site::Step { stream: s, index });
            }
        }
    }
    None
}

/// "gpu:0/compute step 3 'node' ('a') is not before gpu:0/copy step 1 'm' ('b')":
/// why every access of `a` does not happen before every access of `b`.
fn not_before(plan: &Plan, order: &Order, live: &Liveness, folds: &Folds, d: usize, a: usize, b: usize) -> String {
    let names = &plan.devices[d].buffers;
    let Some((t, j, need)) = live.witness(d, a, b) else { return String::new() };
    let at_a = Site::Step { stream: &plan.streams[t], index: j };
    let at_b = access_before(plan, order, folds, (d, b), t, need).map_or("?".to_string(), |s| s.to_string());
    format!("{at_a} ('{}') is not before {at_b} ('{}')", names[a].name, names[b].name)
}

/// What checking overlapping pairs needs, computed at the first such pair.
struct Ctx {
    folds: Folds,
    why: BTreeMap<Key, String>,
    order: Order,
    live: Liveness,
}

impl Ctx {
    fn new(plan: &Plan) -> Result<Ctx, PlanError> {
        let base = |r: &BufRef| base_of(plan, r);
        let folds = Folds::new(&plan.streams, &base);
        let why = pinned(plan, &folds);
        let order = Order::new(&plan.streams, plan.num_events)
            .ok_or_else(|| PlanError::Deadlock { stuck: "the events cannot be replayed".into() })?;
        let counts: Vec<usize> = plan.devices.iter().map(|d| d.buffers.len()).collect();
        let live = Liveness::new(&plan.streams, &order, &counts, &base, &folds);
        Ok(Ctx { folds, why, order, live })
    }

    /// Buffers `a` < `b` of device `d` overlap: are they allowed to?
    fn check(&self, plan: &Plan, d: usize, a: usize, b: usize) -> Result<(), PlanError> {
        let dev = &plan.devices[d];
        let (x, y) = (&dev.buffers[a], &dev.buffers[b]);
        let (start, end) = (x.offset.max(y.offset), (x.offset + x.bytes).min(y.offset + y.bytes));
        for (p, o) in [(a, b), (b, a)] {
            if let Some(w) = self.why.get(&(d, p)) {
                return Err(PlanError::PinnedShared {
                    device: dev.device.to_string().into(),
                    buffer: dev.buffers[p].name.clone().into(),
                    why: w.clone().into(),
                    other: dev.buffers[o].name.clone().into(),
                    start,
                    end,
                });
            }
        }
        if self.live.before(d, a, b) || self.live.before(d, b, a) {
            return Ok(());
        }
        let text = |a, b| -> Text { not_before(plan, &self.order, &self.live, &self.folds, d, a, b).into() };
        Err(PlanError::LiveShared {
            device: dev.device.to_string().into(),
            a: x.name.clone().into(),
            b: y.name.clone().into(),
            start,
            end,
            ab: text(a, b),
            ba: text(b, a),
        })
    }
}

/// Check rule 6 (module docs): every pair of overlapping buffers of their
/// own, device by device, in order of their offsets.
pub(super) fn sharing(plan: &Plan) -> Result<(), PlanError> {
    let mut ctx: Option<Ctx> = None;
    for (d, dev) in plan.devices.iter().enumerate() {
        let mut own: Vec<(usize, usize, usize)> = dev
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| !matches!(b.kind, BufferKind::View { .. }) && b.bytes > 0)
            .map(|(i, b)| (b.offset, b.offset.saturating_add(b.bytes), i))
            .collect();
        own.sort_unstable();
        for (k, &(_, end, i)) in own.iter().enumerate() {
            for &(start, _, j) in &own[k + 1..] {
                if start >= end {
                    break;
                }
                if ctx.is_none() {
                    ctx = Some(Ctx::new(plan)?);
                }
                if let Some(c) = &ctx {
                    c.check(plan, d, i.min(j), i.max(j))?;
                }
            }
        }
    }
    Ok(())
}
