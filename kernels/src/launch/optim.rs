//! Optimizer updates (alone, averaged over towers, or over many variables
//! at once), the moving averages, dropout and the step counter. The
//! learning rate is an input buffer (f32[1]) read on the device each step;
//! pointer and weight arrays are side data ([`Arg::Operands`], [`Arg::F32s`]).

use super::entries::*;
use super::{i64a, Arg, Cx, LaunchError, Which};
use crate::cuda::grid_1d;
use crate::Kernel;

/// Lower `kernel` if it is an optimizer update (or dropout, or the step
/// counter); `false` otherwise.
pub(super) fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<bool, LaunchError> {
    match kernel {
        Kernel::AssignMovingAverage { decay } => {
            let v = cx.o(0)?;
            cx.launch(ASSIGN_MOVING_AVERAGE, grid_1d(v), vec![i64a(v), Arg::F32(*decay), cx.inp(0)?, cx.out(0)?]);
        }
        Kernel::ApplyGradientDescent {} => {
            let w = cx.o(0)?;
            cx.launch(APPLY_GRADIENT_DESCENT, grid_1d(w), vec![i64a(w), cx.inp(1)?, cx.inp(0)?, cx.out(0)?]);
        }
        Kernel::ApplyMomentum { momentum, nesterov } => {
            let w = cx.o(0)?;
            let args = vec![
                i64a(w),
                cx.inp(1)?,
                Arg::F32(*momentum),
                Arg::I32(*nesterov as i32),
                cx.inp(0)?,
                cx.out(0)?,
                cx.out(1)?,
            ];
            cx.launch(APPLY_MOMENTUM, grid_1d(w), args);
        }
        Kernel::ApplyAdam { beta1, beta2, epsilon } => {
            let w = cx.o(0)?;
            let args = vec![
                i64a(w),
                cx.inp(2)?,
                Arg::F32(*beta1),
                Arg::F32(*beta2),
                Arg::F32(*epsilon),
                cx.inp(0)?,
                cx.inp(1)?,
                cx.out(0)?,
                cx.out(1)?,
                cx.out(2)?,
            ];
            cx.launch(APPLY_ADAM, grid_1d(w), args);
        }
        Kernel::ApplyRmsProp { decay, momentum, epsilon } => {
            let w = cx.o(0)?;
            let args = vec![
                i64a(w),
                cx.inp(1)?,
                Arg::F32(*decay),
                Arg::F32(*momentum),
                Arg::F32(*epsilon),
                cx.inp(0)?,
                cx.out(0)?,
                cx.out(1)?,
                cx.out(2)?,
            ];
            cx.launch(APPLY_RMSPROP, grid_1d(w), args);
        }
        Kernel::ApplyAdagrad {} => {
            let w = cx.o(0)?;
            let args = vec![i64a(w), cx.inp(1)?, cx.inp(0)?, cx.out(0)?, cx.out(1)?];
            cx.launch(APPLY_ADAGRAD, grid_1d(w), args);
        }
        Kernel::MeanApply { weights, apply } => mean_apply(cx, weights, apply)?,
        Kernel::MultiApply { apply, count } => multi_apply(cx, apply, *count)?,
        Kernel::IncrementStep => {
            cx.launch_block(INCREMENT_STEP, 1, 1, vec![cx.out(0)?]);
        }
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
        _ => return Ok(false),
    }
    Ok(true)
}

