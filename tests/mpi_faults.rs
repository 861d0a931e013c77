//! Faults under `mpirun -np 2 towers train` (`--features mpi`): a rank that
//! hangs (SIGSTOP inside a step) or dies (SIGKILL) never hangs the other.
//!
//! - SIGSTOP of rank 1: rank 0 exits within `--comm-timeout` + 5 s, and the
//!   job's error names rank 1 (the shared-memory reduce's barriers and the
//!   arrival check both have a deadline: runtime `comm::mpi_shared`).
//! - SIGKILL of rank 1: rank 0 exits within the same bound.
//! - In both, the checkpoint rank 0 writes periodically stays a whole
//!   safetensors file with every variable finite (saves are atomic).
//! - The same two faults under `--variables ps` (rank 1 an owner: its
//!   values' broadcasts and its slots' gather to rank 0 are collectives
//!   with the same deadline); the checkpoint holds both owners' slots.
//! - The same two faults of the parameter-server rank of `mpirun -np 3
//!   ... --ps-ranks 1` (rank 2 runs no towers and owns every slot): both
//!   workers end within the bound, the error names rank 2, and the
//!   checkpoint holds its slots.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TIMEOUT_S: u64 = 3;

fn have_mpirun() -> bool {
    if Command::new("mpirun").arg("--version").output().is_ok() {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "mpirun is missing under CI: .ci/run installs openmpi-bin");
    eprintln!("SKIPPED: mpirun not found (apt-get install libopenmpi-dev openmpi-bin)");
    false
}

/// The pid of the process of this test's job (`marker`) that is rank `rank`.
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

/// Whether `pid` has exited (gone, or a zombie its parent has not reaped).
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

struct Job {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    _session: tempfile::TempDir,
}

fn launch(marker: &str, ck: &Path, extra: &[&str], np: usize) -> Job {
    let session = tempfile::tempdir().expect("a session folder");
    let mut child = Command::new("mpirun")
        .args(["-np", &np.to_string(), "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_orte_tmpdir_base", session.path())
        .env(marker.split_once('=').unwrap().0, marker.split_once('=').unwrap().1)
        .arg(env!("CARGO_BIN_EXE_towers"))
        .args(["train", "--steps", "1000000", "--towers", "1", "--log-every", "1", "--comm-timeout"])
        .arg(TIMEOUT_S.to_string())
        .args(["--checkpoint", ck.to_str().unwrap(), "--checkpoint-every", "20", "--keep", "2"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts");
    let lines = Arc::new(Mutex::new(Vec::new()));
    let out = child.stdout.take().unwrap();
    let l = Arc::clone(&lines);
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            l.lock().unwrap().push(line);
        }
    });
    let stderr = Arc::new(Mutex::new(String::new()));
    let err = child.stderr.take().unwrap();
    let e = Arc::clone(&stderr);
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let mut s = e.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    Job { child, lines, stderr, _session: session }
}

