//! Tests of the IDX loader on small files written into a temp dir.

use std::io::Write;
use std::path::Path;

use super::*;

fn images_bytes(n: u32, rows: u32, cols: u32, fill: impl Fn(usize) -> u8) -> Vec<u8> {
    let mut v = Vec::new();
    for w in [IDX_IMAGES_MAGIC, n, rows, cols] {
        v.extend_from_slice(&w.to_be_bytes());
    }
    v.extend((0..(n * rows * cols) as usize).map(fill));
    v
}

fn labels_bytes(labels: &[u8]) -> Vec<u8> {
    let mut v = IDX_LABELS_MAGIC.to_be_bytes().to_vec();
    v.extend_from_slice(&(labels.len() as u32).to_be_bytes());
    v.extend_from_slice(labels);
    v
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).expect("write to Vec");
    enc.finish().expect("finish gzip")
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).expect("write temp file");
}

/// A valid MNIST-like dir: 3 train and 2 test images of 2x3; `gz` picks the suffix.
fn valid_dir(gz: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let files: [(&str, Vec<u8>); 4] = [
        (TRAIN_IMAGES, images_bytes(3, 2, 3, |i| (i * 10) as u8)),
        (TRAIN_LABELS, labels_bytes(&[7, 0, 9])),
        (TEST_IMAGES, images_bytes(2, 2, 3, |_| 255)),
        (TEST_LABELS, labels_bytes(&[1, 2])),
    ];
    for (name, bytes) in files {
        if gz {
            write(dir.path(), &format!("{name}.gz"), &gzip(&bytes));
        } else {
            write(dir.path(), name, &bytes);
        }
    }
    dir
}

fn check_valid(dir: &Path) {
    let (train, test) = load_mnist_dir(dir).expect("valid MNIST dir");
    assert_eq!(train.shape(), [3, 2, 3, 1]);
    assert_eq!(test.shape(), [2, 2, 3, 1]);
    assert_eq!(train.num_classes(), 10);
    assert_eq!(train.labels(), &[7, 0, 9]);
    assert_eq!(test.labels(), &[1, 2]);
    assert_eq!(train.image(1)[0], 60.0 / 255.0);
    assert_eq!(train.image(0)[5], 50.0 / 255.0);
    assert!(test.images().iter().all(|&p| p == 1.0));
}

#[test]
fn loads_plain_files() {
    check_valid(valid_dir(false).path());
}

#[test]
fn loads_gzipped_files() {
    check_valid(valid_dir(true).path());
}

#[test]
fn loads_a_mix_and_prefers_plain() {
    let dir = valid_dir(true);
    // A plain train label file beside its .gz: the plain one is used.
    write(dir.path(), TRAIN_LABELS, &labels_bytes(&[3, 3, 3]));
    let (train, _) = load_mnist_dir(dir.path()).expect("valid");
    assert_eq!(train.labels(), &[3, 3, 3]);
}

/// The error for `dir` after `corrupt` changed it, as its message.
fn error_after(corrupt: impl FnOnce(&Path)) -> (DataError, String) {
    let dir = valid_dir(false);
    corrupt(dir.path());
    match load_mnist_dir(dir.path()) {
        Ok(_) => panic!("expected an error"),
        Err(e) => {
            let msg = e.to_string();
            (e, msg)
        }
    }
}

#[test]
fn missing_file() {
    let (e, msg) = error_after(|d| std::fs::remove_file(d.join(TEST_LABELS)).expect("rm"));
    assert!(matches!(e, DataError::MissingFile { .. }), "{e:?}");
    assert!(msg.contains("t10k-labels-idx1-ubyte"), "{msg}");
}

#[test]
fn bad_image_magic() {
    let (e, msg) = error_after(|d| write(d, TRAIN_IMAGES, &labels_bytes(&[1, 2, 3])));
    assert!(matches!(e, DataError::BadMagic { expected: 0x803, found: 0x801, .. }), "{e:?}");
    assert!(msg.contains("expected magic 0x00000803"), "{msg}");
    assert!(msg.contains("found 0x00000801"), "{msg}");
    assert!(msg.contains("train-images-idx3-ubyte"), "{msg}");
    assert!(msg.contains("is this an IDX image file?"), "{msg}");
}

