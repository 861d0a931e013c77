//! End-to-end runs of lowered plans on the CPU backend.

mod common;

use towers_runtime::{RuntimeError, Session};

fn setup() -> Session {
    let mut s = Session::new(42);
    s.load("train", common::mlp_plan()).unwrap();
    s.write_variable("fc/weights", &[1.0, 0.0, 0.0, -1.0]).unwrap();
    s.write_variable("fc/biases", &[0.5, 0.5]).unwrap();
    s.feed("train", "x", &[1.0, 2.0, 3.0, 4.0]).unwrap();
    s.feed("train", "labels", &[0, 1]).unwrap();
    s.feed("train", "g", &[1.0, 2.0, 3.0, 4.0]).unwrap();
    s
}

#[test]
fn mlp_matches_hand_computed_values() {
    let mut s = setup();
    s.run("train").unwrap();
    // x·w = [[1,-2],[3,-4]]; + b = [[1.5,-1.5],[3.5,-3.5]]; relu = [[1.5,0],[3.5,0]].
    assert_eq!(s.fetch::<f32>("train", "Relu").unwrap(), &[1.5, 0.0, 3.5, 0.0]);
    // xent row 0 (label 0): ln(e^1.5 + e^0) - 1.5 = ln(1 + e^-1.5);
    // row 1 (label 1): ln(e^3.5 + 1) - 0.
    let l0 = (1.0f64 + (-1.5f64).exp()).ln();
    let l1 = (3.5f64.exp() + 1.0).ln();
    let loss = s.fetch::<f32>("train", "loss").unwrap()[0] as f64;
    assert!((loss - (l0 + l1) / 2.0).abs() < 1e-5, "loss {loss}");
    // SGD: w -= 0.5 * g.
    assert_eq!(s.variable::<f32>("fc/weights").unwrap(), &[0.5, -1.0, -1.5, -3.0]);
    assert_eq!(s.variable::<i32>("global_step").unwrap(), &[1]);
    s.run("train").unwrap();
    assert_eq!(s.variable::<i32>("global_step").unwrap(), &[2]);
}

/// `MatMul`'s bytes are taken by a later tensor of the step (memory reuse):
/// reading it after the step is refused, naming the way out; lowered
/// without reuse, it reads back.
#[test]
fn a_tensor_whose_bytes_are_reused_is_not_fetchable_after_the_step() {
    let mut s = setup();
    s.run("train").unwrap();
    let plan = s.plan("train").unwrap();
    assert!(plan.shares_bytes(plan.lookup("MatMul").unwrap()));
    assert!(!plan.shares_bytes(plan.lookup("Relu").unwrap()), "fetched as 'relu': its bytes are its own");
    let e = s.fetch::<f32>("train", "MatMul").unwrap_err();
    assert!(matches!(&e, RuntimeError::TensorReused { tensor, .. } if tensor == "MatMul"), "{e}");
    assert_eq!(
        e.to_string(),
        "tensor 'MatMul' of program 'train' cannot be read after a step: its arena bytes are reused by later steps \
         (memory planning by liveness); fetch it through the program's fetches (CompileOptions::fetches), or compile \
         with memory reuse off (CompileOptions::reuse_memory = false; CLI: --no-memory-reuse)"
    );
    let mut plain = Session::new(42);
    plain.load("train", common::mlp_plan_without_reuse()).unwrap();
    plain.write_variable("fc/weights", &[1.0, 0.0, 0.0, -1.0]).unwrap();
    plain.feed("train", "x", &[1.0, 2.0, 3.0, 4.0]).unwrap();
    plain.feed("train", "labels", &[0, 1]).unwrap();
    plain.feed("train", "g", &[1.0, 2.0, 3.0, 4.0]).unwrap();
    plain.run("train").unwrap();
    // x·w = [[1,-2],[3,-4]].
    assert_eq!(plain.fetch::<f32>("train", "MatMul").unwrap(), &[1.0, -2.0, 3.0, -4.0]);
}

#[test]
fn initializers_depend_on_seed_and_name_only() {
    let mut a = Session::new(9);
    a.load("train", common::mlp_plan()).unwrap();
    let mut b = Session::new(9);
    b.load("train", common::mlp_plan()).unwrap();
    assert_eq!(a.variable::<f32>("fc/weights").unwrap(), b.variable::<f32>("fc/weights").unwrap());
    assert_eq!(a.variable::<f32>("fc/biases").unwrap(), &[0.0, 0.0]);
    // A second program shares the variables by name.
    a.write_variable("fc/biases", &[1.0, 2.0]).unwrap();
    a.load("again", common::mlp_plan()).unwrap();
    assert_eq!(a.variable::<f32>("fc/biases").unwrap(), &[1.0, 2.0]);
    assert_eq!(a.variable_names(), vec!["fc/biases", "fc/weights", "global_step", "learning_rate"]);
}

