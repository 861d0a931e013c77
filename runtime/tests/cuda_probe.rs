//! The measurements issue 21 asks of a lent GPU (items 1 and 2), one
//! `#[test]` per probe, each printing its findings as
//! `PROBE <name>: <held|failed|value> (<detail>) on <GPU name>` (run with
//! `--nocapture --test-threads 1`, as `bench/gpu_check.sh` part `probe`
//! does: the crossings are timed, so nothing else may run beside them).
//!
//! - Item 1, host/GPU crossings ([`probe::cross`]): round trips, median and
//!   p90 in microseconds, of `cuStreamWaitValue32` / `cuStreamWriteValue32`
//!   on pinned flags (what `runtime/src/cuda/part.rs` chose) against
//!   `cuLaunchHostFunc` and CUDA events, each way; and whether stream
//!   memory operations can be captured into a CUDA graph.
//! - Item 2, 2 and 4 contexts on GPU 0 ([`probe::ctxs`]): peer copies,
//!   cross-context event waits, a kernel reading another context's pointer
//!   (in a child process, this binary re-run with `--ignored`), capture.
//!
//! Without a GPU (no driver, no NVRTC, no device, a driver too old for the
//! probes' calls) each probe says SKIPPED, unless `TOWERS_REQUIRE_GPU` is
//! set: then each fails. A driver error while probing fails the test with
//! the driver's text; an assumption the backend relies on that does not
//! hold (peer copies' bytes, cross-context event order) fails it after its
//! line is printed; the other findings are answers either way.

mod probe;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext};
use probe::cross::Cross;
use probe::ctxs::{Ctxs, Finding};
use probe::{child_after, child_outcome, gpu, line, ChildOutcome, ProbeError, Stats};
use towers_runtime::cuda::{libs, probe as cuda_probe, CudaLibrary, CudaStatus};

/// Round trips per crossing mechanism (a tenth more run first, uncounted).
const TRIPS: usize = 1000;
/// The contexts counts of item 2.
const CONTEXTS: [usize; 2] = [2, 4];
/// The environment variable naming the child's context count.
const CHILD_VAR: &str = "TOWERS_PROBE_CONTEXTS";

/// GPU 0's primary context and the GPU's name; None (after a loud skip)
/// without a usable GPU, a panic under `TOWERS_REQUIRE_GPU`.
fn open(test: &str) -> Option<(Arc<CudaContext>, String)> {
    match usable() {
        Ok(found) => Some(found),
        Err(why) => {
            match towers_kernels::require_gpu::no_gpu(test, &why) {
                Ok(skipped) => eprintln!("{skipped}"),
                Err(failure) => panic!("{failure}"),
            }
            None
        }
    }
}

fn usable() -> Result<(Arc<CudaContext>, String), String> {
    libs::check(&[CudaLibrary::Driver, CudaLibrary::Nvrtc]).map_err(|e| e.to_string())?;
    match cuda_probe() {
        CudaStatus::Found { devices } if devices > 0 => {}
        other => return Err(format!("no CUDA device: {other:?}")),
    }
    gpu::exports(&gpu::NEEDED).map_err(|e| e.to_string())?;
    let ctx = CudaContext::new(0).map_err(|e| format!("the primary context of GPU 0: {e:?}"))?;
    let name = ctx.name().map_err(|e| format!("cuDeviceGetName: {e:?}"))?;
    Ok((ctx, name))
}

fn say(name: &str, verdict: &str, detail: &str, gpu: &str) {
    println!("{}", line(name, verdict, detail, gpu));
}

fn say_stats(name: &str, s: &Stats, detail: &str, gpu: &str) {
    say(name, &s.value(), &format!("{detail}; {} trips", s.n), gpu);
}

/// Print `findings`, then fail naming the relied-on ones that broke.
fn report(findings: &[Finding], gpu: &str) -> Result<(), ProbeError> {
    for f in findings {
        say(&f.name, &f.verdict, &f.detail, gpu);
    }
    let broken: Vec<&str> = findings.iter().filter(|f| f.broken()).map(|f| f.name.as_str()).collect();
    if broken.is_empty() {
        Ok(())
    } else {
        Err(ProbeError::Other(format!("assumptions the CUDA backend relies on failed: {broken:?}")))
    }
}

