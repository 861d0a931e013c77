//! TF1 naming: variables take the variable-scope path only, ops take the
//! name-scope path; name scopes are uniquified on re-entry, variable scopes
//! never are (anchor F14, F15).

use towers_graph::layers::{self, Activation};
use towers_graph::{DType, GraphBuilder, GraphError, Initializer, Reuse, Tensor};

fn name(b: &GraphBuilder, t: Tensor) -> String {
    b.graph().node(t.node).name.clone()
}

#[test]
fn variables_take_variable_scope_path_ops_take_name_scope_path() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [Some(2), Some(3)]).unwrap();
    let (w, y) = b
        .variable_scope("ConvNet", Reuse::No, |b| {
            b.variable_scope("conv_1", Reuse::No, |b| {
                let w = b.get_variable("weights", [3, 4], Initializer::Zeros)?;
                let y = b.matmul(x, w)?;
                Ok::<_, GraphError>((w, y))
            })
        })
        .unwrap();
    assert_eq!(name(&b, w), "ConvNet/conv_1/weights");
    assert_eq!(name(&b, y), "ConvNet/conv_1/MatMul");
    // A name scope around the variable scope changes the ops only.
    let (w2, y2) = b
        .name_scope("outer", |b| {
            b.variable_scope("fc", Reuse::No, |b| {
                let w = b.get_variable("weights", [3, 4], Initializer::Zeros)?;
                let y = b.matmul(x, w)?;
                Ok::<_, GraphError>((w, y))
            })
        })
        .unwrap();
    assert_eq!(name(&b, w2), "fc/weights");
    assert_eq!(name(&b, y2), "outer/fc/MatMul");
}

#[test]
fn reentered_name_scopes_get_suffixes_variables_do_not() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [Some(2), Some(2)]).unwrap();
    let mut ops = Vec::new();
    for i in 0..3 {
        let r = b
            .name_scope("foo", |b| {
                b.variable_scope("foo", Reuse::Auto, |b| {
                    let v = b.get_variable("v", [2, 2], Initializer::Zeros)?;
                    b.add(x, v)
                })
            })
            .unwrap();
        ops.push(name(&b, r));
        assert_eq!(b.graph().collection("variables"), ["foo/v"], "iteration {i}");
    }
    assert_eq!(ops, ["foo/foo/add", "foo_1/foo/add", "foo_2/foo/add"]);
}

#[test]
fn reentered_variable_scope_puts_ops_under_scope_1() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [Some(2), Some(2)]).unwrap();
    let mut out = Vec::new();
    for reuse in [Reuse::No, Reuse::Yes] {
        let (v, y) = b
            .variable_scope("scope", reuse, |b| {
                let v = b.get_variable("v", [2, 2], Initializer::Zeros)?;
                let y = b.mul(x, v)?;
                Ok::<_, GraphError>((v, y))
            })
            .unwrap();
        out.push((name(&b, v), name(&b, y)));
    }
    assert_eq!(
        out,
        [("scope/v".to_string(), "scope/mul".to_string()), ("scope/v".to_string(), "scope_1/mul".to_string())]
    );
}

#[test]
fn repeated_op_names_in_one_scope_are_numbered() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [Some(2), Some(2)]).unwrap();
    let names: Vec<String> = b
        .name_scope("s", |b| {
            let mut v = Vec::new();
            let mut y = x;
            for _ in 0..3 {
                y = b.matmul(y, x)?;
                v.push(b.graph().node(y.node).name.clone());
            }
            Ok::<_, GraphError>(v)
        })
        .unwrap();
    assert_eq!(names, ["s/MatMul", "s/MatMul_1", "s/MatMul_2"]);
    // At root too, and a scope name counts as a used name (TF's _names_in_use).
    let a = b.matmul(x, x).unwrap();
    let c = b.matmul(x, x).unwrap();
    assert_eq!((name(&b, a), name(&b, c)), ("MatMul".into(), "MatMul_1".into()));
    let s = b.identity(x, "s").unwrap();
    assert_eq!(name(&b, s), "s_1");
}

#[test]
fn name_scope_with_trailing_slash_reenters_absolute_scope() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [Some(2)]).unwrap();
    let first = b.name_scope("foo", |b| b.neg(x)).unwrap();
    let again = b
        .name_scope("elsewhere", |b| {
            b.name_scope("foo/", |b| Ok::<_, GraphError>((b.current_name_scope().to_string(), b.neg(x)?)))
        })
        .unwrap();
    assert_eq!(name(&b, first), "foo/Neg");
    assert_eq!(again.0, "foo");
    assert_eq!(name(&b, again.1), "foo/Neg_1");
    // Plain re-entry still uniquifies.
    let third = b.name_scope("foo", |b| b.neg(x)).unwrap();
    assert_eq!(name(&b, third), "foo_1/Neg");
}

