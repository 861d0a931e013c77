//! Malformed serialized graphs are `GraphError::Deserialize`, never a panic.

use serde_json::{json, Value};
use towers_graph::{DType, Graph, GraphBuilder, GraphError};

fn small_graph() -> Graph {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(2)]).unwrap();
    let y = b.neg(x).unwrap();
    let r = b.relu(y).unwrap();
    b.reshape(r, &[-1, 1]).unwrap();
    b.finish()
}

fn small_json() -> String {
    small_graph().to_json().unwrap()
}

/// The JSON value of the small graph, edited by `f`, as text.
fn edited(f: impl FnOnce(&mut Value)) -> String {
    let mut v: Value = serde_json::from_str(&small_json()).unwrap();
    f(&mut v);
    v.to_string()
}

fn deser_err(s: &str) -> String {
    match Graph::from_json(s) {
        Err(GraphError::Deserialize(m)) => m,
        other => panic!("expected Deserialize, got {other:?}"),
    }
}

#[test]
fn truncated_json() {
    let s = small_json();
    for cut in [1, s.len() / 3, s.len() / 2, s.len() - 2] {
        deser_err(&s[..cut]);
    }
    deser_err("");
    deser_err("null");
    deser_err("[]");
}

#[test]
fn node_referring_to_an_unknown_input() {
    let s = edited(|v| v["nodes"][1]["inputs"][0][0] = json!("nope"));
    let m = deser_err(&s);
    assert!(m.contains("node 'Neg' refers to 'nope', which is not defined before it"), "{m}");
    let s = edited(|v| v["nodes"][1]["control_inputs"] = json!(["ghost"]));
    let m = deser_err(&s);
    assert!(m.contains("refers to 'ghost'"), "{m}");
}

#[test]
fn unknown_op_variant() {
    let s = edited(|v| v["nodes"][2]["op"] = json!("Frobnicate"));
    let m = deser_err(&s);
    assert!(m.contains("Frobnicate"), "{m}");
}

#[test]
fn structurally_valid_json_that_breaks_graph_rules() {
    // A bad output slot.
    let m = deser_err(&edited(|v| v["nodes"][1]["inputs"][0][1] = json!(5)));
    assert!(m.contains("'Neg'") && m.contains("output 5"), "{m}");
    // A duplicate name.
    let m = deser_err(&edited(|v| v["nodes"][2]["name"] = json!("Neg")));
    assert!(m.contains("'Neg' already exists"), "{m}");
    // Wrong arity and shape errors.
    let m = deser_err(&edited(|v| v["nodes"][2]["inputs"] = json!([])));
    assert!(m.contains("expects 1 inputs, got 0"), "{m}");
    let m = deser_err(&edited(|v| v["nodes"][3]["op"]["Reshape"]["shape"] = json!([3, 3])));
    assert!(m.contains("cannot reshape"), "{m}");
    // A collection naming a missing node.
    let m = deser_err(&edited(|v| v["collections"] = json!({"losses": ["Gone"]})));
    assert!(m.contains("collection 'losses' names unknown node 'Gone'"), "{m}");
}

#[test]
fn huge_dimensions_do_not_overflow() {
    // [2^40, 2^40] has more elements than usize holds: an error, not a panic.
    let big = 1u64 << 40;
    let s = edited(|v| v["nodes"][0]["op"]["Placeholder"]["shape"] = json!([big, big]));
    let r = std::panic::catch_unwind(|| Graph::from_json(&s).map(|g| g.len()));
    assert!(r.is_ok(), "from_json panicked");
    assert!(deser_err(&s).contains("more elements than fit in memory"));
    let s = edited(|v| v["nodes"][3]["op"]["Reshape"]["shape"] = json!([big, big, -1]));
    let r = std::panic::catch_unwind(|| Graph::from_json(&s).map(|g| g.len()));
    assert!(r.is_ok(), "from_json panicked");
    assert!(deser_err(&s).contains("more elements than fit in memory"));
}
