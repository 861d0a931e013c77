//! The CUDA backend's all-reduce over NCCL (`--features nccl`).
//!
//! Without NCCL (no `libnccl.so` on `LD_LIBRARY_PATH`, as on the CI machine)
//! setting up the communicator is the typed error naming the library and the
//! link it needs. With the library (`.ci/run` installs NVIDIA's wheel for a
//! second run with `TOWERS_REQUIRE_NCCL` set) rank 0's unique id reaches
//! every rank: real NCCL calls, no GPU needed. With a GPU, NCCL and world size 1 (NCCL refuses two ranks
//! on one GPU), a plan whose buckets go through `ncclAllReduce` must train
//! exactly as the same plan without NCCL; those parts say SKIPPED elsewhere,
//! and fail instead when `TOWERS_REQUIRE_GPU` is set (`bench/gpu.sh`).
#![cfg(feature = "nccl")]

mod common;

use towers_runtime::comm::nccl_id::exchange_id;
use towers_runtime::comm::LocalComm;
use towers_runtime::cuda::libs::CudaLibrary;
use towers_runtime::cuda::nccl::{unique_id, NcclComm, NcclFailure};
use towers_runtime::cuda::CudaBackend;
use towers_runtime::Session;

fn skip(test: &str, why: &str) {
    eprintln!("\n==================== SKIPPED: {test} ====================\n{why}\n");
}

/// A GPU part without its GPU (or NCCL): a skip, or a failure under
/// `TOWERS_REQUIRE_GPU`.
fn skip_gpu(test: &str, why: &str) {
    match towers_kernels::require_gpu::no_gpu(test, why) {
        Ok(skipped) => eprintln!("{skipped}"),
        Err(failure) => panic!("{failure}"),
    }
}

#[test]
fn without_nccl_the_communicator_is_a_typed_error_naming_the_link() {
    if CudaLibrary::Nccl.present() {
        return skip("without_nccl_the_communicator_is_a_typed_error_naming_the_link", "NCCL is present here");
    }
    let e = NcclComm::over(&LocalComm::single()).err().expect("no NCCL here");
    let msg = e.to_string();
    assert!(matches!(e, NcclFailure::Id(_)), "{msg}");
    assert!(msg.contains("libnccl.so.2") && msg.contains("ln -s") && msg.contains("LD_LIBRARY_PATH"), "{msg}");
    let e = NcclComm::from_id(&[0; 128], 0, 1).err().expect("no NCCL here");
    assert!(matches!(e, NcclFailure::Unavailable(_)), "{e}");
}

/// With the library (no GPU needed): rank 0's new id reaches every rank.
#[test]
fn with_nccl_rank_zeros_id_reaches_every_rank() {
    if !CudaLibrary::Nccl.present() {
        // .ci/run installs the wheel for a second run that requires it.
        assert!(std::env::var_os("TOWERS_REQUIRE_NCCL").is_none(), "TOWERS_REQUIRE_NCCL is set but NCCL is missing");
        return skip("with_nccl_rank_zeros_id_reaches_every_rank", "NCCL (libnccl.so) is not on LD_LIBRARY_PATH");
    }
    let ranks = LocalComm::group(2);
    let ids: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> =
            ranks.iter().map(|c| s.spawn(move || exchange_id(c, || unique_id().map_err(|e| e.to_string())))).collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    let (a, b) = (ids[0].as_ref().expect("rank 0"), ids[1].as_ref().expect("rank 1"));
    assert_eq!(a, b);
    assert!(a.iter().any(|&x| x != 0), "an id of zeros");
}

/// On a GPU with NCCL: the all-reduce plan of world size 1 runs its two
/// buckets through ncclAllReduce (the sum over one rank: the values stay)
/// and gives what the CPU backend gives.
#[test]
fn a_bucket_through_nccl_on_one_gpu() {
    let backend = match CudaBackend::new() {
        Ok(b) => b,
        Err(e) => return skip_gpu("a_bucket_through_nccl_on_one_gpu", &e.to_string()),
    };
    if !CudaLibrary::Nccl.present() {
        return skip_gpu("a_bucket_through_nccl_on_one_gpu", "NCCL (libnccl.so) is not on LD_LIBRARY_PATH");
    }
    let comm = LocalComm::single();
    let backend = backend.with_nccl(&comm).expect("NCCL over one rank");
    let mut gpu = Session::with_backend(0, Box::new(backend));
    let mut cpu = Session::new(0);
    let x = [-1.0f32, 2.0, -3.0, 4.0, 0.5, -0.25];
    for s in [&mut gpu, &mut cpu] {
        s.load("p", common::two_device_plan_with_all_reduce()).expect("loads");
        s.feed("p", "x", &x).expect("feeds");
        s.run("p").expect("runs");
    }
    for t in ["Relu", "out"] {
        assert_eq!(gpu.fetch::<f32>("p", t).unwrap(), cpu.fetch::<f32>("p", t).unwrap(), "{t}");
    }
}
