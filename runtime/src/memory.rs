//! The memory check of [`crate::Session::load`]: a plan is refused before
//! anything is allocated when it would not fit, so that an allocation
//! failure (or the OOM killer) never comes first.
//!
//! Invariants:
//! - What is needed counts every plan this session loaded before
//!   (`committed`: its arenas and variables), what the caller declared it
//!   holds or will hold besides the plans (`reserved`: the data set, on a
//!   backend whose memory is the host's), and the new plan.
//! - What is available is the backend's reading at the first check (the
//!   baseline), or less when the backend reports less now than the baseline
//!   minus what this session committed (another process took memory):
//!   pages of a loaded plan that are not touched yet do not lower the
//!   backend's reading, so later readings alone would count them twice or
//!   not at all.
//! - A margin stays free: [`MIN_MARGIN`] or an eighth of what is needed,
//!   whichever is more (the runtime's threads, stacks, staging buffers and
//!   the allocator's slack are not planned).

/// The least memory left free by the check: 512 MiB.
pub const MIN_MARGIN: u64 = 512 << 20;

/// What a session counts against the backend's memory (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryBudget {
    baseline: Option<u64>,
    committed: u64,
    reserved: u64,
}

/// A refused plan: what it needs with the rest, and what is available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// Committed + reserved + planned bytes.
    pub need: u64,
    /// The margin kept free on top.
    pub margin: u64,
    /// Bytes available to this session.
    pub available: u64,
}

impl MemoryBudget {
    /// Take `bytes` as what the backend had available before anything of
    /// this session or its caller was allocated.
    pub fn set_baseline(&mut self, bytes: u64) {
        self.baseline = Some(bytes);
    }

    /// Count `bytes` the caller holds besides the plans (e.g. the data set).
    pub fn reserve(&mut self, bytes: u64) {
        self.reserved = self.reserved.saturating_add(bytes);
    }

    /// Admit a plan of `planned` bytes when the backend reports `now` bytes
    /// available, counting it as committed; or say why not.
    pub fn admit(&mut self, now: u64, planned: u64) -> Result<(), Refused> {
        let baseline = *self.baseline.get_or_insert(now);
        let available = baseline.min(now.saturating_add(self.committed));
        let need = self.committed.saturating_add(self.reserved).saturating_add(planned);
        let margin = MIN_MARGIN.max(need / 8);
        if need.saturating_add(margin) > available {
            return Err(Refused { need, margin, available });
        }
        self.committed = self.committed.saturating_add(planned);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// The hostile sweep's case: a 19.87 GiB plan against 21.5 GiB passed
    /// with no margin and left the machine 1.62 GiB once running.
    #[test]
    fn a_plan_that_fits_only_without_a_margin_is_refused() {
        let mut b = MemoryBudget::default();
        let r = b.admit(215 * GIB / 10, 1987 * GIB / 100).unwrap_err();
        assert_eq!(r.margin, r.need / 8);
        let mut b = MemoryBudget::default();
        b.admit(215 * GIB / 10, 15 * GIB).expect("15 GiB + 1.9 GiB margin fits in 21.5 GiB");
    }

    #[test]
    fn the_data_set_and_earlier_plans_count() {
        let mut b = MemoryBudget::default();
        b.reserve(6 * GIB);
        assert!(b.admit(20 * GIB, 12 * GIB).is_err(), "6 + 12 GiB + 2.25 GiB margin > 20 GiB");
        let mut b = MemoryBudget::default();
        b.admit(20 * GIB, 10 * GIB).expect("the train program fits");
        // The eval program comes next; the backend still reports 20 GiB
        // (the train arenas are not touched yet): both count.
        assert!(b.admit(20 * GIB, 8 * GIB).is_err());
        b.admit(20 * GIB, 4 * GIB).expect("10 + 4 GiB + 1.75 GiB margin fits");
    }

    #[test]
    fn small_plans_keep_the_minimum_margin() {
        let mut b = MemoryBudget::default();
        assert_eq!(b.admit(600 << 20, 200 << 20).unwrap_err().margin, MIN_MARGIN);
        let mut b = MemoryBudget::default();
        b.admit(GIB, 200 << 20).expect("fits with 512 MiB to spare");
    }
}
