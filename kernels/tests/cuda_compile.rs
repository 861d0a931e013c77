//! Every CUDA source compiles with NVRTC to PTX for `compute_80` and
//! `compute_90` and to cubins for `sm_80` and `sm_90` (what the backend loads),
//! defines every entry point `towers_kernels::launch::entries` names, and, where
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

use towers_kernels::cuda::sources;
use towers_kernels::launch::entries;

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
    for src in sources() {
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
            for e in entries::all().filter(|e| e.family == src.family) {
                if !text.contains(&format!(".entry {}(", e.name)) {
                    failures.push(format!("{}: launch entry point {} missing from the PTX", src.path, e.name));
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

/// Kernels generated from fused expressions (`cuda::fused_source`): every
/// unary op and its gradient, all four binary ops, constants and repeated
/// inputs; each compiles with NVRTC to PTX and cubins for both
/// architectures, defines its entry point, and assembles with ptxas without
/// spilling.
#[test]
fn generated_fused_kernels_compile_and_assemble() {
    if !common::nvrtc_present() {
        common::skip(
            "cuda_compile (fused)",
            "libnvrtc (libnvrtc.so / libnvrtc.so.13) was not found on LD_LIBRARY_PATH.",
        );
        return;
    }
    use towers_kernels::elementwise::{FusedExpr, FusedStep};
    use towers_kernels::{BinaryOp, UnaryOp};
    let mut exprs: Vec<FusedExpr> = vec![
        "ew[$0;$1;mul:0:1;$2;mul:0:3;sigmoid_grad:4:1;add:2:5]".parse().unwrap(),
        "ew[$0;$1;add:0:1;$2;mul:2:3;$3;div:4:5;tanh:6;tanh_grad:0:7]".parse().unwrap(),
        "ew[$0;c3f000000;mul:0:1;relu:2]".parse().unwrap(),
    ];
    let mut all = vec![FusedStep::Input(0), FusedStep::Input(1)];
    for (i, op) in UnaryOp::ALL.iter().enumerate() {
        let prev = all.len() as u8 - 1;
        all.push(FusedStep::Unary(*op, prev));
        all.push(FusedStep::UnaryGrad(*op, 1, prev + 1));
        all.push(FusedStep::Binary(BinaryOp::ALL[i % 4], prev + 2, 0));
        if all.len() > 18 {
            exprs.push(
                FusedExpr::new(std::mem::replace(&mut all, vec![FusedStep::Input(0), FusedStep::Input(1)])).unwrap(),
            );
        }
    }
    if all.len() > 2 {
        exprs.push(FusedExpr::new(all).unwrap());
    }
    let ptxas = ptxas();
    if ptxas.is_none() && common::in_ci() {
        panic!("CI is set but ptxas is not on PATH (see .ci/run)");
    }
    let dir = std::env::temp_dir().join(format!("towers-cuda-fused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut failures = Vec::new();
    for e in &exprs {
        let g = towers_kernels::cuda::fused_source(e);
        for (virt, real) in ARCHS {
            let ptx = match common::compile(g.source.path, g.source.code, virt, &[]) {
                Ok(c) => String::from_utf8_lossy(&c.image).trim_end_matches('\0').to_string(),
                Err(err) => {
                    failures.push(format!("{e}: {err}"));
                    continue;
                }
            };
            if !ptx.contains(&format!(".entry {}(", g.entry)) {
                failures.push(format!("{e}: entry point {} missing from the PTX", g.entry));
            }
            match common::compile(g.source.path, g.source.code, real, &[]) {
                Ok(c) if c.image.len() > 16 && c.image[..4] == [0x7f, b'E', b'L', b'F'] => {}
                Ok(_) => failures.push(format!("{e}: NVRTC returned no ELF cubin for {real}")),
                Err(err) => failures.push(format!("{e}: {err}")),
            }
            let Some(ptxas) = &ptxas else { continue };
            let file = dir.join(format!("{}-{virt}.ptx", g.source.family));
            std::fs::write(&file, &ptx).unwrap();
            let out = Command::new(ptxas)
                .arg(format!("-arch={real}"))
                .arg("-v")
                .arg(&file)
                .arg("-o")
                .arg(dir.join(format!("{}-{real}.cubin", g.source.family)))
                .output()
                .expect("run ptxas");
            let log = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() {
                failures.push(format!("ptxas -arch={real} failed on {e}:\n{log}"));
                continue;
            }
            let mine = function_resources(&log, real).into_iter().find(|(_, f, _)| f == g.entry);
            match mine {
                Some((_, _, r)) if r.contains("spill stores 0 B, spill loads 0 B") => {
                    eprintln!("{} {real}: {r} ({})", g.entry, e.tree());
                }
                Some((_, _, r)) => failures.push(format!("{e} spills on {real}: {r}")),
                None => failures.push(format!("{e}: ptxas printed nothing for {}", g.entry)),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n\n"));
}

/// An op code no table has writes NaN, never another op's value: a probe
/// kernel calling the generated switches (the prelude every source starts
/// with) with constant codes compiles with NVRTC, and the constants it
/// stores are NaN for the unknown codes and the ops' own values for codes
/// taken from the tables (`Neg.code()` on 2.0 gives -2.0, `Mul.code()` on
/// 3.0 and 4.0 gives 12.0): NVRTC folds each switch to the one case its
/// code selects.
#[test]
fn unknown_op_codes_compile_to_nan() {
    if !common::nvrtc_present() {
        common::skip(
            "cuda_compile (op codes)",
            "libnvrtc (libnvrtc.so / libnvrtc.so.13) was not found on LD_LIBRARY_PATH.",
        );
        return;
    }
    use towers_kernels::{BinaryOp, UnaryOp};
    let unknown = UnaryOp::ALL.iter().chain([UnaryOp::Neg].iter()).map(|o| o.code()).max().unwrap_or(0) + 1000;
    let code = format!(
        "{}\nextern \"C\" __global__ void towers_op_code_probe(float* o) {{\n\
         o[0] = unary_op({unknown}, 2.0f);\n o[1] = unary_grad_op({unknown}, 3.0f, 4.0f);\n\
         o[2] = binary_op({unknown}, 3.0f, 4.0f);\n o[3] = unary_op(-7, 2.0f);\n\
         o[4] = unary_op({neg}, 2.0f);\n o[5] = binary_op({mul}, 3.0f, 4.0f);\n}}\n",
        towers_kernels::cuda::prelude(),
        neg = UnaryOp::Neg.code(),
        mul = BinaryOp::Mul.code(),
    );
    for (virt, _) in ARCHS {
        let ptx = common::compile("op_code_probe.cu", &code, virt, &[]).unwrap_or_else(|e| panic!("{e}"));
        let ptx = String::from_utf8_lossy(&ptx.image).to_string();
        let body = ptx.split(".entry towers_op_code_probe(").nth(1).expect("the probe's entry");
        // NVRTC folds every call: the probe is moves of constant bit patterns
        // (`mov.u32 %r1, 2143289344;`) and stores (`st.global.u32 [%rd2+4], %r1;`).
        let mut regs = std::collections::BTreeMap::new();
        let mut stores: Vec<(u32, u32)> = Vec::new();
        for l in body.lines().map(|l| l.trim().trim_end_matches(';')) {
            let (op, args) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
            let args: Vec<&str> = args.split(',').map(str::trim).collect();
            match (op, args.as_slice()) {
                ("mov.u32" | "mov.b32", [reg, v]) => {
                    if let Ok(v) = v.parse::<i64>() {
                        regs.insert(reg.to_string(), v as u32);
                    }
                }
                // The binary switch rounds each product explicitly (`__fmul_rn`, no
                // FMA contraction), which NVRTC keeps as a `mul.rn` of two constants.
                ("mov.f32", [reg, v]) => {
                    if let Some(hex) = v.strip_prefix("0f") {
                        regs.insert(reg.to_string(), u32::from_str_radix(hex, 16).unwrap());
                    }
                }
                ("mul.rn.f32", [d, a, b]) => {
                    if let (Some(a), Some(b)) = (regs.get(*a), regs.get(*b)) {
                        let p = f32::from_bits(*a) * f32::from_bits(*b);
                        regs.insert(d.to_string(), p.to_bits());
                    }
                }
                ("st.global.u32" | "st.global.b32" | "st.global.f32", [addr, v]) => {
                    let off =
                        addr.trim_matches(|c| c == '[' || c == ']').split('+').nth(1).map_or(0, |o| o.parse().unwrap());
                    let bits = match v.strip_prefix("0f") {
                        Some(hex) => u32::from_str_radix(hex, 16).unwrap(),
                        None => *regs.get(*v).unwrap_or_else(|| panic!("{virt}: {v} is not a constant:\n{body}")),
                    };
                    stores.push((off, bits));
                }
                _ => {}
            }
        }
        stores.sort();
        let bits: Vec<u32> = stores.iter().map(|s| s.1).collect();
        let nan = 0x7fc0_0000u32;
        assert_eq!(
            bits,
            [nan, nan, nan, nan, (-2.0f32).to_bits(), 12.0f32.to_bits()],
            "{virt}: NaN for unknown codes, -2 for Neg.code(), 12 for Mul.code():\n{body}"
        );
    }
}
