//! Which physical device serves each logical device of a plan.
//!
//! The rule, one place for the CUDA backend, the mixed session and the
//! placement report: `gpu:i` runs on physical GPU `i` where the machine has
//! it, otherwise on GPU `i mod n` (n GPUs); every logical GPU gets a CUDA
//! context of its own, so two logical GPUs sharing one physical GPU still
//! copy between each other explicitly (peer copies between contexts) and
//! never read each other's buffers. Contexts on one physical GPU are
//! numbered in the order of their logical indices.

/// The CUDA context serving one logical GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuContext {
    /// `i` of `gpu:i`.
    pub logical: u32,
    /// The physical GPU (CUDA ordinal).
    pub physical: usize,
    /// Its context among those on `physical`, 0-based.
    pub context: usize,
    /// How many contexts `physical` holds.
    pub of: usize,
}

/// The contexts for logical GPUs `logical` (any order, no repeats) on a
/// machine with `physical` GPUs (at least one), in the order given.
pub fn gpu_contexts(logical: &[u32], physical: usize) -> Vec<GpuContext> {
    let n = physical.max(1);
    let on = |p: usize| logical.iter().filter(move |&&l| l as usize % n == p);
    logical
        .iter()
        .map(|&l| {
            let p = l as usize % n;
            GpuContext { logical: l, physical: p, context: on(p).filter(|&&o| o < l).count(), of: on(p).count() }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_logical_gpu_gets_its_own_context() {
        let one = gpu_contexts(&[0, 1, 2, 3], 1);
        assert_eq!(
            one.iter().map(|c| (c.physical, c.context, c.of)).collect::<Vec<_>>(),
            vec![(0, 0, 4), (0, 1, 4), (0, 2, 4), (0, 3, 4)]
        );
        let eight = gpu_contexts(&[0, 1, 2, 3], 8);
        assert!(eight.iter().all(|c| c.physical == c.logical as usize && c.context == 0 && c.of == 1));
        let two = gpu_contexts(&[3, 0, 1, 2], 2);
        assert_eq!(
            two.iter().map(|c| (c.logical, c.physical, c.context, c.of)).collect::<Vec<_>>(),
            vec![(3, 1, 1, 2), (0, 0, 0, 2), (1, 1, 0, 2), (2, 0, 1, 2)]
        );
    }
}
