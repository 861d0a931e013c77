//! towers-kernels (overview written below once all modules exist).
pub mod conv;
pub mod elementwise;
pub mod error;
pub mod gemm;
pub mod pool;
pub mod reduce;
pub mod shape;
pub mod window;
#[cfg(test)]
mod testutil;
pub use error::KernelError;
