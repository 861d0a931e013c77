//! `--ps-async` (asynchronous parameter servers, `--features mpi`) under a
//! real launcher.
//!
//! - Every optimizer at 2 ranks, SGD and Adam at 4 (oversubscribed): the
//!   loss decreases (the mean of the last 5 steps' losses below 0.9 × the
//!   first 5's), every owner applied exactly workers × steps gradients
//!   (so the run applied workers × steps × shards in all), the histogram
//!   counts every one, and every rank ends with the same variables (the
//!   digests, compared across ranks by the launcher test).
//! - A worker slowed by the test hook ([`towers::trainer::SLOW_WORKER_ENV`])
//!   makes the other's gradients stale: the maximum staleness is above 0.
//! - `towers train --ps-async --checkpoint`: the file holds the tensors of a
//!   one-process run's (every owner's Adam slots) and resumes in one process.
//! - The typed refusals (no `--variables ps`, one process, periodic saves).
//! - `towers train --ps-async`: a rank stopped (SIGSTOP) or killed (SIGKILL)
//!   ends the other within `--comm-timeout` + 5 s, and the error names it.
//!
//! The rank tests re-run this binary under `mpirun -np N`; without
//! `mpirun` they say SKIPPED, except under CI, where they fail.
#![cfg(feature = "mpi")]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use towers::config::{OptimizerKind, TrainConfig};
use towers::passes::{PsStrategy, VarPlacement};
use towers::runtime::comm::{Comm, MpiComm};
use towers::train::{train_in, Quiet};

const STEPS: usize = 30;

fn have_mpirun() -> bool {
    if Command::new("mpirun").arg("--version").output().is_ok() {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "mpirun is missing under CI: .ci/run installs openmpi-bin");
    eprintln!("SKIPPED: mpirun not found (apt-get install libopenmpi-dev openmpi-bin)");
    false
}

fn under_mpirun() -> bool {
    std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some()
}

