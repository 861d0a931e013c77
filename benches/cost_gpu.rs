//! The cost model against the clock on a GPU (a benchmark, not a timed
//! test): `cargo bench --bench cost_gpu`, or on a lent GPU machine without
//! a Rust toolchain the prebuilt binary through `bench/gpu_cost.sh`.
//!
//! For the seed models (the MLP 784-256-256-10 and the anchor convnet of
//! `common`, SGD lr 0.1) at batch 256 and 1024, 1, 2 and 4 towers, and
//! variables cpu, gpu0 and round-robin, on `--backend cuda` (a mixed
//! session: `cpu:*` on host threads with pinned memory, `gpu:*` on CUDA):
//! - `predicted`: the cost model (`towers::cost`) from a fresh calibration
//!   in a CUDA mixed session with a context per logical GPU (as a run
//!   opens it), every GPU stream a lane of its own;
//! - `serial GPU`: the same costs with every GPU stream on one lane, the
//!   step as if concurrent streams never overlapped;
//! - `measured`: the mean untraced step with graphs on, a context per
//!   logical GPU (what `towers train --backend cuda` runs), and
//!   `measured 1 ctx`: the same with one context (`--cuda-contexts one`).
//!
//! Reading it: `predicted/measured` near 1 is the goal. Where `measured`
//! sits near `serial GPU` rather than `predicted`, concurrent kernels
//! shared the SMs instead of overlapping (the model ignores that); where
//! `measured` differs from `measured 1 ctx`, contexts on one GPU
//! time-slice (the model ignores that too).
//!
//! Without a usable GPU it says why and exits 2 (nothing measured); with
//! `TOWERS_REQUIRE_GPU=1` it fails (exit 1) instead. `TOWERS_BENCH_QUICK=1`
//! times fewer steps. Output: a markdown table on stdout, one JSON line per
//! row in `target/bench-cost-gpu.jsonl` (or $TOWERS_BENCH_OUT).

use std::io::Write;
use std::sync::Arc;

#[allow(dead_code)]
mod common;

use common::{anchor_convnet, mlp, Model};
use towers::compiler::{compile_train, CompileOptions};
use towers::cost::lanes::{lanes, one_gpu_lane};
use towers::cost::{explain::predict_in, Calibration, Target};
use towers::data::Dataset;
use towers::graph::{Device, Optimizer, F32};
use towers::passes::VarPlacement;
use towers::runtime::{Comm, LocalComm, Session};
use towers::train::{open_session, BackendChoice};

/// Mean and median untraced step (ms) of `plan` in a fresh CUDA mixed
/// session, graphs on, after 10 warm-up steps.
fn measured_ms(plan: &towers::codegen::Plan, batch: usize, steps: usize, one_context: bool) -> (f64, f64) {
    let comm: Arc<dyn Comm> = Arc::new(LocalComm::single());
    let (mut sess, _) = open_session(BackendChoice::Cuda, 0, &comm, true, one_context).expect("a CUDA session");
    sess.load("train", plan.clone()).expect("loads");
    let data = Dataset::synthetic(batch, 28, 28, 1, 10, 1).expect("data");
    sess.feed("train", "images", data.images()).expect("feed");
    sess.feed("train", "labels", data.labels()).expect("feed");
    let mut times = timed(&mut sess, steps);
    times.sort_by(|a, b| a.total_cmp(b));
    (times.iter().sum::<f64>() / times.len() as f64, times[times.len() / 2])
}

