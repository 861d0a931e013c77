//! TF's output-size and padding rules for sliding windows (conv and pool),
//! shared so the two can never disagree. [`Padding`] and its rule live in
//! `towers_vocab`; the window arithmetic of the kernels stays here.
//!
//! - `Same`: `out = ceil(in / stride)`,
//!   `pad_total = max((out - 1) * stride + k - in, 0)`, `pad_before = pad_total / 2`
//!   (the extra padding, if odd, goes after, as in TF).
//! - `Valid`: `out = ceil((in - k + 1) / stride)` when `in >= k`, else 0; no padding.

/// Re-export: the padding rule is vocabulary (`towers_vocab::Padding`),
/// shared with the graph's shape inference.
pub use towers_vocab::Padding;

/// [`Padding::out_and_pad`] with an empty output (`(0, 0)`) where the
/// window does not fit: the kernels' geometry then has nothing to compute.
pub fn out_and_pad(input: usize, k: usize, stride: usize, padding: Padding) -> (usize, usize) {
    padding.out_and_pad(input, k, stride).unwrap_or((0, 0))
}

/// The input range `[lo, hi)` covered by the window of output position `o`,
/// clipped to `[0, input)`; `offset` is the (possibly negative) first input
/// index of the unclipped window.
#[inline]
pub(crate) fn window(o: usize, stride: usize, pad: usize, k: usize, input: usize) -> (usize, usize, isize) {
    let start = (o * stride) as isize - pad as isize;
    let lo = start.max(0) as usize;
    let hi = ((start + k as isize).max(0) as usize).min(input);
    (lo, hi.max(lo), start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tf_rules() {
        // Values from TF: tf.nn.conv2d output sizes and pads.
        assert_eq!(out_and_pad(28, 5, 1, Padding::Same), (28, 2));
        assert_eq!(out_and_pad(28, 5, 2, Padding::Same), (14, 1)); // pad_total 3 -> 1 before, 2 after
        assert_eq!(out_and_pad(7, 3, 2, Padding::Same), (4, 1));
        assert_eq!(out_and_pad(8, 3, 2, Padding::Same), (4, 0)); // pad_total 1 -> 0 before
        assert_eq!(out_and_pad(28, 5, 1, Padding::Valid), (24, 0));
        assert_eq!(out_and_pad(7, 3, 2, Padding::Valid), (3, 0));
        assert_eq!(out_and_pad(2, 3, 1, Padding::Valid), (0, 0));
        assert_eq!(out_and_pad(2, 1, 3, Padding::Same), (1, 0));
        assert_eq!(Padding::Valid.out_and_pad(2, 3, 1), None);
    }
}
