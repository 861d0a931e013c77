//! The command line's parts: the flags ([`args`]), their meaning as a
//! training configuration ([`config`]), and the two commands ([`train`],
//! [`compile`]), which write through [`out`] (no panic on a closed pipe).

#[macro_use]
pub mod out;
pub mod args;
pub mod compile;
pub mod config;
pub mod train;
