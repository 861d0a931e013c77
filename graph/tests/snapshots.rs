//! Snapshots of the text form of small models; review `.snap` diffs by eye.

use towers_graph::layers::{self, Activation};
use towers_graph::text::to_text;
use towers_graph::{DType, GraphBuilder, Padding};

#[test]
fn mlp_two_layers() {
    let mut b = GraphBuilder::with_seed(1);
    let x = b.placeholder("x", DType::F32, [None, Some(784)]).unwrap();
    let labels = b.placeholder("labels", DType::I32, [None]).unwrap();
    let h = layers::dense(&mut b, "hidden", x, 128, Activation::Relu).unwrap();
    let logits = layers::dense(&mut b, "logits", h, 10, Activation::None).unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, labels).unwrap();
    b.reduce_mean_all(xent).unwrap();
    insta::assert_snapshot!(to_text(b.graph()).unwrap());
}

#[test]
fn small_convnet() {
    let mut b = GraphBuilder::with_seed(1);
    let x = b.placeholder("images", DType::F32, [None, Some(28), Some(28), Some(1)]).unwrap();
    let labels = b.placeholder("labels", DType::I32, [None]).unwrap();
    let c = layers::conv2d(&mut b, "conv1", x, 8, [5, 5], Padding::Same, Activation::Relu).unwrap();
    let p = b.max_pool(c, [2, 2], [2, 2], Padding::Same).unwrap();
    let c = layers::conv2d(&mut b, "conv2", p, 16, [3, 3], Padding::Valid, Activation::Relu).unwrap();
    let p = b.max_pool(c, [2, 2], [2, 2], Padding::Valid).unwrap();
    let f = b.flatten(p).unwrap();
    let logits = layers::dense(&mut b, "logits", f, 10, Activation::None).unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, labels).unwrap();
    b.reduce_mean_all(xent).unwrap();
    insta::assert_snapshot!(to_text(b.graph()).unwrap());
}
