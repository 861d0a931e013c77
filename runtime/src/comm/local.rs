//! The in-process communicator: ranks are threads of one process.
//!
//! [`LocalComm::single`] is world size 1, the communicator of every session
//! by default: its collectives return at once. [`LocalComm::group`] makes N
//! ranks sharing one group, for tests of multi-rank plans and as the harness
//! the MPI and NCCL communicators are checked against.
//!
//! How a sum stays deterministic and race free without `unsafe`: each rank
//! stages its buffers in its own slot (a lock held by that rank only while
//! writing), the ranks meet at a barrier, then every rank reads the slots in
//! rank order (0, 1, ...) and adds them into its own buffers, and the ranks
//! meet again before anyone may overwrite its slot. Every rank thus computes
//! ((v0 + v1) + v2) + ..., bit for bit the same on every rank, whatever the
//! arrival order. The slots keep their capacity, so a warm collective
//! allocates nothing. This is shared memory within one process, not a
//! network transport; across processes use the MPI or NCCL communicators.
//!
//! A barrier waits at most the group's timeout; a rank that times out or is
//! dropped marks itself gone, so the others fail at once instead of waiting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use super::{Comm, CommError};

/// How long a rank waits for the others by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// One rank's staged buffers: their lengths and their values back to back.
#[derive(Default)]
struct Staged {
    lens: Vec<usize>,
    data: Vec<f32>,
}

struct Meeting {
    /// Completed barriers.
    generation: u64,
    /// Which ranks wait in the current barrier.
    here: Vec<bool>,
    /// Ranks that left (dropped or timed out).
    gone: Vec<bool>,
}

