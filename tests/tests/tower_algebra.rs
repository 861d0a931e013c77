//! Tower algebra end to end: what the towers compute the same from shared
//! state is computed once (`tower_cse`), and data movement that undoes
//! itself (a split concatenated back) is cancelled (`simplify`'s
//! `concat-pieces`). Both are exact: the plans train bit for bit like the
//! ones without them, and like one device on the whole batch within the
//! equivalence tests' tolerance.

use towers::codegen::Step;
use towers::compiler::{compile_train, CompileOptions, Compiled};
use towers::models::{Model, ModelKind, ModelSpec};
use towers_graph::Graph;
use towers_graph::{
    layers::Activation, DType, GraphBuilder, Initializer, Op, Optimizer, Reuse, Shape, Tensor, VariableOptions, F32,
};
use towers_passes::Pipeline;
use towers_tests::{batches, max_rel_diff, optimizers, run, towers, TOL};

const BATCH: usize = 24;
const STEPS: usize = 3;

/// A dense layer whose weights carry an L2 regularizer of `decay` (TF's
/// `kernel_regularizer=l2_regularizer(decay)`).
fn dense_l2(b: &mut GraphBuilder, name: &str, x: Tensor, units: usize, decay: f32) -> Tensor {
    let in_dim = b.graph().tensor_type(x).unwrap().shape.dim(1).unwrap();
    b.variable_scope(name, Reuse::No, |b| {
        let opts = VariableOptions { l2_regularizer: Some(decay), ..Default::default() };
        let w = b.get_variable_with("weights", [in_dim, units], Initializer::GlorotUniform, opts)?;
        let bias = b.get_variable("biases", [units], Initializer::Zeros)?;
        let y = b.matmul(x, w)?;
        b.bias_add(y, bias)
    })
    .unwrap()
}

/// An MLP 64-16-10 on 8x8 inputs. With `decay`, both weights carry weight
/// decay and the loss is the mean cross-entropy plus the regularization
/// loss, as in cifar10_multi_gpu_train's tower loss. With `split_concat`,
/// the hidden layer is split in two along its features and concatenated
/// back in order before the logits layer (the same function).
fn mlp(decay: Option<f32>, split_concat: bool) -> Model {
    let mut spec = ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10);
    spec.hidden = vec![16];
    spec.seed = 17;
    let mut b = GraphBuilder::with_seed(spec.seed);
    let images = b.placeholder("images", DType::F32, Shape(vec![None, Some(8), Some(8), Some(1)])).unwrap();
    let labels = b.placeholder("labels", DType::I32, Shape(vec![None])).unwrap();
    let x = b.flatten(images).unwrap();
    let dense = |b: &mut GraphBuilder, name: &str, x: Tensor, units: usize| match decay {
        Some(d) => dense_l2(b, name, x, units, d),
        None => towers_graph::layers::dense(b, name, x, units, Activation::None).unwrap(),
    };
    let h = dense(&mut b, "fc1", x, 16);
    let mut h = b.relu(h).unwrap();
    if split_concat {
        let parts = b.split(h, 1, &[6, 10]).unwrap();
        h = b.concat(&parts, 1).unwrap();
    }
    let logits = dense(&mut b, "logits", h, 10);
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, labels).unwrap();
    let mut loss = b.reduce_mean(xent, &[0], false).unwrap();
    if let Some(reg) = b.regularization_loss().unwrap() {
        loss = b.add(loss, reg).unwrap();
    }
    let loss = b.identity(loss, "loss").unwrap();
    let pred = b.argmax(logits, 1).unwrap();
    let name = |b: &GraphBuilder, t: Tensor| b.graph().node(t.node).name.clone();
    Model {
        images: name(&b, images),
        labels: name(&b, labels),
        loss: name(&b, loss),
        logits: name(&b, logits),
        predictions: name(&b, pred),
        spec,
        graph: b.finish(),
    }
}

fn opts(optimizer: &Optimizer, n: u32, merge: bool) -> CompileOptions {
    let mut o = CompileOptions::new(optimizer.clone(), BATCH);
    o.towers = towers(n);
    o.merge_tower_duplicates = merge;
    o
}

