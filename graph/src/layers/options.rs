//! The layers' options: per-call option structs with builder-style setters,
//! and [`LayerDefaults`], the scoped defaults of [`GraphBuilder::arg_scope`]
//! (slim's `arg_scope`).
//!
//! Invariant: every option is an `Option`, unset meaning "take it from the
//! enclosing scope". A value is resolved as call > innermost `arg_scope` >
//! ... > outermost `arg_scope` > the naming style's TF default
//! ([`Naming::Slim`] or [`Naming::TfLayers`]). Setters never validate; the
//! layer validates the resolved values when it is built and returns
//! [`GraphError::LayerOption`] naming the layer.
//!
//! [`GraphBuilder::arg_scope`]: crate::GraphBuilder::arg_scope
//! [`GraphError::LayerOption`]: crate::GraphError::LayerOption

use crate::op::{Initializer, Padding};

use super::Activation;

/// Which TF1 API the layers' names follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Naming {
    /// `tf.contrib.slim`: variables `weights`/`biases`, batch norm `beta`
    /// (and `gamma` with `scale`), default scopes `Conv`, `fully_connected`,
    /// `BatchNorm`, `MaxPool2D`, `AvgPool2D`, `Dropout`. slim's defaults:
    /// ReLU activation, SAME convolutions, batch norm decay 0.999 without
    /// `scale`.
    #[default]
    Slim,
    /// `tf.layers`: variables `kernel`/`bias`, batch norm `gamma`/`beta`,
    /// automatic layer names `conv2d`, `conv2d_1`, `dense`, `dense_1`,
    /// `batch_normalization`, `max_pooling2d`, `average_pooling2d`,
    /// `dropout`. Its defaults: no activation, VALID convolutions, batch norm
    /// momentum 0.99 with `scale`.
    TfLayers,
}

/// A weight penalty added to the `regularization_losses` collection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Regularizer {
    /// No penalty (clears a default from an outer scope).
    None,
    /// `scale * l2_loss(w)` = `scale * sum(w²) / 2`, TF's
    /// `tf.contrib.layers.l2_regularizer(scale)`.
    L2(f32),
}

/// What a layer normalizes its pre-activation with (slim's `normalizer_fn`
/// and `normalizer_params`). With a normalizer the layer has no bias, as slim.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Normalizer {
    /// No normalizer (clears a default from an outer scope).
    #[default]
    None,
    /// Batch normalization with these parameters (unset ones from the scope's
    /// [`LayerDefaults::batch_norm`], then the style's defaults). It is built
    /// in a sub-scope of the layer: `conv1/BatchNorm/beta`.
    BatchNorm(BatchNormOptions),
}

/// Defaults for the layers built inside [`crate::GraphBuilder::arg_scope`];
/// also the common part of [`DenseOptions`] and [`Conv2dOptions`].
///
/// ```
/// use towers_graph::layers::{Activation, LayerDefaults, Regularizer};
/// use towers_graph::{Initializer, F32};
/// let d = LayerDefaults::new()
///     .activation(Activation::Relu)
///     .weights_initializer(Initializer::TruncatedNormal { mean: F32(0.0), stddev: F32(0.01) })
///     .weights_regularizer(Regularizer::L2(5e-4));
/// assert_eq!(d.activation, Some(Activation::Relu));
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LayerDefaults {
    pub naming: Option<Naming>,
    pub activation: Option<Activation>,
    pub weights_initializer: Option<Initializer>,
    pub biases_initializer: Option<Initializer>,
    pub weights_regularizer: Option<Regularizer>,
    pub biases_regularizer: Option<Regularizer>,
    /// Whether the layer adds a bias (ignored, as `false`, with a normalizer).
    pub use_bias: Option<bool>,
    pub normalizer: Option<Normalizer>,
    /// Padding of convolutions and pools.
    pub padding: Option<Padding>,
    /// Defaults of every batch norm, stand-alone or as a normalizer.
    pub batch_norm: BatchNormOptions,
}

