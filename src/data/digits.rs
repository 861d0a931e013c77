//! The embedded default data set: scikit-learn's handwritten digits.
//!
//! `data/digits.csv.gz` (1797 images of 8x8, see `data/README.md` for its
//! source, license and sha256) is compiled into the library. Each CSV line is
//! 64 integer pixels in `0..=16` then a label in `0..=9`; pixels are scaled to
//! `[0, 1]` by dividing by 16.
//!
//! The train/test split is fixed: the indices `0..1797` are shuffled by
//! Fisher-Yates with [`SplitMix64`] seeded with [`DIGITS_SPLIT_SEED`]; the
//! first `n * 4 / 5` (1437) shuffled examples are the train set and the other
//! 360 the test set, both in shuffled order. The split is not stratified.
//! The tests pin it, so it never changes silently.

use std::io::Read;

use super::dataset::Dataset;
use super::error::DataError;
use super::rng::SplitMix64;

const DIGITS_GZ: &[u8] = include_bytes!("../../data/digits.csv.gz");

/// Seed of the digits train/test shuffle.
pub const DIGITS_SPLIT_SEED: u64 = 42;
/// Side of a digits image in pixels.
pub const DIGITS_SIDE: usize = 8;
/// Number of digit classes.
pub const DIGITS_CLASSES: usize = 10;
/// Largest pixel value in the CSV.
const DIGITS_MAX_PIXEL: f32 = 16.0;

/// The text of a gzipped CSV embedded in the binary (`file` names it in errors).
pub(crate) fn embedded_text(gz: &[u8], file: &str) -> Result<String, DataError> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_string(&mut text)
        .map_err(|source| DataError::Gzip { path: format!("<embedded {file}>").into(), source })?;
    Ok(text)
}

/// All 1797 digits, in file order.
pub fn digits() -> Result<Dataset, DataError> {
    parse_digits_csv(&embedded_text(DIGITS_GZ, "data/digits.csv.gz")?)
}

/// The fixed train/test split of the digits (see the module docs).
pub fn digits_split() -> Result<(Dataset, Dataset), DataError> {
    let all = digits()?;
    let train_len = all.len() * 4 / 5;
    Ok(shuffle_split(&all, train_len, DIGITS_SPLIT_SEED))
}

/// Shuffles the indices of `data` with SplitMix64(`seed`) and returns the
/// first `train_len` (clamped to `len()`) as train, the rest as test.
pub fn shuffle_split(data: &Dataset, train_len: usize, seed: u64) -> (Dataset, Dataset) {
    let mut order: Vec<usize> = (0..data.len()).collect();
    SplitMix64::new(seed).shuffle(&mut order);
    let (train, test) = order.split_at(train_len.min(order.len()));
    (data.select(train), data.select(test))
}

/// Parses digits CSV text (64 pixels in `0..=16` then a label in `0..=9` per
/// line; blank lines are skipped) into an 8x8x1 data set scaled to `[0, 1]`.
pub fn parse_digits_csv(text: &str) -> Result<Dataset, DataError> {
    parse_pixel_csv(text, DIGITS_SIDE, DIGITS_MAX_PIXEL as u8, DIGITS_CLASSES)
}

