//! The collapsed Graphviz view: where everything lives, on one screen.
//!
//! One box per name scope per device (the scope cut to its first two
//! components after any `tower_<i>/` prefix, which stays in the label), one
//! cylinder per device holding that device's variables (their count and
//! bytes; with `--variables ps` one per owning `/job:ps/task:k`), devices as flat clusters (never nested), and one edge per pair
//! of groups that exchange data, labelled with the bytes that cross per
//! step (each distinct tensor counted once per reading group; tensors of
//! unknown size count 0). Control edges are left out. Output is
//! deterministic: groups are numbered in the order of their first node in
//! the graph's topological order, edges sorted by those numbers.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::dot::device_colour;
use crate::error::Result;
use crate::graph::Graph;
use crate::op::Op;
use crate::seeds::tower_free_name;

/// The group a node belongs to: its device's name ("unplaced" before
/// placement) and its scope label (or "variables").
fn group_of(name: &str, is_var: bool, device: &str) -> (String, String) {
    if is_var {
        return (device.to_string(), "variables".into());
    }
    let free = tower_free_name(name);
    let tower = &name[..name.len() - free.len()];
    let parts: Vec<&str> = free.split('/').collect();
    let scope: Vec<&str> = parts[..parts.len() - 1].iter().take(2).copied().collect();
    let label = if scope.is_empty() { format!("{tower}(root)") } else { format!("{tower}{}", scope.join("/")) };
    (device.to_string(), label)
}

/// Bytes as a short human figure: `512 B`, `3.1 KiB`, `1.2 MiB`.
fn bytes(n: usize) -> String {
    match n {
        n if n < 1024 => format!("{n} B"),
        n if n < 1 << 20 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
    }
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Render the collapsed view of `g` as Graphviz dot (see the module docs).
pub fn to_dot_collapsed(g: &Graph) -> Result<String> {
    let order = g.topo_order()?;
    let task = g.program().task;
    let mut ids: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut groups: Vec<((String, String), usize, usize, Option<crate::device::Device>)> = Vec::new();
    let mut of_node = BTreeMap::new();
    for &id in &order {
        let n = g.node(id);
        let device = n.device.map(|d| d.qualified(task)).unwrap_or_else(|| "unplaced".into());
        let is_var = matches!(n.op, Op::Variable { .. });
        let mut key = group_of(&n.name, is_var, &device);
        // With --variables ps, a device's variables are one cylinder per owning task.
        if let Some(k) = g.program().ps.as_ref().and_then(|ps| ps.owner(&n.name)) {
            key.1 = format!("variables of {}", crate::device::ps_task_name(k));
        }
        let gi = *ids.entry(key.clone()).or_insert_with(|| {
            groups.push((key, 0, 0, n.device));
            groups.len() - 1
        });
        groups[gi].1 += 1;
        if is_var {
            groups[gi].2 +=
                n.outputs.first().map(|t| t.shape.num_elements().unwrap_or(0) * t.dtype.size_bytes()).unwrap_or(0);
        }
        of_node.insert(id, gi);
    }
    // (from group, to group) -> bytes, each (tensor, reading group) once.
    let mut edges: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    for &id in &order {
        let to = of_node[&id];
        for t in g.inputs(id) {
            let from = of_node[&t.node];
            if from == to || !seen.insert((t, to)) {
                continue;
            }
            let ty = &g.node(t.node).outputs[t.slot];
            *edges.entry((from, to)).or_default() += ty.shape.num_elements().unwrap_or(0) * ty.dtype.size_bytes();
        }
    }
    let mut s = String::from(
        "digraph towers_collapsed {\n  rankdir=LR;\n  newrank=true;\n  node [shape=box, style=\"rounded,filled\", fontsize=10];\n",
    );
    let mut devices: Vec<String> = groups.iter().map(|((d, _), ..)| d.clone()).collect();
    devices.dedup();
    devices.sort();
    devices.dedup();
    for (k, dev) in devices.iter().enumerate() {
        let _ = writeln!(s, "  subgraph cluster_{k} {{\n    label=\"{}\"; style=rounded; color=gray50;", esc(dev));
        for (i, ((_, label), count, vbytes, device)) in groups.iter().enumerate().filter(|(_, g)| &g.0 .0 == dev) {
            let fill = device.map(device_colour).unwrap_or("white");
            if label.starts_with("variables") {
                let _ = writeln!(
                    s,
                    "    g{i} [label=\"{}\\n{count} on {}\\n{}\", shape=cylinder, fillcolor=\"{fill}\"];",
                    esc(label),
                    esc(dev),
                    bytes(*vbytes)
                );
            } else {
                let ops = if *count == 1 { "op" } else { "ops" };
                let _ = writeln!(s, "    g{i} [label=\"{}\\n{count} {ops}\", fillcolor=\"{fill}\"];", esc(label));
            }
        }
        s.push_str("  }\n");
    }
    for ((from, to), b) in &edges {
        let _ = writeln!(s, "  g{from} -> g{to} [label=\"{}\", fontsize=8];", bytes(*b));
    }
    s.push_str("}\n");
    Ok(s)
}