impl LayerDefaults {
    pub fn new() -> LayerDefaults {
        LayerDefaults::default()
    }
    pub fn naming(mut self, n: Naming) -> Self {
        self.naming = Some(n);
        self
    }
    pub fn activation(mut self, a: Activation) -> Self {
        self.activation = Some(a);
        self
    }
    pub fn weights_initializer(mut self, i: Initializer) -> Self {
        self.weights_initializer = Some(i);
        self
    }
    pub fn biases_initializer(mut self, i: Initializer) -> Self {
        self.biases_initializer = Some(i);
        self
    }
    pub fn weights_regularizer(mut self, r: Regularizer) -> Self {
        self.weights_regularizer = Some(r);
        self
    }
    pub fn biases_regularizer(mut self, r: Regularizer) -> Self {
        self.biases_regularizer = Some(r);
        self
    }
    pub fn use_bias(mut self, on: bool) -> Self {
        self.use_bias = Some(on);
        self
    }
    pub fn normalizer(mut self, n: Normalizer) -> Self {
        self.normalizer = Some(n);
        self
    }
    pub fn padding(mut self, p: Padding) -> Self {
        self.padding = Some(p);
        self
    }
    pub fn batch_norm(mut self, bn: BatchNormOptions) -> Self {
        self.batch_norm = bn;
        self
    }

    /// These defaults over `outer`: each field set here wins.
    pub fn over(&self, outer: &LayerDefaults) -> LayerDefaults {
        LayerDefaults {
            naming: self.naming.or(outer.naming),
            activation: self.activation.or(outer.activation),
            weights_initializer: self.weights_initializer.clone().or_else(|| outer.weights_initializer.clone()),
            biases_initializer: self.biases_initializer.clone().or_else(|| outer.biases_initializer.clone()),
            weights_regularizer: self.weights_regularizer.or(outer.weights_regularizer),
            biases_regularizer: self.biases_regularizer.or(outer.biases_regularizer),
            use_bias: self.use_bias.or(outer.use_bias),
            normalizer: self.normalizer.clone().or_else(|| outer.normalizer.clone()),
            padding: self.padding.or(outer.padding),
            batch_norm: self.batch_norm.over(&outer.batch_norm),
        }
    }
}

/// Options of [`super::batch_norm_with`] (slim's `batch_norm`, TF's
/// `tf.layers.batch_normalization`).
///
/// ```
/// use towers_graph::layers::BatchNormOptions;
/// let bn = BatchNormOptions::new().decay(0.9).epsilon(1e-5).scale(true);
/// assert_eq!(bn.decay, Some(0.9));
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchNormOptions {
    /// The layer's scope name; unset: `BatchNorm` (slim) or
    /// `batch_normalization`, `batch_normalization_1`, ... (tf.layers).
    pub name: Option<String>,
    /// Moving-average decay in `[0, 1]` (tf.layers' `momentum`).
    pub decay: Option<f32>,
    /// Added to the variance, `> 0`.
    pub epsilon: Option<f32>,
    /// Add the offset `beta` (a trainable variable); off: no offset.
    pub center: Option<bool>,
    /// Multiply by `gamma` (a trainable variable); off: by one.
    pub scale: Option<bool>,
}

impl BatchNormOptions {
    pub fn new() -> BatchNormOptions {
        BatchNormOptions::default()
    }
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }
    pub fn decay(mut self, d: f32) -> Self {
        self.decay = Some(d);
        self
    }
    pub fn epsilon(mut self, e: f32) -> Self {
        self.epsilon = Some(e);
        self
    }
    pub fn center(mut self, on: bool) -> Self {
        self.center = Some(on);
        self
    }
    pub fn scale(mut self, on: bool) -> Self {
        self.scale = Some(on);
        self
    }
    /// These options over `outer`: each field set here wins (the name is
    /// never inherited).
    pub fn over(&self, outer: &BatchNormOptions) -> BatchNormOptions {
        BatchNormOptions {
            name: self.name.clone(),
            decay: self.decay.or(outer.decay),
            epsilon: self.epsilon.or(outer.epsilon),
            center: self.center.or(outer.center),
            scale: self.scale.or(outer.scale),
        }
    }
}

