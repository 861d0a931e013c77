//! Where each device runs, from the command line (issue 21, items 6 and
//! 7): the run-start lines of `towers train`, the placement report's
//! physical mapping, and the refusals of devices this machine cannot
//! serve: a `/cpu:1` (a `--graph` model's device scope, at load or in
//! placement), a `/gpu:N` under `--backend cuda` on a machine without CUDA.

use std::path::Path;
use std::process::Command;

use towers::graph::layers::{self, Activation};
use towers::graph::{DType, GraphBuilder, GraphError, Reuse};
use towers::runtime::devices::{Cuda, Machine};
use towers::trainer::Model;

/// `towers ARGS`: (success, stdout, stderr).
fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_towers")).args(args).output().expect("the towers binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn no_cuda() -> bool {
    !matches!(Machine::probe().cuda, Cuda::Gpus(n) if n > 0)
}

/// A small MLP on 8x8 digits with every node inside `tf.device(device)`.
fn model_on(device: &str) -> Model {
    let mut b = GraphBuilder::with_seed(7);
    let x = b.placeholder("x", DType::F32, [None, Some(8), Some(8), Some(1)]).unwrap();
    let y = b.placeholder("y", DType::I32, [None]).unwrap();
    b.device(device, |b| -> Result<(), GraphError> {
        let logits = b.variable_scope("net", Reuse::No, |b| {
            let h = b.flatten(x)?;
            let h = layers::dense(b, "hidden", h, 16, Activation::Tanh)?;
            layers::dense(b, "out", h, 10, Activation::None)
        })?;
        let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y)?;
        let loss = b.reduce_mean_all(xent)?;
        b.identity(loss, "loss")?;
        let pred = b.argmax(logits, 1)?;
        b.identity(pred, "pred")?;
        Ok(())
    })
    .unwrap();
    Model::new(b.finish(), "loss", "x", "y", "pred")
}

fn save(dir: &Path, name: &str, device: &str) -> String {
    let p = dir.join(name);
    model_on(device).save_json(&p).expect("saved");
    p.to_str().expect("utf-8").to_string()
}

#[test]
fn every_run_says_where_each_device_runs() {
    let (ok, _, err) = run(&["train", "--towers", "2", "--steps", "2"]);
    assert!(ok, "{err}");
    let start = err.find("devices of train:\n").unwrap_or_else(|| panic!("the map of train: {err}"));
    let lines: Vec<&str> = err[start..].lines().skip(1).take(3).collect();
    assert!(lines[0].starts_with("  cpu:0 -> host (pageable arena "), "{err}");
    assert!(
        lines[1].starts_with("  gpu:0 -> host thread ") && lines[2].starts_with("  gpu:1 -> host thread "),
        "{err}"
    );
    if no_cuda() {
        assert!(lines[1].ends_with("; CPU backend: no CUDA driver found)"), "{err}");
    }
    // Printed before the first step's line and the end of the run.
    assert!(start < err.find(" steps, ").expect("the run's summary"), "{err}");
}

#[test]
fn the_placement_report_gains_the_physical_mapping() {
    let (ok, out, err) = run(&["compile", "--towers", "4", "--emit", "placement"]);
    assert!(ok, "{err}");
    let at = out.find("\nwhere each device runs (--backend cpu on this machine: ").expect("the section");
    let lines: Vec<&str> = out[at..].lines().skip(2).collect();
    assert_eq!(lines.len(), 5, "cpu:0 and four towers: {out}");
    for (i, l) in lines.iter().enumerate().skip(1) {
        assert!(l.starts_with(&format!("  gpu:{} -> host thread ", i - 1)), "{l}");
    }
}

#[test]
fn a_gpu_under_backend_cuda_without_cuda_is_refused_naming_it() {
    if !no_cuda() {
        return; // a machine with a GPU serves any number of logical GPUs
    }
    let fix = "run with --backend cpu, which runs every /gpu:N as a host thread of its own";
    let (ok, _, err) = run(&["train", "--towers", "4", "--backend", "cuda", "--steps", "1"]);
    assert!(!ok);
    assert!(err.contains("--backend cuda: device gpu:0 was asked for, but this machine has no CUDA GPU ("), "{err}");
    assert!(err.contains(fix), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let (ok, _, err) = run(&["compile", "--towers", "2", "--emit", "placement", "--backend", "cuda"]);
    assert!(!ok && err.contains("device gpu:0 was asked for") && err.contains(fix), "{err}");
    // A --graph model inside tf.device('/gpu:3'): named at the start of the run.
    let dir = tempfile::tempdir().expect("tempdir");
    let gpu3 = save(dir.path(), "gpu3.json", "/gpu:3");
    let (ok, _, err) = run(&["train", "--graph", &gpu3, "--backend", "cuda", "--steps", "1"]);
    assert!(!ok && err.contains("device gpu:3 was asked for") && err.contains(fix), "{err}");
    // The fix works: the CPU backend runs it as a host thread.
    let (ok, _, err) = run(&["train", "--graph", &gpu3, "--steps", "2"]);
    assert!(ok, "{err}");
    assert!(err.contains("\n  gpu:3 -> host thread 1 of 1 (arena "), "{err}");
}

#[test]
fn a_second_host_device_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cpu1 = save(dir.path(), "cpu1.json", "/cpu:1");
    let said =
        "device cpu:1 was asked for, but a process has one host device, cpu:0: place what is on /cpu:1 on /cpu:0";
    // `towers train` knows first: refused before any data loads, with or
    // without towers. (`Session::load` refuses such a plan too:
    // tests/tests/devices.rs.)
    for towers in [None, Some("2")] {
        let mut args = vec!["train", "--graph", &cpu1, "--steps", "1"];
        args.extend(towers.iter().flat_map(|t| ["--towers", *t]));
        let (ok, _, err) = run(&args);
        assert!(!ok && err.contains(said), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // `towers compile`: one device places everything on cpu:1, which the
    // placement report's mapping refuses; with towers, placement refuses
    // it first, in TF's words.
    let (ok, _, err) = run(&["compile", "--graph", &cpu1, "--emit", "placement"]);
    assert!(!ok && err.contains(said), "{err}");
    let (ok, _, err) = run(&["compile", "--graph", &cpu1, "--towers", "2"]);
    assert!(!ok && err.contains("was explicitly assigned to /device:CPU:1 but available devices are"), "{err}");
}
