//! Training across processes (not a timed test): `bench/mpi.sh`, or
//! `cargo bench --features mpi --bench processes`.
//!
//! At global batch 256, SGD, the MLP 784-256-256-10 and the anchor convnet
//! (../shared/bench/anchors/common.py): one process of one device (no
//! towers), one process of two towers (threads), and two MPI processes of
//! one tower each (`mpirun -np 2 --bind-to core`: each process on a core of
//! its own, every gradient bucket all-reduced over MPI). For the MPI runs,
//! the share of rank 0's step spent in the all-reduce steps (which include
//! waiting for the other rank), with the default 25 MiB bucket and with
//! 64 KiB buckets (several all-reduces that overlap the backward pass).
//! Both of `MpiComm`'s reduction paths: the shared-memory window (the
//! default on one host) and the MPI library's `MPI_Allreduce` (25 MiB
//! buckets).
//!
//! The run re-launches this binary under `mpirun` for the MPI rows (the
//! ranks see `TOWERS_BENCH_RANKS`); rank 0 prints one JSON line that the
//! parent reads. Each configuration: 10 warm-up steps, then timed steps;
//! medians. `TOWERS_BENCH_VARS=gpu0` places the variables on the tower's
//! device (no gradient copy to the host; the all-reduce then runs on the
//! tower's thread). Output: a markdown table on stdout, JSON lines in
//! `target/bench-processes.jsonl` (or $TOWERS_BENCH_OUT).

mod common;

use std::io::Write;
use std::process::Command;
use std::sync::Arc;

use common::{anchor_convnet, mlp, timed_steps, Model};
use towers::compiler::{compile_train, CompileOptions};
use towers::data::Dataset;
use towers::graph::{Device, Optimizer, F32};
use towers::passes::ProcessGroup;
use towers::runtime::comm::{Comm, LocalComm, MpiComm, MpiReduce};
use towers::runtime::Session;

const BATCH: usize = 256;

/// Median step time, and the share of the step in all-reduce steps.
struct Stats {
    median_ms: f64,
    all_reduce_share: f64,
}

fn time_steps(model: &Model, opts: &CompileOptions, comm: Arc<dyn Comm>, steps: usize) -> Stats {
    let mut opts = opts.clone();
    opts.process = ProcessGroup::new(comm.rank(), comm.world_size()).expect("a rank");
    let rows = opts.process_rows().expect("rows");
    let c = compile_train(&model.graph, "loss", &opts).expect("compiles");
    let mut sess = Session::new(0).with_comm(comm);
    sess.load("train", c.plan).expect("loads");
    let data = Dataset::synthetic(BATCH, 28, 28, 1, 10, 1).expect("data");
    let img = 28 * 28;
    sess.feed("train", "images", &data.images()[rows.start * img..rows.end * img]).expect("feed");
    sess.feed("train", "labels", &data.labels()[rows]).expect("feed");
    let mut times = timed_steps(&mut sess, steps);
    let total: f64 = times.iter().sum();
    let prof = sess.profile("train").expect("profile");
    if std::env::var("TOWERS_BENCH_PROFILE").is_ok_and(|v| v == "1") && opts.process.rank == 0 {
        let mut top: Vec<_> = prof.iter().collect();
        top.sort_by_key(|p| std::cmp::Reverse(p.nanos));
        eprintln!("-- {} towers={} world={}: per-step microseconds", model.name, opts.towers.len(), opts.process.world);
        for p in top.iter().take(16) {
            eprintln!("{:>9.1}  {:<18} {:<14} {}", p.nanos as f64 / 1e3 / steps as f64, p.stream, p.kernel, p.node);
        }
    }
    let all_reduce_ns: u64 = prof.iter().filter(|p| p.kernel == "all_reduce").map(|p| p.nanos).sum();
    times.sort_by(|a, b| a.total_cmp(b));
    Stats { median_ms: times[times.len() / 2], all_reduce_share: all_reduce_ns as f64 / 1e6 / total }
}

fn models() -> Vec<(Model, usize)> {
    let quick = std::env::var("TOWERS_BENCH_QUICK").is_ok_and(|v| v == "1");
    vec![
        (mlp(&[256, 256], "mlp-784-256-256-10"), if quick { 60 } else { 300 }),
        (anchor_convnet(), if quick { 10 } else { 40 }),
    ]
}

fn options(towers: u32, bucket_bytes: usize) -> CompileOptions {
    let vars = std::env::var("TOWERS_BENCH_VARS").unwrap_or_default();
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
    o.towers = (0..towers).map(Device::gpu).collect();
    o.bucket_bytes = bucket_bytes;
    if vars == "gpu0" {
        o.variables = towers::passes::VarPlacement::Gpu0;
    }
    o
}

const BUCKETS: [(usize, &str); 2] = [(25 << 20, "25 MiB"), (64 << 10, "64 KiB")];

