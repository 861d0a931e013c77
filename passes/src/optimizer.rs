//! Optimizer application (TF's `apply_gradients` with a `global_step`), and
//! the `apply` pass.
//!
//! Invariants of the graph this builds:
//! - one `ApplyGradient` node per variable, named
//!   `<Optimizer>/update_<var>/Apply<...>` (`Adam/update_fc1/weights/ApplyAdam`),
//!   with inputs (variable, slots..., grad, step, learning_rate) and
//!   the variable's requested device;
//! - `learning_rate` (f32 scalar, not trainable, initialized to the
//!   optimizer's `lr`) is reused if present: the one learning rate every
//!   unnamed optimizer's update reads each step, so a schedule writes it on
//!   the host between steps (`Session::write_variable`) without recompiling;
//! - slot variables are created here, named as TF names them (`<var>/Momentum`,
//!   `<var>/Adam`, `<var>/Adam_1`, `<var>/RMSProp`, `<var>/RMSProp_1`,
//!   `<var>/Adagrad`): initialized as TF1 does (`Optimizer::slot_initializers`:
//!   zeros, RMSProp's ms ones, Adagrad's accumulator 0.1), not trainable, in the global
//!   variables collection, on their variable's requested device;
//! - `global_step` (i32 scalar, zeros, not trainable) is reused if present;
//!   one `IncrementStep` node (`<Optimizer>/IncrementStep`) increments
//!   it, with a control edge from every apply (TF's `_finish`), so every apply
//!   reads the step before the increment (Adam uses t = step + 1);
//! - an optimizer given a name ([`apply_gradients_named`],
//!   `CompileOptions::optimizer_name`, TF1's `AdamOptimizer(name=..)`) puts
//!   `<name>` where the optimizer's type name stands above (nodes
//!   `<name>/update_..`, slots `<var>/<name>`, `<var>/<name>_1`), reads its
//!   own rate `<name>/learning_rate`, and Adam's step is its own
//!   `<name>/step`, incremented beside `global_step` by a second
//!   `IncrementStep`: two programs of one session, each with its optimizer,
//!   share neither rate nor bias correction;
//! - one `train_op` NoOp has control inputs on every apply, the increments and
//!   every node of the `update_ops` collection, and is in the `train_op`
//!   collection.

use towers_graph::{
    keys, learning_rate_name, optimizer_step_name, DType, Graph, Initializer, NewNode, NodeId, Op, Optimizer, Tensor,
    F32, GLOBAL_STEP,
};

use crate::manager::Pass;
use crate::state::{CompileState, PassError};

/// The nodes [`apply_gradients`] created.
#[derive(Debug, Clone, PartialEq)]
pub struct ApplyResult {
    pub train_op: NodeId,
    pub global_step: NodeId,
    /// One apply node per gradient, in the order of the gradients.
    pub applies: Vec<NodeId>,
    /// The slot variables created, by name.
    pub slots: Vec<String>,
}

/// Add the optimizer's update of every variable, the step increment and the train op.
pub fn apply_gradients(g: &mut Graph, grads: &[(String, Tensor)], opt: &Optimizer) -> Result<ApplyResult, PassError> {
    apply_gradients_named(g, grads, opt, None)
}

