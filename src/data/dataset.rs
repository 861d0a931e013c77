//! [`Dataset`]: labelled images in memory.
//!
//! Invariants (checked by [`Dataset::new`], kept by every method):
//! - `height`, `width`, `channels` and `num_classes` are all at least 1;
//! - `images.len() == len() * height * width * channels`, laid out NHWC
//!   (`[n, h, w, c]`, row-major, channel fastest);
//! - every label is in `0..num_classes`;
//! - pixel values are finite (loaders scale them into `[0, 1]`).

use super::error::DataError;
use super::rng::SplitMix64;

/// Labelled images, f32 NHWC pixels and i32 class labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    images: Vec<f32>,
    labels: Vec<i32>,
    height: usize,
    width: usize,
    channels: usize,
    num_classes: usize,
}

impl Dataset {
    /// Checks the invariants of the module docs and builds the data set.
    pub fn new(
        images: Vec<f32>,
        labels: Vec<i32>,
        height: usize,
        width: usize,
        channels: usize,
        num_classes: usize,
    ) -> Result<Self, DataError> {
        if height == 0 || width == 0 || channels == 0 || num_classes == 0 {
            return Err(DataError::InvalidDataset(format!(
                "height {height}, width {width}, channels {channels} and num_classes \
                 {num_classes} must all be at least 1"
            )));
        }
        if i32::try_from(num_classes).is_err() {
            return Err(DataError::InvalidDataset(format!("num_classes {num_classes} does not fit in an i32 label")));
        }
        let expected =
            height.checked_mul(width).and_then(|x| x.checked_mul(channels)).and_then(|x| x.checked_mul(labels.len()));
        if expected != Some(images.len()) {
            return Err(DataError::InvalidDataset(format!(
                "{} pixels for {} labels of {height}x{width}x{channels}; expected {}",
                images.len(),
                labels.len(),
                expected.map_or_else(|| "an overflowing count".to_string(), |e| e.to_string()),
            )));
        }
        if let Some((i, l)) = labels.iter().enumerate().find(|(_, &l)| l < 0 || l as usize >= num_classes) {
            return Err(DataError::InvalidDataset(format!("label {l} at index {i} is out of range 0..{num_classes}")));
        }
        if let Some(i) = images.iter().position(|p| !p.is_finite()) {
            return Err(DataError::InvalidDataset(format!("pixel {i} is not finite")));
        }
        Ok(Dataset { images, labels, height, width, channels, num_classes })
    }

    /// `n` random examples of `h x w x c` for benchmarks: pixels uniform in
    /// `[0, 1)`, labels uniform in `0..classes`, all drawn from
    /// SplitMix64(`seed`) (pixels of example 0 first, then its label, ...).
    pub fn synthetic(n: usize, h: usize, w: usize, c: usize, classes: usize, seed: u64) -> Result<Self, DataError> {
        let per = h
            .checked_mul(w)
            .and_then(|x| x.checked_mul(c))
            .filter(|&p| p.checked_mul(n).is_some())
            .ok_or_else(|| DataError::InvalidDataset(format!("{n}x{h}x{w}x{c} pixels overflow usize")))?;
        if classes == 0 || i32::try_from(classes).is_err() {
            return Err(DataError::InvalidDataset(format!("classes {classes} must be in 1..=i32::MAX")));
        }
        let mut rng = SplitMix64::new(seed);
        let mut images = Vec::with_capacity(per * n);
        let mut labels = Vec::with_capacity(n);
        for _ in 0..n {
            images.extend((0..per).map(|_| rng.next_f32()));
            labels.push(rng.next_below(classes as u64) as i32);
        }
        Dataset::new(images, labels, h, w, c, classes)
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Bytes of host memory its images and labels take.
    pub fn host_bytes(&self) -> u64 {
        (self.images.len() * std::mem::size_of::<f32>() + self.labels.len() * std::mem::size_of::<i32>()) as u64
    }

    /// True when there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Image height in pixels.
    pub fn height(&self) -> usize {
        self.height
    }

    /// Image width in pixels.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Channels per pixel (1 for digits and MNIST).
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// Number of classes; labels are in `0..num_classes`.
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// Floats per image: `height * width * channels`.
    pub fn image_len(&self) -> usize {
        self.height * self.width * self.channels
    }

    /// `[n, h, w, c]`.
    pub fn shape(&self) -> [usize; 4] {
        [self.len(), self.height, self.width, self.channels]
    }

    /// All pixels, NHWC row-major.
    pub fn images(&self) -> &[f32] {
        &self.images
    }

    /// All labels.
    pub fn labels(&self) -> &[i32] {
        &self.labels
    }

    /// The pixels of example `i` (panics if `i >= len()`, like slice indexing).
    pub fn image(&self, i: usize) -> &[f32] {
        let k = self.image_len();
        &self.images[i * k..(i + 1) * k]
    }

    /// A new data set of the examples at `indices`, in that order
    /// (panics on an index out of range, like slice indexing).
    pub fn select(&self, indices: &[usize]) -> Dataset {
        let k = self.image_len();
        let mut images = Vec::with_capacity(indices.len() * k);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            images.extend_from_slice(self.image(i));
            labels.push(self.labels[i]);
        }
        Dataset {
            images,
            labels,
            height: self.height,
            width: self.width,
            channels: self.channels,
            num_classes: self.num_classes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_rejects_broken_invariants() {
        assert!(Dataset::new(vec![0.0; 8], vec![0, 1], 2, 2, 1, 2).is_ok());
        assert!(Dataset::new(vec![0.0; 7], vec![0, 1], 2, 2, 1, 2).is_err());
        assert!(Dataset::new(vec![0.0; 8], vec![0, 2], 2, 2, 1, 2).is_err());
        assert!(Dataset::new(vec![0.0; 8], vec![0, -1], 2, 2, 1, 2).is_err());
        assert!(Dataset::new(vec![], vec![], 0, 2, 1, 2).is_err());
        assert!(Dataset::new(vec![], vec![], 2, 2, 1, 0).is_err());
        let mut px = vec![0.0; 8];
        px[3] = f32::NAN;
        assert!(Dataset::new(px, vec![0, 1], 2, 2, 1, 2).is_err());
    }

    #[test]
    fn synthetic_shape_range_and_determinism() {
        let a = Dataset::synthetic(50, 28, 28, 1, 10, 9).expect("valid shape");
        assert_eq!(a.shape(), [50, 28, 28, 1]);
        assert_eq!(a.num_classes(), 10);
        assert!(a.images().iter().all(|&p| (0.0..1.0).contains(&p)));
        assert!(a.labels().iter().all(|&l| (0..10).contains(&l)));
        assert_eq!(a, Dataset::synthetic(50, 28, 28, 1, 10, 9).expect("valid"));
        assert_ne!(a, Dataset::synthetic(50, 28, 28, 1, 10, 10).expect("valid"));
        let mean = a.images().iter().sum::<f32>() / a.images().len() as f32;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
        assert!(Dataset::synthetic(5, 2, 2, 1, 0, 0).is_err());
    }

    #[test]
    fn select_copies_examples_in_order() {
        let d = Dataset::new(vec![0.0, 0.1, 1.0, 1.1, 2.0, 2.1], vec![0, 1, 2], 1, 2, 1, 3).expect("valid");
        let s = d.select(&[2, 0]);
        assert_eq!(s.labels(), &[2, 0]);
        assert_eq!(s.images(), &[2.0, 2.1, 0.0, 0.1]);
        assert_eq!(s.shape(), [2, 1, 2, 1]);
        assert_eq!(s.image(1), &[0.0, 0.1]);
    }
}
