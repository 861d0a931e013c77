//! Gradient clipping by global norm, TF1's `tf.clip_by_global_norm`, as
//! the `apply` pass inserts it ([`crate::CompileOptions::clip_global_norm`]):
//!
//! ```text
//! norm  = sqrt(2 · Σᵢ l2_loss(gᵢ))        (the global L2 norm of every gradient)
//! scale = clip / max(norm, clip)          (1 while norm <= clip)
//! gᵢ'   = gᵢ · scale
//! ```
//!
//! Invariants: the gradients clipped are the ones the optimizer applies —
//! after the towers' weighted mean (and any fold), so N towers clip the
//! update one device computes on the whole batch, exactly as a TF1 script
//! clipped `average_gradients(tower_grads)`; a gradient holding Inf makes
//! the scale 0 and the clipped gradient NaN, as TF1's does, so a numerics
//! check still sees it. Across processes the gradients are all-reduced
//! after `apply`, so clipping there would see each process's share only:
//! the pipeline refuses it.

use towers_graph::{BinaryOp, ConstValue, Graph, NewNode, Op, Tensor, UnaryOp};

use crate::state::PassError;

/// Add one node under `clip_by_global_norm/` and return its output 0.
fn node(g: &mut Graph, base: &str, op: Op, inputs: Vec<Tensor>) -> Result<Tensor, PassError> {
    let name = g.unique_name(&format!("clip_by_global_norm/{base}"));
    Ok(Tensor::new(g.add(NewNode::new(name, op, inputs))?, 0))
}

/// The gradients of `grads` (variable, gradient) scaled so that their global
/// L2 norm is at most `clip` (see the module docs).
pub fn clip_by_global_norm(
    g: &mut Graph,
    grads: &[(String, Tensor)],
    clip: f32,
) -> Result<Vec<(String, Tensor)>, PassError> {
    if !clip.is_finite() || clip <= 0.0 {
        return Err(PassError::Options(format!(
            "CompileOptions::clip_global_norm = {clip}: the norm to clip to must be a finite number above 0 (5.0 is usual for RNNs)"
        )));
    }
    let halves = grads.iter().map(|(_, t)| node(g, "L2Loss", Op::L2Loss, vec![*t])).collect::<Result<Vec<_>, _>>()?;
    let half = match halves.as_slice() {
        [one] => *one,
        _ => node(g, "AddN", Op::AddN, halves)?,
    };
    let two = node(g, "two", Op::Const { value: ConstValue::scalar(2.0) }, vec![])?;
    let squared = node(g, "mul", Op::Binary(BinaryOp::Mul), vec![half, two])?;
    let norm = node(g, "global_norm", Op::Unary(UnaryOp::Sqrt), vec![squared])?;
    let limit = node(g, "clip_norm", Op::Const { value: ConstValue::scalar(clip) }, vec![])?;
    let denom = node(g, "Maximum", Op::Binary(BinaryOp::Maximum), vec![norm, limit])?;
    let scale = node(g, "scale", Op::Binary(BinaryOp::Div), vec![limit, denom])?;
    grads.iter().map(|(v, t)| Ok((v.clone(), node(g, v, Op::Binary(BinaryOp::Mul), vec![*t, scale])?))).collect()
}