#[test]
fn two_streams_on_two_threads_with_an_event() {
    let mut s = Session::new(0);
    let plan = common::two_device_plan();
    assert!(plan.to_text().contains("wait e0"));
    s.load("two", plan).unwrap();
    for k in 0..50 {
        let x: Vec<f32> = (0..6).map(|i| (i as f32 - 2.5) * (k as f32 + 1.0)).collect();
        s.feed("two", "x", &x).unwrap();
        s.run("two").unwrap();
        let want: Vec<f32> = x.iter().map(|v| -v.max(0.0)).collect();
        assert_eq!(s.fetch::<f32>("two", "out").unwrap(), want.as_slice());
    }
    assert!(s.backend_note().starts_with("gpu:0 runs as a CPU device"), "{}", s.backend_note());
}

/// A traced step of the two-device plan: cpu:0/compute runs relu;
/// gpu:0/compute waits for it, copies (elided on the CPU backend: a
/// zero-length item) and negates. Each stream's items come in step order,
/// one after another, inside the step.
#[test]
fn a_traced_step_has_every_item_of_every_stream_in_order() {
    let mut s = Session::new(0);
    s.load("two", common::two_device_plan()).unwrap();
    s.feed("two", "x", &[1.0; 6]).unwrap();
    let e = s.trace("two").unwrap_err();
    assert!(e.to_string().contains("no step has run with tracing on"), "{e}");
    s.set_tracing("two", true).unwrap();
    s.run("two").unwrap();
    s.set_tracing("two", false).unwrap();
    s.run("two").unwrap();
    let t = s.trace("two").unwrap();
    assert_eq!(t.step, 0, "the last traced step, not the last step");
    let items: Vec<(usize, usize, &str, &str)> =
        t.events.iter().map(|e| (e.stream, e.index, e.kind, e.node.as_str())).collect();
    assert_eq!(
        items,
        [(0, 0, "unary", "Relu"), (1, 0, "wait", "event 0"), (1, 1, "copy", "relu_gpu0"), (1, 2, "unary", "Neg")]
    );
    for w in t.events.windows(2).filter(|w| w[0].stream == w[1].stream) {
        assert!(w[0].start_ns + w[0].dur_ns <= w[1].start_ns, "{t:?}");
    }
    for e in &t.events {
        assert!(e.start_ns + e.dur_ns <= t.dur_ns, "{t:?}");
    }
}

#[test]
fn feed_and_fetch_errors_name_things() {
    let mut s = setup();
    let e = s.feed("train", "x", &[1.0]).unwrap_err();
    assert!(matches!(e, RuntimeError::FeedLength { expected: 4, got: 1, .. }), "{e}");
    assert!(e.to_string().contains("feed 'x'"), "{e}");
    let e = s.feed("train", "nope", &[1.0]).unwrap_err().to_string();
    assert!(e.contains("'nope'") && e.contains("labels"), "{e}");
    let e = s.feed("train", "labels", &[1.0, 2.0]).unwrap_err().to_string();
    assert!(e.contains("i32"), "{e}");
    let e = s.run("eval").unwrap_err().to_string();
    assert!(e.contains("'eval'") && e.contains("train"), "{e}");
    let e = s.fetch::<f32>("train", "nothing").unwrap_err().to_string();
    assert!(e.contains("'nothing'") && e.contains("loss"), "{e}");
    s.feed("train", "labels", &[0, 7]).unwrap();
    let e = s.run("train").unwrap_err().to_string();
    assert!(e.contains("SparseSoftmaxCrossEntropyWithLogits") && e.contains("label 7"), "{e}");
    let e = s.write_variable("fc/biases", &[1.0]).unwrap_err().to_string();
    assert!(e.contains("fc/biases"), "{e}");
}

#[test]
fn cuda_probe_never_panics() {
    let st = towers_runtime::probe();
    assert!(!st.to_string().is_empty());
}

