//! [`Tensor`]: one output of a node, and the graph identity that lets a
//! graph refuse a tensor another graph made.
//!
//! Invariant: a tensor's identity is 0 (unchecked, from [`Tensor::new`], as
//! the passes make them) or that of the [`crate::Graph`] whose
//! [`crate::Graph::tensor`] made it. Identities are drawn from a process-wide
//! counter and never appear in any output, so they cannot break determinism.

use crate::graph::NodeId;

/// One output of a node.
///
/// A tensor handed out by a [`crate::Graph`] (or its builder) remembers which graph
/// made it, so that [`crate::Graph::add`] refuses it in another graph (TF's "Tensor
/// must be from the same graph") instead of wiring whatever node has the same
/// index there. Equality, hashing and order look at `node` and `slot` only.
#[derive(Clone, Copy)]
pub struct Tensor {
    pub node: NodeId,
    pub slot: usize,
    /// The identity of the graph that made it; 0 for a tensor made
    /// with [`Tensor::new`], which is not checked.
    graph: u32,
}

impl Tensor {
    /// A tensor of any graph (unchecked); prefer [`crate::Graph::tensor`].
    pub fn new(node: NodeId, slot: usize) -> Tensor {
        Tensor { node, slot, graph: 0 }
    }

    pub(crate) fn of_graph(node: NodeId, slot: usize, graph: u32) -> Tensor {
        Tensor { node, slot, graph }
    }

    /// Whether this tensor may be an input of a node of graph `identity`:
    /// it was made by that graph, or it is unchecked.
    pub(crate) fn may_join(&self, identity: u32) -> bool {
        self.graph == 0 || self.graph == identity
    }
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        (self.node, self.slot) == (other.node, other.slot)
    }
}
impl Eq for Tensor {}
impl std::hash::Hash for Tensor {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.node, self.slot).hash(h)
    }
}
impl PartialOrd for Tensor {
    fn partial_cmp(&self, other: &Tensor) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Tensor {
    fn cmp(&self, other: &Tensor) -> std::cmp::Ordering {
        (self.node, self.slot).cmp(&(other.node, other.slot))
    }
}
impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor").field("node", &self.node).field("slot", &self.slot).finish()
    }
}

/// Graph identities: 0 is "unchecked", so the counter starts at 1.
pub(crate) static NEXT_IDENTITY: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

pub(crate) fn fresh_identity() -> u32 {
    NEXT_IDENTITY.fetch_add(1, std::sync::atomic::Ordering::Relaxed).max(1)
}

/// A tensor's node, so that APIs taking a node (`add_to_collection`) take
/// the tensor TF1 code passes (`tf.add_to_collection(key, t)`).
impl From<Tensor> for NodeId {
    fn from(t: Tensor) -> NodeId {
        t.node
    }
}
