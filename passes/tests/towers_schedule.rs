//! Scheduling on fake devices (no device needed), write-after-read edges,
//! determinism, batch-norm policies, gradient accumulation and dropout rows.

mod towers_util;

use std::collections::{BTreeMap, BTreeSet};

use towers_graph::{text::to_text, Device, Op};
use towers_passes::schedule::check_deadlock_free;
use towers_passes::*;
use towers_util::*;

fn check_schedule(g: &towers_graph::Graph, s: &Schedule) {
    check_deadlock_free(s).unwrap();
    let stream_of: BTreeMap<String, usize> = s
        .streams
        .iter()
        .enumerate()
        .flat_map(|(i, st)| {
            st.items.iter().filter_map(move |it| match it {
                ScheduleItem::Run(n) => Some((n.clone(), i)),
                _ => None,
            })
        })
        .collect();
    // Every node with work runs once; Variables, Placeholders, Consts never.
    for id in g.node_ids() {
        let n = g.node(id);
        let scheduled = !matches!(n.op, Op::Variable { .. } | Op::Placeholder { .. } | Op::Const { .. });
        assert_eq!(stream_of.contains_key(&n.name), scheduled, "{}", n.name);
    }
    let mut recorded_on = BTreeMap::new();
    for (i, st) in s.streams.iter().enumerate() {
        let mut waited = BTreeSet::new();
        for it in &st.items {
            match it {
                ScheduleItem::Record(e) => assert!(recorded_on.insert(*e, i).is_none(), "event {e} recorded twice"),
                ScheduleItem::Wait(e) => {
                    assert!(waited.insert(*e), "{}: duplicate wait {e}", st.name())
                }
                ScheduleItem::Run(n) => {
                    let id = g.get(n).unwrap();
                    let want = match g.node(id).op {
                        Op::Copy => StreamKind::Copy,
                        Op::TowerMean { .. } => StreamKind::Collective,
                        _ => StreamKind::Compute,
                    };
                    // A copy runs on the accelerator side's copy stream
                    // (host-to-device: the destination; otherwise the source).
                    let dev = match g.node(id).op {
                        Op::Copy => {
                            let src = g.node(g.inputs(id)[0].node).device.unwrap();
                            Some(towers_passes::schedule::copy_stream_device(src, g.node(id).device.unwrap()))
                        }
                        _ => g.node(id).device,
                    };
                    assert_eq!((st.kind, Some(st.device)), (want, dev), "{n}");
                }
            }
        }
    }
    assert_eq!(recorded_on.len(), s.num_events);
    // Events only across streams: no stream waits for its own event.
    for (i, st) in s.streams.iter().enumerate() {
        for it in &st.items {
            if let ScheduleItem::Wait(e) = it {
                assert_ne!(recorded_on[e], i, "{} waits on its own event {e}", st.name());
            }
        }
    }
    // Every cross-stream edge is covered by a wait before the consumer.
    for st in &s.streams {
        let mut waited = BTreeSet::new();
        for it in &st.items {
            match it {
                ScheduleItem::Wait(e) => {
                    waited.insert(*e);
                }
                ScheduleItem::Run(n) => {
                    let id = g.get(n).unwrap();
                    let preds: Vec<_> = g.inputs(id).iter().map(|t| t.node).chain(g.control_inputs(id)).collect();
                    for p in preds {
                        let pn = &g.node(p).name;
                        if let Some(&ps) = stream_of.get(pn) {
                            if s.streams[ps].name() != st.name() {
                                let rec = s.streams[ps]
                                    .items
                                    .iter()
                                    .position(|x| *x == ScheduleItem::Run(pn.clone()))
                                    .unwrap();
                                let Some(ScheduleItem::Record(e)) = s.streams[ps].items.get(rec + 1) else {
                                    panic!("no record after {pn}")
                                };
                                assert!(waited.contains(e), "{n} on {} does not wait for {pn}", st.name());
                            }
                        }
                    }
                }
                ScheduleItem::Record(_) => {}
            }
        }
    }
}

