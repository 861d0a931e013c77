//! Training across MPI processes (`--features mpi`), under a real launcher.
//!
//! Each test re-runs this binary under `mpirun -np 2` (each process runs
//! only that test, as one rank) and checks the ranks' output; the ranks
//! compare themselves with one device on the whole batch (computed in each
//! rank process) at the tolerance of `processes.rs` (`TOL`, 2e-5 relative after 3
//! steps), and with each other bit for bit (the loss and every variable are
//! printed as bits by both ranks and must agree). Without `mpirun` the tests
//! say SKIPPED, except under CI, where they fail.
#![cfg(feature = "mpi")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use towers::compiler::CompileOptions;
use towers::models::ModelKind;
use towers_graph::{Device, Optimizer, F32};
use towers_passes::SplitPolicy;
use towers_runtime::comm::{Comm, MpiComm};
use towers_tests::{batches, max_rel_diff, mpirun_self, optimizers, run, run_as, small_model, under_mpirun, TOL};

const BATCH: usize = 24;
const EQUIVALENCE: &str = "two_mpi_processes_match_one_device_for_every_optimizer_split_and_accumulation";
const HANG: &str = "a_rank_that_hangs_ends_every_rank_with_an_error_naming_it";

/// One rank's part: every case, compared with one device; a digest of the
/// results printed so the launcher test can compare the ranks.
fn equivalence_as_rank() {
    let comm: Arc<dyn Comm> = Arc::new(MpiComm::init().expect("MPI initializes"));
    let rank = comm.rank();
    assert_eq!(comm.world_size(), 2, "run with mpirun -np 2");
    let model = small_model(ModelKind::Mlp, false, 11);
    let data = batches(BATCH, 3, 5);
    // (towers per process, split over all towers of both ranks, micro-batches)
    let cases = [
        (1, SplitPolicy::Even, 1),
        (2, SplitPolicy::Even, 1),
        (1, SplitPolicy::Weighted(vec![3, 1]), 1),
        (2, SplitPolicy::Weighted(vec![1, 1, 1, 3]), 1),
        (1, SplitPolicy::Even, 3),
    ];
    let mut n = 0;
    for opt in &optimizers() {
        let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
        for (towers, split, k) in &cases {
            let mut o = CompileOptions::new(opt.clone(), BATCH);
            o.towers = (0..*towers).map(Device::gpu).collect();
            o.split = split.clone();
            o.accumulate = *k;
            let r = run_as(&model, &o, &data, Arc::clone(&comm));
            let what = format!("{opt:?} 2x{towers} {split:?} accumulate={k}");
            let (d, var) = max_rel_diff(&r, &single);
            assert!(d <= TOL, "rank {rank}: {what}: {var} differs from one device by {d}");
            for (a, b) in r.losses.iter().zip(&single.losses) {
                assert!((a - b).abs() <= TOL * b.abs().max(1.0), "rank {rank}: {what}: loss {a} vs {b}");
            }
            // Bit-level digest of this rank's result, compared across ranks by the launcher test.
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for x in r.losses.iter().chain(r.variables.values().flatten()) {
                h = (h ^ x.to_bits() as u64).wrapping_mul(0x100_0000_01b3);
            }
            println!("case {n} digest {h:016x}");
            n += 1;
        }
    }
    println!("rank {rank} ok: {n} cases");
}

#[test]
fn two_mpi_processes_match_one_device_for_every_optimizer_split_and_accumulation() {
    if under_mpirun() {
        return equivalence_as_rank();
    }
    let Some((ok, text)) = mpirun_self(EQUIVALENCE, 2, &[]) else {
        eprintln!("SKIPPED: mpirun not found (apt-get install libopenmpi-dev openmpi-bin)");
        return;
    };
    assert!(ok, "mpirun failed:\n{text}");
    // Five layouts per optimizer (see `equivalence_as_rank`).
    let cases = 5 * optimizers().len();
    let done = |r: usize| format!("rank {r} ok: {cases} cases");
    assert!(text.contains(&done(0)) && text.contains(&done(1)), "{text}");
    for case in 0..cases {
        // A rank's first line may follow the test harness's "test ... " on the same line.
        let tag = format!("case {case} digest ");
        let digests: Vec<&str> = text.lines().filter_map(|l| l.split_once(tag.as_str()).map(|(_, d)| d)).collect();
        assert_eq!(digests.len(), 2, "{text}");
        assert_eq!(digests[0], digests[1], "case {case}: the ranks' results differ bit for bit");
    }
}

