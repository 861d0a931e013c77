//! Lowering a placed, scheduled graph to a [`Plan`].
//!
//! Input: the graph alone. What the program is (its fetches and its stream
//! schedule) is the graph's program record, `g.program()`, filled in by the
//! passes; nothing else is read.
//!
//! Order of work, each step deterministic:
//! 1. devices: the sorted set of devices of the schedule's streams and of
//!    every node the program uses;
//! 2. variables, then placeholders and constants, in topological order
//!    (ties by creation order): variables bind to the store by name, the
//!    others get arena buffers;
//! 3. scheduled nodes in topological order: kernel selection
//!    ([`crate::select`]), output and workspace buffers (or an alias of the
//!    input for Reshape/Identity/StopGradient, in-place variable updates
//!    and the all-reduce of a bucket, which sums its inputs' buffers in place
//!    (the bucket's members write views of one contiguous bucket buffer,
//!    declared before any node is lowered, so the collective needs no packing),
//!    or views into the input for a split along the leading axis: the batch
//!    split costs no copy);
//! 4. steps per stream, in the schedule's order;
//! 5. byte offsets, per device, by [`crate::arena::place`] (buffers are
//!    declared in steps 2 and 3 and placed once, at the end, sharing bytes
//!    by liveness over the steps of 4 unless `opts.reuse_memory` is off).
//!
//! Three fusions: a `TowerMean` whose only consumer is an `ApplyGradient` on
//! its device (and that is not fetched) gets no buffer and no launch; the
//! apply becomes one `MeanApply` launch that reads the towers' gradients
//! directly (see [`fusable_means`]); likewise a `TowerMatMul` read only by
//! a plain SGD or non-Nesterov momentum update: one `TowerMatMulApply`
//! whose GEMMs accumulate into the variable or its accumulator (see
//! [`fusable_tower_applies`]). A `BiasAdd` whose only consumer is an
//! activation (`Unary`) likewise: the activation becomes one `BiasAddAct`
//! launch (see [`fusable_bias_acts`]); and a `BiasAddGrad` reading an
//! activation gradient becomes part of it, one `UnaryGradBiasGrad` launch
//! with both outputs (see [`fusable_grad_biases`]). And a `Conv2D` whose only
//! consumer is such a bias add joins the launch: one `Conv2DBiasAct` (see
//! [`fusable_conv_bias_acts`]). Backwards, a `MaxPoolGrad` read only by
//! such an activation gradient joins it: one `MaxPoolGradActBiasGrad` (see
//! [`fusable_pool_grads`]). And a sparse cross-entropy takes in the mean of
//! its loss, the scaling of its gradient and the logits' bias gradient: one
//! `SparseSoftmaxXentMeanGrad` (see [`fusable_xents`]). A `MatMul` read
//! only by a bias add joins that launch (with its activation, if fused): one
//! `MatMulBiasAct` (see [`fusable_matmul_biases`]).
//!
//! In place: an activation gradient whose incoming gradient has no other
//! reader writes over it (see `Lowerer::in_place_input`).
//!
//! Maps keyed by node are used for lookup only; every output order comes
//! from the schedule or the topological order, never from map order.

use std::collections::{BTreeMap, BTreeSet};

use towers_graph::{Device, Graph, NodeId, Op, ScheduleItem, Tensor};

use crate::arena::Arena;
use crate::error::CodegenError;
use crate::plan::{BufRef, BufferKind, ConstantDecl, DevicePlan, LowerOptions, Plan, Step, StreamPlan, VariableDecl};
use crate::select::{select, Lowering, Outs, Ty};

struct Lowerer<'g> {
    g: &'g Graph,
    /// The plan's devices, sorted; `arenas[i]` holds the buffers of `devices[i]`.
    devices: Vec<Device>,
    arenas: Vec<Arena>,
    bind: BTreeMap<Tensor, BufRef>,
    lowered: BTreeMap<NodeId, (Lowering, Option<BufRef>)>,
    /// Apply node -> the TowerMean fused into it.
    fused: BTreeMap<NodeId, NodeId>,
    /// Apply node -> the TowerMatMul fused into it (`TowerMatMulApply`).
    tower_applies: BTreeMap<NodeId, NodeId>,
    /// Launch inputs of fused applies (the towers' gradients, then the rest).
    fused_inputs: BTreeMap<NodeId, Vec<BufRef>>,
    /// Members of an all-reduce bucket -> (device index, the bucket's
    /// buffer, byte offset): their outputs are views of one contiguous buffer.
    bucket_views: BTreeMap<NodeId, (usize, usize, usize)>,
    /// All-reduce node -> its bucket buffer.
    buckets: BTreeMap<NodeId, BufRef>,
    /// Activation -> the bias add fused into it.
    bias_acts: BTreeMap<NodeId, NodeId>,
    /// Activation -> the convolution fused into it (with its bias add).
    conv_acts: BTreeMap<NodeId, NodeId>,
    /// Fused convolution's activation -> the max pool joining the launch.
    conv_pools: BTreeMap<NodeId, NodeId>,
    /// Activation gradient -> the bias gradient fused into it.
    grad_biases: BTreeMap<NodeId, NodeId>,
    /// Activation gradient (with its bias gradient) -> the max-pool
    /// gradient fused into it.
    pool_grads: BTreeMap<NodeId, NodeId>,
    /// Sparse cross-entropy -> its readers fused into it.
    xents: BTreeMap<NodeId, XentFusion>,
    /// Bias add (or its fused activation) -> the matmul fused into it.
    matmuls: BTreeMap<NodeId, NodeId>,
    /// Launch outputs of fused launches that write another node's output too.
    fused_outputs: BTreeMap<NodeId, Vec<BufRef>>,
}

/// BiasAdd nodes that fuse into the activation after them: (activation,
/// bias add) pairs. A bias add fuses when its only consumer (data or
/// control) is one `Unary` on the same device reading it as input 0, and no
/// fetch of the program record names it: the pair becomes one
/// `BiasAddAct` launch, and the sum never gets a buffer.
pub fn fusable_bias_acts(g: &Graph) -> BTreeMap<NodeId, NodeId> {
    let fetched: BTreeSet<&str> = g.program().fetches.values().map(|t| t.node.as_str()).collect();
    let mut out = BTreeMap::new();
    for id in g.node_ids() {
        let n = g.node(id);
        if !matches!(n.op, Op::BiasAdd) || fetched.contains(n.name.as_str()) || !g.control_consumers(id).is_empty() {
            continue;
        }
        if let [(u, 0, 0)] = g.consumers(id)[..] {
            let act = g.node(u);
            let f32_out = n.outputs.first().is_some_and(|t| t.dtype == towers_graph::DType::F32);
            if matches!(act.op, Op::Unary(_)) && act.device == n.device && f32_out {
                out.insert(u, id);
            }
        }
    }
    out
}

