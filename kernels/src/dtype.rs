//! Buffers by storage type. [`DType`] itself lives in `towers_vocab`
//! (re-exported here, so `towers_kernels::DType` and
//! `towers_kernels::dtype::DType` keep working).
//!
//! [`Slice`] and [`SliceMut`] carry a buffer with its storage type, for the
//! few kernels whose element type is a run-time parameter (`cast`, `equal`).

/// Re-export: the element type is vocabulary (`towers_vocab::DType`).
pub use towers_vocab::DType;

/// A read-only buffer by storage type (`I32` also holds `Bool`).
#[derive(Debug, Clone, Copy)]
pub enum Slice<'a> {
    F32(&'a [f32]),
    I32(&'a [i32]),
}

/// A writable buffer by storage type (`I32` also holds `Bool`).
#[derive(Debug)]
pub enum SliceMut<'a> {
    F32(&'a mut [f32]),
    I32(&'a mut [i32]),
}

impl Slice<'_> {
    pub fn len(&self) -> usize {
        match self {
            Slice::F32(x) => x.len(),
            Slice::I32(x) => x.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether this data may go into a tensor of `dtype` (bools are i32 0/1).
    pub fn fits(&self, dtype: DType) -> bool {
        matches!((self, dtype), (Slice::F32(_), DType::F32) | (Slice::I32(_), DType::I32 | DType::Bool))
    }
}

impl SliceMut<'_> {
    pub fn len(&self) -> usize {
        match self {
            SliceMut::F32(x) => x.len(),
            SliceMut::I32(x) => x.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether a tensor of `dtype` may be copied into this memory.
    pub fn fits(&self, dtype: DType) -> bool {
        matches!((self, dtype), (SliceMut::F32(_), DType::F32) | (SliceMut::I32(_), DType::I32 | DType::Bool))
    }
}