#[test]
fn a_rank_that_hangs_ends_every_rank_with_an_error_naming_it() {
    if under_mpirun() {
        let comm = MpiComm::init_with_timeout(Duration::from_secs(2)).expect("MPI initializes");
        comm.note_step(7);
        if comm.rank() == 1 {
            // Never arrives in time; the job must not wait for this sleep.
            std::thread::sleep(Duration::from_secs(60));
        }
        let mut x = [1.0f32; 4];
        let _ = comm.all_reduce_sum(&mut [&mut x[..]]);
        println!("rank {} passed the collective", comm.rank());
        return;
    }
    let started = Instant::now();
    let Some((ok, text)) = mpirun_self(HANG, 2, &[]) else {
        eprintln!("SKIPPED: mpirun not found (apt-get install libopenmpi-dev openmpi-bin)");
        return;
    };
    let took = started.elapsed();
    assert!(!ok, "the job must fail:\n{text}");
    assert!(text.contains("rank 0 of 2, step 7") && text.contains("rank(s) [1]"), "{text}");
    assert!(text.contains("MPI_Abort"), "{text}");
    assert!(!text.contains("passed the collective"), "{text}");
    assert!(took < Duration::from_secs(40), "the hung rank was not stopped: {took:?}\n{text}");
}

const DIES: &str = "a_rank_that_dies_ends_the_job_before_the_timeout";

#[test]
fn a_rank_that_dies_ends_the_job_before_the_timeout() {
    if under_mpirun() {
        let comm = MpiComm::init_with_timeout(Duration::from_secs(120)).expect("MPI initializes");
        if comm.rank() == 1 {
            eprintln!("rank 1 exits without finalizing MPI");
            std::process::exit(3);
        }
        let mut x = [1.0f32; 4];
        let _ = comm.all_reduce_sum(&mut [&mut x[..]]);
        println!("rank 0 passed the collective");
        return;
    }
    let started = Instant::now();
    let Some((ok, text)) = mpirun_self(DIES, 2, &[]) else {
        eprintln!("SKIPPED: mpirun not found (apt-get install libopenmpi-dev openmpi-bin)");
        return;
    };
    let took = started.elapsed();
    assert!(!ok, "the job must fail:\n{text}");
    assert!(text.contains("rank 1 exits"), "{text}");
    assert!(!text.contains("passed the collective"), "{text}");
    // The launcher, not the 120 s timeout, ended rank 0.
    assert!(took < Duration::from_secs(60), "rank 0 waited for the dead rank: {took:?}\n{text}");
}

const THREE: &str = "three_mpi_processes_sum_in_rank_order_and_match_one_device";

/// Three ranks take the gather path of `MpiComm` (two use MPI_Allreduce).
#[test]
fn three_mpi_processes_sum_in_rank_order_and_match_one_device() {
    if under_mpirun() {
        let comm: Arc<dyn Comm> = Arc::new(MpiComm::init().expect("MPI initializes"));
        let model = small_model(ModelKind::Mlp, false, 11);
        let data = batches(BATCH, 3, 5);
        for opt in [
            Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false },
            Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) },
        ] {
            let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
            let mut o = CompileOptions::new(opt.clone(), BATCH);
            o.towers = vec![Device::gpu(0)];
            o.split = SplitPolicy::Weighted(vec![1, 2, 3]);
            let r = run_as(&model, &o, &data, Arc::clone(&comm));
            let (d, var) = max_rel_diff(&r, &single);
            assert!(d <= TOL, "rank {}: {opt:?}: {var} differs by {d}", comm.rank());
            let bits: u64 =
                r.variables.values().flatten().fold(0, |h, x| (h ^ x.to_bits() as u64).wrapping_mul(0x100_0000_01b3));
            println!("rank {} digest {bits:016x}", comm.rank());
        }
        println!("rank {} of 3 ok", comm.rank());
        return;
    }
    let Some((ok, text)) = mpirun_self(THREE, 3, &[]) else {
        eprintln!("SKIPPED: mpirun not found (apt-get install libopenmpi-dev openmpi-bin)");
        return;
    };
    assert!(ok, "mpirun failed:\n{text}");
    for r in 0..3 {
        assert!(text.contains(&format!("rank {r} of 3 ok")), "{text}");
    }
    let digests: Vec<&str> = text.lines().filter_map(|l| l.split_once(" digest ").map(|(_, d)| d)).collect();
    assert_eq!(digests.len(), 6, "{text}");
    let mut sorted = digests.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 2, "every rank ends with the same variables, per optimizer: {digests:?}");
}