#[test]
fn reads_into_caller_slices_check_lengths_and_dtypes() {
    let mut s = setup();
    s.run("train").unwrap();
    let mut relu = [0f32; 4];
    s.fetch_into("train", "Relu", &mut relu).unwrap();
    assert_eq!(relu, [1.5, 0.0, 3.5, 0.0]);
    let e = s.fetch_into("train", "Relu", &mut [0.0; 3]).unwrap_err();
    assert!(matches!(e, RuntimeError::FetchLength { expected: 4, got: 3, .. }), "{e}");
    let e = s.fetch_into("train", "Relu", &mut [0; 4]).unwrap_err();
    assert!(matches!(e, RuntimeError::WrongDtype { .. }), "{e}");
    let mut w = [0f32; 4];
    s.read_variable_into("fc/weights", &mut w).unwrap();
    assert_eq!(w, [0.5, -1.0, -1.5, -3.0]);
    let mut step = [0i32];
    s.variable_into("global_step", &mut step).unwrap();
    assert_eq!(step, [1]);
    let e = s.read_variable_into("fc/weights", &mut [0.0; 5]).unwrap_err();
    assert!(matches!(e, RuntimeError::VariableLength { expected: 4, got: 5, .. }), "{e}");
    let e = s.variable::<f32>("global_step").unwrap_err();
    assert!(matches!(e, RuntimeError::VariableDtype { .. }), "{e}");
}

/// Feeds and fetches take their dtype from the element type: the other
/// type is `WrongDtype`, naming the tensor and both dtypes, and nothing is
/// written.
#[test]
fn the_element_type_picks_the_dtype_of_feeds_and_fetches() {
    let mut s = setup();
    let wrong = |e: RuntimeError, tensor: &str, act: &str, req: &str| {
        assert!(
            matches!(&e, RuntimeError::WrongDtype { name, actual, requested, .. }
                if name == tensor && actual == act && requested == req),
            "{e}"
        );
    };
    wrong(s.feed("train", "x", &[9i32; 4]).unwrap_err(), "x", "f32", "i32");
    wrong(s.feed("train", "labels", &[9.0f32, 9.0]).unwrap_err(), "labels", "i32", "f32");
    s.run("train").unwrap();
    wrong(s.fetch::<i32>("train", "loss").unwrap_err(), "loss", "f32", "i32");
    wrong(s.fetch_into("train", "Relu", &mut [0i32; 4]).unwrap_err(), "Relu", "f32", "i32");
    // The refused feeds left x and labels as `setup` fed them.
    assert_eq!(s.fetch::<f32>("train", "Relu").unwrap(), &[1.5, 0.0, 3.5, 0.0]);
}

#[test]
fn a_session_takes_its_backend() {
    let mut s = Session::with_backend(42, Box::new(towers_runtime::CpuBackend::new()));
    assert_eq!(s.backend_name(), "cpu");
    s.load("train", common::mlp_plan()).unwrap();
    let mut t = Session::new(42);
    t.load("train", common::mlp_plan()).unwrap();
    assert_eq!(s.variable::<f32>("fc/weights").unwrap(), t.variable::<f32>("fc/weights").unwrap());
}

/// The feeds of step `k` of the MLP plan (x, labels, g): different every step.
fn step_feeds(k: usize) -> ([f32; 4], [i32; 2], [f32; 4]) {
    let k = k as f32;
    ([1.0 + k, -2.0 * k, 0.5 - k, 4.0], [(k as i32) % 2, 1 - (k as i32) % 2], [0.1 * k, -0.2, 0.3 + 0.01 * k, -0.4 * k])
}

/// Eight steps of the MLP plan, fed by copy or in place; the losses, relu
/// and every variable after each step, as bits.
fn train_mlp(mut s: Session, in_place: bool) -> Vec<Vec<u32>> {
    s.load("train", common::mlp_plan()).unwrap();
    let mut seen = Vec::new();
    for k in 0..8 {
        let (x, y, g) = step_feeds(k);
        if in_place {
            s.feed_with("train", "x", |b| b.copy_from_slice(&x)).unwrap();
            s.feed_with("train", "labels", |b| b.copy_from_slice(&y)).unwrap();
            s.feed_with("train", "g", |b| b.copy_from_slice(&g)).unwrap();
        } else {
            s.feed("train", "x", &x).unwrap();
            s.feed("train", "labels", &y).unwrap();
            s.feed("train", "g", &g).unwrap();
        }
        s.run("train").unwrap();
        let mut v: Vec<f32> = s.fetch::<f32>("train", "loss").unwrap();
        v.extend(s.fetch::<f32>("train", "relu").unwrap());
        v.extend(s.variable::<f32>("fc/weights").unwrap());
        v.extend(s.variable::<f32>("fc/biases").unwrap());
        seen.push(v.iter().map(|f| f.to_bits()).collect());
    }
    seen
}

