//! Layers built from ops and `get_variable`, as TF1's `tf.layers`/slim did.
//!
//! Each layer opens a variable scope of its name, so its variables are named
//! `<scope>/<layer>/weights` and `<scope>/<layer>/biases`, and reuse follows
//! the enclosing variable scope.

use crate::builder::{GraphBuilder, Reuse, VariableOptions};
use crate::error::Result;
use crate::graph::{keys, Tensor};
use crate::op::{Initializer, Op, Padding};
use crate::types::F32;

/// The activation after a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    None,
    Relu,
    Sigmoid,
    Tanh,
    /// `x * sigmoid(x)` (Ramachandran et al. 2017, TF's `tf.nn.swish`),
    /// built from `Sigmoid` and `Mul`: no op of its own, so autodiff and
    /// the compiler's elementwise fusion handle it like any user formula.
    Swish,
}

fn activate(b: &mut GraphBuilder, x: Tensor, a: Activation) -> Result<Tensor> {
    match a {
        Activation::None => Ok(x),
        Activation::Relu => b.relu(x),
        Activation::Sigmoid => b.sigmoid(x),
        Activation::Tanh => b.tanh(x),
        Activation::Swish => {
            let s = b.sigmoid(x)?;
            b.mul(x, s)
        }
    }
}

/// A fully connected layer: `act(x·weights + biases)`, glorot-uniform weights, zero biases.
pub fn dense(b: &mut GraphBuilder, name: &str, x: Tensor, units: usize, act: Activation) -> Result<Tensor> {
    let in_dim = b.graph().tensor_type(x)?.shape.dim(1);
    b.variable_scope(name, Reuse::No, |b| {
        let in_dim = in_dim.ok_or_else(|| crate::error::GraphError::Shape {
            node: format!("{}/MatMul", b.current_name_scope()),
            scope: b.current_name_scope().to_string(),
            op: "MatMul".into(),
            detail: "dense needs a known input width".into(),
        })?;
        let w = b.get_variable("weights", [in_dim, units], Initializer::GlorotUniform)?;
        let bias = b.get_variable("biases", [units], Initializer::Zeros)?;
        let y = b.matmul(x, w)?;
        let y = b.bias_add(y, bias)?;
        activate(b, y, act)
    })
}

/// A 2-D convolution layer (NHWC, HWIO filters), stride 1, with biases.
pub fn conv2d(
    b: &mut GraphBuilder,
    name: &str,
    x: Tensor,
    filters: usize,
    kernel: [usize; 2],
    padding: Padding,
    act: Activation,
) -> Result<Tensor> {
    let in_c = b.graph().tensor_type(x)?.shape.dim(3).unwrap_or(0);
    b.variable_scope(name, Reuse::No, |b| {
        let w = b.get_variable("weights", [kernel[0], kernel[1], in_c, filters], Initializer::GlorotUniform)?;
        let bias = b.get_variable("biases", [filters], Initializer::Zeros)?;
        let y = b.conv2d(x, w, [1, 1], padding)?;
        let y = b.bias_add(y, bias)?;
        activate(b, y, act)
    })
}

/// Batch normalization over all but the last axis, as slim's `batch_norm`:
/// variables `beta`, `gamma` (trainable), `moving_mean`, `moving_variance`
/// (not trainable), and two moving-average update ops in `UPDATE_OPS`.
pub fn batch_norm(b: &mut GraphBuilder, name: &str, x: Tensor, decay: f32, epsilon: f32) -> Result<Tensor> {
    let c = {
        let s = &b.graph().tensor_type(x)?.shape;
        s.dim(s.rank().saturating_sub(1)).unwrap_or(0)
    };
    b.variable_scope(name, Reuse::No, |b| {
        let beta = b.get_variable("beta", [c], Initializer::Zeros)?;
        let gamma = b.get_variable("gamma", [c], Initializer::Ones)?;
        let fixed = VariableOptions { trainable: false, ..Default::default() };
        let mean = b.get_variable_with("moving_mean", [c], Initializer::Zeros, fixed.clone())?;
        let var = b.get_variable_with("moving_variance", [c], Initializer::Ones, fixed)?;
        let bn = b.op("FusedBatchNorm", Op::BatchNorm { epsilon: F32(epsilon) }, &[x, gamma, beta, mean, var])?;
        let upd_mean =
            b.op("AssignMovingAvg", Op::AssignMovingAverage { decay: F32(decay) }, &[mean, Tensor::new(bn, 1)])?;
        let upd_var =
            b.op("AssignMovingAvg", Op::AssignMovingAverage { decay: F32(decay) }, &[var, Tensor::new(bn, 3)])?;
        b.add_to_collection(keys::UPDATE_OPS, upd_mean);
        b.add_to_collection(keys::UPDATE_OPS, upd_var);
        Ok(Tensor::new(bn, 0))
    })
}
