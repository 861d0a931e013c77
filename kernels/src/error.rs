//! The crate's one error type. Only a few kernels are fallible: those whose
//! failure depends on *values* (labels) or on shape arguments that the caller
//! could get wrong in a way that is not just a slice-length mismatch
//! (broadcast shapes, axes, ranks). Slice lengths themselves are the caller's
//! contract and are checked with `debug_assert!` only.

use thiserror::Error;

/// Errors returned by the fallible kernels.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KernelError {
    /// A sparse label is outside `[0, classes)`.
    #[error("{op}: label {label} of example {example} is outside [0, {classes}); labels must be class indices")]
    LabelOutOfRange { op: &'static str, example: usize, label: i32, classes: usize },
    /// Two shapes cannot be broadcast together (NumPy rules).
    #[error("{op}: shapes {a:?} and {b:?} are not broadcast-compatible (aligned from the right, each dimension pair must be equal or contain a 1)")]
    IncompatibleShapes { op: &'static str, a: Vec<usize>, b: Vec<usize> },
    /// A shape has more dimensions than the kernels support.
    #[error("{op}: rank {rank} exceeds the supported maximum of {max}; reshape (merge contiguous axes) first")]
    RankTooLarge { op: &'static str, rank: usize, max: usize },
    /// An axis argument is out of range for the given rank, or repeated.
    #[error("{op}: axis {axis} is invalid for a tensor of rank {rank} (axes must be in 0..rank and distinct)")]
    BadAxis { op: &'static str, axis: usize, rank: usize },
    /// A fused kernel names an inner kernel it cannot fuse with.
    #[error("{op} cannot fuse into {into}; only the optimizer updates (apply_gradient_descent, apply_momentum, apply_adam) with their variable and slots")]
    CannotFuse { op: &'static str, into: &'static str },
    /// A tower product without one weight per pair.
    #[error("{op}: {pairs} pairs with {weights} weights; a tower product takes one weight per pair")]
    TowerPairs { op: &'static str, pairs: usize, weights: usize },
    /// A fused elementwise expression breaks its invariants, or its launch does not match it.
    #[error("fused elementwise kernel: {reason}")]
    BadFusion { reason: String },
    /// `TOWERS_SIMD` names no SIMD path.
    #[error("{var}={value:?} names no SIMD path; use one of avx512, avx2, neon, scalar (this CPU has: {available}), or unset it for the widest")]
    SimdUnknown { var: &'static str, value: String, available: String },
    /// `TOWERS_SIMD` names a path this CPU cannot run.
    #[error("{var}={path}: this CPU has no {path} instructions (this CPU has: {available}); pick one of those, or unset {var} for the widest")]
    SimdUnsupported { var: &'static str, path: &'static str, available: String },
    // array ops (issue 22)
    /// An index of a gather (or its gradient) is outside `[0, limit)`; TF's
    /// CPU error. `position` is the index's place in the flattened indices.
    #[error("{op}: indices[{position}] = {index} is not in [0, {limit})")]
    IndexOutOfRange { op: &'static str, position: usize, index: i32, limit: usize },
}

/// A fused expression's own error ([`towers_vocab::fused::FusedError`]) is
/// the kernels' [`KernelError::BadFusion`], with the same message.
impl From<towers_vocab::fused::FusedError> for KernelError {
    fn from(e: towers_vocab::fused::FusedError) -> KernelError {
        KernelError::BadFusion { reason: e.reason }
    }
}
