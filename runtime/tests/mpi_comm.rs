//! The MPI communicator (`--features mpi`): real processes under `mpirun`.
//!
//! `two_mpi_ranks_reduce_in_rank_order_and_run_a_plan` re-runs this test
//! binary under `mpirun -np 2` (each process runs only that test, as one
//! rank: it sees `OMPI_COMM_WORLD_SIZE`) and checks both ranks' output. The
//! singleton test runs without a launcher: MPI then makes a world of one.
//! Both need Open MPI (`libopenmpi-dev openmpi-bin`, installed by .ci/run);
//! without `mpirun` on PATH the launcher test says SKIPPED, except under CI
//! (the variable `CI` set), where it fails.
#![cfg(feature = "mpi")]

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use towers_runtime::{Comm, CommError, MpiComm, MpiReduce, Session};

const RANKS_TEST: &str = "two_mpi_ranks_reduce_in_rank_order_and_run_a_plan";

fn input(rank: usize, step: usize) -> Vec<f32> {
    (0..6).map(|i| (i as f32 - 2.0) * (rank as f32 + 1.0) + step as f32).collect()
}

fn relu(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v.max(0.0)).collect()
}

/// What one rank checks; panics (fails its process) on a wrong value.
fn as_rank() {
    let reduce = match std::env::var("TOWERS_TEST_MPI_REDUCE").as_deref() {
        Ok("library") => MpiReduce::Library,
        _ => MpiReduce::Auto,
    };
    let comm = Arc::new(MpiComm::init_with(Duration::from_secs(120), reduce).expect("MPI initializes"));
    let (rank, world) = (comm.rank(), comm.world_size());
    assert_eq!(world, 2, "run with mpirun -np 2");

    // A bucket of two buffers: values whose f32 sum depends on the order of
    // addition (1e8 + 1 - 1e8), summed in rank order on every rank.
    let mut a = vec![if rank == 0 { 1e8 } else { 1.0 }, rank as f32 + 0.5];
    let mut b = vec![rank as f32; 3];
    comm.all_reduce_sum(&mut [&mut a[..], &mut b[..]]).expect("all-reduce");
    assert_eq!(a, vec![1e8 + 1.0, 2.0]);
    assert_eq!(b, vec![1.0; 3]);

    // Buckets of odd lengths, larger ones after smaller (the shared window
    // grows), each element the rank-order sum v0 + v1 of values whose sum
    // rounds; consecutive buckets use alternate halves of the window.
    let v = |r: usize, i: usize| ((i * 7 + r * 13) % 97) as f32 * 0.37 + if r == 0 { 3e7 } else { -1.25 };
    for len in [1usize, 17, 1000, 4099, 333, 100_003] {
        let mut x: Vec<f32> = (0..len).map(|i| v(rank, i)).collect();
        comm.all_reduce_sum(&mut [&mut x[..]]).expect("all-reduce");
        let want: Vec<f32> = (0..len).map(|i| v(0, i) + v(1, i)).collect();
        assert!(x.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "rank {rank}, length {len}");
    }

    // Buckets in lent shared memory (the CPU backend's bucket arenas): at
    // the same offset on every rank, summed where they lie; at different
    // offsets, through the copying path. Either way the rank-order sums, and
    // nothing outside the bucket changes.
    match (reduce, comm.shared_memory(4096)) {
        (MpiReduce::Auto, Some(m)) => {
            assert!(m.bytes >= 4096);
            // SAFETY: the communicator lends `bytes` bytes to this rank alone.
            let lent = unsafe { std::slice::from_raw_parts_mut(m.ptr as *mut f32, 1024) };
            for (at, len) in [(100usize, 333usize), (64, 17), (8 + 4 * rank, 50)] {
                lent.fill(-7.0);
                for i in 0..len {
                    lent[at + i] = v(rank, i);
                }
                comm.all_reduce_sum(&mut [&mut lent[at..at + len]]).expect("all-reduce in lent memory");
                for i in 0..len {
                    assert_eq!(lent[at + i].to_bits(), (v(0, i) + v(1, i)).to_bits(), "rank {rank}, at {at}, {i}");
                }
                assert!(lent[..at].iter().chain(&lent[at + len..]).all(|&x| x == -7.0), "outside the bucket");
            }
        }
        (MpiReduce::Library, None) => {}
        (r, m) => panic!("{r:?}: shared memory {:?}", m.map(|m| m.bytes)),
    }

    let mut c = vec![rank as f32 * 10.0; 4];
    comm.broadcast(1, &mut [&mut c[..]]).expect("broadcast");
    assert_eq!(c, vec![10.0; 4]);
    assert!(matches!(comm.broadcast(2, &mut [&mut c[..]]), Err(CommError::BadRoot { root: 2, .. })));

    // Groups of different lengths: the same typed error on every rank, no hang.
    let mut d = vec![0.0f32; 2 + rank];
    let e = comm.all_reduce_sum(&mut [&mut d[..]]).unwrap_err();
    assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
    comm.barrier().expect("barrier");

    // The plan's collective step through a session: each rank feeds its own data.
    let mut s = Session::new(0).with_comm(comm.clone());
    s.load("two", common::two_device_plan_with_all_reduce()).expect("loads");
    for step in 0..3 {
        s.feed("two", "x", &input(rank, step)).unwrap();
        s.run("two").unwrap();
        let sum: Vec<f32> = relu(&input(0, step)).iter().zip(relu(&input(1, step))).map(|(x, y)| x + y).collect();
        assert_eq!(s.fetch::<f32>("two", "Relu").unwrap(), sum, "rank {rank}, step {step}");
        let out: Vec<f32> = sum.iter().map(|v| -v + -v).collect();
        assert_eq!(s.fetch::<f32>("two", "out").unwrap(), out, "rank {rank}, step {step}");
    }
    println!("rank {rank} of {world} ok: {}", comm.describe());
}