/// Conv2D nodes that fuse, with the bias add after them, into the
/// activation after that: (activation, convolution) pairs, for activations
/// of [`fusable_bias_acts`] whose bias add reads output 0 of a `Conv2D` on
/// the same device that has no other consumer (data or control) and no
/// fetch. The three become one `Conv2DBiasAct` launch: neither the
/// convolution's output nor the sum gets a buffer.
pub fn fusable_conv_bias_acts(
    g: &Graph,
    bias_acts: &BTreeMap<NodeId, NodeId>,
    stream_of: &BTreeMap<NodeId, usize>,
) -> BTreeMap<NodeId, NodeId> {
    let is_conv = |op: &Op| matches!(op, Op::Conv2D { .. });
    bias_acts.iter().filter_map(|(&act, &b)| sole_producer(g, b, act, stream_of, is_conv).map(|c| (act, c))).collect()
}

/// The node computing `reader`'s input 0, when that input is its output 0,
/// `op` accepts its op, nothing but `reader` reads it (no other data or
/// control consumer), no fetch names it, and it runs on `reader`'s device
/// and on `launch`'s stream (the fused launch runs where `launch` is
/// scheduled, so an unscheduled producer is never fused away).
fn sole_producer(
    g: &Graph,
    reader: NodeId,
    launch: NodeId,
    stream_of: &BTreeMap<NodeId, usize>,
    op: impl Fn(&Op) -> bool,
) -> Option<NodeId> {
    let t = g.inputs(reader).first().copied()?;
    let p = g.node(t.node);
    let sole = matches!(g.consumers(t.node)[..], [(n, 0, 0)] if n == reader) && g.control_consumers(t.node).is_empty();
    let same_stream = stream_of.get(&t.node).is_some() && stream_of.get(&t.node) == stream_of.get(&launch);
    let fetched = g.program().fetches.values().any(|f| f.node == p.name);
    let f32_out = p.outputs.first().is_some_and(|o| o.dtype == towers_graph::DType::F32);
    (t.slot == 0 && op(&p.op) && sole && same_stream && f32_out && p.device == g.node(reader).device && !fetched)
        .then_some(t.node)
}

/// MaxPool nodes that join a fused convolution (see
/// [`fusable_conv_bias_acts`]): (activation, pool) pairs, for the one
/// `MaxPool` reading the activation's output on its stream (the activation
/// keeps its buffer and its other readers, the backward pass's). The pool's
/// output is then the launch's second output.
pub fn fusable_conv_pools(
    g: &Graph,
    conv_acts: &BTreeMap<NodeId, NodeId>,
    stream_of: &BTreeMap<NodeId, usize>,
) -> BTreeMap<NodeId, NodeId> {
    let mut out = BTreeMap::new();
    for &act in conv_acts.keys() {
        let pools: Vec<NodeId> = g
            .consumers(act)
            .into_iter()
            .filter(|&(c, dst, src)| src == 0 && dst == 0 && matches!(g.node(c).op, Op::MaxPool { .. }))
            .map(|(c, _, _)| c)
            .collect();
        if let [p] = pools[..] {
            let here = g.node(p).device == g.node(act).device && stream_of.get(&p) == stream_of.get(&act);
            if here && stream_of.contains_key(&p) {
                out.insert(act, p);
            }
        }
    }
    out
}

/// BiasAddGrad nodes that fuse into the activation gradient they read:
/// (activation gradient, bias gradient) pairs. A bias gradient fuses when its
/// input is output 0 of a `UnaryGrad` on the same device; the pair becomes
/// one `UnaryGradBiasGrad` launch writing both outputs (the activation
/// gradient keeps its other readers). One bias gradient per activation
/// gradient (the first by node order).
pub fn fusable_grad_biases(g: &Graph) -> BTreeMap<NodeId, NodeId> {
    let mut out = BTreeMap::new();
    for id in g.node_ids() {
        let n = g.node(id);
        if !matches!(n.op, Op::BiasAddGrad) {
            continue;
        }
        let Some(t) = g.inputs(id).first().copied() else { continue };
        let u = g.node(t.node);
        let f32_in = u.outputs.first().is_some_and(|o| o.dtype == towers_graph::DType::F32);
        if t.slot == 0 && matches!(u.op, Op::UnaryGrad(_)) && u.device == n.device && f32_in {
            out.entry(t.node).or_insert(id);
        }
    }
    out
}

/// MaxPoolGrad nodes that fuse into the activation gradient reading them:
/// (activation gradient, pool gradient) pairs, for activation gradients of
/// `grad_biases` (fused with their bias gradient) whose input 0 is output 0
/// of a `MaxPoolGrad` on the same device with no other consumer (data or
/// control) and no fetch. The three become one `MaxPoolGradActBiasGrad`
/// launch: the pool gradient never gets a buffer.
pub fn fusable_pool_grads(
    g: &Graph,
    grad_biases: &BTreeMap<NodeId, NodeId>,
    stream_of: &BTreeMap<NodeId, usize>,
) -> BTreeMap<NodeId, NodeId> {
    let is_pool_grad = |op: &Op| matches!(op, Op::MaxPoolGrad { .. });
    grad_biases.keys().filter_map(|&u| sole_producer(g, u, u, stream_of, is_pool_grad).map(|p| (u, p))).collect()
}

/// MatMul nodes that fuse with the bias add after them: (launch node,
/// matmul) pairs, for bias adds reading output 0 of a `MatMul` on the same
/// device that has no other consumer (data or control) and no fetch. The
/// launch node is the bias add's activation when [`fusable_bias_acts`]
/// fused the two, else the bias add itself: one `MatMulBiasAct` launch,
/// and the product gets no buffer.
pub fn fusable_matmul_biases(
    g: &Graph,
    bias_acts: &BTreeMap<NodeId, NodeId>,
    stream_of: &BTreeMap<NodeId, usize>,
) -> BTreeMap<NodeId, NodeId> {
    let is_matmul = |op: &Op| matches!(op, Op::MatMul { .. });
    g.node_ids()
        .into_iter()
        .filter(|&b| matches!(g.node(b).op, Op::BiasAdd))
        .filter_map(|b| {
            let launch = bias_acts.iter().find(|&(_, &x)| x == b).map_or(b, |(&act, _)| act);
            sole_producer(g, b, launch, stream_of, is_matmul).map(|m| (launch, m))
        })
        .collect()
}