#[test]
fn name_scope_inside_variable_scope_affects_ops_only() {
    let mut b = GraphBuilder::new();
    let (v, add) = b
        .variable_scope("foo", Reuse::No, |b| {
            b.name_scope("bar", |b| {
                let v = b.get_variable("v", [1], Initializer::Ones)?;
                let add = b.add(v, v)?;
                Ok::<_, GraphError>((v, add))
            })
        })
        .unwrap();
    assert_eq!(name(&b, v), "foo/v");
    assert_eq!(name(&b, add), "foo/bar/add");
}

#[test]
fn reuse_is_inherited_by_sub_scopes() {
    let mut b = GraphBuilder::new();
    b.variable_scope("a", Reuse::No, |b| {
        b.variable_scope("b", Reuse::No, |b| b.get_variable("w", [2], Initializer::Zeros))
    })
    .unwrap();
    let (reuse, w) = b
        .variable_scope("a", Reuse::Yes, |b| {
            b.variable_scope("b", Reuse::No, |b| {
                Ok::<_, GraphError>((b.current_reuse(), b.get_variable("w", [2], Initializer::Zeros)?))
            })
        })
        .unwrap();
    assert_eq!(reuse, Reuse::Yes);
    assert_eq!(name(&b, w), "a/b/w");
    // Auto does not turn reuse off either.
    let r = b
        .variable_scope("a", Reuse::Yes, |b| {
            b.variable_scope("c", Reuse::Auto, |b| Ok::<_, GraphError>(b.current_reuse()))
        })
        .unwrap();
    assert_eq!(r, Reuse::Yes);
    // A reusing sub-scope cannot create.
    let e = b
        .variable_scope("a", Reuse::Yes, |b| {
            b.variable_scope("new", Reuse::No, |b| b.get_variable("w", [2], Initializer::Zeros))
        })
        .unwrap_err();
    assert!(matches!(e, GraphError::VariableMissing { ref name, .. } if name == "a/new/w"), "{e}");
    assert_eq!(b.graph().collection("variables"), ["a/b/w"]);
}

#[test]
fn auto_reuse_creates_then_gets() {
    let mut b = GraphBuilder::new();
    let first = b.variable_scope("s", Reuse::Auto, |b| b.get_variable("v", [3], Initializer::Zeros)).unwrap();
    let second = b.variable_scope("s", Reuse::Auto, |b| b.get_variable("v", [3], Initializer::Zeros)).unwrap();
    assert_eq!(first, second);
    assert_eq!(name(&b, first), "s/v");
    assert_eq!(b.graph().collection("variables"), ["s/v"]);
}

#[test]
fn tf_tower_loop_shares_one_set_of_variables() {
    // The cifar10_multi_gpu_train.py loop:
    //   with tf.variable_scope(tf.get_variable_scope()):
    //     for i in range(N):
    //       with tf.device('/gpu:%d' % i):
    //         with tf.name_scope('tower_%d' % i) as scope:
    //           loss = tower_loss(scope, ...)
    //           tf.get_variable_scope().reuse_variables()
    let mut b = GraphBuilder::new();
    let mut losses = Vec::new();
    b.reuse_scope(Reuse::No, |b| {
        for i in 0..2 {
            let reuse = if i == 0 { Reuse::No } else { Reuse::Yes };
            let loss = b.device(&format!("/gpu:{i}"), |b| {
                b.name_scope(&format!("tower_{i}"), |b| {
                    b.reuse_scope(reuse, |b| {
                        let x = b.placeholder("x", DType::F32, [None, Some(8)])?;
                        let h = layers::dense(b, "fc1", x, 4, Activation::Relu)?;
                        let y = layers::dense(b, "fc2", h, 2, Activation::None)?;
                        b.reduce_mean_all(y)
                    })
                })
            })?;
            losses.push(loss);
        }
        Ok::<_, GraphError>(())
    })
    .unwrap();
    let g = b.graph();
    assert_eq!(g.collection("variables"), ["fc1/weights", "fc1/biases", "fc2/weights", "fc2/biases"]);
    assert_eq!(g.collection("trainable_variables"), g.collection("variables"));
    let names: Vec<String> = losses.iter().map(|t| g.node(t.node).name.clone()).collect();
    assert_eq!(names, ["tower_0/Mean", "tower_1/Mean"]);
    for i in 0..2 {
        let mm = g.get(&format!("tower_{i}/fc1/MatMul")).expect("tower op");
        assert_eq!(g.node(mm).requested_device.to_string(), format!("/device:GPU:{i}"));
        // Both towers read the same variable node.
        assert_eq!(g.node(g.inputs(mm)[1].node).name, "fc1/weights");
    }
    assert!(g.get("tower_1/fc1/weights").is_none());
}
