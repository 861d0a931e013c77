//! Gradient rules of shape ops, reductions and identities.
//!
//! Math of each rule (dy = gradient of the output):
//! - `Reshape`: dx = reshape(dy, shape of x), an unknown dimension written -1
//!   so the rule holds for any batch size bound later;
//! - `Concat`: input i gets slice(dy) at its offset along the axis;
//! - `Split`: dx = concat of the outputs' gradients, zeros for outputs
//!   without one (a `BroadcastLike` of a scalar 0);
//! - `Slice`: SliceGrad(x, dy) (zeros with dy pasted at `begin`);
//! - `ReduceSum`: dx = BroadcastLike(reshape(dy, keep-dims shape), x);
//! - `ReduceMean`: the same, divided by the count of reduced elements. When
//!   that count is known at build time it is a constant; when a reduced axis
//!   is unknown (the batch), the count is computed in the graph as
//!   `ReduceSum(BroadcastLike(1, x), axes, keep_dims)`, so it follows the
//!   batch size bound by `reinfer` and each tower's share after a split
//!   (one extra reduction, no new op);
//! - `Identity`: dy.
//!
//! `StopGradient`, `Cast`, `ArgMax` and `Equal` never get here: the forward
//! sweep does not pass them (see `super::path_nodes`).

use towers_graph::{BinaryOp, GraphError, Op, Shape, Tensor};

use super::{dy0, Ctx, Grads};
use crate::state::PassError;

pub(super) fn rule(
    cx: &mut Ctx,
    op: &Op,
    ins: &[Tensor],
    dys: &[Option<Tensor>],
    need: &[bool],
) -> Result<Option<Grads>, PassError> {
    let want = |i: usize| need.get(i).copied().unwrap_or(false);
    let grads = match op {
        Op::Identity => vec![Some(dy0(cx, dys)?)],
        Op::Reshape { .. } => {
            let dy = dy0(cx, dys)?;
            let shape = cx.ty(ins[0])?.shape;
            let target = reshape_target(cx, &shape)?;
            vec![Some(cx.op(Op::Reshape { shape: target }, vec![dy])?)]
        }
        Op::Concat { axis } => {
            let dy = dy0(cx, dys)?;
            let mut offset = Some(0usize);
            let mut out = Vec::new();
            for (i, &x) in ins.iter().enumerate() {
                let shape = cx.ty(x)?.shape;
                let last = i + 1 == ins.len();
                if want(i) {
                    let Some(off) = offset else {
                        return Err(shape_err(cx, "concat inputs before this one have an unknown size along the axis"));
                    };
                    if shape.dim(*axis).is_none() && !last {
                        return Err(shape_err(
                            cx,
                            "only the last concat input may have an unknown size along the axis",
                        ));
                    }
                    let mut begin = vec![0; shape.rank()];
                    begin[*axis] = off;
                    let size = shape.0.iter().map(|d| d.map(|d| d as i64).unwrap_or(-1)).collect();
                    out.push(Some(cx.op(Op::Slice { begin, size }, vec![dy])?));
                } else {
                    out.push(None);
                }
                offset = offset.zip(shape.dim(*axis)).map(|(a, b)| a + b);
            }
            out
        }
        Op::Split { axis, .. } => {
            let mut parts = Vec::with_capacity(dys.len());
            for (i, d) in dys.iter().enumerate() {
                parts.push(match d {
                    Some(d) => *d,
                    None => cx.zeros_like(Tensor::new(cx.fwd, i))?,
                });
            }
            vec![Some(cx.op(Op::Concat { axis: *axis }, parts)?)]
        }
        Op::Slice { begin, .. } => {
            let dy = dy0(cx, dys)?;
            vec![Some(cx.op(Op::SliceGrad { begin: begin.clone() }, vec![ins[0], dy])?)]
        }
        Op::ReduceSum { axes, keep_dims } | Op::ReduceMean { axes, keep_dims } => {
            let dy = dy0(cx, dys)?;
            let x = ins[0];
            let shape = cx.ty(x)?.shape;
            let dyk = if *keep_dims || cx.ty(dy)?.shape.rank() == 0 || axes.is_empty() {
                dy
            } else {
                let kshape = Shape(
                    shape.0.iter().enumerate().map(|(i, d)| if axes.contains(&i) { Some(1) } else { *d }).collect(),
                );
                let target = reshape_target(cx, &kshape)?;
                cx.op(Op::Reshape { shape: target }, vec![dy])?
            };
            let scaled = if matches!(op, Op::ReduceMean { .. }) {
                let count: Option<usize> = axes.iter().map(|&a| shape.dim(a)).product();
                let c = match count {
                    Some(n) => cx.scalar(n as f32)?,
                    None => {
                        let one = cx.scalar(1.0)?;
                        let ones = cx.op(Op::BroadcastLike, vec![one, x])?;
                        cx.op(Op::ReduceSum { axes: axes.clone(), keep_dims: true }, vec![ones])?
                    }
                };
                cx.op(Op::Binary(BinaryOp::Div), vec![dyk, c])?
            } else {
                dyk
            };
            vec![Some(cx.op(Op::BroadcastLike, vec![scaled, x])?)]
        }
        _ => return Ok(None),
    };
    Ok(Some(grads))
}

/// A reshape target for `shape`: its dimensions, the unknown one as -1.
fn reshape_target(cx: &Ctx, shape: &Shape) -> Result<Vec<i64>, PassError> {
    if shape.0.iter().filter(|d| d.is_none()).count() > 1 {
        return Err(shape_err(
            cx,
            &format!("cannot reshape the gradient back to {shape}: more than one unknown dimension"),
        ));
    }
    Ok(shape.0.iter().map(|d| d.map(|d| d as i64).unwrap_or(-1)).collect())
}

fn shape_err(cx: &Ctx, detail: &str) -> PassError {
    let n = cx.g.node(cx.fwd);
    PassError::Graph(GraphError::Shape {
        node: n.name.clone(),
        scope: n.scope.clone(),
        op: n.op.type_name().to_string(),
        detail: format!("gradient: {detail}"),
    })
}
