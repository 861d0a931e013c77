//! Helpers of the root package's command-line tests (`tests/cli.rs`,
//! `tests/cli_outputs.rs`, `tests/watch.rs`): run the built `towers` binary and read its output.

use std::process::Command;

/// Run `towers ARGS`, which must succeed; its (stdout, stderr).
pub fn towers(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_towers")).args(args).output().expect("the towers binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "towers {args:?} failed:\n{stderr}\n{stdout}");
    (stdout, stderr)
}

/// The `test accuracy: A` line's number.
#[allow(dead_code)] // not every test crate reads the accuracy
pub fn accuracy(stdout: &str) -> f64 {
    let line = stdout.lines().find(|l| l.starts_with("test accuracy: ")).expect("a test accuracy line");
    line["test accuracy: ".len()..].trim().parse().expect("a number")
}

/// The `step N loss L` lines' (N, L).
#[allow(dead_code)] // not every test crate reads losses
pub fn losses(stdout: &str) -> Vec<(usize, f64)> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("step ")?;
            let (step, rest) = rest.split_once(" loss ")?;
            // `step N loss L` or `step N loss L train acc A`.
            let loss = rest.split_whitespace().next()?;
            Some((step.parse().ok()?, loss.parse().ok()?))
        })
        .collect()
}
