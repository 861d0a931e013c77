//! The readable text form of a graph: one node a line, in topological order
//! with ties broken by creation order, so it is stable and diffable.
//!
//! ```text
//! fc1/MatMul = MatMul { transpose_a: false, transpose_b: false }(x:0, fc1/weights:0) -> f32[?,256]
//! ```
//! Devices appear as `@gpu:0 (reason)` once placed; control inputs as `^name`.
//! After the nodes come the collections, then the program record when it is
//! not empty ([`crate::program::Program::to_text`]: fetches, train op, and
//! once `schedule` ran, every stream's items and events).

use std::fmt::Write;

use crate::error::Result;
use crate::graph::Graph;
use crate::op::Op;

/// An op as its text form shows it: the `Debug` form, except that the
/// kernels' elementwise vocabulary prints flat (`Relu`, `ReluGrad`, `Add`),
/// as before those ops shared one variant.
fn op_text(op: &Op) -> String {
    match op {
        Op::Binary(b) => format!("{b:?}"),
        Op::Unary(u) => format!("{u:?}"),
        Op::UnaryGrad(u) => format!("{u:?}Grad"),
        other => format!("{other:?}"),
    }
}

/// Render the graph as text.
pub fn to_text(g: &Graph) -> Result<String> {
    let mut s = String::new();
    for id in g.topo_order()? {
        let n = g.node(id);
        let ins: Vec<String> = g
            .inputs(id)
            .iter()
            .map(|t| format!("{}:{}", g.node(t.node).name, t.slot))
            .chain(g.control_inputs(id).iter().map(|&c| format!("^{}", g.node(c).name)))
            .collect();
        let outs: Vec<String> = n.outputs.iter().map(|t| t.to_string()).collect();
        let _ = write!(s, "{} = {}({})", n.name, op_text(&n.op), ins.join(", "));
        if !outs.is_empty() {
            let _ = write!(s, " -> {}", outs.join(", "));
        }
        if !n.requested_device.is_empty() {
            let _ = write!(s, " requested={}", n.requested_device);
        }
        if let Some(d) = n.device {
            let _ = write!(s, " @{}", d.qualified(g.program().task));
            if let Some(r) = &n.placement_reason {
                let _ = write!(s, " ({r})");
            }
        }
        s.push('\n');
    }
    for (k, v) in g.collections() {
        let _ = writeln!(s, "collection {k}: {}", v.join(", "));
    }
    s.push_str(&g.program().to_text());
    Ok(s)
}
