//! Optimizer application (TF's `apply_gradients` with a `global_step`), and
//! the `apply` pass.
//!
//! Invariants of the graph this builds:
//! - one `ApplyGradient` node per variable, named
//!   `<Optimizer>/update_<var>/Apply<...>` (`Adam/update_fc1/weights/ApplyAdam`),
//!   with inputs (variable, slots..., grad, global_step, learning_rate) and
//!   the variable's requested device;
//! - `learning_rate` (f32 scalar, not trainable, initialized to the
//!   optimizer's `lr`) is reused if present: the one learning rate every
//!   update reads each step, so a schedule writes it on the host between
//!   steps (`Session::write_variable`) without recompiling;
//! - slot variables are created here, named as TF names them (`<var>/Momentum`,
//!   `<var>/Adam`, `<var>/Adam_1`, `<var>/RMSProp`, `<var>/RMSProp_1`,
//!   `<var>/Adagrad`): initialized as TF1 does (`Optimizer::slot_initializers`:
//!   zeros, RMSProp's ms ones, Adagrad's accumulator 0.1), not trainable, in the global
//!   variables collection, on their variable's requested device;
//! - `global_step` (i32 scalar, zeros, not trainable) is reused if present;
//!   exactly one `IncrementStep` node (`<Optimizer>/IncrementStep`) increments
//!   it, with a control edge from every apply (TF's `_finish`), so every apply
//!   reads the step before the increment (Adam uses t = global_step + 1);
//! - one `train_op` NoOp has control inputs on every apply, the increment and
//!   every node of the `update_ops` collection, and is in the `train_op`
//!   collection.

use towers_graph::{keys, DType, Graph, Initializer, NewNode, NodeId, Op, Optimizer, Tensor, F32};

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
    if grads.is_empty() {
        return Err(PassError::NoVariables);
    }
    let global_step = global_step(g)?;
    let learning_rate = learning_rate(g, opt)?;
    let opt_name = opt.name();
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
        inputs.push(Tensor::new(global_step, 0));
        inputs.push(Tensor::new(learning_rate, 0));
        let op = Op::ApplyGradient { optimizer: opt.clone() };
        let name = g.unique_name(&format!("{opt_name}/update_{var_name}/{}", op.type_name()));
        let mut n = NewNode::new(name, op, inputs);
        n.requested_device = dev;
        applies.push(g.add(n)?);
    }
    let mut inc = NewNode::new(
        g.unique_name(&format!("{opt_name}/IncrementStep")),
        Op::IncrementStep,
        vec![Tensor::new(global_step, 0)],
    );
    inc.control_inputs = applies.clone();
    inc.requested_device = g.node(global_step).requested_device.clone();
    let inc = g.add(inc)?;

    let mut deps = applies.clone();
    deps.push(inc);
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

/// The `global_step` variable, created (i32 scalar, zeros, not trainable) if missing.
fn global_step(g: &mut Graph) -> Result<NodeId, PassError> {
    if let Some(id) = g.get("global_step") {
        return match &g.node(id).op {
            Op::Variable { dtype: DType::I32, shape, .. } if shape.is_empty() => Ok(id),
            _ => Err(PassError::Options(
                "a node named 'global_step' exists but is not an i32 scalar variable; rename it".into(),
            )),
        };
    }
    let op = Op::Variable { dtype: DType::I32, shape: vec![], init: Initializer::Zeros, trainable: false };
    let id = g.add(NewNode::new("global_step", op, vec![]))?;
    g.add_to_collection(keys::GLOBAL_VARIABLES, "global_step");
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

/// The `learning_rate` variable, created (f32 scalar, the optimizer's `lr`,
/// not trainable) if missing.
fn learning_rate(g: &mut Graph, opt: &Optimizer) -> Result<NodeId, PassError> {
    if let Some(id) = g.get(LEARNING_RATE) {
        return match &g.node(id).op {
            Op::Variable { dtype: DType::F32, shape, .. } if shape.is_empty() => Ok(id),
            _ => Err(PassError::Options(format!(
                "a node named '{LEARNING_RATE}' exists but is not an f32 scalar variable; rename it"
            ))),
        };
    }
    let lr = rate_of(opt);
    let op = Op::Variable { dtype: DType::F32, shape: vec![], init: Initializer::Constant(lr), trainable: false };
    let id = g.add(NewNode::new(LEARNING_RATE, op, vec![]))?;
    g.add_to_collection(keys::GLOBAL_VARIABLES, LEARNING_RATE);
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
        let res = apply_gradients(g, &grads, &self.optimizer)?;
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
