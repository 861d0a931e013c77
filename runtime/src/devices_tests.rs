//! The device map on fake machines (0, 1, 2 and 8 GPUs; 1, 2 and 4
//! towers), exact text; and the refusals of [`check`].

use super::*;

#[test]
fn each_logical_gpu_gets_its_own_context() {
    let one = gpu_contexts(&[0, 1, 2, 3], 1);
    assert_eq!(
        one.iter().map(|c| (c.physical, c.context, c.of)).collect::<Vec<_>>(),
        vec![(0, 0, 4), (0, 1, 4), (0, 2, 4), (0, 3, 4)]
    );
    let eight = gpu_contexts(&[0, 1, 2, 3], 8);
    assert!(eight.iter().all(|c| c.physical == c.logical as usize && c.context == 0 && c.of == 1));
    let two = gpu_contexts(&[3, 0, 1, 2], 2);
    assert_eq!(
        two.iter().map(|c| (c.logical, c.physical, c.context, c.of)).collect::<Vec<_>>(),
        vec![(3, 1, 1, 2), (0, 0, 0, 2), (1, 1, 0, 2), (2, 0, 1, 2)]
    );
}

fn machine(gpus: Option<usize>, cores: usize) -> Machine {
    let cuda = match gpus {
        Some(n) => Cuda::Gpus(n),
        None => Cuda::Absent("no CUDA driver found".into()),
    };
    Machine { cuda, cores }
}

/// A plan of `towers` towers: cpu:0 holds 3.1 MB of arena and 1.2 MB of
/// variables, each tower 2.5 MB of arena.
fn devices(towers: u32) -> Vec<PlanDevice> {
    let mut v = vec![PlanDevice { device: Device::CPU0, arena_bytes: 3_100_000, variable_bytes: 1_200_000 }];
    v.extend((0..towers).map(|i| PlanDevice { device: Device::gpu(i), arena_bytes: 2_500_000, variable_bytes: 0 }));
    v
}

/// The CPU backend's threads as `thread_plans` makes them: one per device,
/// sorted; when the devices outnumber the cores the host joins the last
/// device's thread, which becomes the first.
fn cpu_threads(towers: u32, cores: usize) -> Vec<Vec<Device>> {
    let mut t: Vec<Vec<Device>> = (0..towers).map(|i| vec![Device::gpu(i)]).collect();
    if towers as usize + 1 > cores {
        let last = t.pop().expect("a tower");
        t.insert(0, vec![Device::CPU0, last[0]]);
    } else {
        t.insert(0, vec![Device::CPU0]);
    }
    t
}

fn text(towers: u32, kind: BackendKind, m: &Machine) -> String {
    let threads = match kind {
        BackendKind::Cpu => cpu_threads(towers, m.cores),
        BackendKind::Mixed { .. } | BackendKind::MixedOneContext => vec![vec![Device::CPU0]],
        BackendKind::Cuda => vec![],
    };
    device_map(&devices(towers), &threads, kind, m).expect("servable").to_string()
}

#[test]
fn the_cpu_backend_runs_every_device_as_a_host_thread() {
    let m = machine(None, 8);
    assert_eq!(
        text(2, BackendKind::Cpu, &m),
        "cpu:0 -> host (pageable arena 3.1 MB, variables 1.2 MB, thread 1 of 3)\n\
         gpu:0 -> host thread 2 of 3 (arena 2.5 MB; CPU backend: no CUDA driver found)\n\
         gpu:1 -> host thread 3 of 3 (arena 2.5 MB; CPU backend: no CUDA driver found)"
    );
    // Two cores, two towers: the host runs on the last tower's thread.
    let m = machine(None, 2);
    assert_eq!(
        text(2, BackendKind::Cpu, &m),
        "cpu:0 -> host (pageable arena 3.1 MB, variables 1.2 MB, thread 1 of 2, shared with gpu:1)\n\
         gpu:0 -> host thread 2 of 2 (arena 2.5 MB; CPU backend: no CUDA driver found)\n\
         gpu:1 -> host thread 1 of 2 (arena 2.5 MB, shared with cpu:0; CPU backend: no CUDA driver found)"
    );
    // GPUs present, the CPU backend chosen anyway.
    let m = machine(Some(1), 8);
    assert_eq!(
        text(1, BackendKind::Cpu, &m),
        "cpu:0 -> host (pageable arena 3.1 MB, variables 1.2 MB, thread 1 of 2)\n\
         gpu:0 -> host thread 2 of 2 (arena 2.5 MB; CPU backend chosen; the machine has 1 CUDA GPU(s))"
    );
}

