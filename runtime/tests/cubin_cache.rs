//! The on-disk cubin cache with the real NVRTC (no GPU needed): the first
//! compile stores each kernel family's cubin, the second reads it back
//! byte for byte, and a corrupted file is compiled again, never loaded.
//! Skipped with a loud message without NVRTC, except under CI (`.ci/run`
//! installs it) or `TOWERS_REQUIRE_GPU`, where it is required.

use towers_runtime::cuda::{compile_cubin, disk_cache::CubinCache, libs};

fn nvrtc_or_skip() -> bool {
    if libs::check(&[libs::CudaLibrary::Nvrtc]).is_ok() {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "CI is set: NVRTC must be on LD_LIBRARY_PATH (.ci/run installs it)");
    assert!(
        !towers_kernels::require_gpu::required(),
        "TOWERS_REQUIRE_GPU is set: NVRTC must be on LD_LIBRARY_PATH (a GPU run needs it)"
    );
    eprintln!("SKIPPED cubin_cache: libnvrtc.so.13 not found on LD_LIBRARY_PATH (see .ci/run)");
    false
}

#[test]
fn kernel_families_compile_once_per_machine() {
    if !nvrtc_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = CubinCache::new(dir.path());
    let sources = &towers_kernels::cuda::sources()[..2];
    let mut first = Vec::new();
    for s in sources {
        let (image, from_disk) = compile_cubin(s, "sm_90", Some(&cache)).expect("compiles");
        assert!(!from_disk, "{}: an empty cache", s.path);
        assert!(image.starts_with(b"\x7fELF"), "{}: a cubin is an ELF image", s.path);
        first.push(image);
    }
    for (s, image) in sources.iter().zip(&first) {
        let (again, from_disk) = compile_cubin(s, "sm_90", Some(&cache)).expect("cached");
        assert!(from_disk, "{}: the second compile reads the cache", s.path);
        assert_eq!(&again, image, "{}", s.path);
    }
    // Corrupt every file: each family compiles again and is stored whole.
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let p = e.unwrap().path();
        let mut b = std::fs::read(&p).unwrap();
        let n = b.len();
        b[n / 2] ^= 0xff;
        std::fs::write(&p, b).unwrap();
    }
    for (s, image) in sources.iter().zip(&first) {
        let (again, from_disk) = compile_cubin(s, "sm_90", Some(&cache)).expect("recompiles");
        assert!(!from_disk, "{}: a corrupted file is not loaded", s.path);
        assert_eq!(&again, image, "{}: NVRTC is deterministic", s.path);
        assert!(compile_cubin(s, "sm_90", Some(&cache)).unwrap().1, "{}: rewritten", s.path);
    }
}
