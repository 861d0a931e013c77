//! The trainer for your own graph (issue 22 item 7): a model built in Rust
//! trains through the library's entry point ([`towers::trainer::fit`]) with
//! the CLI's checkpoints and exact resume, and the same model saved as JSON
//! trains and compiles from the command line (`--graph`), whose log lines
//! carry the training accuracy. Wrong model files are errors naming the
//! file and what is wrong (the fuzzing of the parser is in `tests/fuzz.rs`).

use std::path::Path;
use std::process::Command;

use towers::data::DataSpec;
use towers::graph::layers::{self, Activation};
use towers::graph::{DType, GraphBuilder, Reuse};
use towers::train::{LrScheduleKind, Quiet, TrainConfig, TrainError};
use towers::trainer::{fit, fit_datasets, Model, ModelError};

#[path = "cli_support.rs"]
mod cli_support;
use cli_support::{accuracy, towers};

/// A small MLP on 8x8 digits, with dropout (a random stream that an exact
/// resume must continue), its loss, predictions and training accuracy.
fn mlp() -> Model {
    mlp_with_batch(None)
}

/// [`mlp`] with its placeholders' dimension 0 fixed at `batch` rows (TF1's
/// `tf.placeholder(tf.float32, [32, 8, 8, 1])`), or unknown (None).
fn mlp_with_batch(batch: Option<usize>) -> Model {
    let mut b = GraphBuilder::with_seed(7);
    let x = b.placeholder("x", DType::F32, [batch, Some(8), Some(8), Some(1)]).unwrap();
    let y = b.placeholder("y", DType::I32, [batch]).unwrap();
    let logits = b
        .variable_scope("net", Reuse::No, |b| {
            let h = b.flatten(x)?;
            let h = layers::dense(b, "hidden", h, 32, Activation::Tanh)?;
            let h = b.dropout_with_seed(h, 0.1, 11)?;
            layers::dense(b, "out", h, 10, Activation::None)
        })
        .unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
    let loss = b.reduce_mean_all(xent).unwrap();
    b.identity(loss, "xent_mean").unwrap();
    let pred = b.argmax(logits, 1).unwrap();
    b.identity(pred, "pred").unwrap();
    let hit = b.equal(pred, y).unwrap();
    let hit = b.cast(hit, DType::F32).unwrap();
    let acc = b.reduce_mean_all(hit).unwrap();
    b.identity(acc, "acc").unwrap();
    Model::new(b.finish(), "xent_mean", "x", "y", "pred").with_accuracy("acc")
}

