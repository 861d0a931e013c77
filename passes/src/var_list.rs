//! A training program's variables: TF1's `optimizer.minimize(loss,
//! var_list=...)` ([`crate::CompileOptions::var_list`]).
//!
//! Invariants the pipeline holds with it:
//! - every name of a given list is an f32 `Variable` node of the model
//!   graph, named once; anything else is refused before any pass runs,
//!   naming it and the closest variable names (a typo must not silently
//!   train nothing, or everything);
//! - a non-trainable variable named explicitly is trained, as in TF1
//!   (`compute_gradients` takes any variable of `var_list`): the
//!   `trainable` flag only decides the default list;
//! - the program differentiates and updates only the listed variables
//!   (`autodiff` reads `CompileState::var_list`); it reads the others
//!   (a GAN's generator program reads the discriminator's weights) and
//!   leaves their bits untouched, slots included (none are created for them);
//! - a listed variable the loss does not reach is a diagnostic, and a list
//!   none of whose variables the loss reaches is
//!   [`PassError::NoGradients`] naming the whole list ([`check_reached`]),
//!   never a fallback to every trainable variable.

use std::collections::BTreeSet;

use towers_graph::{keys, suggest, DType, Graph, Op};

use crate::state::{CompileState, PassError};

/// Refuse a `var_list` naming anything but f32 variables of `g`, or a name twice.
pub fn check(g: &Graph, var_list: &[String]) -> Result<(), PassError> {
    let mut seen = BTreeSet::new();
    for name in var_list {
        if !seen.insert(name.as_str()) {
            return Err(PassError::Options(format!(
                "CompileOptions::var_list names '{name}' twice: list each variable once"
            )));
        }
        let Some(id) = g.get(name) else {
            let hint = suggest::closest(name, g.collection(keys::GLOBAL_VARIABLES).iter().map(|s| s.as_str()));
            return Err(PassError::Options(format!(
                "CompileOptions::var_list names '{name}', which is not a variable of the graph{hint} (g.trainable_variables_in_scope(\"scope/\") lists a scope's variables, TF's tf.trainable_variables(scope))"
            )));
        };
        match &g.node(id).op {
            Op::Variable { dtype: DType::F32, .. } => {}
            Op::Variable { dtype, .. } => {
                return Err(PassError::Options(format!(
                    "CompileOptions::var_list names '{name}', a {dtype} variable: only f32 variables have gradients; leave it out of the list"
                )))
            }
            other => {
                let hint =
                    suggest::closest(name, g.collection(keys::GLOBAL_VARIABLES).iter().map(|s| s.as_str()));
                return Err(PassError::Options(format!(
                    "CompileOptions::var_list names '{name}', a {} node, not a variable{hint}; list the variables to train",
                    other.type_name()
                )));
            }
        }
    }
    Ok(())
}

/// After `prune`: with a user's list, warn about the listed variables the
/// loss does not reach and refuse a list none of which it reaches
/// (TF's "No gradients provided for any variable").
pub fn check_reached(st: &mut CompileState, loss: &str) -> Result<(), PassError> {
    if st.requested_vars.is_empty() {
        return Ok(());
    }
    if st.var_list.is_empty() {
        return Err(PassError::NoGradients {
            loss: loss.to_string(),
            vars: st.requested_vars.join(", "),
            cut: String::new(),
        });
    }
    let gone: Vec<&str> = st.requested_vars.iter().filter(|v| !st.var_list.contains(v)).map(|s| s.as_str()).collect();
    if !gone.is_empty() {
        let message = format!(
            "CompileOptions::var_list names [{}], which the loss '{loss}' does not reach: they are not trained",
            gone.join(", ")
        );
        st.warn("prune", message);
    }
    Ok(())
}