#[test]
fn a_mixed_session_gives_each_logical_gpu_a_context() {
    let mixed = BackendKind::Mixed { pinned: true };
    // One GPU for four logical GPUs: four contexts on GPU 0.
    assert_eq!(
        text(4, mixed, &machine(Some(1), 2)),
        "cpu:0 -> host (pinned arena 3.1 MB, variables 1.2 MB, thread 1 of 1)\n\
         gpu:0 -> GPU 0 context 1 of 4 (arena 2.5 MB; one GPU for 4 logical GPUs)\n\
         gpu:1 -> GPU 0 context 2 of 4 (arena 2.5 MB; one GPU for 4 logical GPUs)\n\
         gpu:2 -> GPU 0 context 3 of 4 (arena 2.5 MB; one GPU for 4 logical GPUs)\n\
         gpu:3 -> GPU 0 context 4 of 4 (arena 2.5 MB; one GPU for 4 logical GPUs)"
    );
    // Two GPUs for four: gpu:i on GPU i mod 2.
    assert_eq!(
        text(4, mixed, &machine(Some(2), 2)),
        "cpu:0 -> host (pinned arena 3.1 MB, variables 1.2 MB, thread 1 of 1)\n\
         gpu:0 -> GPU 0 context 1 of 2 (arena 2.5 MB; 2 GPUs for 4 logical GPUs)\n\
         gpu:1 -> GPU 1 context 1 of 2 (arena 2.5 MB; 2 GPUs for 4 logical GPUs)\n\
         gpu:2 -> GPU 0 context 2 of 2 (arena 2.5 MB; 2 GPUs for 4 logical GPUs)\n\
         gpu:3 -> GPU 1 context 2 of 2 (arena 2.5 MB; 2 GPUs for 4 logical GPUs)"
    );
    // Eight GPUs: each logical GPU on its own physical one.
    assert_eq!(
        text(2, mixed, &machine(Some(8), 16)),
        "cpu:0 -> host (pinned arena 3.1 MB, variables 1.2 MB, thread 1 of 1)\n\
         gpu:0 -> GPU 0 context 1 of 1 (arena 2.5 MB)\n\
         gpu:1 -> GPU 1 context 1 of 1 (arena 2.5 MB)"
    );
    assert_eq!(
        text(1, BackendKind::Mixed { pinned: false }, &machine(Some(1), 2)),
        "cpu:0 -> host (pageable arena 3.1 MB, variables 1.2 MB, thread 1 of 1)\n\
         gpu:0 -> GPU 0 context 1 of 1 (arena 2.5 MB)"
    );
}

/// `--cuda-contexts one`: the host pinned, the GPU devices as streams of one context.
#[test]
fn a_mixed_session_with_one_context_says_the_gpus_share_it() {
    assert_eq!(
        text(2, BackendKind::MixedOneContext, &machine(Some(1), 2)),
        "cpu:0 -> host (pinned arena 3.1 MB, variables 1.2 MB, thread 1 of 1)\n\
         gpu:0 -> GPU 0, the CUDA backend's one context (arena 2.5 MB; streams of 2 devices share it)\n\
         gpu:1 -> GPU 0, the CUDA backend's one context (arena 2.5 MB; streams of 2 devices share it)"
    );
    assert_eq!(BackendKind::of_name("cpu+cuda (one context)"), BackendKind::MixedOneContext);
    assert_eq!(BackendKind::of_name("cpu+cuda"), BackendKind::Mixed { pinned: true });
    assert_eq!(BackendKind::of_name("cpu+cpu"), BackendKind::Cpu);
}

#[test]
fn the_one_context_cuda_backend_says_every_device_shares_it() {
    assert_eq!(
        text(1, BackendKind::Cuda, &machine(Some(8), 2)),
        "cpu:0 -> GPU 0, the CUDA backend's one context (arena 3.1 MB, variables 1.2 MB; streams of 2 devices share it)\n\
         gpu:0 -> GPU 0, the CUDA backend's one context (arena 2.5 MB; streams of 2 devices share it)"
    );
}

#[test]
fn devices_the_machine_cannot_serve_are_refused_naming_them() {
    let none = machine(None, 2);
    // The CPU backend serves any number of GPU devices without CUDA.
    for towers in [1, 2, 4] {
        assert!(text(towers, BackendKind::Cpu, &none).lines().count() == towers as usize + 1);
    }
    // A CUDA backend on a machine without CUDA: the first GPU device.
    for kind in [BackendKind::Cuda, BackendKind::Mixed { pinned: true }] {
        let e = device_map(&devices(4), &[], kind, &none).expect_err("no CUDA");
        assert_eq!(e, Unservable::NoCuda { device: Device::gpu(0), why: "no CUDA driver found".into() });
        assert_eq!(
            e.to_string(),
            "device gpu:0 was asked for, but this machine has no CUDA GPU (no CUDA driver found), only the host: \
             run with --backend cpu, which runs every /gpu:N as a host thread of its own, or run where a CUDA \
             driver and a GPU exist"
        );
        let e = check(&[Device::gpu(3)], kind, &machine(Some(0), 2)).expect_err("a driver without GPUs");
        assert_eq!(e.device(), Device::gpu(3));
        assert!(e.to_string().contains("its CUDA driver reports no GPU"), "{e}");
        // Only the host: nothing needs CUDA.
        assert_eq!(check(&[Device::CPU0], kind, &none), Ok(()));
    }
    // A second host device, on every backend and machine.
    for (kind, m) in [(BackendKind::Cpu, &none), (BackendKind::Mixed { pinned: true }, &machine(Some(8), 2))] {
        let e = check(&[Device::CPU0, Device::gpu(0), Device::cpu(1)], kind, m).expect_err("cpu:1");
        assert_eq!(e, Unservable::SecondHost { device: Device::cpu(1) });
        assert_eq!(e.has(), "a process has one host device, cpu:0");
        assert!(e.how().starts_with("place what is on /cpu:1 on /cpu:0"), "{}", e.how());
    }
}

#[test]
fn bytes_read_as_people_write_them() {
    assert_eq!(human_bytes(0), "0 B");
    assert_eq!(human_bytes(999), "999 B");
    assert_eq!(human_bytes(1_000), "1.0 kB");
    assert_eq!(human_bytes(3_149_000), "3.1 MB");
    assert_eq!(human_bytes(12_000_000_000), "12.0 GB");
}

#[test]
fn backend_kinds_by_name() {
    assert_eq!(BackendKind::of_name("cpu"), BackendKind::Cpu);
    assert_eq!(BackendKind::of_name("cuda"), BackendKind::Cuda);
    assert_eq!(BackendKind::of_name("mixed"), BackendKind::Mixed { pinned: true });
}
