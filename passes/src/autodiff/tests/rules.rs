//! One finite-difference check per gradient rule (see `check_grads` for the
//! tolerance). Each graph is `loss = Σ reduce_sum(op(vars) * W)`.

use std::collections::BTreeMap;

use towers_graph::{BinaryOp, DType, GraphBuilder, Op, Padding, Shape, Tensor, UnaryOp, F32};

use super::interp::V;
use super::{case, check_grads, var};

/// Build vars and outputs, add the weighted loss, check every variable.
#[test]
fn matmul_all_transposes() {
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        case(|b| {
            let a = var(b, "a", if ta { &[4, 3] } else { &[3, 4] });
            let w = var(b, "w", if tb { &[5, 4] } else { &[4, 5] });
            (vec![a, w], vec![b.matmul_t(a, w, ta, tb).unwrap()])
        });
    }
}

#[test]
fn add_sub_mul_div_with_broadcasting() {
    // y = a op b with b broadcast along rows and a scalar; grads sum_to back.
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div].map(Op::Binary) {
        case(|b| {
            let x = var(b, "x", &[3, 4]);
            let r = var(b, "r", &[4]);
            let s = var(b, "s", &[]);
            let y = b.op1("y", op.clone(), &[x, r]).unwrap();
            let z = b.op1("z", op.clone(), &[s, y]).unwrap();
            (vec![x, r, s], vec![z])
        });
    }
}

#[test]
fn add_n_bias_add_neg_l2loss() {
    case(|b| {
        let x = var(b, "x", &[2, 3]);
        let c = var(b, "c", &[3]);
        let y = b.bias_add(x, c).unwrap();
        let n = b.neg(y).unwrap();
        let s = b.add_n(&[n, x, y]).unwrap();
        let l = b.l2_loss(s).unwrap();
        (vec![x, c], vec![s, l])
    });
}

#[test]
fn activations() {
    // Relu: dy where y > 0; Sigmoid: dy*y*(1-y); Tanh: dy*(1-y²).
    case(|b| {
        let x = var(b, "x", &[3, 5]);
        let r = b.relu(x).unwrap();
        let s = b.sigmoid(x).unwrap();
        let t = b.tanh(x).unwrap();
        (vec![x], vec![r, s, t])
    });
}

#[test]
fn elu() {
    // y = x (x > 0), exp(x) - 1 (x <= 0); dx = dy (y > 0), dy * (y + 1) (y <= 0),
    // since exp(x) = y + 1 there. Values in [-3, 3) cover both branches.
    case(|b| {
        let x = var(b, "x", &[3, 5]);
        let three = b.scalar(3.0).unwrap();
        let wide = b.mul(x, three).unwrap();
        let e = b.elu(wide).unwrap();
        (vec![x], vec![e])
    });
}

#[test]
fn math_functions_from_their_outputs() {
    // Exp: dy*y; Log: dy/x = dy*exp(-y); Sqrt: dy/(2y); Rsqrt: -dy*y³/2;
    // Reciprocal: -dy*y². Inputs kept in [1, 2] (the domain of all five)
    // by x' = x*x/2 + 1.
    case(|b| {
        let x = var(b, "x", &[2, 3]);
        let sq = b.mul(x, x).unwrap();
        let half = b.scalar(0.5).unwrap();
        let one = b.scalar(1.0).unwrap();
        let h = b.mul(sq, half).unwrap();
        let pos = b.add(h, one).unwrap();
        let outs = [UnaryOp::Exp, UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt, UnaryOp::Reciprocal]
            .map(|op| b.unary(op, pos).unwrap());
        (vec![x], outs.to_vec())
    });
}

#[test]
fn conv2d_same_and_valid_with_strides() {
    for (padding, strides) in [(Padding::Same, [1, 1]), (Padding::Same, [2, 2]), (Padding::Valid, [2, 1])] {
        case(|b| {
            let x = var(b, "x", &[2, 5, 6, 3]);
            let f = var(b, "f", &[3, 2, 3, 4]);
            (vec![x, f], vec![b.conv2d(x, f, strides, padding).unwrap()])
        });
    }
}

#[test]
fn pools() {
    for (padding, k, s) in
        [(Padding::Same, [2, 2], [2, 2]), (Padding::Valid, [3, 2], [1, 2]), (Padding::Same, [3, 3], [2, 1])]
    {
        case(|b| {
            let x = var(b, "x", &[2, 5, 4, 3]);
            let m = b.max_pool(x, k, s, padding).unwrap();
            let a = b.avg_pool(x, k, s, padding).unwrap();
            (vec![x], vec![m, a])
        });
    }
}

#[test]
fn reshape_concat_split_slice() {
    case(|b| {
        let x = var(b, "x", &[2, 6]);
        let y = var(b, "y", &[2, 3]);
        let r = b.reshape(x, &[3, -1]).unwrap();
        let c = b.concat(&[x, y, x], 1).unwrap();
        let parts = b.split(c, 1, &[4, 5, 6]).unwrap();
        // Output 1 of the split is unused: it contributes zeros.
        let s = b.slice(parts[2], &[1, 2], &[1, -1]).unwrap();
        (vec![x, y], vec![r, parts[0], s])
    });
}

