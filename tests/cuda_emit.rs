//! What `towers compile --emit cuda -o DIR` writes compiles: every `.cu`
//! file of the seed plans (mlp and convnet, with and without batch norm,
//! one tower and four towers with variables on the host and on gpu0)
//! compiles alone, as one translation unit, with NVRTC to cubins for `sm_80`
//! and `sm_90`, and defines every entry point `index.txt` names for it.
//! This is the text users get, not the registry's sources one by one
//! (`kernels/tests/cuda_compile.rs` compiles those): a kernel spanning two
//! families is one file holding both.
//!
//! Files with the same text (most kernels appear in several plans) are
//! compiled once. Without NVRTC the test prints a loud SKIPPED message and
//! passes, unless `CI` is set: then it fails. `.ci/run` installs NVRTC from
//! PyPI.

#[path = "../kernels/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::process::Command;

const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// The seed plans: `towers compile` arguments before `--emit cuda -o DIR`.
fn seed_plans() -> Vec<Vec<&'static str>> {
    let mut plans = Vec::new();
    for model in ["mlp", "convnet"] {
        // --batch-norm is the convnet's (refused with the MLP).
        for bn in [false, true].into_iter().filter(|&bn| !bn || model == "convnet") {
            for towers in
                [None, Some(["--towers", "4", "--variables", "cpu"]), Some(["--towers", "4", "--variables", "gpu0"])]
            {
                let mut a = vec!["compile", "--model", model];
                if bn {
                    a.push("--batch-norm");
                }
                a.extend(towers.iter().flatten());
                plans.push(a);
            }
        }
    }
    // The optimizers of issue 22: their single, tower-fused (mean_apply) and
    // multi-tensor updates.
    plans.push(vec!["compile", "--model", "mlp", "--optimizer", "rmsprop", "--towers", "4", "--variables", "cpu"]);
    plans.push(vec!["compile", "--model", "mlp", "--optimizer", "adagrad", "--towers", "4", "--variables", "gpu0"]);
    plans
}

/// A training plan using every math op of issue 22 (maximum, minimum, pow
/// with a trainable exponent, square, leaky_relu, relu6, softplus, and the
/// gradient helpers ge_mask and pow_grad_y), two towers, RMSProp.
fn math_ops_plan() -> towers::codegen::Plan {
    use towers::prelude::*;
    let mut b = GraphBuilder::with_seed(1);
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(6)])).unwrap();
    let w = b.get_variable("w", [6, 4], Initializer::he_normal()).unwrap();
    let e = b.get_variable("e", Shape(vec![]), Initializer::Constant(F32(0.5))).unwrap();
    let h = b.matmul(x, w).unwrap();
    let lr = b.leaky_relu_default(h).unwrap();
    let r6 = b.relu6(h).unwrap();
    let sp = b.softplus(h).unwrap();
    let lo = b.minimum(r6, sp).unwrap();
    let m = b.maximum(lr, lo).unwrap();
    let sq = b.square(m).unwrap();
    let one = b.scalar(1.0).unwrap();
    let base = b.add(sq, one).unwrap();
    let p = b.pow(base, e).unwrap();
    let mean = b.reduce_mean_all(p).unwrap();
    b.identity(mean, "loss").unwrap();
    let opt = Optimizer::RmsProp { lr: F32(0.01), decay: F32(0.9), momentum: F32(0.5), epsilon: F32(1e-10) };
    let mut opts = CompileOptions::new(opt, 8);
    opts.towers = vec![Device::gpu(0), Device::gpu(1)];
    compile_train(&b.finish(), "loss", &opts).expect("the math-ops graph compiles").plan
}