#[test]
fn schedules_have_events_only_across_streams_and_cannot_deadlock() {
    for n in 1..=4 {
        for vars in [VarPlacement::Cpu, VarPlacement::Gpu0, VarPlacement::RoundRobin, VarPlacement::Greedy] {
            let (g, _) = compile(n, 24, vars).unwrap();
            let s = g.program().schedule.as_ref().unwrap();
            check_schedule(&g, s);
            let names: Vec<String> = s.streams.iter().map(|x| x.name()).collect();
            let mut sorted = names.clone();
            sorted.sort_by_key(|x| {
                let st = s.streams.iter().find(|y| y.name() == *x).unwrap();
                (st.device, st.kind)
            });
            assert_eq!(names, sorted);
            assert!(names.contains(&"gpu:0/compute".to_string()));
            assert!(names.contains(&"gpu:0/copy".to_string()));
        }
    }
}

#[test]
fn deadlock_checker_rejects_a_wait_before_its_record() {
    let s = Schedule {
        streams: vec![
            ScheduledStream {
                device: Device::gpu(0),
                kind: StreamKind::Compute,
                items: vec![ScheduleItem::Wait(1), ScheduleItem::Record(0)],
            },
            ScheduledStream {
                device: Device::gpu(1),
                kind: StreamKind::Compute,
                items: vec![ScheduleItem::Wait(0), ScheduleItem::Record(1)],
            },
        ],
        num_events: 2,
    };
    assert!(check_deadlock_free(&s).unwrap_err().contains("deadlock"));
}

