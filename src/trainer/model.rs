//! [`Model`]: a user's graph and the names the trainer needs in it.
//!
//! Invariants checked by [`Model::check`] (and so by every `fit` and every
//! load of a model file) before anything is compiled:
//! - the graph verifies (`towers_graph::verify`);
//! - `images` is an f32 placeholder `[?, h, w, c]` or `[?, h*w*c]`,
//!   `labels` an i32 placeholder `[?]`;
//! - `loss` and `accuracy` (when named) are scalar f32 tensors, and
//!   `predictions` an i32 `[?]` tensor (one class per example);
//! - no other placeholder feeds `loss`, `predictions` or `accuracy`: the
//!   trainer feeds `images` and `labels` only (a placeholder nothing reads
//!   is fine: TF1 graphs often keep one).
//!
//! [`Model::check_data`] adds that the images fit a data set's geometry.

use thiserror::Error;
use towers_graph::{DType, Graph, GraphError, Op, Shape};

use crate::data::Dataset;

/// A model the trainer can train: a graph and the names of its parts.
///
/// The trainer feeds `images` and `labels` with each batch, minimises
/// `loss`, fetches `accuracy` (when named) with every step, and computes
/// the test accuracy from `predictions`. Build one with [`Model::new`];
/// [`Model::save_json`] and [`Model::load_json`] store it as a file that
/// `towers train --graph` and `towers compile --graph` read.
#[derive(Debug, Clone)]
pub struct Model {
    /// The model graph (forward only: the compiler adds the gradients, the
    /// towers and the optimizer).
    pub graph: Graph,
    /// The scalar f32 loss node.
    pub loss: String,
    /// The f32 image placeholder, `[?, h, w, c]` or `[?, h*w*c]`.
    pub images: String,
    /// The i32 label placeholder, `[?]`.
    pub labels: String,
    /// The i32 predicted class per example, `[?]` (for the test accuracy).
    pub predictions: String,
    /// The batch's training accuracy, a scalar f32, fetched with every step.
    pub accuracy: Option<String>,
    /// A seed model of [`crate::models`] (its checkpoints describe it by
    /// its options, not by its graph).
    pub(crate) builtin: bool,
}

