//! Layers without variables: pools and dropout, named like the weighted
//! layers (`MaxPool2D`/`max_pooling2d`, `Dropout`/`dropout`, uniquified), with
//! their options checked.

use crate::builder::GraphBuilder;
use crate::error::Result;
use crate::graph::Tensor;
use crate::op::Padding;

use super::options::Pool2dOptions;
use super::scope::{Kind, LayerScope};

fn pool(b: &mut GraphBuilder, x: Tensor, opts: &Pool2dOptions, kind: Kind) -> Result<Tensor> {
    let d = b.layer_defaults();
    let naming = d.naming.unwrap_or_default();
    let padding = opts.padding.or(d.padding).unwrap_or(Padding::Valid);
    let ls = LayerScope::new(b, kind, naming, opts.name.as_deref());
    if opts.pool_size.contains(&0) {
        return Err(ls.err("pool_size", format!("must be at least 1 in each dimension, got {:?}", opts.pool_size)));
    }
    if opts.strides.contains(&0) {
        return Err(ls.err("strides", format!("must be at least 1 in each dimension, got {:?}", opts.strides)));
    }
    let rank = b.graph().tensor_type(x)?.shape.rank();
    if rank != 4 {
        return Err(ls.err("input", format!("must be NHWC (rank 4), got rank {rank}")));
    }
    ls.enter(b, |b| match kind {
        Kind::AvgPool => b.avg_pool(x, opts.pool_size, opts.strides, padding),
        _ => b.max_pool(x, opts.pool_size, opts.strides, padding),
    })
}

/// Max pooling over NHWC: slim's `max_pool2d`, TF's `tf.layers.max_pooling2d`.
/// Padding: the option, else the `arg_scope`'s, else VALID.
pub fn max_pool2d(b: &mut GraphBuilder, x: Tensor, opts: &Pool2dOptions) -> Result<Tensor> {
    pool(b, x, opts, Kind::MaxPool)
}

/// Average pooling over NHWC: slim's `avg_pool2d`, TF's `tf.layers.average_pooling2d`.
pub fn avg_pool2d(b: &mut GraphBuilder, x: Tensor, opts: &Pool2dOptions) -> Result<Tensor> {
    pool(b, x, opts, Kind::AvgPool)
}

/// Options of [`dropout_with`].
#[derive(Debug, Clone, PartialEq)]
pub struct DropoutOptions {
    /// The probability of dropping a unit, in `[0, 1)` (slim's
    /// `keep_prob` is `1 - rate`).
    pub rate: f32,
    pub name: Option<String>,
}

impl DropoutOptions {
    pub fn new(rate: f32) -> DropoutOptions {
        DropoutOptions { rate, name: None }
    }
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }
}

/// Dropout as a layer: slim's `dropout`, TF's `tf.layers.dropout`. It is
/// [`GraphBuilder::dropout`] in the layer's scope (so its op seed derives
/// from the graph seed and the op name, and it is the identity in eval
/// programs, TF's `training=False`).
pub fn dropout_with(b: &mut GraphBuilder, x: Tensor, opts: &DropoutOptions) -> Result<Tensor> {
    let naming = b.layer_defaults().naming.unwrap_or_default();
    let ls = LayerScope::new(b, Kind::Dropout, naming, opts.name.as_deref());
    if !(0.0..1.0).contains(&opts.rate) {
        return Err(ls.err("rate", format!("must be in [0, 1), got {} (slim's keep_prob is 1 - rate)", opts.rate)));
    }
    ls.enter(b, |b| b.dropout(x, opts.rate))
}
