//! The codegen fusions, decided in one place: [`FusionPlan`].
//!
//! Lowering turns some groups of nodes into one launch. Which groups is
//! decided here, once, on the placed and scheduled graph, before any node
//! is lowered; the lowerer only consumes the plan (`lower/fused.rs` builds
//! each group's launch). `towers compile --emit fusions` prints it.
//!
//! The groups, each keyed by its *lead*, the node whose launch carries the
//! group (the other members are *absorbed*: no launch of their own):
//!
//! | kernel | members (lead last unless noted) |
//! | --- | --- |
//! | `MeanApply` | `TowerMean` → `ApplyGradient` (lead) |
//! | `TowerMatMulApply` | `TowerMatMul` → SGD/momentum `ApplyGradient` (lead) |
//! | `BiasAddAct` | `BiasAdd` → `Unary` (lead) |
//! | `Conv2DBiasAct` | `Conv2D` → `BiasAdd` → `Unary` (lead) [→ `MaxPool`] |
//! | `MatMulBiasAct` | `MatMul` → `BiasAdd` [→ `Unary`] (lead: the last) |
//! | `UnaryGradBiasGrad` | `UnaryGrad` (lead) → `BiasAddGrad` |
//! | `MaxPoolGradActBiasGrad` | `MaxPoolGrad` → `UnaryGrad` (lead) → `BiasAddGrad` |
//! | `SparseSoftmaxXentMeanGrad` | xent (lead) → `ReduceMean`, `Mul`, `BiasAddGrad` |
//!
//! Invariants:
//! - a node is absorbed into at most one group, and a lead is never absorbed;
//! - an absorbed node either gets no buffer (its value lives only inside the
//!   launch) or keeps its output buffer, which the fused launch writes as
//!   one of its outputs ([`FusionPlan::keeps_output`]: the bias gradient, the
//!   cross-entropy's readers, the fused max pool);
//! - no fetched node and no node with an extra reader is absorbed into a
//!   group that drops its buffer; members share the lead's device and stream;
//! - the plan depends only on the graph, its program record and the
//!   `LowerOptions` fusion switches: the same input gives the same plan.
//!
//! Two fusions live elsewhere, each for a reason: elementwise chains are
//! fused by equality saturation before lowering (`passes/src/simplify/fuse.rs`,
//! visible in `--dump-after`), and the multi-tensor update merges apply
//! launches after lowering, on the steps of a stream (`multi_apply.rs`).
//!
//! Maps keyed by node are for lookup only; every order comes from node ids.

use std::collections::{BTreeMap, BTreeSet};

use towers_graph::{Graph, NodeId, Op, Tensor};

use crate::error::CodegenError;
use crate::plan::LowerOptions;

/// The fusions lowering would apply to `g`, a placed and scheduled graph,
/// under `opts` (what `towers compile --emit fusions` prints).
pub fn find_fusions(g: &Graph, opts: &LowerOptions) -> Result<FusionPlan, CodegenError> {
    Ok(FusionPlan::find(g, &crate::lower::stream_map(g)?, opts))
}

/// Every codegen fusion of one graph (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct FusionPlan {
    /// Apply node -> the `TowerMean` fused into it.
    pub means: BTreeMap<NodeId, NodeId>,
    /// Apply node -> the `TowerMatMul` fused into it.
    pub tower_applies: BTreeMap<NodeId, NodeId>,
    /// Activation -> the bias add fused into it.
    pub bias_acts: BTreeMap<NodeId, NodeId>,
    /// Activation -> the convolution fused into it (with its bias add).
    pub conv_acts: BTreeMap<NodeId, NodeId>,
    /// Fused convolution's activation -> the max pool joining the launch.
    pub conv_pools: BTreeMap<NodeId, NodeId>,
    /// Activation gradient -> the bias gradient fused into it.
    pub grad_biases: BTreeMap<NodeId, NodeId>,
    /// Activation gradient (with its bias gradient) -> the max-pool gradient fused into it.
    pub pool_grads: BTreeMap<NodeId, NodeId>,
    /// Sparse cross-entropy -> its readers fused into it.
    pub xents: BTreeMap<NodeId, XentFusion>,
    /// Bias add (or its fused activation) -> the matmul fused into it.
    pub matmuls: BTreeMap<NodeId, NodeId>,
    absorbed: BTreeSet<NodeId>,
    keeps_output: BTreeSet<NodeId>,
}

/// One fused launch, for display: its kernel, its lead and its members in
/// dataflow order (names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FusedGroup {
    pub kernel: &'static str,
    pub lead: String,
    pub members: Vec<String>,
}

impl FusionPlan {
    /// Decide every fusion of `g`, whose scheduled nodes run on the streams
    /// `stream_of` gives, under the switches of `opts` (`fuse_kernels`,
    /// `fuse_reductions`, `fuse_tower_updates`).
    pub fn find(g: &Graph, stream_of: &BTreeMap<NodeId, usize>, opts: &LowerOptions) -> FusionPlan {
        let mut f = FusionPlan::default();
        if opts.fuse_reductions {
            f.means = fusable_means(g);
            if opts.fuse_tower_updates {
                f.tower_applies = fusable_tower_applies(g);
            }
        }
        if opts.fuse_kernels {
            f.bias_acts = fusable_bias_acts(g);
            f.grad_biases = fusable_grad_biases(g);
            f.conv_acts = fusable_conv_bias_acts(g, &f.bias_acts, stream_of);
            f.conv_pools = fusable_conv_pools(g, &f.conv_acts, stream_of);
            f.pool_grads = fusable_pool_grads(g, &f.grad_biases, stream_of);
            f.xents = fusable_xents(g, stream_of);
            f.matmuls = fusable_matmul_biases(g, &f.bias_acts, stream_of);
        }
        let dropped = [&f.means, &f.tower_applies, &f.bias_acts, &f.conv_acts, &f.pool_grads, &f.matmuls];
        f.absorbed = dropped.iter().flat_map(|m| m.values().copied()).collect();
        f.keeps_output = f.grad_biases.values().chain(f.conv_pools.values()).copied().collect();
        f.keeps_output.extend(f.xents.values().flat_map(|x| [x.mean, x.mul, x.bias_grad]));
        f.absorbed.extend(f.keeps_output.iter().copied());
        f
    }

