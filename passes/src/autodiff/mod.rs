//! Reverse-mode automatic differentiation as a graph pass (TF's
//! `compute_gradients`).
//!
//! Invariants:
//! - only nodes on a path from some variable to the loss get gradient nodes:
//!   the forward sweep starts at the variables and stops at ops through which
//!   no gradient flows (`StopGradient`, `Cast`, `ArgMax`, `Equal`, `Compare`,
//!   `InTopK`: TF's non-differentiable selections and casts), the
//!   backward sweep starts at the loss; their intersection is differentiated;
//! - a gradient node is named `gradients/<forward node>_grad/<OpType>`
//!   (uniquified), lives in that scope and inherits the forward node's
//!   `requested_device`, so gradients colocate with their forward ops;
//! - a tensor with several consumers gets its incoming gradients summed by one
//!   `AddN` node, never a chain of adds;
//! - every gradient stays correct after `Graph::reinfer` binds an unknown batch
//!   dimension: no count or shape that depends on an unknown dimension is
//!   folded into a constant (see [`array`] for `ReduceMean` and `Reshape`).
//!
//! Gradient rules live one file per op family: [`math`] (dense math and
//! activations), [`nn`] (convolution, pooling, softmax, losses, dropout, batch
//! norm), [`array`] (shapes, reductions, identities).

mod array;
mod math;
mod nn;
mod pass;

#[cfg(test)]
pub(crate) mod tests;

use std::collections::{BTreeMap, BTreeSet};

use towers_graph::{ConstValue, DType, DeviceSpec, Graph, NewNode, NodeId, Op, Tensor, TensorType};

use crate::state::PassError;

pub use pass::Autodiff;

/// What [`gradients`] returns, in the order of the `vars` argument.
#[derive(Debug, Clone, PartialEq)]
pub struct GradientResult {
    /// (variable name, gradient of the loss with respect to it).
    pub grads: Vec<(String, Tensor)>,
    /// Variables with no differentiable path to the loss (TF's `None` gradient).
    pub unreachable: Vec<String>,
}

/// `LossNotScalar` unless `loss` is a scalar f32 (checked first: a loss of
/// the wrong shape is the mistake to name, before any about variables).
pub fn check_loss(g: &Graph, loss: Tensor) -> Result<(), PassError> {
    let loss_ty = g.tensor_type(loss)?;
    if loss_ty.dtype != DType::F32 || loss_ty.shape.rank() != 0 {
        let loss_name = g.node(loss.node).name.clone();
        return Err(PassError::LossNotScalar { loss: loss_name, ty: loss_ty.to_string() });
    }
    Ok(())
}

/// The gradients of the scalar f32 `loss` with respect to `vars`.
///
/// Errors: `LossNotScalar` for a non-scalar or non-f32 loss, `NoGradients`
/// when no variable reaches the loss, `NoGradientDefined` for an op on the
/// path without a gradient rule.
pub fn gradients(g: &mut Graph, loss: Tensor, vars: &[NodeId]) -> Result<GradientResult, PassError> {
    check_loss(g, loss)?;
    let loss_name = g.node(loss.node).name.clone();
    let on_path = path_nodes(g, loss.node, vars);
    let var_names: Vec<String> = vars.iter().map(|&v| g.node(v).name.clone()).collect();
    if !vars.iter().any(|v| on_path.contains(v)) {
        let cut = cut_at(g, loss.node, vars);
        return Err(PassError::NoGradients { loss: loss_name, vars: var_names.join(", "), cut });
    }

    // Incoming gradient contributions per tensor.
    let mut pending: BTreeMap<Tensor, Vec<Tensor>> = BTreeMap::new();
    let seed_dev = g.node(loss.node).requested_device.clone();
    let seed = add_node(g, "gradients/Fill", Op::Const { value: ConstValue::scalar(1.0) }, vec![], seed_dev)?;
    pending.insert(loss, vec![seed]);

    let mut var_grads: BTreeMap<NodeId, Tensor> = BTreeMap::new();
    let order: Vec<NodeId> = g.topo_order()?.into_iter().filter(|n| on_path.contains(n)).collect();
    for &id in order.iter().rev() {
        let n_out = g.node(id).outputs.len();
        let mut out_grads: Vec<Option<Tensor>> = Vec::with_capacity(n_out);
        for slot in 0..n_out {
            let parts = pending.remove(&Tensor::new(id, slot)).unwrap_or_default();
            out_grads.push(accumulate(g, id, parts)?);
        }
        if out_grads.iter().all(|o| o.is_none()) {
            continue;
        }
        if matches!(g.node(id).op, Op::Variable { .. }) {
            if let Some(d) = out_grads[0] {
                var_grads.insert(id, d);
            }
            continue;
        }
        let inputs = g.inputs(id);
        let need: Vec<bool> = inputs.iter().map(|t| on_path.contains(&t.node) && is_float(g, *t)).collect();
        let mut cx = Ctx::new(g, id);
        let in_grads = rule(&mut cx, &inputs, &out_grads, &need)?;
        for ((t, d), nd) in inputs.iter().zip(in_grads).zip(need) {
            if let (Some(d), true) = (d, nd) {
                pending.entry(*t).or_default().push(d);
            }
        }
    }

    let mut res = GradientResult { grads: Vec::new(), unreachable: Vec::new() };
    for (v, name) in vars.iter().zip(var_names) {
        match var_grads.get(v) {
            Some(d) => res.grads.push((name, *d)),
            None => res.unreachable.push(name),
        }
    }
    if res.grads.is_empty() {
        let vars = res.unreachable.join(", ");
        return Err(PassError::NoGradients { loss: g.node(loss.node).name.clone(), vars, cut: String::new() });
    }
    Ok(res)
}