/// Wait until rank 0 printed `steps` step lines (bounded).
fn wait_for_steps(job: &Job, steps: usize) {
    let t = Instant::now();
    while job.lines.lock().unwrap().iter().filter(|l| l.starts_with("step ")).count() < steps {
        assert!(t.elapsed() < Duration::from_secs(120), "no training progress: {}", job.stderr.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The checkpoint is a whole safetensors file whose f32 values are finite.
fn assert_intact(ck: &Path) {
    let bytes = std::fs::read(ck).expect("the periodic checkpoint exists");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("a whole safetensors file");
    assert!(st.names().iter().any(|n| *n == "global_step"));
    for (name, t) in st.tensors() {
        if t.dtype() == safetensors::Dtype::F32 {
            assert!(
                t.data().chunks_exact(4).all(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite()),
                "{name}"
            );
        }
    }
}

/// Fault rank 1 of 2 with `sig` inside a step; rank 0 must exit in time.
fn fault(sig: &str, name: &str, extra: &[&str]) -> Option<String> {
    fault_on(sig, name, extra, 2, 1)
}

/// Fault rank `victim` of `np` with `sig` inside a step; rank 0 must exit
/// in time, and the last checkpoint stays whole.
fn fault_on(sig: &str, name: &str, extra: &[&str], np: usize, victim: usize) -> Option<String> {
    if !have_mpirun() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("model.safetensors");
    let marker = format!("TOWERS_FAULT_TEST={name}-{}", std::process::id());
    let mut job = launch(&marker, &ck, extra, np);
    wait_for_steps(&job, 70);
    let (r0, r1) = (rank_pid(&marker, 0).expect("rank 0 runs"), rank_pid(&marker, victim).expect("the victim runs"));
    signal(r1, sig);
    let t = Instant::now();
    let bound = Duration::from_secs(TIMEOUT_S + 5);
    while !exited(r0) && t.elapsed() < bound + Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = t.elapsed();
    // Clean up whatever is left, then reap the launcher (bounded).
    signal(r1, "-KILL");
    signal(r0, "-KILL");
    for other in (1..np).filter(|r| *r != victim) {
        if let Some(pid) = rank_pid(&marker, other) {
            signal(pid, "-KILL");
        }
    }
    let t = Instant::now();
    while job.child.try_wait().ok().flatten().is_none() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = job.child.kill();
    let _ = job.child.wait();
    let stderr = job.stderr.lock().unwrap().clone();
    assert!(took <= bound, "{sig}: rank 0 ran {took:?} after rank {victim} stopped (bound {bound:?})\n{stderr}");
    assert_intact(&ck);
    if extra.contains(&"ps") {
        assert_whole_ps(&ck);
    }
    Some(stderr)
}

#[test]
fn a_stopped_rank_ends_the_other_within_the_comm_timeout_naming_it() {
    let Some(stderr) = fault("-STOP", "stop", &[]) else { return };
    assert!(stderr.contains("rank(s) [1]") && stderr.contains("never arrived"), "the error names rank 1:\n{stderr}");
}

#[test]
fn a_killed_rank_ends_the_other() {
    fault("-KILL", "kill", &[]);
}

/// `--variables ps` with Adam: rank 1 owns half the variables and their
/// slots, and takes part in every step's owner broadcasts and in each
/// checkpoint's gather of the slots to rank 0.
const PS: &[&str] = &["--variables", "ps", "--optimizer", "adam"];

/// The periodic checkpoint of a ps run holds both owners' Adam slots.
fn assert_whole_ps(ck: &Path) {
    let bytes = std::fs::read(ck).expect("the periodic checkpoint exists");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("a whole safetensors file");
    let weights = st.names().iter().filter(|n| n.ends_with("/weights") || n.ends_with("/biases")).count();
    let (m, v) = (
        st.names().iter().filter(|n| n.ends_with("/Adam")).count(),
        st.names().iter().filter(|n| n.ends_with("/Adam_1")).count(),
    );
    assert!(weights >= 2 && m == weights && v == weights, "{:?}", st.names());
}

#[test]
fn a_stopped_ps_rank_ends_the_other_within_the_comm_timeout_naming_it() {
    let Some(stderr) = fault("-STOP", "ps-stop", PS) else { return };
    assert!(stderr.contains("rank(s) [1]") && stderr.contains("never arrived"), "the error names rank 1:\n{stderr}");
}

#[test]
fn a_killed_ps_rank_ends_the_other() {
    fault("-KILL", "ps-kill", PS);
}

/// `--ps-ranks 1` on 3 processes: rank 2 is a parameter server running no
/// towers (it owns every variable and all the Adam slots); ranks 0 and 1
/// are workers.
const PS_RANK: &[&str] = &["--variables", "ps", "--ps-ranks", "1", "--optimizer", "adam"];

#[test]
fn a_stopped_ps_only_rank_ends_the_workers_within_the_comm_timeout_naming_it() {
    let Some(stderr) = fault_on("-STOP", "psrank-stop", PS_RANK, 3, 2) else { return };
    assert!(stderr.contains("rank(s) [2]") && stderr.contains("never arrived"), "the error names rank 2:\n{stderr}");
}

#[test]
fn a_killed_ps_only_rank_ends_the_workers() {
    fault_on("-KILL", "psrank-kill", PS_RANK, 3, 2);
}
