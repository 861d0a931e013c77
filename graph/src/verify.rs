//! The verifier: the invariants every pass must keep (see [`crate::graph`]).
//! Passes run it after each pass in debug builds.

use crate::error::{GraphError, Result};
use crate::graph::Graph;
use crate::infer::infer;

/// Check names, slots, acyclicity and that stored types equal inferred ones.
/// When `placed` is true, also check every node has a device and every data
/// edge between devices goes through a `Copy` node.
pub fn verify(g: &Graph, after: &str, placed: bool) -> Result<()> {
    let err = |detail: String| GraphError::Verify { after: after.to_string(), detail };
    let order = g.topo_order().map_err(|e| err(e.to_string()))?;
    let mut names = std::collections::HashSet::new();
    for &id in &order {
        let n = g.node(id);
        if !names.insert(n.name.clone()) || g.get(&n.name) != Some(id) {
            return Err(err(format!("name '{}' is not unique or not indexed", n.name)));
        }
        let inputs = g.inputs(id);
        let mut types = Vec::new();
        for (slot, t) in inputs.iter().enumerate() {
            let ty = g.tensor_type(*t).map_err(|e| err(format!("input {slot} of '{}': {e}", n.name)))?;
            types.push(ty.clone());
        }
        let inferred = infer(&n.op, &types).map_err(|e| err(format!("'{}' ({}): {e:?}", n.name, n.op.type_name())))?;
        if inferred != n.outputs {
            return Err(err(format!(
                "'{}' ({}) stores output types {:?} but its inputs give {:?}",
                n.name,
                n.op.type_name(),
                n.outputs.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
                inferred.iter().map(|t| t.to_string()).collect::<Vec<_>>()
            )));
        }
        if placed {
            let Some(dev) = n.device else {
                return Err(err(format!("'{}' has no device after placement", n.name)));
            };
            for t in &inputs {
                let src = g.node(t.node);
                let src_dev = src.device;
                let is_copy = matches!(n.op, crate::op::Op::Copy);
                if src_dev != Some(dev) && !is_copy {
                    return Err(err(format!(
                        "edge {} ({}) -> {} ({dev}) crosses devices without a Copy",
                        src.name,
                        src_dev.map(|d| d.to_string()).unwrap_or_else(|| "unplaced".into()),
                        n.name
                    )));
                }
                if is_copy && src_dev == Some(dev) {
                    return Err(err(format!("Copy '{}' does not cross devices ({dev})", n.name)));
                }
            }
        }
    }
    Ok(())
}