fn launches(c: &Compiled) -> usize {
    c.plan.streams.iter().flat_map(|s| &s.steps).filter(|s| matches!(s, Step::Launch { .. })).count()
}

/// Two towers with weight decay: each regularizer (`L2Loss` of a weight)
/// is computed once, by tower 0, not once a tower; the run trains bit for
/// bit like the unmerged plan, for every optimizer, and like one device on
/// the whole batch within the equivalence tolerance.
#[test]
fn weight_decay_is_computed_once_and_trains_bit_for_bit() {
    let m = mlp(Some(0.01), false);
    let data = batches(BATCH, STEPS, 21);
    let sgd = Optimizer::Sgd { lr: F32(0.1) };
    let (on, off) = (compile_train(&m.graph, &m.loss, &opts(&sgd, 2, true)).unwrap(), {
        compile_train(&m.graph, &m.loss, &opts(&sgd, 2, false)).unwrap()
    });
    let l2 = |c: &Compiled| c.graph.node_ids().into_iter().filter(|&id| c.graph.node(id).op == Op::L2Loss).count();
    assert_eq!((l2(&on), l2(&off)), (2, 4), "one L2Loss a regularized weight, not one a tower");
    eprintln!("launches per step, 2 towers: merged {} unmerged {}", launches(&on), launches(&off));
    assert!(launches(&on) < launches(&off), "{} launches merged against {}", launches(&on), launches(&off));
    for opt in optimizers() {
        let single = run(&m, &CompileOptions::new(opt.clone(), BATCH), &data);
        for n in [2, 3] {
            let (a, b) = (run(&m, &opts(&opt, n, true), &data), run(&m, &opts(&opt, n, false), &data));
            assert_eq!(a.losses, b.losses, "{opt:?} {n} towers: losses");
            assert_eq!(a.variables, b.variables, "{opt:?} {n} towers: variables");
            let (d, var) = max_rel_diff(&a, &single);
            assert!(d <= TOL, "{opt:?} {n} towers: {var} differs from one device by {d}");
            for (x, y) in a.losses.iter().zip(&single.losses) {
                assert!((x - y).abs() <= TOL * y.abs().max(1.0), "{opt:?} {n} towers: loss {x} vs {y}");
            }
        }
    }
}

/// A split of the hidden layer concatenated back in order is gone from the
/// plan, forward and backward (no split, concat or slice node left), and the
/// model trains bit for bit like the same model without them, on one
/// device and on two towers.
#[test]
fn split_then_concat_is_cancelled() {
    let (with, without) = (mlp(None, true), mlp(None, false));
    let data = batches(BATCH, STEPS, 4);
    let adam = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    for n in [0, 2] {
        let o = opts(&adam, n, true);
        let moves = |g: &Graph| -> Vec<String> {
            g.node_ids()
                .into_iter()
                .filter(|&id| matches!(g.node(id).op, Op::Split { .. } | Op::Concat { .. } | Op::Slice { .. }))
                .map(|id| g.node(id).name.clone())
                .filter(|name| !name.starts_with("split/"))
                .collect()
        };
        // Before simplify: the forward's split and concat, the backward's slices and concat, per tower.
        let front = Pipeline::train(&with.loss, &o).before("simplify").unwrap().run(&with.graph).unwrap();
        assert_eq!(moves(&front.graph).len(), 5 * n.max(1) as usize, "{:?}", moves(&front.graph));
        let c = compile_train(&with.graph, &with.loss, &o).unwrap();
        assert!(moves(&c.graph).is_empty(), "{n} towers: {:?} are left", moves(&c.graph));
        let plain = compile_train(&without.graph, &without.loss, &o).unwrap();
        assert_eq!(launches(&c), launches(&plain), "{n} towers");
        let (a, b) = (run(&with, &o, &data), run(&without, &o, &data));
        assert_eq!(a.losses, b.losses, "{n} towers");
        assert_eq!(a.variables, b.variables, "{n} towers");
    }
}
