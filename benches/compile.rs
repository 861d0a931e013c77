//! What the compiler produces, counted (not a timed test): `cargo bench
//! --bench compile`.
//!
//! For the MLP 784-256-256-10 (ReLU, and swish: `x * sigmoid(x)`, whose
//! chains the e-graph fuses) and the anchor convnet at global batch 256,
//! 1, 2, 4 and 8 towers, variables on the CPU: kernel launches per step
//! with every fusion on and off (`fuse_kernels`, and the towers' weight
//! gradients folded into one product, `fold_tower_matmuls`), copies and
//! events; the peak arena bytes summed over the devices against
//! the sum of all intermediates (the unfused program with every tensor in
//! bytes of its own); the time of the egg pass
//! (`simplify`) and of the whole compilation (median of 5). Output: a
//! markdown table on stdout and JSON lines in `target/bench-compile.jsonl`
//! (or $TOWERS_BENCH_OUT).

#[allow(dead_code)] // the step helpers of the shared module are not used here
mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{anchor_convnet, mlp, mlp_with};
use towers::codegen::Step;
use towers::compiler::{compile_train, CompileOptions};
use towers::graph::{Device, Optimizer, F32};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let out_path = std::env::var("TOWERS_BENCH_OUT").unwrap_or_else(|_| "target/bench-compile.jsonl".into());
    let mut out = std::fs::File::create(&out_path).ok();
    println!("| model | GFLOP/step (3x fwd) | towers | launches/step | unfused | copies | events | peak arena B | all intermediates B (unfused, no reuse) | ratio | egg ms | compile ms |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let swish = mlp_with(&[256, 256], "mlp-swish-784-256-256-10", towers::graph::layers::Activation::Swish);
    for m in [mlp(&[256, 256], "mlp-784-256-256-10"), swish, anchor_convnet()] {
        for towers in [1u32, 2, 4, 8] {
            let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 256);
            o.towers = (0..towers).map(Device::gpu).collect();
            let mut egg = Vec::new();
            let mut total = Vec::new();
            let mut last = None;
            for _ in 0..5 {
                let t = Instant::now();
                let c = compile_train(&m.graph, "loss", &o).expect("compiles");
                total.push(t.elapsed());
                egg.push(c.timings.iter().filter(|t| t.pass == "simplify").map(|t| t.elapsed).sum());
                last = Some(c);
            }
            let c = last.expect("compiled");
            let steps = c.plan.streams.iter().flat_map(|s| &s.steps);
            let launches = steps.clone().filter(|s| matches!(s, Step::Launch { .. })).count();
            let copies = steps.filter(|s| matches!(s, Step::Copy { .. })).count();
            let arena: usize = c.plan.devices.iter().map(|d| d.arena_bytes).sum();
            // The sum of all intermediates: the unfused program, each tensor in bytes of its own.
            let mut bare = o.clone();
            (bare.fuse_kernels, bare.fuse_reductions, bare.reuse_memory) = (false, false, false);
            bare.fold_tower_matmuls = false;
            let before = compile_train(&m.graph, "loss", &bare).expect("compiles").plan;
            let all: usize = before.devices.iter().map(|d| d.bytes_without_reuse()).sum();
            let unfused =
                before.streams.iter().flat_map(|s| &s.steps).filter(|s| matches!(s, Step::Launch { .. })).count();
            let (egg, total) = (median(egg).as_secs_f64() * 1e3, median(total).as_secs_f64() * 1e3);
            println!(
                "| {} | {:.2} | {towers} | {launches} | {unfused} | {copies} | {} | {arena} | {all} | {:.2} | {egg:.1} | {total:.1} |",
                m.name,
                3.0 * m.fwd_flops * 256.0 / 1e9,
                c.plan.num_events,
                arena as f64 / all as f64
            );
            if let Some(f) = out.as_mut() {
                let _ = writeln!(
                    f,
                    "{{\"bench\":\"compile\",\"model\":\"{}\",\"towers\":{towers},\"launches\":{launches},\"unfused_launches\":{unfused},\"copies\":{copies},\"events\":{},\"arena_bytes\":{arena},\"no_reuse_bytes\":{all},\"egg_ms\":{egg:.3},\"compile_ms\":{total:.3}}}",
                    m.name, c.plan.num_events
                );
            }
        }
    }
}
