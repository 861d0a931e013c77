//! Gradient rules of convolution, pooling, softmax, losses, dropout and
//! batch normalization.
//!
//! Math of each rule (dy = gradient of output 0):
//! - `Conv2D(x, f)`: dx = Conv2DBackpropInput(x, f, dy), df = Conv2DBackpropFilter(x, f, dy);
//! - `MaxPool`: MaxPoolGrad(x, y, dy) (to the first maximum); `AvgPool`: AvgPoolGrad(x, dy);
//! - `Softmax`: SoftmaxGrad(dy, y) = y*(dy - Σdy*y); `LogSoftmax`: dy - exp(y)*Σdy;
//! - cross entropy with logits: output 1 ("backprop") is ∂loss_i/∂logits_i, so
//!   dlogits = reshape(dy, [-1,1]) * backprop; labels get no gradient;
//! - `Dropout` (y = x*mask): dx = dy * mask;
//! - `BatchNorm` (training): BatchNormGrad(dy, x, gamma, batch_mean, batch_inv_std)
//!   gives dx, dgamma, dbeta; the moving statistics get none.
//!
//! A gradient arriving at a secondary output (the backprop, the mask, the batch
//! statistics) has no rule: `NoGradientDefined`.

use towers_graph::{BinaryOp, Op, Tensor};

use super::{dy0, Ctx, Grads};
use crate::state::PassError;

pub(super) fn rule(
    cx: &mut Ctx,
    op: &Op,
    ins: &[Tensor],
    dys: &[Option<Tensor>],
    need: &[bool],
) -> Result<Option<Grads>, PassError> {
    let fwd = cx.fwd;
    let out = |s: usize| Tensor::new(fwd, s);
    let want = |i: usize| need.get(i).copied().unwrap_or(false);
    let multi = matches!(
        op,
        Op::SparseSoftmaxCrossEntropy | Op::SoftmaxCrossEntropy | Op::Dropout { .. } | Op::BatchNorm { .. }
    );
    if multi && dys.iter().skip(1).any(|d| d.is_some()) {
        return Err(cx.no_rule());
    }
    let grads = match op {
        Op::Conv2D { strides, padding } => {
            let dy = dy0(cx, dys)?;
            let (x, f) = (ins[0], ins[1]);
            let (strides, padding) = (*strides, *padding);
            let dx =
                if want(0) { Some(cx.op(Op::Conv2DBackpropInput { strides, padding }, vec![x, f, dy])?) } else { None };
            let df = if want(1) {
                Some(cx.op(Op::Conv2DBackpropFilter { strides, padding }, vec![x, f, dy])?)
            } else {
                None
            };
            vec![dx, df]
        }
        Op::MaxPool { ksize, strides, padding } => {
            let dy = dy0(cx, dys)?;
            let g = Op::MaxPoolGrad { ksize: *ksize, strides: *strides, padding: *padding };
            vec![Some(cx.op(g, vec![ins[0], out(0), dy])?)]
        }
        Op::AvgPool { ksize, strides, padding } => {
            let dy = dy0(cx, dys)?;
            let g = Op::AvgPoolGrad { ksize: *ksize, strides: *strides, padding: *padding };
            vec![Some(cx.op(g, vec![ins[0], dy])?)]
        }
        Op::Softmax | Op::LogSoftmax => {
            let dy = dy0(cx, dys)?;
            let g = if matches!(op, Op::Softmax) { Op::SoftmaxGrad } else { Op::LogSoftmaxGrad };
            vec![Some(cx.op(g, vec![dy, out(0)])?)]
        }
        Op::SparseSoftmaxCrossEntropy | Op::SoftmaxCrossEntropy => {
            let dy = dy0(cx, dys)?;
            let col = cx.op(Op::Reshape { shape: vec![-1, 1] }, vec![dy])?;
            vec![Some(cx.op(Op::Binary(BinaryOp::Mul), vec![col, out(1)])?), None]
        }
        Op::Dropout { .. } => {
            let dy = dy0(cx, dys)?;
            vec![Some(cx.op(Op::Binary(BinaryOp::Mul), vec![dy, out(1)])?)]
        }
        Op::BatchNorm { .. } => {
            let dy = dy0(cx, dys)?;
            let n = cx.node(Op::BatchNormGrad, vec![dy, ins[0], ins[1], out(1), out(2)])?;
            vec![
                want(0).then_some(Tensor::new(n, 0)),
                want(1).then_some(Tensor::new(n, 1)),
                want(2).then_some(Tensor::new(n, 2)),
                None,
                None,
            ]
        }
        _ => return Ok(None),
    };
    Ok(Some(grads))
}
