//! Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11, the
//! generator TF and cuRAND use). A value depends only on `(key, counter)`,
//! so any element can be generated independently of threads, order and
//! chunking, and a CUDA twin produces the same bits.
//!
//! Stream layout used by the kernels: key = `seed` (low, high 32 bits);
//! counter = `[block_lo, block_hi, step_lo, step_hi]` where `block = index / 4`
//! and lane `index % 4` of the output is element `index`'s draw.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32 with 10 rounds.
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        let p0 = M0 as u64 * c[0] as u64;
        let p1 = M1 as u64 * c[2] as u64;
        c = [((p1 >> 32) as u32) ^ c[1] ^ k[0], p1 as u32, ((p0 >> 32) as u32) ^ c[3] ^ k[1], p0 as u32];
        if round < 9 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
    }
    c
}

/// The four u32 draws for block `block` of stream `(seed, step)`.
#[inline]
pub fn philox_block(seed: u64, step: u64, block: u64) -> [u32; 4] {
    philox4x32_10(
        [block as u32, (block >> 32) as u32, step as u32, (step >> 32) as u32],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// Uniform in `[0, 1)` with 24 random bits (exactly representable).
#[inline]
pub fn u32_to_unit(u: u32) -> f32 {
    (u >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known-answer vectors from Random123's `kat_vectors` (philox4x32_10).
    #[test]
    fn known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(
            philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn unit_range() {
        assert_eq!(u32_to_unit(0), 0.0);
        assert!(u32_to_unit(u32::MAX) < 1.0);
    }
}
