//! The GPU probes of issue 21 (items 1 and 2), shared by
//! `runtime/tests/cuda_probe.rs`: the pure logic here (statistics, the
//! `PROBE` line, a child process's outcome, the probes' error type), the
//! driver handles in [`gpu`], the host/GPU crossings in [`cross`] and the
//! several-contexts probes in [`ctxs`].
//!
//! Invariants:
//! - every finding is one line `PROBE <name>: <verdict> (<detail>) on <GPU>`
//!   ([`line`]), with no newline inside, so `grep ^PROBE` reads them all;
//! - a driver error is a [`ProbeError`] naming the call and the driver's
//!   own text, returned to the test (which fails with it), never a panic;
//! - every wait on the GPU by the host is bounded ([`gpu::SPIN_LIMIT`]), so
//!   a probe that would hang is an error instead.

#![allow(dead_code)]

pub mod cross;
pub mod ctxs;
pub mod gpu;

use thiserror::Error;

/// Why a probe could not measure.
#[derive(Debug, Error)]
pub enum ProbeError {
    /// A driver call failed: the call, the result code, the driver's text.
    #[error("{call} failed: {code} ({text})")]
    Driver { call: String, code: String, text: String },
    /// The host waited longer than [`gpu::SPIN_LIMIT`] for the GPU.
    #[error("timed out after {ms} ms waiting for {what}")]
    Timeout { what: String, ms: u128 },
    /// Anything else (a wrong value, a missing driver export, NVRTC).
    #[error("{0}")]
    Other(String),
}

/// Median and 90th percentile of a set of latencies, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub median_us: f64,
    pub p90_us: f64,
    pub n: usize,
}

/// The `q`-quantile (0..=1) of sorted `v`, by the nearest-rank rule
/// (the smallest value with at least `q * n` values at or below it).
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

impl Stats {
    /// The statistics of `samples` (microseconds); None when empty or when
    /// one is not a finite number.
    pub fn of(samples: &[f64]) -> Option<Stats> {
        if samples.iter().any(|s| !s.is_finite()) {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        Some(Stats { median_us: quantile(&v, 0.5)?, p90_us: quantile(&v, 0.9)?, n: v.len() })
    }

    /// `median 4.1 us, p90 5.3 us`.
    pub fn value(&self) -> String {
        format!("median {:.1} us, p90 {:.1} us", self.median_us, self.p90_us)
    }
}

/// One finding: `PROBE <name>: <verdict> (<detail>) on <gpu>`, with any
/// newline of the parts (a driver's text) turned into a space.
pub fn line(name: &str, verdict: &str, detail: &str, gpu: &str) -> String {
    let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    format!("PROBE {}: {} ({}) on {}", flat(name), flat(verdict), flat(detail), flat(gpu))
}

/// What the child process of the foreign-pointer probe reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildOutcome {
    /// The kernel ran: whether it read the values the other context wrote.
    Read { right_values: bool },
    /// A call failed (the launch or the synchronize after it): the text.
    Faulted { error: String },
    /// The child ended without reporting (a crash, a signal, a timeout).
    Silent { status: String },
}

/// The marker of the child's report line.
pub const CHILD_MARK: &str = "CHILD foreign_read:";

/// The outcome in the child's output `log` (its `CHILD foreign_read:`
/// line: `read right`, `read wrong` or `fault <text>`), or Silent with the
/// child's exit `status` when it printed none.
pub fn child_outcome(log: &str, status: &str) -> ChildOutcome {
    // libtest prints the child's first line after "test NAME ... ", so the
    // mark is looked for anywhere in a line.
    let Some(rest) = log.lines().find_map(|l| l.find(CHILD_MARK).map(|i| &l[i + CHILD_MARK.len()..])) else {
        return ChildOutcome::Silent { status: status.to_string() };
    };
    match rest.trim() {
        "read right" => ChildOutcome::Read { right_values: true },
        "read wrong" => ChildOutcome::Read { right_values: false },
        r => match r.strip_prefix("fault") {
            Some(e) => ChildOutcome::Faulted { error: e.trim().to_string() },
            None => ChildOutcome::Silent { status: format!("{status}, unreadable report '{r}'") },
        },
    }
}

/// The first line of the child's output mentioning "after the fault", for
/// the detail of the foreign-pointer finding.
pub fn child_after(log: &str) -> Option<String> {
    const AFTER: &str = "CHILD after:";
    log.lines().find_map(|l| l.find(AFTER).map(|i| l[i + AFTER.len()..].trim().to_string()))
}

/// Gigabytes (1e9 bytes) per second moved by `bytes` in `secs`.
pub fn gb_per_s(bytes: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        return f64::INFINITY;
    }
    bytes as f64 / secs / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_follow_the_nearest_rank_rule() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(5.0));
        assert_eq!(quantile(&v, 0.9), Some(9.0));
        assert_eq!(quantile(&v, 1.0), Some(10.0));
        assert_eq!(quantile(&v, 0.0), Some(1.0));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&v, 1.5), None);
    }

    #[test]
    fn stats_sort_first_and_refuse_nan() {
        let s = Stats::of(&[9.0, 1.0, 5.0, 3.0, 7.0]).expect("stats");
        assert_eq!((s.median_us, s.p90_us, s.n), (5.0, 9.0, 5));
        assert_eq!(s.value(), "median 5.0 us, p90 9.0 us");
        assert!(Stats::of(&[1.0, f64::NAN]).is_none());
        assert!(Stats::of(&[]).is_none());
    }

    #[test]
    fn a_line_is_one_line_in_the_agreed_shape() {
        let l = line("ctx2_peer_copy", "held", "bytes equal,\n 12.0 GB/s", "NVIDIA H100 80GB HBM3");
        assert_eq!(l, "PROBE ctx2_peer_copy: held (bytes equal, 12.0 GB/s) on NVIDIA H100 80GB HBM3");
    }

    #[test]
    fn the_childs_report_is_parsed() {
        let log = "running 1 test\nCHILD foreign_read: fault cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS\nCHILD after: context 2 usable\n";
        assert_eq!(
            child_outcome(log, "exit 0"),
            ChildOutcome::Faulted { error: "cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS".into() }
        );
        assert_eq!(child_after(log).as_deref(), Some("context 2 usable"));
        assert_eq!(
            child_outcome("CHILD foreign_read: read right", "exit 0"),
            ChildOutcome::Read { right_values: true }
        );
        assert_eq!(
            child_outcome("CHILD foreign_read: read wrong", "exit 0"),
            ChildOutcome::Read { right_values: false }
        );
        assert_eq!(child_outcome("thread panicked", "signal 11"), ChildOutcome::Silent { status: "signal 11".into() });
        assert!(matches!(child_outcome("CHILD foreign_read: maybe", "exit 0"), ChildOutcome::Silent { .. }));
        // As libtest prints it under --nocapture (seen on an H200): the
        // report follows the test's name on its line.
        let log = "running 1 test\ntest child_foreign_pointer ... CHILD foreign_read: read right\nCHILD after: context 1 (the owner) still usable\nok\n";
        assert_eq!(child_outcome(log, "exit status: 0"), ChildOutcome::Read { right_values: true });
        assert_eq!(child_after(log).as_deref(), Some("context 1 (the owner) still usable"));
    }

    #[test]
    fn bandwidth_is_in_gigabytes_per_second() {
        assert_eq!(gb_per_s(2_000_000_000, 1.0), 2.0);
        assert!(gb_per_s(1, 0.0).is_infinite());
    }
}