/// What fuses into a sparse cross-entropy (see [`fusable_xents`]).
#[derive(Debug, Clone, Copy)]
pub struct XentFusion {
    /// The `ReduceMean` of the loss (output 0).
    pub mean: NodeId,
    /// The `Mul` scaling the backprop (output 1) by a scalar constant.
    pub mul: NodeId,
    /// The constant scale (the `Mul`'s other input).
    pub scale: Tensor,
    /// The `BiasAddGrad` reading the scaled backprop.
    pub bias_grad: NodeId,
}

/// Sparse cross-entropies that fuse with their readers into one
/// `SparseSoftmaxXentMeanGrad` launch: the loss (output 0) read only by a
/// `ReduceMean` over all its axes, the backprop (output 1) read only by a
/// `Mul` with a one-element f32 constant and not fetched, and exactly one
/// `BiasAddGrad` reading that product; all on the cross-entropy's stream.
/// The mean, the product and the bias gradient keep their buffers (outputs
/// of the fused launch); the unscaled backprop gets none.
pub fn fusable_xents(g: &Graph, stream_of: &BTreeMap<NodeId, usize>) -> BTreeMap<NodeId, XentFusion> {
    let fetched: BTreeSet<&str> = g.program().fetches.values().map(|t| t.node.as_str()).collect();
    let mut out = BTreeMap::new();
    for id in g.node_ids() {
        let x = g.node(id);
        if !matches!(x.op, Op::SparseSoftmaxCrossEntropy) || fetched.contains(x.name.as_str()) {
            continue;
        }
        let here = |n: NodeId| g.node(n).device == x.device && stream_of.get(&n) == stream_of.get(&id);
        let cons = g.consumers(id);
        let (loss, back): (Vec<_>, Vec<_>) = cons.iter().partition(|c| c.2 == 0);
        let ([&(mean, 0, 0)], [&(mul, mslot, 1)]) = (&loss[..], &back[..]) else { continue };
        let mean_all =
            matches!(&g.node(mean).op, Op::ReduceMean { axes, .. } if axes.len() == x.outputs[0].shape.rank());
        let Op::Binary(towers_graph::BinaryOp::Mul) = g.node(mul).op else { continue };
        let Some(&scale) = g.inputs(mul).get(1 - mslot.min(1)) else { continue };
        let sn = g.node(scale.node);
        let scalar = matches!(&sn.op, Op::Const { value } if value.data.len() == 1)
            && sn.outputs.first().is_some_and(|t| t.dtype == towers_graph::DType::F32);
        let grads: Vec<NodeId> =
            g.consumers(mul).iter().filter(|c| matches!(g.node(c.0).op, Op::BiasAddGrad)).map(|c| c.0).collect();
        let [bias_grad] = grads[..] else { continue };
        if mean_all && scalar && mslot <= 1 && here(mean) && here(mul) && here(bias_grad) {
            out.insert(id, XentFusion { mean, mul, scale, bias_grad });
        }
    }
    out
}

/// (apply, producer) pairs: a node whose op `produces` accepts, read by
/// nothing but one `ApplyGradient` whose op `applies` accepts (data or
/// control), on the same device, and named by no fetch of the program record.
fn sole_updates(g: &Graph, produces: impl Fn(&Op) -> bool, applies: impl Fn(&Op) -> bool) -> BTreeMap<NodeId, NodeId> {
    let fetched: BTreeSet<&str> = g.program().fetches.values().map(|t| t.node.as_str()).collect();
    let mut out = BTreeMap::new();
    for id in g.node_ids() {
        let n = g.node(id);
        if !produces(&n.op) || fetched.contains(n.name.as_str()) {
            continue;
        }
        if let [(a, _, 0)] = g.consumers(id)[..] {
            let apply = g.node(a);
            if applies(&apply.op) && apply.device == n.device && g.control_consumers(id).iter().all(|&c| c == a) {
                out.insert(a, id);
            }
        }
    }
    out
}

/// TowerMean nodes that fuse into their consumer: (apply, mean) pairs. A
/// mean fuses when its only consumer (data or control) is one
/// `ApplyGradient` on the same device and no fetch of the program record names it.
pub fn fusable_means(g: &Graph) -> BTreeMap<NodeId, NodeId> {
    sole_updates(g, |op| matches!(op, Op::TowerMean { .. }), |op| matches!(op, Op::ApplyGradient { .. }))
}

/// Plain SGD and non-Nesterov momentum updates whose gradient is a
/// `TowerMatMul` read by nothing else (on the update's device, not fetched,
/// no control edge to anything else): (apply, product) pairs. The update
/// becomes one `TowerMatMulApply` launch that accumulates the towers'
/// products straight into the variable (SGD) or its accumulator
/// (momentum): the weight gradient is never stored.
pub fn fusable_tower_applies(g: &Graph) -> BTreeMap<NodeId, NodeId> {
    use towers_graph::Optimizer::{Momentum, Sgd};
    sole_updates(
        g,
        |op| matches!(op, Op::TowerMatMul { .. }),
        |op| matches!(op, Op::ApplyGradient { optimizer: Sgd { .. } | Momentum { nesterov: false, .. } }),
    )
}

impl<'g> Lowerer<'g> {
    fn device_of(&self, id: NodeId) -> Result<Device, CodegenError> {
        let n = self.g.node(id);
        n.device.ok_or_else(|| CodegenError::Unplaced { node: n.name.clone() })
    }

    fn dev_index(&self, d: Device) -> usize {
        self.devices.iter().position(|&p| p == d).unwrap_or(0)
    }

    fn ty(&self, t: Tensor) -> Result<Ty, CodegenError> {
        let n = self.g.node(t.node);
        let tt =
            self.g.tensor_type(t).map_err(|_| CodegenError::UnknownNode { node: format!("{}:{}", n.name, t.slot) })?;
        let dims = tt.shape.dims().ok_or_else(|| CodegenError::UnknownShape {
            node: n.name.clone(),
            slot: t.slot,
            shape: tt.shape.to_string(),
        })?;
        Ok(Ty { dtype: tt.dtype, dims })
    }

    fn alloc(&mut self, device: Device, name: String, ty: &Ty, kind: BufferKind) -> BufRef {
        let di = self.dev_index(device);
        let buffer = self.arenas[di].declare(name, ty.dtype, ty.dims.clone(), kind);
        BufRef::Arena { device: di, buffer }
    }

