//! A program of one device runs where the variables it reads live.
//!
//! `compile_eval` places a model without device scopes on `cpu:0`, while
//! the training program loaded before it may hold the variables on `gpu:0`
//! (`--variables gpu0`) or across GPUs (round-robin). On one backend that
//! is only a label, but where devices have memories of their own (a CUDA
//! part beside a host part, a context per logical GPU) a launch on `cpu:0`
//! cannot read a variable of `gpu:0`. TF1 resolves it by colocating the
//! reads with the variables; so does [`colocate`], before the plan is
//! verified: a one-device program none of whose existing variables is on
//! its device moves, whole, to the device holding most of their bytes
//! (ties to the first device in order). The moved plan computes the same
//! values (every kernel runs on every device kind); the session's device
//! notes show where it runs. Variables it reads on yet other devices
//! (round-robin) come in through copies into its own arena at the start of
//! each run, as TF1's Send/Recv pairs would carry them.
//!
//! Invariant: a plan of several devices is never moved (its placement is
//! the compiler's, reported and snapshot), nor one that reads a variable
//! on its own device, nor one whose variables are all new.

use std::collections::BTreeMap;

use towers_codegen::Plan;
use towers_vocab::Device;

use crate::variables::VarTable;

/// Where `plan` should run instead of its one device, if anywhere; see
/// the module docs.
pub(super) fn target(plan: &Plan, vars: &VarTable) -> Option<Device> {
    let [only] = plan.devices.as_slice() else { return None };
    let mut bytes: BTreeMap<Device, usize> = BTreeMap::new();
    for v in &plan.variables {
        let Some(known) = vars.get(&v.name) else { continue };
        let Some(at) = known.device else { continue };
        *bytes.entry(at).or_default() += known.len() * v.dtype.size_bytes();
    }
    if bytes.is_empty() || bytes.contains_key(&only.device) {
        return None;
    }
    // The most bytes; among equals the first device (the map is in order).
    let mut best: Option<(Device, usize)> = None;
    for (d, b) in bytes {
        if best.is_none_or(|(_, most)| b > most) {
            best = Some((d, b));
        }
    }
    best.map(|(d, _)| d)
}

/// Move `plan` where [`target`] says, then read each variable it does not
/// write that lives on yet another device (round-robin placements) through
/// a copy into its own arena ([`Plan::copy_variable_in`]). Returns the
/// move, if any, and the variables copied in.
pub(super) fn colocate(plan: &mut Plan, vars: &VarTable) -> (Option<(Device, Device)>, Vec<String>) {
    if plan.devices.len() != 1 {
        return (None, Vec::new());
    }
    let from = plan.devices[0].device;
    let moved = target(plan, vars).and_then(|to| plan.move_to(to).ok().map(|()| (from, to)));
    let here = plan.devices[0].device;
    let elsewhere: Vec<String> = plan
        .variables
        .iter()
        .filter(|v| vars.get(&v.name).and_then(|k| k.device).is_some_and(|d| d != here))
        .map(|v| v.name.clone())
        .collect();
    // A variable the program writes keeps its reference (the backend
    // decides whether it can serve it).
    let copied = elsewhere.into_iter().filter(|n| plan.copy_variable_in(n).is_ok()).collect();
    (moved, copied)
}
