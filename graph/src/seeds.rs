//! The seed story, as TF1's `tf.set_random_seed`: which seed decides what.
//!
//! | what | decided by |
//! | --- | --- |
//! | a variable's initial value | the graph seed when one is set ([`crate::GraphBuilder::with_seed`], [`Graph::set_random_seed`]) and the variable's name; else the session's seed (`Session::new(seed)`) and the name |
//! | a dropout mask | the op seed, the step, and the global row: `(op seed, step, first_row + r)` |
//! | dropout's op seed | `GraphBuilder::dropout`: derived from the graph seed and the op's name without its `tower_<i>/` prefix ([`op_seed`]); `GraphBuilder::dropout_with_seed`: the seed given, as given |
//! | the batches' order | the training loop's own seed (`towers train --seed`) |
//!
//! Invariants: derivations are pure functions of their inputs (FNV-1a over
//! the name, then SplitMix64), so a graph built twice draws the same values;
//! an op seed never depends on creation order or on the tower an op is
//! built in, so a hand-built tower `tower_1/MLP/dropout` and the
//! compiler's replica of `MLP/dropout` draw the same masks for the same
//! rows. Where TF1 differs, deliberately: TF1 without a graph seed draws
//! fresh random values each run; towers then uses graph seed 0 for op seeds
//! (runs stay reproducible); an explicit op seed is used as given, not
//! mixed with the graph seed; and TF1's op seeds count ops created, which
//! would give each hand-built tower another mask stream.

use std::collections::{BTreeSet, HashSet};

use crate::error::{GraphError, Result};
use crate::graph::{Graph, NodeId};
use crate::op::Op;

/// SplitMix64's finalizer: a bijective mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a over bytes (stable across Rust versions, unlike `DefaultHasher`).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// `name` without a leading `tower_<digits>/` scope: the name an op of a
/// hand-built tower has in the model the compiler replicates.
pub fn tower_free_name(name: &str) -> &str {
    if let Some(rest) = name.strip_prefix("tower_") {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && rest.as_bytes().get(digits) == Some(&b'/') {
            return &rest[digits + 1..];
        }
    }
    name
}

/// The op seed of a seeded op named `name` without an explicit seed:
/// from the graph seed (0 when none is set) and the tower-free name.
pub fn op_seed(graph_seed: u64, name: &str) -> u64 {
    mix(graph_seed ^ mix(fnv(tower_free_name(name).as_bytes())))
}

/// The first global row of what node `id` computes on: the offset of the
/// output of a `split` along axis 0 that its data inputs come from (0 when
/// none). The walk goes up data edges and stops at each such split; an
/// error when its inputs come from outputs at different offsets (rows of
/// several towers mixed), naming the splits.
pub fn split_row_of(g: &Graph, id: NodeId) -> Result<usize> {
    let mut seen: HashSet<NodeId> = HashSet::new();
    let mut stack: Vec<NodeId> = vec![id];
    let mut rows: BTreeSet<usize> = BTreeSet::new();
    let mut found: Vec<String> = Vec::new();
    while let Some(n) = stack.pop() {
        if !seen.insert(n) {
            continue;
        }
        for t in g.inputs(n) {
            if let Op::Split { axis: 0, sizes } = &g.node(t.node).op {
                let first: usize = sizes[..t.slot.min(sizes.len())].iter().sum();
                if rows.insert(first) {
                    found.push(format!("{}:{} (rows {first}..)", g.node(t.node).name, t.slot));
                }
            } else {
                stack.push(t.node);
            }
        }
    }
    match rows.len() {
        0 => Ok(0),
        1 => Ok(rows.into_iter().next().unwrap_or(0)),
        _ => Err(GraphError::Shape {
            node: g.node(id).name.clone(),
            scope: g.node(id).scope.clone(),
            op: g.node(id).op.type_name().into(),
            detail: format!(
                "its input mixes rows of several batch splits ({}); dropout draws each row's mask from its global row, so build it on one tower's rows",
                found.join(", ")
            ),
        }),
    }
}

impl Graph {
    /// TF's `tf.set_random_seed`: the graph seed that initial values and
    /// derived op seeds come from (set it before building seeded ops).
    pub fn set_random_seed(&mut self, seed: u64) {
        self.seed = seed;
        self.seed_set = true;
    }

    /// The graph seed, when one was set.
    pub fn random_seed(&self) -> Option<u64> {
        self.seed_set.then_some(self.seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tower_prefixes_are_dropped_only_when_whole() {
        assert_eq!(tower_free_name("tower_1/MLP/dropout"), "MLP/dropout");
        assert_eq!(tower_free_name("tower_12/dropout"), "dropout");
        assert_eq!(tower_free_name("tower_/dropout"), "tower_/dropout");
        assert_eq!(tower_free_name("tower_x/dropout"), "tower_x/dropout");
        assert_eq!(tower_free_name("towerish/dropout"), "towerish/dropout");
        assert_eq!(tower_free_name("tower_3"), "tower_3");
    }

    #[test]
    fn op_seeds_depend_on_graph_seed_and_name_not_on_tower() {
        assert_eq!(op_seed(5, "tower_0/MLP/dropout"), op_seed(5, "tower_1/MLP/dropout"));
        assert_eq!(op_seed(5, "MLP/dropout"), op_seed(5, "tower_1/MLP/dropout"));
        assert_ne!(op_seed(5, "MLP/dropout"), op_seed(6, "MLP/dropout"));
        assert_ne!(op_seed(5, "MLP/dropout"), op_seed(5, "MLP/dropout_1"));
    }

    #[test]
    fn the_graph_seed_is_unset_until_set() {
        let mut g = Graph::new();
        assert_eq!(g.random_seed(), None);
        g.set_random_seed(1);
        assert_eq!(g.random_seed(), Some(1));
    }
}