fn is_float(g: &Graph, t: Tensor) -> bool {
    g.tensor_type(t).map(|ty| ty.dtype == DType::F32).unwrap_or(false)
}

/// Ops through which no gradient flows (TF returns `None` for their inputs).
fn blocks_gradient(op: &Op) -> bool {
    matches!(
        op,
        Op::StopGradient | Op::Cast { .. } | Op::ArgMax { .. } | Op::Equal | Op::Compare(_) | Op::InTopK { .. }
    )
}

/// The sentence of `NoGradients` naming the blocking nodes where the paths
/// from `vars` to the loss stop (read by a node reachable from a variable,
/// and reaching the loss), or empty when no such node exists.
fn cut_at(g: &Graph, loss: NodeId, vars: &[NodeId]) -> String {
    let mut reaches = BTreeSet::new();
    let mut stack = vec![loss];
    while let Some(n) = stack.pop() {
        if g.contains(n) && reaches.insert(n) {
            stack.extend(g.inputs(n).into_iter().map(|t| t.node));
        }
    }
    let mut seen = BTreeSet::new();
    let mut cut = BTreeSet::new();
    let mut stack: Vec<NodeId> = vars.to_vec();
    while let Some(n) = stack.pop() {
        if !g.contains(n) || !seen.insert(n) {
            continue;
        }
        if blocks_gradient(&g.node(n).op) {
            if reaches.contains(&n) {
                cut.insert(n);
            }
            continue;
        }
        stack.extend(g.consumers(n).into_iter().map(|(c, _, _)| c));
    }
    if cut.is_empty() {
        return String::new();
    }
    let names: Vec<String> =
        cut.iter().map(|&n| format!("'{}' ({})", g.node(n).name, g.node(n).op.type_name())).collect();
    format!(" Every path stops at an op that has no gradient: {}.", names.join(", "))
}

/// Nodes reachable from some variable (over data edges, not through blocking
/// ops) that also reach the loss.
fn path_nodes(g: &Graph, loss: NodeId, vars: &[NodeId]) -> BTreeSet<NodeId> {
    let mut fwd = BTreeSet::new();
    let mut stack: Vec<NodeId> = vars.to_vec();
    while let Some(n) = stack.pop() {
        if !g.contains(n) || blocks_gradient(&g.node(n).op) || !fwd.insert(n) {
            continue;
        }
        stack.extend(g.consumers(n).into_iter().map(|(c, _, _)| c));
    }
    let mut bwd = BTreeSet::new();
    let mut stack = vec![loss];
    while let Some(n) = stack.pop() {
        if !fwd.contains(&n) || !bwd.insert(n) {
            continue;
        }
        stack.extend(g.inputs(n).into_iter().map(|t| t.node));
    }
    bwd
}

