//! Arena allocation: one device's buffer list and its byte offsets.
//!
//! Lowering declares buffers as it meets them ([`Arena::declare`] for a
//! buffer of its own, [`Arena::view`] for a part of another buffer) and gets
//! back the index a [`crate::BufRef::Arena`] uses; offsets are assigned once,
//! by [`Arena::finish`], so a planner that reuses memory by liveness can
//! replace the assignment without touching lowering.
//!
//! Invariants of the assignment (what the plan snapshots pin down):
//! - buffers keep their declaration order, views included (an index never
//!   changes);
//! - buffers of their own are laid out one after another in declaration
//!   order, each at a multiple of [`ALIGN`] bytes, none overlapping another;
//!   the arena's size is the end of the last one, rounded up to [`ALIGN`];
//! - a view takes no space: its offset is its base buffer's plus its byte
//!   offset inside it, and its base is declared before it.

use crate::plan::{Buffer, BufferKind};
use towers_graph::DType;

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

    /// The byte size of buffer `i`.
    pub fn bytes(&self, i: usize) -> usize {
        self.decls[i].bytes
    }

    /// Assign offsets (see the module docs): the buffers, in declaration
    /// order, and the arena's size in bytes.
    pub fn finish(self) -> (Vec<Buffer>, usize) {
        let mut end = 0usize;
        let mut buffers: Vec<Buffer> = Vec::with_capacity(self.decls.len());
        for d in self.decls {
            let offset = match d.layout {
                Layout::Own => {
                    let offset = end;
                    end = (offset + d.bytes).div_ceil(ALIGN) * ALIGN;
                    offset
                }
                Layout::View { base, at } => buffers[base].offset + at,
            };
            buffers.push(Buffer { name: d.name, dtype: d.dtype, shape: d.shape, kind: d.kind, offset, bytes: d.bytes });
        }
        (buffers, end)
    }
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
}
