//! Data loading for training and evaluation.
//!
//! - [`Dataset`]: labelled images, f32 NHWC `[n, h, w, c]` pixels (scaled to
//!   `[0, 1]` by the loaders) and i32 labels in `0..num_classes`.
//! - [`digits()`], [`digits_split`]: the embedded scikit-learn digits (8x8) and
//!   their fixed 1437/360 train/test split.
//! - [`mnist5k`], [`mnist5k_split`]: the embedded 5000 real MNIST images (28x28)
//!   and their fixed 4000/1000 split.
//! - [`load_mnist_dir`]: real MNIST from IDX files, plain or gzipped.
//! - [`DataSpec`]: the `--data` argument (`digits`, `mnist5k` or `mnist:<dir>`).
//! - [`Batcher`], [`EvalChunks`]: deterministic allocation-free batching.
//! - [`Dataset::synthetic`]: random data of any shape for benchmarks.
//!
//! Invariants of the whole module: every random choice comes from the
//! self-contained [`SplitMix64`] with a documented seed, so results never
//! depend on a dependency's version; no function panics on file contents
//! (every problem is a [`DataError`]); nothing here prints.

mod batch;
mod dataset;
mod digits;
mod error;
mod idx;
mod mnist5k;
mod rng;
mod spec;

pub use batch::{BatchInfo, Batcher, EvalChunks};
pub use dataset::Dataset;
pub use digits::{
    digits, digits_split, parse_digits_csv, shuffle_split, DIGITS_CLASSES, DIGITS_SIDE, DIGITS_SPLIT_SEED,
};
pub use error::DataError;
pub use idx::{
    load_mnist_dir, read_idx_images, read_idx_labels, IdxImages, IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, MNIST_CLASSES,
};
pub use mnist5k::{mnist5k, mnist5k_split, parse_mnist_csv, MNIST5K_SPLIT_SEED, MNIST5K_TRAIN_LEN};
pub use rng::{derive_seed, SplitMix64};
pub use spec::DataSpec;
