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
//! Fusions: which nodes become one launch is decided once, before any
//! node is lowered, by [`crate::fusion::FusionPlan`] (the table of groups is
//! there); `lower/fused.rs` builds each group's launch. An absorbed node
//! lowers to nothing; the lead's launch reads the group's inputs and writes
//! the outputs of the members that keep their buffers.
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
use crate::fusion::FusionPlan;
use crate::plan::{BufRef, BufferKind, ConstantDecl, DevicePlan, LowerOptions, Plan, Step, StreamPlan, VariableDecl};
use crate::select::{select, Lowering, Outs, Ty};

mod fused;

struct Lowerer<'g> {
    g: &'g Graph,
    /// The plan's devices, sorted; `arenas[i]` holds the buffers of `devices[i]`.
    devices: Vec<Device>,
    arenas: Vec<Arena>,
    bind: BTreeMap<Tensor, BufRef>,
    lowered: BTreeMap<NodeId, (Lowering, Option<BufRef>)>,
    /// Which nodes fuse into which launch, decided before lowering.
    fusion: FusionPlan,
    /// Launch inputs of fused launches (the towers' gradients, then the rest).
    fused_inputs: BTreeMap<NodeId, Vec<BufRef>>,
    /// Members of an all-reduce bucket -> (device index, the bucket's
    /// buffer, byte offset): their outputs are views of one contiguous buffer.
    bucket_views: BTreeMap<NodeId, (usize, usize, usize)>,
    /// All-reduce node -> its bucket buffer.
    buckets: BTreeMap<NodeId, BufRef>,
    /// Launch outputs of fused launches that write another node's output too.
    fused_outputs: BTreeMap<NodeId, Vec<BufRef>>,
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
        if self.fusion.keeps_output(id) {
            // Written by its group's launch, into its own buffer.
            return true;
        }
        if self.fusion.is_absorbed(id) {
            return false;
        }
        let node = self.g.node(id);
        let ins = self.g.inputs(id).iter().map(|&t| self.ty(t)).collect::<Result<Vec<_>, _>>();
        let outs = (0..node.outputs.len()).map(|s| self.ty(Tensor::new(id, s))).collect::<Result<Vec<_>, _>>();
        let (Ok(ins), Ok(outs)) = (ins, outs) else { return false };
        let fused_act = self.fusion.bias_acts.contains_key(&id);
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
        if self.fusion.is_absorbed(id) {
            // Fused into its group's launch: no buffer, no launch.
            self.lowered.insert(id, (Lowering::Nothing, None));
            return Ok(());
        }
        let inputs = self.g.inputs(id);
        let ins = inputs.iter().map(|&t| self.ty(t)).collect::<Result<Vec<_>, _>>()?;
        let outs = (0..node.outputs.len()).map(|s| self.ty(Tensor::new(id, s))).collect::<Result<Vec<_>, _>>()?;
        let in_refs = inputs
            .iter()
            .map(|&t| {
                if self.fusion.feeds_launch(id, t.node) {
                    // Absorbed into this launch: read through the fused inputs.
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
        // Views need the input's bytes in this device's arena; a variable
        // (0 towers, or variables on the tower's device) is split by the kernel.
        if let (Lowering::Views, Op::Split { axis, sizes }) = (&low, &node.op) {
            if !matches!(in_refs.first(), Some(BufRef::Arena { .. })) {
                low = crate::select::split_launch(*axis, &ins[0], sizes).map_err(|reason| {
                    CodegenError::Unsupported { node: node.name.clone(), op: node.op.type_name().to_string(), reason }
                })?;
            }
        }
        self.fuse_launch(id, &mut low, &in_refs, opts)?;
        let mut workspace = None;
        match &low {
            Lowering::Nothing | Lowering::Broadcast => {}
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
        self.bind_fused_outputs(id)?;
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
            Lowering::Broadcast => {
                let Op::Broadcast { root, .. } = node.op else { unreachable!("select lowers only Broadcast so") };
                vec![Step::Broadcast { root, buffers: (0..inputs.len()).map(inb).collect(), node: name }]
            }
            Lowering::AllReduce => {
                let buffers = match self.buckets.get(&id) {
                    Some(bucket) => vec![bucket.clone()],
                    None => (0..inputs.len()).map(inb).collect(),
                };
                match node.op {
                    Op::AllReduce { root: Some(root), .. } => vec![Step::Reduce { root, buffers, node: name }],
                    _ => vec![Step::AllReduce { buffers, node: name }],
                }
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

/// Which stream (index into the schedule's streams) runs each scheduled
/// node; errors for a node scheduled twice, unknown, unplaced or on a
/// stream of another device, and for events past the schedule's count.
pub(crate) fn stream_map(g: &Graph) -> Result<BTreeMap<NodeId, usize>, CodegenError> {
    let schedule = g.program().schedule.as_ref().ok_or(CodegenError::NoSchedule)?;
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
    Ok(stream_of)
}

/// Lower a placed, scheduled graph to a plan; the program (fetches,
/// schedule) is the graph's program record.
pub fn lower(g: &Graph, opts: &LowerOptions) -> Result<Plan, CodegenError> {
    let program = g.program();
    let schedule = program.schedule.as_ref().ok_or(CodegenError::NoSchedule)?;
    let stream_of = stream_map(g)?;
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
        fusion: FusionPlan::find(g, &stream_of, opts),
        fused_inputs: BTreeMap::new(),
        bucket_views: BTreeMap::new(),
        buckets: BTreeMap::new(),
        fused_outputs: BTreeMap::new(),
    };

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
        unread_feeds: program
            .unread_feeds
            .iter()
            .map(|(name, ty)| crate::plan::UnreadFeed {
                name: name.clone(),
                dtype: ty.dtype,
                shape: ty.shape.0.clone(),
            })
            .collect(),
    };
    crate::verify::verify(&plan)?;
    Ok(plan)
}