/// Every file `--emit cuda` would write for [`math_ops_plan`] compiles
/// alone for sm_80 and sm_90; the fused kernel of pow's exponent gradient
/// calls the generated switch with `pow_grad_y`'s code, and the switch has
/// a case for every new row.
#[test]
fn the_math_ops_plan_compiles() {
    let files = towers::cuda_emit::cuda_files(&math_ops_plan()).expect("cuda files");
    let all: String = files.iter().map(|(_, t)| t.as_str()).collect();
    use towers::kernels::BinaryOp;
    assert!(all.contains(&format!("binary_op({}, ", BinaryOp::PowGradY.code())), "pow_grad_y in a fused kernel");
    for op in [BinaryOp::Maximum, BinaryOp::Minimum, BinaryOp::Pow, BinaryOp::GreaterEqualMask] {
        assert!(all.contains(&format!("case {}: return ", op.code())), "{op:?} in the binary switch");
    }
    if !common::nvrtc_present() {
        common::skip("cuda_emit", "libnvrtc (libnvrtc.so / libnvrtc.so.13) was not found on LD_LIBRARY_PATH.");
        return;
    }
    let mut failures = Vec::new();
    for (file, text) in files.iter().filter(|(f, _)| f.ends_with(".cu")) {
        for arch in ARCHS {
            match common::compile(file, text, arch, &[]) {
                Ok(c) if c.image.starts_with(b"\x7fELF") => {}
                Ok(_) => failures.push(format!("{file}: NVRTC returned no ELF cubin for {arch}")),
                Err(e) => failures.push(format!("{file}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n\n"));
}

/// Write the plan's CUDA into `dir`; its files other than `index.txt`, with
/// the entry points `index.txt` lists for each.
fn emit(args: &[&str], dir: &std::path::Path) -> Vec<(String, String, Vec<String>)> {
    let out = Command::new(env!("CARGO_BIN_EXE_towers"))
        .args(args)
        .args(["--emit", "cuda", "-o"])
        .arg(dir)
        .output()
        .expect("the towers binary runs");
    assert!(out.status.success(), "towers {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let index = std::fs::read_to_string(dir.join("index.txt")).expect("index.txt");
    let mut files = Vec::new();
    for line in index.lines().filter(|l| !l.starts_with('#')) {
        // "<kernel>: <file> (<entry>, <entry>)" or "<kernel>: <args> (no source)".
        let Some((_, rest)) = line.split_once(": ") else { panic!("index line '{line}'") };
        let Some((file, entries)) = rest.split_once(' ') else { panic!("index line '{line}'") };
        if !file.ends_with(".cu") {
            assert!(line.ends_with("(no source)"), "index line '{line}' names no file");
            continue;
        }
        let entries = entries.trim_start_matches('(').trim_end_matches(')');
        let entries: Vec<String> = entries.split(", ").filter(|e| !e.is_empty()).map(str::to_string).collect();
        let text = std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        files.push((file.to_string(), text, entries));
    }
    assert!(!files.is_empty(), "towers {args:?} wrote no .cu file:\n{index}");
    files
}

#[test]
fn every_emitted_file_of_the_seed_plans_compiles_alone() {
    if !common::nvrtc_present() {
        common::skip("cuda_emit", "libnvrtc (libnvrtc.so / libnvrtc.so.13) was not found on LD_LIBRARY_PATH.");
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    // Text -> (the file name, the first plan that wrote it, entry points).
    let mut unique: BTreeMap<String, (String, String, Vec<String>)> = BTreeMap::new();
    let mut total = 0;
    for (i, args) in seed_plans().iter().enumerate() {
        let dir = root.path().join(i.to_string());
        for (file, text, entries) in emit(args, &dir) {
            total += 1;
            unique.entry(text).or_insert_with(|| (file, format!("towers {}", args.join(" ")), entries));
        }
    }
    let (mut failures, mut compiled) = (Vec::new(), 0);
    for (text, (file, plan, entries)) in &unique {
        let name = format!("{file} (of {plan})");
        for arch in ARCHS {
            match common::compile(file, text, arch, &[]) {
                Ok(c) if c.image.starts_with(b"\x7fELF") => compiled += 1,
                Ok(_) => failures.push(format!("{name}: NVRTC returned no ELF cubin for {arch}")),
                Err(e) => failures.push(format!("{name}: {e}")),
            }
        }
        for e in entries {
            if !text.contains(&format!("extern \"C\" __global__ void {e}(")) {
                failures.push(format!("{name}: index.txt names entry point {e}, which the file does not define"));
            }
        }
    }
    eprintln!(
        "{compiled} of {} (file, architecture) pairs compile: {} distinct files ({total} written over {} plans), {}",
        unique.len() * ARCHS.len(),
        unique.len(),
        seed_plans().len(),
        ARCHS.join(" and ")
    );
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n\n"));
}

/// A plan launching the array kernels of issue 22 (one_hot, transpose, pad,
/// gather and its gradient, tile and its gradient), compiled at two towers:
/// `cuda_files` gives each kernel a file, and every file compiles alone.
#[test]
fn the_array_kernels_of_a_compiled_plan_compile_alone() {
    use towers::prelude::*;
    let mut b = GraphBuilder::with_seed(2);
    let x = b.placeholder("images", DType::F32, [None, Some(6)]).expect("x");
    let y = b.placeholder("labels", DType::I32, [None]).expect("y");
    let w = b.get_variable("w", vec![6, 4], Initializer::GlorotUniform).expect("w");
    let emb = b.get_variable("emb", vec![6, 4], Initializer::GlorotUniform).expect("emb");
    let h = b.matmul(x, w).expect("h");
    let e = b.expand_dims(h, 1).expect("e");
    let t = b.tile(e, &[1, 2, 1]).expect("t");
    let p = b.pad(t, &[[0, 0], [1, 0], [0, 0]], 0.0).expect("p");
    let tr = b.transpose(p, &[0, 2, 1]).expect("tr");
    let s = b.reduce_sum(tr, &[2], false).expect("s");
    let idx = b.argmax(x, 1).expect("idx");
    let g = b.gather(emb, idx, 0).expect("g");
    let logits = b.add(s, g).expect("logits");
    let onehot = b.one_hot(y, 4, 1.0, 0.0).expect("onehot");
    let xent = b.softmax_cross_entropy_with_logits(logits, onehot).expect("xent");
    let loss = b.reduce_mean_all(xent).expect("loss");
    let graph = b.finish();
    let loss = graph.node(loss.node).name.clone();
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
    o.towers = vec![Device::gpu(0), Device::gpu(1)];
    let c = compile_train(&graph, &loss, &o).expect("compiles");
    let files = towers::cuda_emit::cuda_files(&c.plan).expect("cuda files");
    let array = ["one_hot", "transpose", "pad", "gather", "gather_grad", "tile", "tile_grad"];
    for k in array {
        assert!(files.iter().any(|(f, _)| f == &format!("{k}.cu")), "no {k}.cu among the emitted files");
    }
    if !common::nvrtc_present() {
        common::skip("cuda_emit", "libnvrtc (libnvrtc.so / libnvrtc.so.13) was not found on LD_LIBRARY_PATH.");
        return;
    }
    let mut failures = Vec::new();
    for (file, text) in files.iter().filter(|(f, _)| f.ends_with(".cu")) {
        for arch in ARCHS {
            match common::compile(file, text, arch, &[]) {
                Ok(c) if c.image.starts_with(b"\x7fELF") => {}
                Ok(_) => failures.push(format!("{file}: NVRTC returned no ELF cubin for {arch}")),
                Err(e) => failures.push(format!("{file}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n\n"));
}
