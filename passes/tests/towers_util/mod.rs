//! Shared builders for the tower pass tests: a 2-layer MLP with hand-made
//! "gradients" (`g_v = v * loss`, so every gradient depends on the tower's
//! loss and has the variable's shape), and the tower pipeline.
#![allow(dead_code)]

use towers_graph::layers::{batch_norm, dense, Activation};
use towers_graph::{DType, Device, Graph, GraphBuilder, NewNode, Op, Optimizer, Tensor, F32};
use towers_passes::*;

pub fn gpus(n: u32) -> Vec<Device> {
    (0..n).map(Device::gpu).collect()
}

/// x [?, 8] -> fc1 (16, relu) -> [dropout] -> [bn] -> fc2 (4) -> sparse xent -> mean.
pub fn mlp(dropout: bool, bn: bool) -> (Graph, CompileState) {
    let mut b = GraphBuilder::with_seed(7);
    let x = b.placeholder("x", DType::F32, [None, Some(8)]).unwrap();
    let y = b.placeholder("labels", DType::I32, [None]).unwrap();
    let mut h = dense(&mut b, "fc1", x, 16, Activation::Relu).unwrap();
    if dropout {
        h = b.dropout_with_seed(h, 0.5, 3).unwrap();
    }
    if bn {
        h = batch_norm(&mut b, "bn", h, 0.9, 1e-3).unwrap();
    }
    let logits = dense(&mut b, "fc2", h, 4, Activation::None).unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
    let loss = b.reduce_mean_all(xent).unwrap();
    let mut g = b.finish();
    let mut st = CompileState { loss: Some(TensorRef::of(&g, loss)), ..Default::default() };
    for v in g.trainable_variables() {
        let name = g.node(v).name.clone();
        let id = g
            .add(NewNode::new(
                format!("gradients/{name}_grad"),
                Op::Binary(towers_graph::BinaryOp::Mul),
                vec![Tensor::new(v, 0), loss],
            ))
            .unwrap();
        st.var_list.push(name.clone());
        st.grads.insert(name, TensorRef::new(g.node(id).name.clone(), 0));
    }
    (g, st)
}

pub fn sgd() -> Optimizer {
    Optimizer::Sgd { lr: F32(0.1) }
}

/// The tower pipeline over hand-made gradients.
pub fn towers_pm(
    towers: Vec<Device>,
    k: usize,
    batch: usize,
    split: SplitPolicy,
    vars: VarPlacement,
    bn: BnUpdates,
) -> PassManager {
    PassManager::new()
        .verify(true)
        .add(BindBatch::new(batch))
        .add(Replicate { towers: towers.clone(), accumulate: k, bn_updates: bn })
        .add(SplitBatch::new(split))
        .add(GradMean)
        .add(ApplyOptimizer { optimizer: sgd(), clip_global_norm: None, name: None })
        .add(Place { strategy: vars, devices: towers })
        .add(ScheduleStreams)
}

pub fn compile(n: u32, batch: usize, vars: VarPlacement) -> Result<(Graph, CompileState), PassError> {
    let (mut g, mut st) = mlp(false, false);
    towers_pm(gpus(n), 1, batch, SplitPolicy::Even, vars, BnUpdates::Mean).run(&mut g, &mut st)?;
    Ok((g, st))
}

pub fn ids_of(g: &Graph, pred: impl Fn(&Op) -> bool) -> Vec<towers_graph::NodeId> {
    g.node_ids().into_iter().filter(|&i| pred(&g.node(i).op)).collect()
}
