//! Gradient rules of dense math and activations.
//!
//! Math of each rule (dy = gradient of the output y):
//! - `C = op(A)·op(B)`: TF's four MatMul cases, each dA and dB one MatMul;
//! - `a ± b`: da = sum_to(dy, a), db = ±sum_to(dy, b) (sum_to undoes broadcasting);
//! - `a * b`: da = sum_to(dy*b, a), db = sum_to(a*dy, b);
//! - `y = a / b`: da = sum_to(dy/b, a), db = sum_to(-(dy*y)/b, b);
//! - `AddN`: every input gets dy; `BiasAdd`: dx = dy, dbias = BiasAddGrad(dy);
//! - `Neg`: -dy; `Relu`, `Sigmoid`, `Tanh`: their *Grad ops on the output y;
//! - `L2Loss = Σx²/2`: dx = x * dy.

use towers_graph::{Op, Tensor};

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
        Op::MatMul { transpose_a, transpose_b } => {
            let dy = dy0(cx, dys)?;
            let (a, b) = (ins[0], ins[1]);
            let mm = |ta, tb| Op::MatMul { transpose_a: ta, transpose_b: tb };
            // (op for dA, its inputs), (op for dB, its inputs)
            let ((oa, ia), (ob, ib)) = match (*transpose_a, *transpose_b) {
                (false, false) => ((mm(false, true), [dy, b]), (mm(true, false), [a, dy])),
                (true, false) => ((mm(false, true), [b, dy]), (mm(false, false), [a, dy])),
                (false, true) => ((mm(false, false), [dy, b]), (mm(true, false), [dy, a])),
                (true, true) => ((mm(true, true), [b, dy]), (mm(true, true), [dy, a])),
            };
            let da = if want(0) { Some(cx.op(oa, ia.to_vec())?) } else { None };
            let db = if want(1) { Some(cx.op(ob, ib.to_vec())?) } else { None };
            vec![da, db]
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div => {
            let dy = dy0(cx, dys)?;
            let (a, b) = (ins[0], ins[1]);
            let da = if want(0) {
                let d = match op {
                    Op::Mul => cx.op(Op::Mul, vec![dy, b])?,
                    Op::Div => cx.op(Op::Div, vec![dy, b])?,
                    _ => dy,
                };
                Some(cx.sum_to(d, a)?)
            } else {
                None
            };
            let db = if want(1) {
                Some(match op {
                    Op::Add => cx.sum_to(dy, b)?,
                    Op::Sub => {
                        let s = cx.sum_to(dy, b)?;
                        cx.op(Op::Neg, vec![s])?
                    }
                    Op::Mul => {
                        let d = cx.op(Op::Mul, vec![a, dy])?;
                        cx.sum_to(d, b)?
                    }
                    _ => {
                        let t = cx.op(Op::Mul, vec![dy, y])?;
                        let t = cx.op(Op::Div, vec![t, b])?;
                        let t = cx.op(Op::Neg, vec![t])?;
                        cx.sum_to(t, b)?
                    }
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
        Op::Neg => {
            let dy = dy0(cx, dys)?;
            vec![Some(cx.op(Op::Neg, vec![dy])?)]
        }
        Op::Relu | Op::Sigmoid | Op::Tanh => {
            let dy = dy0(cx, dys)?;
            let gop = match op {
                Op::Relu => Op::ReluGrad,
                Op::Sigmoid => Op::SigmoidGrad,
                _ => Op::TanhGrad,
            };
            vec![Some(cx.op(gop, vec![dy, y])?)]
        }
        Op::L2Loss => {
            let dy = dy0(cx, dys)?;
            vec![Some(cx.op(Op::Mul, vec![ins[0], dy])?)]
        }
        _ => return Ok(None),
    };
    Ok(Some(grads))
}