/// As one MPI rank: every model and bucket size; rank 0 prints the results.
fn as_rank() {
    let library = std::env::var("TOWERS_BENCH_RANKS").is_ok_and(|v| v == "library");
    let reduce = if library { MpiReduce::Library } else { MpiReduce::Auto };
    let timeout = std::time::Duration::from_secs(300);
    let comm: Arc<dyn Comm> = Arc::new(MpiComm::init_with(timeout, reduce).expect("MPI initializes"));
    let buckets = if library { &BUCKETS[..1] } else { &BUCKETS[..] };
    for (m, steps) in models() {
        for &(bytes, label) in buckets {
            let label = if library { format!("library {label}") } else { label.to_string() };
            let s = time_steps(&m, &options(1, bytes), Arc::clone(&comm), steps);
            if comm.rank() == 0 {
                println!("RESULT {} {label}|{:.4}|{:.4}", m.name, s.median_ms, s.all_reduce_share);
            }
        }
    }
}

fn main() {
    if std::env::var_os("TOWERS_BENCH_RANKS").is_some() {
        return as_rank();
    }
    let out_path = std::env::var("TOWERS_BENCH_OUT").unwrap_or_else(|_| "target/bench-processes.jsonl".into());
    let mut out = std::fs::File::create(&out_path).ok();
    let local = || -> Arc<dyn Comm> { Arc::new(LocalComm::single()) };
    let mut rows = Vec::new();
    for (m, steps) in models() {
        let one = time_steps(&m, &options(0, 25 << 20), local(), steps);
        let two = time_steps(&m, &options(2, 25 << 20), local(), steps);
        let gflops = 3.0 * m.fwd_flops * BATCH as f64 / (one.median_ms * 1e-3) / 1e9;
        rows.push((m.name, one.median_ms, two.median_ms, gflops));
    }
    // The MPI rows: this binary again, as 2 ranks bound to a core each, on
    // each reduction path.
    let exe = std::env::current_exe().expect("this binary");
    let mut text = String::new();
    for path in ["auto", "library"] {
        let run = Command::new("mpirun")
            .args(["-np", "2", "--bind-to", "core"])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .args([
                "-x",
                &format!("TOWERS_BENCH_RANKS={path}"),
                "-x",
                "TOWERS_BENCH_PROFILE",
                "-x",
                "TOWERS_BENCH_VARS",
            ])
            .args(
                std::env::var("TOWERS_BENCH_QUICK")
                    .map(|q| vec!["-x".to_string(), format!("TOWERS_BENCH_QUICK={q}")])
                    .unwrap_or_default(),
            )
            .arg(&exe)
            .output()
            .expect("mpirun starts (apt-get install openmpi-bin)");
        let out = String::from_utf8_lossy(&run.stdout).to_string();
        assert!(run.status.success(), "the MPI ranks failed:\n{out}\n{}", String::from_utf8_lossy(&run.stderr));
        text += &out;
    }
    let mpi = |name: &str, bucket: &str| -> (f64, f64) {
        let tag = format!("RESULT {name} {bucket}|");
        let line = text.lines().find_map(|l| l.strip_prefix(tag.as_str())).expect("a result line");
        let mut f = line.split('|').map(|x| x.parse::<f64>().expect("a number"));
        (f.next().unwrap_or(0.0), f.next().unwrap_or(0.0))
    };
    println!("## Two MPI processes vs one process, global batch {BATCH} (SGD)\n");
    println!("2 MPI x 1 tower: shared-memory all-reduce (the default on one host) with 25 MiB and 64 KiB buckets; MPI_Allreduce with 25 MiB buckets.\n");
    println!("| model | 1 device ms (GFLOP/s, 3x fwd) | 1 process x 2 towers ms (x) | 2 MPI, 25 MiB ms (x) | all-reduce share | 2 MPI, 64 KiB ms (x) | all-reduce share | 2 MPI, MPI_Allreduce ms (x) | all-reduce share |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, one, two, gflops) in rows {
        let (big, big_share) = mpi(name, "25 MiB");
        let (small, small_share) = mpi(name, "64 KiB");
        let (lib, lib_share) = mpi(name, "library 25 MiB");
        println!(
            "| {name} | {one:.3} ({gflops:.0}) | {two:.3} ({:.2}x) | {big:.3} ({:.2}x) | {:.1}% | {small:.3} ({:.2}x) | {:.1}% | {lib:.3} ({:.2}x) | {:.1}% |",
            one / two,
            one / big,
            100.0 * big_share,
            one / small,
            100.0 * small_share,
            one / lib,
            100.0 * lib_share
        );
        if let Some(f) = out.as_mut() {
            let _ = writeln!(
                f,
                "{{\"bench\":\"processes\",\"model\":\"{name}\",\"batch\":{BATCH},\"single_ms\":{one:.4},\"towers2_ms\":{two:.4},\"mpi2_ms\":{big:.4},\"mpi2_all_reduce_share\":{big_share:.4},\"mpi2_64k_ms\":{small:.4},\"mpi2_64k_all_reduce_share\":{small_share:.4},\"mpi2_library_ms\":{lib:.4},\"mpi2_library_all_reduce_share\":{lib_share:.4}}}"
            );
        }
    }
}
