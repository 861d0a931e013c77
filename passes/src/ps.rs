//! `--variables ps`: which parameter-server task owns each variable.
//!
//! TF1 sharded variables over parameter servers with
//! `tf.train.replica_device_setter(ps_tasks=K, ps_strategy=...)`: every
//! variable op got `/job:ps/task:<ps_strategy(op)>`, everything else the
//! worker device. [`assign_owners`] is that device function for the
//! variables `place` shards (the trainable and moving-average variables in
//! creation order; optimizer slots follow their primary, `global_step` and
//! the learning rate stay on every worker's host, see `place`).
//!
//! Invariants:
//! - the result has one owner per candidate, each below `tasks`;
//! - it depends only on the candidates' order, bytes and requests (no
//!   `HashMap` order), so every rank computes the same owners;
//! - an explicit `/job:ps/task:k` request wins, as TF's `merge_devices`
//!   merges the op's own device over the strategy's choice. As in TF, the
//!   round-robin counter still advances for it; unlike TF's greedy strategy,
//!   whose pick gets the load even when the request overrides it, greedy
//!   adds the variable's bytes to the task that really owns it.

use towers_graph::{ps_task_name, PS_JOB};

use crate::options::PsStrategy;
use crate::state::PassError;

/// A variable to shard: its name (for errors), its bytes (TF's
/// `byte_size_load_fn`: elements times the dtype's size) and the task it
/// asks for (`/job:ps/task:k`), if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsCandidate {
    pub name: String,
    pub bytes: usize,
    pub requested: Option<u32>,
}

/// The owner task of every candidate, in order (see the module docs).
///
/// ```
/// use towers_passes::ps::{assign_owners, PsCandidate};
/// use towers_passes::options::PsStrategy;
/// let v = |name: &str, bytes| PsCandidate { name: name.into(), bytes, requested: None };
/// let vars = [v("w1", 400), v("b1", 4), v("w2", 40), v("b2", 4)];
/// assert_eq!(assign_owners(&vars, 2, PsStrategy::RoundRobin).unwrap(), [0, 1, 0, 1]);
/// assert_eq!(assign_owners(&vars, 2, PsStrategy::Greedy).unwrap(), [0, 1, 1, 1]);
/// ```
pub fn assign_owners(vars: &[PsCandidate], tasks: u32, strategy: PsStrategy) -> Result<Vec<u32>, PassError> {
    if tasks == 0 {
        return Err(PassError::Options(
            "VarPlacement::Ps { tasks: 0, .. } shards the variables over no parameter-server task: give tasks 1 or more (CLI: --ps-tasks)".into(),
        ));
    }
    let mut loads = vec![0usize; tasks as usize];
    let mut owners = Vec::with_capacity(vars.len());
    for (i, v) in vars.iter().enumerate() {
        if let Some(k) = v.requested.filter(|&k| k >= tasks) {
            let all: Vec<String> = (0..tasks).map(ps_task_name).collect();
            return Err(PassError::Placement {
                node: v.name.clone(),
                reason: format!(
                    "'{}' was explicitly assigned to {} but available devices are [ {} ]. Make sure the device specification refers to a valid device (there are {tasks} /job:{PS_JOB} tasks: raise --ps-tasks or request a task below {tasks}).",
                    v.name,
                    ps_task_name(k),
                    all.join(", ")
                ),
            });
        }
        let owner = match strategy {
            PsStrategy::RoundRobin => v.requested.unwrap_or((i % tasks as usize) as u32),
            PsStrategy::Greedy => v.requested.unwrap_or_else(|| {
                // numpy's argmin: the first of the least loaded.
                let (k, _) = loads.iter().enumerate().min_by_key(|&(k, l)| (*l, k)).unwrap_or((0, &0));
                k as u32
            }),
        };
        loads[owner as usize] += v.bytes;
        owners.push(owner);
    }
    Ok(owners)
}