macro_rules! common_setters {
    () => {
        /// The layer's scope name (unset: the style's automatic name).
        pub fn name(mut self, name: &str) -> Self {
            self.name = Some(name.to_string());
            self
        }
        pub fn activation(mut self, a: Activation) -> Self {
            self.args.activation = Some(a);
            self
        }
        pub fn weights_initializer(mut self, i: Initializer) -> Self {
            self.args.weights_initializer = Some(i);
            self
        }
        pub fn biases_initializer(mut self, i: Initializer) -> Self {
            self.args.biases_initializer = Some(i);
            self
        }
        pub fn weights_regularizer(mut self, r: Regularizer) -> Self {
            self.args.weights_regularizer = Some(r);
            self
        }
        pub fn biases_regularizer(mut self, r: Regularizer) -> Self {
            self.args.biases_regularizer = Some(r);
            self
        }
        pub fn use_bias(mut self, on: bool) -> Self {
            self.args.use_bias = Some(on);
            self
        }
        pub fn normalizer(mut self, n: Normalizer) -> Self {
            self.args.normalizer = Some(n);
            self
        }
        pub fn naming(mut self, n: Naming) -> Self {
            self.args.naming = Some(n);
            self
        }
    };
}

/// Options of [`super::dense_with`] (slim's `fully_connected`, TF's `tf.layers.dense`).
///
/// ```
/// use towers_graph::layers::{Activation, DenseOptions};
/// let o = DenseOptions::new(10).name("logits").activation(Activation::None);
/// assert_eq!(o.units, 10);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DenseOptions {
    pub units: usize,
    pub name: Option<String>,
    /// Per-call values of the common options (`padding` is not used).
    pub args: LayerDefaults,
}

impl DenseOptions {
    pub fn new(units: usize) -> DenseOptions {
        DenseOptions { units, name: None, args: LayerDefaults::default() }
    }
    common_setters!();
}

/// Options of [`super::conv2d_with`] (slim's `conv2d`, TF's `tf.layers.conv2d`):
/// NHWC input, HWIO kernel.
///
/// ```
/// use towers_graph::layers::{Activation, Conv2dOptions};
/// use towers_graph::Padding;
/// let o = Conv2dOptions::new(32, [5, 5]).padding(Padding::Same).activation(Activation::Relu);
/// assert_eq!(o.strides, [1, 1]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Conv2dOptions {
    pub filters: usize,
    pub kernel: [usize; 2],
    pub strides: [usize; 2],
    pub name: Option<String>,
    pub args: LayerDefaults,
}

impl Conv2dOptions {
    pub fn new(filters: usize, kernel: [usize; 2]) -> Conv2dOptions {
        Conv2dOptions { filters, kernel, strides: [1, 1], name: None, args: LayerDefaults::default() }
    }
    pub fn strides(mut self, s: [usize; 2]) -> Self {
        self.strides = s;
        self
    }
    pub fn padding(mut self, p: Padding) -> Self {
        self.args.padding = Some(p);
        self
    }
    common_setters!();
}

/// Options of [`super::max_pool2d`] and [`super::avg_pool2d`] (slim's
/// `max_pool2d`/`avg_pool2d`, TF's `tf.layers.max_pooling2d`/`average_pooling2d`).
/// Padding unset: the scope's, else VALID (both APIs' default).
#[derive(Debug, Clone, PartialEq)]
pub struct Pool2dOptions {
    pub pool_size: [usize; 2],
    pub strides: [usize; 2],
    pub padding: Option<Padding>,
    pub name: Option<String>,
}

impl Pool2dOptions {
    pub fn new(pool_size: [usize; 2], strides: [usize; 2]) -> Pool2dOptions {
        Pool2dOptions { pool_size, strides, padding: None, name: None }
    }
    pub fn padding(mut self, p: Padding) -> Self {
        self.padding = Some(p);
        self
    }
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }
}