#[test]
fn crossings_host_to_gpu() -> Result<(), ProbeError> {
    let Some((ctx, name)) = open("crossings_host_to_gpu") else { return Ok(()) };
    let mut c = Cross::new(&ctx)?;
    let back = "then cuStreamWriteValue32 to a second pinned flag the host spins on";
    let s = c.h2g_wait_value(TRIPS)?;
    say_stats(
        "h2g_wait_value32",
        &s,
        &format!("round trip: the host stores a pinned flag, the stream passes cuStreamWaitValue32 GEQ, {back}"),
        &name,
    );
    let s = c.h2g_host_func(TRIPS)?;
    say_stats(
        "h2g_host_func",
        &s,
        &format!("round trip: a cuLaunchHostFunc spinning on the flag releases the stream, {back}"),
        &name,
    );
    let s = c.h2g_event(TRIPS)?;
    say_stats("h2g_event", &s, &format!("round trip: cuEventRecord on a host-side stream, cuStreamWaitEvent enqueued after it (it cannot be enqueued ahead), {back}"), &name);
    Ok(())
}

#[test]
fn crossings_gpu_to_host() -> Result<(), ProbeError> {
    let Some((ctx, name)) = open("crossings_gpu_to_host") else { return Ok(()) };
    let mut c = Cross::new(&ctx)?;
    let lead = "round trip: the host releases a cuStreamWaitValue32, then";
    let s = c.g2h_write_value(TRIPS)?;
    say_stats(
        "g2h_write_value32",
        &s,
        &format!("{lead} cuStreamWriteValue32 to a pinned flag the host spins on"),
        &name,
    );
    let untimed = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    let s = c.g2h_event(TRIPS, untimed, true)?;
    say_stats("g2h_event_query", &s, &format!("{lead} cuEventRecord, the host polls cuEventQuery"), &name);
    let s = c.g2h_event(TRIPS, untimed, false)?;
    say_stats(
        "g2h_event_sync",
        &s,
        &format!("{lead} cuEventRecord, the host waits in cuEventSynchronize (context scheduling: auto)"),
        &name,
    );
    let blocking = untimed | sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
    let s = c.g2h_event(TRIPS, blocking, false)?;
    say_stats(
        "g2h_event_blocking_sync",
        &s,
        &format!("{lead} cuEventRecord of a CU_EVENT_BLOCKING_SYNC event, cuEventSynchronize"),
        &name,
    );
    let s = c.g2h_host_func(TRIPS)?;
    say_stats(
        "g2h_host_func",
        &s,
        &format!("{lead} a cuLaunchHostFunc callback stores a host word the host spins on"),
        &name,
    );
    Ok(())
}

#[test]
fn memops_in_a_cuda_graph() -> Result<(), ProbeError> {
    let Some((ctx, name)) = open("memops_in_a_cuda_graph") else { return Ok(()) };
    let mut c = Cross::new(&ctx)?;
    match c.graph_memops(TRIPS / 5)? {
        Ok(s) => {
            say(
                "memops_graph_capture",
                "held",
                "cuStreamWaitValue32 + cuStreamWriteValue32 captured, instantiated and replayed",
                &name,
            );
            say_stats("memops_graph_round_trip", &s, "the same host->GPU->host round trip as h2g_wait_value32, replayed as a CUDA graph (flags cleared before each launch)", &name);
        }
        Err(refused) => say("memops_graph_capture", "failed", &format!("the driver says: {refused}"), &name),
    }
    Ok(())
}

/// Run `probe` on 2 and 4 contexts of GPU 0 ([`CONTEXTS`]) and report its findings.
fn each_context(test: &str, probe: impl Fn(&Ctxs) -> Result<Vec<Finding>, ProbeError>) -> Result<(), ProbeError> {
    let Some((_primary, name)) = open(test) else { return Ok(()) };
    for n in CONTEXTS {
        report(&probe(&Ctxs::new(n)?)?, &name)?;
    }
    Ok(())
}

#[test]
fn contexts_peer_copies() -> Result<(), ProbeError> {
    each_context("contexts_peer_copies", |c| c.copies(10))
}