/// The tower mean of `weights.len()` gradients, then the update.
/// Inputs after the gradients: (Adam's global_step,) the learning rate.
fn mean_apply(cx: &mut Cx<'_>, weights: &[f32], apply: &Kernel) -> Result<(), LaunchError> {
    let (w, count) = (cx.o(0)?, weights.len());
    let mut a = vec![
        i64a(w),
        Arg::I32(count as i32),
        Arg::Operands((0..count.min(cx.counts.ins.len())).map(Which::In).collect()),
        Arg::F32s(weights.to_vec()),
    ];
    let entry = match apply {
        Kernel::ApplyGradientDescent {} => {
            a.extend([cx.inp(count)?, cx.out(0)?]);
            MEAN_APPLY_GRADIENT_DESCENT
        }
        Kernel::ApplyMomentum { momentum, nesterov } => {
            a.extend([cx.inp(count)?, Arg::F32(*momentum), Arg::I32(*nesterov as i32), cx.out(0)?, cx.out(1)?]);
            MEAN_APPLY_MOMENTUM
        }
        Kernel::ApplyAdam { beta1, beta2, epsilon } => {
            a.extend([cx.inp(count + 1)?, Arg::F32(*beta1), Arg::F32(*beta2), Arg::F32(*epsilon), cx.inp(count)?]);
            a.extend([cx.out(0)?, cx.out(1)?, cx.out(2)?]);
            MEAN_APPLY_ADAM
        }
        Kernel::ApplyRmsProp { decay, momentum, epsilon } => {
            a.extend([cx.inp(count)?, Arg::F32(*decay), Arg::F32(*momentum), Arg::F32(*epsilon)]);
            a.extend([cx.out(0)?, cx.out(1)?, cx.out(2)?]);
            MEAN_APPLY_RMSPROP
        }
        Kernel::ApplyAdagrad {} => {
            a.extend([cx.inp(count)?, cx.out(0)?, cx.out(1)?]);
            MEAN_APPLY_ADAGRAD
        }
        other => return Err(LaunchError::CannotFuse { kernel: cx.name, inner: other.name() }),
    };
    cx.launch(entry, grid_1d(w), a);
    Ok(())
}

/// One update over `n` variables (outputs `m * slots + s`: variable `m`'s
/// slot `s`), as one launch over their concatenation.
fn multi_apply(cx: &mut Cx<'_>, apply: &Kernel, n: usize) -> Result<(), LaunchError> {
    let slots = cx.counts.outs.len() / n.max(1);
    let mut offsets: Vec<i64> = vec![0];
    for m in 0..n {
        offsets.push(offsets[m] + cx.o(m * slots)? as i64);
    }
    let total = offsets[n] as usize;
    let array = |s: usize| Arg::Operands((0..n).map(|m| Which::Out(m * slots + s)).collect());
    let mut a = vec![
        i64a(total),
        Arg::I32(n as i32),
        Arg::I64s(offsets),
        Arg::Operands((0..n.min(cx.counts.ins.len())).map(Which::In).collect()),
        array(0),
    ];
    let lr = cx.inp(cx.counts.ins.len().saturating_sub(1))?;
    let entry = match apply {
        Kernel::ApplyGradientDescent {} => {
            a.push(lr);
            MULTI_APPLY_GRADIENT_DESCENT
        }
        Kernel::ApplyMomentum { momentum, nesterov } => {
            a.extend([array(1), lr, Arg::F32(*momentum), Arg::I32(*nesterov as i32)]);
            MULTI_APPLY_MOMENTUM
        }
        Kernel::ApplyAdam { beta1, beta2, epsilon } => {
            a.extend([array(1), array(2), lr, Arg::F32(*beta1), Arg::F32(*beta2), Arg::F32(*epsilon), cx.inp(n)?]);
            MULTI_APPLY_ADAM
        }
        Kernel::ApplyRmsProp { decay, momentum, epsilon } => {
            a.extend([array(1), array(2), lr, Arg::F32(*decay), Arg::F32(*momentum), Arg::F32(*epsilon)]);
            MULTI_APPLY_RMSPROP
        }
        Kernel::ApplyAdagrad {} => {
            a.extend([array(1), lr]);
            MULTI_APPLY_ADAGRAD
        }
        other => return Err(LaunchError::CannotFuse { kernel: cx.name, inner: other.name() }),
    };
    cx.launch(entry, grid_1d(total), a);
    Ok(())
}