/// [`apply_gradients`] by an optimizer named `name` (TF1's
/// `AdamOptimizer(lr, name=name)`; `None`: the default, as
/// [`apply_gradients`]). A named optimizer reads its own rate,
/// `<name>/learning_rate`, names its slots `<var>/<name>`, `<var>/<name>_1`
/// and its nodes `<name>/update_<var>/..` as TF1 does, and, where its
/// update reads the step (Adam), counts its own updates in `<name>/step`
/// (TF1's per-optimizer beta powers); `global_step` is still incremented.
pub fn apply_gradients_named(
    g: &mut Graph,
    grads: &[(String, Tensor)],
    opt: &Optimizer,
    name: Option<&str>,
) -> Result<ApplyResult, PassError> {
    if grads.is_empty() {
        return Err(PassError::NoVariables);
    }
    if let Some(n) = name {
        check_optimizer_name(n)?;
    }
    let global_step = counter(g, GLOBAL_STEP)?;
    // The step the updates read: the optimizer's own where it has a name
    // and reads it (Adam's t), else global_step.
    let own_step = match (name, opt) {
        (Some(n), Optimizer::Adam { .. }) => Some(counter(g, &optimizer_step_name(n))?),
        _ => None,
    };
    let step = own_step.unwrap_or(global_step);
    let learning_rate = learning_rate(g, opt, &learning_rate_name(name))?;
    let opt_name = name.unwrap_or(opt.name());
    let mut applies = Vec::with_capacity(grads.len());
    let mut slots = Vec::new();
    for (var_name, grad) in grads {
        let var = g.find(var_name)?;
        let (shape, dev) = match &g.node(var).op {
            Op::Variable { shape, .. } => (shape.clone(), g.node(var).requested_device.clone()),
            other => {
                return Err(PassError::Options(format!(
                    "'{var_name}' is a {} node, not a variable; gradients can only be applied to variables",
                    other.type_name()
                )))
            }
        };
        let mut inputs = vec![Tensor::new(var, 0)];
        for (slot, init) in opt.slot_names().iter().zip(opt.slot_initializers()) {
            // TF1 names a slot after its optimizer: `Adam`, `Adam_1`, or `<name>`, `<name>_1`.
            let slot = slot.replacen(opt.name(), opt_name, 1);
            let name = format!("{var_name}/{slot}");
            let op = Op::Variable { dtype: DType::F32, shape: shape.clone(), init, trainable: false };
            let mut n = NewNode::new(name.clone(), op, vec![]);
            n.requested_device = dev.clone();
            let id = g.add(n)?;
            g.add_to_collection(keys::GLOBAL_VARIABLES, &name);
            inputs.push(Tensor::new(id, 0));
            slots.push(name);
        }
        inputs.push(*grad);
        inputs.push(Tensor::new(step, 0));
        inputs.push(Tensor::new(learning_rate, 0));
        let op = Op::ApplyGradient { optimizer: opt.clone() };
        let name = g.unique_name(&format!("{opt_name}/update_{var_name}/{}", op.type_name()));
        let mut n = NewNode::new(name, op, inputs);
        n.requested_device = dev;
        applies.push(g.add(n)?);
    }
    let mut deps = applies.clone();
    for counter in [Some(global_step), own_step].into_iter().flatten() {
        let base = if counter == global_step {
            format!("{opt_name}/IncrementStep")
        } else {
            format!("{opt_name}/IncrementOwnStep")
        };
        let mut inc = NewNode::new(g.unique_name(&base), Op::IncrementStep, vec![Tensor::new(counter, 0)]);
        inc.control_inputs = applies.clone();
        inc.requested_device = g.node(counter).requested_device.clone();
        deps.push(g.add(inc)?);
    }
    for name in g.collection(keys::UPDATE_OPS).to_vec() {
        deps.push(g.find(&name)?);
    }
    let mut train = NewNode::new(g.unique_name("train_op"), Op::NoOp, vec![]);
    train.control_inputs = deps;
    let train_op = g.add(train)?;
    let train_name = g.node(train_op).name.clone();
    g.add_to_collection(keys::TRAIN_OP, &train_name);
    Ok(ApplyResult { train_op, global_step, applies, slots })
}

/// Refuse an optimizer name that cannot prefix its variables' names.
fn check_optimizer_name(name: &str) -> Result<(), PassError> {
    towers_graph::check_node_name(name).map_err(|e| {
        PassError::Options(format!(
            "CompileOptions::optimizer_name '{name}': {e}; name the optimizer as TF1's AdamOptimizer(name=\"d_adam\")"
        ))
    })
}

/// An i32 scalar step counter named `name` (`global_step`, `<optimizer>/step`),
/// created (zeros, not trainable) if missing.
fn counter(g: &mut Graph, name: &str) -> Result<NodeId, PassError> {
    if let Some(id) = g.get(name) {
        return match &g.node(id).op {
            Op::Variable { dtype: DType::I32, shape, .. } if shape.is_empty() => Ok(id),
            _ => Err(PassError::Options(format!(
                "a node named '{name}' exists but is not an i32 scalar variable; rename it"
            ))),
        };
    }
    let op = Op::Variable { dtype: DType::I32, shape: vec![], init: Initializer::Zeros, trainable: false };
    let id = g.add(NewNode::new(name, op, vec![]))?;
    g.add_to_collection(keys::GLOBAL_VARIABLES, name);
    Ok(id)
}

/// The learning rate an optimizer was built with.
fn rate_of(opt: &Optimizer) -> F32 {
    match opt {
        Optimizer::Sgd { lr }
        | Optimizer::Momentum { lr, .. }
        | Optimizer::Adam { lr, .. }
        | Optimizer::RmsProp { lr, .. }
        | Optimizer::Adagrad { lr, .. } => *lr,
    }
}

/// The learning-rate variable `name` (`learning_rate` or
/// `<optimizer>/learning_rate`), created (f32 scalar, the optimizer's `lr`,
/// not trainable) if missing.
fn learning_rate(g: &mut Graph, opt: &Optimizer, name: &str) -> Result<NodeId, PassError> {
    if let Some(id) = g.get(name) {
        return match &g.node(id).op {
            Op::Variable { dtype: DType::F32, shape, .. } if shape.is_empty() => Ok(id),
            _ => Err(PassError::Options(format!(
                "a node named '{name}' exists but is not an f32 scalar variable; rename it"
            ))),
        };
    }
    let lr = rate_of(opt);
    let op = Op::Variable { dtype: DType::F32, shape: vec![], init: Initializer::Constant(lr), trainable: false };
    let id = g.add(NewNode::new(name, op, vec![]))?;
    g.add_to_collection(keys::GLOBAL_VARIABLES, name);
    Ok(id)
}

