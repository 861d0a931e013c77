//! The seed models, built with the TF1-style builder: a 2-hidden-layer ReLU
//! MLP and the seed's convnet (conv 12 5x5 with relu, max-pool 2x2, conv 24
//! 3x3 with relu, max-pool 2x2, flatten, dense 100 with relu, dropout, dense
//! 10), with SAME padding so it fits 8x8 digits and 28x28 MNIST alike, and
//! optional batch norm after each convolution as the seed's slim version has.
//!
//! Every model exposes the same names: placeholders `images` (f32
//! `[?, h, w, c]`) and `labels` (i32 `[?]`), the scalar `loss` (mean softmax
//! cross-entropy), `logits`, `predictions` (argmax, i32 `[?]`) and
//! `accuracy` (the batch's fraction of correct predictions, a scalar f32:
//! the training step fetches it, [`crate::trainer`]). The accuracy nodes
//! come after every other node, so a program that does not fetch them
//! prunes them and is unchanged.

use towers_graph::layers::{self, Activation};
use towers_graph::{DType, Graph, GraphBuilder, GraphError, Padding, Reuse, Shape, Tensor};

/// Which network to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    Mlp,
    Convnet,
}

impl std::str::FromStr for ModelKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mlp" => Ok(ModelKind::Mlp),
            "convnet" => Ok(ModelKind::Convnet),
            other => Err(format!("unknown model '{other}': expected mlp or convnet")),
        }
    }
}

/// The shape of a model: its kind, input geometry and options.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub kind: ModelKind,
    /// Input `[h, w, c]`.
    pub input: [usize; 3],
    pub classes: usize,
    /// Hidden widths of the MLP.
    pub hidden: Vec<usize>,
    /// The activation of the MLP's hidden layers.
    pub activation: Activation,
    /// Batch norm after each convolution (convnet only).
    pub batch_norm: bool,
    /// Drop probability of the convnet's dropout.
    pub dropout: f32,
    /// Graph seed: initializers and dropout masks.
    pub seed: u64,
}

impl ModelSpec {
    pub fn new(kind: ModelKind, input: [usize; 3], classes: usize) -> ModelSpec {
        ModelSpec {
            kind,
            input,
            classes,
            hidden: vec![256, 256],
            activation: Activation::Relu,
            batch_norm: false,
            dropout: 0.25,
            seed: 0,
        }
    }
}

/// A built model and the names of its parts.
#[derive(Debug, Clone)]
pub struct Model {
    pub spec: ModelSpec,
    pub graph: Graph,
    pub images: String,
    pub labels: String,
    pub loss: String,
    pub logits: String,
    pub predictions: String,
}

/// The node of every seed model's batch accuracy: the mean of
/// `predictions == labels` as a scalar f32.
pub const ACCURACY: &str = "accuracy";

/// Build a model graph.
pub fn build(spec: &ModelSpec) -> Result<Model, GraphError> {
    let mut b = GraphBuilder::with_seed(spec.seed);
    let [h, w, c] = spec.input;
    let images = b.placeholder("images", DType::F32, Shape(vec![None, Some(h), Some(w), Some(c)]))?;
    let labels = b.placeholder("labels", DType::I32, Shape(vec![None]))?;
    let logits = match spec.kind {
        ModelKind::Mlp => mlp(&mut b, spec, images)?,
        ModelKind::Convnet => convnet(&mut b, spec, images)?,
    };
    let logits = b.identity(logits, "logits")?;
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, labels)?;
    let mean = b.reduce_mean(xent, &[0], false)?;
    let loss = b.identity(mean, "loss")?;
    let pred = b.argmax(logits, 1)?;
    let pred = b.identity(pred, "predictions")?;
    let hit = b.equal(pred, labels)?;
    let hit = b.cast(hit, DType::F32)?;
    let acc = b.reduce_mean_all(hit)?;
    b.identity(acc, ACCURACY)?;
    let name = |b: &GraphBuilder, t: Tensor| b.graph().node(t.node).name.clone();
    Ok(Model {
        images: name(&b, images),
        labels: name(&b, labels),
        loss: name(&b, loss),
        logits: name(&b, logits),
        predictions: name(&b, pred),
        spec: spec.clone(),
        graph: b.finish(),
    })
}

