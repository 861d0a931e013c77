//! What a GPU test does where no GPU (or no CUDA driver, NVRTC, cuBLAS)
//! can be used: skip with a loud message, or, when `TOWERS_REQUIRE_GPU` is
//! set, fail. A run that was meant to exercise the GPU (`bench/gpu.sh` sets
//! the variable) can then never pass by skipping everything.
//!
//! Invariants:
//! - the variable counts as set unless it is absent, empty, `0` or `false`
//!   (the same reading as `CI` in the compile tests);
//! - [`verdict`] is the one decision every GPU test takes (the kernel twins,
//!   the CUDA backend's tests, NCCL on a GPU, the compile tests' skips), so
//!   the rule is written once; the caller prints a skip or panics with the
//!   failure (library code never prints).
//!
//! ```
//! use towers_kernels::require_gpu::verdict;
//! assert!(verdict(false, "t", "no GPU").is_ok()); // skipped, with a message
//! assert!(verdict(true, "t", "no GPU").is_err()); // TOWERS_REQUIRE_GPU=1: a failure
//! ```

use std::ffi::OsStr;

/// The environment variable that turns a GPU test's skip into a failure.
pub const VAR: &str = "TOWERS_REQUIRE_GPU";

/// Whether a value of [`VAR`] asks for the GPU: anything but absent, empty,
/// `0` or `false`.
pub fn is_set(value: Option<&OsStr>) -> bool {
    match value.and_then(OsStr::to_str) {
        None => value.is_some_and(|v| !v.is_empty()),
        Some(v) => !v.is_empty() && v != "0" && v != "false",
    }
}

/// Whether this process runs with [`VAR`] set.
pub fn required() -> bool {
    is_set(std::env::var_os(VAR).as_deref())
}

/// What test `test` does without a GPU, for the reason `why`: `Ok` with the
/// message to print when it may skip, `Err` with the failure when
/// `required`.
pub fn verdict(required: bool, test: &str, why: &str) -> Result<String, String> {
    if required {
        Err(format!("{VAR} is set, so {test} must run on a GPU, but it cannot: {why}"))
    } else {
        Ok(format!(
            "\n==================== SKIPPED: {test} ====================\n{why}\n\
             (set {VAR}=1 to make this a failure, as bench/gpu.sh does)\n"
        ))
    }
}

/// [`verdict`] under this process's [`VAR`].
pub fn no_gpu(test: &str, why: &str) -> Result<String, String> {
    verdict(required(), test, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_reads_as_ci_does() {
        for (v, set) in [(None, false), (Some(""), false), (Some("0"), false), (Some("false"), false)] {
            assert_eq!(is_set(v.map(OsStr::new)), set, "{v:?}");
        }
        for v in ["1", "true", "yes"] {
            assert!(is_set(Some(OsStr::new(v))), "{v}");
        }
    }

    /// Unset, a missing GPU is a skip naming the test and the reason; set,
    /// it is a failure naming the variable, the test and the reason.
    #[test]
    fn required_turns_a_skip_into_a_failure() {
        let skip = verdict(false, "cuda_twins_match_cpu", "no CUDA driver").expect("a skip");
        assert!(skip.contains("SKIPPED: cuda_twins_match_cpu") && skip.contains("no CUDA driver"), "{skip}");
        let fail = verdict(true, "cuda_twins_match_cpu", "no CUDA driver").expect_err("a failure");
        assert!(
            fail.contains(VAR) && fail.contains("cuda_twins_match_cpu") && fail.contains("no CUDA driver"),
            "{fail}"
        );
    }
}
