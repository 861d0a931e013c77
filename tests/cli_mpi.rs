//! `mpirun -np 2 towers train` (`--features mpi`): two processes of one
//! tower train what one process trains on the whole batch, rank 0 alone
//! prints and writes the checkpoint, and every rank resumes from it.
//!
//! Tolerance: the printed losses (6 decimals) agree within 1e-4 relative
//! after 60 steps (the same float reassociation as the in-process towers,
//! compounded over the steps); the test accuracy is printed once.

mod cli_support;

use std::process::Command;

use cli_support::{accuracy, towers};

/// `mpirun -np 2 towers ARGS`; None when mpirun is missing outside CI.
fn mpirun_towers(args: &[&str]) -> Option<(bool, String, String)> {
    mpirun_towers_np(2, args)
}

/// `mpirun -np NP towers ARGS`; None when mpirun is missing outside CI.
fn mpirun_towers_np(np: usize, args: &[&str]) -> Option<(bool, String, String)> {
    if Command::new("mpirun").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "mpirun is missing under CI: .ci/run installs openmpi-bin");
        eprintln!("SKIPPED: mpirun not found (apt-get install libopenmpi-dev openmpi-bin)");
        return None;
    }
    // A session folder of its own: the tests' launchers start at once and
    // would otherwise race on Open MPI's shared one under /tmp.
    let session = tempfile::tempdir().expect("a session folder");
    let out = Command::new("mpirun")
        .args(["-np", &np.to_string(), "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_orte_tmpdir_base", session.path())
        .arg(env!("CARGO_BIN_EXE_towers"))
        .args(args)
        .output()
        .expect("mpirun starts");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    Some((out.status.success(), stdout, stderr))
}

fn losses(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter_map(|l| {
            l.strip_prefix("step ")
                .and_then(|r| r.split_once(" loss "))
                .map(|(_, v)| v.split_whitespace().next().unwrap().parse().unwrap())
        })
        .collect()
}

#[test]
fn two_mpi_processes_train_what_one_process_trains() {
    let common = ["train", "--steps", "60", "--log-every", "20", "--batch", "64", "--optimizer", "adam"];
    let (single, _) = towers(&common);
    let mut args = common.to_vec();
    args.extend(["--towers", "1"]);
    let Some((ok, stdout, stderr)) = mpirun_towers(&args) else { return };
    assert!(ok, "mpirun towers failed:\n{stderr}\n{stdout}");
    assert!(stderr.contains("MPI, rank 0 of 2"), "{stderr}");
    let (a, b) = (losses(&stdout), losses(&single));
    assert_eq!(a.len(), 3, "rank 0 alone logs: {stdout}");
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-4 * y.abs().max(1.0), "loss {x} vs one process's {y}\n{stdout}");
    }
    assert_eq!(stdout.matches("test accuracy").count(), 1, "{stdout}");
    assert!((accuracy(&stdout) - accuracy(&single)).abs() <= 0.01, "{stdout}\nvs\n{single}");
    // The training accuracy is the whole global batch's (both ranks' rows):
    // a count over 64 rows, which one prediction flipped by reassociation
    // may move by 1/64.
    let (a, b) = (train_accs(&stdout), train_accs(&single));
    assert_eq!(a.len(), 3, "{stdout}");
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1.5 / 64.0, "train acc {x} vs one process's {y}\n{stdout}");
    }
}

/// The `train acc A` of each `step N loss L train acc A` line.
fn train_accs(stdout: &str) -> Vec<f64> {
    stdout.lines().filter_map(|l| l.split_once(" train acc ").and_then(|(_, a)| a.trim().parse().ok())).collect()
}

#[test]
fn rank_zero_writes_the_checkpoint_and_every_rank_resumes_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("model.safetensors");
    let ckpt = ckpt.to_str().unwrap();
    // A constant rate: the default cosine schedule spans --steps, which the
    // first run shortens.
    let first = [
        "train",
        "--steps",
        "20",
        "--batch",
        "32",
        "--towers",
        "1",
        "--checkpoint",
        ckpt,
        "--keep",
        "3",
        "--lr-schedule",
        "constant",
    ];
    let Some((ok, stdout, stderr)) = mpirun_towers(&first) else { return };
    assert!(ok, "{stderr}\n{stdout}");
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    // One checkpoint and its step-stamped copy: written once, by rank 0.
    assert_eq!(files.len(), 2, "{files:?}");
    let resumed = [
        "train",
        "--steps",
        "40",
        "--batch",
        "32",
        "--towers",
        "1",
        "--checkpoint",
        ckpt,
        "--resume",
        "--log-every",
        "40",
        "--lr-schedule",
        "constant",
    ];
    let (ok, stdout, stderr) = mpirun_towers(&resumed).unwrap();
    assert!(ok, "{stderr}\n{stdout}");
    // The same 40 steps in one process, without stopping.
    let (straight, _) =
        towers(&["train", "--steps", "40", "--batch", "32", "--log-every", "40", "--lr-schedule", "constant"]);
    let (a, b) = (losses(&stdout), losses(&straight));
    assert_eq!(a.len(), 1, "{stdout}");
    assert!((a[0] - b[0]).abs() <= 1e-4 * b[0].abs().max(1.0), "resumed {a:?} vs straight {b:?}");
}

