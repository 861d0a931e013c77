//! `prune`: keep only what the program needs.
//!
//! The roots are the loss (`st.loss`), the program record's fetches and
//! train op, and every node of the `update_ops` collection (batch norm's
//! moving averages run with the training step even though the loss does not
//! read them). Every other node that is not an ancestor of a root over data
//! and control edges is removed (it also leaves every collection).
//!
//! Invariants after the pass:
//! - every node is a root or an ancestor of one;
//! - `st.var_list` names only variables that survived, in their order (a
//!   variable the loss does not reach is gone, as from the collections);
//! - a loss, fetch or train op naming a missing node is an error that lists
//!   the closest names; a missing update op is skipped, as TF does;
//! - the program record's `unread_feeds` lists the removed placeholders
//!   (feeding them is accepted and ignored, as TF1's `feed_dict`).

use std::collections::BTreeSet;

use towers_graph::{keys, Graph, NodeId, Op, TensorType};

use crate::manager::Pass;
use crate::state::{CompileState, PassError};

/// Remove the nodes no root needs (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct Prune;

/// Keep only the ancestors of `roots` (over data and control edges), and the roots.
pub fn prune(g: &mut Graph, roots: &[NodeId]) {
    let mut keep = BTreeSet::new();
    let mut stack: Vec<NodeId> = roots.to_vec();
    while let Some(n) = stack.pop() {
        if keep.insert(n) {
            stack.extend(g.inputs(n).iter().map(|t| t.node));
            stack.extend(g.control_inputs(n));
        }
    }
    for id in g.node_ids() {
        if !keep.contains(&id) {
            g.remove(id);
        }
    }
}

/// The roots of a program: loss, fetches, train op, then the update ops.
pub fn roots(g: &Graph, st: &CompileState) -> Result<Vec<NodeId>, PassError> {
    let mut roots = Vec::new();
    if let Some(loss) = &st.loss {
        roots.push(loss.resolve(g)?.node);
    }
    let program = g.program();
    for t in program.fetches.values() {
        roots.push(t.resolve(g)?.node);
    }
    if let Some(t) = &program.train_op {
        roots.push(g.find(t)?);
    }
    roots.extend(g.collection(keys::UPDATE_OPS).iter().filter_map(|n| g.get(n)));
    Ok(roots)
}

impl Pass for Prune {
    fn name(&self) -> &'static str {
        "prune"
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        let roots = roots(g, st)?;
        let placeholders: Vec<(String, TensorType)> = g
            .node_ids()
            .into_iter()
            .filter(|&id| matches!(g.node(id).op, Op::Placeholder { .. }))
            .map(|id| (g.node(id).name.clone(), g.node(id).outputs[0].clone()))
            .collect();
        prune(g, &roots);
        let unread = &mut g.program_mut().unread_feeds;
        for (name, ty) in placeholders {
            if !unread.iter().any(|(u, _)| *u == name) {
                unread.push((name, ty));
            }
        }
        let unread = std::mem::take(&mut g.program_mut().unread_feeds);
        let mut unread: Vec<(String, TensorType)> = unread.into_iter().filter(|(n, _)| g.get(n).is_none()).collect();
        unread.sort_by(|a, b| a.0.cmp(&b.0));
        g.program_mut().unread_feeds = unread;
        st.var_list.retain(|v| g.get(v).is_some());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::TensorRef;
    use towers_graph::{DType, GraphBuilder};

    /// y = relu(x) is fetched; z = neg(x) is not: z goes, x and y stay.
    #[test]
    fn keeps_the_ancestors_of_the_fetches() {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, [2]).unwrap();
        let y = b.relu(x).unwrap();
        let z = b.neg(x).unwrap();
        let mut g = b.finish();
        let (yn, zn) = (g.node(y.node).name.clone(), g.node(z.node).name.clone());
        g.program_mut().fetches.insert("y".into(), TensorRef::new(&yn, 0));
        Prune.run(&mut g, &mut CompileState::default()).unwrap();
        assert!(g.get("x").is_some() && g.get(&yn).is_some());
        assert!(g.get(&zn).is_none());
    }

    /// A fetch naming a node that does not exist says so, with the closest name.
    #[test]
    fn a_missing_root_is_an_error() {
        let mut b = GraphBuilder::new();
        b.placeholder("images", DType::F32, [2]).unwrap();
        let mut g = b.finish();
        let mut st = CompileState { loss: Some(TensorRef::new("image", 0)), ..Default::default() };
        let e = Prune.run(&mut g, &mut st).unwrap_err().to_string();
        assert!(e.contains("'image'") && e.contains("images"), "{e}");
    }
}
