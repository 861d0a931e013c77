//! Edits that would close a cycle are refused; the graph stays acyclic.

use towers_graph::{DType, GraphBuilder, GraphError, Tensor};

#[test]
fn set_input_and_add_control_refuse_cycles() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [Some(2)]).unwrap();
    let a = b.neg(x).unwrap();
    let c = b.relu(a).unwrap();
    let mut g = b.finish();
    // Neg's input <- Relu closes Neg -> Relu -> Neg.
    let e = g.set_input(a.node, 0, c).unwrap_err();
    assert!(matches!(e, GraphError::Cycle { .. }), "{e:?}");
    assert_eq!(e.to_string(), "adding the edge Relu -> Neg would create a cycle: Relu already depends on Neg");
    let e = g.add_control(c.node, x.node).unwrap_err();
    assert!(e.to_string().contains("adding the edge Relu -> x would create a cycle"), "{e}");
    // Self edges.
    assert!(g.add_control(a.node, a.node).is_err());
    assert!(g.set_input(a.node, 0, Tensor::new(a.node, 0)).is_err());
    // Nothing changed: the order is still x, Neg, Relu.
    let names: Vec<String> = g.topo_order().unwrap().iter().map(|&i| g.node(i).name.clone()).collect();
    assert_eq!(names, ["x", "Neg", "Relu"]);
    assert_eq!(g.inputs(a.node), vec![x]);
    // Legal edits still work.
    g.add_control(x.node, c.node).unwrap();
    g.add_control(x.node, c.node).unwrap();
    assert_eq!(g.control_inputs(c.node), vec![x.node]);
    let y =
        g.add(towers_graph::NewNode::new("y", towers_graph::Op::Unary(towers_graph::UnaryOp::Neg), vec![x])).unwrap();
    g.set_input(c.node, 0, Tensor::new(y, 0)).unwrap();
    assert_eq!(g.inputs(c.node), vec![Tensor::new(y, 0)]);
}

#[test]
fn topo_order_is_by_creation_among_ready_nodes() {
    let mut b = GraphBuilder::new();
    let p = b.placeholder("p", DType::F32, [Some(1)]).unwrap();
    let q = b.placeholder("q", DType::F32, [Some(1)]).unwrap();
    let s = b.add(q, p).unwrap();
    let t = b.neg(q).unwrap();
    let g = b.finish();
    let order: Vec<_> = g.topo_order().unwrap();
    assert_eq!(order, vec![p.node, q.node, s.node, t.node]);
}
