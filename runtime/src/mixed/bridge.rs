//! Events that cross parts of a mixed session: one 32-bit flag per bridged
//! event (recorded in one part, waited in another), in host memory from the
//! session's [`HostMemory`] (page-locked when a CUDA part takes part, so a
//! GPU stream writes it with `cuStreamWriteValue32` and waits on it with
//! `cuStreamWaitValue32`).
//!
//! The protocol is a flag per step, not a counter: 0 until the event is
//! recorded in this step, then 1; the mixed backend clears every flag
//! between steps, while no part runs ([`Bridge::clear`]). The values a
//! stream writes and waits for are therefore the same constants every step,
//! so a GPU part can capture them in a CUDA graph and replay it.
//!
//! Invariants: a part sets a flag ([`Bridge::record`]) only after every
//! earlier step of the recording stream completed and its writes are
//! visible to the other parts (release order on the host; the stream
//! write's memory barrier on a GPU); a waiter reads it with acquire order.
//! A part that can wake sleepers (host threads) registers a ringer, which
//! a host record calls; a flag written by a GPU rings nobody, so host
//! waiters on a bridged event sleep with a timeout ([`Bridge::poll_interval`]).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::host_memory::{HostBlock, HostMemory};

/// Called with an event number when a host part records that bridged event.
pub type Ringer = Arc<dyn Fn(usize) + Send + Sync>;

/// The flags of the bridged events of one program; see the module docs.
pub struct Bridge {
    block: HostBlock,
    bridged: Vec<bool>,
    ringers: Mutex<Vec<Ringer>>,
    pinned: bool,
}

impl Bridge {
    /// Flags for the events marked in `bridged` (one entry per plan event),
    /// in memory from `memory`.
    pub fn new(bridged: Vec<bool>, memory: &dyn HostMemory) -> Result<Bridge, String> {
        let block = memory.alloc(bridged.len().max(1) * 4)?;
        Ok(Bridge { block, bridged, ringers: Mutex::new(Vec::new()), pinned: memory.pinned() })
    }

    fn flag(&self, e: usize) -> &AtomicU32 {
        debug_assert!(e < self.bridged.len());
        // SAFETY: the block holds one aligned, zero-initialized u32 per
        // event, alive as long as `self`; every access is atomic.
        unsafe { &*(self.block.ptr() as *const AtomicU32).add(e) }
    }

    /// Whether event `e` is recorded in one part and waited in another.
    pub fn is_bridged(&self, e: usize) -> bool {
        self.bridged.get(e).copied().unwrap_or(false)
    }
    /// How many events the plan has.
    pub fn num_events(&self) -> usize {
        self.bridged.len()
    }
    /// Whether the flags are page-locked (a GPU stream may write and wait on them).
    pub fn pinned(&self) -> bool {
        self.pinned
    }
    /// The host address of event `e`'s flag (a GPU part maps it to the
    /// device address its stream memory operations take).
    pub fn flag_addr(&self, e: usize) -> usize {
        self.block.ptr() as usize + 4 * e
    }

    /// Add a host part's ringer (at load).
    pub fn add_ringer(&self, ringer: Ringer) {
        self.ringers.lock().unwrap_or_else(|p| p.into_inner()).push(ringer);
    }

    /// Set event `e`'s flag (release) and ring the host parts.
    pub fn record(&self, e: usize) {
        if e >= self.bridged.len() {
            return;
        }
        self.flag(e).store(1, Ordering::Release);
        for r in self.ringers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            r(e);
        }
    }

    /// Whether event `e` was recorded in this step (acquire).
    #[inline]
    pub fn recorded(&self, e: usize) -> bool {
        e < self.bridged.len() && self.flag(e).load(Ordering::Acquire) != 0
    }

    /// Clear every flag: only between steps, while no part runs.
    pub fn clear(&self) {
        for e in 0..self.bridged.len() {
            self.flag(e).store(0, Ordering::Release);
        }
    }

    /// How long a host thread sleeping on a bridged event sleeps before it
    /// looks at the flag again (a GPU's write rings nobody).
    pub fn poll_interval(&self) -> std::time::Duration {
        std::time::Duration::from_micros(50)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_memory::Pageable;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn flags_are_set_rung_and_cleared() {
        let b = Bridge::new(vec![false, true, true], &Pageable).expect("bridge");
        let rung = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&rung);
        b.add_ringer(Arc::new(move |e| {
            r.fetch_add(e + 1, Ordering::Relaxed);
        }));
        assert!(!b.is_bridged(0) && b.is_bridged(1) && !b.is_bridged(7));
        assert!(!b.recorded(2));
        b.record(2);
        assert!(b.recorded(2) && !b.recorded(1));
        assert_eq!(rung.load(Ordering::Relaxed), 3);
        assert_eq!(b.flag_addr(2) - b.flag_addr(0), 8);
        b.clear();
        assert!(!b.recorded(2));
    }
}
