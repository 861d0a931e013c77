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
//! An unknown dimension other than 0 is an error: the compiler plans every
//! buffer, so every size must be known.

use towers_graph::{Graph, Op};

use crate::manager::Pass;
use crate::state::{CompileState, PassError};

/// Bind the global batch size (see the module docs).
#[derive(Debug, Clone)]
pub struct BindBatch {
    pub batch: usize,
}

impl Pass for BindBatch {
    fn name(&self) -> &'static str {
        "bind_batch"
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        if self.batch == 0 {
            return Err(PassError::Options("the global batch size must be at least 1".into()));
        }
        let mut batch_inputs = Vec::new();
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
                    shape.0[0] = Some(self.batch);
                    batch_inputs.push(node.name.clone());
                }
                Some(b) if b == self.batch => batch_inputs.push(node.name.clone()),
                Some(_) => {}
            }
            g.node_mut(id).op = Op::Placeholder { dtype, shape };
        }
        g.reinfer()?;
        st.batch_size = Some(self.batch);
        st.batch_inputs = batch_inputs;
        Ok(())
    }
}
