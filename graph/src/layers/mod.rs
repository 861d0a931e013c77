//! Layers built from ops and `get_variable` with TF1's options, as slim and
//! `tf.layers` had them.
//!
//! - [`dense_with`], [`conv2d_with`], [`batch_norm_with`], [`max_pool2d`],
//!   [`avg_pool2d`], [`dropout_with`]: each takes an options struct
//!   ([`DenseOptions`], [`Conv2dOptions`], ...) with builder-style setters;
//! - [`GraphBuilder::arg_scope`](crate::GraphBuilder::arg_scope) with
//!   [`LayerDefaults`]: slim's `arg_scope`, nested scopes override outer ones;
//! - [`Naming`]: slim's names (`weights`/`biases`, scopes `Conv`,
//!   `fully_connected`, `BatchNorm`) or `tf.layers`' (`kernel`/`bias`,
//!   automatic `conv2d`, `conv2d_1`, `dense`, ...), each with its API's
//!   defaults;
//! - [`dense`], [`conv2d`], [`batch_norm`]: the short forms with an explicit
//!   name, kept for the models and tests written against them.
//!
//! Invariants: each layer opens one variable scope (its name), so its
//! variables are `<scope>/<layer>/<var>` and reuse follows the enclosing
//! variable scope; a normalizer is built in a sub-scope of its layer and
//! replaces the bias; every bad option is a
//! [`GraphError::LayerOption`](crate::GraphError::LayerOption) naming the
//! layer's path, checked before anything is added to the graph.

mod core;
mod layer_norm;
mod norm;
mod options;
mod pool;
mod scope;

pub use self::core::{conv2d_with, dense_with};
pub use layer_norm::layer_norm;
pub use norm::batch_norm_with;
pub use options::{
    BatchNormOptions, Conv2dOptions, DenseOptions, LayerDefaults, Naming, Normalizer, Pool2dOptions, Regularizer,
};
pub use pool::{avg_pool2d, dropout_with, max_pool2d, DropoutOptions};

use crate::builder::GraphBuilder;
use crate::error::Result;
use crate::graph::Tensor;
use crate::op::Padding;

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

/// A fully connected layer `act(x·weights + biases)` named `name`:
/// [`dense_with`] with `DenseOptions::new(units).name(name).activation(act)`
/// (glorot-uniform weights, zero biases unless an `arg_scope` says otherwise).
pub fn dense(b: &mut GraphBuilder, name: &str, x: Tensor, units: usize, act: Activation) -> Result<Tensor> {
    dense_with(b, x, &DenseOptions::new(units).name(name).activation(act))
}

/// A 2-D convolution layer (NHWC, HWIO filters), stride 1, named `name`:
/// [`conv2d_with`] with the given filters, kernel, padding and activation.
pub fn conv2d(
    b: &mut GraphBuilder,
    name: &str,
    x: Tensor,
    filters: usize,
    kernel: [usize; 2],
    padding: Padding,
    act: Activation,
) -> Result<Tensor> {
    conv2d_with(b, x, &Conv2dOptions::new(filters, kernel).name(name).padding(padding).activation(act))
}

/// Batch normalization named `name` with both `beta` and `gamma`:
/// [`batch_norm_with`] with `center` and `scale` on.
pub fn batch_norm(b: &mut GraphBuilder, name: &str, x: Tensor, decay: f32, epsilon: f32) -> Result<Tensor> {
    let opts = BatchNormOptions::new().name(name).decay(decay).epsilon(epsilon).center(true).scale(true);
    batch_norm_with(b, x, &opts)
}
