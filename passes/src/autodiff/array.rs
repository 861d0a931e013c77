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
//! - `ReduceMax`/`ReduceMin` (TF's `_MinOrMaxGrad`): with y the kept-dims
//!   result, m = [x == y] (as f32) and n = Σ_axes m (the number of tied
//!   extremes), dx = m · dy / n: the gradient is divided equally among the
//!   elements equal to the extreme (built from `BroadcastLike`, `Equal`,
//!   `Cast`, `ReduceSum` and two `Binary` ops; no new kernel);
//! - `Select` (TF1's `tf.where`, `_SelectGrad`): dx = select(cond, dy, 0),
//!   dy_y = select(cond, 0, dy), none for the bool condition (the same
//!   `Select` kernel with a zeros tensor: no new op);
//! - `Identity`: dy.
//!
//! Array ops of issue 22:
//! - `OneHot`: none (its input is integer indices, as TF);
//! - `Transpose(perm)`: y[c] = x[c permuted], so dx = transpose(dy, inv)
//!   with inv[perm[k]] = k (the inverse permutation);
//! - `ExpandDims(axis)`: dx = squeeze(dy, [axis]); `Squeeze(axes)`: dx =
//!   dy with each axis re-inserted by `ExpandDims`, ascending (both views);
//! - `Pad(paddings)`: y = x inside the window at `before`, a constant
//!   outside, so dx = slice(dy, before, shape of x) (an unknown dimension is
//!   allowed only where nothing is padded after it: its size is "to the end");
//! - `Gather(axis)`: y[.., j, ..] = params[.., idx[j], ..], so dparams[.., r, ..]
//!   = Σ_{j: idx[j] = r} dy[.., j, ..]: `GatherGrad`, an unsorted segment
//!   sum into zeros; none for the indices;
//! - `Tile(m)`: y[c] = x[c mod shape], so dx[c] = Σ over the copies of c of
//!   dy: `TileGrad`.
//!
//! Top-k selection:
//! - `TopK(k)` (TF's `_TopKGrad`): values[r, j] = x[r, idx[r, j]], so
//!   dx[r, c] = Σ_{j: idx[r, j] = c} dvalues[r, j] (each column at most once
//!   per row): `TopKGrad(x, dvalues, indices)`, a scatter into zeros; the
//!   indices (i32) get none. Away from ties the selection is locally
//!   constant, so this is the derivative; at a tie it is TF's choice.
//!
//! `StopGradient`, `Cast`, `ArgMax`, `Equal`, `Compare` and `InTopK` never get here: the forward
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
        Op::ReduceMax { axes, keep_dims } | Op::ReduceMin { axes, keep_dims } => {
            let dy = dy0(cx, dys)?;
            let x = ins[0];
            let y = Tensor::new(cx.fwd, 0);
            let shape = cx.ty(x)?.shape;
            let (yk, dyk) = if *keep_dims || cx.ty(dy)?.shape.rank() == shape.rank() {
                (y, dy)
            } else {
                let kshape = Shape(
                    shape.0.iter().enumerate().map(|(i, d)| if axes.contains(&i) { Some(1) } else { *d }).collect(),
                );
                let target = reshape_target(cx, &kshape)?;
                let yk = cx.op(Op::Reshape { shape: target.clone() }, vec![y])?;
                (yk, cx.op(Op::Reshape { shape: target }, vec![dy])?)
            };
            let wide = cx.op(Op::BroadcastLike, vec![yk, x])?;
            let hit = cx.op(Op::Equal, vec![wide, x])?;
            let m = cx.op(Op::Cast { dtype: towers_graph::DType::F32 }, vec![hit])?;
            let n = cx.op(Op::ReduceSum { axes: axes.clone(), keep_dims: true }, vec![m])?;
            let share = cx.op(Op::Binary(BinaryOp::Div), vec![dyk, n])?;
            let share = cx.op(Op::BroadcastLike, vec![share, x])?;
            vec![Some(cx.op(Op::Binary(BinaryOp::Mul), vec![m, share])?)]
        }
        Op::Select => {
            let dy = dy0(cx, dys)?;
            let zeros = cx.zeros_like(dy)?;
            let dx = if want(1) { Some(cx.op(Op::Select, vec![ins[0], dy, zeros])?) } else { None };
            let dyy = if want(2) { Some(cx.op(Op::Select, vec![ins[0], zeros, dy])?) } else { None };
            vec![None, dx, dyy]
        }
        // array ops (issue 22)
        Op::OneHot { .. } => vec![None],
        Op::Transpose { perm } => {
            let dy = dy0(cx, dys)?;
            let mut inv = vec![0; perm.len()];
            for (k, &a) in perm.iter().enumerate() {
                inv[a] = k;
            }
            vec![Some(cx.op(Op::Transpose { perm: inv }, vec![dy])?)]
        }
        Op::ExpandDims { axis } => vec![Some(cx.op(Op::Squeeze { axes: vec![*axis] }, vec![dy0(cx, dys)?])?)],
        Op::Squeeze { axes } => {
            let mut d = dy0(cx, dys)?;
            for &axis in axes {
                d = cx.op(Op::ExpandDims { axis }, vec![d])?;
            }
            vec![Some(d)]
        }
        Op::Pad { paddings, .. } => {
            let dy = dy0(cx, dys)?;
            let shape = cx.ty(ins[0])?.shape;
            let mut size = Vec::with_capacity(paddings.len());
            for (d, [_, after]) in shape.0.iter().zip(paddings) {
                size.push(match (d, after) {
                    (Some(d), _) => *d as i64,
                    (None, 0) => -1,
                    (None, _) => {
                        return Err(shape_err(cx, "an unknown dimension padded after its end has no gradient slice"))
                    }
                });
            }
            let begin = paddings.iter().map(|p| p[0]).collect();
            vec![Some(cx.op(Op::Slice { begin, size }, vec![dy])?)]
        }
        Op::Gather { axis } => {
            let dy = dy0(cx, dys)?;
            vec![Some(cx.op(Op::GatherGrad { axis: *axis }, vec![ins[0], ins[1], dy])?), None]
        }
        Op::Tile { multiples } => {
            let dy = dy0(cx, dys)?;
            vec![Some(cx.op(Op::TileGrad { multiples: multiples.clone() }, vec![ins[0], dy])?)]
        }
        Op::TopK { .. } => match dys.first().copied().flatten() {
            Some(dvalues) => {
                let indices = Tensor::new(cx.fwd, 1);
                vec![Some(cx.op(Op::TopKGrad, vec![ins[0], dvalues, indices])?)]
            }
            // Only the indices reach the loss (through an integer path): none.
            None => vec![None],
        },
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
