//! Dropout with a counter-based mask: element `i` of step `step` under
//! `seed` is kept iff `unit(philox(seed, step, i)) < keep_prob` (see
//! [`crate::random`] for the stream layout). The mask therefore depends only
//! on `(seed, step, i)`, never on threads or chunking. Towers that must
//! drop differently use different seeds (e.g. the base seed mixed with the
//! tower index by the caller).
//!
//! The mask is stored as f32 scale factors: `0` or `1 / keep_prob`, so
//! `y = x * mask` and the gradient is the graph's `dx = dy * mask` (a `Mul`).

use crate::random::{philox_block, u32_to_unit};

/// `mask[i] = (unit(seed, step, offset + i) < keep_prob) / keep_prob`,
/// `y = x * mask` (`Kernel::Dropout`). `keep_prob >= 1` keeps everything
/// (mask 1); `keep_prob <= 0` drops all.
///
/// The element stream starts at `offset`, so a tower holding elements
/// `offset..` of the global batch draws the mask one device would draw for
/// them: element `offset + i` uses lane `(offset + i) % 4` of Philox block
/// `(offset + i) / 4`.
pub fn dropout(x: &[f32], keep_prob: f32, seed: u64, step: u64, offset: usize, y: &mut [f32], mask: &mut [f32]) {
    debug_assert!(x.len() == y.len() && x.len() == mask.len());
    let scale = if keep_prob > 0.0 { 1.0 / keep_prob.min(1.0) } else { 0.0 };
    let mut block = u64::MAX;
    let mut r = [0u32; 4];
    for (k, (m, (o, v))) in mask.iter_mut().zip(y.iter_mut().zip(x)).enumerate() {
        let g = (offset + k) as u64;
        if g / 4 != block {
            block = g / 4;
            r = philox_block(seed, step, block);
        }
        *m = if keep_prob >= 1.0 || u32_to_unit(r[(g % 4) as usize]) < keep_prob { scale } else { 0.0 };
        *o = *v * *m;
    }
}

/// The dropout family's descriptor: operands, CUDA launch and plan text and CPU dispatch,
/// in one place (see [`crate::family`]). Element `i` draws its mask from
/// `(seed, step, elem_offset + i)`.
///
/// Kept in this file, beside the body: a new family needs no separate
/// descriptor file (docs/design.md, "Adding a kernel family").
pub mod desc {
    use crate::dropout;
    use crate::family::prelude::*;

    entries! { "dropout";
        DROPOUT = "towers_dropout_f32";
    }

    /// The dropout family.
    pub(crate) static DESC: Desc = Desc {
        name: "dropout",
        cuda: Some(CudaFile { path: "dropout/dropout.cu", text: include_str!("dropout.cu") }),
        entries: ENTRIES,
        declare,
        lower,
        text,
        run,
        backend_workspace: no_workspace,
    };

    fn declare(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
        match k {
            Kernel::Dropout { keep_prob, seed, elem_offset } => {
                b.param("keep_prob", keep_prob);
                b.param("seed", seed);
                b.param("elem_offset", elem_offset);
                // Element i draws from counter elem_offset + i, which must not overflow.
                let limit = (u64::MAX as usize).saturating_sub(*elem_offset);
                b.input("x", F32, Len::AtMost(limit), format!("elem_offset {elem_offset} plus the length overflows"));
                b.output("y", F32, Len::Like(IN0), "");
                b.output("mask", F32, Len::Like(IN0), "");
            }
            _ => return Err(Foreign::of(k, DESC.name).into()),
        }
        Ok(())
    }

    fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
        match kernel {
            Kernel::Dropout { keep_prob, seed, elem_offset } => {
                let y = cx.o(0)?;
                let args = vec![
                    i64a(y),
                    Arg::F32(*keep_prob),
                    Arg::U64(*seed),
                    Arg::Step,
                    Arg::U64(*elem_offset as u64),
                    cx.inp(0)?,
                    cx.out(0)?,
                    cx.out(1)?,
                ];
                cx.launch(DROPOUT, grid_1d(y), args);
            }
            _ => return Err(Foreign::of(kernel, DESC.name).into()),
        }
        Ok(())
    }

    /// The CPU body of one of this family's kernels on a launch's operands.
    ///
    /// # Safety
    /// As [`Io`].
    unsafe fn run(k: &Kernel, io: &dyn Io, _lists: &mut Lists<'_>, step: u64) -> Result<(), CpuError> {
        let i = |n: usize| io.f32(n);
        let o = |n: usize| io.out_f32(n);
        match k {
            Kernel::Dropout { keep_prob, seed, elem_offset } => {
                dropout::dropout(i(0), *keep_prob, *seed, step, *elem_offset, o(0), o(1))
            }
            _ => return Err(Foreign::of(k, DESC.name).into()),
        }
        Ok(())
    }

    fn text(k: &Kernel) -> Result<String, Foreign> {
        Ok(match k {
            Kernel::Dropout { keep_prob, seed, elem_offset } => {
                format!("keep_prob={keep_prob} seed={seed} offset={elem_offset}")
            }
            _ => return Err(Foreign::of(k, DESC.name)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_rate() {
        let n = 40_000;
        let x = vec![2.0f32; n];
        let (mut y, mut m) = (vec![0.0; n], vec![0.0; n]);
        dropout(&x, 0.75, 7, 3, 0, &mut y, &mut m);
        let kept = m.iter().filter(|v| **v != 0.0).count() as f64 / n as f64;
        assert!((kept - 0.75).abs() < 0.01, "keep rate {kept}");
        assert!(m.iter().all(|v| *v == 0.0 || (*v - 1.0 / 0.75).abs() < 1e-6));
        assert!(y.iter().zip(&m).all(|(a, b)| *a == 2.0 * b));
        // Element i's draw depends on (seed, step, i) only: a prefix run alone
        // gives the same mask.
        let (mut y2, mut m2) = (vec![0.0; 10], vec![0.0; 10]);
        dropout(&x[..10], 0.75, 7, 3, 0, &mut y2, &mut m2);
        assert_eq!(&m2[..], &m[..10]);
        // A run from an offset (a tower's rows) draws the one-device mask of those elements.
        let (mut y4, mut m4) = (vec![0.0; 13], vec![0.0; 13]);
        dropout(&x[..13], 0.75, 7, 3, 5, &mut y4, &mut m4);
        assert_eq!(&m4[..], &m[5..18]);
        // Another step gives another mask.
        let (mut y3, mut m3) = (vec![0.0; n], vec![0.0; n]);
        dropout(&x, 0.75, 7, 4, 0, &mut y3, &mut m3);
        assert_ne!(m3, m);
        assert!(y3.iter().zip(&m3).all(|(a, b)| *a == 2.0 * b));
        dropout(&x, 1.0, 7, 4, 0, &mut y3, &mut m3);
        assert_eq!(y3, x);
    }
}