    fn tensor_name(&self, t: Tensor) -> String {
        let name = &self.g.node(t.node).name;
        if t.slot == 0 {
            name.clone()
        } else {
            format!("{name}:{}", t.slot)
        }
    }

    fn alloc_outputs(&mut self, id: NodeId, kind: BufferKind) -> Result<(), CodegenError> {
        let device = self.device_of(id)?;
        for slot in 0..self.g.node(id).outputs.len() {
            let t = Tensor::new(id, slot);
            let ty = self.ty(t)?;
            let r = self.alloc(device, self.tensor_name(t), &ty, kind);
            self.bind.insert(t, r);
        }
        Ok(())
    }

    /// The buffer of a node's input, checking it is bound and on this device.
    fn input(&self, id: NodeId, t: Tensor) -> Result<BufRef, CodegenError> {
        let node = self.g.node(id);
        let r = self.bind.get(&t).cloned().ok_or_else(|| CodegenError::NotScheduled {
            node: self.g.node(t.node).name.clone(),
            by: node.name.clone(),
        })?;
        let from = self.device_of(t.node)?;
        let here = self.device_of(id)?;
        // Variables live in the host store; the CPU backend reads them from any device.
        if from != here && !matches!(node.op, Op::Copy) && !matches!(r, BufRef::Variable(_)) {
            return Err(CodegenError::CrossDevice {
                node: node.name.clone(),
                op: node.op.type_name().to_string(),
                input: self.tensor_name(t),
                from: from.to_string(),
            });
        }
        Ok(r)
    }

    /// Bind each output of a leading-axis split to the contiguous part of
    /// the input buffer it covers (no buffer space, no step).
    fn bind_views(&mut self, id: NodeId, input: Option<&BufRef>) -> Result<(), CodegenError> {
        let node = self.g.node(id);
        let Some(BufRef::Arena { device, buffer }) = input.cloned() else {
            return Err(CodegenError::Unsupported {
                node: node.name.clone(),
                op: node.op.type_name().to_string(),
                reason: "a split view needs its input in an arena buffer".into(),
            });
        };
        // Byte offset of the next view inside the input buffer.
        let mut at = 0;
        for slot in 0..node.outputs.len() {
            let t = Tensor::new(id, slot);
            let ty = self.ty(t)?;
            let name = self.g.node(id).name.clone() + &if slot == 0 { String::new() } else { format!(":{slot}") };
            let arena = &mut self.arenas[device];
            let view = arena.view(buffer, at, name, ty.dtype, ty.dims);
            at += arena.bytes(view);
            self.bind.insert(t, BufRef::Arena { device, buffer: view });
        }
        Ok(())
    }

    /// One contiguous buffer for an all-reduce bucket whose members are all
    /// single-output launches of f32 on its device that write a buffer of
    /// their own (a tower mean, a gradient's kernel, or a bias gradient
    /// fused into its activation gradient's launch: PyTorch DDP's gradients
    /// as bucket views): each member writes its part of the bucket, and the
    /// collective step sums the one buffer, with no packing. Otherwise the
    /// step lists the members' own buffers.
    fn declare_bucket(&mut self, id: NodeId, opts: &LowerOptions) -> Result<(), CodegenError> {
        let device = self.device_of(id)?;
        let members: Vec<NodeId> = self.g.inputs(id).iter().map(|t| t.node).collect();
        let viewable = self.g.inputs(id).iter().all(|t| {
            let m = self.g.node(t.node);
            t.slot == 0
                && m.outputs.len() == 1
                && m.device == Some(device)
                && self.g.consumers(t.node).iter().all(|&(c, _, _)| c == id)
                && self.writes_own_buffer(t.node, opts)
        });
        let distinct = members.iter().collect::<BTreeSet<_>>().len() == members.len();
        if !viewable || !distinct {
            return Ok(());
        }
        let tys = self.g.inputs(id).iter().map(|&t| self.ty(t)).collect::<Result<Vec<_>, _>>()?;
        if tys.iter().any(|t| t.dtype != towers_graph::DType::F32) {
            return Ok(());
        }
        let total: usize = tys.iter().map(|t| t.dims.iter().product::<usize>()).sum();
        let name = self.g.node(id).name.clone();
        let ty = Ty { dtype: towers_graph::DType::F32, dims: vec![total] };
        let bucket = self.alloc(device, name, &ty, BufferKind::Tensor);
        let BufRef::Arena { device: di, buffer } = bucket.clone() else { return Ok(()) };
        let mut at = 0;
        for (m, t) in members.iter().zip(&tys) {
            self.bucket_views.insert(*m, (di, buffer, at));
            at += t.dims.iter().product::<usize>() * 4;
        }
        self.buckets.insert(id, bucket);
        Ok(())
    }

    /// Whether `id` is lowered to a launch that writes an output buffer of
    /// its own (so that buffer can be a view of a bucket): not fused away
    /// into another launch's inputs, not an alias or a view, not in place.
    /// A bias gradient fused into its activation gradient's launch writes
    /// its own output (the launch's second).
    fn writes_own_buffer(&self, id: NodeId, opts: &LowerOptions) -> bool {
        if self.grad_biases.values().any(|&b| b == id) {
            return true;
        }
        if self.fused.values().any(|&m| m == id)
            || self.tower_applies.values().any(|&t| t == id)
            || self.bias_acts.values().any(|&b| b == id)
            || self.conv_acts.values().any(|&c| c == id)
            || self.pool_grads.values().any(|&p| p == id)
            || self.matmuls.values().any(|&m| m == id)
        {
            return false;
        }
        if self.xents.values().any(|x| [x.mean, x.mul, x.bias_grad].contains(&id))
            || self.conv_pools.values().any(|&p| p == id)
        {
            // Written by the fused cross-entropy's launch, into its own buffer.
            return true;
        }
        let node = self.g.node(id);
        let ins = self.g.inputs(id).iter().map(|&t| self.ty(t)).collect::<Result<Vec<_>, _>>();
        let outs = (0..node.outputs.len()).map(|s| self.ty(Tensor::new(id, s))).collect::<Result<Vec<_>, _>>();
        let (Ok(ins), Ok(outs)) = (ins, outs) else { return false };
        let fused_act = self.bias_acts.contains_key(&id);
        matches!(select(&node.op, &ins, &outs, opts.mode), Ok(Lowering::Launch { outs: Outs::Own, .. })) || fused_act
    }