#[test]
fn bad_label_magic() {
    let (e, _) = error_after(|d| write(d, TEST_LABELS, &images_bytes(1, 1, 1, |_| 0)));
    assert!(matches!(e, DataError::BadMagic { expected: 0x801, found: 0x803, .. }), "{e:?}");
}

#[test]
fn truncated_body() {
    let mut bytes = images_bytes(3, 2, 3, |_| 1);
    bytes.pop();
    let (e, msg) = error_after(|d| write(d, TRAIN_IMAGES, &bytes));
    assert!(matches!(e, DataError::Truncated { expected: 34, found: 33, .. }), "{e:?}");
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn truncated_header() {
    let bytes = images_bytes(3, 2, 3, |_| 1);
    let (e, _) = error_after(|d| write(d, TRAIN_IMAGES, &bytes[..10]));
    assert!(matches!(e, DataError::Truncated { found: 10, .. }), "{e:?}");
    let (e, _) = error_after(|d| write(d, TRAIN_LABELS, &[0, 0]));
    assert!(matches!(e, DataError::Truncated { found: 2, .. }), "{e:?}");
}

#[test]
fn truncated_gzip_stream() {
    let gz = gzip(&images_bytes(3, 2, 3, |i| i as u8));
    let (e, _) = error_after(|d| {
        std::fs::remove_file(d.join(TRAIN_IMAGES)).expect("rm");
        write(d, &format!("{TRAIN_IMAGES}.gz"), &gz[..gz.len() - 12]);
    });
    assert!(matches!(e, DataError::Gzip { .. }), "{e:?}");
}

#[test]
fn trailing_bytes() {
    let mut bytes = labels_bytes(&[1, 2, 3]);
    bytes.push(0);
    let (e, _) = error_after(|d| write(d, TRAIN_LABELS, &bytes));
    assert!(matches!(e, DataError::TrailingBytes { .. }), "{e:?}");
}

#[test]
fn zero_dimension() {
    let (e, _) = error_after(|d| write(d, TEST_IMAGES, &images_bytes(2, 0, 3, |_| 0)));
    assert!(matches!(e, DataError::BadDimensions { .. }), "{e:?}");
}

#[test]
fn huge_header_does_not_allocate_or_overflow() {
    let mut bytes = Vec::new();
    for w in [IDX_IMAGES_MAGIC, u32::MAX, u32::MAX, u32::MAX] {
        bytes.extend_from_slice(&w.to_be_bytes());
    }
    let (e, _) = error_after(|d| write(d, TRAIN_IMAGES, &bytes));
    assert!(matches!(e, DataError::BadDimensions { .. }), "{e:?}");
}

#[test]
fn count_mismatch() {
    let (e, msg) = error_after(|d| write(d, TRAIN_LABELS, &labels_bytes(&[1, 2])));
    assert!(matches!(e, DataError::CountMismatch { n_images: 3, n_labels: 2, .. }), "{e:?}");
    assert!(msg.contains("train-images-idx3-ubyte"), "{msg}");
    assert!(msg.contains("train-labels-idx1-ubyte"), "{msg}");
}

#[test]
fn label_out_of_range() {
    let (e, _) = error_after(|d| write(d, TEST_LABELS, &labels_bytes(&[1, 10])));
    assert!(matches!(e, DataError::LabelOutOfRange { index: 1, label: 10, .. }), "{e:?}");
}

#[test]
fn train_and_test_sizes_must_agree() {
    let (e, _) = error_after(|d| write(d, TEST_IMAGES, &images_bytes(2, 3, 2, |_| 0)));
    assert!(matches!(e, DataError::BadDimensions { .. }), "{e:?}");
}

#[test]
fn gzip_is_detected_by_content_not_name() {
    // A plain file named `.gz` (e.g. auto-decompressed by a browser) still loads.
    let dir = valid_dir(false);
    let plain = std::fs::read(dir.path().join(TEST_IMAGES)).expect("read");
    std::fs::remove_file(dir.path().join(TEST_IMAGES)).expect("rm");
    write(dir.path(), &format!("{TEST_IMAGES}.gz"), &plain);
    check_valid(dir.path());
}
