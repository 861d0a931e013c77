//! Several processes are exact: W processes of T towers, each feeding its
//! rows of every global batch, compute the update one device computes on the
//! whole batch. The ranks here are threads of one process joined by an
//! in-process communicator (`LocalComm`), running exactly what an MPI
//! process runs (compile for rank r of W, feed its rows, all-reduce the
//! gradient buckets through the communicator); `mpi_training.rs` runs the
//! same under `mpirun`.
//!
//! Tolerance: 2e-5 relative after 3 steps, as the in-process tower
//! equivalence (tests/tests/equivalence.rs): the per-example terms are summed
//! in a different order (per-tower means, weighted by the towers' shares of
//! the global batch, then summed across ranks in rank order). Every rank ends
//! with bit-identical variables.

use std::collections::BTreeMap;
use std::sync::Arc;

use towers::compiler::{compile_train, CompileOptions};
use towers::models::ModelKind;
use towers_graph::{Op, Optimizer, F32};
use towers_passes::{BnUpdates, ProcessGroup, SplitPolicy, VarPlacement};
use towers_runtime::comm::LocalComm;
use towers_runtime::{RuntimeError, Session};
use towers_tests::{batches, max_rel_diff, optimizers, run, run_ranks, small_model, towers, RunResult, TOL};

const BATCH: usize = 24;
const STEPS: usize = 3;

fn check(ranks: &[RunResult], single: &RunResult, what: &str) {
    for (r, got) in ranks.iter().enumerate() {
        let (d, var) = max_rel_diff(got, single);
        assert!(d <= TOL, "{what}: rank {r}: {var} differs from one device by {d}");
        for (a, b) in got.losses.iter().zip(&single.losses) {
            assert!((a - b).abs() <= TOL * b.abs().max(1.0), "{what}: rank {r}: loss {a} vs one device's {b}");
        }
        assert_eq!(got.variables, ranks[0].variables, "{what}: rank {r} differs from rank 0 bit for bit");
        assert_eq!(got.losses, ranks[0].losses, "{what}: rank {r}'s losses differ from rank 0's");
    }
}

#[test]
fn processes_of_one_and_two_towers_match_one_device_for_every_optimizer() {
    let model = small_model(ModelKind::Mlp, false, 11);
    let data = batches(BATCH, STEPS, 5);
    for opt in optimizers() {
        let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
        // (world, towers per process, split over all towers of all ranks)
        let cases: [(usize, u32, SplitPolicy); 5] = [
            (2, 1, SplitPolicy::Even),
            (2, 2, SplitPolicy::Even),
            (3, 1, SplitPolicy::Even),
            (2, 1, SplitPolicy::Weighted(vec![3, 1])),
            (2, 2, SplitPolicy::Weighted(vec![1, 1, 1, 3])),
        ];
        for (world, t, split) in cases {
            for vars in [VarPlacement::Cpu, VarPlacement::Gpu0] {
                let mut o = CompileOptions::new(opt.clone(), BATCH);
                o.towers = towers(t);
                o.split = split.clone();
                o.variables = vars;
                let ranks = run_ranks(&model, &o, &data, world);
                check(&ranks, &single, &format!("{opt:?} {world}x{t} {split:?} {vars:?}"));
            }
        }
    }
}

#[test]
fn accumulation_across_processes_matches_one_device_and_communicates_once() {
    let model = small_model(ModelKind::Mlp, false, 11);
    let data = batches(BATCH, STEPS, 5);
    let opt = Optimizer::Momentum { lr: F32(0.05), momentum: F32(0.9), nesterov: false };
    let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
    let mut o = CompileOptions::new(opt, BATCH);
    o.towers = towers(1);
    o.accumulate = 3;
    check(&run_ranks(&model, &o, &data, 2), &single, "2 processes x 1 tower x 3 micro-batches");
    // One all-reduce per bucket per step, not one per micro-batch: the default
    // 25 MiB bucket holds every gradient and the loss of this small model.
    o.process = ProcessGroup::new(0, 2).unwrap();
    let c = compile_train(&model.graph, &model.loss, &o).unwrap();
    let all_reduces =
        c.plan.streams.iter().flat_map(|s| &s.steps).filter(|s| matches!(s, towers::codegen::Step::AllReduce { .. }));
    assert_eq!(all_reduces.count(), 1);
    assert_eq!(c.state.buckets.len(), 1);
}