struct Group {
    world: usize,
    timeout: Duration,
    meeting: Mutex<Meeting>,
    cv: Condvar,
    slots: Vec<RwLock<Staged>>,
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, Meeting> {
        self.meeting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait until every rank arrived; allocation-free unless it fails.
    fn meet(&self, rank: usize, op: &'static str) -> Result<(), CommError> {
        let mut m = self.lock();
        if let Some(peer) = m.gone.iter().position(|&g| g) {
            return Err(CommError::PeerGone { op, rank, peer });
        }
        let gen = m.generation;
        m.here[rank] = true;
        if m.here.iter().all(|&h| h) {
            m.here.iter_mut().for_each(|h| *h = false);
            m.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        while m.generation == gen {
            if let Some(peer) = m.gone.iter().position(|&g| g) {
                m.here[rank] = false;
                return Err(CommError::PeerGone { op, rank, peer });
            }
            let now = Instant::now();
            if now >= deadline {
                let missing = (0..self.world).filter(|&r| !m.here[r]).collect();
                m.here[rank] = false;
                m.gone[rank] = true;
                self.cv.notify_all();
                return Err(CommError::Timeout { op, rank, waited: self.timeout, missing });
            }
            m = self.cv.wait_timeout(m, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        Ok(())
    }

    fn leave(&self, rank: usize) {
        let mut m = self.lock();
        m.gone[rank] = true;
        self.cv.notify_all();
    }
}

/// One rank of an in-process group; see the module docs.
pub struct LocalComm {
    rank: usize,
    /// None for world size 1.
    group: Option<Arc<Group>>,
    busy: AtomicBool,
}

impl Default for LocalComm {
    fn default() -> Self {
        LocalComm::single()
    }
}

impl LocalComm {
    /// World size 1: collectives leave buffers unchanged.
    pub fn single() -> LocalComm {
        LocalComm { rank: 0, group: None, busy: AtomicBool::new(false) }
    }

    /// `n` ranks of one group, rank `i` at index `i`; hand one to each thread.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use towers_runtime::comm::{Comm, LocalComm};
    /// let handles: Vec<_> = LocalComm::group(2)
    ///     .into_iter()
    ///     .map(|c| std::thread::spawn(move || {
    ///         let mut v = vec![c.rank() as f32 + 1.0; 3];
    ///         c.all_reduce_sum(&mut [&mut v[..]]).unwrap();
    ///         v
    ///     }))
    ///     .collect();
    /// for h in handles {
    ///     assert_eq!(h.join().unwrap(), vec![3.0; 3]);
    /// }
    /// ```
    pub fn group(n: usize) -> Vec<LocalComm> {
        LocalComm::group_with_timeout(n, DEFAULT_TIMEOUT)
    }

    /// As [`LocalComm::group`], waiting at most `timeout` for the other ranks.
    pub fn group_with_timeout(n: usize, timeout: Duration) -> Vec<LocalComm> {
        if n == 1 {
            return vec![LocalComm::single()];
        }
        let group = Arc::new(Group {
            world: n,
            timeout,
            meeting: Mutex::new(Meeting { generation: 0, here: vec![false; n], gone: vec![false; n] }),
            cv: Condvar::new(),
            slots: (0..n).map(|_| RwLock::new(Staged::default())).collect(),
        });
        (0..n).map(|rank| LocalComm { rank, group: Some(Arc::clone(&group)), busy: AtomicBool::new(false) }).collect()
    }

    /// Run `f` as this rank's only collective in flight.
    fn exclusive<R>(&self, op: &'static str, f: impl FnOnce() -> Result<R, CommError>) -> Result<R, CommError> {
        if self.busy.swap(true, Ordering::Acquire) {
            return Err(CommError::Concurrent { op, rank: self.rank });
        }
        let r = f();
        self.busy.store(false, Ordering::Release);
        r
    }

    fn stage(&self, g: &Group, group: &[&mut [f32]]) {
        let mut s = g.slots[self.rank].write().unwrap_or_else(|p| p.into_inner());
        s.lens.clear();
        s.lens.extend(group.iter().map(|b| b.len()));
        s.data.clear();
        for b in group {
            s.data.extend_from_slice(b);
        }
    }

    /// Check that rank `k`'s staged lengths match `group`'s.
    fn check(&self, op: &'static str, k: usize, s: &Staged, group: &[&mut [f32]]) -> Result<(), CommError> {
        let same = s.lens.len() == group.len() && s.lens.iter().zip(group.iter()).all(|(l, b)| *l == b.len());
        if same {
            return Ok(());
        }
        Err(CommError::Mismatch {
            op,
            rank: self.rank,
            mine: group.iter().map(|b| b.len()).collect(),
            other: k,
            theirs: s.lens.clone(),
        })
    }

    /// Copy (`add` false) or add rank `k`'s staged values into `group`.
    fn take(
        &self,
        op: &'static str,
        g: &Group,
        k: usize,
        group: &mut [&mut [f32]],
        add: bool,
    ) -> Result<(), CommError> {
        let s = g.slots[k].read().unwrap_or_else(|p| p.into_inner());
        self.check(op, k, &s, group)?;
        let mut off = 0;
        for b in group.iter_mut() {
            let src = &s.data[off..off + b.len()];
            if add {
                b.iter_mut().zip(src).for_each(|(o, v)| *o += *v);
            } else {
                b.copy_from_slice(src);
            }
            off += b.len();
        }
        Ok(())
    }
}

impl Comm for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.group.as_ref().map_or(1, |g| g.world)
    }

    fn all_reduce_sum(&self, group: &mut [&mut [f32]]) -> Result<(), CommError> {
        const OP: &str = "all-reduce";
        let Some(g) = &self.group else { return Ok(()) };
        self.exclusive(OP, || {
            self.stage(g, group);
            g.meet(self.rank, OP)?;
            // Rank order, whatever the arrival order: ((v0 + v1) + v2) + ...
            let mut summed = Ok(());
            for k in 0..g.world {
                summed = self.take(OP, g, k, group, k > 0);
                if summed.is_err() {
                    break;
                }
            }
            // Meet again even after a mismatch, so no slot is rewritten while
            // a peer still reads it.
            let met = g.meet(self.rank, OP);
            summed.and(met)
        })
    }

    fn reduce_to(&self, root: usize, group: &mut [&mut [f32]]) -> Result<(), CommError> {
        const OP: &str = "reduce";
        let world = self.world_size();
        if root >= world {
            return Err(CommError::BadRoot { op: OP, rank: self.rank, root, world });
        }
        let Some(g) = &self.group else { return Ok(()) };
        self.exclusive(OP, || {
            self.stage(g, group);
            g.meet(self.rank, OP)?;
            // Every rank checks every rank's lengths (the same error
            // everywhere); the root alone sums, in rank order.
            let mut summed = Ok(());
            for k in 0..g.world {
                summed = if self.rank == root {
                    self.take(OP, g, k, group, k > 0)
                } else {
                    let s = g.slots[k].read().unwrap_or_else(|p| p.into_inner());
                    self.check(OP, k, &s, group)
                };
                if summed.is_err() {
                    break;
                }
            }
            let met = g.meet(self.rank, OP);
            summed.and(met)
        })
    }

    fn broadcast(&self, root: usize, group: &mut [&mut [f32]]) -> Result<(), CommError> {
        const OP: &str = "broadcast";
        let world = self.world_size();
        if root >= world {
            return Err(CommError::BadRoot { op: OP, rank: self.rank, root, world });
        }
        let Some(g) = &self.group else { return Ok(()) };
        self.exclusive(OP, || {
            if self.rank == root {
                self.stage(g, group);
            }
            g.meet(self.rank, OP)?;
            let copied = if self.rank == root { Ok(()) } else { self.take(OP, g, root, group, false) };
            let met = g.meet(self.rank, OP);
            copied.and(met)
        })
    }

    fn gather_to(&self, root: usize, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        const OP: &str = "gather";
        let world = self.world_size();
        if root >= world {
            return Err(CommError::BadRoot { op: OP, rank: self.rank, root, world });
        }
        let Some(g) = &self.group else {
            return match recv.len() == send.len() {
                true => {
                    recv.copy_from_slice(send);
                    Ok(())
                }
                false => Err(CommError::Mismatch {
                    op: OP,
                    rank: 0,
                    mine: vec![recv.len()],
                    other: 0,
                    theirs: vec![send.len()],
                }),
            };
        };
        self.exclusive(OP, || {
            {
                // Staged: this rank's buffer, then (the root alone) its recv length.
                let mut s = g.slots[self.rank].write().unwrap_or_else(|p| p.into_inner());
                s.lens.clear();
                s.lens.push(send.len());
                if self.rank == root {
                    s.lens.push(recv.len());
                }
                s.data.clear();
                s.data.extend_from_slice(send);
            }
            g.meet(self.rank, OP)?;
            let lens: Vec<usize> =
                (0..g.world).map(|k| g.slots[k].read().unwrap_or_else(|p| p.into_inner()).lens[0]).collect();
            let want = g.slots[root].read().unwrap_or_else(|p| p.into_inner()).lens[1];
            let total: usize = lens.iter().sum();
            let copied = if want != total {
                Err(CommError::Mismatch { op: OP, rank: self.rank, mine: vec![total], other: root, theirs: vec![want] })
            } else if self.rank == root {
                let mut at = 0;
                for k in 0..g.world {
                    let s = g.slots[k].read().unwrap_or_else(|p| p.into_inner());
                    recv[at..at + s.data.len()].copy_from_slice(&s.data);
                    at += s.data.len();
                }
                Ok(())
            } else {
                Ok(())
            };
            let met = g.meet(self.rank, OP);
            copied.and(met)
        })
    }

    fn barrier(&self) -> Result<(), CommError> {
        let Some(g) = &self.group else { return Ok(()) };
        self.exclusive("barrier", || g.meet(self.rank, "barrier"))
    }

    fn describe(&self) -> String {
        format!("in-process, rank {} of {}", self.rank, self.world_size())
    }

    fn abort(&self, _code: i32) {
        if let Some(g) = &self.group {
            g.leave(self.rank);
        }
    }
}

impl Drop for LocalComm {
    fn drop(&mut self) {
        if let Some(g) = &self.group {
            g.leave(self.rank);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_ranks<T: Send + 'static>(
        comms: Vec<LocalComm>,
        f: impl Fn(&LocalComm) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let f = Arc::clone(&f);
                std::thread::spawn(move || f(&c))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn world_size_one_leaves_buffers_unchanged() {
        let c = LocalComm::single();
        let mut a = vec![1.0, 2.0];
        c.all_reduce_sum(&mut [&mut a[..]]).unwrap();
        c.broadcast(0, &mut [&mut a[..]]).unwrap();
        c.barrier().unwrap();
        assert_eq!(a, [1.0, 2.0]);
        assert_eq!((c.rank(), c.world_size()), (0, 1));
    }

    #[test]
    fn sums_in_rank_order_whatever_the_arrival_order() {
        // 1e8 + 1 - 1e8 in f32: rank order gives (1e8 + 1) - 1e8 = 0 (1e8 + 1
        // rounds to 1e8); any other order could give 1. Ranks arrive in
        // reverse order (rank 2 first) and still all get 0.
        let out = on_ranks(LocalComm::group(3), |c| {
            std::thread::sleep(Duration::from_millis(30 * (2 - c.rank()) as u64));
            let mut a = vec![[1e8f32, 1.0, -1e8][c.rank()]];
            let mut b = vec![c.rank() as f32; 3];
            for _ in 0..3 {
                c.all_reduce_sum(&mut [&mut a[..], &mut b[..]]).unwrap();
                a[0] = [1e8f32, 1.0, -1e8][c.rank()];
                b.fill(c.rank() as f32);
            }
            c.all_reduce_sum(&mut [&mut a[..], &mut b[..]]).unwrap();
            (a, b)
        });
        for (a, b) in out {
            assert_eq!(a, [0.0]);
            assert_eq!(b, [3.0; 3]);
        }
    }

    #[test]
    fn reduce_gives_the_root_the_all_reduce_sum_bit_for_bit() {
        // Values whose sum depends on the association: only rank order gives
        // the all-reduce's bits.
        let vals = [1.0e8f32, 1.0, -1.0e8, 0.5];
        let run = |reduce: bool| {
            on_ranks(LocalComm::group(4), move |c| {
                let mut a = vec![vals[c.rank()], vals[c.rank()] * 3.0];
                let mut b = vec![vals[3 - c.rank()]];
                let r = if reduce {
                    c.reduce_to(2, &mut [&mut a[..], &mut b[..]])
                } else {
                    c.all_reduce_sum(&mut [&mut a[..], &mut b[..]])
                };
                r.unwrap();
                (a, b)
            })
        };
        let (reduced, all) = (run(true), run(false));
        assert_eq!(reduced[2], all[2]);
        // The other ranks keep their own values.
        assert_eq!(reduced[0], (vec![vals[0], vals[0] * 3.0], vec![vals[3]]));
        let bad = LocalComm::single().reduce_to(1, &mut []);
        assert!(matches!(bad, Err(CommError::BadRoot { root: 1, world: 1, .. })));
    }

    #[test]
    fn broadcast_copies_the_roots_values() {
        let out = on_ranks(LocalComm::group(3), |c| {
            let mut a = vec![c.rank() as f32; 2];
            c.broadcast(1, &mut [&mut a[..]]).unwrap();
            c.barrier().unwrap();
            a
        });
        assert!(out.iter().all(|a| a == &[1.0, 1.0]));
    }

    #[test]
    fn mismatched_groups_are_an_error_on_every_rank() {
        let out = on_ranks(LocalComm::group(2), |c| {
            let mut a = vec![0.0; 2 + c.rank()];
            c.all_reduce_sum(&mut [&mut a[..]]).unwrap_err()
        });
        for e in out {
            assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
            assert!(e.to_string().contains("same buckets"), "{e}");
        }
    }

    #[test]
    fn a_missing_rank_times_out_and_a_dropped_rank_fails_its_peers() {
        let mut comms = LocalComm::group_with_timeout(2, Duration::from_millis(50));
        let c1 = comms.pop().unwrap();
        let c0 = comms.pop().unwrap();
        let e = c0.barrier().unwrap_err();
        assert!(matches!(&e, CommError::Timeout { rank: 0, missing, .. } if missing == &[1]), "{e}");
        let e = c1.barrier().unwrap_err();
        assert!(matches!(e, CommError::PeerGone { rank: 1, peer: 0, .. }), "{e}");

        let mut comms = LocalComm::group(2);
        let c1 = comms.pop().unwrap();
        drop(comms);
        let e = c1.barrier().unwrap_err();
        assert!(matches!(e, CommError::PeerGone { peer: 0, .. }), "{e}");
    }

    #[test]
    fn gather_puts_each_ranks_buffer_on_the_root_in_rank_order() {
        let got = on_ranks(LocalComm::group(3), |c| {
            let send: Vec<f32> = (0..c.rank() + 1).map(|i| (10 * c.rank() + i) as f32).collect();
            let mut recv = vec![-1.0; if c.rank() == 1 { 6 } else { 0 }];
            c.gather_to(1, &send, &mut recv).map(|_| recv)
        });
        assert_eq!(got[1].as_ref().unwrap(), &[0.0, 10.0, 11.0, 20.0, 21.0, 22.0]);
        assert!(got[0].as_ref().unwrap().is_empty() && got[2].as_ref().unwrap().is_empty());
        // A root whose recv is the wrong length: the same error on every rank.
        let bad = on_ranks(LocalComm::group(2), |c| {
            c.gather_to(0, &[1.0], &mut vec![0.0; if c.rank() == 0 { 3 } else { 0 }])
        });
        assert!(bad.iter().all(|r| matches!(r, Err(CommError::Mismatch { op: "gather", .. }))), "{bad:?}");
    }

    #[test]
    fn a_bad_root_is_an_error() {
        let e = LocalComm::single().broadcast(1, &mut []).unwrap_err();
        assert!(matches!(e, CommError::BadRoot { root: 1, world: 1, .. }), "{e}");
    }
}