/// One image a line: `side * side` integer pixels in `0..=max_pixel`, then a
/// label in `0..classes`; blank lines are skipped. Pixels are scaled to
/// `[0, 1]` by `max_pixel`. Every malformed line is a [`DataError::Csv`]
/// naming its line and column. (The digits and mnist5k share it.)
pub(crate) fn parse_pixel_csv(text: &str, side: usize, max_pixel: u8, classes: usize) -> Result<Dataset, DataError> {
    let pixels = side * side;
    let mut images = Vec::new();
    let mut labels = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let err = |detail: String| DataError::Csv { line: i + 1, detail };
        let mut count = 0;
        for (col, field) in line.split(',').enumerate() {
            count += 1;
            if col > pixels {
                continue;
            }
            let value: u8 = field
                .trim()
                .parse()
                .map_err(|_| err(format!("column {} is {field:?}, not an integer in 0..=255", col + 1)))?;
            if col < pixels {
                if value > max_pixel {
                    return Err(err(format!("pixel in column {} is {value}, outside 0..={max_pixel}", col + 1)));
                }
                images.push(f32::from(value) / f32::from(max_pixel));
            } else if usize::from(value) >= classes {
                return Err(err(format!("label {value} is outside 0..={}", classes - 1)));
            } else {
                labels.push(i32::from(value));
            }
        }
        if count != pixels + 1 {
            return Err(err(format!("{count} columns, expected {} ({pixels} pixels and a label)", pixels + 1)));
        }
    }
    Dataset::new(images, labels, side, side, 1, classes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Order-sensitive checksum: sum of (position + 1) * label.
    fn label_checksum(labels: &[i32]) -> u64 {
        labels.iter().enumerate().map(|(i, &l)| (i as u64 + 1) * l as u64).sum()
    }

    #[test]
    fn embedded_digits_load() {
        let d = digits().expect("embedded digits parse");
        assert_eq!(d.shape(), [1797, 8, 8, 1]);
        assert_eq!(d.num_classes(), 10);
        assert_eq!(&d.labels()[..5], &[0, 1, 2, 3, 4]);
        assert!(d.images().iter().all(|&p| (0.0..=1.0).contains(&p)));
        assert!(d.images().contains(&1.0));
        // First row of the file: 0,0,5,13,9,1,0,0,...
        assert_eq!(&d.image(0)[..4], &[0.0, 0.0, 5.0 / 16.0, 13.0 / 16.0]);
        let mut per_class = [0usize; 10];
        for &l in d.labels() {
            per_class[l as usize] += 1;
        }
        assert_eq!(per_class, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]);
    }

    #[test]
    fn split_is_pinned() {
        let (train, test) = digits_split().expect("embedded digits parse");
        assert_eq!(train.len(), 1437);
        assert_eq!(test.len(), 360);
        assert_eq!(&train.labels()[..8], PINNED_TRAIN_HEAD);
        assert_eq!(&test.labels()[..8], PINNED_TEST_HEAD);
        assert_eq!(label_checksum(test.labels()), PINNED_TEST_CHECKSUM);
    }

    // Computed independently by a Python re-implementation of SplitMix64 and
    // the Fisher-Yates shuffle over the same file (seed 42).
    const PINNED_TRAIN_HEAD: &[i32] = &[9, 1, 1, 1, 7, 5, 2, 7];
    const PINNED_TEST_HEAD: &[i32] = &[5, 4, 9, 6, 2, 9, 3, 9];
    const PINNED_TEST_CHECKSUM: u64 = 291_763;

    #[test]
    fn split_partitions_the_examples() {
        let all = digits().expect("embedded digits parse");
        let (train, test) = digits_split().expect("embedded digits parse");
        let pixel_sum = |d: &Dataset| d.images().iter().map(|&p| f64::from(p)).sum::<f64>();
        let total = pixel_sum(&all);
        assert!((pixel_sum(&train) + pixel_sum(&test) - total).abs() < 1e-6 * total);
        let mut counts = [0i64; 10];
        for &l in all.labels() {
            counts[l as usize] += 1;
        }
        for &l in train.labels().iter().chain(test.labels()) {
            counts[l as usize] -= 1;
        }
        assert_eq!(counts, [0; 10]);
    }

    fn row(pixel: &str, label: &str) -> String {
        let mut v = vec!["0"; 64];
        v[0] = pixel;
        v.push(label);
        v.join(",")
    }

    #[test]
    fn csv_errors_are_typed_with_line_numbers() {
        let good = row("16", "9");
        let d = parse_digits_csv(&format!("{good}\n\n{good}\n")).expect("valid");
        assert_eq!(d.len(), 2);
        assert_eq!(d.image(1)[0], 1.0);

        let cases = [
            format!("{good}\n{}", row("17", "1")),
            format!("{good}\n{}", row("x", "1")),
            format!("{good}\n{}", row("-1", "1")),
            format!("{good}\n{}", row("3", "10")),
            format!("{good}\n{good},0"),
            format!("{good}\n0,1,2"),
        ];
        for text in &cases {
            match parse_digits_csv(text) {
                Err(DataError::Csv { line: 2, .. }) => {}
                other => panic!("{text:?}: expected a CSV error on line 2, got {other:?}"),
            }
        }
    }
}
