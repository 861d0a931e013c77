//! Kernel argument lists, built once at load.
//!
//! `cuLaunchKernel` takes an array of pointers, one per parameter, each to
//! the parameter's bytes. [`ArgPack`] keeps the bytes in one `Vec<u64>`
//! (every argument 8-byte aligned, which covers `i64`, pointers and the
//! `#[repr(C)]` blocks) and the pointer array beside it. The `Vec`'s heap
//! buffer never grows after [`ArgPack::finish`], so the pointers stay valid
//! when the pack moves; nothing in a pack changes after load (dropout reads
//! the step number from the side buffer's first word, [`STEP_CELL`], which
//! the backend writes before each step), so a captured CUDA graph stays valid.

use std::ffi::c_void;

/// The argument list of one launch.
#[derive(Default)]
pub(crate) struct ArgPack {
    words: Vec<u64>,
    starts: Vec<usize>,
    ptrs: Vec<*mut c_void>,
    /// Whether the launch reads the step number ([`ArgPack::step`]).
    pub uses_step: bool,
    /// Words holding the address of side data (pointer and weight arrays):
    /// `(word, byte offset in the side buffer)`, patched once it is uploaded.
    pub side: Vec<(usize, usize)>,
}

impl ArgPack {
    pub fn new() -> ArgPack {
        ArgPack::default()
    }

    /// Append one argument by value.
    pub fn push<T: Copy>(&mut self, v: T) -> &mut Self {
        let size = std::mem::size_of::<T>();
        let start = self.words.len();
        self.words.resize(start + size.div_ceil(8).max(1), 0);
        // SAFETY: the destination holds at least `size` bytes; `T: Copy` is plain data.
        unsafe {
            std::ptr::copy_nonoverlapping(
                &v as *const T as *const u8,
                self.words[start..].as_mut_ptr() as *mut u8,
                size,
            )
        };
        self.starts.push(start);
        self
    }

    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.push(v)
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.push(v)
    }
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.push(v)
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.push(v)
    }
    /// A device pointer.
    pub fn ptr(&mut self, v: u64) -> &mut Self {
        self.push(v)
    }
    /// The device address of the step number (the side buffer's
    /// [`STEP_CELL`], patched after upload; the backend writes the step
    /// there before each step that needs it).
    pub fn step(&mut self) -> &mut Self {
        self.uses_step = true;
        self.side_ptr(STEP_CELL)
    }
    /// The device address of side data at `offset` (patched after upload).
    pub fn side_ptr(&mut self, offset: usize) -> &mut Self {
        self.side.push((self.words.len(), offset));
        self.push(0u64)
    }

    /// Fix the pointer array; no argument may be pushed afterwards.
    pub fn finish(&mut self) {
        let base = self.words.as_mut_ptr();
        // SAFETY: every start indexes into `words`, whose buffer no longer moves.
        self.ptrs = self.starts.iter().map(|&s| unsafe { base.add(s) } as *mut c_void).collect();
    }

    /// Write the address of the uploaded side buffer into the words that need it.
    pub fn patch_side(&mut self, side_base: u64) {
        for &(w, off) in &self.side {
            self.words[w] = side_base + off as u64;
        }
    }

    /// The pointer array for `cuLaunchKernel`.
    pub fn params(&mut self) -> &mut [*mut c_void] {
        &mut self.ptrs
    }
}

/// Byte offset of the step number (a `u64`) in the side buffer.
pub(crate) const STEP_CELL: usize = 0;

/// Pointer and weight arrays a launch reads from device memory, and scratch
/// areas a launch alone writes (the two-stage bias gradient's partial sums),
/// gathered at load into one host buffer and uploaded once; its first 8
/// bytes are the step number ([`STEP_CELL`]).
pub(crate) struct Side {
    pub bytes: Vec<u8>,
}

impl Default for Side {
    fn default() -> Side {
        Side { bytes: vec![0; 8] }
    }
}

impl Side {
    /// Append `v` (8-byte aligned); returns its byte offset.
    pub fn push<T: Copy>(&mut self, v: &[T]) -> usize {
        let off = self.bytes.len().next_multiple_of(8);
        self.bytes.resize(off, 0);
        let n = std::mem::size_of_val(v);
        // SAFETY: plain `Copy` data viewed as bytes.
        let b = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, n) };
        self.bytes.extend_from_slice(b);
        off
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_aligned_and_pointers_stable() {
        let mut a = ArgPack::new();
        a.i32(7).i64(9).f32(1.5).step().side_ptr(16);
        a.push([1i32; 13]);
        a.finish();
        assert!(a.uses_step);
        a.patch_side(1000);
        // The pointers survive a move of the pack (its heap buffer stays put).
        let mut boxed = Box::new(a);
        let p = boxed.params();
        assert_eq!(p.len(), 6);
        unsafe {
            assert_eq!(*(p[0] as *const i32), 7);
            assert_eq!(*(p[1] as *const i64), 9);
            assert_eq!(*(p[2] as *const f32), 1.5);
            assert_eq!(*(p[3] as *const u64), 1000 + STEP_CELL as u64);
            assert_eq!(*(p[4] as *const u64), 1016);
            assert_eq!(*(p[5] as *const [i32; 13]), [1; 13]);
        }
        let mut s = Side::default();
        assert_eq!(s.push(&[1u8]), 8);
        assert_eq!(s.push(&[2u64, 3]), 16);
        assert_eq!(s.bytes.len(), 32);
    }
}
