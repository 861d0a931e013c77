//! TF's variable regularizers: `l2_regularizer(scale)` builds
//! `scale * l2_loss(var)` once, when the variable is created (a reusing
//! tower builds none), under `<var>/Regularizer/`, and collects it in
//! `regularization_losses`; `regularization_loss()` sums the collection.

use towers_graph::{keys, GraphBuilder, Initializer, Op, Reuse, VariableOptions};

#[test]
fn l2_regularizers_are_built_once_and_collected() {
    let mut b = GraphBuilder::new();
    let opts = VariableOptions { l2_regularizer: Some(0.01), ..Default::default() };
    for (i, reuse) in [Reuse::No, Reuse::Yes].into_iter().enumerate() {
        b.name_scope(&format!("tower_{i}"), |b| {
            b.reuse_scope(reuse, |b| {
                b.variable_scope("fc", Reuse::No, |b| {
                    b.get_variable_with("weights", [3, 4], Initializer::Zeros, opts.clone())?;
                    b.get_variable_with("biases", [4], Initializer::Zeros, opts.clone())
                })
            })
        })
        .unwrap();
    }
    let g = b.graph();
    assert_eq!(
        g.collection(keys::REGULARIZATION_LOSSES),
        ["fc/weights/Regularizer/l2_regularizer", "fc/biases/Regularizer/l2_regularizer"]
    );
    let reg = g.get("fc/weights/Regularizer/l2_regularizer").unwrap();
    assert!(matches!(g.node(reg).op, Op::Binary(towers_graph::BinaryOp::Mul)));
    assert!(g.get("fc/weights/Regularizer/L2Loss").is_some());
    let total = b.regularization_loss().unwrap().unwrap();
    assert_eq!(b.graph().node(total.node).name, "total_regularization_loss");
    assert!(b.graph().tensor_type(total).unwrap().shape.rank() == 0);
}

#[test]
fn no_regularizer_means_no_regularization_loss() {
    let mut b = GraphBuilder::new();
    b.get_variable("w", [2], Initializer::Zeros).unwrap();
    assert!(b.regularization_loss().unwrap().is_none());
}
