//! Training-step benchmarks (not timed tests): `cargo bench --bench step`.
//!
//! 1. One training step, single device (one thread): the MLP 784-256-256-10
//!    and the anchor convnet on 28x28 inputs (conv 5x5x12 VALID + relu,
//!    max-pool 2x2, conv 3x3x24 VALID + relu, max-pool 2x2, flatten 600,
//!    dense 100 + relu, dense 10; SGD lr 0.1), batch 256 — the models of
//!    ../shared/bench/anchors/common.py, so the figures compare with JAX,
//!    TensorFlow and PyTorch measured by that harness on the same machine.
//! 2. Two towers against one device at the same global batch 256 (MLP
//!    784-128-10 and 784-256-256-10; each variable placement), with the
//!    share of the step's wall time during which the cross-tower gradient
//!    reduction or an optimizer update runs (the union, over all threads, of
//!    the spans of the launches `weighted_sum`, `mean_apply`, `multi_apply`
//!    and `apply_*` in traced steps, median of the steps: codegen fuses a
//!    variable's reduction into its update). Each tower computes its own
//!    weight gradients (the default); "folded" rows fold the large weight
//!    gradients' means into one product over the batch (`gemm_tower_mean`,
//!    the `tower_matmul` pass, `CompileOptions::fold_tower_matmuls`): their
//!    reduction is then the product's own sum, and with plain SGD or
//!    non-Nesterov momentum the product updates its variable itself
//!    (`gemm_tower_apply`), which the last column counts in too (a backward
//!    product, its reduction and its update in one launch); "unfused" rows
//!    turn every fusion off (the reduction then is its own `weighted_sum`
//!    launch).
//!
//! Each configuration: 10 warm-up steps, then timed steps; the median, p10 and
//! p90 are reported. Output: a markdown table on stdout and one JSON line per
//! configuration in `target/bench-step.jsonl` (or $TOWERS_BENCH_OUT).
//! `bench/run.sh` wraps this with the FMA probe that detects the host running
//! both vCPUs on one physical core.

use std::io::Write;

mod common;

use common::{anchor_convnet, mlp, timed_steps, Model};
use towers::compiler::{compile_train, CompileOptions};
use towers::data::Dataset;
use towers::graph::{Device, Optimizer, F32};
use towers::passes::VarPlacement;
use towers::runtime::Session;

struct Stats {
    median_ms: f64,
    p10_ms: f64,
    p90_ms: f64,
    reduce_share: Option<f64>,
    /// The same, counting also the folded products that update their
    /// variable themselves (`gemm_tower_apply`: a backward product, the
    /// reduction and the update in one launch).
    fused_share: Option<f64>,
}

/// Whether a launch reduces the towers' gradients or updates a variable.
fn reduces_or_updates(kind: &str) -> bool {
    matches!(kind, "weighted_sum" | "mean_apply" | "multi_apply") || kind.starts_with("apply_")
}

/// With towers: the median over `steps` traced steps of the share of the
/// step's wall time during which some reduction or update launch runs (the
/// union of their spans on every thread, so two updates at once on two
/// threads count once).
fn towers_share(sess: &mut Session, opts: &CompileOptions, steps: usize, with_products: bool) -> Option<f64> {
    if opts.towers.len() < 2 {
        return None;
    }
    let counted = |kind: &str| reduces_or_updates(kind) || (with_products && kind == "gemm_tower_apply");
    sess.set_tracing("train", true).expect("tracing");
    let mut shares = Vec::with_capacity(steps);
    for _ in 0..steps {
        sess.run("train").expect("step");
        let t = sess.trace("train").expect("trace");
        let mut spans: Vec<(u64, u64)> =
            t.events.iter().filter(|e| counted(e.kind)).map(|e| (e.start_ns, e.start_ns + e.dur_ns)).collect();
        spans.sort_unstable();
        let (mut covered, mut end) = (0u64, 0u64);
        for (a, b) in spans {
            let a = a.max(end);
            if b > a {
                covered += b - a;
                end = b;
            }
        }
        shares.push(covered as f64 / t.dur_ns.max(1) as f64);
    }
    sess.set_tracing("train", false).expect("tracing");
    shares.sort_by(|a, b| a.total_cmp(b));
    shares.get(shares.len() / 2).copied()
}

