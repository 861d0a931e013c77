//! `tower_matmul`: a mean of the replicas' matrix products as one product
//! over the whole batch (tower algebra).
//!
//! A weight gradient is a sum over the batch: `dW = x^T · dy`. With towers,
//! each replica computes it over its rows and `grad_mean` averages them:
//! `Σ_i w_i · x_i^T · dy_i`, N products and a reduction that reads every
//! one of them again. That is one product over the concatenated batch, with
//! each replica's rows weighted: this pass rewrites a variable's gradient
//! mean whose every input is a `MatMul` (same transposes, read only by the
//! mean) into one `TowerMatMul` over the replicas' operands, where the
//! operands are no more elements than the products (the reduction's reads):
//! the MLP's 784x256 and 256x256 weights at 128 rows a tower, not a 256x10
//! logits layer, whose inputs are 13x its gradient. The reduction
//! disappears into the products' sums; the result is the same up to float
//! reassociation.
//!
//! Invariants after this pass:
//! - each rewritten mean keeps its name (`<var>/grad_mean`), its requested
//!   device and its readers, so `st.grads` and placement (with the
//!   variable) are unchanged; its op is `TowerMatMul` with inputs `a_0, b_0,
//!   a_1, b_1, ...` in replica order and the mean's weights;
//! - the replicas' products it replaced are gone, and so are their entries
//!   in `st.tower_grads`.
//!
//! Where it runs: only where the towers share one memory (the CPU backend),
//! whose runtime runs the product's two row halves on two idle tower threads
//! and then the update on the rows each computed, and only when
//! `CompileOptions::fold_tower_matmuls` asks for it (off by default, never
//! for the CUDA backend or with several processes, whose reduction crosses
//! them). It saves the replicas' gradient buffers and the reduction's reads,
//! but each half of the product reads the other core's activations inside
//! the GEMM: on a 2-vCPU VM whose host runs the vCPUs apart (cross-core
//! reads at ~40 GB/s instead of ~110) the folded step measured 4-6% slower
//! than each tower computing its own product, and equal otherwise.

use towers_graph::{DType, Graph, NewNode, NodeId, Op, Tensor};

use crate::manager::Pass;
use crate::state::{CompileState, PassError};

/// Fold each gradient mean of replicas' products into one product (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct TowerMatMuls;

/// The replicas' products of one mean: (transpose_a, transpose_b, the products).
fn foldable(g: &Graph, mean: NodeId) -> Option<(bool, bool, Vec<NodeId>)> {
    let n = g.node(mean);
    let control = !g.control_inputs(mean).is_empty() || !g.control_consumers(mean).is_empty();
    if !matches!(n.op, Op::TowerMean { .. }) || control {
        return None;
    }
    let fetched = |name: &str| g.program().fetches.values().any(|t| t.node == name);
    let inputs = g.inputs(mean);
    if inputs.len() < 2 || n.outputs.first().map(|t| t.dtype) != Some(DType::F32) {
        return None;
    }
    let mut flags = None;
    let mut products = Vec::with_capacity(inputs.len());
    for (slot, t) in inputs.iter().enumerate() {
        let p = g.node(t.node);
        let Op::MatMul { transpose_a, transpose_b } = p.op else { return None };
        let only_the_mean = g.consumers(t.node) == [(mean, slot, 0)] && g.control_consumers(t.node).is_empty();
        if t.slot != 0
            || !only_the_mean
            || fetched(&p.name)
            || *flags.get_or_insert((transpose_a, transpose_b)) != (transpose_a, transpose_b)
        {
            return None;
        }
        products.push(t.node);
    }
    let (ta, tb) = flags?;
    // Bytes: the operands must be no more than the products they replace
    // (what a reduction would read), or the fold moves more than it saves.
    let elems = |t: Tensor| g.tensor_type(t).ok().and_then(|ty| ty.shape.num_elements());
    let operands: usize = products.iter().flat_map(|&p| g.inputs(p)).map(elems).sum::<Option<usize>>()?;
    let reduced: usize = inputs.iter().map(|&t| elems(t)).sum::<Option<usize>>()?;
    (operands <= reduced).then_some((ta, tb, products))
}

