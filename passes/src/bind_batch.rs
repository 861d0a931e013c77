//! `bind_batch`: give the feeds' unknown batch dimension the global batch size.
//!
//! Invariants after this pass:
//! - every placeholder's shape is fully known; a placeholder whose dimension 0
//!   was unknown now has `batch` there;
//! - `st.batch_inputs` lists (in creation order) the placeholders whose
//!   dimension 0 is the global batch: the ones that were unknown, and those
//!   declared with exactly `batch` rows (a TF1 user often hard-codes it);
//!   these, and only these, are split across towers by `split`;
//! - `st.batch_size == Some(batch)` and every node's output types are re-inferred.
//!
//! With several processes ([`BindBatch::share`]), `batch` is the global
//! batch and each placeholder gets this process's rows of it
//! ([`ProcessShare::rows`]); `st.global_batch` keeps the global size. A
//! placeholder declared with exactly the global batch is then an error: no
//! process feeds all of it.
//!
//! An unknown dimension other than 0 is an error: the compiler plans every
//! buffer, so every size must be known. So is a batch no placeholder takes:
//! where no placeholder has an unknown dimension 0 or exactly `batch` rows
//! but one declares another number of rows, the options' batch would be
//! ignored (nothing split, every tower computing the declared rows), and
//! the error says which placeholder holds what.
//!
//! [`OpenBatch`] runs before `autodiff` in the training pipeline: it turns
//! a placeholder declared with exactly `batch` rows back into an unknown
//! batch, so the gradients count the batch in the graph (a mean's divisor,
//! a reshape's `-1`) instead of baking in the global rows that `split`
//! later divides across towers.
//!
//! A placeholder whose declared rows merely equal the batch but whose
//! axis 0 is not the examples' (TF1's `tf.placeholder([VOCAB, DIM])`
//! embedding table read by a gather, a `[CLASSES]` scale broadcast along
//! the last axis, a matrix multiplied from the right) is neither opened nor
//! split: [`rows_on_axis_0`] reads that from its consumers.

use towers_graph::{Graph, NodeId, Op};

use crate::manager::Pass;
use crate::split::ProcessShare;
use crate::state::{CompileState, PassError};

/// Bind the global batch size (see the module docs).
#[derive(Debug, Clone)]
pub struct BindBatch {
    pub batch: usize,
    /// With several processes: how the global batch divides over them.
    pub share: Option<ProcessShare>,
}

impl BindBatch {
    /// Bind `batch` rows (one process).
    pub fn new(batch: usize) -> BindBatch {
        BindBatch { batch, share: None }
    }
}

impl Pass for BindBatch {
    fn name(&self) -> &'static str {
        "bind_batch"
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        if self.batch == 0 {
            return Err(PassError::Options("the global batch size must be at least 1".into()));
        }
        let rows = match &self.share {
            Some(share) => share.rows(self.batch)?.len(),
            None => self.batch,
        };
        let mut batch_inputs = Vec::new();
        // Placeholders declaring another number of rows than the batch.
        let mut fixed = Vec::new();
        for id in g.node_ids() {
            let node = g.node(id);
            let Op::Placeholder { dtype, shape } = &node.op else {
                continue;
            };
            let (dtype, mut shape) = (*dtype, shape.clone());
            if shape.rank() == 0 {
                continue;
            }
            for (i, d) in shape.0.iter().enumerate().skip(1) {
                if d.is_none() {
                    return Err(PassError::Options(format!(
                        "placeholder '{}' has shape {shape} with unknown dimension {i}; only dimension 0 (the batch) may be unknown: give the other dimensions when creating it",
                        node.name
                    )));
                }
            }
            match shape.0[0] {
                None => {
                    shape.0[0] = Some(rows);
                    batch_inputs.push(node.name.clone());
                }
                Some(b) if b == self.batch && self.share.is_some() => {
                    return Err(PassError::Options(format!(
                        "placeholder '{}' is declared with the global batch of {b} rows, but with several processes each one feeds only its {rows} rows of it; declare its dimension 0 as unknown (None)",
                        node.name
                    )));
                }
                Some(b) if b == self.batch && rows_on_axis_0(g, id) => batch_inputs.push(node.name.clone()),
                Some(b) => fixed.push(format!("'{}' is {shape} ({b} rows)", node.name)),
            }
            g.node_mut(id).op = Op::Placeholder { dtype, shape };
        }
        if batch_inputs.is_empty() && !fixed.is_empty() {
            return Err(PassError::Options(format!(
                "the batch is {} rows but no placeholder takes it: {}; set the batch to the rows the placeholders declare, or declare their dimension 0 as unknown (None) so that they take any batch",
                self.batch,
                fixed.join(", ")
            )));
        }
        g.reinfer()?;
        st.batch_size = Some(rows);
        st.global_batch = self.share.as_ref().map(|_| self.batch);
        st.batch_inputs = batch_inputs;
        Ok(())
    }
}

/// Whether the placeholder `id`'s axis 0 can be the batch's rows, judged by
/// its consumers: not when it is a gather's table, a matmul's right operand
/// (or its left one transposed), a convolution's filter, the lower-rank
/// operand of an elementwise op (broadcasting aligns its axis 0 with a
/// later axis of the other operand), or a batched matmul's operand of
/// lower rank than its output (a shared `[D,E]`, or a batch aligned with a
/// later output axis).
pub fn rows_on_axis_0(g: &Graph, id: NodeId) -> bool {
    let rank = |n: NodeId, slot: usize| g.tensor_type(g.tensor(n, slot)).map(|t| t.shape.rank()).unwrap_or(0);
    let own = rank(id, 0);
    g.consumers(id).into_iter().all(|(c, dst, _)| {
        let ins = g.inputs(c);
        match &g.node(c).op {
            Op::Gather { .. } => dst != 0,
            Op::MatMul { transpose_a, transpose_b } => (dst == 0 && !transpose_a) || (dst == 1 && *transpose_b),
            Op::Conv2D { .. } => dst == 0,
            Op::BatchMatMul { .. } => own >= 3 && own == rank(c, 0),
            Op::Binary(_) | Op::BiasAdd => ins.iter().enumerate().all(|(i, t)| i == dst || rank(t.node, t.slot) <= own),
            _ => true,
        }
    })
}

/// Open a placeholder declared with exactly `batch` rows into an unknown
/// batch dimension (see the module docs), before `autodiff`.
#[derive(Debug, Clone)]
pub struct OpenBatch {
    pub batch: usize,
}

impl Pass for OpenBatch {
    fn name(&self) -> &'static str {
        "open_batch"
    }

    fn run(&mut self, g: &mut Graph, _st: &mut CompileState) -> Result<(), PassError> {
        let mut opened = false;
        for id in g.node_ids() {
            if let Op::Placeholder { dtype, shape } = &g.node(id).op {
                if shape.rank() > 0 && shape.0[0] == Some(self.batch) && rows_on_axis_0(g, id) {
                    let (dtype, mut shape) = (*dtype, shape.clone());
                    shape.0[0] = None;
                    g.node_mut(id).op = Op::Placeholder { dtype, shape };
                    opened = true;
                }
            }
        }
        if opened {
            g.reinfer()?;
        }
        Ok(())
    }
}
