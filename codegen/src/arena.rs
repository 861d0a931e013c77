//! Arena allocation: one device's buffer list and its byte offsets.
//!
//! Lowering declares buffers as it meets them ([`Arena::declare`] for a
//! buffer of its own, [`Arena::view`] for a part of another buffer) and gets
//! back the index a [`crate::BufRef::Arena`] uses; offsets are assigned once
//! all steps exist, by [`place`]: either one after another
//! ([`Arena::finish`]), or sharing bytes by liveness.
//!
//! Invariants of every assignment (what the plan snapshots pin down):
//! - buffers keep their declaration order, views included (an index never
//!   changes);
//! - a buffer of its own starts at a multiple of [`ALIGN`] bytes; the
//!   arena's size is the end of the last one, rounded up to [`ALIGN`];
//! - a view takes no space: its offset is its base buffer's plus its byte
//!   offset inside it, and its base is declared before it;
//! - the same declarations and steps give the same offsets, byte for byte.
//!
//! Without reuse, buffers of their own are laid out one after another in
//! declaration order, none overlapping another. With reuse (the default,
//! `LowerOptions::reuse_memory`), two buffers of one device may share bytes
//! only when every access of one happens before every access of the other
//! in the order of streams and events ([`crate::liveness`], which also folds
//! views into their base and copy destinations into their sources), and
//! neither is *pinned*: feeds (written before the step), constants (filled
//! at load), fetched buffers and the sources they are copied from (read
//! after the step) keep their bytes for the whole step. The placement is a
//! greedy: pinned buffers first in declaration order, then the others
//! largest first (ties by index), each at the lowest aligned offset where it
//! overlaps no placed buffer it conflicts with.

use std::cmp::Reverse;

use crate::liveness::{Folds, Key, Liveness, Order};
use crate::plan::{BufRef, Buffer, BufferKind, StreamPlan};
use towers_vocab::DType;

/// Every buffer of its own starts at a multiple of this many bytes.
pub const ALIGN: usize = 64;

/// Where a declared buffer lives.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// Space of its own.
    Own,
    /// `at` bytes into buffer `base`.
    View { base: usize, at: usize },
}

/// A declared buffer: what it holds and where it lives.
#[derive(Debug, Clone)]
struct Decl {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    kind: BufferKind,
    bytes: usize,
    layout: Layout,
}

/// The buffers of one device, declared during lowering, placed by [`Arena::finish`].
#[derive(Debug, Clone, Default)]
pub struct Arena {
    decls: Vec<Decl>,
}

impl Arena {
    pub fn new() -> Arena {
        Arena::default()
    }

    /// Declare a buffer with space of its own; its index.
    pub fn declare(&mut self, name: String, dtype: DType, shape: Vec<usize>, kind: BufferKind) -> usize {
        let bytes = shape.iter().product::<usize>() * dtype.size_bytes();
        self.push(Decl { name, dtype, shape, kind, bytes, layout: Layout::Own })
    }

    /// Declare a view of `bytes(shape, dtype)` bytes starting `at` bytes into
    /// buffer `base` (declared before); its index. The caller keeps it inside `base`.
    pub fn view(&mut self, base: usize, at: usize, name: String, dtype: DType, shape: Vec<usize>) -> usize {
        let bytes = shape.iter().product::<usize>() * dtype.size_bytes();
        self.push(Decl {
            name,
            dtype,
            shape,
            kind: BufferKind::View { of: base },
            bytes,
            layout: Layout::View { base, at },
        })
    }

    fn push(&mut self, d: Decl) -> usize {
        self.decls.push(d);
        self.decls.len() - 1
    }

    /// Whether buffer `i` is an intermediate tensor with space of its own
    /// (not a view, feed, constant or workspace).
    pub fn is_own_tensor(&self, i: usize) -> bool {
        matches!((self.decls[i].layout, self.decls[i].kind), (Layout::Own, BufferKind::Tensor))
    }

    /// The byte size of buffer `i`.
    pub fn bytes(&self, i: usize) -> usize {
        self.decls[i].bytes
    }

