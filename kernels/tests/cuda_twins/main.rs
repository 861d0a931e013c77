//! Every CUDA twin against its CPU body on a GPU, when one exists: random
//! inputs (fixed seeds), each source compiled by NVRTC to a cubin for the
//! device's own architecture, launched through cudarc's driver API, copied
//! back and compared with the CPU kernel on the same inputs.
//!
//! Tolerances, per kernel (`tol` in the table the test prints):
//! - `exact`: bit for bit (NaN matches NaN): copies, selections, integer
//!   kernels, dropout masks, pooling, the tower reduction, optimizer updates
//!   (their CUDA forms round every step as the CPU does);
//! - otherwise `|gpu - cpu| <= tol * max(|cpu|, 1)`: tree-ordered sums
//!   (1e-4: sums of up to thousands of terms in another order), softmax rows
//!   (1e-5), transcendental functions (`expf`, `tanhf`: 2e-6) differ by rounding.
//!
//! Skipped, with a message, without a CUDA driver, a GPU or NVRTC (CI has
//! no GPU), unless `TOWERS_REQUIRE_GPU` is set (`bench/gpu.sh` sets it):
//! then that is a failure (`towers_kernels::require_gpu`). The CPU bodies are called through the small
//! adapters in `cpu.rs`, the one place to fix when their signatures move.
//! Files: `harness.rs` (launch, buffers, report), `math.rs`, `spatial.rs`,
//! `training.rs`, `array.rs` (the checks by kernel family).
#[path = "../common/mod.rs"]
mod common;
// array ops (issue 22)
mod array;
mod cpu;
mod harness;
mod math;
mod spatial;
mod training;

use std::cell::RefCell;

use cudarc::driver::CudaContext;

use harness::{Gpu, Report, Rng};
use math::{elementwise, fused, reductions, softmax};
use spatial::{convs, layout, pools};
use training::{batchnorm, dropout, optim};

fn gpu() -> Result<Gpu, String> {
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
    Ok(Gpu { ctx, stream, arch: format!("sm_{major}{minor}"), modules: RefCell::default() })
}

#[test]
fn cuda_twins_match_cpu() {
    let g = match gpu() {
        Ok(g) => g,
        Err(why) => match towers_kernels::require_gpu::no_gpu("cuda_twins_match_cpu", &why) {
            Ok(skipped) => return eprintln!("{skipped}"),
            Err(failure) => panic!("{failure}"),
        },
    };
    let mut r = Report::default();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    elementwise(&g, &mut r, &mut rng);
    fused(&g, &mut r, &mut rng);
    reductions(&g, &mut r, &mut rng);
    softmax(&g, &mut r, &mut rng);
    pools(&g, &mut r, &mut rng);
    convs(&g, &mut r, &mut rng);
    layout(&g, &mut r, &mut rng);
    dropout(&g, &mut r, &mut rng);
    batchnorm(&g, &mut r, &mut rng);
    optim(&g, &mut r, &mut rng);
    array::arrays(&g, &mut r, &mut rng);

    eprintln!("\n{:<24} {:<44} {:>8} {:>11} {:>11}  result", "kernel", "case", "tol", "max |err|", "max rel");
    for c in &r.checks {
        let tol = c.tol.map(|t| format!("{t:.0e}")).unwrap_or_else(|| "exact".into());
        eprintln!(
            "{:<24} {:<44} {:>8} {:>11.3e} {:>11.3e}  {}",
            c.kernel,
            c.case,
            tol,
            c.max_abs,
            c.max_err,
            if c.pass { "ok" } else { "FAILED" }
        );
    }
    let mut kernels: Vec<&str> = Vec::new();
    for c in &r.checks {
        if !kernels.contains(&c.kernel) {
            kernels.push(c.kernel);
        }
    }
    let failed: Vec<&str> =
        kernels.iter().copied().filter(|k| r.checks.iter().any(|c| c.kernel == *k && !c.pass)).collect();
    let missing: Vec<&str> = WITH_SOURCE.iter().copied().filter(|k| !kernels.contains(k)).collect();
    eprintln!(
        "\n{} kernels checked ({} checks): {} passed, {} failed {:?}; not covered: {:?}",
        kernels.len(),
        r.checks.len(),
        kernels.len() - failed.len(),
        failed.len(),
        failed,
        missing
    );
    assert!(failed.is_empty() && missing.is_empty(), "failed: {failed:?}, not covered: {missing:?}");
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
];