    /// The buffer of `id`'s input 0 when `id` (a kernel that works in place,
    /// `Kernel::in_place_ok`) may write its output 0 over it: the input is
    /// an intermediate with a buffer of its own on this device (not a view,
    /// a feed, a constant or a variable), written by a launch, of the same
    /// type as the output, and this node is its only reader (no other data
    /// consumer, no fetch, no alias). Its bytes are then dead once read, and
    /// the activation gradient needs no buffer of its own: lowering's
    /// in-place activation gradients.
    fn in_place_input(&self, id: NodeId) -> Option<BufRef> {
        let t = *self.g.inputs(id).first()?;
        let only_reader = matches!(self.g.consumers(t.node).iter().filter(|c| c.2 == t.slot).collect::<Vec<_>>()[..], [&(c, 0, _)] if c == id);
        let fetched = self.g.program().fetches.values().any(|f| f.node == self.g.node(t.node).name);
        let (a, b) = (self.ty(t).ok()?, self.ty(Tensor::new(id, 0)).ok()?);
        let by_launch = matches!(self.lowered.get(&t.node), Some((Lowering::Launch { .. }, _)));
        if !only_reader || fetched || !by_launch || a.dtype != b.dtype || a.dims != b.dims {
            return None;
        }
        let r = self.bind.get(&t)?.clone();
        let BufRef::Arena { device, buffer } = r else { return None };
        let here = self.devices.iter().position(|d| Some(*d) == self.g.node(id).device)?;
        (device == here && self.arenas[device].is_own_tensor(buffer)).then_some(r)
    }

    /// The kernel `select` gives node `id`, which a fused launch absorbs;
    /// its input types are those of `inputs` (the node's own, unless a
    /// fusion feeds it another tensor). An error naming the node when it
    /// lowers to anything but a launch.
    fn fused_kernel(&self, id: NodeId, inputs: &[Tensor], opts: &LowerOptions) -> Result<crate::Kernel, CodegenError> {
        let n = self.g.node(id);
        let unsupported = |reason: String| CodegenError::Unsupported {
            node: n.name.clone(),
            op: n.op.type_name().to_string(),
            reason,
        };
        let ins = inputs.iter().map(|&t| self.ty(t)).collect::<Result<Vec<_>, _>>()?;
        let outs = (0..n.outputs.len()).map(|s| self.ty(Tensor::new(id, s))).collect::<Result<Vec<_>, _>>()?;
        match select(&n.op, &ins, &outs, opts.mode).map_err(unsupported)? {
            Lowering::Launch { kernel, .. } => Ok(kernel),
            _ => Err(unsupported("a node fused into another launch must lower to a launch of its own".into())),
        }
    }

    /// The error for a fused node whose kernel is not the one its fusion expects.
    fn wrong_fused_kernel(&self, id: NodeId, expected: &str) -> CodegenError {
        let n = self.g.node(id);
        CodegenError::Unsupported {
            node: n.name.clone(),
            op: n.op.type_name().to_string(),
            reason: format!("its fusion expects a {expected} launch"),
        }
    }

    /// Give node `n`, whose output a fused launch writes, its buffer: its
    /// bucket view when it is a member of a bucket, else a buffer of its own.
    fn bind_fused_output(&mut self, n: NodeId) -> Result<(), CodegenError> {
        if self.bucket_views.contains_key(&n) {
            self.bind_bucket_view(n)
        } else {
            self.alloc_outputs(n, BufferKind::Tensor)
        }
    }

    /// The buffers bound to `tensors`, outputs of `id`'s fused launch.
    fn bound(&self, id: NodeId, tensors: &[Tensor]) -> Result<Vec<BufRef>, CodegenError> {
        tensors
            .iter()
            .map(|t| {
                self.bind.get(t).cloned().ok_or_else(|| CodegenError::NotScheduled {
                    node: self.g.node(t.node).name.clone(),
                    by: self.g.node(id).name.clone(),
                })
            })
            .collect()
    }

    /// Bind `id`'s single output to its bucket view (see `declare_bucket`).
    fn bind_bucket_view(&mut self, id: NodeId) -> Result<(), CodegenError> {
        let (device, base, at) = self.bucket_views[&id];
        let t = Tensor::new(id, 0);
        let ty = self.ty(t)?;
        let name = self.tensor_name(t);
        let view = self.arenas[device].view(base, at, name, ty.dtype, ty.dims);
        self.bind.insert(t, BufRef::Arena { device, buffer: view });
        Ok(())
    }

