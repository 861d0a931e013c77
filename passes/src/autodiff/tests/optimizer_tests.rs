//! Tests of `apply_gradients`: TF names of slots and applies, the single step
//! increment, control edges, and one and two numeric steps against TF's
//! formulas written out by hand.

use std::collections::BTreeMap;

use towers_graph::{keys, GraphBuilder, Op, Optimizer, Tensor, F32};

use crate::autodiff::tests::interp::{self, V};
use crate::autodiff::tests::{var, weighted_loss};
use crate::optimizer::apply_gradients;
use crate::state::PassError;

fn adam() -> Optimizer {
    Optimizer::Adam { lr: F32(0.1), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) }
}

/// TF1's RMSPropOptimizer defaults but a momentum, so both slots matter.
fn rmsprop() -> Optimizer {
    Optimizer::RmsProp { lr: F32(0.1), decay: F32(0.9), momentum: F32(0.5), epsilon: F32(1e-10) }
}

fn adagrad() -> Optimizer {
    Optimizer::Adagrad { lr: F32(0.1), initial_accumulator_value: F32(0.1) }
}

/// TF1's slot initial values: RMSProp's ms ones (rmsprop.py `_create_slots`:
/// `init_ops.ones_initializer`), its momentum zeros; Adagrad's accumulator
/// `initial_accumulator_value` (adagrad.py: `constant_initializer`).
#[test]
fn slots_start_as_tf1_creates_them() {
    use towers_graph::Initializer;
    for (opt, want) in [
        (rmsprop(), vec![("fc1/weights/RMSProp", Initializer::Ones), ("fc1/weights/RMSProp_1", Initializer::Zeros)]),
        (adagrad(), vec![("fc1/weights/Adagrad", Initializer::Constant(F32(0.1)))]),
        (adam(), vec![("fc1/weights/Adam", Initializer::Zeros), ("fc1/weights/Adam_1", Initializer::Zeros)]),
    ] {
        let (g, _, _) = model(&opt);
        for (name, init) in want {
            let Op::Variable { init: got, .. } = &g.node(g.find(name).unwrap()).op else { panic!("{name}") };
            assert_eq!(got, &init, "{name}");
        }
    }
}

/// A model with variables fc1/weights [2,3] and fc1/biases [3]; loss = l2_loss(w) + Σ b*W.
fn model(opt: &Optimizer) -> (towers_graph::Graph, crate::optimizer::ApplyResult, Vec<(String, Tensor)>) {
    let mut b = GraphBuilder::new();
    let (w, bias) = b
        .variable_scope("fc1", towers_graph::Reuse::No, |b| {
            Ok::<_, towers_graph::GraphError>((var(b, "weights", &[2, 3]), var(b, "biases", &[3])))
        })
        .unwrap();
    let l2 = b.l2_loss(w).unwrap();
    let lb = weighted_loss(&mut b, &[bias]);
    let loss = b.add(l2, lb).unwrap();
    let mut g = b.finish();
    let grads = crate::autodiff::gradients(&mut g, loss, &[w.node, bias.node]).unwrap().grads;
    let res = apply_gradients(&mut g, &grads, opt).unwrap();
    (g, res, grads)
}

