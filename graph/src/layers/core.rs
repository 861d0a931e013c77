//! `dense_with` and `conv2d_with`: a weighted layer with TF's options.
//!
//! Graph order (kept by the snapshot tests): the weights variable, the bias
//! variable (unless `use_bias` is off or a normalizer is given), the product,
//! `BiasAdd`, the normalizer in a sub-scope, the activation.

use crate::builder::{GraphBuilder, VariableOptions};
use crate::error::Result;
use crate::graph::Tensor;
use crate::op::{Initializer, Padding};
use crate::types::Shape;

use super::norm::batch_norm_resolved;
use super::options::{Conv2dOptions, DenseOptions, LayerDefaults, Naming, Normalizer, Regularizer};
use super::scope::{Kind, LayerScope};
use super::{activate, Activation};

/// A weighted layer's options after resolving call > scopes > style.
struct Resolved {
    naming: Naming,
    activation: Activation,
    weights_init: Initializer,
    biases_init: Initializer,
    weights_l2: Option<f32>,
    biases_l2: Option<f32>,
    use_bias: bool,
    normalizer: Normalizer,
    padding: Padding,
    defaults: LayerDefaults,
}

/// The style's own defaults for what no scope set.
fn resolve(ls: &LayerScope, d: LayerDefaults) -> Result<Resolved> {
    let naming = d.naming.unwrap_or_default();
    let weights_init = d.weights_initializer.clone().unwrap_or(Initializer::GlorotUniform);
    let biases_init = d.biases_initializer.clone().unwrap_or(Initializer::Zeros);
    check_initializer(ls, "weights_initializer", &weights_init)?;
    check_initializer(ls, "biases_initializer", &biases_init)?;
    let normalizer = d.normalizer.clone().unwrap_or_default();
    Ok(Resolved {
        naming,
        activation: d.activation.unwrap_or(match naming {
            Naming::Slim => Activation::Relu,
            Naming::TfLayers => Activation::None,
        }),
        weights_init,
        biases_init,
        weights_l2: l2_scale(ls, "weights_regularizer", d.weights_regularizer)?,
        biases_l2: l2_scale(ls, "biases_regularizer", d.biases_regularizer)?,
        use_bias: normalizer == Normalizer::None && d.use_bias.unwrap_or(true),
        normalizer,
        padding: d.padding.unwrap_or(match naming {
            Naming::Slim => Padding::Same,
            Naming::TfLayers => Padding::Valid,
        }),
        defaults: d,
    })
}

/// The l2 scale of a regularizer, checked: finite and not negative.
pub(crate) fn l2_scale(ls: &LayerScope, option: &str, r: Option<Regularizer>) -> Result<Option<f32>> {
    match r {
        None | Some(Regularizer::None) => Ok(None),
        Some(Regularizer::L2(s)) if s.is_finite() && s >= 0.0 => Ok(Some(s)),
        Some(Regularizer::L2(s)) => {
            Err(ls.err(option, format!("l2 scale must be finite and >= 0, got {s} (use Regularizer::None for none)")))
        }
    }
}

fn check_initializer(ls: &LayerScope, option: &str, init: &Initializer) -> Result<()> {
    let bad = match init {
        Initializer::Constant(v) => (!v.0.is_finite()).then(|| format!("constant {} is not finite", v.0)),
        Initializer::TruncatedNormal { mean, stddev } => {
            (!(mean.0.is_finite() && stddev.0.is_finite() && stddev.0 > 0.0)).then(|| {
                format!("truncated normal needs a finite mean and stddev > 0, got mean {} stddev {}", mean.0, stddev.0)
            })
        }
        Initializer::RandomUniform { min, max } => (!(min.0.is_finite() && max.0.is_finite() && min.0 < max.0))
            .then(|| format!("random uniform needs finite min < max, got [{}, {})", min.0, max.0)),
        Initializer::RandomNormal { mean, stddev } => (!(mean.0.is_finite() && stddev.0.is_finite() && stddev.0 > 0.0))
            .then(|| {
                format!("random normal needs a finite mean and stddev > 0, got mean {} stddev {}", mean.0, stddev.0)
            }),
        Initializer::VarianceScaling { scale, .. } => (!(scale.0.is_finite() && scale.0 > 0.0))
            .then(|| format!("variance scaling needs a finite scale > 0 (TF's ValueError), got {}", scale.0)),
        _ => None,
    };
    match bad {
        Some(detail) => Err(ls.err(option, detail)),
        None => Ok(()),
    }
}

/// Names of the weights and the bias in a style.
fn var_names(naming: Naming) -> (&'static str, &'static str) {
    match naming {
        Naming::Slim => ("weights", "biases"),
        Naming::TfLayers => ("kernel", "bias"),
    }
}

