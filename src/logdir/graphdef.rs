//! The placed [`Graph`] as a `tensorflow.GraphDef`.
//!
//! One `NodeDef` per node, in creation order: its scoped name (TensorBoard
//! groups by `/`, so towers show as `tower_N` boxes), its op as TF names it
//! ([`Op::type_name`](towers_graph::Op::type_name)), its inputs (`name`,
//! `name:slot`, `^name` for control edges, the NodeDef convention), its
//! device as a full TF string (`/device:GPU:0`; empty when unplaced) and the
//! `_output_shapes` attribute (-1 for an unknown dimension) that TensorBoard
//! draws on edges.

use std::collections::HashMap;

use towers_graph::{Device, DeviceKind, Graph};

use super::proto::{AttrKind, AttrList, AttrValue, Dim, GraphDef, NodeDef, TensorShapeProto, VersionDef};

/// TF's full device string: `/device:CPU:0`, `/device:GPU:1`.
pub fn tf_device(d: Device) -> String {
    let kind = match d.kind {
        DeviceKind::Cpu => "CPU",
        DeviceKind::Gpu => "GPU",
    };
    format!("/device:{kind}:{}", d.index)
}

/// The graph as a `GraphDef` (see the module docs).
pub fn graph_def(g: &Graph) -> GraphDef {
    let node = g
        .node_ids()
        .into_iter()
        .map(|id| {
            let n = g.node(id);
            let mut input: Vec<String> = g
                .inputs(id)
                .into_iter()
                .map(|t| {
                    let src = &g.node(t.node).name;
                    if t.slot == 0 {
                        src.clone()
                    } else {
                        format!("{src}:{}", t.slot)
                    }
                })
                .collect();
            input.extend(g.control_inputs(id).into_iter().map(|c| format!("^{}", g.node(c).name)));
            let shapes = n
                .outputs
                .iter()
                .map(|t| TensorShapeProto {
                    dim: t.shape.0.iter().map(|d| Dim { size: d.map_or(-1, |s| s as i64) }).collect(),
                })
                .collect();
            let mut attr = HashMap::new();
            attr.insert(
                "_output_shapes".to_string(),
                AttrValue { value: Some(AttrKind::List(AttrList { shape: shapes })) },
            );
            NodeDef {
                name: n.name.clone(),
                op: n.op.type_name().to_string(),
                input,
                device: n.device.map(tf_device).unwrap_or_default(),
                attr,
            }
        })
        .collect();
    // The producer version of TF 1.15's GraphDefs.
    GraphDef { node, versions: Some(VersionDef { producer: 134 }) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::{compile_train, CompileOptions};
    use crate::models::{build, ModelKind, ModelSpec};
    use towers_graph::{Optimizer, F32};

    #[test]
    fn placed_two_tower_graph_carries_devices_ops_and_inputs() {
        let m = build(&ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10)).expect("model");
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
        o.towers = vec![Device::gpu(0), Device::gpu(1)];
        let c = compile_train(&m.graph, &m.loss, &o).expect("compile");
        let gd = graph_def(&c.graph);
        assert_eq!(gd.node.len(), c.graph.len());
        let by_name: HashMap<&str, &NodeDef> = gd.node.iter().map(|n| (n.name.as_str(), n)).collect();
        let w = by_name["MLP/fc1/weights"];
        assert_eq!(w.device, "/device:CPU:0");
        let towers: Vec<&&NodeDef> =
            by_name.iter().filter(|(k, _)| k.starts_with("tower_1/")).map(|(_, v)| v).collect();
        assert!(!towers.is_empty());
        // Tower 1 computes on GPU 1 (its copies and reductions may sit on the CPU).
        assert!(towers.iter().filter(|n| n.op == "MatMul").all(|n| n.device == "/device:GPU:1"));
        assert!(towers.iter().any(|n| n.op == "MatMul"));
        assert!(gd.node.iter().all(|n| n.device.starts_with("/device:")), "every node placed");
        assert!(gd.node.iter().any(|n| n.op == "MatMul"));
        // Every input names an existing node.
        for n in &gd.node {
            for i in &n.input {
                let src = i.trim_start_matches('^').split(':').next().expect("a name");
                assert!(by_name.contains_key(src), "{}: input {i}", n.name);
            }
        }
    }

    #[test]
    fn tf_device_strings() {
        assert_eq!(tf_device(Device::cpu(0)), "/device:CPU:0");
        assert_eq!(tf_device(Device::gpu(3)), "/device:GPU:3");
    }
}