/// `mpirun -np N` of this test binary running only `test`; (success, output).
fn mpirun_self(test: &str, np: usize, env: &[(&str, &str)]) -> Option<(bool, String)> {
    if !have_mpirun() {
        return None;
    }
    let session = tempfile::tempdir().expect("a session folder");
    let mut cmd = Command::new("mpirun");
    cmd.args(["-np", &np.to_string(), "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_orte_tmpdir_base", session.path());
    for (k, v) in env {
        cmd.args(["-x", &format!("{k}={v}")]);
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = cmd.arg(exe).args(["--exact", test, "--nocapture", "--test-threads=1"]).output().expect("mpirun starts");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    Some((out.status.success(), text))
}

fn config(kind: OptimizerKind, world: usize) -> TrainConfig {
    let lr = match kind {
        OptimizerKind::Sgd => 0.1,
        OptimizerKind::Momentum => 0.05,
        OptimizerKind::Adagrad => 0.05,
        OptimizerKind::Adam => 0.005,
        // TF's RMSProp starts its mean square at 1: a slow first few steps.
        OptimizerKind::RmsProp => 0.02,
    };
    let mut cfg = TrainConfig { optimizer: kind, lr, ..TrainConfig::default() };
    cfg.hidden = vec![32];
    cfg.batch = 32;
    cfg.steps = Some(STEPS);
    cfg.log_every = 1;
    cfg.seed = 3;
    cfg.variables = VarPlacement::Ps { tasks: world as u32, strategy: PsStrategy::RoundRobin };
    cfg.ps_async = true;
    cfg.comm_timeout = Duration::from_secs(60);
    cfg
}

/// One rank's part: train with each of `kinds`, check, print the digest.
fn as_rank(kinds: &[OptimizerKind]) {
    let comm: Arc<dyn Comm> = Arc::new(MpiComm::init_with_timeout(Duration::from_secs(60)).expect("MPI initializes"));
    let (rank, world) = (comm.rank(), comm.world_size());
    for (n, kind) in kinds.iter().enumerate() {
        let what = format!("rank {rank} of {world}, {kind:?}");
        let r =
            train_in(&config(*kind, world), Arc::clone(&comm), &mut Quiet).unwrap_or_else(|e| panic!("{what}: {e}"));
        let losses: Vec<f32> = r.losses.iter().map(|l| l.1).collect();
        assert_eq!(losses.len(), STEPS, "{what}");
        let mean = |l: &[f32]| l.iter().sum::<f32>() / l.len() as f32;
        let (first, last) = (mean(&losses[..5]), mean(&losses[STEPS - 5..]));
        assert!(last < 0.9 * first, "{what}: the loss did not decrease: {first} -> {last} ({losses:?})");
        let p = r.ps_async.as_ref().expect("a --ps-async report");
        assert_eq!(p.expected_per_owner, (world * STEPS) as u64, "{what}");
        if rank == 0 {
            assert!(!p.owners.is_empty(), "{what}: no owner reported");
            for (owner, s) in &p.owners {
                assert_eq!(s.applied, p.expected_per_owner, "{what}: the shard of rank {owner} applied {s}");
                assert_eq!(s.histogram.iter().sum::<u64>(), s.applied, "{what}: {s}");
                assert!(s.min <= s.max && s.sum >= s.min * s.applied && s.sum <= s.max * s.applied, "{what}: {s}");
            }
            let total = p.total();
            assert_eq!(total.applied, (world * STEPS * p.owners.len()) as u64, "{what}");
            println!("case {n} staleness max {} applied {}", total.max, total.applied);
            for line in p.lines() {
                println!("{line}");
            }
        } else {
            assert!(p.owners.is_empty(), "{what}: the staleness is gathered to rank 0 only");
        }
        println!("case {n} digest {:016x}", p.digest);
    }
    println!("rank {rank} ok: {} cases", kinds.len());
}

/// Launch `test` on `np` ranks; every rank passed and holds the same variables.
fn launch(test: &str, np: usize, cases: usize, env: &[(&str, &str)]) -> Option<String> {
    let (ok, text) = mpirun_self(test, np, env)?;
    assert!(ok, "mpirun failed:\n{text}");
    for r in 0..np {
        assert!(text.contains(&format!("rank {r} ok: {cases} cases")), "{text}");
    }
    for case in 0..cases {
        let tag = format!("case {case} digest ");
        let digests: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_once(tag.as_str()).map(|(_, d)| d.split_whitespace().next().unwrap_or("")))
            .collect();
        assert_eq!(digests.len(), np, "{text}");
        assert!(digests.iter().all(|d| *d == digests[0]), "case {case}: the ranks' variables differ: {digests:?}");
    }
    Some(text)
}

const ALL: [OptimizerKind; 5] =
    [OptimizerKind::Sgd, OptimizerKind::Momentum, OptimizerKind::Adam, OptimizerKind::RmsProp, OptimizerKind::Adagrad];

#[test]
fn two_async_ranks_train_with_every_optimizer_and_agree() {
    if under_mpirun() {
        return as_rank(&ALL);
    }
    launch("two_async_ranks_train_with_every_optimizer_and_agree", 2, ALL.len(), &[]);
}

#[test]
fn four_async_ranks_train_and_agree() {
    if under_mpirun() {
        return as_rank(&[OptimizerKind::Sgd, OptimizerKind::Adam]);
    }
    launch("four_async_ranks_train_and_agree", 4, 2, &[]);
}

#[test]
fn a_slowed_worker_makes_gradients_stale() {
    if under_mpirun() {
        return as_rank(&[OptimizerKind::Sgd]);
    }
    let env = [(towers::trainer::SLOW_WORKER_ENV, "1:25")];
    let Some(text) = launch("a_slowed_worker_makes_gradients_stale", 2, 1, &env) else { return };
    let max: u64 = text
        .lines()
        .find_map(|l| l.split_once("case 0 staleness max "))
        .and_then(|(_, r)| r.split_whitespace().next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("no staleness line:\n{text}"));
    assert!(max > 0, "rank 1 slept 25 ms per step, yet no gradient was stale:\n{text}");
}

// ---- typed refusals, through `towers train` --------------------------------

/// `towers train` in this process alone with `args`: (success, stderr).
fn train_alone(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_towers"))
        .args(["train", "--steps", "2", "--hidden", "8"])
        .args(args)
        .env_remove("OMPI_COMM_WORLD_SIZE")
        .output()
        .expect("towers runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
}

#[test]
fn ps_async_without_ps_variables_or_processes_is_refused_naming_the_flag() {
    let (ok, err) = train_alone(&["--ps-async"]);
    assert!(!ok && err.contains("--ps-async") && err.contains("needs --variables ps"), "{err}");
    let (ok, err) = train_alone(&["--ps-async", "--variables", "ps"]);
    assert!(!ok && err.contains("--ps-async") && err.contains("mpirun -np N"), "{err}");
}

/// The tensor names of a safetensors file.
fn tensor_names(path: &std::path::Path) -> Vec<String> {
    let bytes = std::fs::read(path).expect("the checkpoint exists");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("a whole safetensors file");
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    names
}

#[test]
fn an_async_checkpoint_is_whole_and_resumes_in_one_process() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, one) = (dir.path().join("async.safetensors"), dir.path().join("one.safetensors"));
    let flags = ["train", "--optimizer", "adam", "--lr", "0.005", "--hidden", "32", "--steps", "20"];
    let session = tempfile::tempdir().expect("a session folder");
    let out = Command::new("mpirun")
        .args(["-np", "2", "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_orte_tmpdir_base", session.path())
        .arg(env!("CARGO_BIN_EXE_towers"))
        .args(flags)
        .args(["--variables", "ps", "--ps-async", "--checkpoint", a.to_str().unwrap()])
        .output()
        .expect("mpirun starts");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("not exact") && err.contains("ps-async: 80 gradients over 2 shard(s)"), "{err}");
    let single = Command::new(env!("CARGO_BIN_EXE_towers"))
        .args(flags)
        .args(["--checkpoint", one.to_str().unwrap()])
        .env_remove("OMPI_COMM_WORLD_SIZE")
        .output()
        .expect("towers runs");
    assert!(single.status.success(), "{}", String::from_utf8_lossy(&single.stderr));
    // Every owner's Adam slots, as in the file of one process.
    assert_eq!(tensor_names(&a), tensor_names(&one));
    let resumed = Command::new(env!("CARGO_BIN_EXE_towers"))
        .args(["train", "--optimizer", "adam", "--lr", "0.005", "--hidden", "32", "--steps", "22", "--log-every", "1"])
        .args(["--checkpoint", a.to_str().unwrap(), "--resume"])
        .env_remove("OMPI_COMM_WORLD_SIZE")
        .output()
        .expect("towers runs");
    let text = String::from_utf8_lossy(&resumed.stdout);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert!(text.contains("step 21 ") && !text.contains("step 20 "), "resumes after step 20:\n{text}");
    let (ok, err) =
        train_alone(&["--ps-async", "--variables", "ps", "--checkpoint-every", "5", "--checkpoint", "x.st"]);
    assert!(!ok && err.contains("--ps-async") && err.contains("--checkpoint-every"), "{err}");
}