#[test]
fn two_mpi_ranks_reduce_in_rank_order_and_run_a_plan() {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() {
        return as_rank();
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "mpirun is missing under CI: .ci/run installs openmpi-bin");
        eprintln!("SKIPPED: mpirun not found (apt-get install libopenmpi-dev openmpi-bin)");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary");
    // Both reduction paths: the shared-memory window (the default on one
    // host) and the MPI library's collectives.
    for (reduce, path) in [("auto", ", shared memory"), ("library", "\n")] {
        // Open MPI's session folder, of this launcher's own (no race with
        // launchers of other tests started at the same time).
        let session = tempfile::tempdir().expect("a session folder");
        let out = Command::new("mpirun")
            .args(["-np", "2", "--oversubscribe"])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("OMPI_MCA_orte_tmpdir_base", session.path())
            .env("TOWERS_TEST_MPI_REDUCE", reduce)
            .arg(&exe)
            .args(["--exact", RANKS_TEST, "--nocapture", "--test-threads=1"])
            .output()
            .expect("mpirun starts");
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "mpirun ({reduce}) failed:\n{text}");
        for rank in 0..2 {
            assert!(text.contains(&format!("rank {rank} of 2 ok: MPI, rank {rank} of 2{path}")), "{reduce}: {text}");
        }
    }
}

/// The singleton checks run in a child process of their own: MPI
/// initializes once per process, and its environment must not leak into
/// the `mpirun` that the test above starts.
#[test]
fn without_a_launcher_mpi_is_a_world_of_one() {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() {
        return; // a rank process runs only the test above
    }
    if std::env::var_os("TOWERS_MPI_SINGLETON").is_none() {
        let exe = std::env::current_exe().expect("the test binary");
        let out = Command::new(exe)
            .env("TOWERS_MPI_SINGLETON", "1")
            .args(["--exact", "without_a_launcher_mpi_is_a_world_of_one", "--nocapture"])
            .output()
            .expect("the child starts");
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("singleton ok"), "{text}");
        return;
    }
    let comm = MpiComm::init().expect("a singleton MPI world");
    assert_eq!((comm.rank(), comm.world_size()), (0, 1));
    let mut a = vec![1.5f32, -2.0];
    comm.all_reduce_sum(&mut [&mut a[..]]).unwrap();
    assert_eq!(a, vec![1.5, -2.0]);
    comm.barrier().unwrap();
    // MPI initializes once per process.
    assert!(matches!(MpiComm::init(), Err(CommError::Transport { .. })));
    println!("singleton ok");
}
