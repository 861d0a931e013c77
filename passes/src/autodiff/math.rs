//! Gradient rules of dense math and activations.
//!
//! Math of each rule (dy = gradient of the output y):
//! - `C = op(A)·op(B)`: TF's four MatMul cases, each dA and dB one MatMul;
//!   the batched product (`BatchMatMul`) takes the same four cases, one
//!   batched product each (per batch index the rank-2 rule), then sums a
//!   shared operand's gradient over the batch it was broadcast along
//!   (`sum_to`: `[B,T,D]·[D,E]` gives dB = Σ_b A_bᵀ·dC_b);
//! - `a ± b`: da = sum_to(dy, a), db = ±sum_to(dy, b) (sum_to undoes broadcasting);
//! - `a * b`: da = sum_to(dy*b, a), db = sum_to(a*dy, b);
//! - `y = a / b`: da = sum_to(dy/b, a), db = sum_to(-(dy*y)/b, b);
//! - `z = max(a, b)` (TF's `_MaximumGrad`): with m = [a >= b] (`GreaterEqualMask`),
//!   da = sum_to(dy*m, a), db = sum_to(dy - dy*m, b): ties go to a, as TF;
//!   `z = min(a, b)`: the same with m = [b >= a] = [a <= b] (ties to a, as TF);
//!   `dy - dy*m` is exactly dy where m = 0 and 0 where m = 1 (finite dy);
//! - `z = a ^ b` (TF's `_PowGrad`): ∂z/∂a = b·a^(b-1), so da = sum_to(dy*(b*pow(a, b-1)), a);
//!   ∂z/∂b = z·ln(a), taken as 0 where a <= 0 (TF's `where(x > 0, log(x), 0)`),
//!   so db = sum_to(dy*PowGradY(a, z), b);
//! - `|x|` (TF's `_AbsGrad`): dx = dy·sign(x), 0 at 0: `AbsGrad(x, dy)`, a binary
//!   helper, because the unary table's gradients see only y = |x|;
//! - the gradient helpers `GreaterEqualMask`, `PowGradY` and `AbsGrad` have no gradient;
//! - `AddN`: every input gets dy; `BiasAdd`: dx = dy, dbias = BiasAddGrad(dy);
//! - every unary op (`Neg`, `Relu`, `Tanh`, ...): one rule, dx = UnaryGrad(op)(dy, y)
//!   on the output y (each op's gradient from y is the kernels', written beside its forward);
//! - `L2Loss = Σx²/2`: dx = x * dy.

use towers_graph::{BinaryOp, Op, Tensor, UnaryOp};

use super::{dy0, Ctx, Grads};
use crate::state::PassError;

