//! Tests of the structure of gradient graphs and of the diagnostics.

use towers_graph::{DType, GraphBuilder, Op};

use super::{var, weighted_loss};
use crate::autodiff::gradients;
use crate::state::PassError;

#[test]
fn unreachable_variable_is_listed_not_zero() {
    let mut b = GraphBuilder::new();
    let x = var(&mut b, "x", &[3]);
    let unused = var(&mut b, "unused", &[3]);
    let loss = weighted_loss(&mut b, &[x]);
    let mut g = b.finish();
    let res = gradients(&mut g, loss, &[x.node, unused.node]).unwrap();
    assert_eq!(res.grads.len(), 1);
    assert_eq!(res.grads[0].0, "x");
    assert_eq!(res.unreachable, vec!["unused".to_string()]);
}

#[test]
fn no_gradients_error_names_loss_and_vars() {
    let mut b = GraphBuilder::new();
    let x = var(&mut b, "x", &[3]);
    let s = b.stop_gradient(x).unwrap();
    let loss = b.reduce_sum_all(s).unwrap();
    let mut g = b.finish();
    let err = gradients(&mut g, loss, &[x.node]).unwrap_err();
    assert!(matches!(err, PassError::NoGradients { .. }));
    let text = err.to_string();
    assert!(text.contains("No gradients provided for any variable"), "{text}");
    assert!(text.contains("'Sum'") && text.contains("[x]"), "{text}");
}

#[test]
fn stop_gradient_blocks_one_path() {
    // loss = Σ(x * stop_gradient(x)): dx = stop_gradient(x) only.
    let mut b = GraphBuilder::new();
    let x = var(&mut b, "x", &[3]);
    let s = b.stop_gradient(x).unwrap();
    let p = b.mul(x, s).unwrap();
    let loss = b.reduce_sum_all(p).unwrap();
    let mut g = b.finish();
    let res = gradients(&mut g, loss, &[x.node]).unwrap();
    let d = res.grads[0].1;
    // No AddN: only one contribution reaches x.
    assert!(!matches!(g.node(d.node).op, Op::AddN));
    assert!(g.node_ids().iter().all(|&n| !g.node(n).name.starts_with("gradients/StopGradient")));
}

#[test]
fn tensor_used_twice_accumulates_with_one_add_n() {
    let mut b = GraphBuilder::new();
    let x = var(&mut b, "x", &[3]);
    let t = b.tanh(x).unwrap();
    let s = b.sigmoid(x).unwrap();
    let r = b.relu(x).unwrap();
    let loss = weighted_loss(&mut b, &[t, s, r]);
    let mut g = b.finish();
    let res = gradients(&mut g, loss, &[x.node]).unwrap();
    let d = res.grads[0].1;
    assert!(matches!(g.node(d.node).op, Op::AddN));
    assert_eq!(g.inputs(d.node).len(), 3);
    assert_eq!(g.node(d.node).name, "gradients/x_grad/AddN");
    let addns = g.node_ids().into_iter().filter(|&n| matches!(g.node(n).op, Op::AddN)).count();
    // One in the forward loss (3 terms), one accumulating x's gradient.
    assert_eq!(addns, 2);
}

#[test]
fn gradient_names_and_devices_follow_forward_nodes() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [2, 3]).unwrap();
    let (w, y) = b
        .device("/gpu:1", |b| {
            b.variable_scope("fc1", towers_graph::Reuse::No, |b| {
                let w = var(b, "weights", &[3, 4]);
                Ok::<_, towers_graph::GraphError>((w, b.matmul(x, w)?))
            })
        })
        .unwrap();
    let loss = b.reduce_sum_all(y).unwrap();
    let mut g = b.finish();
    let res = gradients(&mut g, loss, &[w.node]).unwrap();
    let d = g.node(res.grads[0].1.node);
    assert_eq!(d.name, "gradients/fc1/MatMul_grad/MatMul");
    assert_eq!(d.requested_device, g.node(y.node).requested_device);
    // Pruned: no gradient is built for the placeholder input.
    assert_eq!(g.node_ids().iter().filter(|&&n| g.node(n).name.starts_with("gradients/fc1/MatMul_grad/")).count(), 1);
}

#[test]
fn non_scalar_loss_and_missing_rule_are_errors() {
    let mut b = GraphBuilder::new();
    let x = var(&mut b, "x", &[3]);
    let mut g = b.finish();
    assert!(matches!(gradients(&mut g, x, &[x.node]), Err(PassError::LossNotScalar { .. })));

    let mut b = GraphBuilder::new();
    let x = var(&mut b, "x", &[3]);
    let c = b.op1("copy", Op::Copy, &[x]).unwrap();
    let loss = b.reduce_sum_all(c).unwrap();
    let mut g = b.finish();
    let err = gradients(&mut g, loss, &[x.node]).unwrap_err();
    assert!(err.to_string().contains("No gradient defined for operation 'copy'"), "{err}");
}

#[test]
fn int_paths_do_not_propagate() {
    // argmax/cast/equal: no gradient flows (TF returns None).
    let mut b = GraphBuilder::new();
    let x = var(&mut b, "x", &[2, 3]);
    let a = b.argmax(x, 1).unwrap();
    let c = b.cast(a, DType::F32).unwrap();
    let l1 = b.reduce_sum_all(c).unwrap();
    let l2 = b.l2_loss(x).unwrap();
    let loss = b.add(l1, l2).unwrap();
    let mut g = b.finish();
    let res = gradients(&mut g, loss, &[x.node]).unwrap();
    assert_eq!(res.grads.len(), 1);
}

#[test]
fn autodiff_and_apply_passes_fill_the_state() {
    use crate::autodiff::Autodiff;
    use crate::manager::Pass;
    use crate::optimizer::ApplyOptimizer;
    use crate::state::{CompileState, TensorRef};
    let mut b = GraphBuilder::new();
    let x = var(&mut b, "x", &[3]);
    let _unused = var(&mut b, "unused", &[3]);
    let loss = weighted_loss(&mut b, &[x]);
    let mut g = b.finish();
    let mut st = CompileState { loss: Some(TensorRef::of(&g, loss)), ..Default::default() };
    Autodiff.run(&mut g, &mut st).unwrap();
    assert_eq!(st.grads.keys().collect::<Vec<_>>(), ["x"]);
    assert!(st.diagnostics[0].message.contains("[unused]"), "{:?}", st.diagnostics);
    let opt = towers_graph::Optimizer::Sgd { lr: towers_graph::F32(0.1) };
    ApplyOptimizer { optimizer: opt, clip_global_norm: None, name: None }.run(&mut g, &mut st).unwrap();
    assert_eq!(g.program().train_op.as_deref(), Some("train_op"));
    assert_eq!(g.program().fetches["loss"], TensorRef::of(&g, loss));
}