fn mlp(b: &mut GraphBuilder, spec: &ModelSpec, images: Tensor) -> Result<Tensor, GraphError> {
    b.variable_scope("MLP", Reuse::No, |b| {
        let mut x = b.flatten(images)?;
        for (i, &units) in spec.hidden.iter().enumerate() {
            x = layers::dense(b, &format!("fc{}", i + 1), x, units, spec.activation)?;
        }
        layers::dense(b, "logits", x, spec.classes, Activation::None)
    })
}

fn conv_block(
    b: &mut GraphBuilder,
    spec: &ModelSpec,
    name: &str,
    x: Tensor,
    filters: usize,
    k: usize,
) -> Result<Tensor, GraphError> {
    if spec.batch_norm {
        let y = layers::conv2d(b, name, x, filters, [k, k], Padding::Same, Activation::None)?;
        let y = b.variable_scope(name, Reuse::Auto, |b| layers::batch_norm(b, "BatchNorm", y, 0.9, 1e-3))?;
        b.relu(y)
    } else {
        layers::conv2d(b, name, x, filters, [k, k], Padding::Same, Activation::Relu)
    }
}

fn convnet(b: &mut GraphBuilder, spec: &ModelSpec, images: Tensor) -> Result<Tensor, GraphError> {
    b.variable_scope("ConvNet", Reuse::No, |b| {
        let x = conv_block(b, spec, "conv_1", images, 12, 5)?;
        let x = b.max_pool(x, [2, 2], [2, 2], Padding::Same)?;
        let x = conv_block(b, spec, "conv_2", x, 24, 3)?;
        let x = b.max_pool(x, [2, 2], [2, 2], Padding::Same)?;
        let x = b.flatten(x)?;
        let x = layers::dense(b, "fc", x, 100, Activation::Relu)?;
        let x = b.dropout_with_seed(x, spec.dropout, spec.seed ^ 0x5eed)?;
        layers::dense(b, "logits", x, spec.classes, Activation::None)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_models_have_tf_names_and_shapes() {
        let m = build(&ModelSpec::new(ModelKind::Convnet, [8, 8, 1], 10)).unwrap();
        let vars = m.graph.collection(towers_graph::keys::TRAINABLE_VARIABLES).to_vec();
        assert_eq!(
            vars,
            [
                "ConvNet/conv_1/weights",
                "ConvNet/conv_1/biases",
                "ConvNet/conv_2/weights",
                "ConvNet/conv_2/biases",
                "ConvNet/fc/weights",
                "ConvNet/fc/biases",
                "ConvNet/logits/weights",
                "ConvNet/logits/biases"
            ]
        );
        let fc = m.graph.node(m.graph.get("ConvNet/fc/weights").unwrap());
        assert_eq!(fc.outputs[0].shape, Shape::known(&[2 * 2 * 24, 100]));
        let m = build(&ModelSpec::new(ModelKind::Mlp, [28, 28, 1], 10)).unwrap();
        let w = m.graph.node(m.graph.get("MLP/fc1/weights").unwrap());
        assert_eq!(w.outputs[0].shape, Shape::known(&[784, 256]));
        assert_eq!(m.loss, "loss");
    }

    #[test]
    fn batch_norm_variant_registers_update_ops() {
        let mut s = ModelSpec::new(ModelKind::Convnet, [28, 28, 1], 10);
        s.batch_norm = true;
        let m = build(&s).unwrap();
        assert_eq!(m.graph.collection(towers_graph::keys::UPDATE_OPS).len(), 4);
        assert!(m.graph.get("ConvNet/conv_1/BatchNorm/moving_mean").is_some());
        let fc = m.graph.node(m.graph.get("ConvNet/fc/weights").unwrap());
        assert_eq!(fc.outputs[0].shape, Shape::known(&[7 * 7 * 24, 100]));
    }
}