/// A feed written in place is the same feed as one copied in: bit for bit,
/// on the CPU backend (which lends its arena) and on a backend that lends
/// nothing (the session's scratch and `write_buffer`).
#[test]
fn feeding_in_place_equals_feeding_a_copy() {
    let copied = train_mlp(Session::new(7), false);
    assert_eq!(train_mlp(Session::new(7), true), copied, "CPU backend");
    let fallback = Session::with_backend(7, Box::new(common::CopyingFeeds(towers_runtime::CpuBackend::new(), None)));
    assert_eq!(train_mlp(fallback, true), copied, "a backend that lends no memory");
    // Mixed, in place and by copy, on the two-device plan (two threads:
    // cpu:0 reads the feed, gpu:0 what cpu:0 made of it).
    let mut s = Session::new(0);
    s.load("two", common::two_device_plan()).unwrap();
    for k in 0..6 {
        let x: Vec<f32> = (0..6).map(|i| (i as f32 - 2.5) * (k as f32 + 1.0)).collect();
        if k % 3 == 1 {
            s.feed("two", "x", &x).unwrap();
        } else {
            s.feed_with("two", "x", |b| b.copy_from_slice(&x)).unwrap();
        }
        s.run("two").unwrap();
        let want: Vec<f32> = x.iter().map(|v| -v.max(0.0)).collect();
        assert_eq!(s.fetch::<f32>("two", "out").unwrap(), want, "step {k}");
    }
}

/// The CPU backend lends the feed's own memory: it holds the last feed
/// (zeros before any), and the closure's value comes back.
#[test]
fn the_cpu_backend_lends_the_feed_itself() {
    let mut s = Session::new(0);
    s.load("train", common::mlp_plan()).unwrap();
    assert_eq!(s.feed_with::<f32, _>("train", "x", |b| b.to_vec()).unwrap(), [0.0; 4]);
    s.feed("train", "x", &[1.0, 2.0, 3.0, 4.0]).unwrap();
    assert_eq!(s.feed_with::<f32, _>("train", "x", |b| b.to_vec()).unwrap(), [1.0, 2.0, 3.0, 4.0]);
    let n = s
        .feed_with("train", "labels", |b| {
            b.copy_from_slice(&[1, 0]);
            b.len()
        })
        .unwrap();
    assert_eq!(n, 2);
    assert_eq!(s.feed_with::<i32, _>("train", "labels", |b| b.to_vec()).unwrap(), [1, 0]);
}

/// Writing a feed in place checks what `feed` checks, with the same
/// typed errors, and never calls the closure then.
#[test]
fn feed_with_errors_are_typed_and_the_closure_is_not_called() {
    let mut s = setup();
    let mut called = false;
    let e = s.feed_with::<f32, _>("eval", "x", |_| called = true).unwrap_err();
    assert!(
        matches!(&e, RuntimeError::UnknownProgram { program, loaded } if program == "eval" && loaded == "train"),
        "{e}"
    );
    let e = s.feed_with::<f32, _>("train", "nope", |_| called = true).unwrap_err();
    assert!(
        matches!(&e, RuntimeError::UnknownFeed { feed, feeds, .. } if feed == "nope" && feeds == "g, labels, x"),
        "{e}"
    );
    assert_eq!(e.to_string(), "program 'train' has no feed named 'nope' (feeds: g, labels, x)");
    let e = s.feed_with::<f32, _>("train", "labels", |_| called = true).unwrap_err();
    assert!(
        matches!(&e, RuntimeError::WrongDtype { name, actual, requested, .. } if name == "labels" && actual == "i32" && requested == "f32"),
        "{e}"
    );
    let e = s.feed_with::<i32, _>("train", "x", |_| called = true).unwrap_err();
    assert!(matches!(&e, RuntimeError::WrongDtype { name, actual, .. } if name == "x" && actual == "f32"), "{e}");
    // A fetch is no feed.
    let e = s.feed_with::<f32, _>("train", "loss", |_| called = true).unwrap_err();
    assert!(matches!(&e, RuntimeError::UnknownFeed { .. }), "{e}");
    assert!(!called, "the closure ran on an error");
    // The errors left the feeds as they were.
    s.run("train").unwrap();
    assert_eq!(s.fetch::<f32>("train", "Relu").unwrap(), &[1.5, 0.0, 3.5, 0.0]);
}

