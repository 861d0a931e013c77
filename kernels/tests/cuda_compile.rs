//! Every CUDA source compiles with NVRTC to PTX for `compute_80` and
//! `compute_90` and to cubins for `sm_80` and `sm_90` (what the backend loads),
//! defines every entry point the registry names, and, where
//! `ptxas` is on PATH, assembles for `sm_80` and `sm_90` without error
//! (`ptxas -v` prints registers, spills and shared memory per kernel).
//!
//! With ptxas, each function's registers, stack, spills and shared memory
//! per architecture are kept in an insta snapshot
//! (`snapshots/cuda_compile__ptxas_resources.snap`), so a change that makes
//! a kernel spill or grow shows up in review (NVRTC and ptxas are pinned to
//! 13.0.88 by .ci/run, so the figures are the same on every machine).
//!
//! Without NVRTC the test prints a loud SKIPPED message and passes, unless
//! `CI` is set: then it fails. `.ci/run` installs NVRTC and ptxas from PyPI.

mod common;

use std::path::PathBuf;
use std::process::Command;

use towers_kernels::cuda::{KERNELS, SOURCES};

const ARCHS: [(&str, &str); 2] = [("compute_80", "sm_80"), ("compute_90", "sm_90")];

fn ptxas() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("ptxas")).find(|p| p.is_file())
}

#[test]
fn every_source_compiles_with_nvrtc_and_assembles_with_ptxas() {
    if !common::nvrtc_present() {
        common::skip("cuda_compile", "libnvrtc (libnvrtc.so / libnvrtc.so.13) was not found on LD_LIBRARY_PATH.");
        return;
    }
    let (major, minor) = common::nvrtc_version();
    eprintln!("NVRTC {major}.{minor}");
    let ptxas = ptxas();
    match &ptxas {
        Some(p) => eprintln!("ptxas: {}", p.display()),
        None if common::in_ci() => panic!("CI is set but ptxas is not on PATH (see .ci/run)"),
        None => eprintln!("\n===== ptxas not on PATH: PTX is not assembled (SKIPPED part) =====\n"),
    }
    let dir = std::env::temp_dir().join(format!("towers-cuda-compile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut failures = Vec::new();
    // (arch, function, resources) of every function ptxas assembled.
    let mut resources: Vec<(String, String, String)> = Vec::new();
    for src in SOURCES {
        for (virt, real) in ARCHS {
            let t = std::time::Instant::now();
            let ptx = match common::compile(src.path, src.code, virt, &[]) {
                Ok(c) => c,
                Err(e) => {
                    failures.push(e);
                    continue;
                }
            };
            let text = String::from_utf8_lossy(&ptx.image).trim_end_matches('\0').to_string();
            for k in KERNELS.iter().filter(|k| k.family == Some(src.family)) {
                for e in k.entries {
                    if !text.contains(&format!(".entry {e}(")) {
                        failures
                            .push(format!("{}: entry point {e} of kernel {} missing from the PTX", src.path, k.kernel));
                    }
                }
            }
            let nvrtc_ms = t.elapsed().as_millis();
            // The path the CUDA backend takes at load: NVRTC straight to a cubin for the real architecture.
            match common::compile(src.path, src.code, real, &[]) {
                Ok(c) if c.image.len() > 16 && c.image[..4] == [0x7f, b'E', b'L', b'F'] => {}
                Ok(_) => failures.push(format!("{}: NVRTC returned no ELF cubin for {real}", src.path)),
                Err(e) => failures.push(e),
            }
            let Some(ptxas) = &ptxas else {
                eprintln!("{:<28} {virt}: PTX {} bytes ({nvrtc_ms} ms)", src.path, text.len());
                continue;
            };
            let file = dir.join(format!("{}-{virt}.ptx", src.family));
            std::fs::write(&file, &text).unwrap();
            let out = Command::new(ptxas)
                .arg(format!("-arch={real}"))
                .arg("-v")
                .arg(&file)
                .arg("-o")
                .arg(dir.join(format!("{}-{real}.cubin", src.family)))
                .output()
                .expect("run ptxas");
            let log = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() {
                failures.push(format!("ptxas -arch={real} failed on {} (PTX from {virt}):\n{log}", src.path));
                continue;
            }
            let spills = log.lines().filter(|l| l.contains("spill") && !l.contains(" 0 bytes spill stores")).count();
            let regs: Vec<u32> =
                log.lines().filter_map(|l| l.split("Used ").nth(1)?.split(' ').next()?.parse().ok()).collect();
            eprintln!(
                "{:<28} {virt} -> {real}: PTX {} bytes ({nvrtc_ms} ms), {} functions, max {} registers, {} with spills",
                src.path,
                text.len(),
                regs.len(),
                regs.iter().max().unwrap_or(&0),
                spills
            );
            if std::env::var_os("TOWERS_PTXAS_LOG").is_some() {
                eprintln!("{log}");
            }
            resources.extend(function_resources(&log, real));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n\n"));
    if ptxas.is_some() {
        resources.sort();
        let table: String = resources.iter().map(|(arch, f, r)| format!("{arch} {f}: {r}\n")).collect();
        insta::assert_snapshot!("ptxas_resources", table);
    }
}

/// Per function of a `ptxas -v` log: "N registers, S B stack, spill stores
/// A B, spill loads B B, smem C B" (shared memory only when used).
fn function_resources(log: &str, arch: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            current = Some((rest.trim().to_string(), String::new()));
        } else if let (Some((_, props)), true) = (current.as_mut(), line.contains("bytes stack frame")) {
            let nums: Vec<&str> = line.split_whitespace().filter(|w| w.parse::<u64>().is_ok()).collect();
            if let [stack, stores, loads] = nums[..] {
                *props = format!("{stack} B stack, spill stores {stores} B, spill loads {loads} B");
            }
        } else if let Some(used) = line.split("Used ").nth(1) {
            if let Some((f, props)) = current.take() {
                let regs = used.split(' ').next().unwrap_or("?");
                let smem = used
                    .split(", ")
                    .find_map(|p| p.strip_suffix(" bytes smem"))
                    .map(|b| format!(", smem {b} B"))
                    .unwrap_or_default();
                out.push((arch.to_string(), f, format!("{regs} registers, {props}{smem}")));
            }
        }
    }
    out
}
