//! Tests of the training batcher and the evaluation pass.

use super::*;

/// `n` 1x2x1 examples whose pixels are `[i, -i]` and label `i % classes`.
fn toy(n: usize, classes: usize) -> Dataset {
    let images = (0..n).flat_map(|i| [i as f32, -(i as f32)]).collect();
    let labels = (0..n).map(|i| (i % classes) as i32).collect();
    Dataset::new(images, labels, 1, 2, 1, classes).expect("valid toy")
}

/// Example ids (pixel 0) of the next `count` batches.
fn ids(b: &mut Batcher<'_>, count: usize) -> Vec<Vec<usize>> {
    let bs = b.batch_size();
    let mut img = vec![0.0; bs * 2];
    let mut lab = vec![0; bs];
    (0..count)
        .map(|_| {
            b.next_batch(&mut img, &mut lab).expect("buffers fit");
            (0..bs)
                .map(|s| {
                    assert_eq!(img[2 * s + 1], -img[2 * s], "pixels of one example");
                    assert_eq!(lab[s] as usize, img[2 * s] as usize % 5, "label matches");
                    img[2 * s] as usize
                })
                .collect()
        })
        .collect()
}

#[test]
fn same_seed_same_batches_other_seed_differs() {
    let d = toy(23, 5);
    let a = ids(&mut Batcher::new(&d, 4, 11).expect("ok"), 12);
    let b = ids(&mut Batcher::new(&d, 4, 11).expect("ok"), 12);
    let c = ids(&mut Batcher::new(&d, 4, 12).expect("ok"), 12);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn epochs_drop_the_partial_batch_and_reshuffle() {
    let d = toy(23, 5);
    let mut b = Batcher::new(&d, 4, 3).expect("ok");
    assert_eq!(b.batches_per_epoch(), 5);
    let order0 = b.epoch_order().to_vec();
    let e0: Vec<usize> = ids(&mut b, 5).concat();
    // 20 distinct examples, in the epoch's order; the last 3 are dropped.
    assert_eq!(e0, order0[..20]);
    assert_eq!(b.epoch(), 1);
    let order1 = b.epoch_order().to_vec();
    assert_ne!(order0, order1);
    let mut sorted = order1.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..23).collect::<Vec<_>>());
    let mut img = vec![0.0; 8];
    let mut lab = vec![0; 4];
    let info = b.next_batch(&mut img, &mut lab).expect("ok");
    assert_eq!(info, BatchInfo { epoch: 1, batch: 0 });
    assert_eq!(img[0] as usize, order1[0]);
}

#[test]
fn rejects_bad_sizes_and_buffers() {
    let d = toy(10, 5);
    assert!(Batcher::new(&d, 0, 0).is_err());
    assert!(Batcher::new(&d, 11, 0).is_err());
    let mut b = Batcher::new(&d, 10, 0).expect("whole set is one batch");
    assert!(b.next_batch(&mut [0.0; 19], &mut [0; 10]).is_err());
    assert!(b.next_batch(&mut [0.0; 20], &mut [0; 9]).is_err());
    assert!(b.next_batch(&mut [0.0; 20], &mut [0; 10]).is_ok());
    assert!(EvalChunks::new(&d, 0).is_err());
    let mut e = EvalChunks::new(&d, 4).expect("ok");
    assert!(e.next_chunk(&mut [0.0; 6], &mut [0; 4]).is_err());
}

#[test]
fn eval_visits_every_example_once_in_order() {
    let d = toy(10, 5);
    let mut e = EvalChunks::new(&d, 4).expect("ok");
    assert_eq!(e.num_chunks(), 3);
    let mut img = vec![9.0; 8];
    let mut lab = vec![9; 4];
    let mut seen = Vec::new();
    let mut lens = Vec::new();
    while let Some(n) = e.next_chunk(&mut img, &mut lab).expect("ok") {
        lens.push(n);
        seen.extend((0..n).map(|s| img[2 * s] as usize));
        assert_eq!(&lab[..n], &seen[seen.len() - n..].iter().map(|&i| (i % 5) as i32).collect::<Vec<_>>()[..]);
    }
    assert_eq!(lens, [4, 4, 2]);
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    // The tail of the partial chunk is zeroed, not stale.
    assert_eq!(&img[4..], &[0.0; 4]);
    assert_eq!(&lab[2..], &[0, 0]);
    assert_eq!(e.next_chunk(&mut img, &mut lab).expect("ok"), None);
}

#[test]
fn eval_of_empty_set_yields_nothing() {
    let d = toy(0, 5);
    let mut e = EvalChunks::new(&d, 3).expect("ok");
    assert_eq!(e.num_chunks(), 0);
    assert_eq!(e.next_chunk(&mut [0.0; 6], &mut [0; 3]).expect("ok"), None);
}

/// Filling each buffer on its own, then moving on, gives the bytes
/// `next_batch` / `next_chunk` give (what a feed written in place relies on),
/// across epochs, with a rank's rows, and for a partial eval chunk.
#[test]
fn filling_in_parts_gives_the_same_bytes() {
    let d = toy(23, 5);
    let mut whole = Batcher::new(&d, 4, 9).expect("ok").with_rows(1..3).expect("rows");
    let mut parts = whole.clone();
    let (mut img, mut lab) = (vec![0.0; 4], vec![0; 2]);
    let (mut pimg, mut plab) = (vec![7.0; 4], vec![7; 2]);
    for _ in 0..12 {
        let info = whole.next_batch(&mut img, &mut lab).expect("ok");
        parts.fill_images(&mut pimg).expect("ok");
        parts.fill_labels(&mut plab).expect("ok");
        assert_eq!(parts.advance(), info);
        assert_eq!(
            pimg.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            img.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(plab, lab);
    }
    assert!(parts.fill_images(&mut [0.0; 6]).is_err());
    assert!(parts.fill_labels(&mut [0; 4]).is_err());

    let mut whole = EvalChunks::new(&d, 10).expect("ok");
    let mut parts = whole.clone();
    let (mut img, mut lab) = (vec![0.0; 20], vec![0; 10]);
    let (mut pimg, mut plab) = (vec![7.0; 20], vec![7; 10]);
    while let Some(n) = whole.next_chunk(&mut img, &mut lab).expect("ok") {
        assert_eq!(parts.peek().len(), n);
        parts.fill_images(&mut pimg).expect("ok");
        parts.fill_labels(&mut plab).expect("ok");
        assert_eq!(parts.advance(), Some(n));
        assert_eq!((&pimg, &plab), (&img, &lab));
    }
    assert!(parts.peek().is_empty());
    assert_eq!(parts.advance(), None);
    assert!(parts.fill_labels(&mut [0; 3]).is_err());
}