fn run_towers(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_towers")).args(args).output().expect("the towers binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// `step N loss L train acc A` lines: (step, accuracy).
fn train_accs(stdout: &str) -> Vec<(usize, f64)> {
    stdout
        .lines()
        .filter_map(|l| {
            let (head, acc) = l.strip_prefix("step ")?.split_once(" train acc ")?;
            Some((head.split_whitespace().next()?.parse().ok()?, acc.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn a_user_graph_resumes_exactly_through_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let m = mlp();
    let cfg = |steps: usize, ck: &Path, resume: bool| {
        TrainConfig::default()
            .with_steps(steps)
            .with_towers(2)
            .with_lr(0.1)
            .with_lr_schedule(LrScheduleKind::Constant)
            .with_log_every(5)
            .with_checkpoint(ck.to_path_buf())
            .with_resume(resume)
    };
    let (straight, resumed) = (dir.path().join("straight.safetensors"), dir.path().join("resumed.safetensors"));
    let full = fit(&m, &cfg(50, &straight, false), &mut Quiet).expect("the straight run trains");
    fit(&m, &cfg(20, &resumed, false), &mut Quiet).expect("the first half trains");
    let half = std::fs::read(&resumed).unwrap();
    let rest = fit(&m, &cfg(50, &resumed, true), &mut Quiet).expect("the second half trains");
    let (a, b) = (std::fs::read(&straight).unwrap(), std::fs::read(&resumed).unwrap());
    assert_ne!(half, b, "the second half trained");
    assert!(a == b, "resumed variables differ from the straight run's");
    // The resumed run reports the same last steps as the straight run.
    assert_eq!(rest.losses.first().map(|l| l.0), Some(25));
    assert_eq!(full.losses.last(), rest.losses.last());
    assert_eq!(full.train_accuracies.len(), 10);
    assert_eq!(full.train_accuracies.last(), rest.train_accuracies.last());
    assert!(full.train_accuracies.iter().all(|(_, a)| (0.0..=1.0).contains(a)), "{:?}", full.train_accuracies);
    // A checkpoint of another graph is refused by its description.
    let mut other = mlp();
    other.accuracy = None;
    let e = fit(&other, &cfg(60, &resumed, true), &mut Quiet).unwrap_err();
    assert!(matches!(&e, TrainError::Resume(m) if m.contains("another model (graph: ")), "{e}");
    // A model whose names do not fit is refused before anything runs.
    other.loss = "pred".into();
    let e = fit(&other, &cfg(60, &resumed, true), &mut Quiet).unwrap_err();
    assert!(matches!(e, TrainError::Model(ModelError::WrongKind { role: "loss", .. })), "{e}");
}

#[test]
fn a_user_graph_trains_on_the_callers_arrays_with_a_rising_training_accuracy() {
    let (train, test) = DataSpec::Digits.load().unwrap();
    let cfg = TrainConfig::default().with_epochs(8).with_lr(0.1).with_log_every(10);
    let r = fit_datasets(&mlp(), &cfg, train, test, &mut Quiet).expect("trains");
    assert!(r.test_accuracy >= 0.9, "test accuracy {}", r.test_accuracy);
    let (first, last) = (r.train_accuracies[0].1, r.train_accuracies.last().unwrap().1);
    assert!(last > first + 0.3, "training accuracy {first} -> {last}");
    // Options are checked before anything runs, naming the field's flag.
    let bad = TrainConfig::default().with_lr(f32::NAN);
    let e = fit(&mlp(), &bad, &mut Quiet).unwrap_err();
    assert!(matches!(e, TrainError::InvalidOption { flag: "lr", .. }), "{e}");
}

#[test]
fn train_and_compile_a_saved_graph_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.json");
    mlp().save_json(&file).unwrap();
    let f = file.to_str().unwrap();
    let (out, _) = towers(&["train", "--graph", f, "--epochs", "8", "--lr", "0.1", "--log-every", "20"]);
    let acc = accuracy(&out);
    assert!(acc >= 0.9, "test accuracy {acc}\n{out}");
    let accs = train_accs(&out);
    assert!(accs.len() >= 5 && accs.iter().all(|(_, a)| (0.0..=1.0).contains(a)), "{out}");
    assert!(accs.last().unwrap().1 > accs[0].1, "{out}");
    let (plan, _) = towers(&["compile", "--graph", f, "--towers", "2", "--emit", "placement"]);
    assert!(plan.contains("gpu:1") && plan.contains("tower_1/net"), "{plan}");
    let (text, _) = towers(&["compile", "--graph", f, "--emit", "graph"]);
    assert!(text.contains("net/hidden/weights"), "{text}");
}

/// A model whose placeholders declare a fixed batch (32 rows) trains at
/// `--batch 32` and is evaluated at its own batch, the test set's last
/// partial chunk (360 = 11 x 32 + 8) padded and its padding not counted: the
/// same test accuracy as the model that takes any batch (the evaluation
/// was compiled at 256 rows and refused). Another --batch is refused
/// naming --batch, the file and the placeholder.
#[test]
fn a_graph_with_a_fixed_batch_trains_and_evaluates_at_that_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (fixed, any) = (dir.path().join("fixed.json"), dir.path().join("any.json"));
    mlp_with_batch(Some(32)).save_json(&fixed).unwrap();
    mlp().save_json(&any).unwrap();
    let run = |f: &Path| {
        towers(&["train", "--graph", f.to_str().unwrap(), "--batch", "32", "--steps", "40", "--log-every", "10"])
    };
    let ((out_fixed, _), (out_any, _)) = (run(&fixed), run(&any));
    assert_eq!(train_accs(&out_fixed).len(), 4, "{out_fixed}");
    assert_eq!(accuracy(&out_fixed), accuracy(&out_any), "fixed:\n{out_fixed}\nany:\n{out_any}");
    let f = fixed.to_str().unwrap();
    let (ok, _, err) = run_towers(&["train", "--graph", f, "--batch", "64", "--steps", "1"]);
    assert!(!ok, "{err}");
    for part in [
        "--batch 64: the --graph ",
        "fixed.json placeholder 'x' has a fixed batch of 32 rows: give --batch 32",
        "declare its dimension 0 as None (tf.placeholder(tf.float32, [None, 8, 8, 1]))",
    ] {
        assert!(err.contains(part), "{part}: {err}");
    }
    let (ok, _, err) = run_towers(&["compile", "--graph", f, "--batch", "64"]);
    assert!(!ok && err.contains("give --batch 32"), "{err}");
}

#[test]
fn seed_models_print_their_training_accuracy_per_logged_step() {
    for model in ["mlp", "convnet"] {
        let (out, _) = towers(&["train", "--model", model, "--steps", "30", "--log-every", "10", "--towers", "2"]);
        let accs = train_accs(&out);
        assert_eq!(accs.iter().map(|a| a.0).collect::<Vec<_>>(), [10, 20, 30], "{model}: {out}");
        assert!(accs.iter().all(|(_, a)| (0.0..=1.0).contains(a)), "{out}");
    }
}

#[test]
fn wrong_model_files_are_errors_naming_the_file_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let good = mlp().to_json().unwrap();
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        ("truncated", good[..good.len() / 2].to_string(), vec!["truncated.json:", "EOF"]),
        ("version", good.replacen("\"version\": 1", "\"version\": 9", 1), vec!["\"version\" is 9", "reads version 1"]),
        ("format", good.replacen("towers-model", "keras", 1), vec!["not a towers model file"]),
        ("unknown_op", good.replacen("\"MatMul\"", "\"MatMulV9\"", 1), vec!["unknown variant `MatMulV9`"]),
        (
            "dangling",
            good.replacen("\"net/hidden/weights\",\n", "\"net/hidden/wieghts\",\n", 1),
            vec!["refers to 'net/hidden/weights'", "not defined before it"],
        ),
        (
            "loss",
            good.replacen("\"loss\": \"xent_mean\"", "\"loss\": \"xent_maen\"", 1),
            vec!["loss 'xent_maen'", "did you mean 'xent_mean'"],
        ),
        ("kind", good.replacen("\"loss\": \"xent_mean\"", "\"loss\": \"pred\"", 1), vec!["loss 'pred'", "scalar f32"]),
    ];
    for (name, text, wants) in cases {
        let p = dir.path().join(format!("{name}.json"));
        std::fs::write(&p, &text).unwrap();
        let (ok, _, err) = run_towers(&["train", "--graph", p.to_str().unwrap(), "--steps", "1"]);
        assert!(!ok, "{name}: trained");
        assert!(err.contains(&format!("{name}.json")), "{name}: {err}");
        for w in wants {
            assert!(err.contains(w), "{name}: wanted {w:?} in\n{err}");
        }
        assert!(!err.contains("panicked"), "{err}");
        let (ok, _, err) = run_towers(&["compile", "--graph", p.to_str().unwrap()]);
        assert!(!ok && err.contains(&format!("{name}.json")), "{name}: {err}");
    }
    // Images that do not fit the data set.
    let p = dir.path().join("model.json");
    mlp().save_json(&p).unwrap();
    let f = p.to_str().unwrap();
    for cmd in ["train", "compile"] {
        let (ok, _, err) =
            run_towers(&[cmd, "--graph", f, "--data", "mnist5k", "--steps", "1"][..if cmd == "train" { 7 } else { 5 }]);
        assert!(!ok && err.contains("images 'x' are [?,8,8,1]") && err.contains("28x28x1"), "{cmd}: {err}");
    }
    // Flags of the seed models do not go with --graph.
    let (ok, _, err) = run_towers(&["train", "--graph", f, "--hidden", "3"]);
    assert!(!ok && err.contains("--hidden") && err.contains("--graph"), "{err}");
    let (ok, _, err) = run_towers(&["compile", "--graph", f, "--input", "8x8x1"]);
    assert!(!ok && err.contains("--input"), "{err}");
    let (ok, _, err) = run_towers(&["train", "--graph", dir.path().join("absent.json").to_str().unwrap()]);
    assert!(!ok && err.contains("absent.json: cannot read"), "{err}");
}

/// [`mlp`] with a third placeholder, TF1's `keep_prob` (f32 scalar), that
/// scales the loss when `used`, or that nothing reads.
fn mlp_with_keep_prob(used: bool) -> Model {
    let mut m = mlp();
    let mut b = GraphBuilder::with_seed(7);
    *b.graph_mut() = m.graph.clone();
    let kp = b.placeholder("keep_prob", DType::F32, Vec::<usize>::new()).unwrap();
    if !used {
        m.graph = b.finish();
        return m;
    }
    let loss = b.graph().tensor(b.graph().get("xent_mean").unwrap(), 0);
    let scaled = b.mul(loss, kp).unwrap();
    b.identity(scaled, "scaled_loss").unwrap();
    m.graph = b.finish();
    m.loss = "scaled_loss".into();
    m
}

/// A placeholder the trainer cannot feed (TF1's `keep_prob`) is refused
/// when the model is checked, naming the file, the placeholder and what
/// the trainer feeds (it failed at the first step asking for
/// `Session::feed`); one that nothing reads is fine.
#[test]
fn a_placeholder_the_trainer_cannot_feed_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let used = mlp_with_keep_prob(true);
    let e = used.check().unwrap_err();
    assert!(matches!(e, ModelError::UnfedPlaceholder { .. }), "{e}");
    let p = dir.path().join("keep_prob.json");
    std::fs::write(&p, used.to_json().unwrap()).unwrap();
    let f = p.to_str().unwrap();
    for cmd in [&["train", "--graph", f, "--steps", "1"][..], &["compile", "--graph", f][..]] {
        let (ok, _, err) = run_towers(cmd);
        assert!(!ok, "{cmd:?}");
        for part in [
            "keep_prob.json: the model's loss 'scaled_loss' reads the placeholder 'keep_prob'",
            "neither its images ('x') nor its labels ('y')",
            "feeds only those two",
            "make 'keep_prob' a constant",
        ] {
            assert!(err.contains(part), "{cmd:?}: {part}: {err}");
        }
    }
    let unused = dir.path().join("unused.json");
    std::fs::write(&unused, mlp_with_keep_prob(false).to_json().unwrap()).unwrap();
    towers(&["compile", "--graph", unused.to_str().unwrap()]);
}

