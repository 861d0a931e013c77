//! The staleness record of the asynchronous parameter servers
//! (`--ps-async`, [`super::async_ps`]): for every gradient an owner applies,
//! the owner's version of the shard at the apply minus the version the
//! gradient was computed from (versions count applied gradients). Plain
//! data, so reports can hold it in builds without MPI.

/// The upper bounds of the staleness histogram's buckets (the last is open).
pub const HISTOGRAM_BOUNDS: [u64; 7] = [0, 1, 2, 4, 8, 16, 32];

/// The staleness of the gradients one owner applied (or of all, summed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Staleness {
    /// Gradients applied.
    pub applied: u64,
    pub min: u64,
    pub max: u64,
    /// Sum of the staleness of every applied gradient (mean = sum / applied).
    pub sum: u64,
    /// Counts per bucket: staleness 0, 1, 2, 3-4, 5-8, 9-16, 17-32, 33+.
    pub histogram: [u64; 8],
}

impl Staleness {
    /// Count one applied gradient of staleness `s`.
    pub fn record(&mut self, s: u64) {
        self.min = if self.applied == 0 { s } else { self.min.min(s) };
        self.max = self.max.max(s);
        self.applied += 1;
        self.sum += s;
        let b = HISTOGRAM_BOUNDS.iter().position(|&u| s <= u).unwrap_or(HISTOGRAM_BOUNDS.len());
        self.histogram[b] += 1;
    }

    /// Both owners' gradients as one record.
    pub fn merge(&mut self, o: &Staleness) {
        if o.applied == 0 {
            return;
        }
        self.min = if self.applied == 0 { o.min } else { self.min.min(o.min) };
        self.max = self.max.max(o.max);
        self.applied += o.applied;
        self.sum += o.sum;
        for (a, b) in self.histogram.iter_mut().zip(o.histogram) {
            *a += b;
        }
    }

    /// The mean staleness (0 when nothing was applied).
    pub fn mean(&self) -> f64 {
        if self.applied == 0 {
            0.0
        } else {
            self.sum as f64 / self.applied as f64
        }
    }

    /// As 2 × 12 f32 slots holding u32 bit patterns, for a gather over the communicator.
    pub fn to_words(&self) -> [f32; 24] {
        let mut w = [0f32; 24];
        let vals = [self.applied, self.min, self.max, self.sum].into_iter().chain(self.histogram);
        for (i, v) in vals.enumerate() {
            w[2 * i] = f32::from_bits(v as u32);
            w[2 * i + 1] = f32::from_bits((v >> 32) as u32);
        }
        w
    }

    /// The inverse of [`Staleness::to_words`].
    pub fn from_words(w: &[f32]) -> Staleness {
        let v = |i: usize| w[2 * i].to_bits() as u64 | (w[2 * i + 1].to_bits() as u64) << 32;
        let mut histogram = [0; 8];
        for (i, h) in histogram.iter_mut().enumerate() {
            *h = v(4 + i);
        }
        Staleness { applied: v(0), min: v(1), max: v(2), sum: v(3), histogram }
    }
}

impl std::fmt::Display for Staleness {
    /// `N applied, staleness min a / mean b / max c; histogram 0:n 1:n 2:n 3-4:n ...`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} applied, staleness min {} / mean {:.2} / max {}; histogram",
            self.applied,
            self.min,
            self.mean(),
            self.max
        )?;
        let mut lo = 0;
        for (i, n) in self.histogram.iter().enumerate() {
            match HISTOGRAM_BOUNDS.get(i) {
                Some(&hi) if hi == lo => write!(f, " {hi}:{n}")?,
                Some(&hi) => write!(f, " {lo}-{hi}:{n}")?,
                None => write!(f, " {lo}+:{n}")?,
            }
            lo = HISTOGRAM_BOUNDS.get(i).map_or(lo, |&h| h + 1);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_merge_and_cross_the_communicator_as_words() {
        let mut a = Staleness::default();
        for s in [0, 0, 3, 40] {
            a.record(s);
        }
        assert_eq!((a.applied, a.min, a.max, a.sum), (4, 0, 40, 43));
        assert_eq!(a.histogram, [2, 0, 0, 1, 0, 0, 0, 1]);
        let mut b = Staleness::default();
        b.record(1);
        b.record(u64::from(u32::MAX) + 5);
        let mut m = a;
        m.merge(&b);
        assert_eq!((m.applied, m.min, m.max), (6, 0, u64::from(u32::MAX) + 5));
        assert_eq!(Staleness::from_words(&m.to_words()), m);
        let mut e = Staleness::default();
        e.merge(&b);
        assert_eq!(e, b);
        assert_eq!(
            a.to_string(),
            "4 applied, staleness min 0 / mean 10.75 / max 40; histogram 0:2 1:0 2:0 3-4:1 5-8:0 9-16:0 17-32:0 33+:1"
        );
    }
}