pub(super) fn rule(
    cx: &mut Ctx,
    op: &Op,
    ins: &[Tensor],
    dys: &[Option<Tensor>],
    need: &[bool],
) -> Result<Option<Grads>, PassError> {
    let y = Tensor::new(cx.fwd, 0);
    let want = |i: usize| need.get(i).copied().unwrap_or(false);
    let grads = match op {
        Op::MatMul { transpose_a, transpose_b } | Op::BatchMatMul { transpose_a, transpose_b } => {
            let dy = dy0(cx, dys)?;
            let (a, b) = (ins[0], ins[1]);
            let batched = matches!(op, Op::BatchMatMul { .. });
            let mm = |ta, tb| {
                if batched {
                    Op::BatchMatMul { transpose_a: ta, transpose_b: tb }
                } else {
                    Op::MatMul { transpose_a: ta, transpose_b: tb }
                }
            };
            // (op for dA, its inputs), (op for dB, its inputs)
            let ((oa, ia), (ob, ib)) = match (*transpose_a, *transpose_b) {
                (false, false) => ((mm(false, true), [dy, b]), (mm(true, false), [a, dy])),
                (true, false) => ((mm(false, true), [b, dy]), (mm(false, false), [a, dy])),
                (false, true) => ((mm(false, false), [dy, b]), (mm(true, false), [dy, a])),
                (true, true) => ((mm(true, true), [b, dy]), (mm(true, true), [dy, a])),
            };
            // A batched product's operand shared by every batch index gets
            // the sum of its per-index gradients (no-op at equal shapes).
            let da = if want(0) { Some(cx.op(oa, ia.to_vec())?) } else { None };
            let da = match da {
                Some(d) if batched => Some(cx.sum_to(d, a)?),
                d => d,
            };
            let db = if want(1) { Some(cx.op(ob, ib.to_vec())?) } else { None };
            let db = match db {
                Some(d) if batched => Some(cx.sum_to(d, b)?),
                d => d,
            };
            vec![da, db]
        }
        Op::Binary(bop) => {
            use BinaryOp::*;
            let dy = dy0(cx, dys)?;
            let (a, b) = (ins[0], ins[1]);
            // The mask of a's share for maximum/minimum (1 where a gets dy).
            let mask = match bop {
                Maximum => Some(cx.op(Op::Binary(GreaterEqualMask), vec![a, b])?),
                Minimum => Some(cx.op(Op::Binary(GreaterEqualMask), vec![b, a])?),
                GreaterEqualMask | PowGradY | AbsGrad => return Err(cx.no_rule()),
                _ => None,
            };
            // dy * mask, a's share (also the part of dy that b does not get).
            let a_share = match mask {
                Some(m) if want(0) || want(1) => Some(cx.op(Op::Binary(Mul), vec![dy, m])?),
                _ => None,
            };
            let da = if want(0) {
                let d = match bop {
                    Mul => cx.op(Op::Binary(Mul), vec![dy, b])?,
                    Div => cx.op(Op::Binary(Div), vec![dy, b])?,
                    Add | Sub => dy,
                    Maximum | Minimum => a_share.ok_or_else(|| cx.no_rule())?,
                    Pow => {
                        let one = cx.scalar(1.0)?;
                        let bm1 = cx.op(Op::Binary(Sub), vec![b, one])?;
                        let p = cx.op(Op::Binary(Pow), vec![a, bm1])?;
                        let f = cx.op(Op::Binary(Mul), vec![b, p])?;
                        cx.op(Op::Binary(Mul), vec![dy, f])?
                    }
                    GreaterEqualMask | PowGradY | AbsGrad => return Err(cx.no_rule()),
                };
                Some(cx.sum_to(d, a)?)
            } else {
                None
            };
            let db = if want(1) {
                Some(match bop {
                    Add => cx.sum_to(dy, b)?,
                    Sub => {
                        let s = cx.sum_to(dy, b)?;
                        cx.op(Op::Unary(UnaryOp::Neg), vec![s])?
                    }
                    Mul => {
                        let d = cx.op(Op::Binary(Mul), vec![a, dy])?;
                        cx.sum_to(d, b)?
                    }
                    Div => {
                        let t = cx.op(Op::Binary(Mul), vec![dy, y])?;
                        let t = cx.op(Op::Binary(Div), vec![t, b])?;
                        let t = cx.op(Op::Unary(UnaryOp::Neg), vec![t])?;
                        cx.sum_to(t, b)?
                    }
                    Maximum | Minimum => {
                        let s = a_share.ok_or_else(|| cx.no_rule())?;
                        let t = cx.op(Op::Binary(Sub), vec![dy, s])?;
                        cx.sum_to(t, b)?
                    }
                    Pow => {
                        let f = cx.op(Op::Binary(PowGradY), vec![a, y])?;
                        let t = cx.op(Op::Binary(Mul), vec![dy, f])?;
                        cx.sum_to(t, b)?
                    }
                    GreaterEqualMask | PowGradY | AbsGrad => return Err(cx.no_rule()),
                })
            } else {
                None
            };
            vec![da, db]
        }
        Op::AddN => {
            let dy = dy0(cx, dys)?;
            (0..ins.len()).map(|i| want(i).then_some(dy)).collect()
        }
        Op::BiasAdd => {
            let dy = dy0(cx, dys)?;
            let db = if want(1) { Some(cx.op(Op::BiasAddGrad, vec![dy])?) } else { None };
            vec![Some(dy), db]
        }
        Op::Unary(UnaryOp::Abs) => {
            // d|x| = dy * sign(x), 0 at 0 (TF's `_AbsGrad`): from x, which
            // the unary table's y-only gradients cannot see.
            let dy = dy0(cx, dys)?;
            vec![Some(cx.op(Op::Binary(BinaryOp::AbsGrad), vec![ins[0], dy])?)]
        }
        Op::Unary(u) => {
            let dy = dy0(cx, dys)?;
            vec![Some(cx.op(Op::UnaryGrad(*u), vec![dy, y])?)]
        }
        Op::L2Loss => {
            let dy = dy0(cx, dys)?;
            vec![Some(cx.op(Op::Binary(BinaryOp::Mul), vec![ins[0], dy])?)]
        }
        _ => return Ok(None),
    };
    Ok(Some(grads))
}
