//! The command line's outputs and flags, end to end (root package
//! integration test: it runs the built `towers` binary): atomic writes,
//! standard output (`-o -`, a closed pipe), reused output folders, and the
//! flags whose meaning depends on others (RMSProp's momentum,
//! `--restore-partial`'s fresh step and slots).

use std::process::Command;

#[path = "cli_support.rs"]
mod cli_support;
use cli_support::{losses, towers};

/// `compile -o`, `--trace` and `--plot` replace their file atomically (a
/// new file renamed over the old one: a new inode, never the old file
/// truncated and rewritten in place), and leave no temporary file.
#[test]
fn outputs_are_replaced_atomically() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |n: &str| dir.path().join(n);
    let s = |n: &str| p(n).to_str().expect("utf-8").to_string();
    for n in ["plan.txt", "trace.json", "curves.svg"] {
        std::fs::write(p(n), b"a good file of an earlier run").expect("write");
    }
    let inodes =
        |names: &[&str]| names.iter().map(|n| std::fs::metadata(p(n)).expect("exists").ino()).collect::<Vec<_>>();
    let before = inodes(&["plan.txt", "trace.json", "curves.svg"]);
    towers(&["compile", "-o", &s("plan.txt")]);
    towers(&["train", "--steps", "3", "--trace", &s("trace.json"), "--plot", &s("curves.svg")]);
    let after = inodes(&["plan.txt", "trace.json", "curves.svg"]);
    for ((b, a), n) in before.iter().zip(&after).zip(["plan.txt", "trace.json", "curves.svg"]) {
        assert_ne!(b, a, "{n} was rewritten in place");
    }
    assert!(std::fs::read_to_string(p("plan.txt")).expect("plan").contains("stream"));
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into())
        .collect();
    assert_eq!(names.len(), 3, "no temporary file left: {names:?}");
}

/// `--momentum` with `--optimizer rmsprop` is RMSProp's momentum term
/// (TF1's `RMSPropOptimizer(momentum=0.9)`): it reaches the update and
/// changes the losses; left out it is 0, as TF1's default (it was dropped
/// in silence: every value trained as 0).
#[test]
fn rmsprop_reads_momentum() {
    let (plan, _) = towers(&["compile", "--optimizer", "rmsprop", "--momentum", "0.9", "--emit", "plan"]);
    assert!(plan.contains("apply_rmsprop decay=0.9 momentum=0.9 "), "{plan}");
    let (plan, _) = towers(&["compile", "--optimizer", "rmsprop", "--emit", "plan"]);
    assert!(plan.contains("apply_rmsprop decay=0.9 momentum=0 "), "{plan}");
    let run = |m: &str| {
        let mut a = vec!["train", "--optimizer", "rmsprop", "--steps", "6", "--log-every", "6"];
        if !m.is_empty() {
            a.extend(["--momentum", m]);
        }
        losses(&towers(&a).0)
    };
    let (none, zero, high) = (run(""), run("0"), run("0.9"));
    assert_eq!(none, zero, "the default is TF1's momentum 0");
    assert_ne!(zero, high, "--momentum 0.9 changes the run");
}

/// `towers train | head` and `towers compile | head -c 10`: the reader
/// closes the pipe; the process ends quietly (status 141, as a Unix tool
/// ended by SIGPIPE) instead of panicking with status 101.
#[test]
fn a_closed_standard_output_ends_the_run_without_a_panic() {
    use std::io::Read;
    use std::process::Stdio;
    for args in [
        &["train", "--steps", "20000", "--log-every", "1"][..],
        &["compile", "--model", "convnet", "--towers", "4", "--emit", "plan-json"][..],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_towers"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("towers runs");
        let mut first = [0u8; 10];
        child.stdout.take().expect("stdout").read_exact(&mut first).expect("some output");
        // The read end is dropped here: the next write fails with EPIPE.
        let out = child.wait_with_output().expect("towers ends");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(141), "{args:?}: {err}");
    }
}

/// `-o -` is standard output (it wrote a file named `-`).
#[test]
fn output_dash_is_standard_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_towers"))
        .args(["compile", "--emit", "plan", "-o", "-"])
        .current_dir(dir.path())
        .output()
        .expect("towers runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("program train"));
    assert!(!dir.path().join("-").exists(), "no file named -");
}

/// `--restore-partial` restores the model's variables only (TF1's fine
/// tuning): `global_step`, the learning rate and the optimizer slots start
/// fresh, so `--steps 10` from a step-8 checkpoint trains 10 steps (it
/// trained 2), and the note says so.
#[test]
fn restore_partial_starts_the_step_and_the_slots_fresh() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ft.safetensors");
    let ck = ck.to_str().expect("utf-8 path");
    towers(&["train", "--steps", "8", "--checkpoint", ck]);
    let args = ["train", "--hidden", "256,128", "--steps", "10", "--log-every", "1", "--checkpoint", ck];
    let (out, err) = towers(&[&args[..], &["--resume", "--restore-partial"]].concat());
    assert_eq!(losses(&out).iter().map(|l| l.0).collect::<Vec<_>>(), (1..=10).collect::<Vec<_>>(), "{out}\n{err}");
    assert!(err.contains("at global step 0 (10 of --steps 10 to train)"), "{err}");
    assert!(err.contains("global_step, the learning rate and 6 optimizer slot(s) start fresh"), "{err}");
    assert!(err.contains("skipped 'MLP/fc2/weights: f32[256, 256] in the file"), "{err}");
    assert!(!err.contains("fc2/weights/Momentum"), "fresh slots are not listed as skipped: {err}");
}

/// A reused `--dump-dir` holds this compile's dumps only, and a reused
/// `--emit cuda -o DIR` the kernels of this plan only (a 2-tower run's
/// `10-place.dot` stayed beside a 1-tower run's `06-place.dot`; a convnet's
/// `.cu` files beside an MLP's); other files are kept.
#[test]
fn reused_output_folders_hold_this_runs_files_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dd = dir.path().join("dd");
    let (d, plan) = (dd.to_str().expect("utf-8"), dir.path().join("x.plan"));
    let p = plan.to_str().expect("utf-8");
    towers(&["compile", "--towers", "2", "--dump-dir", d, "-o", p]);
    assert!(dd.join("10-place.dot").exists());
    std::fs::write(dd.join("notes.txt"), "mine").unwrap();
    towers(&["compile", "--dump-dir", d, "-o", p]);
    assert!(!dd.join("10-place.dot").exists() && !dd.join("04-replicate.txt").exists(), "stale dumps removed");
    assert!(dd.join("06-place.dot").exists() && dd.join("notes.txt").exists());
    let cu = dir.path().join("cu");
    let c = cu.to_str().expect("utf-8");
    towers(&["compile", "--model", "convnet", "--towers", "2", "--emit", "cuda", "-o", c]);
    let count = |ext: &str| {
        std::fs::read_dir(&cu)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(ext))
            .count()
    };
    let convnet = count(".cu");
    std::fs::write(cu.join("mine.cu"), "// mine").unwrap();
    towers(&["compile", "--model", "mlp", "--emit", "cuda", "-o", c]);
    let index = std::fs::read_to_string(cu.join("index.txt")).unwrap();
    let listed = towers::outputs::cuda_files_of_index(&cu);
    assert!(!listed.is_empty() && listed.len() < convnet, "{index}");
    for f in &listed {
        assert!(cu.join(f).exists(), "{f}");
    }
    assert_eq!(count(".cu"), listed.len() + 1, "the MLP's kernels and the user's file: {index}");
    assert!(cu.join("mine.cu").exists());
}
