//! Which SIMD path the CPU kernels take, chosen once per process.
//!
//! The hot kernels are written once, generic over [`pulp::Simd`] (the
//! vector width is `S::F32_LANES`), and entered through [`dispatch`], which
//! runs them on the [`SimdPath`] this process selected:
//! - by default the widest this CPU has: AVX-512 (pulp's `V4`), AVX2 + FMA
//!   (`V3`), NEON on aarch64, else scalar;
//! - or the one named by the environment variable `TOWERS_SIMD`
//!   (`avx512`, `avx2`, `neon`, `scalar`), so that the paths most users run
//!   are tested on any machine. A path this CPU lacks, or an unknown name,
//!   is refused by [`selected`] with a [`KernelError`] that names the
//!   variable and lists what the CPU has; `Session::new` and the command line
//!   call it first, so a bad value never reaches a kernel.
//!
//! ## Invariants
//! - The selection is made once ([`std::sync::OnceLock`]) and never changes
//!   within a process: a plan's bits never depend on when a kernel ran.
//! - [`dispatch`] never runs a path the CPU lacks: where the selection was
//!   refused it runs the detected best (callers have already turned the
//!   refusal into an error).
//! - Every kernel keeps, per output element, the same order of operations
//!   (fused multiply-adds included) on every path wherever its doc says so;
//!   vector lanes are independent outputs. Where a kernel's bits differ
//!   between paths, its module docs say where.
//! - The GEMM (crate `gemm`) picks its own micro-kernel from the CPU and the
//!   build: with the cargo feature `avx512-gemm` (on by default) it uses
//!   AVX-512 where the CPU has it, whatever `TOWERS_SIMD` says; a build
//!   without that feature (`--no-default-features`) runs its AVX2 kernel, as
//!   an AVX2-only machine does. [`gemm_path`] says which.

use std::sync::OnceLock;

use crate::KernelError;

/// The environment variable that forces a lower SIMD path.
pub const ENV: &str = "TOWERS_SIMD";

/// One SIMD instruction set the CPU kernels can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SimdPath {
    /// No vector instructions (pulp's `Scalar`: one lane, `f32::mul_add`).
    Scalar,
    /// ARM NEON (aarch64), 4 lanes of f32.
    Neon,
    /// x86-64 AVX2 with FMA (x86-64-v3), 8 lanes of f32.
    Avx2,
    /// x86-64 AVX-512 F/BW/CD/DQ/VL (x86-64-v4), 16 lanes of f32.
    Avx512,
}

impl SimdPath {
    /// Every path, widest first.
    pub const ALL: [SimdPath; 4] = [SimdPath::Avx512, SimdPath::Avx2, SimdPath::Neon, SimdPath::Scalar];

    /// The name `TOWERS_SIMD` takes and the benchmarks print.
    pub fn name(self) -> &'static str {
        match self {
            SimdPath::Avx512 => "avx512",
            SimdPath::Avx2 => "avx2",
            SimdPath::Neon => "neon",
            SimdPath::Scalar => "scalar",
        }
    }

    /// The path named `s` (as [`name`](Self::name) writes it; case-insensitive).
    pub fn parse(s: &str) -> Option<SimdPath> {
        let s = s.trim().to_ascii_lowercase();
        SimdPath::ALL.into_iter().find(|p| p.name() == s)
    }

    /// f32 lanes per vector register on this path.
    pub fn f32_lanes(self) -> usize {
        match self {
            SimdPath::Avx512 => 16,
            SimdPath::Avx2 => 8,
            SimdPath::Neon => 4,
            SimdPath::Scalar => 1,
        }
    }

    /// True when this CPU can run the path.
    pub fn supported(self) -> bool {
        match self {
            SimdPath::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdPath::Avx512 => pulp::x86::V4::try_new().is_some(),
            #[cfg(target_arch = "x86_64")]
            SimdPath::Avx2 => pulp::x86::V3::try_new().is_some(),
            #[cfg(target_arch = "aarch64")]
            SimdPath::Neon => pulp::aarch64::Neon::try_new().is_some(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The widest path this CPU has.
    pub fn best() -> SimdPath {
        SimdPath::ALL.into_iter().find(|p| p.supported()).unwrap_or(SimdPath::Scalar)
    }

    /// Every path this CPU has, widest first (scalar always last).
    pub fn available() -> Vec<SimdPath> {
        SimdPath::ALL.into_iter().filter(|p| p.supported()).collect()
    }
}

impl std::fmt::Display for SimdPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The path a value of `TOWERS_SIMD` selects on this CPU (`None`: unset or
/// empty, the best). Refuses unknown names and paths the CPU lacks.
pub fn select(value: Option<&str>) -> Result<SimdPath, KernelError> {
    let available = || SimdPath::available().iter().map(|p| p.name()).collect::<Vec<_>>().join(", ");
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(SimdPath::best()),
        Some(v) => match SimdPath::parse(v) {
            None => Err(KernelError::SimdUnknown { var: ENV, value: v.to_string(), available: available() }),
            Some(p) if !p.supported() => {
                Err(KernelError::SimdUnsupported { var: ENV, path: p.name(), available: available() })
            }
            Some(p) => Ok(p),
        },
    }
}

static SELECTED: OnceLock<Result<SimdPath, KernelError>> = OnceLock::new();

/// This process's selection: `TOWERS_SIMD` read once, checked against the
/// CPU. An error names the variable and the paths the CPU has.
pub fn selected() -> Result<SimdPath, KernelError> {
    SELECTED.get_or_init(|| select(std::env::var(ENV).ok().as_deref())).clone()
}

/// The path the kernels run on: the selection, or the best where the
/// selection was refused (see the module's invariants).
pub fn active() -> SimdPath {
    selected().unwrap_or_else(|_| SimdPath::best())
}

/// Which micro-kernel family the GEMM runs on this CPU with this build
/// (`"avx512"`, `"avx2"`, `"neon"` or `"scalar"`); see the module docs.
pub fn gemm_path() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if cfg!(feature = "avx512-gemm") && std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
        if std::arch::is_x86_feature_detected!("fma") {
            return "avx2";
        }
        "scalar"
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return "neon";
        }
        "scalar"
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        "scalar"
    }
}

