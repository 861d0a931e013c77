//! A mixed session against one backend (a benchmark, not a timed test):
//! `cargo bench --bench mixed`.
//!
//! The seed MLP 784-256-256-10 and the anchor convnet, batch 256, SGD, at
//! 1, 2 and 4 towers with variables on the host and on GPU 0: the step on
//! one CPU backend (every device in one memory, copies elided) beside the
//! same plan in a mixed session of two CPU backends
//! (`MixedBackend::cpu_pair`: `cpu:*` in one, `gpu:*` in the other, every
//! copy between them real, every event between them a bridged flag). The
//! ratio is what the mixed path itself costs on this machine: the copies
//! of weights up and gradients down, the flags, and a second runner. The
//! two sessions alternate in blocks of steps, so both see the same
//! neighbours. `TOWERS_BENCH_QUICK=1` times fewer steps.

#[allow(dead_code)] // the benches share `common`; this one times its own steps
mod common;

use common::{anchor_convnet, mlp};
use towers::compiler::{compile_train, CompileOptions};
use towers::data::Dataset;
use towers::graph::{Device, Optimizer, F32};
use towers::passes::VarPlacement;
use towers::runtime::mixed::MixedBackend;
use towers::runtime::{Backend, CpuBackend, Session};

fn session(plan: &towers::codegen::Plan, backend: Box<dyn Backend>, batch: usize) -> Session {
    let mut s = Session::with_backend(0, backend);
    s.load("train", plan.clone()).expect("loads");
    let data = Dataset::synthetic(batch, 28, 28, 1, 10, 1).expect("data");
    s.feed("train", "images", data.images()).expect("feed");
    s.feed("train", "labels", data.labels()).expect("feed");
    for _ in 0..10 {
        s.run("train").expect("warm-up");
    }
    s
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::var("TOWERS_BENCH_QUICK").is_ok_and(|v| v == "1");
    let batch = 256;
    println!("| model | towers | variables | one backend ms | mixed (cpu pair) ms | mixed / one |");
    println!("|---|---|---|---|---|---|");
    let models = [(mlp(&[256, 256], "mlp-784-256-256-10"), 10), (anchor_convnet(), 3)];
    for (m, block) in &models {
        for n in [1u32, 2, 4] {
            for (v, vname) in [(VarPlacement::Cpu, "cpu"), (VarPlacement::Gpu0, "gpu0")] {
                let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, batch);
                o.towers = (0..n).map(Device::gpu).collect();
                o.variables = v;
                let plan = compile_train(&m.graph, "loss", &o).expect("compiles").plan;
                let mut one = session(&plan, Box::new(CpuBackend::new()), batch);
                let mut mixed = session(&plan, Box::new(MixedBackend::cpu_pair().expect("parts start")), batch);
                let (mut a, mut b) = (Vec::new(), Vec::new());
                for _ in 0..if quick { 4 } else { 12 } {
                    for (s, out) in [(&mut one, &mut a), (&mut mixed, &mut b)] {
                        for _ in 0..*block {
                            let t = std::time::Instant::now();
                            s.run("train").expect("step");
                            out.push(t.elapsed().as_secs_f64() * 1e3);
                        }
                    }
                }
                let (x, y) = (median(a), median(b));
                println!("| {} | {n} | {vname} | {x:.3} | {y:.3} | {:.2} |", m.name, y / x);
            }
        }
    }
}
