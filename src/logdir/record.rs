//! TFRecord framing, as TensorFlow's `RecordWriter` writes it:
//!
//! ```text
//! u64 length (little endian) | u32 masked_crc32c(length bytes) | data | u32 masked_crc32c(data)
//! ```
//!
//! where `masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8` (wrapping), the
//! mask TF applies so that a CRC of data holding CRCs stays well distributed.

use std::io::{self, Write};

const MASK_DELTA: u32 = 0xa282_ead8;

/// TF's masked CRC32C of `bytes`.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    let c = crc32c::crc32c(bytes);
    c.rotate_right(15).wrapping_add(MASK_DELTA)
}

/// Writes one record.
pub fn write_record(w: &mut impl Write, data: &[u8]) -> io::Result<()> {
    let len = (data.len() as u64).to_le_bytes();
    w.write_all(&len)?;
    w.write_all(&masked_crc32c(&len).to_le_bytes())?;
    w.write_all(data)?;
    w.write_all(&masked_crc32c(data).to_le_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_and_mask_match_tensorflow() {
        // CRC32C("123456789") = 0xe3069283 (the standard check value);
        // masked by hand: rotr(0xe3069283, 15) = 0x2507c60d, + 0xa282ead8.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc32c(b"123456789"), 0x2507_c60d_u32.wrapping_add(0xa282_ead8));
    }

    #[test]
    fn record_layout() {
        let mut v = Vec::new();
        write_record(&mut v, b"abc").expect("write to Vec");
        assert_eq!(v.len(), 8 + 4 + 3 + 4);
        assert_eq!(&v[..8], &3u64.to_le_bytes());
        assert_eq!(&v[12..15], b"abc");
        assert_eq!(&v[15..], &masked_crc32c(b"abc").to_le_bytes());
    }
}