    /// Lay buffers out one after another in declaration order (no reuse):
    /// the buffers, in declaration order, and the arena's size in bytes.
    pub fn finish(self) -> (Vec<Buffer>, usize) {
        let mut end = 0usize;
        let mut offsets = vec![0; self.decls.len()];
        for (i, d) in self.decls.iter().enumerate() {
            if let Layout::Own = d.layout {
                offsets[i] = end;
                end = (end + d.bytes).div_ceil(ALIGN) * ALIGN;
            }
        }
        (self.buffers(&offsets), end)
    }

    /// The base buffer of declaration `i` (itself unless it is a view).
    fn base(&self, i: usize) -> usize {
        match self.decls[i].layout {
            Layout::Own => i,
            Layout::View { base, .. } => base,
        }
    }

    /// Share bytes by liveness (see the module docs): `live` holds the live
    /// ranges of this arena as device `device`, `pinned[i]` says buffer `i`
    /// keeps its bytes for the whole step.
    fn finish_reusing(self, live: &Liveness, device: usize, pinned: &[bool]) -> (Vec<Buffer>, usize) {
        let own: Vec<usize> = (0..self.decls.len()).filter(|&i| matches!(self.decls[i].layout, Layout::Own)).collect();
        let mut order: Vec<usize> = own.iter().copied().filter(|&i| pinned[i]).collect();
        let mut free: Vec<usize> = own.iter().copied().filter(|&i| !pinned[i]).collect();
        free.sort_by_key(|&i| (Reverse(self.decls[i].bytes), i));
        order.extend(free);
        let conflict =
            |a: usize, b: usize| pinned[a] || pinned[b] || !(live.before(device, a, b) || live.before(device, b, a));
        let mut offsets = vec![0; self.decls.len()];
        // (buffer, start, aligned end) of every placed buffer with bytes.
        let mut placed: Vec<(usize, usize, usize)> = Vec::with_capacity(own.len());
        let mut end = 0usize;
        for b in order {
            let size = self.decls[b].bytes.div_ceil(ALIGN) * ALIGN;
            if size == 0 {
                continue;
            }
            let mut busy: Vec<(usize, usize)> =
                placed.iter().filter(|p| conflict(p.0, b)).map(|p| (p.1, p.2)).collect();
            busy.sort_unstable();
            // The lowest offset before the next busy interval with room for `size`.
            let mut at = 0;
            for (start, stop) in busy {
                if start >= at + size {
                    break;
                }
                at = at.max(stop);
            }
            offsets[b] = at;
            placed.push((b, at, at + size));
            end = end.max(at + size);
        }
        (self.buffers(&offsets), end)
    }

    /// The buffers with their own buffers at `offsets` and views inside their base.
    fn buffers(self, offsets: &[usize]) -> Vec<Buffer> {
        let mut buffers: Vec<Buffer> = Vec::with_capacity(self.decls.len());
        for (i, d) in self.decls.into_iter().enumerate() {
            let offset = match d.layout {
                Layout::Own => offsets[i],
                Layout::View { base, at } => buffers[base].offset + at,
            };
            buffers.push(Buffer { name: d.name, dtype: d.dtype, shape: d.shape, kind: d.kind, offset, bytes: d.bytes });
        }
        buffers
    }
}

