//! towers
pub mod data;
