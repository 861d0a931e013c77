//! Crash tests of periodic checkpointing: `kill -9` at seeded random
//! moments of `towers train --checkpoint-every 1 --keep 3 --resume` never
//! leaves a torn checkpoint (every `.safetensors` file present after a kill
//! is whole, with finite values), the next start deletes the temporary
//! files a kill left, and the run resumed after every kill ends with the
//! same bytes as a run that was never killed, with no stray file beside
//! them.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const STEPS: &str = "150";

fn args(ck: &str) -> Vec<&str> {
    vec![
        "train",
        "--steps",
        STEPS,
        "--seed",
        "5",
        "--checkpoint",
        ck,
        "--checkpoint-every",
        "1",
        "--keep",
        "3",
        "--resume",
    ]
}

/// Every checkpoint file in `dir` is a whole safetensors file with finite values.
fn assert_whole(dir: &Path) -> usize {
    let mut temporaries = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".tmp") {
            temporaries += 1;
            continue;
        }
        let bytes = std::fs::read(&p).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{name} is torn: {e}"));
        for (t, v) in st.tensors() {
            if v.dtype() == safetensors::Dtype::F32 {
                let finite = v.data().chunks_exact(4).all(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite());
                assert!(finite, "{name}: {t} is not finite");
            }
        }
    }
    temporaries
}

#[test]
fn kill_9_during_periodic_checkpoints_leaves_no_torn_or_stray_file_and_resumes_exactly() {
    let bin = env!("CARGO_BIN_EXE_towers");
    let straight = tempfile::tempdir().unwrap();
    let reference = straight.path().join("x.safetensors");
    let t = std::time::Instant::now();
    let out = Command::new(bin).args(args(reference.to_str().unwrap())).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Kill moments scale with this machine's speed (fsyncs dominate): each
    // killed run gets between a 40th and a 10th of a whole run.
    // A run that ends before its kill (the machine got faster, e.g. a
    // neighbour stopped compiling) shortens the later delays.
    let mut whole = t.elapsed().as_millis() as u64;

    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("x.safetensors");
    let ck_s = ck.to_str().unwrap();
    // xorshift: seeded kill moments.
    let mut seed = 0x23_C2A5u64;
    let (mut kills, mut left_temporaries) = (0, 0);
    let mut runs = 0;
    while runs < 12 || (kills < 8 && runs < 30) {
        runs += 1;
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_millis(whole / 40 + seed % (whole / 10 - whole / 40).max(1));
        let mut child = Command::new(bin).args(args(ck_s)).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        std::thread::sleep(delay);
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            kills += 1;
        } else {
            whole = (whole * 2 / 3).max(40);
        }
        child.wait().unwrap();
        left_temporaries += assert_whole(dir.path());
    }
    // The last run finishes what remains.
    let out = Command::new(bin).args(args(ck_s)).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(assert_whole(dir.path()), 0, "no temporary file after a completed run");
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    names.sort();
    assert_eq!(
        names,
        ["x-148.safetensors", "x-149.safetensors", "x-150.safetensors", "x.safetensors"],
        "no stray file"
    );
    for n in &names {
        let (a, b) = (std::fs::read(dir.path().join(n)).unwrap(), std::fs::read(straight.path().join(n)).unwrap());
        assert!(a == b, "{n}: the resumed run's bytes differ from the run that was never killed");
    }
    eprintln!("crash test: {kills} kill -9s, {left_temporaries} temporary files seen right after a kill (each deleted at the next start), 0 torn files");
    assert!(kills >= 6, "most runs were killed mid-way: {kills}");
}