/// Refuse hyper-parameters no training can mean: a learning rate that is
/// negative or not finite, a momentum or decay outside [0, 1) (1 or more
/// makes the updates grow without bound; Adam's bias correction divides by
/// `1 - beta^t`), an epsilon or Adagrad accumulator that is not above 0
/// (a zero gradient would divide 0 by 0).
pub fn check_hyperparameters(opt: &Optimizer) -> Result<(), PassError> {
    let name = match opt {
        Optimizer::Sgd { .. } => "Sgd",
        Optimizer::Momentum { .. } => "Momentum",
        Optimizer::Adam { .. } => "Adam",
        Optimizer::RmsProp { .. } => "RmsProp",
        Optimizer::Adagrad { .. } => "Adagrad",
    };
    let bad = |field: &str, v: f32, want: &str| {
        Err(PassError::Options(format!("Optimizer::{name} {{ {field}: {v} }}: {field} must be {want}")))
    };
    let unit = |field: &str, v: F32| {
        if v.0.is_finite() && (0.0..1.0).contains(&v.0) {
            Ok(())
        } else {
            bad(field, v.0, "in [0, 1) (0.9 is usual; 1 or more makes the updates grow without bound)")
        }
    };
    let positive = |field: &str, v: F32| {
        if v.0.is_finite() && v.0 > 0.0 {
            Ok(())
        } else {
            bad(field, v.0, "a finite number above 0")
        }
    };
    let lr = rate_of(opt);
    if !lr.0.is_finite() || lr.0 < 0.0 {
        return bad("lr", lr.0, "a finite number, 0 or above");
    }
    match opt {
        Optimizer::Sgd { .. } => Ok(()),
        Optimizer::Momentum { momentum, .. } => unit("momentum", *momentum),
        Optimizer::Adam { beta1, beta2, epsilon, .. } => {
            unit("beta1", *beta1)?;
            unit("beta2", *beta2)?;
            positive("epsilon", *epsilon)
        }
        Optimizer::RmsProp { decay, momentum, epsilon, .. } => {
            unit("decay", *decay)?;
            unit("momentum", *momentum)?;
            positive("epsilon", *epsilon)
        }
        Optimizer::Adagrad { initial_accumulator_value, .. } => {
            positive("initial_accumulator_value", *initial_accumulator_value)
        }
    }
}

/// The name of the learning-rate variable every optimizer update reads.
pub use towers_graph::LEARNING_RATE;

/// The `apply` pass: reads `st.grads`, sets the program record's `train_op` and `fetches["loss"]`.
#[derive(Debug, Clone)]
pub struct ApplyOptimizer {
    pub optimizer: Optimizer,
    /// Clip the gradients to this global norm first ([`crate::clip`]).
    pub clip_global_norm: Option<f32>,
    /// The optimizer's name (`CompileOptions::optimizer_name`), see [`apply_gradients_named`].
    pub name: Option<String>,
}

impl Pass for ApplyOptimizer {
    fn name(&self) -> &'static str {
        "apply"
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        check_hyperparameters(&self.optimizer)?;
        if st.grads.is_empty() {
            return Err(PassError::MissingState {
                pass: "apply".into(),
                what: "gradients (CompileState::grads)".into(),
                after: "autodiff (and grad_mean when replicating)".into(),
            });
        }
        // Variables in var_list order first, then any others by name.
        let mut names: Vec<&String> = st.var_list.iter().filter(|v| st.grads.contains_key(*v)).collect();
        names.extend(st.grads.keys().filter(|k| !st.var_list.contains(k)));
        let grads = names
            .into_iter()
            .map(|v| Ok((v.clone(), st.grads[v].resolve(g)?)))
            .collect::<Result<Vec<_>, PassError>>()?;
        let grads = match self.clip_global_norm {
            Some(clip) => crate::clip::clip_by_global_norm(g, &grads, clip)?,
            None => grads,
        };
        let res = apply_gradients_named(g, &grads, &self.optimizer, self.name.as_deref())?;
        let train_op = g.node(res.train_op).name.clone();
        let program = g.program_mut();
        program.train_op = Some(train_op);
        if let (false, Some(loss)) = (program.fetches.contains_key("loss"), st.loss.clone()) {
            program.fetches.insert("loss".into(), loss);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "autodiff/tests/optimizer_tests.rs"]
mod tests;
