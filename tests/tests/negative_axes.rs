//! Axes as TF takes them: every builder method with an axis argument accepts
//! a negative axis (`-1` is the last), resolved at build time against the
//! input's rank, so a graph written with negative axes is byte for byte the
//! graph written with the positive ones; an axis outside `[-rank, rank)` is
//! a shape error naming the node, in TF's words. Also `unstack`, TF's
//! `tf.unstack`, in training: its gradient is the stack of the parts'.

use towers::prelude::*;
use towers_graph::text::to_text;
use towers_tests::{batches, max_rel_diff, run, towers, TOL};

/// A body using every axis-taking method; `neg` writes each axis counted
/// from the end, otherwise from the front. x: [N, 8, 8, 1].
fn body(b: &mut GraphBuilder, x: Tensor, neg: bool) -> Result<Tensor, GraphError> {
    let a = |p: i64, r: i64| if neg { p - r } else { p };
    let h = b.reshape(x, &[-1, 8, 8])?; // rank 3
    let s = b.reduce_sum(h, &[a(2, 3)], false)?; // [N, 8]
    let m = b.reduce_mean(h, &[a(1, 3), a(2, 3)], true)?; // [N, 1, 1]
    let mx = b.reduce_max(h, &[a(1, 3)], false)?; // [N, 8]
    let mn = b.reduce_min(h, &[a(2, 3)], false)?; // [N, 8]
    let c = b.concat(&[s, mx, mn], a(1, 2))?; // [N, 24]
    let parts = b.split(c, a(1, 2), &[12, 12])?;
    let e = b.expand_dims(parts[0], a(2, 3))?; // [N, 12, 1]
    let st = b.stack(&[parts[0], parts[1]], a(1, 3))?; // [N, 2, 12]
    let n = b.l2_normalize(st, a(2, 3))?;
    let (mean, var) = b.moments(n, &[a(1, 3)], false)?; // [N, 12] each
    let sq = b.squeeze(e, &[a(2, 3)])?; // [N, 12]
    let am = b.argmax(sq, a(1, 2))?; // [N]
    let table = b.get_variable("table", [12, 12], Initializer::Constant(F32(0.1)))?;
    let g = b.gather(table, am, a(0, 2))?; // [N, 12]
    let mm = b.reshape(m, &[-1, 1])?;
    let t = b.add(mean, var)?;
    let t = b.add(t, g)?;
    let t = b.mul(t, mm)?;
    layers::dense(b, "logits", t, 10, Activation::None)
}

fn graph(neg: bool) -> Graph {
    let mut b = GraphBuilder::with_seed(3);
    let x = b.placeholder("images", DType::F32, [None, Some(8), Some(8), Some(1)]).unwrap();
    body(&mut b, x, neg).unwrap();
    b.finish()
}

#[test]
fn negative_axes_build_the_graph_of_the_positive_ones() {
    let (pos, neg) = (to_text(&graph(false)).unwrap(), to_text(&graph(true)).unwrap());
    assert!(pos.contains("Sum") && pos.contains("concat"), "{pos}");
    assert_eq!(neg, pos, "a negative axis resolves to the positive one at build time");
}

#[test]
fn an_axis_outside_the_rank_names_the_node() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(4)]).unwrap();
    let cases: Vec<(&str, Result<Tensor, GraphError>)> = vec![
        ("outer/Sum", b.name_scope("outer", |b| b.reduce_sum(x, &[2], false))),
        ("Mean", b.reduce_mean(x, &[-3], false)),
        ("concat", b.concat(&[x, x], -3)),
        ("ArgMax", b.argmax(x, 2)),
        ("split", b.split(x, 5usize, &[2, 2]).map(|v| v[0])),
    ];
    for (node, r) in cases {
        let e = r.expect_err(node).to_string();
        assert!(e.contains(node), "names the node {node}: {e}");
        assert!(e.contains("Expected axis in the range [-2, 2), but got"), "TF's words: {e}");
    }
}

/// One of each integer type a user may hold an axis in.
#[test]
fn axes_take_any_integer_type() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(4), Some(3)]).unwrap();
    let (u, i, l): (usize, i32, i64) = (1, -1, -2);
    let a = b.reduce_sum(x, &[u], false).unwrap();
    let c = b.reduce_sum(x, &[i], false).unwrap();
    let d = b.reduce_sum(x, &vec![l], false).unwrap();
    let ty = |b: &GraphBuilder, t: Tensor| b.graph().tensor_type(t).unwrap().shape.to_string();
    assert_eq!(ty(&b, a), "[?,3]");
    assert_eq!(ty(&b, c), "[?,4]");
    assert_eq!(ty(&b, d), "[?,3]");
    // 1 and -2 name one axis of a rank-3 input: counted once, as TF does.
    let e = b.reduce_sum(x, &[1, -2], false).unwrap();
    assert_eq!(ty(&b, e), "[?,3]");
}

/// `unstack` over time, each step through one shared dense layer, summed:
/// a recurrent model's shape. Two towers train as one device (each
/// example's steps stay in its tower); the loss falls.
fn unstack_model() -> towers::models::Model {
    let mut b = GraphBuilder::with_seed(9);
    let x = b.placeholder("images", DType::F32, [None, Some(8), Some(8), Some(1)]).unwrap();
    let y = b.placeholder("labels", DType::I32, [None]).unwrap();
    let logits = (|| -> Result<Tensor, GraphError> {
        let seq = b.reshape(x, &[-1, 8, 8])?;
        let steps = b.unstack(seq, -2)?;
        assert_eq!(steps.len(), 8);
        let mut acc: Option<Tensor> = None;
        for (t, s) in steps.into_iter().enumerate() {
            let reuse = if t == 0 { Reuse::No } else { Reuse::Yes };
            let h = b.variable_scope("cell", reuse, |b| layers::dense(b, "step", s, 16, Activation::Tanh))?;
            acc = Some(match acc {
                None => h,
                Some(a) => b.add(a, h)?,
            });
        }
        layers::dense(&mut b, "logits", acc.expect("8 steps"), 10, Activation::None)
    })()
    .unwrap();
    towers_tests::mean_xent_model(b, logits, y, 9)
}

#[test]
fn unstack_trains_and_two_towers_match_one_device() {
    let model = unstack_model();
    let data = batches(16, 4, 2);
    let opts = CompileOptions::new(Optimizer::Sgd { lr: F32(0.02) }, 16);
    let one = run(&model, &opts, &data);
    let mut o = opts.clone();
    o.towers = towers(2);
    let two = run(&model, &o, &data);
    let (d, var) = max_rel_diff(&two, &one);
    assert!(d <= TOL, "{var} differs by {d}");
    let repeat: Vec<_> = (0..30).map(|_| data[0].clone()).collect();
    let fit = run(&model, &opts, &repeat);
    assert!(fit.losses[29] < 0.7 * fit.losses[0], "the loss falls: {:?}", fit.losses);
}

#[test]
fn unstack_of_an_unknown_axis_is_refused() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(4)]).unwrap();
    let e = b.unstack(x, 0).expect_err("the batch axis has no known size").to_string();
    assert!(e.contains("unstack") && e.contains("known size"), "{e}");
}
