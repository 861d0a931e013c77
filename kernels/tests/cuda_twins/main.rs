//! Every CUDA twin through the CUDA backend's own lowering
//! (`towers_kernels::launch::lower`, which `runtime/src/cuda/lower.rs`
//! marshals), and on a GPU against its CPU body.
//!
//! - **Everywhere** (CPU-only CI too): each case's lowering (entry points,
//!   grid, block, dynamic shared memory, every argument: scalars, shapes,
//!   operand indices and offsets, side arrays, scratch areas, cuBLAS GEMMs)
//!   is recorded as text and checked against the insta snapshots in
//!   `snapshots/` (one per section), so a change of marshalling fails here.
//!   Every plan kernel with CUDA C (`WITH_SOURCE`) must be lowered by some
//!   case, and every entry point of `launch::entries::all()` launched.
//! - **On a GPU**: the same cases run: random inputs (fixed seeds), each
//!   family's source compiled by NVRTC to a cubin for the device's own
//!   architecture, launched through cudarc's driver API with the lowering's
//!   argument lists (a lowering's cuBLAS GEMMs run on the host), copied back
//!   and compared with the CPU kernel on the same inputs.
//!
//! Tolerances, per kernel (`tol` in the table the test prints):
//! - `exact`: bit for bit (NaN matches NaN): copies, selections, integer
//!   kernels, dropout masks, pooling, the tower reduction, optimizer updates
//!   (their CUDA forms round every step as the CPU does);
//! - otherwise `|gpu - cpu| <= tol * max(|cpu|, 1)`: tree-ordered sums
//!   (1e-4: sums of up to thousands of terms in another order), softmax rows
//!   (1e-5), transcendental functions (`expf`, `tanhf`: 2e-6) differ by
//!   rounding. The CPU side may take any SIMD path: the margins hold on all.
//!
//! Without a CUDA driver, a GPU or NVRTC, the comparisons are skipped with a
//! message (the snapshots are still checked), unless `TOWERS_REQUIRE_GPU`
//! is set (`bench/gpu_check.sh` sets it): then the test fails at once
//! (`towers_kernels::require_gpu`). The CPU bodies are called through the
//! small adapters in `cpu.rs`, the one place to fix when their signatures
//! move. Files: `harness.rs` (lowering, launch, buffers, report),
//! `math.rs`, `spatial.rs`, `training.rs`, `array.rs`, `topk.rs` (the cases by family).
#[path = "../common/mod.rs"]
mod common;
// array ops (issue 22)
mod array;
mod cpu;
mod harness;
mod math;
mod spatial;
mod topk;
mod training;

use std::cell::RefCell;

use cudarc::driver::CudaContext;

use harness::{Device, Gpu, Report, Rng};
use math::{elementwise, fused, reductions, softmax};
use spatial::{convs, layout, pools};
use training::{batchnorm, dropout, optim};

fn device() -> Result<Device, String> {
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so) on this machine".into());
    }
    let count = CudaContext::device_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
    if count < 1 {
        return Err("a CUDA driver but no GPU".into());
    }
    if !common::nvrtc_present() {
        return Err("no libnvrtc (libnvrtc.so.13) on LD_LIBRARY_PATH".into());
    }
    let ctx = CudaContext::new(0).map_err(|e| format!("cuCtxCreate: {e:?}"))?;
    let (major, minor) = ctx.compute_capability().map_err(|e| format!("{e:?}"))?;
    let name = ctx.name().unwrap_or_default();
    let (nv_major, nv_minor) = common::nvrtc_version();
    eprintln!("device 0: {name}, sm_{major}{minor}; NVRTC {nv_major}.{nv_minor}");
    let stream = ctx.default_stream();
    Ok(Device { ctx, stream, arch: format!("sm_{major}{minor}"), modules: RefCell::default() })
}

type Section = fn(&Gpu, &mut Report, &mut Rng);

/// The cases, by section; each section's lowerings are one snapshot.
const SECTIONS: &[(&str, Section)] = &[
    ("elementwise", elementwise),
    ("fused", fused),
    ("reductions", reductions),
    ("softmax", softmax),
    ("pools", pools),
    ("convs", convs),
    ("layout", layout),
    ("dropout", dropout),
    ("batchnorm", batchnorm),
    ("optim", optim),
    ("arrays", array::arrays),
    ("topk", topk::topk),
];

