//! The launch rule of the verifier: a launch agrees with its kernel's
//! operand signature (`Kernel::signature` in `towers_kernels::operands`,
//! the one place each kernel declares its operands): its parameters agree
//! with themselves, then the arity, the workspace, every operand's dtype
//! and every element count, checked generically in launch order. This file
//! only turns a mismatch into a [`PlanError`] naming the step, the operand
//! by index and by name, the buffer, and expected vs got.

use towers_kernels::operands::{Actual, Mismatch, Side, Signature};
use towers_kernels::Kernel;

use super::{Operand, PlanError, Site};

/// Check one launch of `k` with these operands.
pub(super) fn check(
    at: Site<'_>,
    k: &Kernel,
    ins: &[Operand<'_>],
    outs: &[Operand<'_>],
    ws: Option<&Operand<'_>>,
) -> Result<(), PlanError> {
    let kernel = k.name();
    let sig = k.signature().map_err(|e| PlanError::BadParams {
        at: at.to_string().into(),
        kernel: kernel.into(),
        reason: e.reason.into(),
    })?;
    let actual = |o: &Operand| Actual { dtype: o.dtype, elems: o.elems };
    let (a_ins, a_outs): (Vec<Actual>, Vec<Actual>) =
        (ins.iter().map(actual).collect(), outs.iter().map(actual).collect());
    match sig.check(&a_ins, &a_outs, ws.map(actual)) {
        Ok(()) => Ok(()),
        Err(m) => Err(error(at, &sig, ins, outs, ws, m)),
    }
}

/// The [`PlanError`] of a mismatch.
fn error(
    at: Site<'_>,
    sig: &Signature,
    ins: &[Operand<'_>],
    outs: &[Operand<'_>],
    ws: Option<&Operand<'_>>,
    m: Mismatch,
) -> PlanError {
    let (at, kernel) = (at.to_string().into(), sig.kernel.into());
    // "input 0 (a)" and the buffer of operand `i` of `side`.
    let operand = |side: Side, i: usize| {
        let o = match side {
            Side::In => &ins[i],
            Side::Out => &outs[i],
        };
        (format!("{} {i} ({})", side.word(), sig.name(side, i)), o)
    };
    match m {
        Mismatch::Arity { side, expected, got } => PlanError::Arity {
            at,
            kernel,
            what: format!("{}s", side.word()).into(),
            expected: expected.to_string().into(),
            names: sig.names(side).into(),
            got,
        },
        Mismatch::Workspace { expected, .. } => PlanError::Workspace {
            at,
            kernel,
            expected,
            got: match ws {
                Some(w) => format!("'{}' ({}, {} elements)", w.name, w.ty(), w.elems).into(),
                None => "none".into(),
            },
        },
        Mismatch::Dtype { side, index, expected, .. } => {
            let (label, o) = operand(side, index);
            PlanError::OperandDtype {
                at,
                kernel,
                operand: label.into(),
                name: o.name.into(),
                got: o.ty().into(),
                expected: expected.to_string().into(),
            }
        }
        Mismatch::Size { side, index, expected, got } => {
            let (label, o) = operand(side, index);
            PlanError::OperandSize {
                at,
                kernel,
                operand: label.into(),
                name: o.name.into(),
                got,
                expected,
                why: sig.why(side, index).into(),
            }
        }
        Mismatch::Multiple { side, index, of, got } => {
            let (label, o) = operand(side, index);
            let reason =
                format!("{label} '{}' has {got} elements, not a multiple of {} {of}", o.name, sig.why(side, index));
            PlanError::BadParams { at, kernel, reason: reason.into() }
        }
        Mismatch::TooLong { side, index, limit, got } => {
            let (label, o) = operand(side, index);
            let why = sig.why(side, index);
            let reason = format!("{label} '{}' has {got} elements, more than {limit}: {why}", o.name);
            PlanError::BadParams { at, kernel, reason: reason.into() }
        }
        Mismatch::Overflow { side, index } => {
            let (label, o) = operand(side, index);
            let reason = format!("the length {label} '{}' needs overflows ({})", o.name, sig.why(side, index));
            PlanError::BadParams { at, kernel, reason: reason.into() }
        }
    }
}