#[test]
fn names_of_slots_and_applies() {
    let cases: [(Optimizer, &[&str], &str); 5] = [
        (Optimizer::Sgd { lr: F32(0.1) }, &[], "GradientDescent/update_fc1/weights/ApplyGradientDescent"),
        (
            Optimizer::Momentum { lr: F32(0.1), momentum: F32(0.9), nesterov: true },
            &["fc1/weights/Momentum", "fc1/biases/Momentum"],
            "Momentum/update_fc1/weights/ApplyMomentum",
        ),
        (
            adam(),
            &["fc1/weights/Adam", "fc1/weights/Adam_1", "fc1/biases/Adam", "fc1/biases/Adam_1"],
            "Adam/update_fc1/weights/ApplyAdam",
        ),
        (
            rmsprop(),
            &["fc1/weights/RMSProp", "fc1/weights/RMSProp_1", "fc1/biases/RMSProp", "fc1/biases/RMSProp_1"],
            "RMSProp/update_fc1/weights/ApplyRMSProp",
        ),
        (adagrad(), &["fc1/weights/Adagrad", "fc1/biases/Adagrad"], "Adagrad/update_fc1/weights/ApplyAdagrad"),
    ];
    for (opt, slots, apply) in cases {
        let (g, res, _) = model(&opt);
        assert_eq!(res.slots, slots.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(g.node(res.applies[0]).name, apply);
        for s in slots {
            let id = g.find(s).unwrap();
            assert!(matches!(g.node(id).op, Op::Variable { trainable: false, .. }));
            assert!(g.collection(keys::GLOBAL_VARIABLES).iter().any(|n| n == s));
            assert!(!g.collection(keys::TRAINABLE_VARIABLES).iter().any(|n| n == s));
        }
        assert_eq!(g.node(res.global_step).name, "global_step");
        assert_eq!(g.node(res.train_op).name, "train_op");
        assert_eq!(g.collection(keys::TRAIN_OP), ["train_op".to_string()]);
    }
}

#[test]
fn one_increment_after_every_apply_and_train_op_deps() {
    let (g, res, _) = model(&adam());
    let incs: Vec<_> = g.node_ids().into_iter().filter(|&n| matches!(g.node(n).op, Op::IncrementStep)).collect();
    assert_eq!(incs.len(), 1);
    assert_eq!(g.node(incs[0]).name, "Adam/IncrementStep");
    assert_eq!(g.control_inputs(incs[0]), res.applies);
    let deps = g.control_inputs(res.train_op);
    for a in res.applies.iter().chain(&incs) {
        assert!(deps.contains(a));
    }
    // Inputs: variable, slots, grad, global_step, learning_rate.
    let ins = g.inputs(res.applies[0]);
    assert_eq!(ins.len(), 6);
    assert_eq!(g.node(ins[1].node).name, "fc1/weights/Adam");
    assert_eq!(ins[4].node, res.global_step);
    assert_eq!(g.node(ins[5].node).name, "learning_rate");
}

#[test]
fn update_ops_run_with_the_step_and_global_step_is_reused() {
    let mut b = GraphBuilder::new();
    let x = var(&mut b, "x", &[4, 2]);
    let y = towers_graph::layers::batch_norm(&mut b, "bn", x, 0.9, 1e-3).unwrap();
    let loss = weighted_loss(&mut b, &[y]);
    let mut g = b.finish();
    let grads = crate::autodiff::gradients(&mut g, loss, &[x.node]).unwrap().grads;
    let first = apply_gradients(&mut g, &grads, &Optimizer::Sgd { lr: F32(0.1) }).unwrap();
    let deps = g.control_inputs(first.train_op);
    for u in g.collection(keys::UPDATE_OPS) {
        assert!(deps.contains(&g.find(u).unwrap()));
    }
    let grads2: Vec<_> = grads.iter().map(|(v, t)| (v.clone(), *t)).collect();
    let _ = grads2;
    assert!(matches!(apply_gradients(&mut g, &[], &adam()), Err(PassError::NoVariables)));
}

/// Run `steps` training steps of the graph; returns the variable map.
fn train(opt: &Optimizer, steps: usize) -> (BTreeMap<String, V>, BTreeMap<String, V>) {
    let (g, _, _) = model(opt);
    let init = BTreeMap::from([
        ("fc1/weights".to_string(), V::new(&[2, 3], crate::autodiff::tests::rand_vec(6, 1))),
        ("fc1/biases".to_string(), V::new(&[3], crate::autodiff::tests::rand_vec(3, 2))),
    ]);
    let mut vars = init.clone();
    for _ in 0..steps {
        interp::run(&g, &mut vars, &BTreeMap::new());
    }
    (init, vars)
}

#[test]
fn one_and_two_steps_match_tf_formulas() {
    // The gradients: d l2_loss(w)/dw = w; d Σ b*W / db = W (the fixed weights).
    let wb: Vec<f64> = crate::autodiff::tests::rand_vec(3, 1000).into_iter().map(|v| v as f32 as f64).collect();
    let opts = [
        Optimizer::Sgd { lr: F32(0.1) },
        Optimizer::Momentum { lr: F32(0.1), momentum: F32(0.9), nesterov: false },
        Optimizer::Momentum { lr: F32(0.1), momentum: F32(0.9), nesterov: true },
        adam(),
        rmsprop(),
        adagrad(),
    ];
    for opt in &opts {
        for steps in [1, 2] {
            let (init, got) = train(opt, steps);
            for (name, grad_of) in [("fc1/weights", None), ("fc1/biases", Some(&wb))] {
                let mut w = init[name].data.clone();
                // The slots as TF1 starts them: RMSProp's ms at 1, Adagrad's accumulator at 0.1.
                let m0 = match opt {
                    Optimizer::RmsProp { .. } => 1.0,
                    Optimizer::Adagrad { .. } => 0.1f32 as f64,
                    _ => 0.0,
                };
                let (mut m, mut v) = (vec![m0; w.len()], vec![0.0; w.len()]);
                for t in 1..=steps {
                    for k in 0..w.len() {
                        let g = grad_of.map(|wb| wb[k]).unwrap_or(w[k]);
                        match opt {
                            // SGD: w -= lr*g
                            Optimizer::Sgd { .. } => w[k] -= 0.1 * g,
                            // Momentum: a = μa + g; w -= lr*a  (Nesterov: w -= lr*(g + μa))
                            Optimizer::Momentum { nesterov, .. } => {
                                m[k] = 0.9 * m[k] + g;
                                w[k] -= 0.1 * if *nesterov { g + 0.9 * m[k] } else { m[k] };
                            }
                            // Adam: lr_t = lr*sqrt(1-β2^t)/(1-β1^t); m = β1m+(1-β1)g;
                            // v = β2v+(1-β2)g²; w -= lr_t*m/(sqrt(v)+ε)
                            Optimizer::Adam { .. } => {
                                let (b1, b2) = (0.9f32 as f64, 0.999f32 as f64);
                                let lr_t =
                                    (0.1f32 as f64) * (1.0 - b2.powi(t as i32)).sqrt() / (1.0 - b1.powi(t as i32));
                                m[k] = b1 * m[k] + (1.0 - b1) * g;
                                v[k] = b2 * v[k] + (1.0 - b2) * g * g;
                                w[k] -= lr_t * m[k] / (v[k].sqrt() + 1e-8f32 as f64);
                            }
                            // RMSProp: ms = ρms + (1-ρ)g²; mom = μmom + lr*g/sqrt(ms + ε); w -= mom
                            Optimizer::RmsProp { .. } => {
                                let rho = 0.9f32 as f64;
                                m[k] = rho * m[k] + (1.0 - rho) * g * g;
                                v[k] = 0.5 * v[k] + 0.1f32 as f64 * g / (m[k] + 1e-10f32 as f64).sqrt();
                                w[k] -= v[k];
                            }
                            // Adagrad: accum += g²; w -= lr*g/sqrt(accum)
                            Optimizer::Adagrad { .. } => {
                                m[k] += g * g;
                                w[k] -= 0.1f32 as f64 * g / m[k].sqrt();
                            }
                        }
                    }
                }
                for (k, (g, want)) in got[name].data.iter().zip(w.iter()).enumerate() {
                    let lr_err = (g - want).abs();
                    assert!(lr_err < 1e-6, "{opt:?} step {steps} {name}[{k}]: {g} vs {want}");
                }
            }
            assert_eq!(got["global_step"].data, vec![steps as f64]);
        }
    }
}
