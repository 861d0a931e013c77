//! Tests of autodiff: finite-difference checks of every gradient rule against
//! the f64 reference interpreter in [`interp`], and the diagnostics.

pub(crate) mod interp;
mod interp_array;
mod interp_nn;
mod rules;
mod rules_array;
mod rules_compose;
mod rules_math;
mod rules_select;
mod rules_topk;
mod structure;

use std::collections::BTreeMap;

use towers_graph::{ConstValue, DType, Graph, GraphBuilder, Initializer, NodeId, Op, Tensor, F32};

use interp::V;

/// Deterministic pseudo-random values in [-1, 1).
pub(crate) fn rand_vec(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

/// A variable `name` of `shape` (its value is given to the interpreter separately).
pub(crate) fn var(b: &mut GraphBuilder, name: &str, shape: &[usize]) -> Tensor {
    b.get_variable(name, shape.to_vec(), Initializer::Zeros).expect("variable")
}

/// `Σ_i reduce_sum(outs[i] * W_i)` with fixed random f32 weights W_i, so every
/// output element matters to the loss.
pub(crate) fn weighted_loss(b: &mut GraphBuilder, outs: &[Tensor]) -> Tensor {
    let mut terms = Vec::new();
    for (i, &y) in outs.iter().enumerate() {
        let shape = b.graph().tensor_type(y).expect("type").shape.dims().expect("known shape");
        let n = shape.iter().product();
        let data: Vec<F32> = rand_vec(n, 1000 + i as u64).into_iter().map(|v| F32(v as f32)).collect();
        let w = b.op1("W", Op::Const { value: ConstValue { dtype: DType::F32, shape, data } }, &[]).expect("const");
        let p = b.mul(y, w).expect("mul");
        terms.push(b.reduce_sum_all(p).expect("sum"));
    }
    if terms.len() == 1 {
        terms[0]
    } else {
        b.add_n(&terms).expect("add_n")
    }
}

/// Loss value of the graph at these variable values.
fn loss_at(g: &Graph, loss: Tensor, vals: &BTreeMap<String, V>, feeds: &BTreeMap<String, V>) -> f64 {
    let mut vars = vals.clone();
    interp::run(g, &mut vars, feeds)[&loss.node][loss.slot].data[0]
}

/// Build a case (the variables to check, the outputs a weighted loss sums)
/// and check its gradients by central differences (see [`check_grads`]).
pub(crate) fn case(build: impl FnOnce(&mut GraphBuilder) -> (Vec<Tensor>, Vec<Tensor>)) {
    case_fed(BTreeMap::new(), build)
}

/// As [`case`], with placeholders fed `feeds`.
pub(crate) fn case_fed(
    feeds: BTreeMap<String, V>,
    build: impl FnOnce(&mut GraphBuilder) -> (Vec<Tensor>, Vec<Tensor>),
) {
    let mut b = GraphBuilder::new();
    let (vars, outs) = build(&mut b);
    let loss = weighted_loss(&mut b, &outs);
    let mut g = b.finish();
    let ids: Vec<_> = vars.iter().map(|t| t.node).collect();
    check_grads(&mut g, loss, &ids, &feeds);
}

/// Check `gradients` against central differences for every variable in `vars`.
///
/// Step h = 1e-4 in f64: the truncation error is O(h²·f''') ≈ 1e-8 and the
/// rounding error ≈ 1e-16/h = 1e-12, so we require
/// |analytic - numeric| <= 1e-5 * max(1, |numeric|) elementwise.
pub(crate) fn check_grads(g: &mut Graph, loss: Tensor, vars: &[NodeId], feeds: &BTreeMap<String, V>) {
    let mut vals = BTreeMap::new();
    for (i, &v) in vars.iter().enumerate() {
        let node = g.node(v);
        let Op::Variable { shape, .. } = &node.op else { panic!("not a variable") };
        let n = shape.iter().product();
        vals.insert(node.name.clone(), V::new(shape, rand_vec(n, 7 + i as u64)));
    }
    let res = super::gradients(g, loss, vars).expect("gradients");
    assert!(res.unreachable.is_empty(), "unreachable: {:?}", res.unreachable);
    let mut state = vals.clone();
    let out = interp::run(g, &mut state, feeds);
    let h = 1e-4;
    for (name, grad) in &res.grads {
        let analytic = &out[&grad.node][grad.slot];
        let base = &vals[name];
        assert_eq!(analytic.shape, base.shape, "gradient shape of {name}");
        for k in 0..base.data.len() {
            let mut plus = vals.clone();
            plus.get_mut(name).expect("var").data[k] += h;
            let mut minus = vals.clone();
            minus.get_mut(name).expect("var").data[k] -= h;
            let numeric = (loss_at(g, loss, &plus, feeds) - loss_at(g, loss, &minus, feeds)) / (2.0 * h);
            let a = analytic.data[k];
            assert!(
                (a - numeric).abs() <= 1e-5 * numeric.abs().max(1.0),
                "d loss / d {name}[{k}]: analytic {a} vs numeric {numeric}"
            );
        }
    }
}