/// A [`Model`] whose names or graph do not fit together.
#[derive(Debug, Error)]
pub enum ModelError {
    /// A name the model gives is not a node of its graph.
    #[error("the model's {role} '{name}' is not a node of the graph{hint}")]
    UnknownName { role: &'static str, name: String, hint: String },
    /// A named node is not what its role needs.
    #[error("the model's {role} '{name}' is {found}, but {role} must be {expected}")]
    WrongKind { role: &'static str, name: String, expected: &'static str, found: String },
    /// The graph fails the verifier.
    #[error("the model's graph does not verify: {0}")]
    Verify(GraphError),
    /// A placeholder other than the images and labels feeds what the trainer runs.
    #[error("the model's {role} '{reader}' reads the placeholder '{name}' ({ty}), which is neither its images ('{images}') nor its labels ('{labels}'): the trainer (towers train --graph) feeds only those two; make '{name}' a constant in the model (a dropout rate is an argument of b.dropout(x, rate), which the evaluation already ignores), or remove it")]
    UnfedPlaceholder { role: &'static str, reader: String, name: String, ty: String, images: String, labels: String },
    /// The image placeholder does not fit the data set's images.
    #[error("the model's images '{name}' are {shape}, but the data set's images are {data} (h x w x c): build the placeholder as [?, {h}, {w}, {c}] or [?, {flat}], or train on a data set of that geometry")]
    DataMismatch { name: String, shape: Shape, data: String, h: usize, w: usize, c: usize, flat: usize },
}

impl Model {
    /// A model of `graph`: its loss, its two placeholders and its
    /// predictions, without a training accuracy ([`Model::with_accuracy`]).
    pub fn new(
        graph: Graph,
        loss: impl Into<String>,
        images: impl Into<String>,
        labels: impl Into<String>,
        predictions: impl Into<String>,
    ) -> Model {
        Model {
            graph,
            loss: loss.into(),
            images: images.into(),
            labels: labels.into(),
            predictions: predictions.into(),
            accuracy: None,
            builtin: false,
        }
    }

    /// The same model, fetching `accuracy` (a scalar f32 node) with every
    /// training step; with towers it is combined by each tower's share of
    /// the batch, like the loss.
    pub fn with_accuracy(mut self, accuracy: impl Into<String>) -> Model {
        self.accuracy = Some(accuracy.into());
        self
    }

    /// A seed model of [`crate::models`], with its accuracy node.
    pub fn from_builtin(m: crate::models::Model) -> Model {
        let accuracy = m.graph.get(crate::models::ACCURACY).map(|_| crate::models::ACCURACY.to_string());
        Model {
            graph: m.graph,
            loss: m.loss,
            images: m.images,
            labels: m.labels,
            predictions: m.predictions,
            accuracy,
            builtin: true,
        }
    }

    /// The rows of the images placeholder when its dimension 0 is fixed
    /// (TF1's `tf.placeholder(tf.float32, [32, 8, 8, 1])`): every program
    /// of the model, the evaluation's too, then runs at that batch. None
    /// when it takes any batch (`[None, ...]`) or is not a placeholder.
    pub fn fixed_batch(&self) -> Option<usize> {
        let n = self.graph.node(self.graph.get(&self.images)?);
        match &n.op {
            Op::Placeholder { shape, .. } => shape.0.first().copied().flatten(),
            _ => None,
        }
    }

    /// Check the invariants of the module docs; the first problem is an error naming the role and node.
    pub fn check(&self) -> Result<(), ModelError> {
        towers_graph::verify::verify(&self.graph, "loading the model", false).map_err(ModelError::Verify)?;
        let placeholder = |role: &'static str, name: &str, dtype: DType, rank: &[usize], expected: &'static str| {
            let (op, ty) = self.output(role, name)?;
            let ok = matches!(op, Op::Placeholder { .. }) && ty.0 == dtype && rank.contains(&ty.1 .0.len());
            if ok {
                Ok(())
            } else {
                Err(self.wrong(role, name, expected))
            }
        };
        placeholder("images", &self.images, DType::F32, &[2, 4], "an f32 placeholder [?, h, w, c] or [?, h*w*c]")?;
        placeholder("labels", &self.labels, DType::I32, &[1], "an i32 placeholder [?] (one class per example)")?;
        let tensor = |role: &'static str, name: &str, dtype: DType, rank: usize, expected: &'static str| {
            let (_, ty) = self.output(role, name)?;
            if ty.0 == dtype && ty.1 .0.len() == rank {
                Ok(())
            } else {
                Err(self.wrong(role, name, expected))
            }
        };
        tensor("loss", &self.loss, DType::F32, 0, "a scalar f32 tensor (e.g. reduce_mean of the cross-entropy)")?;
        tensor("predictions", &self.predictions, DType::I32, 1, "an i32 tensor [?] (e.g. argmax of the logits)")?;
        if let Some(a) = &self.accuracy {
            tensor("accuracy", a, DType::F32, 0, "a scalar f32 tensor (e.g. reduce_mean of cast(equal))")?;
        }
        self.check_placeholders()
    }

    /// No placeholder but `images` and `labels` reaches the loss, the
    /// predictions or the accuracy (TF1's `keep_prob` or `is_training`
    /// failed at the first step, asking for `Session::feed`).
    fn check_placeholders(&self) -> Result<(), ModelError> {
        let mut roles = vec![("loss", &self.loss), ("predictions", &self.predictions)];
        if let Some(a) = &self.accuracy {
            roles.push(("accuracy", a));
        }
        for id in self.graph.node_ids() {
            let n = self.graph.node(id);
            if !matches!(n.op, Op::Placeholder { .. }) || n.name == self.images || n.name == self.labels {
                continue;
            }
            for &(role, reader) in &roles {
                let Some(r) = self.graph.get(reader) else { continue };
                if self.graph.reaches(id, r) {
                    let ty = n.outputs.first().map(|t| format!("{:?} {}", t.dtype, t.shape)).unwrap_or_default();
                    return Err(ModelError::UnfedPlaceholder {
                        role,
                        reader: reader.clone(),
                        name: n.name.clone(),
                        ty,
                        images: self.images.clone(),
                        labels: self.labels.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// [`Model::check`], and that the images placeholder fits `data`'s images.
    pub fn check_data(&self, data: &Dataset) -> Result<(), ModelError> {
        self.check()?;
        let (_, (_, shape)) = self.output("images", &self.images)?;
        let [h, w, c] = [data.height(), data.width(), data.channels()];
        let flat = h * w * c;
        let fits = match shape.0.as_slice() {
            [_, a, b, d] => [a, b, d].iter().zip([h, w, c]).all(|(x, y)| x.is_none_or(|x| x == y)),
            [_, a] => a.is_none_or(|a| a == flat),
            _ => false,
        };
        if fits {
            return Ok(());
        }
        Err(ModelError::DataMismatch { name: self.images.clone(), shape, data: format!("{h}x{w}x{c}"), h, w, c, flat })
    }

    /// The op and first output (dtype, shape) of the node `name` of role `role`.
    fn output(&self, role: &'static str, name: &str) -> Result<(&Op, (DType, Shape)), ModelError> {
        let id = self.graph.get(name).ok_or_else(|| ModelError::UnknownName {
            role,
            name: name.to_string(),
            hint: towers_graph::suggest::closest(
                name,
                self.graph.node_ids().iter().map(|&i| self.graph.node(i).name.as_str()),
            ),
        })?;
        let n = self.graph.node(id);
        match n.outputs.first() {
            Some(t) => Ok((&n.op, (t.dtype, t.shape.clone()))),
            None => Err(ModelError::WrongKind {
                role,
                name: name.to_string(),
                expected: "a node with an output",
                found: format!("a {} with no output", n.op.type_name()),
            }),
        }
    }

    fn wrong(&self, role: &'static str, name: &str, expected: &'static str) -> ModelError {
        let found = match self.graph.get(name).map(|i| self.graph.node(i)) {
            Some(n) => match n.outputs.first() {
                Some(t) => format!("a {} of {:?} {}", n.op.type_name(), t.dtype, t.shape),
                None => format!("a {} with no output", n.op.type_name()),
            },
            None => "missing".into(),
        };
        ModelError::WrongKind { role, name: name.to_string(), expected, found }
    }
}