/// The bias (if any), the product `product(b, x, w)`, the normalizer and the
/// activation, inside the layer's scope.
fn weighted(
    b: &mut GraphBuilder,
    ls: &LayerScope,
    r: &Resolved,
    weights_shape: Vec<usize>,
    out: usize,
    product: impl FnOnce(&mut GraphBuilder, Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let (wn, bn) = var_names(r.naming);
    ls.enter(b, |b| {
        let wopts = VariableOptions { l2_regularizer: r.weights_l2, ..Default::default() };
        let w = b.get_variable_with(wn, Shape::known(&weights_shape), r.weights_init.clone(), wopts)?;
        let bias = if r.use_bias {
            let bopts = VariableOptions { l2_regularizer: r.biases_l2, ..Default::default() };
            Some(b.get_variable_with(bn, [out], r.biases_init.clone(), bopts)?)
        } else {
            None
        };
        let mut y = product(b, w)?;
        if let Some(bias) = bias {
            y = b.bias_add(y, bias)?;
        }
        if let Normalizer::BatchNorm(p) = &r.normalizer {
            y = batch_norm_resolved(b, y, &p.over(&r.defaults.batch_norm), r.naming)?;
        }
        activate(b, y, r.activation)
    })
}

/// A fully connected layer `act(norm(x·W + b))` with TF's options: slim's
/// `fully_connected`, TF's `tf.layers.dense` (by [`Naming`]). `x` is
/// `[batch, in]` with `in` known, or of higher rank `[batch, d1, ..., in]`
/// with every dimension but the batch known: as TF's, the layer then
/// applies to the last axis (`Tensordot`: reshaped to `[-1, in]`,
/// multiplied, reshaped to `[batch, d1, ..., units]`).
pub fn dense_with(b: &mut GraphBuilder, x: Tensor, opts: &DenseOptions) -> Result<Tensor> {
    let d = opts.args.over(b.layer_defaults());
    let ls = LayerScope::new(b, Kind::Dense, d.naming.unwrap_or_default(), opts.name.as_deref());
    if opts.units == 0 {
        return Err(ls.err("units", "must be at least 1, got 0"));
    }
    let shape = b.graph().tensor_type(x)?.shape.clone();
    let rank = shape.rank();
    let inner: Option<Vec<usize>> = (1..rank).map(|i| shape.dim(i)).collect();
    let (in_dim, inner) = match (rank, inner) {
        (2, Some(inner)) => (inner[0], None),
        (r, Some(inner)) if r > 2 => (inner[r - 2], Some(inner)),
        _ => {
            return Err(ls.err(
                "input",
                format!(
                    "must be [batch, n] (or [batch, d1, ..., n]) with every dimension but the batch known, got {shape}"
                ),
            ))
        }
    };
    if d.normalizer.as_ref().is_some_and(|n| !matches!(n, Normalizer::None)) && inner.is_some() {
        return Err(ls.err("normalizer_fn", format!("applies to a rank-2 input only, got {shape}")));
    }
    let r = resolve(&ls, d)?;
    let units = opts.units as i64;
    weighted(b, &ls, &r, vec![in_dim, opts.units], opts.units, |b, w| match &inner {
        None => b.matmul(x, w),
        Some(inner) => b.name_scope("Tensordot", |b| {
            let flat = b.reshape(x, &[-1, in_dim as i64])?;
            let y = b.matmul(flat, w)?;
            let mut back: Vec<i64> = vec![-1];
            back.extend(inner[..inner.len() - 1].iter().map(|&n| n as i64));
            back.push(units);
            b.reshape(y, &back)
        }),
    })
}

/// A 2-D convolution layer (NHWC input, HWIO kernel) with TF's options:
/// slim's `conv2d`, TF's `tf.layers.conv2d` (by [`Naming`]).
pub fn conv2d_with(b: &mut GraphBuilder, x: Tensor, opts: &Conv2dOptions) -> Result<Tensor> {
    let d = opts.args.over(b.layer_defaults());
    let ls = LayerScope::new(b, Kind::Conv2d, d.naming.unwrap_or_default(), opts.name.as_deref());
    if opts.filters == 0 {
        return Err(ls.err("filters", "must be at least 1, got 0"));
    }
    if opts.kernel.contains(&0) {
        return Err(ls.err("kernel_size", format!("must be at least 1 in each dimension, got {:?}", opts.kernel)));
    }
    if opts.strides.contains(&0) {
        return Err(ls.err("strides", format!("must be at least 1 in each dimension, got {:?}", opts.strides)));
    }
    let shape = b.graph().tensor_type(x)?.shape.clone();
    let in_c = match (shape.rank(), shape.dim(3)) {
        (4, Some(c)) => c,
        _ => {
            return Err(ls.err(
                "input",
                format!("must be NHWC [batch, height, width, channels] with channels known, got {shape}"),
            ))
        }
    };
    let r = resolve(&ls, d)?;
    let (k, s, p) = (opts.kernel, opts.strides, r.padding);
    weighted(b, &ls, &r, vec![k[0], k[1], in_c, opts.filters], opts.filters, |b, w| b.conv2d(x, w, s, p))
}
