//! `--ps-ranks K` (`ProcessGroup::ps_ranks`): the last K ranks are
//! parameter-server ranks that run no towers, on in-process ranks
//! (`LocalComm`, the code path of MPI processes; `mpi_ps.rs` runs it under
//! `mpirun`).
//!
//! For every optimizer, 2 workers + 1 ps rank and 2 workers + 2 ps ranks:
//! every rank's losses and held variables equal one device on the whole
//! batch within `TOL`, and equal the co-located run on the 2 workers alone
//! bit for bit (a ps rank adds `-0.0`, the exact additive identity, to
//! every rank-ordered sum); the slots live on the ps ranks only, and a ps
//! rank's program holds no tower (no feed, no forward pass).

use std::collections::BTreeSet;

use towers::compiler::{compile_train, CompileOptions};
use towers::models::ModelKind;
use towers_graph::{Device, Op};
use towers_passes::{ProcessGroup, PsStrategy, VarPlacement};
use towers_tests::{batches, max_rel_diff_held, optimizers, run, run_ranks, small_model, TOL};

const BATCH: usize = 24;

fn ps(tasks: u32) -> VarPlacement {
    VarPlacement::Ps { tasks, strategy: PsStrategy::RoundRobin }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn ps_ranks_run_no_towers_and_match_one_device_for_every_optimizer() {
    let model = small_model(ModelKind::Mlp, false, 11);
    let data = batches(BATCH, 3, 5);
    for k in [1usize, 2] {
        let world = 2 + k;
        for opt in &optimizers() {
            let what = format!("{opt:?}, 2 workers + {k} ps ranks");
            let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
            let mut o = CompileOptions::new(opt.clone(), BATCH);
            o.towers = vec![Device::gpu(0)];
            o.variables = ps(k as u32);
            let mut sep = o.clone();
            sep.process = ProcessGroup::new(0, world).unwrap().with_ps_ranks(k).unwrap();
            let ranks = run_ranks(&model, &sep, &data, world);
            let colocated = run_ranks(&model, &o, &data, 2);
            let groups = compile_train(&model.graph, &model.loss, &sep).expect("compiles").state.ps_groups;
            assert_eq!(groups.iter().map(|g| g.rank).collect::<Vec<_>>(), (2..world).collect::<Vec<_>>(), "{what}");
            let every_slot: BTreeSet<&String> = groups.iter().flat_map(|g| &g.slots).collect();
            for (rank, r) in ranks.iter().enumerate() {
                let (d, var) = max_rel_diff_held(r, &single);
                assert!(d <= TOL, "rank {rank}: {what}: {var} differs from one device by {d}");
                assert_eq!(r.losses.len(), single.losses.len(), "rank {rank}: {what}");
                for (a, b) in r.losses.iter().zip(&single.losses) {
                    assert!((a - b).abs() <= TOL * b.abs().max(1.0), "rank {rank}: {what}: loss {a} vs {b}");
                }
                assert_eq!(bits(&r.losses), bits(&colocated[0].losses), "rank {rank}: {what}: losses vs co-located");
                for (name, v) in r.variables.iter().filter(|(n, _)| !every_slot.contains(n)) {
                    assert_eq!(bits(v), bits(&colocated[0].variables[name]), "rank {rank}: {what}: {name}");
                }
                let held: BTreeSet<&String> = r.variables.keys().filter(|n| every_slot.contains(n)).collect();
                let owned: BTreeSet<&String> =
                    groups.iter().filter(|g| g.rank == rank).flat_map(|g| &g.slots).collect();
                assert_eq!(held, owned, "rank {rank}: {what}: the slots held are exactly the owned ones");
            }
        }
        // A ps rank's program: no feed, no tower's forward pass.
        let mut mine = CompileOptions::new(optimizers()[0].clone(), BATCH);
        mine.towers = vec![Device::gpu(0)];
        mine.variables = ps(k as u32);
        mine.process = ProcessGroup::new(world - 1, world).unwrap().with_ps_ranks(k).unwrap();
        let c = compile_train(&model.graph, &model.loss, &mine).expect("compiles");
        for id in c.graph.node_ids() {
            let n = c.graph.node(id);
            assert!(!matches!(n.op, Op::Placeholder { .. } | Op::MatMul { .. }), "ps rank holds '{}'", n.name);
        }
    }
}

#[test]
fn ps_ranks_refuse_a_group_without_workers_or_without_sharded_variables() {
    let e = ProcessGroup::new(0, 2).unwrap().with_ps_ranks(2).unwrap_err().to_string();
    assert!(e.contains("--ps-ranks 2") && e.contains("no worker"), "{e}");
    let model = small_model(ModelKind::Mlp, false, 11);
    let mut o = CompileOptions::new(optimizers()[0].clone(), BATCH);
    o.towers = vec![Device::gpu(0)];
    o.process = ProcessGroup::new(0, 3).unwrap().with_ps_ranks(1).unwrap();
    let e = compile_train(&model.graph, &model.loss, &o).expect_err("refused").to_string();
    assert!(e.contains("ProcessGroup::ps_ranks = 1 needs CompileOptions::variables = VarPlacement::Ps"), "{e}");
    assert!(e.contains("CLI: --variables ps"), "{e}");
}
