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

/// Gradients go to their owners only: under `--variables ps` each owned
/// gradient is in a `Step::Reduce` whose root is its owner, so the bytes
/// reduced to rank `r` are exactly the bytes of the variables `r` owns,
/// and what stays all-reduced (the loss) is not a gradient. The plan text
/// and the dot name the root.
#[test]
fn gradients_are_reduced_to_their_owner_only() {
    use towers::codegen::Step;
    let model = small_model(ModelKind::Mlp, false, 5);
    let opt = optimizers()[0].clone();
    for world in [2usize, 4] {
        let mut o = CompileOptions::new(opt.clone(), BATCH);
        o.variables = ps(world as u32);
        o.process = ProcessGroup::new(world - 1, world).unwrap();
        let c = compile_train(&model.graph, &model.loss, &o).expect("compiles");
        let steps: Vec<&Step> = c.plan.streams.iter().flat_map(|s| &s.steps).collect();
        let bytes = |bufs: &[towers::codegen::BufRef]| -> usize {
            bufs.iter().filter_map(|b| c.plan.buffer(b)).map(|b| b.bytes).sum()
        };
        let mut reduced = vec![0usize; world];
        let mut all_reduced = 0;
        for s in &steps {
            match s {
                Step::Reduce { root, buffers, .. } => reduced[*root] += bytes(buffers),
                Step::AllReduce { buffers, .. } => all_reduced += bytes(buffers),
                _ => {}
            }
        }
        let mut owned = vec![0usize; world];
        for g in &c.state.ps_groups {
            owned[g.rank] += g.variable_bytes;
        }
        assert_eq!(reduced, owned, "{world} ranks: bytes reduced to each rank vs the bytes it owns");
        assert!(all_reduced < 64, "{world} ranks: only the loss stays all-reduced, got {all_reduced} B");
        let text = c.plan.to_text();
        assert!(text.contains("reduce→rank 0 sum over ranks"), "{text}");
        let dot = towers_graph::dot::to_dot(&c.graph).expect("dot");
        assert!(dot.contains("reduce→rank 0"), "{dot}");
        // A plan compiled for 4 ranks reduces to ranks 2 and 3: a communicator of 2
        // ranks refuses it at load, naming the flag.
        if world == 4 {
            let comm = std::sync::Arc::new(towers_runtime::comm::LocalComm::group(2).remove(0));
            let mut sess = towers_runtime::Session::new(1).with_comm(comm);
            let e = sess.load("train", c.plan.clone()).expect_err("root 3 of 2 ranks").to_string();
            assert!(e.contains("the communicator has 2 rank(s)") && e.contains("--world-size"), "{e}");
        }
    }
}

/// The cost model's ps layouts (`towers::cost::ps`): each rank's payload
/// matches what the compiled programs exchange (all-reduce: every rank sends
/// and receives every gradient; ps: every rank receives, as a sum or as a
/// value, each variable once, and sends its gradients plus its own values),
/// and the predicted exchange orders the layouts as their busiest rank's
/// bytes do.
#[test]
fn the_cost_model_orders_the_ps_layouts_by_their_bytes() {
    use towers::cost::ps::{predict_layouts, Link};
    let model = small_model(ModelKind::Mlp, false, 5);
    let base = CompileOptions::new(optimizers()[0].clone(), BATCH);
    let link = Link { bytes_per_ns: 10.0, latency_ns: 0.0 };
    let p = predict_layouts(&model.graph, &model.loss, &base, 2, link).expect("predicts");
    assert_eq!(p.iter().map(|l| l.name).collect::<Vec<_>>(), ["all-reduce", "ps", "ps-greedy"]);
    let grads = p[0].ranks[0].sent;
    for r in &p[0].ranks {
        assert_eq!((r.sent, r.received), (grads, grads), "all-reduce: {r:?}");
    }
    for l in &p[1..] {
        let own: usize = l.ranks.iter().map(|r| r.sent - grads).sum();
        assert!(own > 0 && own < grads, "{}: the owners' values are the variables: {:?}", l.name, l.ranks);
        for r in &l.ranks {
            assert_eq!(r.received, grads, "{}: each variable arrives once, as its sum or its value: {r:?}", l.name);
        }
    }
    let busiest = |i: usize| p[i].ranks.iter().map(|r| r.sent + r.received).max().unwrap();
    for i in 0..p.len() {
        for j in 0..p.len() {
            if busiest(i) < busiest(j) {
                assert!(p[i].exchange_ns < p[j].exchange_ns, "{} vs {}: {p:?}", p[i].name, p[j].name);
            }
        }
    }
    // Round-robin puts every weight matrix on task 0; greedy balances bytes.
    assert!(busiest(2) < busiest(1), "{p:?}");
    assert!(predict_layouts(&model.graph, &model.loss, &base, 1, link).is_err());
}

/// The owners' values come back inside the step, overlapping it: each
/// owner's `Broadcast` is chained into the collectives right after the last
/// gradient bucket reduced to it, in the order the backward pass finishes
/// the gradients, the same order on every rank. With one tensor per bucket
/// (MLP, round-robin: w0, w1 on rank 0, b0, b1 on rank 1; backward order
/// b1, w1, b0, w0), rank 1's values go out before w0's gradient is reduced.
#[test]
fn value_broadcasts_follow_each_owners_last_reduce_in_backward_order() {
    use towers_graph::Op;
    let model = small_model(ModelKind::Mlp, false, 5);
    let mut orders = Vec::new();
    for rank in 0..2 {
        let mut o = CompileOptions::new(optimizers()[0].clone(), BATCH);
        o.variables = ps(2);
        o.bucket_bytes = 1;
        o.process = ProcessGroup::new(rank, 2).unwrap();
        let c = compile_train(&model.graph, &model.loss, &o).expect("compiles");
        let g = &c.graph;
        // Every collective in the order the chain of control edges imposes.
        let mut collectives: Vec<_> = g
            .node_ids()
            .into_iter()
            .filter(|&id| matches!(g.node(id).op, Op::AllReduce { .. } | Op::Broadcast { .. }))
            .collect();
        collectives.sort_by(|&a, &b| {
            if g.reaches(a, b) {
                std::cmp::Ordering::Less
            } else {
                assert!(g.reaches(b, a), "rank {rank}: {} and {} are not ordered", g.node(a).name, g.node(b).name);
                std::cmp::Ordering::Greater
            }
        });
        let label = |id| match g.node(id).op {
            Op::AllReduce { root: Some(r), .. } => {
                let b = c.state.buckets.iter().find(|b| b.node == g.node(id).name).unwrap();
                format!("reduce {}→{r}", b.members.join("+"))
            }
            Op::AllReduce { root: None, .. } => "all_reduce".to_string(),
            Op::Broadcast { root, .. } => format!("broadcast {root}"),
            _ => unreachable!(),
        };
        let order: Vec<String> = collectives.into_iter().map(label).collect();
        // Each broadcast right after its owner's last reduce.
        for (i, l) in order.iter().enumerate() {
            if let Some(r) = l.strip_prefix("broadcast ") {
                let last = order.iter().rposition(|x| x.ends_with(&format!("→{r}"))).unwrap();
                assert!(last < i && order[last + 1..i].iter().all(|x| x.starts_with("broadcast")), "{order:?}");
            }
        }
        let first_broadcast = order.iter().position(|x| x.starts_with("broadcast")).unwrap();
        assert!(order[first_broadcast..].iter().any(|x| x.starts_with("reduce")), "no overlap: {order:?}");
        orders.push(order);
    }
    assert_eq!(orders[0], orders[1], "every rank issues the same collectives in the same order");
}
