//! The `autodiff` pass: [`super::gradients`] over the compile state.
//!
//! Reads `st.loss` and `st.var_list` (empty: the trainable variables), writes
//! `st.grads` and warns about every variable with no path to the loss.

use towers_graph::Graph;

use crate::manager::Pass;
use crate::state::{CompileState, PassError, TensorRef};

/// Differentiates the loss with respect to the variables to train.
#[derive(Debug, Default, Clone)]
pub struct Autodiff;

impl Pass for Autodiff {
    fn name(&self) -> &'static str {
        "autodiff"
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        let loss = st.loss.as_ref().ok_or_else(|| PassError::MissingState {
            pass: "autodiff".into(),
            what: "a loss (CompileState::loss)".into(),
            after: "building the model and setting its loss".into(),
        })?;
        let loss = loss.resolve(g)?;
        let vars = if st.var_list.is_empty() {
            g.trainable_variables()
        } else {
            st.var_list.iter().map(|v| g.find(v)).collect::<Result<Vec<_>, _>>()?
        };
        if vars.is_empty() {
            return Err(PassError::NoVariables);
        }
        let res = super::gradients(g, loss, &vars)?;
        for (v, t) in &res.grads {
            st.grads.insert(v.clone(), TensorRef::of(g, *t));
        }
        if !res.unreachable.is_empty() {
            st.warn(
                "autodiff",
                format!(
                    "no gradient for variables [{}]: they have no differentiable path to the loss and will not be trained",
                    res.unreachable.join(", ")
                ),
            );
        }
        Ok(())
    }
}
