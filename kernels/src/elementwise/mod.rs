//! Elementwise kernels.
//!
//! - [`broadcast`]: binary arithmetic with NumPy/TF broadcasting (rank <= 4),
//!   [`broadcast_to`] and its adjoint [`sum_to_shape`] (the gradient of a
//!   broadcast). Shapes are right-aligned; a scalar has shape `[]`.
//! - [`unary`]: the unary ops ([`UnaryOp`]), each with its forward and its
//!   gradient from the output, in one table.
//! - [`bias`]: `bias_add` over the last axis and its gradient.
//! - [`fused`]: a chain of the above generated into one kernel from its
//!   expression ([`FusedExpr`]), CPU body and CUDA C.
//!
//! All outputs are dense row-major and fully overwritten; no kernel reads
//! its output before writing it unless it says so.

pub mod bias;
pub mod broadcast;
pub mod desc;
pub mod fused;
pub mod unary;

pub use bias::{
    bias_add, bias_add_act, bias_add_act_in_place, bias_add_grad, bias_then_act_in_place, unary_grad_bias_grad,
    unary_grad_bias_grad_in_place,
};
pub use broadcast::{binary, binary_same_shape, broadcast_to, sum_to_shape, BinaryOp};
pub use fused::{fused, FusedExpr, FusedStep};
pub use unary::{unary, unary_grad, unary_grad_in_place, UnaryOp};
