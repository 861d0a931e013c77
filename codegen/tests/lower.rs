//! Lowering hand-built, hand-scheduled graphs: the text form (snapshot),
//! determinism, and the errors that name the node.

use towers_codegen::{lower, CodegenError, LowerOptions, Mode, Step};
use towers_graph::{
    DType, Device, Graph, GraphBuilder, Initializer, Op, Optimizer, Program, Schedule, ScheduleItem, ScheduledStream,
    Shape, StreamKind, TensorRef, UnaryOp, F32,
};

/// Place every node on cpu:0 and schedule all of them, in topological
/// order, on one compute stream (in the graph's program record).
fn one_stream(g: &mut Graph) {
    let order = g.topo_order().unwrap();
    for &id in &order {
        g.node_mut(id).device = Some(Device::CPU0);
    }
    let items = order.iter().map(|&id| ScheduleItem::Run(g.node(id).name.clone())).collect();
    g.program_mut().schedule = Some(Schedule {
        streams: vec![ScheduledStream { device: Device::CPU0, kind: StreamKind::Compute, items }],
        num_events: 0,
    });
}

/// x[4,3] · w[3,2] + b, relu, sparse softmax cross-entropy, mean; one SGD step.
fn mlp() -> Graph {
    let mut b = GraphBuilder::with_seed(7);
    let x = b.placeholder("x", DType::F32, [4, 3]).unwrap();
    let y = b.placeholder("labels", DType::I32, [4]).unwrap();
    let w = b.get_variable("fc/weights", [3, 2], Initializer::GlorotUniform).unwrap();
    let bias = b.get_variable("fc/biases", [2], Initializer::Zeros).unwrap();
    let h = b.matmul(x, w).unwrap();
    let h = b.bias_add(h, bias).unwrap();
    let h = b.relu(h).unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(h, y).unwrap();
    let loss = b.reduce_mean_all(xent).unwrap();
    let step = b
        .op1(
            "global_step",
            Op::Variable { dtype: DType::I32, shape: vec![], init: Initializer::Zeros, trainable: false },
            &[],
        )
        .unwrap();
    // A real gradient buffer: an Identity would alias the variable, and an update
    // that reads the variable it writes is rejected by the verifier.
    let g_w = b.op1("grad_w", Op::Unary(UnaryOp::Neg), &[w]).unwrap();
    let lr = b
        .op1(
            "learning_rate",
            Op::Variable { dtype: DType::F32, shape: vec![], init: Initializer::Constant(F32(0.5)), trainable: false },
            &[],
        )
        .unwrap();
    b.op1("apply_w", Op::ApplyGradient { optimizer: Optimizer::Sgd { lr: F32(0.5) } }, &[w, g_w, step, lr]).unwrap();
    b.op1("inc", Op::IncrementStep, &[step]).unwrap();
    let mut g = b.finish();
    one_stream(&mut g);
    let loss = TensorRef::of(&g, loss);
    g.program_mut().fetches.insert("loss".into(), loss);
    g
}

fn opts(mode: Mode) -> LowerOptions {
    LowerOptions::new(mode, "train")
}

#[test]
fn mlp_plan_text() {
    let g = mlp();
    let plan = lower(&g, &opts(Mode::Train)).unwrap();
    insta::assert_snapshot!(plan.to_text());
}

#[test]
fn lowering_is_deterministic() {
    let g = mlp();
    let a = lower(&g, &opts(Mode::Train)).unwrap();
    let b = lower(&g, &opts(Mode::Train)).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.to_text(), b.to_text());
    assert_eq!(a.to_json(), b.to_json());
}

#[test]
fn conv_gets_a_workspace_and_eval_dropout_is_a_copy() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [2, 5, 5, 3]).unwrap();
    let f = b.get_variable("conv/filter", [3, 3, 3, 4], Initializer::GlorotUniform).unwrap();
    let y = b.conv2d(x, f, [1, 1], towers_graph::Padding::Same).unwrap();
    let y = b.dropout_with_seed(y, 0.5, 3).unwrap();
    let _ = b.reshape(y, &[2, -1]).unwrap();
    let mut g = b.finish();
    one_stream(&mut g);
    let plan = lower(&g, &opts(Mode::Eval)).unwrap();
    let text = plan.to_text();
    assert!(text.contains("/workspace f32["), "{text}");
    let steps = &plan.streams[0].steps;
    assert!(steps.iter().any(|s| matches!(s, Step::Copy { .. })), "{text}");
    assert!(!text.contains("dropout keep_prob"), "{text}");
    let train = lower(&g, &opts(Mode::Train)).unwrap().to_text();
    assert!(train.contains("dropout keep_prob=0.5"), "{train}");
    // The reshape aliases its input: no buffer of its own.
    assert!(!text.contains("Reshape f32"), "{text}");
}

#[test]
fn errors_name_the_node() {
    let mut g = mlp();
    let id =
        g.get("MatMul").or_else(|| g.node_ids().into_iter().find(|&i| g.node(i).op.type_name() == "MatMul")).unwrap();
    let name = g.node(id).name.clone();
    g.node_mut(id).device = None;
    let e = lower(&g, &opts(Mode::Train)).unwrap_err();
    assert!(matches!(&e, CodegenError::Unplaced { node } if *node == name), "{e}");

    let mut g = mlp();
    if let Some(s) = g.program_mut().schedule.as_mut() {
        s.streams[0].items.retain(|i| *i != ScheduleItem::Run(name.clone()));
    }
    let e = lower(&g, &opts(Mode::Train)).unwrap_err().to_string();
    assert!(e.contains(&name) && e.contains("missing from the schedule"), "{e}");

    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(3)])).unwrap();
    b.relu(x).unwrap();
    let mut g = b.finish();
    one_stream(&mut g);
    let e = lower(&g, &opts(Mode::Train)).unwrap_err().to_string();
    assert!(e.contains("'x'") && e.contains("batch not bound"), "{e}");

    g.set_program(Program::default());
    let e = lower(&g, &opts(Mode::Train)).unwrap_err();
    assert_eq!(e, CodegenError::NoSchedule);
}
