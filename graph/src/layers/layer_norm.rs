//! Layer normalization: TF1's `tf.contrib.layers.layer_norm`.
//!
//! Each example is normalized over the axes from `begin_norm_axis` to the
//! last (1: everything but the batch; -1: the last axis, as transformers
//! use it), then scaled by `gamma` and shifted by `beta`, both of the last
//! axis's size, created as `<scope>/LayerNorm/{beta,gamma}` in TF's order.
//! Built from reductions and elementwise ops, so its gradient is autodiff's
//! and it runs on every backend. Unlike batch norm it reads no other
//! example, so N towers compute exactly one device's result.

use crate::builder::GraphBuilder;
use crate::error::Result;
use crate::graph::Tensor;
use crate::op::Initializer;

use super::scope::{Kind, LayerScope};

/// Layer normalization (see the module docs) with TF's defaults: `center`
/// and `scale` on, epsilon 1e-12; `name` overrides the scope name
/// (default `LayerNorm`, `LayerNorm_1`, ...).
///
/// ```
/// use towers_graph::{layers, DType, GraphBuilder};
/// let mut b = GraphBuilder::new();
/// let x = b.placeholder("x", DType::F32, [None, Some(5), Some(8)]).unwrap();
/// let y = layers::layer_norm(&mut b, None, x, -1).unwrap();
/// assert_eq!(b.graph().tensor_type(y).unwrap().shape.to_string(), "[?,5,8]");
/// assert!(b.graph().get("LayerNorm/gamma").is_some());
/// ```
pub fn layer_norm(b: &mut GraphBuilder, name: Option<&str>, x: Tensor, begin_norm_axis: i64) -> Result<Tensor> {
    let naming = b.layer_defaults().naming.unwrap_or_default();
    let ls = LayerScope::new(b, Kind::LayerNorm, naming, name);
    let shape = b.graph().tensor_type(x)?.shape.clone();
    let rank = shape.rank() as i64;
    let begin = if begin_norm_axis < 0 { begin_norm_axis + rank } else { begin_norm_axis };
    if rank < 2 || !(1..rank).contains(&begin) {
        return Err(ls.err(
            "begin_norm_axis",
            format!("must name an axis after the batch of a rank-{rank} input ({shape}), got {begin_norm_axis}"),
        ));
    }
    let Some(c) = shape.dim(rank as usize - 1) else {
        return Err(ls.err("input", format!("needs a known last axis, got {shape}")));
    };
    let axes: Vec<usize> = (begin as usize..rank as usize).collect();
    ls.enter(b, |b| {
        let beta = b.get_variable("beta", [c], Initializer::Zeros)?;
        let gamma = b.get_variable("gamma", [c], Initializer::Ones)?;
        let mean = b.reduce_mean(x, &axes, true)?;
        let centred = b.sub(x, mean)?;
        let sq = b.square(centred)?;
        let variance = b.reduce_mean(sq, &axes, true)?;
        b.name_scope("batchnorm", |b| {
            let eps = b.scalar(1e-12)?;
            let v = b.add(variance, eps)?;
            let inv = b.rsqrt(v)?;
            let scaled = b.mul(inv, gamma)?;
            let y = b.mul(centred, scaled)?;
            b.add(y, beta)
        })
    })
}
