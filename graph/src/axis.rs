//! Axis arguments as TF takes them: an index into a tensor's dimensions that
//! may count from the end (`-1` is the last axis).
//!
//! The builder's axis parameters are generic over [`AxisIndex`], so
//! `b.reduce_sum(x, &[-1], false)`, `b.concat(&xs, 1)` and a `usize`
//! variable all compile (an integer literal defaults to `i32`).
//!
//! Invariant: axes are resolved at build time, against the input's rank
//! (always known then), into plain `usize` axes; ops never store a negative
//! axis, and an axis outside `[-rank, rank)` is a [`GraphError::Shape`]
//! naming the node that would have been built, in TF's words.

use crate::error::GraphError;

/// An axis as a user writes it: any integer type, negative counting from the
/// last axis as in TF. `usize` values are never negative.
pub trait AxisIndex: Copy {
    /// The axis as a signed index (`usize` values past `i64::MAX` saturate,
    /// and are then refused as out of range).
    fn as_i64(self) -> i64;
}

macro_rules! axis_index {
    ($($t:ty),*) => {$(
        impl AxisIndex for $t {
            fn as_i64(self) -> i64 {
                i64::try_from(self).unwrap_or(i64::MAX)
            }
        }
    )*};
}
axis_index!(i32, i64, isize, usize, u32);

/// `axis` resolved against `rank` as TF resolves it (`axis + rank` when
/// negative); `Err` holds TF's message for an axis outside `[-rank, rank)`.
pub(crate) fn resolve(axis: impl AxisIndex, rank: usize) -> Result<usize, String> {
    let (a, n) = (axis.as_i64(), rank as i64);
    if a < -n || a >= n {
        return Err(format!("Expected axis in the range [{}, {n}), but got {a}", -n));
    }
    Ok(if a < 0 { (a + n) as usize } else { a as usize })
}

/// The error of the node `node` (in scope `scope`) would have been.
pub(crate) fn axis_error(node: String, scope: String, op: &str, detail: String) -> GraphError {
    GraphError::Shape { node, scope, op: op.into(), detail }
}
