//! `--variables ps` on the command line (one process): the placement
//! report, the graph text and the dot name every variable's owner
//! `/job:ps/task:k`; training in one process holds every shard, so it
//! prints bit for bit the losses of `--variables cpu`; the ps flags' user
//! errors; a rank of several compiles only its own shards' updates.

use std::process::Command;

#[path = "cli_support.rs"]
#[allow(dead_code)]
mod cli_support;
use cli_support::towers;

fn compile(extra: &[&str]) -> String {
    let mut args = vec!["compile", "--towers", "2", "--optimizer", "adam", "--variables", "ps"];
    args.extend_from_slice(extra);
    towers(&args).0
}

#[test]
fn placement_graph_and_dot_name_each_variables_owner() {
    let report = compile(&["--ps-tasks", "2", "--emit", "placement"]);
    assert!(report.contains("parameter-server tasks: 2 (owner of each variable and slot):"), "{report}");
    // Round-robin in creation order: the first variable on task 0, the second on task 1.
    let owners: Vec<&str> = report
        .lines()
        .filter(|l| l.ends_with("  variable"))
        .map(|l| if l.contains("/job:ps/task:0") { "0" } else { "1" })
        .collect();
    assert!(owners.len() >= 4, "{report}");
    assert!(
        owners.iter().step_by(2).all(|&k| k == "0") && owners.iter().skip(1).step_by(2).all(|&k| k == "1"),
        "{report}"
    );
    // Adam's two slots per variable live with their owner only.
    let slots = report.lines().filter(|l| l.ends_with("  slot")).count();
    assert_eq!(slots, 2 * owners.len(), "{report}");
    assert!(report.contains("variables=ps round_robin: /job:ps/task:1"), "{report}");
    // The MLP 784-256-256-10 (digits: 64-256-256-10): Adam's slots are twice the variables' bytes.
    let line = report.lines().find(|l| l.contains("optimizer slots: ")).expect("a slots line");
    let nums: Vec<usize> = line.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    let (total, most, fewer) = (nums[0], nums[1], nums[2]);
    assert!(most < total && fewer == total - most, "{line}");
    let greedy = compile(&["--ps-tasks", "2", "--ps-strategy", "greedy", "--emit", "placement"]);
    assert!(greedy.contains("variables=ps greedy: /job:ps/task:"), "{greedy}");
    let graph = compile(&["--ps-tasks", "3", "--emit", "graph"]);
    assert!(graph.contains("ps tasks = 3\n") && graph.contains(" = /job:ps/task:2\n"), "{graph}");
    let dot = compile(&["--ps-tasks", "2", "--emit", "dot"]);
    assert!(dot.contains("\\nowner /job:ps/task:1"), "{dot}");
    let collapsed = compile(&["--emit", "dot", "--collapse"]);
    // One process: --ps-tasks defaults to 1.
    assert!(collapsed.contains("variables of /job:ps/task:0") && !collapsed.contains("/job:ps/task:1"), "{collapsed}");
}

fn losses(stdout: &str) -> Vec<String> {
    stdout.lines().filter(|l| l.starts_with("step ") && l.contains(" loss ")).map(str::to_string).collect()
}

#[test]
fn one_process_holds_every_shard_and_trains_as_variables_cpu() {
    let run = |vars: &[&'static str]| {
        let mut args =
            vec!["train", "--towers", "2", "--optimizer", "adam", "--seed", "2", "--log-every", "1", "--steps", "5"];
        args.extend_from_slice(vars);
        losses(&towers(&args).0)
    };
    let cpu = run(&["--variables", "cpu"]);
    assert_eq!(cpu.len(), 5);
    assert_eq!(run(&["--variables", "ps", "--ps-tasks", "2"]), cpu);
    assert_eq!(run(&["--variables", "ps", "--ps-tasks", "3", "--ps-strategy", "greedy"]), cpu);
}

#[test]
fn ps_flags_mistakes_are_errors() {
    let bad = |args: &[&str], needle: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_towers")).args(args).output().expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(err.contains(needle), "{args:?}: expected '{needle}' in:\n{err}");
        assert!(!err.contains("panicked"), "{err}");
    };
    bad(&["compile", "--ps-tasks", "2"], "--ps-tasks 2 needs --variables ps");
    bad(&["compile", "--ps-strategy", "greedy"], "--ps-strategy greedy needs --variables ps");
    bad(&["compile", "--variables", "ps", "--ps-tasks", "0"], "--ps-tasks 1 or more");
}

/// Compiled as rank 1 of 2 (`--world-size 2 --rank 1`), the program keeps
/// the updates of the variables rank 1 owns (task 1 of 2: every second
/// one) and none of the others' optimizer slots.
#[test]
fn a_rank_compiles_only_its_own_shards_updates() {
    let count = |text: &str| text.lines().filter(|l| l.contains("/ApplyAdam = ApplyGradient")).count();
    let whole = count(&compile(&["--emit", "graph"]));
    let rank1 = compile(&["--world-size", "2", "--rank", "1", "--emit", "graph"]);
    assert!(whole >= 4 && count(&rank1) * 2 == whole, "{whole} updates in one process:\n{rank1}");
    let rank0 = compile(&["--world-size", "2", "--rank", "0", "--emit", "graph"]);
    assert_eq!(count(&rank0) + count(&rank1), whole, "{rank0}");
    let report = compile(&["--world-size", "2", "--rank", "1", "--emit", "placement"]);
    assert!(report.contains("this program is rank 1's: it holds "), "{report}");
    // Rank 1 runs task 1 only: task 0's slot bytes are not in its program.
    let task0 = report.lines().find(|l| l.trim_start().starts_with("/job:ps/task:0 ")).expect("a task 0 row");
    assert!(task0.trim_end().ends_with(" 0"), "{task0}");
}
