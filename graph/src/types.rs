//! Element types, shapes with an optionally unknown batch dimension, and
//! tensor types.
//!
//! A [`Shape`] dimension is `None` when unknown at build time (TF's `None`
//! batch dimension); it becomes known when the compiler binds the feeds'
//! batch size. [`DType`] is the vocabulary's (`towers_vocab::DType`): all
//! element types are 4 bytes wide, so every buffer can live in one
//! 4-byte-aligned arena.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Re-exports: the element type and the bit-compared `f32` are vocabulary
/// (`towers_vocab`), shared with the kernels and the plan.
pub use towers_vocab::{DType, F32};

/// A shape whose dimensions may be unknown (`None`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Shape(pub Vec<Option<usize>>);

impl Shape {
    pub fn known(dims: &[usize]) -> Shape {
        Shape(dims.iter().map(|&d| Some(d)).collect())
    }
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    pub fn dim(&self, i: usize) -> Option<usize> {
        self.0.get(i).copied().flatten()
    }
    pub fn is_fully_known(&self) -> bool {
        self.0.iter().all(|d| d.is_some())
    }
    /// The dimensions, if all are known.
    pub fn dims(&self) -> Option<Vec<usize>> {
        self.0.iter().copied().collect()
    }
    /// Number of elements, if known (`None` also when the count overflows
    /// `usize`; inference rejects such shapes at their source).
    pub fn num_elements(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |acc, d| d.and_then(|d| acc.checked_mul(d)))
    }
    /// Whether `other` could be the same shape (unknown dims match anything).
    pub fn compatible(&self, other: &Shape) -> bool {
        self.rank() == other.rank()
            && self.0.iter().zip(&other.0).all(|(a, b)| match (a, b) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            })
    }
    /// A copy with dimension `i` replaced.
    pub fn with_dim(&self, i: usize, d: Option<usize>) -> Shape {
        let mut s = self.clone();
        s.0[i] = d;
        s
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Shape {
        Shape::known(&d)
    }
}

impl<const N: usize> From<[Option<usize>; N]> for Shape {
    fn from(d: [Option<usize>; N]) -> Shape {
        Shape(d.to_vec())
    }
}

impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Shape {
        Shape::known(&d)
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Shape {
        Shape::known(d)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match d {
                Some(d) => write!(f, "{d}")?,
                None => f.write_str("?")?,
            }
        }
        f.write_str("]")
    }
}

/// The type of one output of a node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType { dtype, shape: shape.into() }
    }
    pub fn f32(shape: impl Into<Shape>) -> TensorType {
        TensorType::new(DType::F32, shape)
    }
    /// Bytes, if the shape is fully known.
    pub fn byte_size(&self) -> Option<usize> {
        self.shape.num_elements().map(|n| n * self.dtype.size_bytes())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}