fn time_steps(model: &Model, opts: &CompileOptions, steps: usize) -> Stats {
    let c = compile_train(&model.graph, "loss", opts).expect("compiles");
    let mut sess = Session::new(0);
    sess.load("train", c.plan).expect("loads");
    let data = Dataset::synthetic(opts.batch, 28, 28, 1, 10, 1).expect("data");
    sess.feed("train", "images", data.images()).expect("feed");
    sess.feed("train", "labels", data.labels()).expect("feed");
    let mut times = timed_steps(&mut sess, steps);
    let prof = sess.profile("train").expect("profile");
    if std::env::var("TOWERS_BENCH_PROFILE").is_ok_and(|v| v == "1") {
        let mut top: Vec<_> = prof.iter().collect();
        top.sort_by_key(|p| std::cmp::Reverse(p.nanos));
        eprintln!("-- {} towers={} vars={:?}: per-step microseconds", model.name, opts.towers.len(), opts.variables);
        let mut per: std::collections::BTreeMap<(String, bool), f64> = Default::default();
        for p in &prof {
            *per.entry((p.stream.split('/').next().unwrap_or("").to_string(), p.kernel == "wait")).or_default() +=
                p.nanos as f64 / 1e3 / steps as f64;
        }
        for ((dev, wait), us) in &per {
            eprintln!("   {dev:<8} {} {us:>9.1} us/step", if *wait { "waiting" } else { "working" });
        }
        for p in top.iter().take(25) {
            eprintln!("{:>9.1}  {:<18} {:<14} {}", p.nanos as f64 / 1e3 / steps as f64, p.stream, p.kernel, p.node);
        }
    }
    let traced = if steps >= 100 { 30 } else { 8 };
    let reduce_share = towers_share(&mut sess, opts, traced, false);
    let fused_share = towers_share(&mut sess, opts, traced, true);
    times.sort_by(|a, b| a.total_cmp(b));
    let q = |f: f64| times[((times.len() - 1) as f64 * f).round() as usize];
    Stats { median_ms: q(0.5), p10_ms: q(0.1), p90_ms: q(0.9), reduce_share, fused_share }
}