/// Offsets of every device's arena (`arenas[d]` is device `d` of the plan
/// whose steps are `streams`): with `reuse`, buffers share bytes by
/// liveness (module docs); without, or when the streams' events cannot be
/// replayed (the verifier then says why), one after another. Per device:
/// its buffers and its arena's size.
pub fn place(
    arenas: Vec<Arena>,
    streams: &[StreamPlan],
    num_events: usize,
    fetches: &[(String, BufRef)],
    reuse: bool,
) -> Vec<(Vec<Buffer>, usize)> {
    let order = if reuse { Order::new(streams, num_events) } else { None };
    let Some(order) = order else { return arenas.into_iter().map(Arena::finish).collect() };
    let base = |r: &BufRef| -> Option<Key> {
        match r {
            BufRef::Arena { device, buffer } => {
                let a = arenas.get(*device)?;
                (*buffer < a.decls.len()).then(|| (*device, a.base(*buffer)))
            }
            BufRef::Variable(_) => None,
        }
    };
    let folds = Folds::new(streams, &base);
    let counts: Vec<usize> = arenas.iter().map(|a| a.decls.len()).collect();
    let live = Liveness::new(streams, &order, &counts, &base, &folds);
    let mut pinned: Vec<Vec<bool>> = arenas
        .iter()
        .map(|a| a.decls.iter().map(|d| matches!(d.kind, BufferKind::Feed | BufferKind::Constant)).collect())
        .collect();
    for (_, r) in fetches {
        if let Some(k) = base(r) {
            for &(d, b) in std::iter::once(&k).chain(folds.sources(k)) {
                pinned[d][b] = true;
            }
        }
    }
    arenas.into_iter().enumerate().map(|(d, a)| a.finish_reusing(&live, d, &pinned[d])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 3 f32 (12 B) at 0, 20 f32 (80 B) at 64, a view of the second half of
    /// the second buffer at 64 + 40, one i32 at 64 + 128 = 192; size 256.
    #[test]
    fn offsets_are_aligned_in_declaration_order_and_views_take_no_space() {
        let mut a = Arena::new();
        let x = a.declare("x".into(), DType::F32, vec![3], BufferKind::Feed);
        let y = a.declare("y".into(), DType::F32, vec![2, 10], BufferKind::Tensor);
        let v = a.view(y, 40, "y:1".into(), DType::F32, vec![1, 10]);
        let z = a.declare("z".into(), DType::I32, vec![], BufferKind::Tensor);
        assert_eq!((x, y, v, z), (0, 1, 2, 3));
        assert_eq!(a.bytes(v), 40);
        let (bufs, size) = a.finish();
        let at: Vec<(usize, usize)> = bufs.iter().map(|b| (b.offset, b.bytes)).collect();
        assert_eq!(at, [(0, 12), (64, 80), (104, 40), (192, 4)]);
        assert_eq!(bufs[2].kind, BufferKind::View { of: 1 });
        assert_eq!(size, 256);
    }

    /// One stream: x -> t1 -> t2 -> t3 -> out, each step reading the buffer
    /// before it. x (a feed) and out (fetched) are pinned: 0 and 64. The
    /// tensors go largest first, ties by index: t1 at 128, t2 (live with t1
    /// at step 1) at 384, t3 (all of t1's uses come before it) back at 128.
    #[test]
    fn tensors_share_bytes_once_their_last_reader_ran() {
        use crate::plan::Step;
        use towers_kernels::{Kernel, UnaryOp};
        use towers_vocab::{Device, StreamKind};
        let mut a = Arena::new();
        let x = a.declare("x".into(), DType::F32, vec![16], BufferKind::Feed);
        let t: Vec<usize> =
            (1..4).map(|i| a.declare(format!("t{i}"), DType::F32, vec![64], BufferKind::Tensor)).collect();
        let v = a.view(t[2], 128, "t3:1".into(), DType::F32, vec![32]);
        let out = a.declare("out".into(), DType::F32, vec![16], BufferKind::Tensor);
        let r = |b: usize| BufRef::Arena { device: 0, buffer: b };
        let chain = [x, t[0], t[1], v, out];
        let steps = chain
            .windows(2)
            .map(|w| Step::Launch {
                kernel: Kernel::Unary { op: UnaryOp::Relu },
                inputs: vec![r(w[0])],
                outputs: vec![r(w[1])],
                workspace: None,
                node: format!("n{}", w[1]),
            })
            .collect();
        let streams = vec![StreamPlan { device: Device::gpu(0), kind: StreamKind::Compute, steps }];
        let fetches = vec![("out".to_string(), r(out))];
        let placed = place(vec![a.clone()], &streams, 0, &fetches, true);
        let (bufs, size) = &placed[0];
        let at: Vec<usize> = bufs.iter().map(|b| b.offset).collect();
        assert_eq!(at, [0, 128, 384, 128, 256, 64]);
        assert_eq!(*size, 640);
        assert_eq!(place(vec![a.clone()], &streams, 0, &fetches, true), placed, "deterministic");
        let (_, plain) = &place(vec![a], &streams, 0, &fetches, false)[0];
        assert_eq!(*plain, 896);
    }
}
