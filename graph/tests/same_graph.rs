//! A tensor belongs to the graph that made it: using it in another builder is
//! refused (TF's "Tensor must be from the same graph"), even where the other
//! graph has a node at the same index, which it would otherwise be wired to.

use towers_graph::{DType, GraphBuilder, GraphError, TensorRef};

fn two_placeholders(b: &mut GraphBuilder, a: &str, c: &str) -> (towers_graph::Tensor, towers_graph::Tensor) {
    let x = b.placeholder(a, DType::F32, [None, Some(4)]).unwrap();
    let y = b.placeholder(c, DType::F32, [None, Some(4)]).unwrap();
    (x, y)
}

#[test]
fn a_tensor_of_another_builder_is_refused_even_where_its_index_exists_here() {
    let mut b1 = GraphBuilder::new();
    let (_, x1) = two_placeholders(&mut b1, "z", "x");
    let mut b2 = GraphBuilder::new();
    let (_, other) = two_placeholders(&mut b2, "labels", "other");
    // Same index, same shape: before the check this silently read 'other'.
    assert_eq!(x1.node, other.node);
    let e = b2.relu(x1).unwrap_err();
    assert!(matches!(e, GraphError::ForeignTensor { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("node 'Relu'") && msg.contains("another GraphBuilder"), "{msg}");
    assert!(msg.contains("same graph"), "{msg}");
    assert!(b2.graph().get("Relu").is_none(), "the refused op leaves no node");

    // An empty builder: the same error, not an unknown index.
    let mut b3 = GraphBuilder::new();
    let e = b3.relu(x1).unwrap_err();
    assert!(matches!(e, GraphError::ForeignTensor { .. }), "{e:?}");
}

#[test]
fn a_graphs_own_tensors_and_its_clones_are_accepted() {
    let mut b = GraphBuilder::new();
    let (x, _) = two_placeholders(&mut b, "x", "y");
    let h = b.relu(x).unwrap();
    // Looked up by name, or from the node's inputs, a tensor is this graph's.
    let g = b.graph().clone();
    let by_name = TensorRef::new("x", 0).resolve(&g).unwrap();
    assert_eq!(by_name, x);
    assert_eq!(g.inputs(h.node), vec![x]);
    // A clone holds the same nodes, so the original's tensors are its own.
    let mut b2 = GraphBuilder::new();
    *b2.graph_mut() = g;
    b2.tanh(h).unwrap();
    // The builder's tensors go on working after more ops.
    b.sigmoid(h).unwrap();
}

#[test]
fn a_deserialized_graph_is_a_new_graph() {
    let mut b = GraphBuilder::new();
    let (x, _) = two_placeholders(&mut b, "x", "y");
    let json = b.graph().to_json().unwrap();
    let mut b2 = GraphBuilder::new();
    *b2.graph_mut() = towers_graph::Graph::from_json(&json).unwrap();
    let e = b2.relu(x).unwrap_err();
    assert!(matches!(e, GraphError::ForeignTensor { .. }), "{e:?}");
    // Its own tensors are found by name.
    let x2 = TensorRef::new("x", 0).resolve(b2.graph()).unwrap();
    b2.relu(x2).unwrap();
}
