//! Rule 5 of the verifier: events are in range (checked with the steps),
//! each recorded exactly once, and a replay of the streams runs every step.

use std::collections::BTreeMap;

use super::{PlanError, Site};
use crate::plan::{Plan, Step};

/// Events: each in range (checked with the steps) recorded exactly once, and
/// a replay of the streams that runs every step.
pub(super) fn events(plan: &Plan) -> Result<(), PlanError> {
    let n = plan.num_events;
    let mut recorded_at: BTreeMap<usize, Site> = BTreeMap::new();
    for s in &plan.streams {
        for (index, step) in s.steps.iter().enumerate() {
            if let Step::Record(e) = step {
                let at = Site::Step { stream: s, index };
                if let Some(first) = recorded_at.insert(*e, at) {
                    return Err(PlanError::EventRecordedTwice {
                        event: *e,
                        first: first.to_string().into(),
                        second: at.to_string().into(),
                    });
                }
            }
        }
    }
    for s in &plan.streams {
        for (index, step) in s.steps.iter().enumerate() {
            if let Step::Wait(e) = step {
                if !recorded_at.contains_key(e) {
                    return Err(PlanError::WaitNeverRecorded {
                        at: Site::Step { stream: s, index }.to_string().into(),
                        event: *e,
                    });
                }
            }
        }
    }
    // Events are in range and recorded once, so there are at most as many
    // events as records, and an unrecorded one is found among the first
    // `records + 1`: nothing is allocated or scanned per event before this.
    if recorded_at.len() < n {
        let event = (0..=recorded_at.len()).find(|e| !recorded_at.contains_key(e)).unwrap_or(0);
        return Err(PlanError::EventNeverRecorded { event, count: n });
    }
    // Replay: a worklist of runnable streams; a stream blocked on an event
    // parks on it until the event's record runs. Each step runs once.
    let mut recorded = vec![false; n];
    let mut parked: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut pos = vec![0usize; plan.streams.len()];
    let mut ready: Vec<usize> = (0..plan.streams.len()).rev().collect();
    while let Some(si) = ready.pop() {
        let steps = &plan.streams[si].steps;
        while let Some(step) = steps.get(pos[si]) {
            match step {
                Step::Wait(e) if !recorded[*e] => {
                    parked[*e].push(si);
                    break;
                }
                Step::Record(e) => {
                    recorded[*e] = true;
                    ready.append(&mut parked[*e]);
                }
                _ => {}
            }
            pos[si] += 1;
        }
    }
    let stuck: Vec<String> = plan
        .streams
        .iter()
        .enumerate()
        .filter(|(si, s)| pos[*si] < s.steps.len())
        .map(|(si, s)| Site::Step { stream: s, index: pos[si] }.to_string())
        .collect();
    if stuck.is_empty() {
        Ok(())
    } else {
        Err(PlanError::Deadlock { stuck: stuck.join(", ").into() })
    }
}