/// TF1's "You must feed a value for placeholder tensor": a run with a
/// placeholder never fed since the program was loaded is refused, naming it;
/// a feed written in place counts; a fed value stays for later runs.
#[test]
fn a_placeholder_never_fed_is_an_error_naming_it() {
    let mut s = Session::new(42);
    s.load("train", common::mlp_plan()).unwrap();
    s.feed("train", "x", &[1.0, 2.0, 3.0, 4.0]).unwrap();
    s.feed("train", "g", &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let e = s.run("train").unwrap_err();
    assert!(matches!(&e, RuntimeError::Unfed { feed, .. } if feed == "labels"), "{e}");
    assert!(
        e.to_string().starts_with("You must feed a value for placeholder tensor 'labels' with dtype i32 and shape [2]"),
        "{e}"
    );
    assert_eq!(s.variable::<i32>("global_step").unwrap(), &[0], "nothing ran");
    s.feed_with("train", "labels", |l| l.copy_from_slice(&[0, 1])).unwrap();
    s.run("train").unwrap();
    s.run("train").unwrap();
    assert_eq!(s.variable::<i32>("global_step").unwrap(), &[2], "a fed value stays fed");
    // Another program of the same model starts unfed.
    s.load("again", common::mlp_plan()).unwrap();
    let e = s.run("again").unwrap_err().to_string();
    assert!(e.contains("placeholder tensor 'g'") && e.contains("'again'"), "{e}");
}

/// Feed sizes are said in shapes and rows.
#[test]
fn feed_length_errors_speak_in_shapes_and_rows() {
    let mut s = Session::new(42);
    s.load("train", common::mlp_plan()).unwrap();
    let e = s.feed("train", "x", &[1.0, 2.0]).unwrap_err().to_string();
    assert!(e.starts_with("feed 'x' of program 'train' expects [2,2], got 2 elements = 1 rows;"), "{e}");
    let e = s.feed("train", "x", &[1.0, 2.0, 3.0]).unwrap_err().to_string();
    assert!(e.contains("expects [2,2], got 3 elements, not a whole number of rows of 2 elements ([2])"), "{e}");
}

/// Every training program reads the session's one `learning_rate`: a second
/// program compiled with another rate would train at the first one's, so
/// its load is refused, naming both rates; the same rate loads.
#[test]
fn a_second_program_compiled_with_another_learning_rate_is_refused() {
    let mut s = setup();
    let mut slow = common::mlp_plan();
    for v in slow.variables.iter_mut().filter(|v| v.name == "learning_rate") {
        v.init = towers_vocab::Initializer::Constant(towers_vocab::F32(0.01));
    }
    let e = s.load("slow", slow).unwrap_err();
    assert!(matches!(&e, RuntimeError::LearningRateConflict { owner, .. } if owner == "train"), "{e}");
    assert!(e.to_string().contains("learning rate 0.01") && e.to_string().contains("'s 0.5"), "{e}");
    s.load("again", common::mlp_plan()).unwrap();
}

/// A step's tensor holds nothing before the program's first run: a fetch
/// then is refused (it would read zeros); after a run it reads.
#[test]
fn a_fetch_before_the_first_run_is_refused() {
    let mut s = setup();
    let e = s.fetch::<f32>("train", "loss").unwrap_err();
    assert!(matches!(&e, RuntimeError::FetchBeforeRun { fetch, .. } if fetch == "loss"), "{e}");
    s.run("train").unwrap();
    s.fetch::<f32>("train", "loss").unwrap();
}

/// TF1's tensor names: `node:0` is slot 0, listed in the plan as `node`.
#[test]
fn a_tensor_is_fetched_by_its_tf1_name_too() {
    let mut s = setup();
    s.run("train").unwrap();
    assert_eq!(s.fetch::<f32>("train", "Relu:0").unwrap(), s.fetch::<f32>("train", "Relu").unwrap());
    let e = s.fetch::<f32>("train", "Relu:1").unwrap_err();
    assert!(e.to_string().contains("CompileOptions::fetches"), "{e}");
}

/// A variable asked for without its scope, or misspelt, is an error that
/// says which one was probably meant.
#[test]
fn an_unknown_variable_names_the_one_probably_meant() {
    let s = setup();
    let e = s.variable::<f32>("weights").unwrap_err().to_string();
    assert!(e.contains("did you mean 'fc/weights'?"), "{e}");
    let e = s.variable::<f32>("fc/wieghts").unwrap_err().to_string();
    assert!(e.contains("did you mean 'fc/weights'?"), "{e}");
    let e = s.variable::<f32>("something/else/entirely").unwrap_err().to_string();
    assert_eq!(e, "no variable named 'something/else/entirely'");
}
