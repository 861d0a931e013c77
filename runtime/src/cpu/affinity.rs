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
    if let Some(core) = current().and_then(|allowed| nth_core(&allowed, k)) {
        set_current(&one_core(core));
    }
    #[cfg(not(target_os = "linux"))]
    let _ = k;
}

/// The calling thread's affinity, to restore after a step (see [`HostPin`]).
#[cfg(target_os = "linux")]
fn current() -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0).then_some(set)
    }
}

/// The `k`-th core (modulo their count) of a set, if it has at least two
/// (no allocation: this runs at every step).
#[cfg(target_os = "linux")]
fn nth_core(set: &libc::cpu_set_t, k: usize) -> Option<usize> {
    // SAFETY: CPU_ISSET reads the set within CPU_SETSIZE.
    let cores = || (0..libc::CPU_SETSIZE as usize).filter(move |&c| unsafe { libc::CPU_ISSET(c, set) });
    let n = cores().count();
    if n < 2 {
        return None;
    }
    cores().nth(k % n)
}

#[cfg(target_os = "linux")]
fn one_core(c: usize) -> libc::cpu_set_t {
    // SAFETY: a zeroed set, then one bit set within CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(c, &mut set);
        set
    }
}

#[cfg(target_os = "linux")]
fn set_current(set: &libc::cpu_set_t) {
    // SAFETY: a valid set for the calling thread; failure leaves it unpinned.
    unsafe {
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set);
    }
}

/// The host's work runs on the caller's thread; during a step it is pinned
/// to one core (`sched::host_core` picks it: the core after the workers'
/// when they leave one free or when the caller runs a device's streams too;
/// else the last worker's, as the host alone works mostly while the towers
/// wait, at the start and the end of a step) and its own affinity is
/// restored when the step ends, so the caller's thread is left as found.
pub struct HostPin {
    #[cfg(target_os = "linux")]
    saved: Option<libc::cpu_set_t>,
}

impl HostPin {
    /// Pin the calling thread to the `k`-th allowed core (modulo their count) for one step.
    pub fn new(k: usize) -> HostPin {
        #[cfg(target_os = "linux")]
        {
            let saved = current();
            match saved.as_ref().and_then(|allowed| nth_core(allowed, k)) {
                Some(core) => {
                    set_current(&one_core(core));
                    HostPin { saved }
                }
                None => HostPin { saved: None },
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = k;
            HostPin {}
        }
    }
}

impl Drop for HostPin {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some(s) = &self.saved {
            set_current(s);
        }
    }
}
