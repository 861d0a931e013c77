//! Collections and control dependencies.

use towers_graph::layers::{self, Activation};
use towers_graph::{keys, DType, GraphBuilder, GraphError, Reuse};

#[test]
fn trainable_vs_global_and_batch_norm_update_ops() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(4)]).unwrap();
    let h = layers::dense(&mut b, "fc", x, 3, Activation::None).unwrap();
    layers::batch_norm(&mut b, "bn", h, 0.9, 1e-3).unwrap();
    let g = b.graph();
    assert_eq!(
        g.collection(keys::GLOBAL_VARIABLES),
        ["fc/weights", "fc/biases", "bn/beta", "bn/gamma", "bn/moving_mean", "bn/moving_variance"]
    );
    assert_eq!(g.collection(keys::TRAINABLE_VARIABLES), ["fc/weights", "fc/biases", "bn/beta", "bn/gamma"]);
    assert_eq!(g.collection(keys::UPDATE_OPS), ["bn/AssignMovingAvg", "bn/AssignMovingAvg_1"]);
    assert_eq!(g.trainable_variables().len(), 4);
    assert_eq!(g.global_variables().len(), 6);
}

#[test]
fn collection_in_scope_filters_by_tower_prefix() {
    let mut b = GraphBuilder::new();
    for i in [0, 1, 10] {
        let reuse = if i == 0 { Reuse::No } else { Reuse::Yes };
        b.name_scope(&format!("tower_{i}"), |b| {
            b.reuse_scope(reuse, |b| {
                let x = b.placeholder("x", DType::F32, [None, Some(4)])?;
                layers::batch_norm(b, "bn", x, 0.9, 1e-3)
            })
        })
        .unwrap();
    }
    let g = b.graph();
    assert_eq!(g.collection(keys::UPDATE_OPS).len(), 6);
    assert_eq!(
        g.collection_in_scope(keys::UPDATE_OPS, "tower_1/"),
        ["tower_1/bn/AssignMovingAvg", "tower_1/bn/AssignMovingAvg_1"]
    );
    assert_eq!(g.collection_in_scope(keys::UPDATE_OPS, "tower_10/").len(), 2);
    // Variables exist once, under the variable scope only.
    assert_eq!(g.collection(keys::GLOBAL_VARIABLES).len(), 4);
    assert!(g.collection_in_scope(keys::GLOBAL_VARIABLES, "tower_0/").is_empty());
}

#[test]
fn control_dependencies_reach_nodes_created_inside() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [Some(2)]).unwrap();
    let u1 = b.neg(x).unwrap();
    let u2 = b.relu(x).unwrap();
    let (inner, nested, v) = b
        .control_dependencies(&[u2.node], |b| {
            let inner = b.identity(x, "inner")?;
            let nested = b.control_dependencies(&[u1.node], |b| b.identity(x, "nested"))?;
            let v = b.get_variable("v", [2], towers_graph::Initializer::Zeros)?;
            Ok::<_, GraphError>((inner, nested, v))
        })
        .unwrap();
    let after = b.identity(x, "after").unwrap();
    let g = b.graph();
    assert_eq!(g.control_inputs(inner.node), vec![u2.node]);
    // Sorted by creation, whatever the nesting order.
    assert_eq!(g.control_inputs(nested.node), vec![u1.node, u2.node]);
    // Variables ignore control dependencies (TF's init_scope).
    assert!(g.control_inputs(v.node).is_empty());
    assert!(g.control_inputs(after.node).is_empty());
    let grp = b.group("train_op", &[u1.node, u2.node]).unwrap();
    assert_eq!(b.graph().control_inputs(grp), vec![u1.node, u2.node]);
    assert!(b.graph().inputs(grp).is_empty());
}

/// `tf.add_to_collection(key, t)` takes a tensor, as TF1 code passes it.
#[test]
fn a_tensor_goes_into_a_collection_by_its_node() {
    let mut b = towers_graph::GraphBuilder::new();
    let x = b.placeholder("x", towers_graph::DType::F32, [2]).unwrap();
    let y = b.relu(x).unwrap();
    b.add_to_collection("activations", y);
    b.add_to_collection("activations", x.node);
    assert_eq!(b.graph().collection("activations"), ["Relu", "x"]);
}