#[test]
fn a_weighted_split_over_both_ranks_towers_and_a_wrong_one_is_an_error_on_every_rank() {
    let args = ["train", "--steps", "5", "--batch", "32", "--towers", "1", "--split-weights", "3,1"];
    let Some((ok, stdout, stderr)) = mpirun_towers(&args) else { return };
    assert!(ok, "{stderr}\n{stdout}");
    let bad = ["train", "--steps", "5", "--batch", "32", "--towers", "1", "--split-weights", "3,1,1"];
    let (ok, _, stderr) = mpirun_towers(&bad).unwrap();
    assert!(!ok);
    assert!(stderr.contains("gives 3 weights for 2 towers (1 per process x 2 processes"), "{stderr}");
}

/// The arguments as `&str`s.
fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The tensors (name -> (shape, f32 bits or i32 values as bits)) of a safetensors file.
fn tensors(path: &std::path::Path) -> std::collections::BTreeMap<String, (Vec<usize>, Vec<u32>)> {
    let data = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&data).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, t)| {
            let words = t.data().chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            (n, (t.shape().to_vec(), words))
        })
        .collect()
}

/// `mpirun -np 2 towers train --variables ps`: each rank keeps only its own
/// optimizer slots (it says so), trains what the all-reduce path trains and
/// writes, from rank 0, the very file the all-reduce path writes (the other
/// owner's slots gathered in), with the tensors of a one-process file; that
/// checkpoint resumes in one process, on two all-reduce ranks and on two ps
/// ranks with another --ps-tasks, each ending where one process ends.
#[test]
fn ps_ranks_train_exactly_and_their_whole_checkpoint_resumes_under_any_layout() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (ps, ar, one) = (path("ps.safetensors"), path("ar.safetensors"), path("one.safetensors"));
    let args = |steps: &'static str, ckpt: &str, extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> =
            ["train", "--steps", steps, "--batch", "32", "--optimizer", "adam", "--log-every", "10"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        a.extend(["--lr-schedule", "constant", "--checkpoint", ckpt].iter().map(|s| s.to_string()));
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let Some((ok, ps_out, stderr)) = mpirun_towers(&strs(&args("10", &ps, &["--towers", "1", "--variables", "ps"])))
    else {
        return;
    };
    assert!(ok, "{stderr}\n{ps_out}");
    let line = stderr.lines().find(|l| l.contains("ps: rank 0 holds")).unwrap_or_else(|| panic!("{stderr}"));
    let nums: Vec<usize> = line.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    // "ps: rank 0 holds M B of optimizer slots of T B in all (T-M B fewer ...)"
    let (mine, all, fewer) = (nums[1], nums[2], nums[3]);
    assert!(mine > 0 && mine < all && fewer == all - mine, "{line}");
    // Gradients reach their owner only: the sums rank 0 receives are what it
    // sends less the gradients of the variables it receives the values of.
    let line = stderr.lines().find(|l| l.starts_with("exchange: rank 0 ")).unwrap_or_else(|| panic!("{stderr}"));
    let nums: Vec<usize> = line.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    // "exchange: rank 0 sends G B ... (all-reduces A B in N bucket(s), reduces D B ... in M bucket(s))
    //  and receives H B of sums, broadcasts S B of values and receives V B; it holds O B ..."
    let (sent, all_reduced, reduced, sums, values_in) = (nums[1], nums[2], nums[4], nums[6], nums[8]);
    assert!(reduced > 0 && all_reduced + reduced == sent, "{line}");
    assert_eq!(sums + values_in, sent, "{line}");
    let (ok, ar_out, stderr) =
        mpirun_towers(&strs(&args("10", &ar, &["--towers", "1", "--variables", "cpu"]))).unwrap();
    assert!(ok, "{stderr}\n{ar_out}");
    assert_eq!(losses(&ps_out), losses(&ar_out), "ps vs all-reduce:\n{ps_out}\n{ar_out}");
    assert!(
        std::fs::read(&ps).unwrap() == std::fs::read(&ar).unwrap(),
        "the ps checkpoint differs from the all-reduce one"
    );
    let (out, _) = towers(&strs(&args("10", &one, &[])));
    let shapes = |m: &std::collections::BTreeMap<String, (Vec<usize>, Vec<u32>)>| {
        m.iter().map(|(n, (s, _))| (n.clone(), s.clone())).collect::<Vec<_>>()
    };
    assert_eq!(
        shapes(&tensors(dir.path().join("ps.safetensors").as_path())),
        shapes(&tensors(dir.path().join("one.safetensors").as_path())),
        "{out}"
    );
    // Resumed to 20 steps under three other layouts, against 20 steps in one process.
    let (straight, _) = towers(&strs(&args("20", &path("straight.safetensors"), &[])));
    let want = losses(&straight);
    let layouts: [&[&str]; 3] =
        [&[], &["--towers", "1", "--variables", "cpu"], &["--towers", "1", "--variables", "ps", "--ps-tasks", "3"]];
    for (i, extra) in layouts.iter().enumerate() {
        let copy = path(&format!("resume{i}.safetensors"));
        std::fs::copy(&ps, &copy).unwrap();
        let mut a = args("20", &copy, extra);
        a.push("--resume".into());
        let (ok, stdout, stderr) = if i == 0 {
            let (o, e) = towers(&strs(&a));
            (true, o, e)
        } else {
            mpirun_towers(&strs(&a)).unwrap()
        };
        assert!(ok, "layout {extra:?}: {stderr}\n{stdout}");
        let got = losses(&stdout);
        let (x, y) = (got.last().copied().unwrap(), want.last().copied().unwrap());
        assert!((x - y).abs() <= 1e-4 * y.abs().max(1.0), "layout {extra:?}: resumed {got:?} vs straight {want:?}");
    }
}

