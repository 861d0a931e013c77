//! Multi-tensor optimizer updates: a run of two or more consecutive
//! optimizer-update launches on one stream (nothing between them: no
//! event, copy or other launch), of the same kind with the same
//! parameters and the same shared inputs (the learning rate, Adam's
//! global_step), becomes one [`Kernel::MultiApply`] launch over all their
//! variables, as PyTorch's `foreach` optimizers and apex's
//! `multi_tensor_apply` do. Each element is updated by the same step in the
//! same rounding, so the numbers do not change; the launch count drops
//! (one update launch per device for a single tower, where every gradient
//! is ready before the first update runs).
//!
//! Runs that events split (the towers' updates that start as soon as
//! their gradient arrives, overlapping the backward pass) stay as they are:
//! merging them would make the first update wait for the last gradient.
//! The merged launch takes the first member's place and node name. It runs
//! before buffers are placed, so liveness sees the merged launch.

use crate::plan::{Step, StreamPlan};
use crate::Kernel;

/// What a member shares with the others: its kernel, then its inputs after the gradient.
fn key(step: &Step) -> Option<(&Kernel, &[crate::BufRef])> {
    match step {
        Step::Launch { kernel, inputs, workspace: None, .. }
            if towers_kernels::optim::update_arity(kernel).is_some() && !inputs.is_empty() =>
        {
            Some((kernel, &inputs[1..]))
        }
        _ => None,
    }
}

/// Merge every run of mergeable updates in `streams` (see the module docs).
pub(crate) fn merge_applies(streams: &mut [StreamPlan]) {
    for s in streams {
        let old = std::mem::take(&mut s.steps);
        let mut i = 0;
        while i < old.len() {
            let Some(k0) = key(&old[i]) else {
                s.steps.push(old[i].clone());
                i += 1;
                continue;
            };
            let mut j = i + 1;
            while j < old.len() && key(&old[j]) == Some(k0) {
                j += 1;
            }
            if j - i < 2 {
                s.steps.push(old[i].clone());
                i += 1;
                continue;
            }
            let (mut grads, mut outs) = (Vec::new(), Vec::new());
            for st in &old[i..j] {
                if let Step::Launch { inputs, outputs, .. } = st {
                    grads.push(inputs[0].clone());
                    outs.extend(outputs.iter().cloned());
                }
            }
            grads.extend(k0.1.iter().cloned());
            let node = match &old[i] {
                Step::Launch { node, .. } => node.clone(),
                _ => String::new(),
            };
            s.steps.push(Step::Launch {
                kernel: Kernel::MultiApply { apply: Box::new(k0.0.clone()), count: j - i },
                inputs: grads,
                outputs: outs,
                workspace: None,
                node,
            });
            i = j;
        }
    }
}
