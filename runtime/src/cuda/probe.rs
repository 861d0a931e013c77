//! Whether a CUDA driver is present, asked without ever panicking: cudarc
//! panics when it cannot load libcuda, so the library is probed with
//! `is_culib_present` before any other cudarc call, and those calls run
//! under `catch_unwind` as a second guard.

use std::fmt;

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaStatus {
    /// No CUDA driver library could be loaded.
    NotInstalled,
    /// The driver loaded and reports this many devices.
    Found { devices: usize },
    /// The driver loaded but failed to initialize or count devices.
    Error(String),
}

impl fmt::Display for CudaStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaStatus::NotInstalled => f.write_str("no CUDA driver found"),
            CudaStatus::Found { devices } => write!(f, "CUDA driver found with {devices} device(s)"),
            CudaStatus::Error(e) => write!(f, "CUDA driver found but unusable: {e}"),
        }
    }
}

/// Probe for the CUDA driver and its devices.
pub fn probe() -> CudaStatus {
    // SAFETY: only tries to dlopen the driver's candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return CudaStatus::NotInstalled;
    }
    let r = std::panic::catch_unwind(|| {
        cudarc::driver::result::init().map_err(|e| format!("{e:?}"))?;
        cudarc::driver::result::device::get_count().map_err(|e| format!("{e:?}"))
    });
    match r {
        Ok(Ok(n)) => CudaStatus::Found { devices: n.max(0) as usize },
        Ok(Err(e)) => CudaStatus::Error(e),
        Err(_) => CudaStatus::Error("the CUDA driver panicked while initializing".into()),
    }
}