#[test]
fn cuda_twins_match_cpu() {
    let dev = match device() {
        Ok(d) => Some(d),
        Err(why) => match towers_kernels::require_gpu::no_gpu("cuda_twins_match_cpu", &why) {
            Ok(skipped) => {
                eprintln!("{skipped}(the GPU comparisons are skipped; the argument lists are still checked)");
                None
            }
            Err(failure) => panic!("{failure}"),
        },
    };
    let g = Gpu::new(dev);
    let mut r = Report { live: g.live(), checks: Vec::new() };
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut logs = Vec::new();
    for &(name, section) in SECTIONS {
        section(&g, &mut r, &mut rng);
        logs.push((name, g.take_log()));
    }

    // Coverage: every kernel with CUDA C lowered, every entry point launched.
    let missing: Vec<&str> = WITH_SOURCE.iter().copied().filter(|k| !g.kernels.borrow().contains(k)).collect();
    let unlaunched: Vec<&str> =
        towers_kernels::launch::entries::all().map(|e| e.name).filter(|e| !g.entries.borrow().contains(e)).collect();
    let lowered: usize = logs.iter().map(|(_, l)| l.lines().filter(|l| !l.starts_with(' ')).count()).sum();
    eprintln!(
        "{lowered} lowerings of {} kernels, {} entry points; kernels not covered: {missing:?}; entries not launched: {unlaunched:?}",
        g.kernels.borrow().len(),
        g.entries.borrow().len()
    );
    assert!(missing.is_empty() && unlaunched.is_empty(), "not covered: {missing:?}; not launched: {unlaunched:?}");

    let mut failed: Vec<&str> = Vec::new();
    if r.live {
        eprintln!("\n{:<24} {:<44} {:>8} {:>11} {:>11}  result", "kernel", "case", "tol", "max |err|", "max rel");
        for c in &r.checks {
            let tol = c.tol.map(|t| format!("{t:.0e}")).unwrap_or_else(|| "exact".into());
            let verdict = if c.pass { "ok" } else { "FAILED" };
            eprintln!("{:<24} {:<44} {tol:>8} {:>11.3e} {:>11.3e}  {verdict}", c.kernel, c.case, c.max_abs, c.max_err);
        }
        let mut kernels: Vec<&str> = Vec::new();
        for c in &r.checks {
            if !kernels.contains(&c.kernel) {
                kernels.push(c.kernel);
            }
        }
        failed = kernels.iter().copied().filter(|k| r.checks.iter().any(|c| c.kernel == *k && !c.pass)).collect();
        eprintln!(
            "\n{} kernels checked on the GPU ({} checks): {} passed, {} failed {failed:?}",
            kernels.len(),
            r.checks.len(),
            kernels.len() - failed.len(),
            failed.len()
        );
    }
    // The recorded argument lists, on every machine.
    for (name, log) in logs {
        insta::assert_snapshot!(name, log);
    }
    assert!(failed.is_empty(), "failed on the GPU: {failed:?}");
}

/// `TOWERS_REQUIRE_GPU=1` turns the twins' skip into a failure (issue 20
/// item 9): where no device can be used, the twin test run again in a
/// child process with the variable set must fail, saying why. (On a GPU the
/// twin test itself runs; nothing to prove here.)
#[test]
fn require_gpu_fails_the_twins_without_a_gpu() {
    if let Err(why) = device() {
        let out = std::process::Command::new(std::env::current_exe().expect("this test binary"))
            .args(["--exact", "cuda_twins_match_cpu", "--test-threads", "1"])
            .env(towers_kernels::require_gpu::VAR, "1")
            .output()
            .expect("the test binary runs");
        let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "no GPU here ({why}), yet the twins passed under TOWERS_REQUIRE_GPU=1:\n{log}");
        assert!(log.contains("TOWERS_REQUIRE_GPU is set") && log.contains("1 failed"), "{log}");
    }
}

/// Every plan kernel with CUDA C of its own (all but the cuBLAS-only
/// GEMMs): each must have a twin check.
const WITH_SOURCE: &[&str] = &[
    "binary",
    "fused_elementwise",
    "add_n",
    "bias_add",
    "bias_add_act",
    "unary_grad_bias_grad",
    "bias_add_grad",
    "unary",
    "unary_grad",
    "conv2d",
    "conv2d_bias_act",
    "conv2d_backprop_input",
    "conv2d_backprop_filter",
    "max_pool",
    "max_pool_grad",
    "max_pool_grad_act_bias_grad",
    "avg_pool",
    "avg_pool_grad",
    "concat",
    "split",
    "slice",
    "slice_grad",
    "broadcast_to",
    "sum_to_shape",
    "softmax",
    "log_softmax",
    "softmax_grad",
    "log_softmax_grad",
    "sparse_softmax_xent",
    "sparse_softmax_xent_mean_grad",
    "softmax_xent",
    "l2_loss",
    "reduce_sum",
    "reduce_mean",
    "argmax",
    "equal",
    "cast",
    "dropout",
    "fill",
    "batch_norm_train",
    "batch_norm_infer",
    "batch_norm_grad",
    "assign_moving_average",
    "apply_gradient_descent",
    "apply_momentum",
    "apply_adam",
    "weighted_sum",
    "mean_apply",
    "multi_apply",
    "increment_step",
    "one_hot",
    "transpose",
    "pad",
    "gather",
    "gather_grad",
    "tile",
    "tile_grad",
    "apply_rmsprop",
    "apply_adagrad",
    "top_k",
    "in_top_k",
    "top_k_grad",
];
