//! The text, JSON and dot forms are stable; the verifier guards invariants.

use towers_graph::dot::to_dot;
use towers_graph::layers::{self, Activation};
use towers_graph::text::to_text;
use towers_graph::verify::verify;
use towers_graph::{DType, Device, Graph, GraphBuilder, GraphError, NewNode, Op, Reuse, TensorType};

/// Two towers sharing an MLP, with batch norm and a control dependency.
fn towers() -> Graph {
    let mut b = GraphBuilder::with_seed(7);
    b.reuse_scope(Reuse::No, |b| {
        for i in 0..2 {
            let reuse = if i == 0 { Reuse::No } else { Reuse::Yes };
            b.device(&format!("/gpu:{i}"), |b| {
                b.name_scope(&format!("tower_{i}"), |b| {
                    b.reuse_scope(reuse, |b| {
                        let x = b.placeholder("x", DType::F32, [None, Some(8)])?;
                        let h = layers::dense(b, "fc1", x, 4, Activation::Relu)?;
                        let h = layers::batch_norm(b, "bn", h, 0.9, 1e-3)?;
                        let y = layers::dense(b, "fc2", h, 2, Activation::None)?;
                        let m = b.reduce_mean_all(y)?;
                        b.control_dependencies(&[x.node], |b| b.identity(m, "loss"))
                    })
                })
            })?;
        }
        Ok::<_, GraphError>(())
    })
    .unwrap();
    b.finish()
}

#[test]
fn text_is_stable_across_builds() {
    let (a, b) = (to_text(&towers()).unwrap(), to_text(&towers()).unwrap());
    assert_eq!(a, b);
    assert!(a.contains("tower_1/fc1/MatMul = MatMul { transpose_a: false, transpose_b: false }(tower_1/x:0, fc1/weights:0) -> f32[?,4] requested=/device:GPU:1\n"), "{a}");
    assert!(a.contains("tower_0/loss = Identity(tower_0/Mean:0, ^tower_0/x) -> f32[]"), "{a}");
}

#[test]
fn json_round_trip_is_exact() {
    let g = towers();
    let j = g.to_json().unwrap();
    let back = Graph::from_json(&j).unwrap();
    assert_eq!(back.to_json().unwrap(), j);
    assert_eq!(to_text(&back).unwrap(), to_text(&g).unwrap());
    assert_eq!(back.seed, 7);
    assert_eq!(back.collections(), g.collections());
    verify(&back, "from_json", false).unwrap();
}

#[test]
fn json_keeps_placement() {
    let mut g = towers();
    for id in g.node_ids() {
        let n = g.node_mut(id);
        n.device = Some(Device::gpu(1));
        n.placement_reason = Some("test".into());
        n.tower = Some(1);
    }
    let back = Graph::from_json(&g.to_json().unwrap()).unwrap();
    assert_eq!(to_text(&back).unwrap(), to_text(&g).unwrap());
    assert!(to_text(&back).unwrap().contains(" @gpu:1 (test)\n"));
}

#[test]
fn dot_has_scope_clusters_and_is_deterministic() {
    let g = towers();
    let d = to_dot(&g).unwrap();
    assert_eq!(d, to_dot(&towers()).unwrap());
    assert!(d.starts_with("digraph towers {\n"));
    for label in ["tower_0", "tower_1", "fc1", "bn", "fc2"] {
        assert!(d.contains(&format!("label=\"{label}\";")), "no cluster {label}:\n{d}");
    }
    // tower_0 and tower_1 and their fc1/fc2/bn sub-scopes, plus the variable scopes fc1, bn, fc2.
    assert_eq!(d.matches("subgraph cluster_").count(), 2 + 2 * 3 + 3, "{d}");
    assert!(d.contains("style=dashed"), "control edge missing");
    assert!(d.contains("shape=cylinder"), "variables drawn as cylinders");
}

#[test]
fn verifier_accepts_built_graphs_and_catches_tampering() {
    let mut g = towers();
    verify(&g, "build", false).unwrap();
    let id = g.find("tower_0/fc1/MatMul").unwrap();
    g.node_mut(id).outputs[0] = TensorType::f32([Some(3), Some(4)]);
    let e = verify(&g, "tamper", false).unwrap_err();
    assert!(matches!(e, GraphError::Verify { .. }), "{e:?}");
    let m = e.to_string();
    assert!(
        m.starts_with(
            "graph verification failed after tamper: 'tower_0/fc1/MatMul' (MatMul) stores output types [\"f32[3,4]\"]"
        ),
        "{m}"
    );
}

#[test]
fn placed_verifier_wants_devices_and_copies() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [Some(2)]).unwrap();
    let y = b.neg(x).unwrap();
    let mut g = b.finish();
    let e = verify(&g, "place", true).unwrap_err().to_string();
    assert!(e.contains("'x' has no device after placement"), "{e}");
    g.node_mut(x.node).device = Some(Device::CPU0);
    g.node_mut(y.node).device = Some(Device::gpu(0));
    let e = verify(&g, "place", true).unwrap_err().to_string();
    assert!(e.contains("edge x (cpu:0) -> Neg (gpu:0) crosses devices without a Copy"), "{e}");
    // Put a Copy on the edge: valid.
    let c = g.add(NewNode::new("x/copy", Op::Copy, vec![x])).unwrap();
    g.node_mut(c).device = Some(Device::gpu(0));
    g.set_input(y.node, 0, towers_graph::Tensor::new(c, 0)).unwrap();
    verify(&g, "copy", true).unwrap();
    // A Copy that does not cross devices is rejected.
    g.node_mut(x.node).device = Some(Device::gpu(0));
    let e = verify(&g, "copy", true).unwrap_err().to_string();
    assert!(e.contains("Copy 'x/copy' does not cross devices (gpu:0)"), "{e}");
}
