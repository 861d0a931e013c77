//! `towers compile --emit cuda -o DIR`: the CUDA C that a plan launches on
//! the CUDA backend, one file per kernel the plan uses (`<kernel>.cu`: a
//! header listing the launches of the kernel's first launch in the plan, as
//! `towers_kernels::launch` describes them for that launch's shapes — entry,
//! grid, block, shared memory and argument list, and any cuBLAS GEMMs —
//! then the source of every family those launches use, as NVRTC compiles
//! it; a fused kernel generated from its expression is `fused_<hash>.cu`,
//! one per distinct expression), plus `index.txt` listing every kernel in
//! first-launch order (a kernel that is only cuBLAS GEMMs has no source).
//! Deterministic: the same plan gives the same files, byte for byte.
//!
//! Invariant: every file is one translation unit that NVRTC compiles alone
//! (`tests/cuda_emit.rs` compiles every file of the seed plans for sm_80 and
//! sm_90). Each family's [`Source::code`](cuda::Source) starts with the
//! shared prelude, so a kernel whose launches span several families takes
//! the first family's whole text and only the [`body`](cuda::Source::body)
//! of the others: the prelude once, never `block_sum` twice.

use std::fmt::Write;

use towers_codegen::{Plan, Step};
use towers_kernels::cuda;
use towers_kernels::launch::{LaunchOp, Lowering};
use towers_kernels::Kernel;

/// The file of one kernel: its header (the launches of `low`), the
/// sources of the families they use, and the entry points it defines.
fn kernel_file(title: &str, low: &Lowering) -> Result<Option<(String, Vec<&'static str>)>, String> {
    let mut sources: Vec<&'static cuda::Source> = Vec::new();
    let mut entries: Vec<&'static str> = Vec::new();
    for l in low.launches() {
        let src = cuda::source(l.family).ok_or_else(|| format!("{title}: no CUDA source for family {}", l.family))?;
        if !sources.iter().any(|s| s.family == src.family) {
            sources.push(src);
        }
        if !entries.contains(&l.entry) {
            entries.push(l.entry);
        }
    }
    if sources.is_empty() {
        return Ok(None);
    }
    let mut text = format!("// kernel {title}: its launches, as the CUDA backend makes them for its first launch\n");
    for op in &low.ops {
        let _ = match op {
            LaunchOp::Launch(l) => writeln!(text, "//   {l}"),
            LaunchOp::Gemm(g) => writeln!(text, "//   cuBLAS {g}"),
        };
    }
    for (k, n) in low.scratch.iter().enumerate() {
        let _ = writeln!(text, "//   scratch{k}: {n} f32 (zeroed once at load)");
    }
    for (i, src) in sources.iter().enumerate() {
        if i == 0 {
            let _ = writeln!(text, "// source: kernels/src/{} (fnv1a64 {:016x})\n", src.path, src.hash());
            text.push_str(src.code);
        } else {
            let _ = writeln!(
                text,
                "\n// source: kernels/src/{} (fnv1a64 {:016x}), after the prelude above\n",
                src.path,
                src.hash()
            );
            text.push_str(src.body());
        }
    }
    Ok(Some((text, entries)))
}

/// The files to write: (file name, contents), `index.txt` last.
pub fn cuda_files(plan: &Plan) -> Result<Vec<(String, String)>, String> {
    let mut seen: Vec<String> = Vec::new();
    let mut files = Vec::new();
    let mut index = format!("# CUDA kernels of program '{}', in first-launch order\n", plan.program);
    for s in &plan.streams {
        for step in &s.steps {
            let Step::Launch { kernel, inputs, outputs, workspace, node } = step else { continue };
            // One file per kernel name, one per distinct fused expression.
            let (key, title) = match kernel {
                Kernel::Fused { expr, .. } => {
                    let g = cuda::fused_source(expr);
                    (g.source.family.to_string(), format!("fused_elementwise {expr}"))
                }
                k => (k.name().to_string(), k.name().to_string()),
            };
            if seen.contains(&key) {
                continue;
            }
            seen.push(key.clone());
            let low = plan
                .cuda_lowering(kernel, inputs, outputs, workspace.as_ref())
                .map_err(|e| format!("node '{node}': the CUDA backend cannot run it: {e}"))?;
            let label = match kernel {
                Kernel::Fused { expr, .. } => format!("fused_elementwise {}", expr.tree()),
                k => k.name().to_string(),
            };
            match kernel_file(&title, &low)? {
                Some((text, entries)) => {
                    let file = format!("{key}.cu");
                    let _ = writeln!(index, "{label}: {file} ({})", entries.join(", "));
                    files.push((file, text));
                }
                None => {
                    let _ = writeln!(index, "{label}: cuBLAS sgemm only (no source)");
                }
            }
        }
    }
    files.push(("index.txt".into(), index));
    Ok(files)
}