    fn lower_node(&mut self, id: NodeId, opts: &LowerOptions) -> Result<(), CodegenError> {
        let node = self.g.node(id);
        if self.fused.values().any(|&m| m == id)
            || self.tower_applies.values().any(|&t| t == id)
            || self.bias_acts.values().any(|&b| b == id)
            || self.conv_acts.values().any(|&c| c == id)
            || self.pool_grads.values().any(|&p| p == id)
            || self.xents.values().any(|x| [x.mean, x.mul, x.bias_grad].contains(&id))
            || self.matmuls.values().any(|&m| m == id)
            || self.conv_pools.values().any(|&p| p == id)
            || self.grad_biases.values().any(|&b| b == id)
        {
            // Fused into its apply or its activation: no buffer, no launch.
            self.lowered.insert(id, (Lowering::Nothing, None));
            return Ok(());
        }
        let mean = self.fused.get(&id).copied();
        let product = self.tower_applies.get(&id).copied();
        let inputs = self.g.inputs(id);
        let ins = inputs.iter().map(|&t| self.ty(t)).collect::<Result<Vec<_>, _>>()?;
        let outs = (0..node.outputs.len()).map(|s| self.ty(Tensor::new(id, s))).collect::<Result<Vec<_>, _>>()?;
        let in_refs = inputs
            .iter()
            .map(|&t| {
                let fused_in = self.bias_acts.get(&id) == Some(&t.node)
                    || self.pool_grads.get(&id) == Some(&t.node)
                    || self.matmuls.get(&id) == Some(&t.node);
                if Some(t.node) == mean || Some(t.node) == product || fused_in {
                    Ok(BufRef::Variable(String::new()))
                } else {
                    self.input(id, t)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut low = select(&node.op, &ins, &outs, opts.mode).map_err(|reason| CodegenError::Unsupported {
            node: node.name.clone(),
            op: node.op.type_name().to_string(),
            reason,
        })?;
        if let (Some(m), Lowering::Launch { kernel, inputs: idx, .. }) = (mean, &mut low) {
            let Op::TowerMean { weights } = &self.g.node(m).op else {
                return Err(CodegenError::Unsupported {
                    node: node.name.clone(),
                    op: node.op.type_name().into(),
                    reason: "its fused gradient is not a TowerMean".into(),
                });
            };
            let mut refs = self.g.inputs(m).iter().map(|&t| self.input(m, t)).collect::<Result<Vec<_>, _>>()?;
            refs.extend(idx.iter().skip(1).map(|&i| in_refs[i].clone()));
            let apply = Box::new(kernel.clone());
            *kernel = crate::Kernel::MeanApply { weights: weights.iter().map(|w| w.0).collect(), apply };
            self.fused_inputs.insert(id, refs);
        }
        if let (Some(tmm), Lowering::Launch { kernel, inputs: idx, .. }) = (product, &mut low) {
            // The towers' pairs (the product's inputs), then the update's
            // inputs after its gradient (the learning rate).
            let crate::Kernel::TowerMatMul { m, n, ks, trans_a, trans_b, weights } =
                self.fused_kernel(tmm, &self.g.inputs(tmm), opts)?
            else {
                return Err(self.wrong_fused_kernel(tmm, "TowerMatMul"));
            };
            let mut refs = self.g.inputs(tmm).iter().map(|&t| self.input(tmm, t)).collect::<Result<Vec<_>, _>>()?;
            refs.extend(idx.iter().skip(1).map(|&i| in_refs[i].clone()));
            let apply = Box::new(kernel.clone());
            *kernel = crate::Kernel::TowerMatMulApply { m, n, ks, trans_a, trans_b, weights, apply };
            self.fused_inputs.insert(id, refs);
        }
        if let (Some(&b), Lowering::Launch { kernel, .. }, Op::Unary(act)) =
            (self.bias_acts.get(&id), &mut low, &node.op)
        {
            // With a fused convolution, the bias add's input 0 (the
            // convolution's output) has no buffer: only its bias is read.
            let skip = usize::from(self.conv_acts.contains_key(&id) || self.matmuls.contains_key(&id));
            let mut refs =
                self.g.inputs(b).iter().skip(skip).map(|&t| self.input(b, t)).collect::<Result<Vec<_>, _>>()?;
            let channels = self.ty(self.g.inputs(b)[1])?.dims.last().copied().unwrap_or(1);
            *kernel = crate::Kernel::BiasAddAct { channels, act: *act };
            if let Some(&c) = self.conv_acts.get(&id) {
                // The convolution too: inputs x, filter (the convolution's), bias.
                let crate::Kernel::Conv2D { geom, workspace_len } = self.fused_kernel(c, &self.g.inputs(c), opts)?
                else {
                    return Err(self.wrong_fused_kernel(c, "Conv2D"));
                };
                let bias = refs.pop().ok_or_else(|| CodegenError::NotScheduled {
                    node: self.g.node(c).name.clone(),
                    by: node.name.clone(),
                })?;
                refs = self.g.inputs(c).iter().map(|&t| self.input(c, t)).collect::<Result<Vec<_>, _>>()?;
                refs.push(bias);
                let pool = match self.conv_pools.get(&id) {
                    Some(&pn) => match self.fused_kernel(pn, &[Tensor::new(id, 0)], opts)? {
                        crate::Kernel::MaxPool { geom } => Some(geom),
                        _ => return Err(self.wrong_fused_kernel(pn, "MaxPool")),
                    },
                    None => None,
                };
                *kernel = crate::Kernel::Conv2DBiasAct { geom, workspace_len, act: *act, pool };
            }
            self.fused_inputs.insert(id, refs);
        }
        if let (Some(&mm), Lowering::Launch { kernel, .. }) = (self.matmuls.get(&id), &mut low) {
            // A matmul with its bias add (and activation): inputs a, b (the
            // matmul's), bias.
            let act = match kernel {
                crate::Kernel::BiasAddAct { act, .. } => Some(*act),
                _ => None,
            };
            let crate::Kernel::MatMul { m, n, k, trans_a, trans_b } =
                self.fused_kernel(mm, &self.g.inputs(mm), opts)?
            else {
                return Err(self.wrong_fused_kernel(mm, "GEMM"));
            };
            let b = self.bias_acts.get(&id).copied().unwrap_or(id);
            let bias = self.input(b, self.g.inputs(b)[1])?;
            let mut refs = self.g.inputs(mm).iter().map(|&t| self.input(mm, t)).collect::<Result<Vec<_>, _>>()?;
            refs.push(bias);
            *kernel = crate::Kernel::MatMulBiasAct { m, n, k, trans_a, trans_b, act };
            self.fused_inputs.insert(id, refs);
        }
        let grad_bias = self.grad_biases.get(&id).copied();
        if let (Some(b), Lowering::Launch { kernel, .. }, Op::UnaryGrad(act)) = (grad_bias, &mut low, &node.op) {
            let channels = self.ty(Tensor::new(b, 0))?.dims.iter().product::<usize>();
            *kernel = crate::Kernel::UnaryGradBiasGrad { channels, act: *act };
            if let Some(&p) = self.pool_grads.get(&id) {
                // The pool gradient too: inputs x, y, dy (the pool
                // gradient's), then the activation's output.
                let crate::Kernel::MaxPoolGrad { geom } = self.fused_kernel(p, &self.g.inputs(p), opts)? else {
                    return Err(self.wrong_fused_kernel(p, "MaxPoolGrad"));
                };
                let mut refs = self.g.inputs(p).iter().map(|&t| self.input(p, t)).collect::<Result<Vec<_>, _>>()?;
                refs.push(in_refs[1].clone());
                *kernel = crate::Kernel::MaxPoolGradActBiasGrad { geom, act: *act };
                self.fused_inputs.insert(id, refs);
            }
        }
        let xent = self.xents.get(&id).copied();
        if let (Some(f), Lowering::Launch { kernel, .. }) = (xent, &mut low) {
            let classes = self.ty(self.g.inputs(id)[0])?.dims.last().copied().unwrap_or(1);
            *kernel = crate::Kernel::SparseSoftmaxXentMeanGrad { classes };
            let mut refs = in_refs.clone();
            refs.push(self.input(f.mul, f.scale)?);
            self.fused_inputs.insert(id, refs);
        }
        let mut workspace = None;
        match &low {
            Lowering::Nothing => {}
            Lowering::Alias => {
                if let Some(r) = in_refs.first() {
                    self.bind.insert(Tensor::new(id, 0), r.clone());
                }
            }
            Lowering::Views => self.bind_views(id, in_refs.first())?,
            Lowering::AllReduce => {
                for (slot, r) in in_refs.iter().enumerate() {
                    if !matches!(r, BufRef::Arena { .. }) {
                        return Err(CodegenError::Unsupported {
                            node: node.name.clone(),
                            op: node.op.type_name().to_string(),
                            reason: format!("input {slot} is a variable; an all-reduce sums arena buffers in place"),
                        });
                    }
                    self.bind.insert(Tensor::new(id, slot), r.clone());
                }
            }
            Lowering::Launch { outs: Outs::InPlace(_), .. } => {
                if let (Some(r), false) = (in_refs.first(), node.outputs.is_empty()) {
                    self.bind.insert(Tensor::new(id, 0), r.clone());
                }
            }
            Lowering::CopyOut | Lowering::CopyAndOnes | Lowering::Launch { .. } => {
                let in_place = match &low {
                    Lowering::Launch { kernel, outs: Outs::Own, .. } if opts.fuse_kernels && kernel.in_place_ok() => {
                        self.in_place_input(id)
                    }
                    _ => None,
                };
                if matches!(low, Lowering::Launch { outs: Outs::Own, .. }) && self.bucket_views.contains_key(&id) {
                    self.bind_bucket_view(id)?;
                } else if let Some(r) = in_place {
                    // Output 0 written over input 0 (see `in_place_input`).
                    self.bind.insert(Tensor::new(id, 0), r);
                    for slot in 1..node.outputs.len() {
                        let t = Tensor::new(id, slot);
                        let ty = self.ty(t)?;
                        let r = self.alloc(self.device_of(id)?, self.tensor_name(t), &ty, BufferKind::Tensor);
                        self.bind.insert(t, r);
                    }
                } else {
                    self.alloc_outputs(id, BufferKind::Tensor)?;
                }
                let ws = match &low {
                    Lowering::Launch {
                        kernel:
                            crate::Kernel::Conv2D { workspace_len, .. }
                            | crate::Kernel::Conv2DBiasAct { workspace_len, .. }
                            | crate::Kernel::Conv2DBackpropInput { workspace_len, .. }
                            | crate::Kernel::Conv2DBackpropFilter { workspace_len, .. },
                        ..
                    } => *workspace_len,
                    _ => 0,
                };
                if ws > 0 {
                    let ty = Ty { dtype: towers_graph::DType::F32, dims: vec![ws] };
                    let name = format!("{}/workspace", node.name);
                    workspace = Some(self.alloc(self.device_of(id)?, name, &ty, BufferKind::Workspace));
                }
            }
        }
        if let Some(b) = grad_bias {
            // The bias gradient's output, written by this launch.
            self.bind_fused_output(b)?;
            let refs = self.bound(id, &[Tensor::new(id, 0), Tensor::new(b, 0)])?;
            self.fused_outputs.insert(id, refs);
        }
        if let Some(&pn) = self.conv_pools.get(&id) {
            // Outputs: the activation (bound above), then the pool's.
            self.bind_fused_output(pn)?;
            let refs = self.bound(id, &[Tensor::new(id, 0), Tensor::new(pn, 0)])?;
            self.fused_outputs.insert(id, refs);
        }
        if let Some(f) = xent {
            // Outputs: the loss (output 0, bound above), the mean, the scaled
            // backprop and the bias gradient, each a buffer of its node.
            for n in [f.mean, f.mul, f.bias_grad] {
                self.bind_fused_output(n)?;
            }
            let refs = self.bound(id, &[id, f.mean, f.mul, f.bias_grad].map(|n| Tensor::new(n, 0)))?;
            self.fused_outputs.insert(id, refs);
        }
        self.lowered.insert(id, (low, workspace));
        Ok(())
    }

    fn steps(&self, id: NodeId) -> Vec<Step> {
        let node = self.g.node(id);
        let Some((low, workspace)) = self.lowered.get(&id) else { return Vec::new() };
        let inputs = self.g.inputs(id);
        let inb = |i: usize| self.bind.get(&inputs[i]).cloned().unwrap_or(BufRef::Variable(String::new()));
        let outb = |s: usize| self.bind.get(&Tensor::new(id, s)).cloned().unwrap_or(BufRef::Variable(String::new()));
        let name = node.name.clone();
        let bytes = |s: usize| node.outputs[s].byte_size().unwrap_or(0);
        match low {
            Lowering::Nothing | Lowering::Alias | Lowering::Views => Vec::new(),
            Lowering::AllReduce => {
                let buffers = match self.buckets.get(&id) {
                    Some(bucket) => vec![bucket.clone()],
                    None => (0..inputs.len()).map(inb).collect(),
                };
                vec![Step::AllReduce { buffers, node: name }]
            }
            Lowering::CopyOut => vec![Step::Copy { from: inb(0), to: outb(0), bytes: bytes(0), node: name }],
            Lowering::CopyAndOnes => vec![
                Step::Copy { from: inb(0), to: outb(0), bytes: bytes(0), node: name.clone() },
                Step::Launch {
                    kernel: crate::Kernel::Fill { value: 1.0 },
                    inputs: vec![],
                    outputs: vec![outb(1)],
                    workspace: None,
                    node: name,
                },
            ],
            Lowering::Launch { kernel, inputs: idx, outs } => {
                let outputs = match (outs, self.fused_outputs.get(&id)) {
                    (Outs::Own, Some(refs)) => refs.clone(),
                    (Outs::Own, None) => (0..node.outputs.len()).map(outb).collect(),
                    (Outs::InPlace(v), _) => v.iter().map(|&i| inb(i)).collect(),
                };
                let inputs = match self.fused_inputs.get(&id) {
                    Some(refs) => refs.clone(),
                    None => idx.iter().map(|&i| inb(i)).collect(),
                };
                vec![Step::Launch { kernel: kernel.clone(), inputs, outputs, workspace: workspace.clone(), node: name }]
            }
        }
    }
}

/// Lower a placed, scheduled graph to a plan; the program (fetches,
/// schedule) is the graph's program record.
pub fn lower(g: &Graph, opts: &LowerOptions) -> Result<Plan, CodegenError> {
    let program = g.program();
    let schedule = program.schedule.as_ref().ok_or(CodegenError::NoSchedule)?;
    // Which stream runs each node.
    let mut stream_of: BTreeMap<NodeId, usize> = BTreeMap::new();
    for (si, s) in schedule.streams.iter().enumerate() {
        for item in &s.items {
            match item {
                ScheduleItem::Run(name) => {
                    let id = g.get(name).ok_or_else(|| CodegenError::UnknownNode { node: name.clone() })?;
                    if let Some(&first) = stream_of.get(&id) {
                        return Err(CodegenError::ScheduledTwice {
                            node: name.clone(),
                            first: schedule.streams[first].name(),
                            second: s.name(),
                        });
                    }
                    let n = g.node(id);
                    let device = n.device.ok_or_else(|| CodegenError::Unplaced { node: name.clone() })?;
                    if device != s.device && !matches!(n.op, Op::Copy) {
                        return Err(CodegenError::WrongStream {
                            node: name.clone(),
                            op: n.op.type_name().to_string(),
                            stream: s.name(),
                            device: device.to_string(),
                        });
                    }
                    stream_of.insert(id, si);
                }
                ScheduleItem::Record(e) | ScheduleItem::Wait(e) => {
                    if *e >= schedule.num_events {
                        return Err(CodegenError::BadEvent { event: *e, num_events: schedule.num_events });
                    }
                }
            }
        }
    }
    let order = g.topo_order().map_err(|e| CodegenError::UnknownNode { node: e.to_string() })?;
    let is_source =
        |id: NodeId| matches!(g.node(id).op, Op::Variable { .. } | Op::Placeholder { .. } | Op::Const { .. });

    let mut devices: BTreeSet<Device> = schedule.streams.iter().map(|s| s.device).collect();
    for &id in &order {
        if is_source(id) || stream_of.contains_key(&id) {
            let n = g.node(id);
            devices.insert(n.device.ok_or_else(|| CodegenError::Unplaced { node: n.name.clone() })?);
        }
    }
    let devices: Vec<Device> = devices.into_iter().collect();
    let mut lw = Lowerer {
        g,
        arenas: vec![Arena::new(); devices.len()],
        devices,
        bind: BTreeMap::new(),
        lowered: BTreeMap::new(),
        fused: if opts.fuse_reductions { fusable_means(g) } else { BTreeMap::new() },
        tower_applies: if opts.fuse_reductions && opts.fuse_tower_updates {
            fusable_tower_applies(g)
        } else {
            BTreeMap::new()
        },
        fused_inputs: BTreeMap::new(),
        bucket_views: BTreeMap::new(),
        buckets: BTreeMap::new(),
        conv_acts: BTreeMap::new(),
        conv_pools: BTreeMap::new(),
        pool_grads: BTreeMap::new(),
        xents: BTreeMap::new(),
        matmuls: BTreeMap::new(),
        bias_acts: if opts.fuse_kernels { fusable_bias_acts(g) } else { BTreeMap::new() },
        grad_biases: if opts.fuse_kernels { fusable_grad_biases(g) } else { BTreeMap::new() },
        fused_outputs: BTreeMap::new(),
    };

    lw.conv_acts = fusable_conv_bias_acts(g, &lw.bias_acts, &stream_of);
    lw.conv_pools = fusable_conv_pools(g, &lw.conv_acts, &stream_of);
    lw.pool_grads = fusable_pool_grads(g, &lw.grad_biases, &stream_of);
    if opts.fuse_kernels {
        lw.xents = fusable_xents(g, &stream_of);
        lw.matmuls = fusable_matmul_biases(g, &lw.bias_acts, &stream_of);
    }

    let mut variables = Vec::new();
    let mut constants = Vec::new();
    let mut feeds = Vec::new();
    for &id in &order {
        let n = g.node(id);
        match &n.op {
            Op::Variable { dtype, shape, init, trainable } => {
                variables.push(VariableDecl {
                    name: n.name.clone(),
                    dtype: *dtype,
                    shape: shape.clone(),
                    init: init.clone(),
                    trainable: *trainable,
                    device: lw.device_of(id)?,
                    seed: g.random_seed(),
                });
                lw.bind.insert(Tensor::new(id, 0), BufRef::Variable(n.name.clone()));
            }
            Op::Placeholder { .. } => {
                lw.alloc_outputs(id, crate::plan::BufferKind::Feed)?;
                feeds.push((n.name.clone(), lw.bind[&Tensor::new(id, 0)].clone()));
            }
            Op::Const { value } => {
                lw.alloc_outputs(id, crate::plan::BufferKind::Constant)?;
                let buffer = lw.bind[&Tensor::new(id, 0)].clone();
                constants.push(ConstantDecl { buffer, data: value.data.iter().map(|v| v.0).collect() });
            }
            _ => {}
        }
    }
    for &id in &order {
        if matches!(g.node(id).op, Op::AllReduce { .. }) {
            lw.declare_bucket(id, opts)?;
        }
    }
    for &id in &order {
        if stream_of.contains_key(&id) && !is_source(id) {
            lw.lower_node(id, opts)?;
        }
    }

    let mut streams = Vec::new();
    for s in &schedule.streams {
        let mut steps = Vec::new();
        for item in &s.items {
            match item {
                ScheduleItem::Run(name) => {
                    if let Some(id) = g.get(name) {
                        steps.extend(lw.steps(id));
                    }
                }
                ScheduleItem::Record(e) => steps.push(Step::Record(*e)),
                ScheduleItem::Wait(e) => steps.push(Step::Wait(*e)),
            }
        }
        streams.push(StreamPlan { device: s.device, kind: s.kind, steps });
    }

    if opts.fuse_kernels {
        crate::multi_apply::merge_applies(&mut streams);
    }

    let mut fetches = Vec::new();
    for (name, tr) in &program.fetches {
        let bad = || CodegenError::BadFetch { fetch: name.clone(), tensor: tr.to_string() };
        let id = g.get(&tr.node).ok_or_else(bad)?;
        if tr.slot >= g.node(id).outputs.len() {
            return Err(bad());
        }
        let r = lw
            .bind
            .get(&Tensor::new(id, tr.slot))
            .cloned()
            .ok_or_else(|| CodegenError::NotScheduled { node: tr.node.clone(), by: format!("fetch '{name}'") })?;
        fetches.push((name.clone(), r));
    }
    fetches.sort();
    feeds.sort();
    let mut tensors: Vec<(String, BufRef)> = lw.bind.iter().map(|(t, r)| (lw.tensor_name(*t), r.clone())).collect();
    tensors.sort();
    let placed = crate::arena::place(lw.arenas, &streams, schedule.num_events, &fetches, opts.reuse_memory);
    let devices = lw
        .devices
        .iter()
        .zip(placed)
        .map(|(&device, (buffers, arena_bytes))| DevicePlan { device, buffers, arena_bytes })
        .collect();

    let plan = Plan {
        program: opts.program.clone(),
        mode: opts.mode,
        devices,
        variables,
        constants,
        feeds,
        fetches,
        tensors,
        streams,
        num_events: schedule.num_events,
        task: program.task,
    };
    crate::verify::verify(&plan)?;
    Ok(plan)
}
