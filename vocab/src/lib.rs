//! # towers-vocab: the names and plain data every layer shares
//!
//! The bottom crate of towers. `graph`, `kernels`, `codegen` and `runtime`
//! all speak this vocabulary, and it depends on nothing of theirs (serde and
//! thiserror only), so a plan can be carried and run without the graph, and
//! the graph can be built without the SIMD kernels.
//!
//! ## What belongs here
//! Names and data that appear on both sides of a layer boundary, with the
//! scalar rules that define them:
//! - [`DType`], the element types;
//! - the op tables: [`UnaryOp`] ([`unary_table!`]) and [`BinaryOp`]
//!   ([`binary_table!`]), and [`Comparison`] ([`compare_table!`]), each one table from which every crate expands
//!   what it needs (names, codes, scalar forms and CUDA switches here; CPU
//!   loops in `towers_kernels`);
//! - [`Padding`] with TF's output-size rule;
//! - [`FusedExpr`]/[`FusedStep`], a fused elementwise kernel's program;
//! - device names: [`Device`], [`DeviceKind`], [`DeviceSpec`] (TF device
//!   strings), [`StreamKind`];
//! - [`Initializer`] with [`Distribution`]/[`FanMode`], and [`F32`];
//! - [`LEARNING_RATE`] and [`GLOBAL_STEP`], the variables the optimizer
//!   creates and the runtime treats apart (a restore leaves the learning
//!   rate as the program compiled it, and continues the step), and the
//!   names of a named optimizer's own rate and step
//!   ([`learning_rate_name`], [`optimizer_step_name`]).
//!
//! ## What does not
//! Math kernels and SIMD (`towers_kernels`), graph structure and shape
//! inference (`towers_graph`), the kernel ABI `Kernel` and its parameter
//! blocks (`towers_kernels`), plans (`towers_codegen`). Nothing here
//! allocates buffers or touches a device.
//!
//! ## Invariants
//! - Every type derives `Clone, Debug, PartialEq, Eq, Hash, Serialize,
//!   Deserialize` (floats through [`F32`], compared by bits), so ops and
//!   plans that hold them hash, compare and serialize.
//! - An op's code is its table's `code`, never its position; the generated
//!   CUDA switches write NaN for an unknown code.
//! - The other crates re-export these types at their old paths
//!   (`towers_kernels::UnaryOp`, `towers_graph::DType`, ...).

pub mod binary;
pub mod compare;
pub mod device;
pub mod dtype;
pub mod fused;
pub mod init;
pub mod padding;
pub mod unary;

pub use binary::BinaryOp;
pub use compare::Comparison;
pub use device::{Device, DeviceError, DeviceKind, DeviceSpec, StreamKind};
pub use dtype::DType;
pub use fused::{FusedError, FusedExpr, FusedStep};
pub use init::{Distribution, FanMode, Initializer, F32};
pub use padding::Padding;
pub use unary::UnaryOp;

/// The name of the learning-rate variable every optimizer update reads
/// (f32 scalar, created by the `apply` pass with the optimizer's `lr`;
/// schedules write it before each step).
pub const LEARNING_RATE: &str = "learning_rate";

/// The learning-rate variable of an optimizer: [`LEARNING_RATE`] without a
/// name (every unnamed optimizer of a session reads that one), or
/// `<name>/learning_rate` for an optimizer given a name (TF1's
/// `AdamOptimizer(lr, name=...)`: each optimizer its own rate).
pub fn learning_rate_name(optimizer: Option<&str>) -> String {
    match optimizer {
        Some(name) => format!("{name}/{LEARNING_RATE}"),
        None => LEARNING_RATE.to_string(),
    }
}

/// Whether `name` is a learning-rate variable ([`learning_rate_name`]):
/// `learning_rate` or `<optimizer>/learning_rate`, a name the optimizers
/// reserve (a restore keeps the program's value of each).
pub fn is_learning_rate(name: &str) -> bool {
    name == LEARNING_RATE || name.strip_suffix(LEARNING_RATE).is_some_and(|s| s.ends_with('/'))
}

/// The step counter of an optimizer given a name whose update reads the
/// step (Adam's bias correction): `<name>/step`, counting that optimizer's
/// updates alone, as TF1's per-optimizer `beta1_power`/`beta2_power`.
pub fn optimizer_step_name(optimizer: &str) -> String {
    format!("{optimizer}/step")
}

/// The name of the step counter the optimizer creates (i32 scalar, one
/// more after each training step; a restore makes it the programs' step).
pub const GLOBAL_STEP: &str = "global_step";

/// FNV-1a 64 of `bytes`: stable across builds and machines (names the CUDA
/// entry point of a fused expression, [`FusedExpr::hash`]).
pub const fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

#[cfg(test)]
mod tests {
    #[test]
    fn fnv1a64_reference_values() {
        // The FNV-1a 64 offset basis and the published hash of "a".
        assert_eq!(super::fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(super::fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
    }
}
