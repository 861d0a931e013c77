//! The plan's collective step on the CPU backend: sessions on threads as the
//! ranks of an in-process communicator group.

mod common;

use std::sync::Arc;

use towers_codegen::Step;
use towers_runtime::{Comm, LocalComm, RuntimeError, Session};

fn input(rank: usize, step: usize) -> Vec<f32> {
    (0..6).map(|i| (i as f32 - 2.0) * (rank as f32 + 1.0) + step as f32).collect()
}

fn relu(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v.max(0.0)).collect()
}

#[test]
fn two_sessions_on_two_threads_hold_the_sum_after_run() {
    let handles: Vec<_> = LocalComm::group(2)
        .into_iter()
        .map(|comm| {
            std::thread::spawn(move || {
                let rank = comm.rank();
                let mut s = Session::new(0).with_comm(Arc::new(comm));
                s.load("two", common::two_device_plan_with_all_reduce()).unwrap();
                let mut seen = Vec::new();
                for step in 0..5 {
                    s.feed("two", "x", &input(rank, step)).unwrap();
                    s.run("two").unwrap();
                    seen.push((s.fetch::<f32>("two", "Relu").unwrap(), s.fetch::<f32>("two", "out").unwrap()));
                }
                seen
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for step in 0..5 {
        let (a, b) = (relu(&input(0, step)), relu(&input(1, step)));
        let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        let out: Vec<f32> = sum.iter().map(|v| -v + -v).collect();
        for (rank, r) in results.iter().enumerate() {
            assert_eq!(r[step].0, sum, "Relu, rank {rank}, step {step}");
            assert_eq!(r[step].1, out, "out, rank {rank}, step {step}");
        }
    }
}

#[test]
fn world_size_one_leaves_the_buffers_unchanged() {
    let mut s = Session::new(0);
    assert_eq!(s.comm().world_size(), 1);
    s.load("two", common::two_device_plan_with_all_reduce()).unwrap();
    let x = input(0, 3);
    s.feed("two", "x", &x).unwrap();
    s.run("two").unwrap();
    assert_eq!(s.fetch::<f32>("two", "Relu").unwrap(), relu(&x));
    let mut out = [0f32; 6];
    s.fetch_into("two", "out", &mut out).unwrap();
    assert_eq!(out.to_vec(), relu(&x).iter().map(|v| -v).collect::<Vec<_>>());
    let prof = {
        s.set_profiling("two", true).unwrap();
        s.run("two").unwrap();
        s.profile("two").unwrap()
    };
    assert_eq!(prof.iter().filter(|p| p.kernel == "all_reduce").count(), 2, "{prof:?}");
}

#[test]
fn a_rank_that_left_is_an_error_naming_the_collective_not_a_hang() {
    let mut comms = LocalComm::group(2);
    drop(comms.pop());
    let mut s = Session::new(0).with_comm(Arc::new(comms.pop().unwrap()));
    s.load("two", common::two_device_plan_with_all_reduce()).unwrap();
    s.feed("two", "x", &input(0, 0)).unwrap();
    let e = s.run("two").unwrap_err();
    assert!(matches!(&e, RuntimeError::Collective { node, .. } if node == "allreduce/relu"), "{e}");
    assert!(e.to_string().contains("rank 1 left"), "{e}");
}

#[test]
fn an_all_reduce_of_a_copy_destination_is_refused_at_load() {
    // Copies are elided on the CPU backend: a copy's destination is its
    // source, so writing it would change the source too.
    let mut plan = common::two_device_plan();
    let to = plan.streams[1]
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Copy { to, .. } => Some(to.clone()),
            _ => None,
        })
        .expect("a copy");
    plan.streams[1].steps.push(Step::AllReduce { buffers: vec![to], node: "bad".into() });
    let e = Session::new(0).load("two", plan).unwrap_err();
    assert!(matches!(&e, RuntimeError::BadPlan { .. }), "{e}");
    assert!(e.to_string().contains("all-reduce 'bad' writes") && e.to_string().contains("copy"), "{e}");
}

#[test]
fn an_all_reduce_of_an_i32_buffer_is_refused_at_load() {
    let mut plan = common::mlp_plan();
    let labels = plan.feeds.iter().find(|(n, _)| n == "labels").unwrap().1.clone();
    plan.streams[0].steps.push(Step::AllReduce { buffers: vec![labels], node: "bad".into() });
    let e = Session::new(0).load("train", plan).unwrap_err().to_string();
    assert!(e.contains("sums f32 buffers") && e.contains("i32"), "{e}");
}
