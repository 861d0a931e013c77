//! Batch normalization with `center`/`scale`, decay and epsilon: slim's
//! `batch_norm`, TF's `tf.layers.batch_normalization`.
//!
//! Without `scale` the `FusedBatchNorm` op reads a constant of ones for
//! gamma, without `center` a constant of zeros for beta (as slim's fused
//! batch norm does): no variable is created, and autodiff's gradients for
//! those inputs reach a constant and are dropped, so the gradient of `x`
//! is the one of `x * 1 + 0` (checked by finite differences in
//! `passes/src/autodiff/tests/rules.rs`).

use crate::builder::{GraphBuilder, VariableOptions};
use crate::error::Result;
use crate::graph::{keys, Tensor};
use crate::op::{Initializer, Op};
use crate::types::{DType, F32};

use super::options::{BatchNormOptions, Naming};
use super::scope::{Kind, LayerScope};

/// Batch normalization over all but the last axis with TF's options:
/// variables `beta` (with `center`), `gamma` (with `scale`) (trainable),
/// `moving_mean`, `moving_variance` (not trainable), and two moving-average
/// updates in `UPDATE_OPS`. Unset options come from the `arg_scope`s'
/// [`super::LayerDefaults::batch_norm`], then the style: slim's decay 0.999,
/// `center`, no `scale`; tf.layers' momentum 0.99, `center`, `scale`; both
/// epsilon 0.001.
pub fn batch_norm_with(b: &mut GraphBuilder, x: Tensor, opts: &BatchNormOptions) -> Result<Tensor> {
    let d = b.layer_defaults();
    let naming = d.naming.unwrap_or_default();
    let p = opts.over(&d.batch_norm);
    batch_norm_resolved(b, x, &p, naming)
}

/// Batch norm with `p` already merged over the scopes' defaults.
pub(crate) fn batch_norm_resolved(
    b: &mut GraphBuilder,
    x: Tensor,
    p: &BatchNormOptions,
    naming: Naming,
) -> Result<Tensor> {
    let ls = LayerScope::new(b, Kind::BatchNorm, naming, p.name.as_deref());
    let decay = p.decay.unwrap_or(match naming {
        Naming::Slim => 0.999,
        Naming::TfLayers => 0.99,
    });
    if !(0.0..=1.0).contains(&decay) {
        return Err(ls.err("decay", format!("must be in [0, 1], got {decay}")));
    }
    let epsilon = p.epsilon.unwrap_or(1e-3);
    if !(epsilon.is_finite() && epsilon > 0.0) {
        return Err(ls.err("epsilon", format!("must be finite and > 0, got {epsilon}")));
    }
    let center = p.center.unwrap_or(true);
    let scale = p.scale.unwrap_or(naming == Naming::TfLayers);
    let shape = b.graph().tensor_type(x)?.shape.clone();
    let c = match shape.rank().checked_sub(1).and_then(|r| if r == 0 { None } else { shape.dim(r) }) {
        Some(c) => c,
        None => return Err(ls.err("input", format!("must have rank >= 2 with a known last axis, got {shape}"))),
    };
    ls.enter(b, |b| {
        let var = |b: &mut GraphBuilder, name: &str, init: Initializer| b.get_variable(name, [c], init);
        // The variables in each API's creation order.
        let (gamma, beta) = match naming {
            Naming::Slim => {
                let beta = center.then(|| var(b, "beta", Initializer::Zeros)).transpose()?;
                (scale.then(|| var(b, "gamma", Initializer::Ones)).transpose()?, beta)
            }
            Naming::TfLayers => {
                let gamma = scale.then(|| var(b, "gamma", Initializer::Ones)).transpose()?;
                (gamma, center.then(|| var(b, "beta", Initializer::Zeros)).transpose()?)
            }
        };
        let fixed = VariableOptions { trainable: false, ..Default::default() };
        let mean = b.get_variable_with("moving_mean", [c], Initializer::Zeros, fixed.clone())?;
        let var = b.get_variable_with("moving_variance", [c], Initializer::Ones, fixed)?;
        let gamma = match gamma {
            Some(g) => g,
            None => b.constant("Const", DType::F32, &[c], &vec![1.0; c])?,
        };
        let beta = match beta {
            Some(v) => v,
            None => b.constant("Const", DType::F32, &[c], &vec![0.0; c])?,
        };
        let bn = b.op("FusedBatchNorm", Op::BatchNorm { epsilon: F32(epsilon) }, &[x, gamma, beta, mean, var])?;
        let upd_mean =
            b.op("AssignMovingAvg", Op::AssignMovingAverage { decay: F32(decay) }, &[mean, b.tensor(bn, 1)])?;
        let upd_var =
            b.op("AssignMovingAvg", Op::AssignMovingAverage { decay: F32(decay) }, &[var, b.tensor(bn, 3)])?;
        b.add_to_collection(keys::UPDATE_OPS, upd_mean);
        b.add_to_collection(keys::UPDATE_OPS, upd_var);
        Ok(b.tensor(bn, 0))
    })
}
