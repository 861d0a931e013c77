//! Element types. Every element type is 4 bytes wide, so every buffer can
//! live in one 4-byte-aligned arena; `Bool` is stored as an `i32` 0 or 1.
//!
//! [`Slice`] and [`SliceMut`] carry a buffer with its storage type, for the
//! few kernels whose element type is a run-time parameter (`cast`, `equal`).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    F32,
    I32,
    /// Stored as an `i32` 0 or 1.
    Bool,
}

impl DType {
    pub fn size_bytes(self) -> usize {
        4
    }
    pub fn is_float(self) -> bool {
        self == DType::F32
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
}