fn main() {
    let quick = std::env::var("TOWERS_BENCH_QUICK").is_ok_and(|v| v == "1");
    let out_path = std::env::var("TOWERS_BENCH_OUT").unwrap_or_else(|_| "target/bench-step.jsonl".into());
    let mut out = std::fs::File::create(&out_path).ok();
    let sgd = Optimizer::Sgd { lr: F32(0.1) };
    let batch = 256;
    let n_mlp = if quick { 60 } else { 300 };
    let n_conv = if quick { 10 } else { 40 };

    // Warm the machine up (page cache, frequency, the kernel's memory
    // housekeeping after a build) with an untimed two-tower run: the first
    // timed configurations were otherwise sometimes 3x slower.
    {
        let m = mlp(&[128], "warm-up");
        let mut o = CompileOptions::new(sgd.clone(), batch);
        o.towers = vec![Device::gpu(0), Device::gpu(1)];
        let _ = time_steps(&m, &o, if quick { 300 } else { 1500 });
    }
    let simd = towers::kernels::simd::active();
    // The FMA probe's one-thread figure at this path's width (bench/run.sh
    // passes it), for the share of peak.
    let peak: Option<f64> =
        std::env::var("TOWERS_BENCH_PEAK_1T").ok().and_then(|v| v.parse().ok()).filter(|p| *p > 0.0);
    println!(
        "SIMD path: {simd} (TOWERS_SIMD={}), GEMM: {}",
        std::env::var("TOWERS_SIMD").unwrap_or_default(),
        towers::kernels::simd::gemm_path()
    );
    match peak {
        Some(p) => println!("FMA probe at this width, one thread: {p:.1} GFLOP/s\n"),
        None => println!("FMA probe: none (run through bench/run.sh for the share of peak)\n"),
    }
    println!("## One training step, single device, one thread (batch {batch})\n");
    println!("| model | step ms (median) | p10-p90 | GFLOP/s (3x fwd) | share of FMA peak |");
    println!("|---|---|---|---|---|");
    let big = mlp(&[256, 256], "mlp-784-256-256-10");
    let conv = anchor_convnet();
    for (m, n) in [(&big, n_mlp), (&conv, n_conv)] {
        let s = time_steps(m, &CompileOptions::new(sgd.clone(), batch), n);
        let gflops = 3.0 * m.fwd_flops * batch as f64 / (s.median_ms * 1e-3) / 1e9;
        let share = peak.map_or("-".to_string(), |p| format!("{:.0}%", 100.0 * gflops / p));
        println!("| {} | {:.3} | {:.3}-{:.3} | {:.1} | {share} |", m.name, s.median_ms, s.p10_ms, s.p90_ms, gflops);
        if let Some(f) = out.as_mut() {
            let _ = writeln!(
                f,
                "{{\"bench\":\"single\",\"simd\":\"{simd}\",\"model\":\"{}\",\"batch\":{batch},\"median_ms\":{:.4},\"p10_ms\":{:.4},\"p90_ms\":{:.4}}}",
                m.name, s.median_ms, s.p10_ms, s.p90_ms
            );
        }
    }

    println!("\n## Two towers vs one device, global batch {batch}\n");
    println!("| model | variables | 1 device ms | 2 towers ms | 2 towers p10-p90 | speed-up | reduction + update share of step | with products that update |");
    println!("|---|---|---|---|---|---|---|---|");
    let small = mlp(&[128], "mlp-784-128-10");
    let placements = [
        (VarPlacement::Cpu, "cpu", false, true),
        (VarPlacement::Gpu0, "gpu0", false, true),
        (VarPlacement::RoundRobin, "round-robin", false, true),
        (VarPlacement::Greedy, "greedy", false, true),
    ];
    let others = [
        // The weight gradients' products folded into one over the batch
        // (`CompileOptions::fold_tower_matmuls`, off by default).
        (VarPlacement::Cpu, "cpu, folded", true, true),
        (VarPlacement::Gpu0, "gpu0, folded", true, true),
        // Folded, but the product stores its gradient and the update reads it.
        (VarPlacement::Cpu, "cpu, folded, product apart", true, true),
        // Unfused: each reduction its own weighted_sum launch.
        (VarPlacement::Cpu, "cpu, unfused", false, false),
    ];
    for (m, n) in [(&small, n_mlp), (&big, n_mlp), (&conv, n_conv)] {
        let one = time_steps(m, &CompileOptions::new(sgd.clone(), batch), n);
        // The convnet's products do not fold at batch 256 (their operands
        // outnumber their gradients): its "folded" rows would repeat.
        let rows = if std::ptr::eq(m, &conv) { &others[3..] } else { &others[..] };
        for &(vars, vname, fold, fuse) in placements.iter().chain(rows) {
            let mut o = CompileOptions::new(sgd.clone(), batch);
            o.towers = vec![Device::gpu(0), Device::gpu(1)];
            o.variables = vars;
            o.fold_tower_matmuls = fold;
            o.fuse_reductions = fuse;
            o.fuse_tower_updates = !vname.ends_with("product apart");
            let two = time_steps(m, &o, n);
            let pct = |s: Option<f64>| s.map(|s| format!("{:.1}%", 100.0 * s)).unwrap_or_else(|| "-".into());
            let (share, with) = (pct(two.reduce_share), pct(two.fused_share));
            println!(
                "| {} | {vname} | {:.3} | {:.3} | {:.3}-{:.3} | {:.2}x | {share} | {with} |",
                m.name,
                one.median_ms,
                two.median_ms,
                two.p10_ms,
                two.p90_ms,
                one.median_ms / two.median_ms
            );
            if let Some(f) = out.as_mut() {
                let _ = writeln!(
                    f,
                    "{{\"bench\":\"towers2\",\"model\":\"{}\",\"variables\":\"{vname}\",\"batch\":{batch},\"single_ms\":{:.4},\"towers2_ms\":{:.4},\"towers2_p10_ms\":{:.4},\"towers2_p90_ms\":{:.4},\"speedup\":{:.4},\"reduce_share\":{:.4},\"fused_share\":{:.4}}}",
                    m.name,
                    one.median_ms,
                    two.median_ms,
                    two.p10_ms,
                    two.p90_ms,
                    one.median_ms / two.median_ms,
                    two.reduce_share.unwrap_or(0.0),
                    two.fused_share.unwrap_or(0.0)
                );
            }
        }
    }
}