#[test]
fn the_convnet_with_dropout_is_exact_across_processes() {
    let model = small_model(ModelKind::Convnet, false, 3);
    let data = batches(BATCH, STEPS, 7);
    let opt = Optimizer::Sgd { lr: F32(0.05) };
    let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
    let mut o = CompileOptions::new(opt, BATCH);
    o.towers = towers(1);
    check(&run_ranks(&model, &o, &data, 2), &single, "convnet with dropout");
}

#[test]
fn batch_norm_over_two_processes_is_batch_norm_over_two_towers() {
    // Batch norm normalizes by each tower's own batch statistics (as in TF1's
    // towers), so the reference is two towers in one process, not one device;
    // the moving averages combine every rank's statistics (BnUpdates::Mean).
    let model = small_model(ModelKind::Convnet, true, 3);
    let data = batches(BATCH, STEPS, 7);
    let opt = Optimizer::Sgd { lr: F32(0.05) };
    let mut two = CompileOptions::new(opt.clone(), BATCH);
    two.towers = towers(2);
    two.bn_updates = BnUpdates::Mean;
    let reference = run(&model, &two, &data);
    let mut o = CompileOptions::new(opt, BATCH);
    o.towers = towers(1);
    o.bn_updates = BnUpdates::Mean;
    check(&run_ranks(&model, &o, &data, 2), &reference, "convnet with batch norm");
}

#[test]
fn small_buckets_split_the_gradients_in_backward_order_each_in_exactly_one_bucket() {
    let model = small_model(ModelKind::Mlp, false, 11);
    let data = batches(BATCH, STEPS, 5);
    let opt = Optimizer::Sgd { lr: F32(0.1) };
    let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
    let mut o = CompileOptions::new(opt, BATCH);
    o.towers = towers(2);
    o.bucket_bytes = 256; // fc1 weights (64x16 f32 = 4 KiB) alone, the small tensors packed
    check(&run_ranks(&model, &o, &data, 2), &single, "256-byte buckets");

    o.process = ProcessGroup::new(1, 2).unwrap();
    let c = compile_train(&model.graph, &model.loss, &o).unwrap();
    let g = &c.graph;
    // Every TowerMean in exactly one bucket, each bucket within the cap unless alone.
    let means: Vec<String> = g
        .node_ids()
        .into_iter()
        .filter(|&i| matches!(g.node(i).op, Op::TowerMean { .. }))
        .map(|i| g.node(i).name.clone())
        .collect();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for b in &c.state.buckets {
        assert!(b.bytes <= 256 || b.members.len() == 1, "{b:?} exceeds the cap with several members");
        for m in &b.members {
            *seen.entry(m.as_str()).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), means.len(), "buckets {:?} vs means {means:?}", c.state.buckets);
    assert!(seen.values().all(|&n| n == 1));
    // Backward order: the logits layer's gradients are reduced before fc1's.
    let bucket_of = |m: &str| c.state.buckets.iter().position(|b| b.members.iter().any(|x| x == m)).unwrap();
    assert!(bucket_of("MLP/logits/weights/grad_mean") < bucket_of("MLP/fc1/weights/grad_mean"));
    assert!(c.state.buckets.len() >= 3, "{:?}", c.state.buckets);
    // Buckets are chained, so every rank issues them in the same order.
    for (i, b) in c.state.buckets.iter().enumerate().skip(1) {
        let id = g.get(&b.node).unwrap();
        let prev = g.get(&c.state.buckets[i - 1].node).unwrap();
        assert_eq!(g.control_inputs(id), vec![prev], "bucket {i}");
    }
    // The collective stream starts bucket 0's all-reduce before fc1's gradient
    // is written: it overlaps the rest of the backward pass.
    let collective = c.plan.streams.iter().find(|s| s.kind == towers_graph::StreamKind::Collective).unwrap();
    let first = collective.steps.iter().position(|s| matches!(s, towers::codegen::Step::AllReduce { .. })).unwrap();
    let fc1_grad_copy = collective.steps[..first].iter().any(|s| format!("{s:?}").contains("fc1/weights/grad_mean"));
    assert!(!fc1_grad_copy, "bucket 0 waits for fc1's gradient: no overlap");
}

