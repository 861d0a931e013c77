//! The cost model on the command line (root package integration test):
//! `towers compile --explain-cost` and `--variables auto` on `compile` and
//! `train`, with their calibrations cached in a temporary folder. Which
//! placement wins depends on this machine's timings, so the tests check
//! that a choice is made, said and applied, never which one.

#[path = "cli_support.rs"]
#[allow(dead_code)]
mod cli_support;
use cli_support::towers;

const PLACEMENTS: [&str; 4] = ["cpu", "gpu0", "round_robin", "greedy"];

/// Every placement at 1, 2 and 4 towers gets a predicted step, compute per
/// device, transfer per link and critical path; a second run reads every
/// calibration from the cache (keyed by machine and plan hash).
#[test]
fn explain_cost_predicts_every_placement_and_tower_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().to_str().expect("utf-8 path");
    let (out, _) = towers(&["compile", "--explain-cost", "--cost-cache", cache]);
    for n in [1, 2, 4] {
        for v in PLACEMENTS {
            let heading = format!("towers={n} variables={v}");
            let line = out.lines().find(|l| l.starts_with(&heading)).unwrap_or_else(|| panic!("{heading}:\n{out}"));
            assert!(line.contains(": predicted step "), "{line}");
        }
    }
    for part in
        ["  compute per device: cpu:0 ", "  transfer per link: ", "  critical path (", "  calibrated copy paths: "]
    {
        assert_eq!(out.matches(part).count(), 12, "{part}:\n{out}");
    }
    // Links name their copy path; the calibration has an entry per path.
    let cpu2 = &out[out.find("towers=2 variables=cpu:").expect("the row")..];
    let cpu2 = &cpu2[..cpu2.find("\ntowers=").unwrap_or(cpu2.len())];
    for part in
        ["cpu:0 -> gpu:1 [host->device]", "gpu:1 -> cpu:0 [device->host]", "calibrated copy paths: host->device: "]
    {
        assert!(cpu2.contains(part), "{part}:\n{cpu2}");
    }
    assert!(out.contains("towers=2 variables=gpu0") && out.contains("[device->device]"), "{out}");
    assert!(!out.contains("GPU lanes"), "the CPU backend has none:\n{out}");
    let (again, _) = towers(&["compile", "--explain-cost", "--cost-cache", cache]);
    assert_eq!(again.matches(", calibration cached: predicted step").count(), 12, "{again}");
}

/// `--variables auto` says which placement it chose and why, and the
/// placement report shows that placement; `train` runs with it.
#[test]
fn variables_auto_picks_a_placement_and_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().to_str().expect("utf-8 path");
    let args = ["--variables", "auto", "--towers", "2", "--cost-cache", cache];
    let (report, err) = towers(&[&["compile", "--emit", "placement"][..], &args].concat());
    let reason = err.lines().find_map(|l| l.strip_prefix("--variables auto: variables=")).expect(&err);
    // The lowest prediction, or one within the tie margin that comes first.
    let chosen = PLACEMENTS
        .iter()
        .find(|v| {
            reason.starts_with(&format!("{v} has the lowest predicted step"))
                || reason.starts_with(&format!("{v} is within 5% of the lowest predicted step"))
        })
        .expect(reason);
    for other in PLACEMENTS.iter().filter(|v| *v != chosen) {
        assert!(reason.contains(&format!("{other} ")), "{reason}");
    }
    assert!(report.contains(&format!("variables={chosen}")), "{report}");
    // Same options, same plans, same cached calibrations: the same choice.
    let (_, err) = towers(&[&["train", "--steps", "3"][..], &args].concat());
    assert!(err.contains(&format!("--variables auto: variables={chosen} ")), "{err}");
}

/// With several processes each would time its own machine: refused, naming the flag.
#[test]
fn variables_auto_is_refused_across_processes() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_towers"))
        .args(["compile", "--variables", "auto", "--towers", "2", "--world-size", "2"])
        .output()
        .expect("the towers binary runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error: --variables auto: each of the 2 processes would time its own machine"), "{err}");
}

/// `--explain-cost` and `--variables auto` under `--backend cuda` calibrate
/// in a CUDA mixed session; on a machine without CUDA both are refused at
/// once with the error `towers train --backend cuda` gives, naming the device.
#[test]
fn explain_cost_on_cuda_without_cuda_is_refused_naming_the_device() {
    use towers::runtime::devices::{Cuda, Machine};
    if matches!(Machine::probe().cuda, Cuda::Gpus(n) if n > 0) {
        return; // a machine with a GPU calibrates there (bench/gpu_cost.sh)
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().to_str().expect("utf-8 path");
    for args in [
        &["compile", "--explain-cost", "--backend", "cuda", "--cost-cache", cache][..],
        &["compile", "--variables", "auto", "--towers", "2", "--backend", "cuda", "--cost-cache", cache][..],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_towers")).args(args).output().expect("runs");
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--backend cuda: device gpu:0 was asked for, but this machine has no CUDA GPU ("),
            "{err}"
        );
        assert!(err.contains("run with --backend cpu"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(String::from_utf8_lossy(&out.stdout).is_empty(), "nothing predicted: {args:?}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0, "nothing calibrated");
}

/// `--explain-cost` explains the user's `--towers` too, skips (saying why)
/// a count `--batch` does not split over instead of stopping half-way,
/// keeps `--split-weights` for the user's count only, and writes to `-o`.
#[test]
fn explain_cost_explains_the_users_towers_and_skips_what_does_not_split() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let cache = cache.to_str().expect("utf-8 path");
    let (out, _) = towers(&["compile", "--explain-cost", "--towers", "3", "--batch", "30", "--cost-cache", cache]);
    for n in [1, 2, 3] {
        for v in PLACEMENTS {
            assert!(out.lines().any(|l| l.starts_with(&format!("towers={n} variables={v}"))), "{n} {v}:\n{out}");
        }
    }
    assert!(out.contains("towers=4: skipped: --batch 30 does not split evenly over 4 towers"), "{out}");
    let report = dir.path().join("ec.txt");
    let r = report.to_str().expect("utf-8 path");
    let args = ["compile", "--explain-cost", "--towers", "2", "--split-weights", "3,1", "--cost-cache", cache, "-o", r];
    let (out, _) = towers(&args);
    assert!(out.is_empty(), "the report goes to -o: {out}");
    let text = std::fs::read_to_string(&report).expect("-o written");
    assert_eq!(text.lines().filter(|l| l.starts_with("towers=")).count(), 12, "{text}");
}
