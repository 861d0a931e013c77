//! `--variables ps` across MPI processes (`--features mpi`), under a real
//! launcher: the parameter-server exchange of `passes/src/ps_exchange.rs`
//! (each rank applies only the variables it owns and keeps only their
//! optimizer slots; the owners broadcast the new values) at 2 and 4 ranks
//! (4 oversubscribed), and with a separate parameter-server rank
//! (`--ps-ranks 1`: 2 workers + 1 ps rank that runs no towers, 3
//! oversubscribed), for every optimizer of `optimizers()`.
//!
//! Each test re-runs this binary under `mpirun -np N` (each process runs
//! only that test, as one rank). Every rank compares itself with one device
//! on the whole batch, computed in the rank's process, at `TOL` (the
//! tolerance of `mpi_training.rs` and `processes.rs`) and with the
//! all-reduce path on the same ranks (bit for bit), checks that it holds
//! exactly the slots it owns, and prints a digest of the variables every
//! rank holds (all but the slots), which the launcher test compares across
//! ranks bit for bit. Without `mpirun` the tests say SKIPPED, except under
//! CI, where they fail.
#![cfg(feature = "mpi")]

use std::collections::BTreeSet;
use std::sync::Arc;

use towers::compiler::{compile_train, CompileOptions};
use towers::models::ModelKind;
use towers_graph::Device;
use towers_passes::{ProcessGroup, PsStrategy, VarPlacement};
use towers_runtime::comm::{Comm, MpiComm};
use towers_tests::{batches, max_rel_diff_held, mpirun_self, optimizers, run, run_as, small_model, under_mpirun, TOL};

const BATCH: usize = 24;
const TWO: &str = "two_ps_ranks_match_one_device_for_every_optimizer";
const FOUR: &str = "four_ps_ranks_match_one_device_for_every_optimizer";
const SEPARATE: &str = "two_workers_and_a_ps_rank_match_one_device_for_every_optimizer";
/// The environment variable that gives the ranks `--ps-ranks` (unset: 0).
const PS_RANKS: &str = "TOWERS_TEST_PS_RANKS";

/// One rank's part: every optimizer, compared with one device.
fn as_rank() {
    let comm: Arc<dyn Comm> = Arc::new(MpiComm::init().expect("MPI initializes"));
    let (rank, world) = (comm.rank(), comm.world_size());
    let k: usize = std::env::var(PS_RANKS).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let group = |r: usize| ProcessGroup::new(r, world).and_then(|p| p.with_ps_ranks(k)).unwrap();
    let model = small_model(ModelKind::Mlp, false, 11);
    let data = batches(BATCH, 3, 5);
    let mut n = 0;
    for opt in &optimizers() {
        let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
        let mut o = CompileOptions::new(opt.clone(), BATCH);
        o.towers = vec![Device::gpu(0)];
        let tasks = if k > 0 { k } else { world } as u32;
        o.variables = VarPlacement::Ps { tasks, strategy: PsStrategy::RoundRobin };
        o.process = group(0);
        let mut mine = o.clone();
        mine.process = group(rank);
        let groups = compile_train(&model.graph, &model.loss, &mine).expect("compiles").state.ps_groups;
        let r = run_as(&model, &o, &data, Arc::clone(&comm));
        let what = format!("rank {rank} of {world}: {opt:?}");
        let (d, var) = max_rel_diff_held(&r, &single);
        assert!(d <= TOL, "{what}: {var} differs from one device by {d}");
        for (a, b) in r.losses.iter().zip(&single.losses) {
            assert!((a - b).abs() <= TOL * b.abs().max(1.0), "{what}: loss {a} vs {b}");
        }
        // The all-reduce path (--variables cpu) on the same ranks: the owner
        // applies the same rank-ordered sum, so every value held is the same
        // bit for bit (at 4 ranks this also covers the shared-memory
        // in-place sum of ranks 2 and up). With a ps rank there is no such
        // layout (it runs no towers): one device at TOL and the ranks'
        // digests below cover it.
        if k == 0 {
            let mut cpu = o.clone();
            cpu.variables = VarPlacement::Cpu;
            let reduced = run_as(&model, &cpu, &data, Arc::clone(&comm));
            for (name, v) in &r.variables {
                let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(v), bits(&reduced.variables[name]), "{what}: {name} vs the all-reduce path");
            }
            assert_eq!(r.losses, reduced.losses, "{what}: the losses vs the all-reduce path");
        }
        let every_slot: BTreeSet<&String> = groups.iter().flat_map(|g| &g.slots).collect();
        let held: BTreeSet<&String> = r.variables.keys().filter(|k| every_slot.contains(k)).collect();
        let owned: BTreeSet<&String> = groups.iter().filter(|g| g.rank == rank).flat_map(|g| &g.slots).collect();
        assert_eq!(held, owned, "{what}: the slots held are exactly the owned ones");
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let shared = r.variables.iter().filter(|(k, _)| !every_slot.contains(k)).flat_map(|(_, v)| v);
        for x in r.losses.iter().chain(shared) {
            h = (h ^ x.to_bits() as u64).wrapping_mul(0x100_0000_01b3);
        }
        println!("case {n} digest {h:016x} slots {}", held.len());
        n += 1;
    }
    println!("rank {rank} ok: {n} cases");
}

/// Launch `test` on `np` ranks (the last `ps_ranks` of them ps ranks) and
/// check every rank passed and agreed.
fn launch(test: &str, np: usize, ps_ranks: usize) {
    let k = ps_ranks.to_string();
    let Some((ok, text)) = mpirun_self(test, np, &[(PS_RANKS, &k)]) else {
        eprintln!("SKIPPED: mpirun not found (apt-get install libopenmpi-dev openmpi-bin)");
        return;
    };
    assert!(ok, "mpirun failed:\n{text}");
    let cases = optimizers().len();
    for r in 0..np {
        assert!(text.contains(&format!("rank {r} ok: {cases} cases")), "{text}");
    }
    for case in 0..cases {
        let tag = format!("case {case} digest ");
        let digests: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_once(tag.as_str()).map(|(_, d)| d.split_whitespace().next().unwrap_or("")))
            .collect();
        assert_eq!(digests.len(), np, "{text}");
        assert!(
            digests.iter().all(|d| *d == digests[0]),
            "case {case}: the ranks' shared variables differ: {digests:?}"
        );
    }
}

#[test]
fn two_ps_ranks_match_one_device_for_every_optimizer() {
    if under_mpirun() {
        return as_rank();
    }
    launch(TWO, 2, 0);
}

#[test]
fn four_ps_ranks_match_one_device_for_every_optimizer() {
    if under_mpirun() {
        return as_rank();
    }
    launch(FOUR, 4, 0);
}

#[test]
fn two_workers_and_a_ps_rank_match_one_device_for_every_optimizer() {
    if under_mpirun() {
        return as_rank();
    }
    launch(SEPARATE, 3, 1);
}