    /// Whether `id` is a member of a group led by another node: it gets no
    /// launch of its own.
    pub fn is_absorbed(&self, id: NodeId) -> bool {
        self.absorbed.contains(&id)
    }

    /// Whether `id` is absorbed but keeps its output buffer, which its
    /// group's launch writes.
    pub fn keeps_output(&self, id: NodeId) -> bool {
        self.keeps_output.contains(&id)
    }

    /// The number of fused launches.
    pub fn len(&self) -> usize {
        self.leads().len()
    }

    /// Whether nothing fuses.
    pub fn is_empty(&self) -> bool {
        self.leads().is_empty()
    }

    /// Whether `producer`, an input of `lead`, is absorbed into `lead`'s
    /// launch without a buffer: `lead` then reads it through the group's
    /// inputs, never from memory.
    pub fn feeds_launch(&self, lead: NodeId, producer: NodeId) -> bool {
        [&self.means, &self.tower_applies, &self.bias_acts, &self.pool_grads, &self.matmuls]
            .iter()
            .any(|m| m.get(&lead) == Some(&producer))
    }

    fn leads(&self) -> BTreeSet<NodeId> {
        let keyed = [&self.means, &self.tower_applies, &self.bias_acts, &self.grad_biases, &self.matmuls];
        let mut leads: BTreeSet<NodeId> = keyed.iter().flat_map(|m| m.keys().copied()).collect();
        leads.extend(self.xents.keys().copied());
        leads
    }

    /// The fused launches in node order, each with its kernel and members.
    pub fn groups(&self, g: &Graph) -> Vec<FusedGroup> {
        let name = |id: NodeId| g.node(id).name.clone();
        let mut out = Vec::new();
        for lead in self.leads() {
            let (kernel, members): (&'static str, Vec<NodeId>) = if let Some(&m) = self.means.get(&lead) {
                ("MeanApply", vec![m, lead])
            } else if let Some(&t) = self.tower_applies.get(&lead) {
                ("TowerMatMulApply", vec![t, lead])
            } else if let Some(x) = self.xents.get(&lead) {
                ("SparseSoftmaxXentMeanGrad", vec![lead, x.mean, x.mul, x.bias_grad])
            } else if let Some(&b) = self.grad_biases.get(&lead) {
                match self.pool_grads.get(&lead) {
                    Some(&p) => ("MaxPoolGradActBiasGrad", vec![p, lead, b]),
                    None => ("UnaryGradBiasGrad", vec![lead, b]),
                }
            } else if let Some(&b) = self.bias_acts.get(&lead) {
                if let Some(&c) = self.conv_acts.get(&lead) {
                    let mut m = vec![c, b, lead];
                    m.extend(self.conv_pools.get(&lead));
                    ("Conv2DBiasAct", m)
                } else if let Some(&mm) = self.matmuls.get(&lead) {
                    ("MatMulBiasAct", vec![mm, b, lead])
                } else {
                    ("BiasAddAct", vec![b, lead])
                }
            } else if let Some(&mm) = self.matmuls.get(&lead) {
                ("MatMulBiasAct", vec![mm, lead])
            } else {
                continue;
            };
            out.push(FusedGroup { kernel, lead: name(lead), members: members.into_iter().map(name).collect() });
        }
        out
    }

    /// One line per fused launch: `Conv2DBiasAct  lead <- a, b, c`, in node order.
    ///
    /// Then the elementwise kernels `simplify` generated (`Fused` nodes,
    /// `fused_elementwise` in the plan): `FusedElementwise  node <- expr
    /// (inputs)`, in creation order.
    pub fn to_text(&self, g: &Graph) -> String {
        let groups = self.groups(g);
        let mut generated: Vec<NodeId> =
            g.node_ids().into_iter().filter(|&id| matches!(g.node(id).op, Op::Fused { .. })).collect();
        generated.sort_by_key(|&id| g.node(id).seq);
        const GENERATED: &str = "FusedElementwise";
        let width = groups.iter().map(|x| x.kernel.len()).chain(generated.iter().map(|_| GENERATED.len())).max();
        let width = width.unwrap_or(0);
        let mut s = format!("# {} fused launches\n", groups.len() + generated.len());
        for x in groups {
            s.push_str(&format!("{:width$}  {} <- {}\n", x.kernel, x.lead, x.members.join(", ")));
        }
        for id in generated {
            let Op::Fused { expr } = &g.node(id).op else { continue };
            let inputs: Vec<String> = g.inputs(id).iter().map(|t| g.node(t.node).name.clone()).collect();
            s.push_str(&format!("{GENERATED:width$}  {} <- {expr} ({})\n", g.node(id).name, inputs.join(", ")));
        }
        s
    }
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