#[test]
fn writers_run_after_every_other_reader_of_their_variable() {
    for vars in [VarPlacement::Cpu, VarPlacement::Gpu0] {
        let (g, _) = compile(2, 24, vars).unwrap();
        let mut checked = 0;
        for w in g.node_ids() {
            let muts = g.node(w).op.mutated_inputs();
            for t in g.inputs(w).iter().take(muts.end) {
                // Readers of the variable, and readers of its copies.
                let mut readers = g.consumers(t.node);
                for (c, _, _) in g.consumers(t.node) {
                    if matches!(g.node(c).op, Op::Copy) {
                        readers.extend(g.consumers(c));
                    }
                }
                for (c, _, _) in readers {
                    if c != w {
                        assert!(
                            g.reaches(c, w),
                            "{} may overwrite {} before {} reads it",
                            g.node(w).name,
                            g.node(t.node).name,
                            g.node(c).name
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 0);
    }
    // A reader that the update does not already follow (a summary of the
    // weights, reading them through their copy to the host) gets a control
    // edge into the apply: a backend may alias the copy to the variable.
    let (mut g, mut st) = mlp(false, false);
    let w = g.get("fc1/weights").unwrap();
    g.add(towers_graph::NewNode::new("summary/fc1_norm", Op::L2Loss, vec![towers_graph::Tensor::new(w, 0)])).unwrap();
    towers_pm(gpus(2), 1, 24, SplitPolicy::Even, VarPlacement::Gpu0, BnUpdates::Mean).run(&mut g, &mut st).unwrap();
    let apply = g
        .node_ids()
        .into_iter()
        .find(|&i| {
            matches!(g.node(i).op, Op::ApplyGradient { .. }) && g.node(g.inputs(i)[0].node).name == "fc1/weights"
        })
        .unwrap();
    let ctrl: Vec<String> = g.control_inputs(apply).iter().map(|&c| g.node(c).name.clone()).collect();
    assert!(ctrl.contains(&"summary/fc1_norm".to_string()), "{ctrl:?}");
    assert!(g.reaches(g.get("fc1/weights/read_cpu_0").unwrap(), apply));
    check_schedule(&g, g.program().schedule.as_ref().unwrap());
}

#[test]
fn the_whole_pipeline_is_deterministic() {
    for vars in [VarPlacement::Greedy, VarPlacement::RoundRobin] {
        let (g1, _) = compile(3, 24, vars).unwrap();
        let (g2, _) = compile(3, 24, vars).unwrap();
        assert_eq!(to_text(&g1).unwrap(), to_text(&g2).unwrap());
        assert_eq!(g1.program().schedule, g2.program().schedule);
    }
}

#[test]
fn batch_norm_updates_by_policy() {
    for (policy, want_mean) in [(BnUpdates::Mean, true), (BnUpdates::Tower0, false)] {
        let (mut g, mut st) = mlp(false, true);
        towers_pm(gpus(2), 1, 24, SplitPolicy::Weighted(vec![2, 1]), VarPlacement::Cpu, policy)
            .run(&mut g, &mut st)
            .unwrap();
        let upd = g.collection("update_ops").to_vec();
        assert_eq!(upd.len(), 2, "update ops are not replicated");
        for u in upd {
            let id = g.get(&u).unwrap();
            let stat = g.node(g.inputs(id)[1].node).clone();
            let var = g.node(g.inputs(id)[0].node).name.clone();
            assert_eq!(g.node(id).device, g.node(g.get(&var).unwrap()).device);
            if want_mean {
                // Copies to the variable's device sit in between the mean and the update only if they differ.
                assert_eq!(
                    stat.op,
                    Op::TowerMean { weights: vec![towers_graph::F32(2.0 / 3.0), towers_graph::F32(1.0 / 3.0)] },
                    "{u}"
                );
                assert_eq!(stat.placement_reason, Some(format!("colocated with {var}")));
            } else {
                let src = if matches!(stat.op, Op::Copy) {
                    g.node(g.inputs(g.get(&stat.name).unwrap())[0].node).name.clone()
                } else {
                    stat.name.clone()
                };
                assert!(src.starts_with("tower_0/"), "{u} reads {src}");
            }
        }
        assert!(ids_of(&g, |op| matches!(op, Op::BatchNorm { .. })).len() == 2);
    }
}

#[test]
fn accumulation_runs_micro_batches_in_sequence() {
    let (mut g, mut st) = mlp(true, false);
    towers_pm(gpus(2), 2, 24, SplitPolicy::Even, VarPlacement::Cpu, BnUpdates::Mean).run(&mut g, &mut st).unwrap();
    assert_eq!(st.tower_batches, vec![6; 4]);
    assert_eq!(
        st.replicas.iter().map(|r| r.prefix.as_str()).collect::<Vec<_>>(),
        ["tower_0/micro_0/", "tower_0/micro_1/", "tower_1/micro_0/", "tower_1/micro_1/"]
    );
    let loss0 = g.get("tower_0/micro_0/Mean").unwrap();
    let mm1 = g.get("tower_0/micro_1/fc1/MatMul").unwrap();
    assert!(g.reaches(loss0, mm1), "micro-batch 1 must run after micro-batch 0");
    assert_eq!(g.node(mm1).device, Some(Device::gpu(0)));
    assert_eq!(g.node(mm1).tower, Some(0));
    // Dropout rows follow the global batch: replica r starts at 6r.
    for (r, rep) in st.replicas.iter().enumerate() {
        let d = g.get(&format!("{}dropout", rep.prefix)).unwrap();
        let Op::Dropout { first_row, .. } = g.node(d).op else { panic!() };
        assert_eq!(first_row, 6 * r);
    }
    let Op::TowerMean { weights } = &g.node(g.get("fc1/weights/grad_mean").unwrap()).op else { panic!() };
    assert_eq!(weights.len(), 4);
    check_schedule(&g, g.program().schedule.as_ref().unwrap());
}

#[test]
fn manual_average_gradients_checks_the_variable_sets() {
    let (mut g, st) = mlp(false, false);
    let t = |v: &str| (v.to_string(), st.grads[v].resolve(&g).unwrap());
    let a = vec![t("fc1/weights"), t("fc1/biases")];
    let b = vec![t("fc1/weights")];
    let e = average_gradients(&mut g, &[a.clone(), b], &[0.5, 0.5]).unwrap_err().to_string();
    assert!(e.contains("tower 1 has no gradient for [fc1/biases]"), "{e}");
    let e = average_gradients(&mut g, &[a.clone(), a.clone()], &[0.5, 0.6]).unwrap_err().to_string();
    assert!(e.contains("sum to 1"), "{e}");
    let out = average_gradients(&mut g, &[a.clone(), a], &[0.5, 0.5]).unwrap();
    assert_eq!(g.node(out[0].1.node).name, "fc1/weights/grad_mean");
}

#[test]
fn bind_batch_rejects_unknown_feature_dims() {
    let mut b = towers_graph::GraphBuilder::new();
    b.placeholder("x", towers_graph::DType::F32, [None, None]).unwrap();
    let mut g = b.finish();
    let e =
        PassManager::new().add(BindBatch::new(8)).run(&mut g, &mut CompileState::default()).unwrap_err().to_string();
    assert!(e.contains("'x'") && e.contains("unknown dimension 1"), "{e}");
}