// ---- faults, through `towers train` ---------------------------------------

const TIMEOUT_S: u64 = 3;

/// The pid of the process of the job marked `marker` that is rank `rank`.
fn rank_pid(marker: &str, rank: usize) -> Option<u32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(env) = std::fs::read(e.path().join("environ")) else { continue };
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        if vars.contains(&marker.as_bytes()) && vars.contains(&want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// Whether `pid` has exited (gone, or a zombie).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => {
            s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()).is_some_and(|st| st == "Z" || st == "X")
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

/// Run `towers train --ps-async` on 2 ranks, signal rank 1 with `sig` after
/// 30 steps; rank 0 must exit within the timeout + 5 s. Returns the output.
fn fault(sig: &str, name: &str) -> Option<String> {
    if !have_mpirun() {
        return None;
    }
    let session = tempfile::tempdir().expect("a session folder");
    let marker = format!("TOWERS_PS_ASYNC_FAULT={name}-{}", std::process::id());
    let (key, value) = marker.split_once('=').unwrap();
    let mut child = Command::new("mpirun")
        .args(["-np", "2", "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_orte_tmpdir_base", session.path())
        .env(key, value)
        .arg(env!("CARGO_BIN_EXE_towers"))
        .args(["train", "--variables", "ps", "--ps-async", "--optimizer", "adam", "--hidden", "32"])
        .args(["--steps", "1000000", "--log-every", "1", "--comm-timeout", &TIMEOUT_S.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts");
    let text = Arc::new(Mutex::new(String::new()));
    let mut readers = Vec::new();
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let t = Arc::clone(&text);
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let mut s = t.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        }));
    }
    let t = Instant::now();
    while text.lock().unwrap().lines().filter(|l| l.starts_with("step ")).count() < 30 {
        assert!(t.elapsed() < Duration::from_secs(120), "no training progress:\n{}", text.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (r0, r1) = (rank_pid(&marker, 0).expect("rank 0 runs"), rank_pid(&marker, 1).expect("rank 1 runs"));
    signal(r1, sig);
    let t = Instant::now();
    let bound = Duration::from_secs(TIMEOUT_S + 5);
    while !exited(r0) && t.elapsed() < bound + Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = t.elapsed();
    signal(r1, "-KILL");
    signal(r0, "-KILL");
    let t = Instant::now();
    while child.try_wait().ok().flatten().is_none() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    for r in readers {
        let _ = r.join();
    }
    let out = text.lock().unwrap().clone();
    assert!(took <= bound, "{sig}: rank 0 ran {took:?} after rank 1 stopped (bound {bound:?})\n{out}");
    Some(out)
}

#[test]
fn a_stopped_async_rank_ends_the_other_within_the_comm_timeout_naming_it() {
    let Some(out) = fault("-STOP", "stop") else { return };
    assert!(out.contains("rank(s) [1]") && out.contains("never arrived"), "the error names rank 1:\n{out}");
}

#[test]
fn a_killed_async_rank_ends_the_other_naming_it() {
    let Some(out) = fault("-KILL", "kill") else { return };
    assert!(out.contains("rank 1") || out.contains("rank(s) [1]"), "the output names rank 1:\n{out}");
}