/// `mpirun -np 3 towers train --variables ps --ps-ranks 1`: 2 workers and a
/// parameter-server rank that runs no towers; its losses equal the
/// co-located run on 2 ranks (within the equivalence tolerance; the ps
/// rank adds -0.0 to each sum, so they are in fact the same), it writes
/// the same checkpoint, and the flag's misuses are refused naming it.
#[test]
fn a_separate_ps_rank_trains_what_the_colocated_ps_ranks_train() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (sep, colo) = (path("sep.safetensors"), path("colo.safetensors"));
    let args = |ckpt: &str, extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["train", "--steps", "10", "--batch", "32", "--optimizer", "adam", "--log-every", "2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["--towers", "1", "--variables", "ps", "--checkpoint", ckpt].iter().map(|s| s.to_string()));
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let Some((ok, sep_out, stderr)) = mpirun_towers_np(3, &strs(&args(&sep, &["--ps-ranks", "1"]))) else { return };
    assert!(ok, "{stderr}\n{sep_out}");
    let (ok, colo_out, stderr) = mpirun_towers(&strs(&args(&colo, &[]))).unwrap();
    assert!(ok, "{stderr}\n{colo_out}");
    let (a, b) = (losses(&sep_out), losses(&colo_out));
    assert!(a.len() == 5 && a.len() == b.len(), "{sep_out}\n{colo_out}");
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-4 * y.abs().max(1.0), "--ps-ranks 1 {a:?} vs co-located {b:?}");
    }
    assert!(std::fs::read(&sep).unwrap() == std::fs::read(&colo).unwrap(), "the checkpoints differ");
    let (ok, _, stderr) = mpirun_towers(&strs(&args(&path("x.safetensors"), &["--ps-ranks", "2"]))).unwrap();
    assert!(!ok && stderr.contains("--ps-ranks 2") && stderr.contains("worker"), "{stderr}");
    let mut cpu = args(&path("y.safetensors"), &["--ps-ranks", "1"]);
    let at = cpu.iter().position(|s| s == "ps").unwrap();
    cpu[at] = "cpu".into();
    let (ok, _, stderr) = mpirun_towers(&strs(&cpu)).unwrap();
    assert!(!ok && stderr.contains("--ps-ranks 1 needs --variables ps"), "{stderr}");
}
