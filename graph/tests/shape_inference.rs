//! Shape inference with an unknown batch, then `reinfer` after binding it.

use towers_graph::layers::{self, Activation};
use towers_graph::{DType, Graph, GraphBuilder, Op, Padding, Shape, Tensor};

fn shape(g: &Graph, t: Tensor) -> String {
    g.tensor_type(t).unwrap().shape.to_string()
}

/// x[?,28,28,1] -> conv 5x5 SAME 32 -> pool 2x2/2 SAME -> conv 3x3/2 VALID 64
/// -> pool 3x3/1 VALID -> flatten -> dense 10 -> sparse xent.
fn convnet() -> (Graph, Vec<(Tensor, &'static str, &'static str)>) {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("images", DType::F32, [None, Some(28), Some(28), Some(1)]).unwrap();
    let labels = b.placeholder("labels", DType::I32, [None]).unwrap();
    let c1 = layers::conv2d(&mut b, "conv1", x, 32, [5, 5], Padding::Same, Activation::Relu).unwrap();
    let p1 = b.max_pool(c1, [2, 2], [2, 2], Padding::Same).unwrap();
    let w = b.get_variable("conv2_w", [3, 3, 32, 64], towers_graph::Initializer::Zeros).unwrap();
    // VALID, stride 2: ceil((14 - 3 + 1) / 2) = 6.
    let c2 = b.conv2d(p1, w, [2, 2], Padding::Valid).unwrap();
    // VALID 3x3 stride 1: 6 - 3 + 1 = 4.
    let p2 = b.max_pool(c2, [3, 3], [1, 1], Padding::Valid).unwrap();
    let f = b.flatten(p2).unwrap();
    let logits = layers::dense(&mut b, "logits", f, 10, Activation::None).unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, labels).unwrap();
    let loss = b.reduce_mean_all(xent).unwrap();
    let checks = vec![
        (c1, "[?,28,28,32]", "[8,28,28,32]"),
        (p1, "[?,14,14,32]", "[8,14,14,32]"),
        (c2, "[?,6,6,64]", "[8,6,6,64]"),
        (p2, "[?,4,4,64]", "[8,4,4,64]"),
        (f, "[?,1024]", "[8,1024]"),
        (logits, "[?,10]", "[8,10]"),
        (xent, "[?]", "[8]"),
        (Tensor::new(xent.node, 1), "[?,10]", "[8,10]"),
        (loss, "[]", "[]"),
    ];
    (b.finish(), checks)
}

#[test]
fn unknown_batch_flows_through_layers() {
    let (g, checks) = convnet();
    for (t, unknown, _) in &checks {
        assert_eq!(shape(&g, *t), *unknown, "{}", g.node(t.node).name);
    }
}

#[test]
fn same_and_strided_windows_follow_tf() {
    // SAME: ceil(in / stride); VALID: ceil((in - k + 1) / stride).
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(7), Some(5), Some(3)]).unwrap();
    let same = b.max_pool(x, [3, 3], [2, 2], Padding::Same).unwrap();
    let valid = b.avg_pool(x, [3, 3], [2, 2], Padding::Valid).unwrap();
    assert_eq!(shape(b.graph(), same), "[?,4,3,3]");
    assert_eq!(shape(b.graph(), valid), "[?,3,2,3]");
    let e = b.max_pool(x, [6, 6], [1, 1], Padding::Valid).unwrap_err();
    assert!(e.to_string().contains("does not fit input [?,7,5,3]"), "{e}");
}

#[test]
fn binding_the_batch_and_reinfer_makes_everything_known() {
    let (mut g, checks) = convnet();
    for name in ["images", "labels"] {
        let id = g.find(name).unwrap();
        if let Op::Placeholder { shape, .. } = &mut g.node_mut(id).op {
            *shape = shape.with_dim(0, Some(8));
        }
    }
    g.reinfer().unwrap();
    for (t, _, known) in &checks {
        assert_eq!(shape(&g, *t), *known, "{}", g.node(t.node).name);
    }
    for id in g.node_ids() {
        for t in &g.node(id).outputs {
            assert!(t.shape.is_fully_known(), "{} still has {}", g.node(id).name, t);
        }
    }
    towers_graph::verify::verify(&g, "reinfer", false).unwrap();
}

#[test]
fn reinfer_reports_a_batch_that_no_longer_fits() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(6)]).unwrap();
    b.reshape(x, &[-1, 4]).unwrap();
    let mut g = b.finish();
    let id = g.find("x").unwrap();
    g.node_mut(id).op = Op::Placeholder { dtype: DType::F32, shape: Shape(vec![Some(3), Some(6)]) };
    let e = g.reinfer().unwrap_err();
    assert!(e.to_string().contains("cannot reshape [3,6] (18 elements) into [-1, 4]"), "{e}");
}
