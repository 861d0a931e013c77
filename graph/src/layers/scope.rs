//! Scoped layer defaults ([`GraphBuilder::arg_scope`]) and the layers'
//! scope names.
//!
//! Naming follows TF1's `variable_scope(name_or_scope, default_name=...)`:
//! an explicit name is used as given; a default name is made unique among
//! the variable scopes opened in the current variable scope since it was
//! entered (`dense`, `dense_1`, ...). Leaving a variable scope forgets the
//! counts of its sub-scopes, so a second tower that re-enters `model` with
//! reuse gets `model/dense` again, and `reuse_scope` restores the counts on
//! exit, as TF does for a re-entered scope object.

use crate::builder::{GraphBuilder, Reuse};
use crate::error::{GraphError, Result};

use super::options::{LayerDefaults, Naming};

impl GraphBuilder {
    /// slim's `arg_scope`: layers built inside take `defaults` for every
    /// option they are not given; a nested scope's values override the
    /// outer's, field by field, and everything is restored on exit.
    ///
    /// ```
    /// use towers_graph::layers::{self, Activation, DenseOptions, LayerDefaults};
    /// use towers_graph::{DType, GraphBuilder, Shape};
    /// let mut b = GraphBuilder::new();
    /// let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(4)])).unwrap();
    /// let y = b.arg_scope(LayerDefaults::new().activation(Activation::Tanh).use_bias(false), |b| {
    ///     layers::dense_with(b, x, &DenseOptions::new(3).name("fc"))
    /// }).unwrap();
    /// assert_eq!(b.graph().node(y.node).op.type_name(), "Tanh");
    /// assert!(b.graph().get("fc/biases").is_none());
    /// ```
    pub fn arg_scope<T, E: From<GraphError>>(
        &mut self,
        defaults: LayerDefaults,
        f: impl FnOnce(&mut Self) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let merged = defaults.over(&self.layer_defaults);
        let saved = std::mem::replace(&mut self.layer_defaults, merged);
        let r = f(self);
        self.layer_defaults = saved;
        r
    }

    /// The layer defaults in force (the merged `arg_scope`s).
    pub fn layer_defaults(&self) -> &LayerDefaults {
        &self.layer_defaults
    }

    /// TF's `_get_unique_variable_scope(prefix)`: `prefix`, or `prefix_1`,
    /// `prefix_2`, ... the first not opened in the current variable scope.
    pub fn unique_layer_name(&self, prefix: &str) -> String {
        let scope = self.current_variable_scope();
        let full = if scope.is_empty() { prefix.to_string() } else { format!("{scope}/{prefix}") };
        let opened = |n: &str| self.scope_counts.get(n).copied().unwrap_or(0) > 0;
        if !opened(&full) {
            return prefix.to_string();
        }
        let mut i = 1;
        while opened(&format!("{full}_{i}")) {
            i += 1;
        }
        format!("{prefix}_{i}")
    }
}

/// Which default name a layer kind takes in each style.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Dense,
    Conv2d,
    BatchNorm,
    MaxPool,
    AvgPool,
    Dropout,
    LayerNorm,
}

impl Kind {
    fn default_name(self, naming: Naming) -> &'static str {
        match (naming, self) {
            (Naming::Slim, Kind::Dense) => "fully_connected",
            (Naming::Slim, Kind::Conv2d) => "Conv",
            (Naming::Slim, Kind::BatchNorm) => "BatchNorm",
            (Naming::Slim, Kind::MaxPool) => "MaxPool2D",
            (Naming::Slim, Kind::AvgPool) => "AvgPool2D",
            (Naming::Slim, Kind::Dropout) => "Dropout",
            (Naming::TfLayers, Kind::Dense) => "dense",
            (Naming::TfLayers, Kind::Conv2d) => "conv2d",
            (Naming::TfLayers, Kind::BatchNorm) => "batch_normalization",
            (Naming::TfLayers, Kind::MaxPool) => "max_pooling2d",
            (Naming::TfLayers, Kind::AvgPool) => "average_pooling2d",
            (Naming::TfLayers, Kind::Dropout) => "dropout",
            // tf.contrib.layers.layer_norm in both styles.
            (_, Kind::LayerNorm) => "LayerNorm",
        }
    }
}

/// A layer about to be built: its scope name and full path (for errors).
pub(crate) struct LayerScope {
    pub name: String,
    pub path: String,
}

impl LayerScope {
    /// The scope name of a layer of `kind` given `name` (or the style's
    /// unique default).
    pub fn new(b: &GraphBuilder, kind: Kind, naming: Naming, name: Option<&str>) -> LayerScope {
        let name = match name {
            Some(n) => n.to_string(),
            None => b.unique_layer_name(kind.default_name(naming)),
        };
        let scope = b.current_variable_scope();
        let path = if scope.is_empty() { name.clone() } else { format!("{scope}/{name}") };
        LayerScope { name, path }
    }

    /// An error about `option` of this layer.
    pub fn err(&self, option: &str, detail: impl Into<String>) -> GraphError {
        GraphError::LayerOption { layer: self.path.clone(), option: option.to_string(), detail: detail.into() }
    }

    /// Build the layer's ops and variables inside its variable scope (reuse
    /// inherited from the enclosing scope).
    pub fn enter<T>(&self, b: &mut GraphBuilder, f: impl FnOnce(&mut GraphBuilder) -> Result<T>) -> Result<T> {
        b.variable_scope(&self.name, Reuse::No, f)
    }
}
