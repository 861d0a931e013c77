//! towers