/// 10 untimed steps, then `steps` timed ones (no profiling: it would make
/// the CUDA backend launch eagerly).
fn timed(sess: &mut Session, steps: usize) -> Vec<f64> {
    for _ in 0..10 {
        sess.run("train").expect("step");
    }
    (0..steps.max(1))
        .map(|_| {
            let t = std::time::Instant::now();
            sess.run("train").expect("step");
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect()
}

fn main() {
    let require = std::env::var("TOWERS_REQUIRE_GPU").is_ok_and(|v| v == "1");
    if let Err(e) = towers::runtime::cuda::available() {
        if require {
            eprintln!("cost_gpu: FAILED: TOWERS_REQUIRE_GPU=1, but there is no usable GPU: {e}");
            std::process::exit(1);
        }
        eprintln!(
            "cost_gpu: no usable GPU ({e}); nothing measured. Run it on a machine with CUDA (bench/gpu_cost.sh), or set TOWERS_REQUIRE_GPU=1 to make this a failure"
        );
        std::process::exit(2);
    }
    let quick = std::env::var("TOWERS_BENCH_QUICK").is_ok_and(|v| v == "1");
    let out_path = std::env::var("TOWERS_BENCH_OUT").unwrap_or_else(|_| "target/bench-cost-gpu.jsonl".into());
    let mut out = std::fs::File::create(&out_path).ok();
    let cores = towers::cost::cores();
    let device = Target::Cuda.session().map(|s| s.backend_note()).unwrap_or_else(|e| e.to_string());
    println!("machine: {}\ndevice: {device}\n", towers::cost::machine_key());
    println!(
        "| model | batch | towers | variables | predicted ms | serial GPU ms | measured ms (mean) | median | measured 1 ctx | predicted/measured | within 20% |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let (traced, timed_steps) = if quick { (5, 10) } else { (10, 30) };
    let models: [Model; 2] = [mlp(&[256, 256], "mlp-784-256-256-10"), anchor_convnet()];
    let (mut rows, mut within) = (0, 0);
    for m in &models {
        for batch in [256usize, 1024] {
            for towers in [1u32, 2, 4] {
                for v in [VarPlacement::Cpu, VarPlacement::Gpu0, VarPlacement::RoundRobin] {
                    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, batch);
                    o.towers = (0..towers).map(Device::gpu).collect();
                    o.variables = v;
                    let plan = compile_train(&m.graph, "loss", &o).expect("compiles").plan;
                    let mut sess = Target::Cuda.session().expect("a CUDA session");
                    let cal = Calibration::measure_in(&mut sess, &plan, 10, traced).expect("calibrates");
                    drop(sess);
                    let gpu_lanes = lanes(&plan, &cal.backend, cores).expect("lanes");
                    let pred = predict_in(&plan, &cal, &gpu_lanes, 5).expect("predicts");
                    let serial = predict_in(&plan, &cal, &one_gpu_lane(&gpu_lanes), 5).expect("predicts");
                    let (predicted, serial) = (pred.step_ns as f64 / 1e6, serial.step_ns as f64 / 1e6);
                    let (measured, median) = measured_ms(&plan, batch, timed_steps, false);
                    let (one_ctx, _) = measured_ms(&plan, batch, timed_steps, true);
                    let ratio = predicted / measured;
                    let ok = (0.8..=1.2).contains(&ratio);
                    rows += 1;
                    within += ok as usize;
                    println!(
                        "| {} | {batch} | {towers} | {} | {predicted:.3} | {serial:.3} | {measured:.3} | {median:.3} | {one_ctx:.3} | {ratio:.2} | {} |",
                        m.name,
                        v.name(),
                        if ok { "yes" } else { "no" }
                    );
                    if let Some(f) = out.as_mut() {
                        let _ = writeln!(
                            f,
                            "{{\"bench\":\"cost_gpu\",\"model\":\"{}\",\"towers\":{towers},\"variables\":\"{}\",\"batch\":{batch},\"predicted_ms\":{predicted:.4},\"serial_gpu_ms\":{serial:.4},\"measured_ms\":{measured:.4},\"median_ms\":{median:.4},\"measured_one_context_ms\":{one_ctx:.4},\"traced_ms\":{:.4},\"ratio\":{ratio:.4},\"gpu_launch_gap_us\":{:.1},\"gpu_handoff_us\":{:.1},\"bridge_us\":{:.1},\"paths\":{}}}",
                            m.name,
                            v.name(),
                            cal.traced_step_ns as f64 / 1e6,
                            cal.gpu_launch_gap_ns as f64 / 1e3,
                            cal.gpu_handoff_ns as f64 / 1e3,
                            cal.bridge_ns as f64 / 1e3,
                            serde_json::to_string(&cal.paths).unwrap_or_else(|_| "{}".into())
                        );
                    }
                }
            }
        }
    }
    println!("\n{within} of {rows} predictions within 20% of the measured step (device: {device})");
}