#[test]
fn softmax_and_log_softmax() {
    case(|b| {
        let x = var(b, "x", &[3, 4]);
        let s = b.softmax(x).unwrap();
        let l = b.log_softmax(x).unwrap();
        (vec![x], vec![s, l])
    });
}

#[test]
fn cross_entropies() {
    // dlogits = reshape(dloss, [-1,1]) * (softmax(logits) - labels).
    case(|b| {
        let x = var(b, "x", &[3, 4]);
        let labels = b.constant("labels", DType::I32, &[3], &[2.0, 0.0, 3.0]).unwrap();
        let onehot = b
            .constant("onehot", DType::F32, &[3, 4], &[0.2, 0.3, 0.5, 0.0, 1., 0., 0., 0., 0.1, 0.1, 0.1, 0.7])
            .unwrap();
        let s = b.sparse_softmax_cross_entropy_with_logits(x, labels).unwrap();
        let d = b.softmax_cross_entropy_with_logits(x, onehot).unwrap();
        (vec![x], vec![s, d])
    });
}

#[test]
fn reductions_all_axes_and_keep_dims() {
    // ReduceSum: broadcast dy back; ReduceMean: and divide by the count.
    case(|b| {
        let x = var(b, "x", &[2, 3, 4]);
        let a = b.reduce_sum(x, &[1], false).unwrap();
        let m = b.reduce_mean(x, &[0, 2], true).unwrap();
        let m2 = b.reduce_mean(x, &[2], false).unwrap();
        let all = b.reduce_mean_all(x).unwrap();
        (vec![x], vec![a, m, m2, all])
    });
}

#[test]
fn identity_and_dropout() {
    // Dropout y = x*mask: dx = dy*mask (the interpreter's mask is deterministic).
    case(|b| {
        let x = var(b, "x", &[4, 5]);
        let i = b.identity(x, "id").unwrap();
        let d = b.dropout_with_seed(i, 0.4, 9).unwrap();
        (vec![x], vec![d])
    });
}

#[test]
fn batch_norm_x_gamma_beta() {
    for shape in [vec![6, 3], vec![2, 3, 2, 3]] {
        case(|b| {
            let x = var(b, "x", &shape);
            let gamma = var(b, "gamma", &[3]);
            let beta = var(b, "beta", &[3]);
            let mm = var(b, "mm", &[3]);
            let mv = var(b, "mv", &[3]);
            let bn = b.op("bn", Op::BatchNorm { epsilon: F32(1e-3) }, &[x, gamma, beta, mm, mv]).unwrap();
            (vec![x, gamma, beta], vec![Tensor::new(bn, 0)])
        });
    }
}

#[test]
fn unknown_batch_reduce_mean_and_reshape_after_reinfer() {
    // Built with a None batch: the mean's count must come from the bound shape.
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(2), Some(3)])).unwrap();
    let w = var(&mut b, "w", &[6, 2]);
    let f = b.flatten(x).unwrap();
    let h = b.matmul(f, w).unwrap();
    let r = b.reshape(h, &[-1, 1, 2]).unwrap();
    let t = b.tanh(r).unwrap();
    let per = b.reduce_sum(t, &[1, 2], false).unwrap();
    let per = b.mul(per, per).unwrap();
    let loss = b.reduce_mean(per, &[0], false).unwrap();
    let mut g = b.finish();
    let res = crate::autodiff::gradients(&mut g, loss, &[w.node]).unwrap();
    assert!(res.unreachable.is_empty());
    // Bind the batch to 4 and re-run inference; then check numerically.
    g.node_mut(x.node).op = Op::Placeholder { dtype: DType::F32, shape: Shape::known(&[4, 2, 3]) };
    g.reinfer().unwrap();
    let mut feeds = BTreeMap::new();
    feeds.insert("x".to_string(), V::new(&[4, 2, 3], super::rand_vec(24, 99)));
    check_grads(&mut g, loss, &[w.node], &feeds);
}

/// The batch-norm layer in its four `center`/`scale` variants: a missing
/// gamma is a constant of ones, a missing beta one of zeros, and the
/// gradients of `x` and of the variables that exist stay exact
/// (`y = gamma * (x - mean) * inv_std + beta`, with gamma = 1 or beta = 0
/// fixed: the rule's dgamma/dbeta outputs are just not used).
#[test]
fn batch_norm_layer_center_scale_variants() {
    use towers_graph::layers::{batch_norm_with, BatchNormOptions};
    for (center, scale) in [(true, true), (true, false), (false, true), (false, false)] {
        for shape in [vec![6, 3], vec![2, 3, 2, 3]] {
            case(|b| {
                let x = var(b, "x", &shape);
                let opts = BatchNormOptions::new().name("bn").center(center).scale(scale);
                let y = batch_norm_with(b, x, &opts).unwrap();
                let mut vars = vec![x];
                for (on, name) in [(scale, "bn/gamma"), (center, "bn/beta")] {
                    assert_eq!(b.graph().get(name).is_some(), on, "{name} with center {center} scale {scale}");
                    if let Some(id) = b.graph().get(name) {
                        vars.push(Tensor::new(id, 0));
                    }
                }
                (vars, vec![y])
            });
        }
    }
}
