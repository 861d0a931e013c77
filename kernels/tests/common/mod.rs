//! NVRTC through cudarc's raw bindings, shared by the CUDA tests: PTX for a
//! virtual architecture (`compute_90`) or a cubin for a real one (`sm_90`),
//! with the program log on failure. cudarc's safe API returns PTX only, and
//! the PTX of a newer NVRTC can be refused by an older driver's JIT, so the
//! GPU tests load cubins.

#![allow(dead_code)]

use std::ffi::{c_char, CStr, CString};

use cudarc::nvrtc::sys;

/// True when libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn nvrtc_present() -> bool {
    unsafe { sys::is_culib_present() }
}

/// `(major, minor)` of the loaded NVRTC.
pub fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
}

/// What NVRTC produced: PTX text or a cubin image, and the program log.
pub struct Compiled {
    pub image: Vec<u8>,
    pub log: String,
}

fn check(r: sys::nvrtcResult, what: &str) -> Result<(), String> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}"))
    }
}

/// Compile `code` (named `name` in messages) for `arch`: `compute_XX` gives
/// PTX (NUL-terminated), `sm_XX` a cubin. `extra` are further NVRTC options.
pub fn compile(name: &str, code: &str, arch: &str, extra: &[&str]) -> Result<Compiled, String> {
    let src = CString::new(code).map_err(|e| format!("{name}: {e}"))?;
    let cname = CString::new(name).unwrap();
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    unsafe {
        check(
            sys::nvrtcCreateProgram(&mut prog, src.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null()),
            "nvrtcCreateProgram",
        )?;
    }
    let mut opts: Vec<CString> = vec![CString::new(format!("--gpu-architecture={arch}")).unwrap()];
    opts.extend(extra.iter().map(|o| CString::new(*o).unwrap()));
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let result = unsafe { sys::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr()) };
    let log = unsafe {
        let mut n = 0usize;
        sys::nvrtcGetProgramLogSize(prog, &mut n);
        let mut buf = vec![0 as c_char; n.max(1)];
        sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr());
        CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
    };
    let out = if result != sys::nvrtcResult::NVRTC_SUCCESS {
        Err(format!("NVRTC failed to compile {name} for {arch} ({result:?}):\n{log}"))
    } else if arch.starts_with("sm_") {
        unsafe {
            let mut n = 0usize;
            check(sys::nvrtcGetCUBINSize(prog, &mut n), "nvrtcGetCUBINSize")?;
            let mut image = vec![0u8; n];
            check(sys::nvrtcGetCUBIN(prog, image.as_mut_ptr() as *mut c_char), "nvrtcGetCUBIN")?;
            Ok(Compiled { image, log })
        }
    } else {
        unsafe {
            let mut n = 0usize;
            check(sys::nvrtcGetPTXSize(prog, &mut n), "nvrtcGetPTXSize")?;
            let mut image = vec![0u8; n];
            check(sys::nvrtcGetPTX(prog, image.as_mut_ptr() as *mut c_char), "nvrtcGetPTX")?;
            Ok(Compiled { image, log })
        }
    };
    unsafe { sys::nvrtcDestroyProgram(&mut prog) };
    out
}

/// True when the `CI` environment variable asks for required checks.
pub fn in_ci() -> bool {
    std::env::var("CI").map(|v| !v.is_empty() && v != "0" && v != "false").unwrap_or(false)
}

/// A skipped test says so loudly; in CI, or with `TOWERS_REQUIRE_GPU` set
/// (a GPU run needs NVRTC too), a skip is a failure.
pub fn skip(test: &str, why: &str) {
    let msg = format!(
        "\n==================== SKIPPED: {test} ====================\n{why}\n\
         Install NVRTC and ptxas (see .ci/run): python3 -m venv .venv && .venv/bin/pip install --no-deps \
         nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-nvcc==13.0.88, then put \
         .venv/lib/python3*/site-packages/nvidia/cu13/lib on LD_LIBRARY_PATH and its bin on PATH.\n\
         =========================================================\n"
    );
    if in_ci() {
        panic!("CI is set, so this test is required:{msg}");
    }
    if towers_kernels::require_gpu::required() {
        panic!("{} is set, so this test is required:{msg}", towers_kernels::require_gpu::VAR);
    }
    eprintln!("{msg}");
}
