//! Pinning device threads to cores.
//!
//! The device threads of a multi-device plan sleep and wake at every step.
//! Left to itself, the kernel sometimes wakes two of them on the same core
//! and takes milliseconds to migrate one, which showed as a bimodal step
//! time (1.5x or 0.85x of one device, run to run). Worker `k` (the devices
//! after the host, which stays on the calling thread and is not pinned) is
//! pinned to the k-th core the process may use, modulo their count; with at
//! least as many cores as towers every tower then has a core of its own.
//! Where pinning is not possible the thread just runs unpinned.

/// Pin the calling worker thread (index `k` among the workers).
pub fn pin_worker(k: usize) {
    #[cfg(target_os = "linux")]
    // SAFETY: plain libc calls on a zeroed cpu_set_t owned by this frame.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut allowed) != 0 {
            return;
        }
        let cores: Vec<usize> = (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &allowed)).collect();
        if cores.len() < 2 {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cores[k % cores.len()], &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = k;
}
