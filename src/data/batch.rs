//! Deterministic, allocation-free batching.
//!
//! [`Batcher`] (training): epoch `e` visits the examples in the order of
//! `0..n` shuffled by SplitMix64([`derive_seed`]`(seed, e)`), so the same seed
//! gives the same batches, and any epoch's order can be rebuilt on its own.
//! Only full batches are produced: the last `n % batch_size` examples of each
//! epoch's order are dropped and the next epoch starts (a different shuffle
//! drops different examples). [`Batcher::next_batch`] copies into
//! caller-provided buffers and never allocates; so do its parts,
//! [`Batcher::fill_images`], [`Batcher::fill_labels`] and
//! [`Batcher::advance`], which let each buffer be filled where it is lent
//! (a session's feed written in place) with the very bytes `next_batch`
//! would copy. With several processes,
//! each one draws the same global batches and copies only its rows of each
//! ([`Batcher::with_rows`]): together the ranks see exactly the batches one
//! process would.
//!
//! [`EvalChunks`] (evaluation): one in-order pass in chunks of `chunk_size`;
//! the final chunk may be partial and its length is returned, so every example
//! is seen exactly once. The unused tail of a partial chunk is zero-filled.
//! As for batches, [`EvalChunks::fill_images`], [`EvalChunks::fill_labels`]
//! and [`EvalChunks::advance`] are [`EvalChunks::next_chunk`] in parts.

use super::dataset::Dataset;
use super::error::DataError;
use super::rng::{derive_seed, SplitMix64};

/// Where a training batch came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchInfo {
    /// Epoch number, from 0.
    pub epoch: u64,
    /// Index of the batch within its epoch, from 0.
    pub batch: usize,
}

/// Endless seeded training batches over a data set (see the module docs).
#[derive(Debug, Clone)]
pub struct Batcher<'a> {
    data: &'a Dataset,
    batch_size: usize,
    seed: u64,
    epoch: u64,
    batch: usize,
    order: Vec<usize>,
    /// The rows of each global batch this batcher copies (all by default).
    rows: std::ops::Range<usize>,
}

impl<'a> Batcher<'a> {
    /// A batcher starting at epoch 0; needs `1 <= batch_size <= data.len()`.
    pub fn new(data: &'a Dataset, batch_size: usize, seed: u64) -> Result<Self, DataError> {
        if batch_size == 0 || batch_size > data.len() {
            return Err(DataError::Batch(format!(
                "batch size {batch_size} must be in 1..={} (the number of examples)",
                data.len()
            )));
        }
        let mut b = Batcher {
            data,
            batch_size,
            seed,
            epoch: 0,
            batch: 0,
            order: (0..data.len()).collect(),
            rows: 0..batch_size,
        };
        b.shuffle_for_epoch();
        Ok(b)
    }

    /// Copy only `rows` of every global batch (one process's share); an
    /// error unless they lie inside the batch.
    pub fn with_rows(mut self, rows: std::ops::Range<usize>) -> Result<Self, DataError> {
        if rows.is_empty() || rows.end > self.batch_size {
            return Err(DataError::Batch(format!(
                "rows {rows:?} are not a part of a batch of {} examples",
                self.batch_size
            )));
        }
        self.rows = rows;
        Ok(self)
    }

    /// Examples per batch this batcher copies (its rows of the global batch).
    pub fn rows_per_batch(&self) -> usize {
        self.rows.len()
    }

    /// Examples per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Full batches per epoch: `len / batch_size`.
    pub fn batches_per_epoch(&self) -> usize {
        self.data.len() / self.batch_size
    }

    /// The epoch the next batch belongs to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The example indices of the current epoch, in visiting order.
    pub fn epoch_order(&self) -> &[usize] {
        &self.order
    }

    /// Fills `images` (`rows * image_len` floats) and `labels` (`rows`)
    /// with this batcher's rows of the next batch, moving to the next epoch after
    /// the last full batch. Errors only on wrong buffer lengths.
    pub fn next_batch(&mut self, images: &mut [f32], labels: &mut [i32]) -> Result<BatchInfo, DataError> {
        check_buffers(self.data, self.rows.len(), images, labels, true)?;
        self.fill_images(images)?;
        self.fill_labels(labels)?;
        Ok(self.advance())
    }

    /// This batcher's rows of the next batch, as example indices.
    fn picks(&self) -> &[usize] {
        let start = self.batch * self.batch_size;
        &self.order[start + self.rows.start..start + self.rows.end]
    }

    /// Fills `images` (`rows * image_len` floats) with the images of this
    /// batcher's rows of the next batch, without moving on ([`Batcher::advance`]
    /// does). Errors only on a wrong length.
    pub fn fill_images(&self, images: &mut [f32]) -> Result<(), DataError> {
        let k = self.data.image_len();
        check_len("batch", "floats", self.rows.len() * k, images.len())?;
        for (slot, &i) in self.picks().iter().enumerate() {
            images[slot * k..(slot + 1) * k].copy_from_slice(self.data.image(i));
        }
        Ok(())
    }

