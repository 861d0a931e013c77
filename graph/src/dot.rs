//! Graphviz export: name scopes as nested clusters, devices as fill colours
//! (once placed), control edges dashed, copies and the cross-tower reduction
//! drawn in their own shapes. Output is deterministic.
//!
//! The graph asks for `newrank=true`. Without it, dot's ranking collapses
//! each cluster into one node per level of nesting and ranks cluster by
//! cluster; a compiled graph's scopes nest two deep and more (`ConvNet/
//! conv1/weights` holds a variable, its regularizer and its copies to the
//! towers; `tower_0/ConvNet/conv1` reads them; `Momentum/update_ConvNet/
//! ...` takes the gradients back), so edges run both ways between nested
//! clusters and Graphviz 2.43 stops with "trouble in init_rank" (seed 003's
//! slim convnet at 2 towers: exit 1 after 2.9 s on this machine). Capping
//! the nesting at one level also renders, but loses the scopes; `newrank`
//! ranks all nodes at once with the clusters kept, and renders that graph
//! in 1.4 s. [`to_dot_collapsed`] is the view that fits on one screen.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::device::{Device, DeviceKind};
use crate::error::Result;
use crate::graph::{Graph, NodeId};
use crate::op::Op;

pub use crate::dot_collapsed::to_dot_collapsed;

const GPU_COLOURS: [&str; 8] = ["#a6cee3", "#b2df8a", "#fdbf6f", "#cab2d6", "#ffff99", "#fb9a99", "#8dd3c7", "#bebada"];

/// The fill colour of a device (CPU grey, GPUs from a fixed palette).
pub fn device_colour(d: Device) -> &'static str {
    match d.kind {
        DeviceKind::Cpu => "#d9d9d9",
        DeviceKind::Gpu => GPU_COLOURS[d.index as usize % GPU_COLOURS.len()],
    }
}

#[derive(Default)]
struct Cluster {
    nodes: Vec<NodeId>,
    children: BTreeMap<String, Cluster>,
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Render the graph as Graphviz dot.
pub fn to_dot(g: &Graph) -> Result<String> {
    let order = g.topo_order()?;
    let index: BTreeMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut root = Cluster::default();
    for &id in &order {
        let name = &g.node(id).name;
        let parts: Vec<&str> = name.split('/').collect();
        let mut c = &mut root;
        let mut path = String::new();
        for p in &parts[..parts.len() - 1] {
            if !path.is_empty() {
                path.push('/');
            }
            path.push_str(p);
            c = c.children.entry(path.clone()).or_default();
        }
        c.nodes.push(id);
    }
    let mut s = String::from("digraph towers {\n  rankdir=TB;\n  newrank=true;\n  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontsize=10];\n");
    let mut cid = 0usize;
    emit(g, &root, &index, &mut s, &mut cid, 1);
    for &id in &order {
        for t in g.inputs(id) {
            let ty = &g.node(t.node).outputs[t.slot];
            let _ = writeln!(
                s,
                "  n{} -> n{} [label=\"{}\", fontsize=8];",
                index[&t.node],
                index[&id],
                esc(&ty.to_string())
            );
        }
        for c in g.control_inputs(id) {
            let _ = writeln!(s, "  n{} -> n{} [style=dashed, color=gray40];", index[&c], index[&id]);
        }
    }
    let mut devs: Vec<Device> = order.iter().filter_map(|&i| g.node(i).device).collect();
    devs.sort();
    devs.dedup();
    if !devs.is_empty() {
        s.push_str("  subgraph cluster_legend {\n    label=\"devices\";\n");
        for d in devs {
            let _ = writeln!(
                s,
                "    legend_{} [label=\"{d}\", fillcolor=\"{}\"];",
                d.to_string().replace(':', "_"),
                device_colour(d)
            );
        }
        s.push_str("  }\n");
    }
    s.push_str("}\n");
    Ok(s)
}

fn emit(g: &Graph, c: &Cluster, index: &BTreeMap<NodeId, usize>, s: &mut String, cid: &mut usize, depth: usize) {
    let pad = "  ".repeat(depth);
    for &id in &c.nodes {
        let n = g.node(id);
        let short = n.name.rsplit('/').next().unwrap_or(&n.name);
        let fill = n.device.map(device_colour).unwrap_or("white");
        let shape = match n.op {
            Op::Copy => "cds",
            Op::TowerMean { .. } | Op::TowerMatMul { .. } => "doubleoctagon",
            Op::AllReduce { .. } => "tripleoctagon",
            Op::Variable { .. } => "cylinder",
            Op::Placeholder { .. } => "invhouse",
            Op::ApplyGradient { .. } | Op::AssignMovingAverage { .. } | Op::IncrementStep => "hexagon",
            _ => "box",
        };
        let dev = n.device.map(|d| format!("\\n@{}", d.qualified(g.program().task))).unwrap_or_default();
        // With --variables ps: the owning parameter-server task of a variable or slot.
        let owner = g
            .program()
            .ps
            .as_ref()
            .and_then(|ps| ps.owner(&n.name))
            .map(|k| format!("\\nowner {}", crate::device::ps_task_name(k)))
            .or_else(|| match n.op {
                Op::AllReduce { root: Some(k), .. } => Some(format!("\\nreduce→rank {k}")),
                _ => None,
            })
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "{pad}n{} [label=\"{}\\n{}{}{}\", shape={shape}, fillcolor=\"{fill}\", tooltip=\"{}\"];",
            index[&id],
            esc(short),
            n.op.type_name(),
            dev,
            owner,
            esc(&n.name)
        );
    }
    for (path, child) in &c.children {
        *cid += 1;
        let label = path.rsplit('/').next().unwrap_or(path);
        let _ = writeln!(
            s,
            "{pad}subgraph cluster_{} {{\n{pad}  label=\"{}\";\n{pad}  style=rounded; color=gray50;",
            cid,
            esc(label)
        );
        emit(g, child, index, s, cid, depth + 1);
        let _ = writeln!(s, "{pad}}}");
    }
}