/// One tower per rank and an even split: every rank scales its gradient by
/// the same share, so the scale folds past the all-reduce. The bucket holds
/// the tower's gradients themselves (written by their kernels as views,
/// summed on the tower's device), no scaling launch runs before the
/// collective, and each apply scales as it updates (`mean_apply`). An uneven
/// split cannot fold (the ranks' shares differ): the means stay in the
/// bucket. Both are exact (the equivalence test above runs both).
#[test]
fn one_tower_per_rank_folds_the_share_into_the_update() {
    let model = small_model(ModelKind::Mlp, false, 11);
    for vars in [VarPlacement::Cpu, VarPlacement::Gpu0] {
        let mut o = CompileOptions::new(
            Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) },
            BATCH,
        );
        o.towers = towers(1);
        o.variables = vars;
        o.process = ProcessGroup::new(0, 2).unwrap();
        let c = compile_train(&model.graph, &model.loss, &o).unwrap();
        let text = c.plan.to_text();
        assert_eq!(c.state.buckets.len(), 1, "{vars:?}: {:?}", c.state.buckets);
        let b = &c.state.buckets[0];
        assert_eq!(b.device, towers_graph::Device::gpu(0), "{vars:?}: the bucket lives on the tower's device");
        assert!(b.members.iter().all(|m| m.starts_with("tower_0/")), "{vars:?}: {:?}", b.members);
        assert_eq!(b.members.len(), 5, "four gradients and the loss: {:?}", b.members);
        assert!(text.contains("all_reduce/bucket_0 = ["), "{vars:?}: one contiguous bucket buffer:\n{text}");
        assert_eq!(text.matches("mean_apply w=0.5 apply_adam").count(), 4, "{vars:?}:\n{text}");
        assert_eq!(text.matches("weighted_sum w=").count(), 1, "{vars:?}: only the loss's mean scales:\n{text}");

        o.split = SplitPolicy::Weighted(vec![3, 1]);
        let c = compile_train(&model.graph, &model.loss, &o).unwrap();
        let b = &c.state.buckets[0];
        assert!(b.members.iter().all(|m| !m.starts_with("tower_0/")), "{vars:?} uneven: {:?}", b.members);
        assert_eq!(c.plan.to_text().matches("weighted_sum w=").count(), 5, "{vars:?} uneven: every mean scales first");
    }
}

