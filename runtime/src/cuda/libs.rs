//! Which CUDA libraries can be loaded, asked without ever panicking.
//!
//! cudarc opens every library by bare name on first use (`libcuda.so.1`,
//! `libnvrtc.so.13`, `libcublas.so.13`, ...) and panics inside a `OnceLock`
//! when it cannot: so each library is probed with `is_culib_present()`
//! before any other call into it. There is no path variable: the folders
//! holding them must be on `LD_LIBRARY_PATH` (the driver comes with the
//! NVIDIA driver install; NVRTC and cuBLAS from a CUDA toolkit's `lib64`, or
//! from the PyPI wheels `nvidia-cuda-nvrtc` and `nvidia-cublas`, which put
//! them in `site-packages/nvidia/cu13/lib`, e.g. the ones a PyTorch install
//! ships).

use std::fmt;

use thiserror::Error;

/// A CUDA library the backend needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaLibrary {
    /// `libcuda.so.1`, the driver.
    Driver,
    /// `libnvrtc.so.13`, the run-time compiler.
    Nvrtc,
    /// `libcublas.so.13` (and `libcublasLt.so.13` beside it).
    Cublas,
    /// NCCL, for the all-reduce across processes (cargo feature `nccl`).
    Nccl,
}

impl CudaLibrary {
    /// The file cudarc looks for.
    pub fn file(self) -> &'static str {
        match self {
            CudaLibrary::Driver => "libcuda.so.1",
            CudaLibrary::Nvrtc => "libnvrtc.so.13",
            CudaLibrary::Cublas => "libcublas.so.13",
            CudaLibrary::Nccl => "libnccl.so",
        }
    }

    /// Where it usually lives, for the error message.
    pub fn hint(self) -> &'static str {
        match self {
            CudaLibrary::Driver => "it comes with the NVIDIA driver (e.g. /usr/lib/x86_64-linux-gnu); a machine without a GPU has none",
            CudaLibrary::Nvrtc => {
                "a CUDA toolkit's lib64 (/usr/local/cuda-13.0/targets/x86_64-linux/lib) or `pip install nvidia-cuda-nvrtc==13.0.88` (site-packages/nvidia/cu13/lib)"
            }
            CudaLibrary::Cublas => {
                "a CUDA toolkit's lib64, or `pip install nvidia-cublas` / a PyTorch install (site-packages/nvidia/cu13/lib)"
            }
            CudaLibrary::Nccl => {
                "`pip install nvidia-nccl-cu13` puts libnccl.so.2 in site-packages/nvidia/nccl/lib, a name cudarc does not try: `ln -s libnccl.so.2 libnccl.so` there; towers must also be built with `--features nccl`"
            }
        }
    }

    /// Whether cudarc can load it (dlopen by its candidate names only).
    pub fn present(self) -> bool {
        // SAFETY: these only try to dlopen the library's candidate names.
        unsafe {
            match self {
                CudaLibrary::Driver => cudarc::driver::sys::is_culib_present(),
                CudaLibrary::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                CudaLibrary::Cublas => cudarc::cublas::sys::is_culib_present(),
                #[cfg(feature = "nccl")]
                CudaLibrary::Nccl => cudarc::nccl::sys::is_culib_present(),
                #[cfg(not(feature = "nccl"))]
                CudaLibrary::Nccl => false,
            }
        }
    }
}

impl fmt::Display for CudaLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CudaLibrary::Driver => "the CUDA driver",
            CudaLibrary::Nvrtc => "NVRTC",
            CudaLibrary::Cublas => "cuBLAS",
            CudaLibrary::Nccl => "NCCL",
        })
    }
}

/// Why the CUDA backend cannot start.
#[derive(Debug, Error)]
pub enum CudaUnavailable {
    #[error(
        "the CUDA backend needs {library} ({file}), which could not be loaded: put the folder holding it on LD_LIBRARY_PATH ({hint})",
        file = library.file(),
        hint = library.hint()
    )]
    MissingLibrary { library: CudaLibrary },
    #[error("the CUDA driver loaded but reports no GPU")]
    NoDevice,
    #[error("the CUDA driver failed: {0}")]
    Driver(String),
}

/// The first library of `needed` that cannot be loaded.
pub fn check(needed: &[CudaLibrary]) -> Result<(), CudaUnavailable> {
    match needed.iter().find(|l| !l.present()) {
        Some(&library) => Err(CudaUnavailable::MissingLibrary { library }),
        None => Ok(()),
    }
}

/// Whether the loaded CUDA driver exports every function of `names`, or an
/// error naming the first it lacks and `why` they are needed. cudarc looks
/// a driver function up on its first call and panics when it is missing:
/// the functions newer than the backend's first version (stream memory
/// operations, peer copies, `cuCtxCreate_v4`) are asked here first. The
/// driver library must be present ([`check`]).
pub(crate) fn driver_exports(names: &[&str], why: &str) -> Result<(), String> {
    for name in names {
        // SAFETY: the driver library was probed present; looking a symbol up calls nothing.
        let found = unsafe { cudarc::driver::sys::culib().get::<unsafe extern "C" fn()>(name.as_bytes()).is_ok() };
        if !found {
            return Err(format!(
                "the CUDA driver does not export {name}, which {why} needs: update the NVIDIA driver (CUDA 12.5 or newer)"
            ));
        }
    }
    Ok(())
}
