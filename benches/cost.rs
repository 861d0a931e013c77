//! The cost model against the clock (a benchmark, not a timed test):
//! `cargo bench --bench cost`.
//!
//! For the seed models (the MLP 784-256-256-10 and the anchor convnet of
//! `common`, batch 256, SGD lr 0.1, the step bench's options) at 1, 2 and 4
//! towers and every variable placement on the CPU backend: the step the
//! cost model predicts (`towers::cost`: a fresh calibration of the plan,
//! then the critical path of its streams and events on this machine's
//! cores) beside the mean measured step (untraced, in a fresh session:
//! what a training run's throughput pays; the median rides along), and
//! their ratio. The goal is a ratio within 0.8-1.2 everywhere.
//!
//! The calibration and the measurement run back to back per row, so on a
//! loaded machine both see about the same neighbours; rerun on a quiet one
//! for figures that stand. `TOWERS_BENCH_QUICK=1` times fewer steps.
//! Output: a markdown table on stdout, one JSON line per row in
//! `target/bench-cost.jsonl` (or $TOWERS_BENCH_OUT), each with the
//! calibration's entry per copy path (`paths`: transfers, bytes and
//! nanoseconds of host->device, device->host, device->device, in-process
//! reduction, across processes).

use std::io::Write;

mod common;

use common::{anchor_convnet, mlp, timed_steps, Model};
use towers::compiler::{compile_train, CompileOptions};
use towers::cost::{predict, Calibration, PLACEMENTS};
use towers::data::Dataset;
use towers::graph::{Device, Optimizer, F32};
use towers::runtime::Session;

/// Mean and median measured step (ms) of a plan, untraced, after 10 warm-up steps.
fn measured_ms(plan: &towers::codegen::Plan, batch: usize, steps: usize) -> (f64, f64) {
    let mut sess = Session::new(0);
    sess.load("train", plan.clone()).expect("loads");
    let data = Dataset::synthetic(batch, 28, 28, 1, 10, 1).expect("data");
    sess.feed("train", "images", data.images()).expect("feed");
    sess.feed("train", "labels", data.labels()).expect("feed");
    let mut times = timed_steps(&mut sess, steps);
    times.sort_by(|a, b| a.total_cmp(b));
    (times.iter().sum::<f64>() / times.len() as f64, times[times.len() / 2])
}

fn main() {
    let quick = std::env::var("TOWERS_BENCH_QUICK").is_ok_and(|v| v == "1");
    let out_path = std::env::var("TOWERS_BENCH_OUT").unwrap_or_else(|_| "target/bench-cost.jsonl".into());
    let mut out = std::fs::File::create(&out_path).ok();
    let batch = 256;
    let cores = towers::cost::cores();
    println!("machine: {}\n", towers::cost::machine_key());
    println!(
        "| model | towers | variables | predicted ms | measured ms (mean) | median | predicted/measured | within 20% |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let models: [(Model, usize, usize); 2] = [
        (mlp(&[256, 256], "mlp-784-256-256-10"), if quick { 15 } else { 40 }, if quick { 40 } else { 200 }),
        (anchor_convnet(), if quick { 5 } else { 15 }, if quick { 10 } else { 40 }),
    ];
    let (mut rows, mut within) = (0, 0);
    for (m, traced, timed) in &models {
        for towers in [1u32, 2, 4] {
            for v in PLACEMENTS {
                let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, batch);
                o.towers = (0..towers).map(Device::gpu).collect();
                o.variables = v;
                let plan = compile_train(&m.graph, "loss", &o).expect("compiles").plan;
                let cal = Calibration::measure(&plan, 10, *traced).expect("calibrates");
                let pred = predict(&plan, &cal, cores, 5).expect("predicts");
                let predicted = pred.step_ns as f64 / 1e6;
                let (measured, median) = measured_ms(&plan, batch, *timed);
                let ratio = predicted / measured;
                let ok = (0.8..=1.2).contains(&ratio);
                rows += 1;
                within += ok as usize;
                println!(
                    "| {} | {towers} | {} | {predicted:.3} | {measured:.3} | {median:.3} | {ratio:.2} | {} |",
                    m.name,
                    v.name(),
                    if ok { "yes" } else { "no" }
                );
                if let Some(f) = out.as_mut() {
                    let _ = writeln!(
                        f,
                        "{{\"bench\":\"cost\",\"model\":\"{}\",\"towers\":{towers},\"variables\":\"{}\",\"batch\":{batch},\"fwd_flops\":{},\"predicted_ms\":{predicted:.4},\"measured_ms\":{measured:.4},\"median_ms\":{median:.4},\"traced_ms\":{:.4},\"ratio\":{ratio:.4},\"handoff_us\":{:.1},\"step_overhead_us\":{:.1},\"launch_gap_us\":{:.1},\"paths\":{}}}",
                        m.name,
                        v.name(),
                        m.fwd_flops,
                        cal.traced_step_ns as f64 / 1e6,
                        cal.handoff_ns as f64 / 1e3,
                        cal.step_overhead_ns as f64 / 1e3,
                        cal.launch_gap_ns as f64 / 1e3,
                        serde_json::to_string(&cal.paths).unwrap_or_else(|_| "{}".into())
                    );
                }
            }
        }
    }
    println!("\n{within} of {rows} predictions within 20% of the measured step");
}
