//! The command line's parts: the flags ([`args`]), their meaning as a
//! training configuration ([`config`]), and the two commands ([`train`],
//! [`compile`]).

pub mod args;
pub mod compile;
pub mod config;
pub mod train;
