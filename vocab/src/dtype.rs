//! Element types. Every element type is 4 bytes wide, so every buffer can
//! live in one 4-byte-aligned arena; `Bool` is stored as an `i32` 0 or 1.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 32-bit signed integer (labels, indices, counters).
    I32,
    /// Stored as an `i32` 0 or 1.
    Bool,
}

impl DType {
    /// Bytes per element: 4 for every type.
    pub fn size_bytes(self) -> usize {
        4
    }
    /// Whether the type is a floating-point type (`F32`).
    pub fn is_float(self) -> bool {
        self == DType::F32
    }
    /// The lower-case name used in plan text and errors (`f32`).
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