/// Node names the graph builder refuses (empty, `a:0`, `a//b`, a newline)
/// are refused in a model file too, naming the file and the node (they
/// trained into checkpoint keys no fetch can address).
#[test]
fn bad_node_names_in_a_model_file_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let good = mlp().to_json().unwrap();
    for (name, bad, why) in [
        ("empty", "", "a node needs a name"),
        ("colon", "net/hidden/w:0", "':' separates a node from its output slot"),
        ("slashes", "net//hidden/weights", "'/' separates scopes"),
        ("newline", "net/hidden/we\\nights", "control characters"),
    ] {
        // Every mention, so that only the name check can catch it.
        let text = good.replace("\"net/hidden/weights\"", &format!("\"{bad}\""));
        let p = dir.path().join(format!("{name}.json"));
        std::fs::write(&p, text).unwrap();
        let (ok, _, err) = run_towers(&["compile", "--graph", p.to_str().unwrap()]);
        assert!(!ok, "{name}: compiled");
        assert!(err.contains(&format!("{name}.json: node ")) && err.contains("invalid node name"), "{name}: {err}");
        assert!(err.contains(why), "{name}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// The README's Rust program is `examples/readme.rs` (which CI builds and
/// the README says it is), line for line.
#[test]
fn the_readme_program_is_the_example_file() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let example = std::fs::read_to_string(root.join("examples/readme.rs")).expect("examples/readme.rs");
    let start = readme.find("```rust\n").expect("a rust block in the README") + "```rust\n".len();
    let block = &readme[start..start + readme[start..].find("```").expect("the block's end")];
    let body: String =
        example.lines().skip_while(|l| l.starts_with("//!") || l.is_empty()).map(|l| format!("{l}\n")).collect();
    assert_eq!(block, body, "paste examples/readme.rs into the README (or the other way round)");
}