/// Bytes per task of the candidates under `owners` (the load each ps task holds).
pub fn loads(vars: &[PsCandidate], owners: &[u32], tasks: u32) -> Vec<usize> {
    let mut out = vec![0usize; tasks as usize];
    for (v, &k) in vars.iter().zip(owners) {
        if let Some(l) = out.get_mut(k as usize) {
            *l += v.bytes;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(name: &str, bytes: usize) -> PsCandidate {
        PsCandidate { name: name.into(), bytes, requested: None }
    }

    /// The MLP 784-256-256-10's variables in creation order (f32 bytes).
    fn mlp() -> Vec<PsCandidate> {
        vec![
            v("fc1/weights", 784 * 256 * 4),
            v("fc1/biases", 256 * 4),
            v("fc2/weights", 256 * 256 * 4),
            v("fc2/biases", 256 * 4),
            v("logits/weights", 256 * 10 * 4),
            v("logits/biases", 10 * 4),
        ]
    }

    #[test]
    fn round_robin_deals_tasks_in_creation_order() {
        assert_eq!(assign_owners(&mlp(), 2, PsStrategy::RoundRobin).unwrap(), [0, 1, 0, 1, 0, 1]);
        assert_eq!(assign_owners(&mlp(), 4, PsStrategy::RoundRobin).unwrap(), [0, 1, 2, 3, 0, 1]);
        assert_eq!(assign_owners(&mlp(), 1, PsStrategy::RoundRobin).unwrap(), [0; 6]);
        // More tasks than variables: the last tasks own nothing.
        assert_eq!(assign_owners(&mlp()[..2], 3, PsStrategy::RoundRobin).unwrap(), [0, 1]);
    }

    #[test]
    fn greedy_puts_each_variable_on_the_least_loaded_task_so_far() {
        // Loads (bytes) after each step, 2 tasks:
        // fc1/w 802816 -> t0 [802816, 0]; fc1/b 1024 -> t1 [802816, 1024];
        // fc2/w 262144 -> t1 [802816, 263168]; fc2/b -> t1 [.., 264192];
        // logits/w 10240 -> t1 [.., 274432]; logits/b -> t1.
        let owners = assign_owners(&mlp(), 2, PsStrategy::Greedy).unwrap();
        assert_eq!(owners, [0, 1, 1, 1, 1, 1]);
        assert_eq!(loads(&mlp(), &owners, 2), [802816, 1024 + 262144 + 1024 + 10240 + 40]);
        // Ties go to the lowest task, as numpy's argmin.
        let same = [v("a", 8), v("b", 8), v("c", 8), v("d", 8)];
        assert_eq!(assign_owners(&same, 3, PsStrategy::Greedy).unwrap(), [0, 1, 2, 0]);
        // Creation order matters (TF: "very sensitive to the exact order").
        let mut rev = mlp();
        rev.reverse();
        assert_eq!(assign_owners(&rev, 2, PsStrategy::Greedy).unwrap(), [0, 1, 0, 0, 1, 1]);
    }

    #[test]
    fn an_explicit_task_wins_and_round_robin_still_counts_it() {
        let mut vars = mlp();
        vars[0].requested = Some(1);
        assert_eq!(assign_owners(&vars, 2, PsStrategy::RoundRobin).unwrap(), [1, 1, 0, 1, 0, 1]);
        // Greedy charges the requested task: fc1/weights' bytes on task 1.
        assert_eq!(assign_owners(&vars, 2, PsStrategy::Greedy).unwrap(), [1, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_task_that_does_not_exist_is_a_placement_error() {
        let mut vars = mlp();
        vars[2].requested = Some(2);
        let e = assign_owners(&vars, 2, PsStrategy::RoundRobin).unwrap_err().to_string();
        assert!(e.contains("'fc2/weights' was explicitly assigned to /job:ps/task:2 but available devices are [ /job:ps/task:0, /job:ps/task:1 ]"), "{e}");
        assert!(e.contains("--ps-tasks"), "{e}");
        let e = assign_owners(&mlp(), 0, PsStrategy::Greedy).unwrap_err().to_string();
        assert!(e.contains("VarPlacement::Ps { tasks: 0, .. }") && e.contains("CLI: --ps-tasks"), "{e}");
    }
}
