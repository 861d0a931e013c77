//! MNIST in the IDX format (LeCun's `*-idx3-ubyte` / `*-idx1-ubyte` files).
//!
//! An IDX image file is the big-endian u32s `0x00000803, n, rows, cols`
//! followed by exactly `n * rows * cols` bytes; a label file is
//! `0x00000801, n` followed by exactly `n` bytes, each in `0..10`. A file is
//! read gzip-decompressed when it starts with the gzip magic `1f 8b` (whatever
//! its name; an IDX file starts with `00 00`). Pixels are scaled to `[0, 1]`
//! by dividing by 255; images are `rows x cols x 1`.
//!
//! Invariant: every malformed input is a [`DataError`] naming the file; the
//! header is never trusted for an allocation before the bytes are there.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::dataset::Dataset;
use super::error::DataError;

/// Magic number of an IDX file of unsigned bytes with 3 dimensions.
pub const IDX_IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic number of an IDX file of unsigned bytes with 1 dimension.
pub const IDX_LABELS_MAGIC: u32 = 0x0000_0801;
/// Number of MNIST classes.
pub const MNIST_CLASSES: usize = 10;

const TRAIN_IMAGES: &str = "train-images-idx3-ubyte";
const TRAIN_LABELS: &str = "train-labels-idx1-ubyte";
const TEST_IMAGES: &str = "t10k-images-idx3-ubyte";
const TEST_LABELS: &str = "t10k-labels-idx1-ubyte";

/// Loads `(train, test)` from `dir`, which holds the four MNIST files
/// `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
/// `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`, each plain or with
/// a `.gz` suffix (the plain file wins when both exist). Both splits must
/// have the same image size.
pub fn load_mnist_dir(dir: impl AsRef<Path>) -> Result<(Dataset, Dataset), DataError> {
    let dir = dir.as_ref();
    let train = load_split(dir, TRAIN_IMAGES, TRAIN_LABELS)?;
    let test = load_split(dir, TEST_IMAGES, TEST_LABELS)?;
    if (train.height(), train.width()) != (test.height(), test.width()) {
        return Err(DataError::BadDimensions {
            path: resolve(dir, TEST_IMAGES)?,
            detail: format!(
                "test images are {}x{} but train images are {}x{}; use the files of one data set",
                test.height(),
                test.width(),
                train.height(),
                train.width()
            ),
        });
    }
    Ok((train, test))
}

fn load_split(dir: &Path, images: &str, labels: &str) -> Result<Dataset, DataError> {
    let images_path = resolve(dir, images)?;
    let labels_path = resolve(dir, labels)?;
    let img = read_idx_images(&images_path)?;
    let lab = read_idx_labels(&labels_path)?;
    if img.count != lab.len() {
        return Err(DataError::CountMismatch {
            images: images_path,
            labels: labels_path,
            n_images: img.count,
            n_labels: lab.len(),
        });
    }
    let pixels = img.pixels.iter().map(|&b| f32::from(b) / 255.0).collect();
    let labels = lab.iter().map(|&l| i32::from(l)).collect();
    Dataset::new(pixels, labels, img.rows, img.cols, 1, MNIST_CLASSES)
}

/// `dir/name` if it exists, else `dir/name.gz` if it exists.
fn resolve(dir: &Path, name: &str) -> Result<PathBuf, DataError> {
    let plain = dir.join(name);
    if plain.is_file() {
        return Ok(plain);
    }
    let gz = dir.join(format!("{name}.gz"));
    if gz.is_file() {
        return Ok(gz);
    }
    Err(DataError::MissingFile { dir: dir.to_path_buf(), name: name.to_string() })
}

/// The contents of an IDX image file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxImages {
    /// Number of images.
    pub count: usize,
    /// Rows per image.
    pub rows: usize,
    /// Columns per image.
    pub cols: usize,
    /// `count * rows * cols` bytes, row-major.
    pub pixels: Vec<u8>,
}

/// Reads and validates an IDX image file (plain or gzip).
pub fn read_idx_images(path: &Path) -> Result<IdxImages, DataError> {
    let bytes = read_maybe_gz(path)?;
    let header = header(path, &bytes, IDX_IMAGES_MAGIC, "image", 4)?;
    let [count, rows, cols] = [header[1], header[2], header[3]];
    if rows == 0 || cols == 0 {
        return Err(DataError::BadDimensions {
            path: path.to_path_buf(),
            detail: format!("images are {rows}x{cols}; both sides must be at least 1"),
        });
    }
    let body = (count as u64).checked_mul(rows as u64).and_then(|x| x.checked_mul(cols as u64)).ok_or_else(|| {
        DataError::BadDimensions {
            path: path.to_path_buf(),
            detail: format!("{count} images of {rows}x{cols} overflow a 64-bit size; is the header corrupt?"),
        }
    })?;
    let pixels = body_bytes(path, &bytes, 16, body)?;
    Ok(IdxImages { count, rows, cols, pixels: pixels.to_vec() })
}

/// Reads and validates an IDX label file (plain or gzip); labels are in `0..10`.
pub fn read_idx_labels(path: &Path) -> Result<Vec<u8>, DataError> {
    let bytes = read_maybe_gz(path)?;
    let header = header(path, &bytes, IDX_LABELS_MAGIC, "label", 2)?;
    let labels = body_bytes(path, &bytes, 8, header[1] as u64)?;
    if let Some(index) = labels.iter().position(|&l| usize::from(l) >= MNIST_CLASSES) {
        return Err(DataError::LabelOutOfRange {
            path: path.to_path_buf(),
            index,
            label: labels[index],
            num_classes: MNIST_CLASSES,
        });
    }
    Ok(labels.to_vec())
}

/// The file's bytes, gunzipped if they start with the gzip magic.
fn read_maybe_gz(path: &Path) -> Result<Vec<u8>, DataError> {
    let raw = std::fs::read(path).map_err(|e| DataError::io(path, e))?;
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw);
    }
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(raw.as_slice())
        .read_to_end(&mut out)
        .map_err(|source| DataError::Gzip { path: path.to_path_buf(), source })?;
    Ok(out)
}

/// The first `words` big-endian u32s (magic first), after checking the magic.
fn header(path: &Path, bytes: &[u8], magic: u32, kind: &'static str, words: usize) -> Result<[usize; 4], DataError> {
    let word = |i: usize| -> Option<u32> {
        let b = bytes.get(4 * i..4 * i + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let truncated =
        || DataError::Truncated { path: path.to_path_buf(), expected: 4 * words as u64, found: bytes.len() as u64 };
    let found = word(0).ok_or_else(truncated)?;
    if found != magic {
        return Err(DataError::BadMagic { path: path.to_path_buf(), expected: magic, found, kind });
    }
    let mut out = [0usize; 4];
    for (i, slot) in out.iter_mut().enumerate().take(words) {
        *slot = word(i).ok_or_else(truncated)? as usize;
    }
    Ok(out)
}

/// `bytes[start..]`, which must be exactly `len` bytes long.
fn body_bytes<'a>(path: &Path, bytes: &'a [u8], start: usize, len: u64) -> Result<&'a [u8], DataError> {
    let expected = start as u64 + len;
    let found = bytes.len() as u64;
    if found < expected {
        return Err(DataError::Truncated { path: path.to_path_buf(), expected, found });
    }
    if found > expected {
        return Err(DataError::TrailingBytes { path: path.to_path_buf(), expected, found });
    }
    Ok(&bytes[start..])
}

#[cfg(test)]
#[path = "idx_tests.rs"]
mod tests;
