//! `--variables ps` across ranks (ZeRO-1, `passes/src/ps_exchange.rs`), on
//! in-process ranks (`LocalComm`: the same code path as MPI processes,
//! without a launcher; `mpi_ps.rs` runs it under `mpirun`).
//!
//! For 2 and 4 ranks and every optimizer: the losses and every variable a
//! rank holds equal one device on the whole batch within `TOL`, every rank
//! ends bit for bit with the all-reduce path's values (the owner applies the
//! same rank-ordered sum), each optimizer slot lives on exactly one rank,
//! its owner, and the ranks' shared variables agree bit for bit.

use std::collections::BTreeSet;

use towers::compiler::{compile_train, CompileOptions};
use towers::models::ModelKind;
use towers_graph::Device;
use towers_passes::{ProcessGroup, PsStrategy, VarPlacement};
use towers_tests::{batches, max_rel_diff_held, optimizers, run, run_ranks, small_model, TOL};

const BATCH: usize = 24;

fn ps(tasks: u32) -> VarPlacement {
    VarPlacement::Ps { tasks, strategy: PsStrategy::RoundRobin }
}

#[test]
fn ps_ranks_match_one_device_and_keep_each_slot_on_its_owner() {
    let model = small_model(ModelKind::Mlp, false, 11);
    let data = batches(BATCH, 3, 5);
    for world in [2usize, 4] {
        for opt in &optimizers() {
            let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
            let mut o = CompileOptions::new(opt.clone(), BATCH);
            o.towers = vec![Device::gpu(0)];
            o.variables = ps(world as u32);
            let ranks = run_ranks(&model, &o, &data, world);
            let mut reduce = o.clone();
            reduce.variables = VarPlacement::Cpu;
            let all_reduce = run_ranks(&model, &reduce, &data, world);
            // The owners, as every rank's compiler computes them.
            let mut o0 = o.clone();
            o0.process = ProcessGroup::new(0, world).unwrap();
            let groups = compile_train(&model.graph, &model.loss, &o0).expect("compiles").state.ps_groups;
            let every_slot: BTreeSet<&String> = groups.iter().flat_map(|g| &g.slots).collect();
            let what = format!("{opt:?} on {world} ranks");
            assert_eq!(every_slot.len(), opt.slot_names().len() * 4, "{what}: the MLP's 4 variables' slots");
            for (rank, r) in ranks.iter().enumerate() {
                let (d, var) = max_rel_diff_held(r, &single);
                assert!(d <= TOL, "rank {rank}: {what}: {var} differs from one device by {d}");
                for (a, b) in r.losses.iter().zip(&single.losses) {
                    assert!((a - b).abs() <= TOL * b.abs().max(1.0), "rank {rank}: {what}: loss {a} vs {b}");
                }
                let held: BTreeSet<&String> = r.variables.keys().filter(|n| every_slot.contains(n)).collect();
                let owned: BTreeSet<&String> =
                    groups.iter().filter(|g| g.rank == rank).flat_map(|g| &g.slots).collect();
                assert_eq!(held, owned, "rank {rank}: {what}: the slots held are exactly the owned ones");
                for (name, v) in &r.variables {
                    let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(v),
                        bits(&all_reduce[rank].variables[name]),
                        "rank {rank}: {what}: {name} vs the all-reduce path"
                    );
                    if !every_slot.contains(name) {
                        assert_eq!(bits(v), bits(&ranks[0].variables[name]), "rank {rank}: {what}: {name} vs rank 0");
                    }
                }
                assert_eq!(r.losses, all_reduce[rank].losses, "rank {rank}: {what}: the losses vs the all-reduce path");
            }
            // Every slot lives on exactly one rank.
            let mut count = std::collections::BTreeMap::<&String, usize>::new();
            for r in &ranks {
                for n in r.variables.keys().filter(|n| every_slot.contains(n)) {
                    *count.entry(n).or_default() += 1;
                }
            }
            assert!(count.len() == every_slot.len() && count.values().all(|&c| c == 1), "{what}: {count:?}");
        }
    }
}

/// Fewer ps tasks than ranks (2 tasks on 3 ranks: rank 2 owns nothing) and
/// more (3 tasks on 2 ranks: rank 0 runs tasks 0 and 2): tasks map to ranks
/// round-robin, and the run stays exact.
#[test]
fn ps_tasks_map_to_ranks_round_robin() {
    let model = small_model(ModelKind::Mlp, false, 3);
    let data = batches(BATCH, 2, 7);
    let opt = towers_graph::Optimizer::Adam {
        lr: towers_graph::F32(0.01),
        beta1: towers_graph::F32(0.9),
        beta2: towers_graph::F32(0.999),
        epsilon: towers_graph::F32(1e-8),
    };
    let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
    for (world, tasks) in [(3usize, 2u32), (2, 3)] {
        let mut o = CompileOptions::new(opt.clone(), BATCH);
        o.variables = ps(tasks);
        let mut o0 = o.clone();
        o0.process = ProcessGroup::new(0, world).unwrap();
        let groups = compile_train(&model.graph, &model.loss, &o0).expect("compiles").state.ps_groups;
        for g in &groups {
            assert!(g.tasks.iter().all(|&k| k as usize % world == g.rank), "{groups:?}");
        }
        let ranks: BTreeSet<usize> = groups.iter().map(|g| g.rank).collect();
        assert_eq!(ranks.len(), world.min(tasks as usize), "{world} ranks, {tasks} tasks: {groups:?}");
        for (rank, r) in run_ranks(&model, &o, &data, world).iter().enumerate() {
            let (d, var) = max_rel_diff_held(r, &single);
            assert!(d <= TOL, "rank {rank} of {world}, {tasks} tasks: {var} differs by {d}");
        }
    }
}
