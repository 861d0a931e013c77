//! Building the launches of fused groups (see [`crate::fusion`]): the lead
//! node's kernel becomes the fused kernel, its inputs the group's inputs, and
//! the outputs of absorbed members that keep their buffers become the
//! launch's extra outputs. The decisions are the `FusionPlan`'s; this file
//! only lowers them, so every member must still lower as `select` says (an
//! error naming the node otherwise).

use towers_graph::{NodeId, Op, Tensor};

use super::Lowerer;
use crate::error::CodegenError;
use crate::plan::{BufRef, BufferKind, LowerOptions};
use crate::select::{select, Lowering};

impl Lowerer<'_> {
    /// Turn `low`, the lowering `select` gave the lead `id`, into its group's
    /// fused launch (when `id` leads one), recording the launch's inputs;
    /// `in_refs` are `id`'s own inputs.
    pub(super) fn fuse_launch(
        &mut self,
        id: NodeId,
        low: &mut Lowering,
        in_refs: &[BufRef],
        opts: &LowerOptions,
    ) -> Result<(), CodegenError> {
        let node = self.g.node(id);
        let mean = self.fusion.means.get(&id).copied();
        let product = self.fusion.tower_applies.get(&id).copied();
        if let (Some(m), Lowering::Launch { kernel, inputs: idx, .. }) = (mean, &mut *low) {
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
        if let (Some(tmm), Lowering::Launch { kernel, inputs: idx, .. }) = (product, &mut *low) {
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
            (self.fusion.bias_acts.get(&id), &mut *low, &node.op)
        {
            // With a fused convolution, the bias add's input 0 (the
            // convolution's output) has no buffer: only its bias is read.
            let skip = usize::from(self.fusion.conv_acts.contains_key(&id) || self.fusion.matmuls.contains_key(&id));
            let mut refs =
                self.g.inputs(b).iter().skip(skip).map(|&t| self.input(b, t)).collect::<Result<Vec<_>, _>>()?;
            let channels = self.ty(self.g.inputs(b)[1])?.dims.last().copied().unwrap_or(1);
            *kernel = crate::Kernel::BiasAddAct { channels, act: *act };
            if let Some(&c) = self.fusion.conv_acts.get(&id) {
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
                let pool = match self.fusion.conv_pools.get(&id) {
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
        if let (Some(&mm), Lowering::Launch { kernel, .. }) = (self.fusion.matmuls.get(&id), &mut *low) {
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
            let b = self.fusion.bias_acts.get(&id).copied().unwrap_or(id);
            let bias = self.input(b, self.g.inputs(b)[1])?;
            let mut refs = self.g.inputs(mm).iter().map(|&t| self.input(mm, t)).collect::<Result<Vec<_>, _>>()?;
            refs.push(bias);
            *kernel = crate::Kernel::MatMulBiasAct { m, n, k, trans_a, trans_b, act };
            self.fused_inputs.insert(id, refs);
        }
        let grad_bias = self.fusion.grad_biases.get(&id).copied();
        if let (Some(b), Lowering::Launch { kernel, .. }, Op::UnaryGrad(act)) = (grad_bias, &mut *low, &node.op) {
            let channels = self.ty(Tensor::new(b, 0))?.dims.iter().product::<usize>();
            *kernel = crate::Kernel::UnaryGradBiasGrad { channels, act: *act };
            if let Some(&p) = self.fusion.pool_grads.get(&id) {
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
        let xent = self.fusion.xents.get(&id).copied();
        if let (Some(f), Lowering::Launch { kernel, .. }) = (xent, &mut *low) {
            let classes = self.ty(self.g.inputs(id)[0])?.dims.last().copied().unwrap_or(1);
            *kernel = crate::Kernel::SparseSoftmaxXentMeanGrad { classes };
            let mut refs = in_refs.to_vec();
            refs.push(self.input(f.mul, f.scale)?);
            self.fused_inputs.insert(id, refs);
        }
        Ok(())
    }

    /// Bind the outputs of the absorbed members of `id`'s group that keep
    /// their buffers, and record the launch's output list.
    pub(super) fn bind_fused_outputs(&mut self, id: NodeId) -> Result<(), CodegenError> {
        let grad_bias = self.fusion.grad_biases.get(&id).copied();
        let xent = self.fusion.xents.get(&id).copied();
        if let Some(b) = grad_bias {
            // The bias gradient's output, written by this launch.
            self.bind_fused_output(b)?;
            let refs = self.bound(id, &[Tensor::new(id, 0), Tensor::new(b, 0)])?;
            self.fused_outputs.insert(id, refs);
        }
        if let Some(&pn) = self.fusion.conv_pools.get(&id) {
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
        Ok(())
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
}