/// Runs `op` on the [`active`] path.
#[inline]
pub fn dispatch<Op: pulp::WithSimd>(op: Op) -> Op::Output {
    dispatch_on(active(), op)
}

/// Runs `op` on `path`; on scalar where this CPU lacks `path` (tests use it
/// to compare paths; pass only [`SimdPath::available`] ones).
#[inline]
pub fn dispatch_on<Op: pulp::WithSimd>(path: SimdPath, op: Op) -> Op::Output {
    use pulp::Simd;
    match path {
        #[cfg(target_arch = "x86_64")]
        SimdPath::Avx512 => match pulp::x86::V4::try_new() {
            Some(s) => Simd::vectorize(s, op),
            None => Simd::vectorize(pulp::Scalar::new(), op),
        },
        #[cfg(target_arch = "x86_64")]
        SimdPath::Avx2 => match pulp::x86::V3::try_new() {
            Some(s) => Simd::vectorize(s, op),
            None => Simd::vectorize(pulp::Scalar::new(), op),
        },
        #[cfg(target_arch = "aarch64")]
        SimdPath::Neon => match pulp::aarch64::Neon::try_new() {
            Some(s) => Simd::vectorize(s, op),
            None => Simd::vectorize(pulp::Scalar::new(), op),
        },
        _ => Simd::vectorize(pulp::Scalar::new(), op),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_scalar_is_always_there() {
        for p in SimdPath::ALL {
            assert_eq!(SimdPath::parse(p.name()), Some(p));
            assert_eq!(SimdPath::parse(&p.name().to_uppercase()), Some(p));
        }
        assert!(SimdPath::Scalar.supported());
        assert_eq!(SimdPath::available().last(), Some(&SimdPath::Scalar));
        assert_eq!(SimdPath::available()[0], SimdPath::best());
    }

    #[test]
    fn select_refuses_unknown_and_unsupported_paths() {
        assert_eq!(select(None).unwrap(), SimdPath::best());
        assert_eq!(select(Some("  ")).unwrap(), SimdPath::best());
        assert_eq!(select(Some("scalar")).unwrap(), SimdPath::Scalar);
        let e = select(Some("sse9")).unwrap_err().to_string();
        assert!(e.contains("TOWERS_SIMD") && e.contains("sse9") && e.contains("scalar"), "{e}");
        // A path of the other architecture is never supported.
        let foreign = if cfg!(target_arch = "aarch64") { "avx2" } else { "neon" };
        let e = select(Some(foreign)).unwrap_err().to_string();
        assert!(e.contains("TOWERS_SIMD") && e.contains(foreign) && e.contains("this CPU"), "{e}");
    }

    #[test]
    fn dispatch_runs_the_path_it_names() {
        struct Lanes;
        impl pulp::WithSimd for Lanes {
            type Output = usize;
            fn with_simd<S: pulp::Simd>(self, _: S) -> usize {
                S::F32_LANES
            }
        }
        for p in SimdPath::available() {
            assert_eq!(dispatch_on(p, Lanes), p.f32_lanes(), "{p}");
        }
        assert_eq!(dispatch(Lanes), active().f32_lanes());
    }
}