#[test]
fn ranks_whose_variables_differ_all_stop_with_the_same_error() {
    let model = small_model(ModelKind::Mlp, false, 11);
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
    o.towers = towers(1);
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = LocalComm::group(2)
            .into_iter()
            .enumerate()
            .map(|(r, comm)| {
                let (model, mut o) = (&model, o.clone());
                s.spawn(move || {
                    o.process = ProcessGroup::new(r, 2).unwrap();
                    let c = compile_train(&model.graph, &model.loss, &o).unwrap();
                    // Rank 1's first variable drifts (the graph seed gives
                    // both ranks the same initial values).
                    let mut sess = Session::new(model.spec.seed).with_comm(Arc::new(comm));
                    sess.load("train", c.plan).unwrap();
                    if r == 1 {
                        let name = model.graph.trainable_variables()[0];
                        let name = model.graph.node(name).name.clone();
                        let mut v = sess.variable::<f32>(&name).unwrap();
                        v[0] += 1.0;
                        sess.write_variable(&name, &v).unwrap();
                    }
                    match sess.check_replicas("before the first step") {
                        Err(e @ RuntimeError::ReplicasDiffer { .. }) => e.to_string(),
                        other => panic!("rank {r}: expected ReplicasDiffer, got {other:?}"),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(errors[0], errors[1]);
    assert!(errors[0].contains("rank(s) [1] differ from rank 0's"), "{}", errors[0]);
}

#[test]
fn one_towers_statistics_for_batch_norm_is_refused_with_several_processes() {
    let model = small_model(ModelKind::Convnet, true, 3);
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
    o.bn_updates = BnUpdates::Tower0;
    o.process = ProcessGroup::new(0, 2).unwrap();
    let e = compile_train(&model.graph, &model.loss, &o).unwrap_err().to_string();
    assert!(e.contains("use BnUpdates::Mean"), "{e}");
}

#[test]
fn a_weighted_split_names_every_tower_of_every_rank() {
    let model = small_model(ModelKind::Mlp, false, 11);
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
    o.towers = towers(2);
    o.split = SplitPolicy::Weighted(vec![3, 1]);
    o.process = ProcessGroup::new(0, 2).unwrap();
    let e = compile_train(&model.graph, &model.loss, &o).unwrap_err().to_string();
    assert!(e.contains("2 weights") && e.contains("4 towers"), "{e}");
    // Rank 1's rows follow rank 0's: weights 1,1,1,3 of 24 give 4,4 | 4,12.
    o.split = SplitPolicy::Weighted(vec![1, 1, 1, 3]);
    assert_eq!(o.process_rows().unwrap(), 0..8);
    o.process = ProcessGroup::new(1, 2).unwrap();
    assert_eq!(o.process_rows().unwrap(), 8..24);
}

#[test]
fn a_device_of_another_process_is_refused_and_this_processes_own_is_fine() {
    use towers_graph::{layers, DType, GraphBuilder};
    let build = |task: u32| {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, [None, Some(4)]).unwrap();
        let y = b.placeholder("y", DType::I32, [None]).unwrap();
        let logits = b
            .device(&format!("/job:worker/task:{task}/device:CPU:0"), |b| {
                layers::dense(b, "fc", x, 3, layers::Activation::None)
            })
            .unwrap();
        let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
        let loss = b.reduce_mean_all(xent).unwrap();
        let g = b.finish();
        let name = g.node(loss.node).name.clone();
        (g, name)
    };
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
    o.process = ProcessGroup::new(1, 2).unwrap();
    let (g, loss) = build(0);
    let e = compile_train(&g, &loss, &o).unwrap_err().to_string();
    assert!(e.contains("/job:worker/task:0") && e.contains("not a device of this process"), "{e}");
    let (g, loss) = build(1);
    compile_train(&g, &loss, &o).expect("rank 1 may name its own task");
    // In one process only task 0 exists: task 1 was placed here with its task
    // dropped, silently; now refused, naming the node (TF1 cannot satisfy it).
    let one = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
    let e = compile_train(&g, &loss, &one).unwrap_err().to_string();
    assert!(e.contains("/job:worker/task:1") && e.contains("task 0 only") && e.contains("fc/"), "{e}");
    let (g0, loss0) = build(0);
    compile_train(&g0, &loss0, &one).expect("task 0 is this process");
}

/// A loss that sums over the batch (`reduce_sum(xent)`): the replicas'
/// sums are added (weight 1) and the all-reduce adds the ranks' partial
/// sums, so W processes still compute one device's update and loss.
#[test]
fn a_summed_loss_is_exact_across_processes() {
    use towers_graph::layers::{self, Activation};
    use towers_graph::{DType, GraphBuilder, Shape};
    let mut b = GraphBuilder::with_seed(11);
    let x = b.placeholder("images", DType::F32, Shape(vec![None, Some(8), Some(8), Some(1)])).unwrap();
    let y = b.placeholder("labels", DType::I32, Shape(vec![None])).unwrap();
    let f = b.flatten(x).unwrap();
    let h = layers::dense(&mut b, "fc1", f, 16, Activation::Relu).unwrap();
    let logits = layers::dense(&mut b, "fc2", h, 10, Activation::None).unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
    let sum = b.reduce_sum(xent, &[0], false).unwrap();
    b.identity(sum, "loss").unwrap();
    let model = towers_tests::digits_model(b, logits, 11);
    let data = batches(BATCH, STEPS, 5);
    let opt = Optimizer::Sgd { lr: F32(0.002) };
    let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
    for (t, split) in [(1, SplitPolicy::Even), (2, SplitPolicy::Weighted(vec![1, 1, 1, 3]))] {
        let mut o = CompileOptions::new(opt.clone(), BATCH);
        o.towers = towers(t);
        o.split = split.clone();
        check(&run_ranks(&model, &o, &data, 2), &single, &format!("summed loss, 2x{t} {split:?}"));
    }
}
