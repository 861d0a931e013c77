//! The `autodiff` pass: [`super::gradients`] over the compile state.
//!
//! Reads `st.loss` and `st.var_list` (empty: the trainable variables), writes
//! `st.grads` and warns about every variable with no path to the loss. With
//! a user's `var_list` (`st.requested_vars`) only those variables are
//! differentiated, and none reached is `NoGradients` naming the whole list
//! ([`crate::var_list::check_reached`]).

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
        let loss = st.loss.clone().ok_or_else(|| PassError::MissingState {
            pass: "autodiff".into(),
            what: "a loss (CompileState::loss)".into(),
            after: "building the model and setting its loss".into(),
        })?;
        let loss_name = loss.node.clone();
        crate::var_list::check_reached(st, &loss_name)?;
        let loss = loss.resolve(g)?;
        let vars = if st.var_list.is_empty() {
            g.trainable_variables()
        } else {
            st.var_list.iter().map(|v| g.find(v)).collect::<Result<Vec<_>, _>>()?
        };
        super::check_loss(g, loss)?;
        if vars.is_empty() {
            return Err(PassError::LossReachesNoVariable { loss: loss_name });
        }
        let res = super::gradients(g, loss, &vars).map_err(|e| match e {
            // Name the list the user gave, not only what prune left of it.
            PassError::NoGradients { loss, .. } if !st.requested_vars.is_empty() => {
                PassError::NoGradients { loss, vars: st.requested_vars.join(", "), cut: String::new() }
            }
            e => e,
        })?;
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
