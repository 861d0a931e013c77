//! Files the CLI writes besides checkpoints (`--trace`, `--plot`,
//! `compile -o`, `--emit cuda -o DIR`, `--dump-dir`): checked before any
//! work, written atomically.
//!
//! Invariants:
//! - A path is checked up front ([`check_file`], [`check_dir`]): its folder
//!   exists and is a folder this process can create files in (probed by
//!   creating and removing one), and the path itself, when it exists, is a
//!   regular file (a folder for [`check_dir`]). A bad path is an error
//!   naming its flag before a run starts, never after it ends.
//! - Every write goes through [`write_atomic`] (the runtime's: temporary
//!   file in the same folder, fsync, rename; the temporary removed on
//!   error), so a full disk or a crash never leaves a torn file and a good
//!   file is never truncated first.
//! - No two paths of one run name the same file ([`check_distinct`]): an
//!   output never replaces an input (`compile --graph m.json -o m.json`
//!   replaced the model with the plan) nor another output of the run.

use std::path::{Path, PathBuf};

use towers_runtime::checkpoint::not_regular;

/// Write `bytes` to `path` atomically (see the module docs).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(kind) = not_regular(path) {
        return Err(std::io::Error::other(format!("{} is {kind}, not a regular file", path.display())));
    }
    towers_runtime::checkpoint::write_atomic(path, bytes)
}

/// The folder a file `path` goes into ("." for a bare name).
fn folder(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// The file `path` names, comparable with another path's: its folder
/// canonicalised (symbolic links, `..`, `./`) joined with its file name,
/// and a symbolic link to a file followed; `path` itself when its folder
/// does not exist (refused elsewhere).
pub fn identity(path: &Path) -> PathBuf {
    match (std::fs::canonicalize(folder(path)), path.file_name()) {
        (Ok(dir), Some(name)) => {
            let p = dir.join(name);
            std::fs::canonicalize(&p).unwrap_or(p)
        }
        _ => path.to_path_buf(),
    }
}

/// Refuse two paths of one run that name the same file, each given as
/// (flag, path, whether the run reads it): an output on an input, or two
/// outputs on one path (`--checkpoint c.st --trace c.st` kept one of them).
/// Two inputs may share a file.
pub fn check_distinct(paths: &[(&str, &Path, bool)]) -> Result<(), String> {
    for (i, &(fa, pa, ra)) in paths.iter().enumerate() {
        for &(fb, pb, rb) in &paths[..i] {
            if (ra && rb) || identity(pa) != identity(pb) {
                continue;
            }
            return Err(match (ra, rb) {
                (true, _) | (_, true) => {
                    let (out, inp) = if ra { (fb, fa) } else { (fa, fb) };
                    let p = if ra { pb } else { pa };
                    format!(
                        "--{out} {} is the --{inp} file this run reads: writing it would replace it; give --{out} another path",
                        p.display()
                    )
                }
                _ => format!(
                    "--{fb} {} and --{fa} {} are the same file: one would replace the other; give each its own path",
                    pb.display(),
                    pa.display()
                ),
            });
        }
    }
    Ok(())
}

/// Check that the file `path` of `--flag` can be written (see the module
/// docs); the error names the flag and says what to do.
pub fn check_file(flag: &str, path: &Path) -> Result<(), String> {
    let p = path.display();
    if path.as_os_str().is_empty() || path.file_name().is_none() {
        return Err(format!("--{flag} '{p}': give a file name"));
    }
    let dir = folder(path);
    if !dir.exists() {
        return Err(format!("--{flag} {p}: the folder {} does not exist; create it first", dir.display()));
    }
    if !dir.is_dir() {
        return Err(format!("--{flag} {p}: {} is not a folder", dir.display()));
    }
    if let Some(kind) = not_regular(path) {
        return Err(format!("--{flag} {p}: is {kind}, not a regular file; give the path of a file"));
    }
    writable(flag, &p.to_string(), dir)
}

/// Whether files can be created in the existing folder `dir`: create and
/// remove one (permissions alone do not tell: root, read-only mounts, ACLs).
fn writable(flag: &str, p: &str, dir: &Path) -> Result<(), String> {
    let probe = dir.join(format!(".towers-write-check.{}", std::process::id()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(format!(
            "--{flag} {p}: cannot create files in the folder {}: {e}; choose a folder you can write to",
            dir.display()
        )),
    }
}

/// Whether `name` is a file the pass dumps write: `NN-<pass>.txt` or `.dot`.
fn is_dump_file(name: &str) -> bool {
    let Some((stem, ext)) = name.rsplit_once('.') else { return false };
    let Some((n, pass)) = stem.split_once('-') else { return false };
    matches!(ext, "txt" | "dot")
        && n.len() == 2
        && n.bytes().all(|b| b.is_ascii_digit())
        && !pass.is_empty()
        && pass.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

/// Remove the pass dumps (`NN-<pass>.txt|dot`) a previous run left in
/// `--dump-dir`, so that the folder holds this compile's dumps only (a
/// 2-tower run's `10-place.dot` stayed beside a 1-tower run's `06-place.dot`).
/// Other files are left alone; a folder that does not exist is fine.
pub fn clear_stale_dumps(dir: &Path) -> Result<(), String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if is_dump_file(&name) && e.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::remove_file(e.path()).map_err(|err| {
                format!("--dump-dir {}: cannot remove the previous run's dump {name}: {err}", dir.display())
            })?;
        }
    }
    Ok(())
}

