//! The one error type of `towers::data`.
//!
//! Invariant: every variant that concerns a file names that file, says what is
//! wrong with it and how to fix it, so that a message printed by the binary is
//! enough to act on without reading the source.

use std::path::PathBuf;

/// Everything that can go wrong while loading, parsing or batching data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file could not be opened or read.
    #[error("cannot read {}: {source}; check that the file exists and is readable", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    /// A gzip-compressed file could not be decompressed.
    #[error("cannot decompress {}: {source}; the file is not valid gzip (re-download it, or gunzip it by hand)", path.display())]
    Gzip {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    /// One of the four MNIST files is missing from the directory.
    #[error("missing MNIST file {name} (or {name}.gz) in {}; put the four MNIST IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, plain or .gz) in that directory", dir.display())]
    MissingFile {
        /// The directory that was searched.
        dir: PathBuf,
        /// The file name without `.gz`.
        name: String,
    },

    /// An IDX file starts with the wrong magic number.
    #[error("expected magic 0x{expected:08x} in {}, found 0x{found:08x}; is this an IDX {kind} file?", path.display())]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The magic number required.
        expected: u32,
        /// The magic number found.
        found: u32,
        /// `"image"` or `"label"`.
        kind: &'static str,
    },

    /// An IDX file is shorter than its header says.
    #[error("{} is truncated: its header needs {expected} bytes, the file has {found}; re-download it", path.display())]
    Truncated {
        /// The file (after decompression).
        path: PathBuf,
        /// Bytes the header implies.
        expected: u64,
        /// Bytes present.
        found: u64,
    },

    /// An IDX file is longer than its header says.
    #[error("{} has trailing bytes: its header needs {expected} bytes, the file has {found}; is the header correct?", path.display())]
    TrailingBytes {
        /// The file (after decompression).
        path: PathBuf,
        /// Bytes the header implies.
        expected: u64,
        /// Bytes present.
        found: u64,
    },

    /// Image dimensions are zero, overflow, or disagree between files.
    #[error("bad dimensions in {}: {detail}", path.display())]
    BadDimensions {
        /// The file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        detail: String,
    },

    /// An image file and its label file disagree on the number of examples.
    #[error("{} holds {n_images} images but {} holds {n_labels} labels; use the image and label files of the same MNIST split", images.display(), labels.display())]
    CountMismatch {
        /// The image file.
        images: PathBuf,
        /// The label file.
        labels: PathBuf,
        /// Images in the image file.
        n_images: usize,
        /// Labels in the label file.
        n_labels: usize,
    },

    /// A label in an IDX file is not a valid class.
    #[error("label {label} at index {index} in {} is out of range 0..{num_classes}; is this an MNIST label file?", path.display())]
    LabelOutOfRange {
        /// The file.
        path: PathBuf,
        /// Index of the example.
        index: usize,
        /// The label found.
        label: u8,
        /// Number of classes expected.
        num_classes: usize,
    },

    /// The digits CSV is malformed.
    #[error("CSV line {line} of an embedded data set: {detail}")]
    Csv {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        detail: String,
    },

    /// A `--data` spec is not one of the accepted forms.
    #[error("invalid data spec {spec:?}: {reason}; accepted forms: `digits` (the embedded scikit-learn digits, 8x8), `mnist5k` (the embedded 5000 real MNIST images, 28x28) or `mnist:<dir>` (a directory holding the four MNIST IDX files, plain or .gz)")]
    BadSpec {
        /// The spec as given.
        spec: String,
        /// What is wrong.
        reason: String,
    },

    /// A [`Dataset`](super::Dataset) would break its invariants.
    #[error("invalid dataset: {0}")]
    InvalidDataset(String),

    /// A batcher was configured or called wrongly.
    #[error("invalid batching: {0}")]
    Batch(String),
}

impl DataError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io { path: path.into(), source }
    }
}
