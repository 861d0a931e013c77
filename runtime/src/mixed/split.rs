//! How a plan divides between the parts of a mixed session: which part
//! serves each device, which events cross parts, and which other parts'
//! buffers each part's copies name. Pure analysis of the plan, checked
//! before any part allocates.
//!
//! Rules (what makes a part's share runnable on its own):
//! - a device is served by the part of its kind (`cpu:*` the host part,
//!   `gpu:*` the device part); a stream runs in its device's part;
//! - a launch or a collective names only its own part's memory (arena
//!   buffers of its devices, variables it holds); only a copy may name
//!   another part's memory, on one side;
//! - an event recorded in one part and waited in another is bridged (its
//!   flag lives in the bridge); an event recorded in two parts is refused.

use std::collections::{BTreeMap, BTreeSet};

use towers_codegen::{BufRef, Plan, Step};
use towers_vocab::DeviceKind;

/// The division of one plan; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Per plan device, its part.
    pub device_part: Vec<usize>,
    /// Per part, per plan device: whether it serves it.
    pub served: Vec<Vec<bool>>,
    /// Per event: whether it crosses parts.
    pub bridged: Vec<bool>,
    /// Per part: the other parts' buffers and variables its copies name,
    /// with the part holding each.
    pub foreign: Vec<BTreeMap<BufRef, usize>>,
}

/// Divide `plan` between parts of the given device kinds; `var_part` says
/// which part holds each variable.
pub fn split(plan: &Plan, kinds: &[DeviceKind], var_part: &BTreeMap<String, usize>) -> Result<Split, String> {
    let mut device_part = Vec::with_capacity(plan.devices.len());
    for d in &plan.devices {
        let p = kinds
            .iter()
            .position(|k| *k == d.device.kind)
            .ok_or_else(|| format!("device {} has no part of its kind in this session (parts: {kinds:?})", d.device))?;
        device_part.push(p);
    }
    let owner = |r: &BufRef| -> Result<usize, String> {
        match r {
            BufRef::Arena { device, .. } => {
                device_part.get(*device).copied().ok_or_else(|| format!("{} names device {device}", plan.ref_name(r)))
            }
            BufRef::Variable(n) => var_part
                .get(n)
                .copied()
                .ok_or_else(|| format!("variable '{n}' was not created in any part (declare it before loading)")),
        }
    };
    let mut foreign: Vec<BTreeMap<BufRef, usize>> = vec![BTreeMap::new(); kinds.len()];
    let mut recorded: Vec<Option<usize>> = vec![None; plan.num_events];
    let mut waited: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); plan.num_events];
    for s in &plan.streams {
        let me = plan
            .devices
            .iter()
            .position(|d| d.device == s.device)
            .map(|i| device_part[i])
            .ok_or_else(|| format!("stream {} runs on a device the plan does not declare", s.name()))?;
        for step in &s.steps {
            let own = |r: &BufRef, node: &str| -> Result<(), String> {
                let o = owner(r)?;
                if o != me {
                    return Err(format!(
                        "node '{node}' on stream {} names {}, which another part holds; only copies cross parts",
                        s.name(),
                        plan.ref_name(r)
                    ));
                }
                Ok(())
            };
            match step {
                Step::Launch { inputs, outputs, workspace, node, .. } => {
                    for r in inputs.iter().chain(outputs).chain(workspace) {
                        own(r, node)?;
                    }
                }
                Step::AllReduce { buffers, node }
                | Step::Reduce { buffers, node, .. }
                | Step::Broadcast { buffers, node, .. } => {
                    for r in buffers {
                        own(r, node)?;
                    }
                }
                Step::Copy { from, to, node, .. } => {
                    let (f, t) = (owner(from)?, owner(to)?);
                    if f != me && t != me {
                        return Err(format!(
                            "copy '{node}' on stream {} moves {} to {}, neither of which its part holds",
                            s.name(),
                            plan.ref_name(from),
                            plan.ref_name(to)
                        ));
                    }
                    for (r, o) in [(from, f), (to, t)] {
                        if o != me {
                            foreign[me].insert(r.clone(), o);
                        }
                    }
                }
                Step::Record(e) => {
                    let slot = recorded.get_mut(*e).ok_or_else(|| format!("event {e} is out of range"))?;
                    if slot.is_some_and(|p| p != me) {
                        return Err(format!("event {e} is recorded in two parts of the session"));
                    }
                    *slot = Some(me);
                }
                Step::Wait(e) => {
                    waited.get_mut(*e).ok_or_else(|| format!("event {e} is out of range"))?.insert(me);
                }
            }
        }
    }
    let bridged = recorded.iter().zip(&waited).map(|(r, w)| r.is_some_and(|r| w.iter().any(|&p| p != r))).collect();
    let served = (0..kinds.len()).map(|k| device_part.iter().map(|&p| p == k).collect()).collect();
    Ok(Split { device_part, served, bridged, foreign })
}
