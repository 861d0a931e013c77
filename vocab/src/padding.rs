//! TF's output-size and padding rules for sliding windows (conv and pool),
//! shared so the graph's shape inference and the kernels' geometry can
//! never disagree.
//!
//! - `Same`: `out = ceil(in / stride)`,
//!   `pad_total = max((out - 1) * stride + k - in, 0)`, `pad_before = pad_total / 2`
//!   (the extra padding, if odd, goes after, as in TF).
//! - `Valid`: `out = ceil((in - k + 1) / stride)` when `in >= k`, else 0; no padding.

use serde::{Deserialize, Serialize};

/// Padding of convolutions and pools, as TF's `padding="SAME"` / `"VALID"`.
/// The graph's ops and the kernels' geometry share this one type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Padding {
    Same,
    Valid,
}

impl Padding {
    /// `(out, pad_before)` along one spatial axis for input size `input`,
    /// window `k` and `stride` (`stride >= 1`, `k >= 1`), TF's rules; `None`
    /// when a `Valid` window does not fit (`input < k`).
    pub fn out_and_pad(self, input: usize, k: usize, stride: usize) -> Option<(usize, usize)> {
        debug_assert!(stride >= 1 && k >= 1);
        match self {
            Padding::Same => {
                let out = input.div_ceil(stride);
                let needed = (out.saturating_sub(1)) * stride + k;
                let pad_total = needed.saturating_sub(input);
                Some((out, pad_total / 2))
            }
            Padding::Valid => (input >= k).then(|| ((input - k + 1).div_ceil(stride), 0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tf_rules() {
        // Values from TF: tf.nn.conv2d output sizes and pads.
        assert_eq!(Padding::Same.out_and_pad(28, 5, 2), Some((14, 1))); // pad_total 3 -> 1 before, 2 after
        assert_eq!(Padding::Same.out_and_pad(8, 3, 2), Some((4, 0))); // pad_total 1 -> 0 before
        assert_eq!(Padding::Valid.out_and_pad(7, 3, 2), Some((3, 0)));
        assert_eq!(Padding::Valid.out_and_pad(2, 3, 1), None);
    }
}
