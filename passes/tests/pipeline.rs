//! The pipeline written once: its pass lists, prefixes of them, and the
//! dumps it writes (the text dump carries the program record, schedule
//! included).

use towers_graph::layers::{dense, Activation};
use towers_graph::{keys, DType, Device, Graph, GraphBuilder, Initializer, Optimizer, F32};
use towers_passes::{pipeline, CompileOptions, PassError, Pipeline};

/// x [?, 8] -> fc1 (16, relu) -> fc2 (4) -> sparse xent -> mean, plus a
/// variable `unused` the loss never reads. Returns the graph and the loss name.
fn model() -> (Graph, String) {
    let mut b = GraphBuilder::with_seed(3);
    let x = b.placeholder("x", DType::F32, [None, Some(8)]).unwrap();
    let y = b.placeholder("labels", DType::I32, [None]).unwrap();
    let h = dense(&mut b, "fc1", x, 16, Activation::Relu).unwrap();
    let logits = dense(&mut b, "fc2", h, 4, Activation::None).unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
    let loss = b.reduce_mean_all(xent).unwrap();
    b.get_variable("unused", [3], Initializer::Zeros).unwrap();
    let g = b.finish();
    let loss = g.node(loss.node).name.clone();
    (g, loss)
}

fn opts(towers: u32) -> CompileOptions {
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
    o.towers = (0..towers).map(Device::gpu).collect();
    o
}

#[test]
fn the_pass_lists() {
    let (_, loss) = model();
    let names = |p: Pipeline| p.names().join(" ");
    assert_eq!(
        names(Pipeline::train(&loss, &opts(0))),
        "prune open_batch autodiff bind_batch simplify apply place schedule"
    );
    // The fold is opt-in (`fold_tower_matmuls`, off by default).
    assert_eq!(
        names(Pipeline::train(&loss, &opts(2))),
        "prune open_batch autodiff bind_batch replicate split grad_mean simplify tower_cse apply place schedule"
    );
    let mut folded = opts(2);
    folded.fold_tower_matmuls = true;
    assert_eq!(
        names(Pipeline::train(&loss, &folded)),
        "prune open_batch autodiff bind_batch replicate split grad_mean simplify tower_cse tower_matmul apply place schedule"
    );
    let mut unfolded = opts(2);
    unfolded.merge_tower_duplicates = false;
    assert_eq!(
        names(Pipeline::train(&loss, &unfolded)),
        "prune open_batch autodiff bind_batch replicate split grad_mean simplify apply place schedule"
    );
    assert_eq!(names(Pipeline::eval(&[("p", &loss)], 4)), "prune bind_batch simplify place schedule");
    let front = Pipeline::train(&loss, &opts(2)).before("simplify").unwrap();
    assert_eq!(names(front), "prune open_batch autodiff bind_batch replicate split grad_mean");
}

#[test]
fn a_prefix_naming_no_pass_is_an_error() {
    let (_, loss) = model();
    let e = Pipeline::train(&loss, &opts(0)).before("replicate").err().unwrap();
    assert!(matches!(e, PassError::Options(_)), "{e}");
    assert!(e.to_string().contains("no pass 'replicate'"), "{e}");
}

/// Prune runs first and the unused variable goes: from the graph, from the
/// collections and from the variables to train; the program record names
/// the loss fetch and the train op, and holds the schedule.
#[test]
fn train_prunes_first_and_fills_the_program_record() {
    let (g, loss) = model();
    let out = pipeline::train(&g, &loss, &opts(2)).unwrap();
    assert_eq!(out.timings[0].pass, "prune");
    assert!(out.graph.get("unused").is_none());
    assert!(!out.state.var_list.iter().any(|v| v == "unused"));
    assert!(!out.graph.collection(keys::GLOBAL_VARIABLES).iter().any(|v| v == "unused"));
    let p = out.graph.program();
    assert_eq!(p.fetches["loss"].node, "loss/tower_mean");
    assert_eq!(p.train_op.as_deref(), Some("train_op"));
    assert!(p.schedule.as_ref().is_some_and(|s| s.num_events > 0));
}

#[test]
fn eval_fetches_what_it_is_asked_for_and_nothing_else() {
    let (g, loss) = model();
    let out = pipeline::eval(&g, &[("loss", &loss)], 4).unwrap();
    let p = out.graph.program();
    assert_eq!(p.fetches.keys().collect::<Vec<_>>(), ["loss"]);
    assert!(p.train_op.is_none() && p.schedule.is_some());
    assert!(out.graph.collection(keys::UPDATE_OPS).is_empty());
    let e = pipeline::eval(&g, &[("p", "no_such_node")], 4).unwrap_err().to_string();
    assert!(e.contains("'no_such_node'"), "{e}");
}

/// `--dump-after schedule` shows the schedule: every stream, its runs,
/// records and waits, after the nodes.
#[test]
fn a_dump_after_schedule_shows_the_streams_and_events() {
    let (g, loss) = model();
    let dir = tempfile::tempdir().unwrap();
    let out = Pipeline::train(&loss, &opts(2)).dump(dir.path(), &["schedule".to_string()]).run(&g).unwrap();
    let n = out.timings.len() - 1;
    let text = std::fs::read_to_string(dir.path().join(format!("{n:02}-schedule.txt"))).unwrap();
    let s = out.graph.program().schedule.as_ref().unwrap();
    assert!(text.contains(&format!("schedule: {} streams, {} events\n", s.streams.len(), s.num_events)), "{text}");
    for st in &s.streams {
        assert!(text.contains(&format!("\nstream {}\n", st.name())), "{text}");
    }
    for line in ["fetch loss = loss/tower_mean:0\n", "train_op = train_op\n", "  record e0\n", "  wait e0\n"] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
    assert!(text.contains("  run tower_1/fc1/MatMul\n"), "{text}");
    assert!(dir.path().join(format!("{n:02}-schedule.dot")).exists());
    // Only the pass asked for is dumped.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}