    /// Fills `labels` (`rows`) with the labels of this batcher's rows of
    /// the next batch, without moving on. Errors only on a wrong length.
    pub fn fill_labels(&self, labels: &mut [i32]) -> Result<(), DataError> {
        check_len("batch", "labels", self.rows.len(), labels.len())?;
        for (slot, &i) in self.picks().iter().enumerate() {
            labels[slot] = self.data.labels()[i];
        }
        Ok(())
    }

    /// Move past the next batch (to the next epoch after the last full
    /// batch) and say where it came from.
    pub fn advance(&mut self) -> BatchInfo {
        let info = BatchInfo { epoch: self.epoch, batch: self.batch };
        self.batch += 1;
        if self.batch == self.batches_per_epoch() {
            self.batch = 0;
            self.epoch += 1;
            self.shuffle_for_epoch();
        }
        info
    }

    /// Continue as if `batches` batches had been drawn since `new`: the
    /// epoch and position they lead to, with that epoch's shuffle (a resumed
    /// run draws the batches it would have drawn without stopping).
    pub fn seek(&mut self, batches: u64) {
        let per = self.batches_per_epoch() as u64;
        self.epoch = batches / per;
        self.batch = (batches % per) as usize;
        self.shuffle_for_epoch();
    }

    fn shuffle_for_epoch(&mut self) {
        for (slot, i) in self.order.iter_mut().enumerate() {
            *i = slot;
        }
        SplitMix64::new(derive_seed(self.seed, self.epoch)).shuffle(&mut self.order);
    }
}

/// One in-order pass over a data set in chunks (see the module docs).
#[derive(Debug, Clone)]
pub struct EvalChunks<'a> {
    data: &'a Dataset,
    chunk_size: usize,
    next: usize,
}

impl<'a> EvalChunks<'a> {
    /// A pass over `data` in chunks of `chunk_size >= 1`.
    pub fn new(data: &'a Dataset, chunk_size: usize) -> Result<Self, DataError> {
        if chunk_size == 0 {
            return Err(DataError::Batch("chunk size must be at least 1".into()));
        }
        Ok(EvalChunks { data, chunk_size, next: 0 })
    }

    /// Chunks in the pass: `ceil(len / chunk_size)`.
    pub fn num_chunks(&self) -> usize {
        self.data.len().div_ceil(self.chunk_size)
    }

    /// Fills the buffers (`chunk_size * image_len` floats, `chunk_size`
    /// labels) with the next chunk and returns how many examples it holds
    /// (`chunk_size` except maybe for the last), or `None` after the last.
    pub fn next_chunk(&mut self, images: &mut [f32], labels: &mut [i32]) -> Result<Option<usize>, DataError> {
        check_buffers(self.data, self.chunk_size, images, labels, false)?;
        if self.peek().is_empty() {
            return Ok(None);
        }
        self.fill_images(images)?;
        self.fill_labels(labels)?;
        Ok(self.advance())
    }

    /// The examples of the next chunk (empty after the last), without moving on.
    pub fn peek(&self) -> std::ops::Range<usize> {
        self.next..self.next + self.chunk_size.min(self.data.len() - self.next)
    }

    /// Fills `images` (`chunk_size * image_len` floats) with the next
    /// chunk's images, the unused tail zeroed, without moving on
    /// ([`EvalChunks::advance`] does). Errors only on a wrong length.
    pub fn fill_images(&self, images: &mut [f32]) -> Result<(), DataError> {
        let k = self.data.image_len();
        check_len("chunk", "floats", self.chunk_size * k, images.len())?;
        let r = self.peek();
        let n = r.len();
        images[..n * k].copy_from_slice(&self.data.images()[r.start * k..r.end * k]);
        images[n * k..].fill(0.0);
        Ok(())
    }

    /// Fills `labels` (`chunk_size`) with the next chunk's labels, the
    /// unused tail zeroed, without moving on. Errors only on a wrong length.
    pub fn fill_labels(&self, labels: &mut [i32]) -> Result<(), DataError> {
        check_len("chunk", "labels", self.chunk_size, labels.len())?;
        let r = self.peek();
        let n = r.len();
        labels[..n].copy_from_slice(&self.data.labels()[r]);
        labels[n..].fill(0);
        Ok(())
    }

    /// Move past the next chunk: how many examples it held, or `None`
    /// after the last.
    pub fn advance(&mut self) -> Option<usize> {
        let r = self.peek();
        self.next = r.end;
        (!r.is_empty()).then_some(r.len())
    }
}

/// `got` elements where a batch or chunk buffer needs `want`.
fn check_len(what: &str, unit: &str, want: usize, got: usize) -> Result<(), DataError> {
    if got != want {
        return Err(DataError::Batch(format!("{what} buffers must hold {want} {unit}, got {got}")));
    }
    Ok(())
}

fn check_buffers(data: &Dataset, size: usize, images: &[f32], labels: &[i32], training: bool) -> Result<(), DataError> {
    let want = size * data.image_len();
    if images.len() != want || labels.len() != size {
        return Err(DataError::Batch(format!(
            "{} buffers must hold {want} floats and {size} labels, got {} and {}",
            if training { "batch" } else { "chunk" },
            images.len(),
            labels.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