impl Pass for TowerMatMuls {
    fn name(&self) -> &'static str {
        "tower_matmul"
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        // The gradient means, last variable first: the folded products are
        // created (and so ordered, among nodes ready at once) in the order
        // the backward pass finishes their operands, the logits layer's first.
        let mut means: Vec<NodeId> =
            st.var_list.iter().filter_map(|v| st.grads.get(v)).filter_map(|t| g.get(&t.node)).collect();
        means.reverse();
        for mean in means {
            let Some((transpose_a, transpose_b, products)) = foldable(g, mean) else { continue };
            let Op::TowerMean { weights } = g.node(mean).op.clone() else { continue };
            let operands: Vec<Tensor> = products.iter().flat_map(|&p| g.inputs(p)).collect();
            let readers = g.consumers(mean);
            let old = g.node(mean).clone();
            let folded: Vec<String> = products.iter().map(|&p| g.node(p).name.clone()).collect();
            g.remove(mean);
            for p in products {
                g.remove(p);
            }
            let mut node =
                NewNode::new(old.name.clone(), Op::TowerMatMul { weights, transpose_a, transpose_b }, operands);
            node.scope = old.scope.clone();
            node.requested_device = old.requested_device.clone();
            let id = g.add(node)?;
            for (reader, dst_slot, src_slot) in readers {
                g.set_input(reader, dst_slot, Tensor::new(id, src_slot))?;
            }
            for tg in &mut st.tower_grads {
                tg.retain(|_, t| !folded.contains(&t.node));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use towers_graph::layers::{dense, Activation};
    use towers_graph::{DType, Device, GraphBuilder, Optimizer, F32};

    use crate::options::CompileOptions;
    use crate::pipeline::Pipeline;

    use super::*;

    fn model() -> (Graph, String) {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, [None, Some(16)]).unwrap();
        let y = b.placeholder("y", DType::I32, [None]).unwrap();
        let h = dense(&mut b, "fc1", x, 8, Activation::Relu).unwrap();
        let logits = dense(&mut b, "fc2", h, 3, Activation::None).unwrap();
        let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
        let loss = b.reduce_mean_all(xent).unwrap();
        let g = b.finish();
        let name = g.node(loss.node).name.clone();
        (g, name)
    }

    fn front(towers: usize, split: Option<Vec<u32>>) -> (Graph, CompileState) {
        let (g, loss) = model();
        let mut opts = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
        opts.towers = (0..towers as u32).map(Device::gpu).collect();
        opts.fold_tower_matmuls = true;
        if let Some(w) = split {
            opts.split = crate::options::SplitPolicy::Weighted(w);
        }
        let out = Pipeline::train(&loss, &opts).before("tower_matmul").unwrap().run(&g).unwrap();
        (out.graph, out.state)
    }

    /// Each weight's gradient mean over two towers becomes one product of
    /// the towers' operands, in tower order, under the mean's name; the
    /// towers' products are gone. Bias gradients (column sums, not
    /// products) keep their mean, and so does a gradient smaller than its
    /// operands (fc2: 8x3, from 4x8 and 4x3 a tower; fc1: 16x8 from 4x16
    /// and 4x8).
    #[test]
    fn weight_gradient_means_become_one_product() {
        let (mut g, mut st) = front(2, None);
        let mean = g.get("fc1/weights/grad_mean").unwrap();
        let before: Vec<Tensor> = g.inputs(mean).iter().flat_map(|t| g.inputs(t.node)).collect();
        let tower_products: Vec<String> = g.inputs(mean).iter().map(|t| g.node(t.node).name.clone()).collect();
        TowerMatMuls.run(&mut g, &mut st).unwrap();
        let mean = g.get("fc1/weights/grad_mean").unwrap();
        let Op::TowerMatMul { weights, transpose_a, transpose_b } = &g.node(mean).op else {
            panic!("{:?}", g.node(mean).op)
        };
        assert_eq!(weights, &vec![F32(0.5), F32(0.5)]);
        assert!(*transpose_a && !*transpose_b, "x^T dy");
        // x's rows of each tower (the batch split's outputs 0 and 1), then dy.
        let ins: Vec<(String, usize)> = g.inputs(mean).iter().map(|t| (g.node(t.node).name.clone(), t.slot)).collect();
        assert_eq!(ins.len(), 4);
        assert_eq!((ins[0].0.as_str(), ins[0].1, ins[2].0.as_str(), ins[2].1), ("split/x", 0, "split/x", 1), "{ins:?}");
        assert!(ins[1].0.starts_with("tower_0/gradients/") && ins[3].0.starts_with("tower_1/gradients/"), "{ins:?}");
        assert_eq!(g.inputs(mean).len(), before.len());
        assert!(tower_products.iter().all(|p| g.get(p).is_none()), "the towers' products are gone");
        assert!(st.tower_grads.iter().all(|tg| !tg.contains_key("fc1/weights")));
        assert_eq!(g.node(mean).outputs[0].shape.to_string(), "[16,8]");
        let bias = g.get("fc1/biases/grad_mean").unwrap();
        assert!(matches!(g.node(bias).op, Op::TowerMean { .. }), "a bias gradient is no product");
        let small = g.get("fc2/weights/grad_mean").unwrap();
        assert!(matches!(g.node(small).op, Op::TowerMean { .. }), "24 elements a tower from 44 operands");
    }

    /// Uneven splits keep their weights (each replica's share of the batch)
    /// and their different k.
    #[test]
    fn uneven_splits_keep_their_weights() {
        let (mut g, mut st) = front(2, Some(vec![3, 1]));
        TowerMatMuls.run(&mut g, &mut st).unwrap();
        let mean = g.get("fc1/weights/grad_mean").unwrap();
        let Op::TowerMatMul { weights, .. } = &g.node(mean).op else { panic!("{:?}", g.node(mean).op) };
        assert_eq!(weights, &vec![F32(0.75), F32(0.25)]);
        let rows: Vec<String> = g.inputs(mean).iter().map(|&t| g.tensor_type(t).unwrap().shape.to_string()).collect();
        assert_eq!(rows, ["[6,16]", "[6,8]", "[2,16]", "[2,8]"]);
    }

    /// A fetched tower product (a user reading one tower's gradient) is kept, and so is its mean.
    #[test]
    fn a_fetched_product_is_kept() {
        let (mut g, mut st) = front(2, None);
        let mean = g.get("fc1/weights/grad_mean").unwrap();
        let p0 = g.node(g.inputs(mean)[0].node).name.clone();
        g.program_mut().fetches.insert("g0".into(), crate::state::TensorRef::new(&p0, 0));
        TowerMatMuls.run(&mut g, &mut st).unwrap();
        let mean = g.get("fc1/weights/grad_mean").unwrap();
        assert!(matches!(g.node(mean).op, Op::TowerMean { .. }));
        assert!(g.get(&p0).is_some());
    }
}