#[test]
fn contexts_event_waits() -> Result<(), ProbeError> {
    each_context("contexts_event_waits", |c| c.event_waits())
}

#[test]
fn contexts_graph_capture() -> Result<(), ProbeError> {
    each_context("contexts_graph_capture", |c| c.captures())
}

/// A kernel of context 0 reads a buffer of context n-1, in a child process
/// (this binary, `--ignored --exact child_foreign_pointer`): a fault
/// poisons the context, and with it every later probe of this process.
#[test]
fn contexts_foreign_pointer() -> Result<(), ProbeError> {
    let Some((_primary, name)) = open("contexts_foreign_pointer") else { return Ok(()) };
    for n in CONTEXTS {
        let (log, status) = run_child(n)?;
        let after = child_after(&log).unwrap_or_else(|| "no report on the contexts after".into());
        let (verdict, detail) = match child_outcome(&log, &status) {
            ChildOutcome::Read { right_values: true } => {
                ("read", "the kernel read the other context's values".to_string())
            }
            ChildOutcome::Read { right_values: false } => {
                ("read wrong values", "the kernel ran without a fault but read other values".to_string())
            }
            ChildOutcome::Faulted { error } => ("fault", error),
            ChildOutcome::Silent { status } => {
                return Err(ProbeError::Other(format!("the child reported nothing ({status}):\n{log}")))
            }
        };
        say(
            &format!("ctx{n}_foreign_pointer"),
            verdict,
            &format!("a kernel in context 0 of {n} reading a pointer of context {}: {detail}; {after}", n - 1),
            &name,
        );
    }
    Ok(())
}

/// This binary re-run for the child of [`contexts_foreign_pointer`], with
/// at most a minute; its output and exit status.
fn run_child(n: usize) -> Result<(String, String), ProbeError> {
    let exe = std::env::current_exe().map_err(|e| ProbeError::Other(format!("this test binary: {e}")))?;
    let mut child = Command::new(exe)
        .args(["--ignored", "--exact", "child_foreign_pointer", "--nocapture", "--test-threads", "1"])
        .env(CHILD_VAR, n.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ProbeError::Other(format!("starting the child: {e}")))?;
    let start = Instant::now();
    let status = loop {
        match child.try_wait().map_err(|e| ProbeError::Other(format!("waiting for the child: {e}")))? {
            Some(s) => break format!("{s}"),
            None if start.elapsed() > Duration::from_secs(60) => {
                let _ = child.kill();
                let _ = child.wait();
                break "killed after 60 s".to_string();
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let out = child.wait_with_output().map_err(|e| ProbeError::Other(format!("the child's output: {e}")))?;
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((log, status))
}

/// The child of [`contexts_foreign_pointer`] (run by it, with the context
/// count in `TOWERS_PROBE_CONTEXTS`).
#[test]
#[ignore = "the child process of contexts_foreign_pointer, which runs it"]
fn child_foreign_pointer() -> Result<(), ProbeError> {
    let n: usize = std::env::var(CHILD_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 2)
        .ok_or_else(|| ProbeError::Other(format!("{CHILD_VAR} must name a context count of 2 or more")))?;
    let Some(_primary) = open("child_foreign_pointer") else { return Ok(()) };
    probe::ctxs::foreign_read(n)
}

/// The gate works end to end: a probe re-run in a child process with
/// `TOWERS_REQUIRE_GPU=1` passes exactly where a GPU is usable and fails,
/// naming the variable, everywhere else.
#[test]
fn require_gpu_turns_a_missing_gpu_into_a_failure() {
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", "contexts_peer_copies", "--test-threads", "1"])
        .env(towers_kernels::require_gpu::VAR, "1")
        .output()
        .expect("the test binary runs");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(log.contains("1 passed") || log.contains("1 failed"), "the child ran the one test:\n{log}");
    let gpu = usable().is_ok();
    assert_eq!(out.status.success(), gpu, "GPU usable here: {gpu}; the child under TOWERS_REQUIRE_GPU=1:\n{log}");
    if !gpu {
        assert!(log.contains("TOWERS_REQUIRE_GPU is set"), "{log}");
    }
}