/// Sum the contributions to one tensor with a single `AddN`.
fn accumulate(g: &mut Graph, fwd: NodeId, mut parts: Vec<Tensor>) -> Result<Option<Tensor>, PassError> {
    match parts.len() {
        0 => Ok(None),
        1 => Ok(parts.pop()),
        _ => {
            let base = format!("gradients/{}_grad/AddN", g.node(fwd).name);
            let dev = g.node(fwd).requested_device.clone();
            Ok(Some(add_node(g, &base, Op::AddN, parts, dev)?))
        }
    }
}

fn add_node(g: &mut Graph, base: &str, op: Op, inputs: Vec<Tensor>, dev: DeviceSpec) -> Result<Tensor, PassError> {
    let mut n = NewNode::new(g.unique_name(base), op, inputs);
    n.requested_device = dev;
    Ok(Tensor::new(g.add(n)?, 0))
}

/// Builds the gradient nodes of one forward node.
pub(crate) struct Ctx<'a> {
    pub g: &'a mut Graph,
    pub fwd: NodeId,
    prefix: String,
    device: DeviceSpec,
}

impl<'a> Ctx<'a> {
    fn new(g: &'a mut Graph, fwd: NodeId) -> Ctx<'a> {
        let node = g.node(fwd);
        let prefix = format!("gradients/{}_grad", node.name);
        let device = node.requested_device.clone();
        Ctx { g, fwd, prefix, device }
    }
    /// Add `gradients/<fwd>_grad/<OpType>` and return its output 0.
    pub fn op(&mut self, op: Op, inputs: Vec<Tensor>) -> Result<Tensor, PassError> {
        Ok(Tensor::new(self.node(op, inputs)?, 0))
    }
    pub fn node(&mut self, op: Op, inputs: Vec<Tensor>) -> Result<NodeId, PassError> {
        let base = format!("{}/{}", self.prefix, op.type_name());
        Ok(add_node(self.g, &base, op, inputs, self.device.clone())?.node)
    }
    pub fn scalar(&mut self, v: f32) -> Result<Tensor, PassError> {
        self.op(Op::Const { value: ConstValue::scalar(v) }, vec![])
    }
    pub fn ty(&self, t: Tensor) -> Result<TensorType, PassError> {
        Ok(self.g.tensor_type(t)?.clone())
    }
    /// `d` reduced to `like`'s shape with `SumToLike`, only when shapes differ.
    pub fn sum_to(&mut self, d: Tensor, like: Tensor) -> Result<Tensor, PassError> {
        if self.ty(d)?.shape == self.ty(like)?.shape {
            Ok(d)
        } else {
            self.op(Op::SumToLike, vec![d, like])
        }
    }
    /// Zeros shaped like `like` (a broadcast scalar 0).
    pub fn zeros_like(&mut self, like: Tensor) -> Result<Tensor, PassError> {
        let z = self.scalar(0.0)?;
        self.op(Op::BroadcastLike, vec![z, like])
    }
    pub fn no_rule(&self) -> PassError {
        let n = self.g.node(self.fwd);
        PassError::NoGradientDefined { node: n.name.clone(), op: n.op.type_name().to_string() }
    }
}

/// Input gradients of one node: `None` where no gradient flows or none is needed.
type Grads = Vec<Option<Tensor>>;

fn rule(cx: &mut Ctx, inputs: &[Tensor], dys: &[Option<Tensor>], need: &[bool]) -> Result<Grads, PassError> {
    let op = cx.g.node(cx.fwd).op.clone();
    if let Some(r) = math::rule(cx, &op, inputs, dys, need)? {
        return Ok(r);
    }
    if let Some(r) = nn::rule(cx, &op, inputs, dys, need)? {
        return Ok(r);
    }
    if let Some(r) = array::rule(cx, &op, inputs, dys, need)? {
        return Ok(r);
    }
    Err(cx.no_rule())
}

/// The gradient of output 0, for single-output ops (always present when the rule runs).
fn dy0(cx: &Ctx, dys: &[Option<Tensor>]) -> Result<Tensor, PassError> {
    dys.first().copied().flatten().ok_or_else(|| cx.no_rule())
}
