//! `towers compile --emit cuda -o DIR`: the CUDA C that a plan launches on
//! the CUDA backend, one file per kernel the plan uses (`<kernel>.cu`: a
//! header naming the entry points, their arguments and launch geometry,
//! then the kernel family's source as NVRTC compiles it; a fused kernel
//! generated from its expression is `fused_<hash>.cu`, one per distinct
//! expression), plus `index.txt` listing every kernel in first-launch order
//! (the GEMM is cuBLAS: no source; a cuBLAS kernel with an epilogue of
//! another family gets a file holding that family's source). Deterministic:
//! the same plan gives the same files, byte for byte.
//!
//! Invariant: every file is one translation unit that NVRTC compiles alone
//! (`tests/cuda_emit.rs` compiles every file of the seed plans for sm_80 and
//! sm_90). Each family's [`Source::code`](cuda::Source) starts with the
//! shared prelude, so a kernel whose launches span several families takes
//! the first family's whole text and only the [`body`](cuda::Source::body)
//! of the others: the prelude once, never `block_sum` twice.

use std::fmt::Write;

use towers_codegen::{Plan, Step};
use towers_kernels::elementwise::FusedExpr;
use towers_kernels::{cuda, Kernel};

/// The files to write: (file name, contents), `index.txt` last.
pub fn cuda_files(plan: &Plan) -> Result<Vec<(String, String)>, String> {
    let mut names: Vec<&'static str> = Vec::new();
    let mut fused: Vec<FusedExpr> = Vec::new();
    let mut files = Vec::new();
    let mut index = format!("# CUDA kernels of program '{}', in first-launch order\n", plan.program);
    for s in &plan.streams {
        for step in &s.steps {
            match step {
                Step::Launch { kernel: Kernel::Fused { expr, .. }, .. } if !fused.contains(expr) => {
                    let g = cuda::fused_source(expr);
                    let file = format!("{}.cu", g.source.family);
                    let mut text = format!("// kernel fused_elementwise {}: entry point {}\n", expr, g.entry);
                    let k = cuda::kernel("fused_elementwise").ok_or("fused_elementwise has no registry entry")?;
                    let _ = writeln!(text, "// arguments: {}", k.args);
                    let _ = writeln!(text, "// launch: {}", k.launch);
                    let _ = writeln!(text, "// source: {} (fnv1a64 {:016x})\n", g.source.path, g.source.hash());
                    text.push_str(g.source.code);
                    let _ = writeln!(index, "fused_elementwise {}: {file} ({})", expr.tree(), g.entry);
                    files.push((file, text));
                    fused.push(expr.clone());
                }
                Step::Launch { kernel, .. }
                    if !matches!(kernel, Kernel::Fused { .. }) && !names.contains(&kernel.name()) =>
                {
                    names.push(kernel.name());
                }
                _ => {}
            }
        }
    }
    for name in names {
        let k = cuda::kernel(name).ok_or_else(|| format!("kernel '{name}' has no CUDA form in the registry"))?;
        // The families this kernel launches, in launch order, each once.
        let mut sources: Vec<&'static cuda::Source> = Vec::new();
        for family in k.family.into_iter().chain(k.after.iter().map(|(f, _)| *f)) {
            let src =
                cuda::source(family).ok_or_else(|| format!("kernel '{name}': no CUDA source for family {family}"))?;
            if !sources.iter().any(|s| s.family == src.family) {
                sources.push(src);
            }
        }
        if sources.is_empty() {
            let _ = writeln!(index, "{name}: {} (no source)", k.args);
            continue;
        }
        let file = format!("{name}.cu");
        let mut text = String::new();
        match k.family {
            Some(_) => {
                let _ = writeln!(text, "// kernel {name}: entry points {}", k.entries.join(", "));
            }
            None => {
                let _ = writeln!(text, "// kernel {name}: cuBLAS, then the entry points below");
            }
        }
        for (f, e) in k.after {
            let _ = writeln!(text, "// then entry point {e} of family {f} (its source is below)");
        }
        let _ = writeln!(text, "// arguments: {}", k.args);
        let _ = writeln!(text, "// launch: {}", k.launch);
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
        // Every entry point the file defines for this kernel, each once, in launch order.
        let mut entries: Vec<&str> = Vec::new();
        for e in k.entries.iter().copied().chain(k.after.iter().map(|(_, e)| *e)) {
            if !entries.contains(&e) {
                entries.push(e);
            }
        }
        let _ = writeln!(index, "{name}: {file} ({})", entries.join(", "));
        files.push((file, text));
    }
    files.push(("index.txt".into(), index));
    Ok(files)
}