/// The `.cu` files an `index.txt` that `--emit cuda` wrote names (none
/// when `dir` holds no such index).
pub fn cuda_files_of_index(dir: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(dir.join("index.txt")) else { return Vec::new() };
    if !text.starts_with("# CUDA kernels of program") {
        return Vec::new();
    }
    let mut files: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_once(": ")?.1.split_whitespace().next())
        .filter(|f| f.ends_with(".cu") && !f.contains('/'))
        .map(String::from)
        .collect();
    files.sort();
    files.dedup();
    files
}

/// Check that the folder `path` of `--flag` exists or can be created: it is
/// a folder when it exists, else its nearest existing ancestor is one.
pub fn check_dir(flag: &str, path: &Path) -> Result<(), String> {
    let p = path.display();
    if path.as_os_str().is_empty() {
        return Err(format!("--{flag}: give a folder"));
    }
    let mut at = Some(path);
    while let Some(a) = at {
        let a = if a.as_os_str().is_empty() { Path::new(".") } else { a };
        if a.exists() {
            return if a.is_dir() {
                writable(flag, &p.to_string(), a)
            } else if a == path {
                Err(format!("--{flag} {p}: exists and is not a folder; give a folder"))
            } else {
                Err(format!("--{flag} {p}: {} is not a folder", a.display()))
            };
        }
        at = a.parent();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_paths_name_their_flag() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let e = check_file("plot", &d.join("missing/x.svg")).unwrap_err();
        assert!(e.starts_with("--plot ") && e.contains("does not exist"), "{e}");
        let e = check_file("trace", d).unwrap_err();
        assert!(e.contains("is a folder"), "{e}");
        let e = check_file("trace", Path::new("/dev/null")).unwrap_err();
        assert!(e.contains("a character device"), "{e}");
        check_file("trace", &d.join("t.json")).expect("a new file in an existing folder");
        std::fs::write(d.join("f"), b"").unwrap();
        let e = check_dir("dump-dir", &d.join("f/sub")).unwrap_err();
        assert!(e.contains("is not a folder"), "{e}");
        check_dir("dump-dir", &d.join("a/b/c")).expect("created on demand");
        // A folder no file can be created in (even by root): refused up front.
        let e = check_file("checkpoint", Path::new("/proc/model.safetensors")).unwrap_err();
        assert!(e.starts_with("--checkpoint ") && e.contains("cannot create files in the folder /proc"), "{e}");
        let e = check_dir("logdir", Path::new("/proc/runs/a")).unwrap_err();
        assert!(e.starts_with("--logdir ") && e.contains("cannot create files"), "{e}");
        assert_eq!(std::fs::read_dir(d).unwrap().count(), 1, "the probe leaves no file behind");
    }

    #[test]
    fn atomic_writes_replace_the_file_and_leave_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("out.txt");
        write_atomic(&f, b"one").unwrap();
        write_atomic(&f, b"two").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary left");
        // A folder in the way: an error, and no temporary left either.
        std::fs::create_dir(dir.path().join("d")).unwrap();
        assert!(write_atomic(&dir.path().join("d"), b"x").is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    /// An output on an input, or two outputs on one file (through `./`,
    /// `..` or a symbolic link), are refused naming both flags; two inputs
    /// may share a file.
    #[test]
    fn outputs_never_replace_an_input_or_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("m.json"), b"{}").unwrap();
        let m = d.join("m.json");
        let via_dots = d.join("sub/../m.json");
        let e = check_distinct(&[("graph", &m, true), ("output", &via_dots, false)]).unwrap_err();
        assert!(e.contains("--output") && e.contains("is the --graph file this run reads"), "{e}");
        assert!(e.contains("give --output another path"), "{e}");
        let (c, t) = (d.join("c.st"), d.join("./c.st"));
        let e = check_distinct(&[("checkpoint", &c, false), ("trace", &t, false)]).unwrap_err();
        assert!(e.contains("--checkpoint") && e.contains("--trace") && e.contains("are the same file"), "{e}");
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&m, d.join("link.json")).unwrap();
            let l = d.join("link.json");
            assert!(check_distinct(&[("graph", &m, true), ("output", &l, false)]).is_err());
        }
        check_distinct(&[("graph", &m, true), ("checkpoint", &m, true)]).expect("two inputs");
        check_distinct(&[("graph", &m, true), ("output", &c, false)]).expect("distinct files");
    }

    /// A reused `--dump-dir` loses the previous dumps, and only them.
    #[test]
    fn stale_dumps_are_removed_and_other_files_kept() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for f in ["10-place.dot", "04-replicate.txt", "notes.txt", "1-x.txt", "05-Mine.txt", "06-place.svg"] {
            std::fs::write(d.join(f), b"").unwrap();
        }
        clear_stale_dumps(d).unwrap();
        let mut left: Vec<String> =
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
        left.sort();
        assert_eq!(left, ["05-Mine.txt", "06-place.svg", "1-x.txt", "notes.txt"]);
        clear_stale_dumps(&d.join("absent")).expect("a missing folder is fine");
    }
}
