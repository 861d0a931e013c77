//! The variable store's errors, with TF1's phrases (anchor F16).

use towers_graph::builder::VariableOptions;
use towers_graph::{DType, GraphBuilder, GraphError, Initializer, Reuse};

fn fc_weights(b: &mut GraphBuilder, reuse: Reuse, shape: [usize; 2]) -> Result<(), GraphError> {
    b.variable_scope("ConvNet", reuse, |b| {
        b.variable_scope("fc", Reuse::No, |b| b.get_variable("weights", shape, Initializer::Zeros))
    })?;
    Ok(())
}

#[test]
fn creating_an_existing_variable_without_reuse() {
    let mut b = GraphBuilder::new();
    fc_weights(&mut b, Reuse::No, [2, 4]).unwrap();
    let e = fc_weights(&mut b, Reuse::No, [2, 4]).unwrap_err();
    assert!(matches!(e, GraphError::VariableExists { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains(
            "Variable ConvNet/fc/weights already exists, disallowed. Did you mean to set reuse=Yes or reuse=Auto in the variable scope?"
        ),
        "{msg}"
    );
    assert!(msg.contains("scope 'ConvNet/fc' has reuse=No"), "{msg}");
    // Duplicates at root are errors too (the root scope is reuse=No).
    b.get_variable("g", [1], Initializer::Zeros).unwrap();
    let e = b.get_variable("g", [1], Initializer::Zeros).unwrap_err();
    assert!(e.to_string().starts_with("Variable g already exists, disallowed."), "{e}");
}

#[test]
fn reusing_a_missing_variable() {
    let mut b = GraphBuilder::new();
    let e = fc_weights(&mut b, Reuse::Yes, [2, 4]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("Variable ConvNet/fc/weights does not exist, or was not created with get_variable()."),
        "{msg}"
    );
    assert!(!msg.contains("did you mean '"), "no close name yet: {msg}");
    // With a near miss in the store, the hint names it.
    b.variable_scope("ConvNet", Reuse::No, |b| {
        b.variable_scope("fc", Reuse::No, |b| b.get_variable("weight", [2, 4], Initializer::Zeros))
    })
    .unwrap();
    let msg = fc_weights(&mut b, Reuse::Yes, [2, 4]).unwrap_err().to_string();
    assert!(msg.ends_with("; did you mean 'ConvNet/fc/weight'?"), "{msg}");
}

#[test]
fn sharing_with_another_shape_or_dtype() {
    let mut b = GraphBuilder::new();
    b.variable_scope("fc", Reuse::No, |b| b.get_variable("weights", [2, 4], Initializer::Zeros)).unwrap();
    let e = b.variable_scope("fc", Reuse::Yes, |b| b.get_variable("weights", [3, 4], Initializer::Zeros)).unwrap_err();
    assert_eq!(e.to_string(), "Trying to share variable fc/weights, but specified shape [3,4] and found shape [2,4].");
    let e = b
        .variable_scope("fc", Reuse::Auto, |b| {
            b.get_variable_with(
                "weights",
                [2, 4],
                Initializer::Zeros,
                VariableOptions { dtype: DType::I32, ..Default::default() },
            )
        })
        .unwrap_err();
    assert_eq!(e.to_string(), "Trying to share variable fc/weights, but specified dtype i32 and found dtype f32.");
    // A partially known shape is compatible (TF checks compatibility, not equality).
    let ok = b.variable_scope("fc", Reuse::Yes, |b| b.get_variable("weights", [None, Some(4)], Initializer::Zeros));
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn a_variable_name_taken_by_an_op_is_a_duplicate() {
    let mut b = GraphBuilder::new();
    b.placeholder("x", DType::F32, [Some(1)]).unwrap();
    let e = b.variable_scope("s", Reuse::Auto, |b| {
        b.reuse_scope(Reuse::Auto, |b| b.name_scope("/", |b| b.get_variable("x", [1], Initializer::Zeros)))
    });
    // "/" is not a valid scope name; the store must still reject a clash at root.
    assert!(e.is_err());
    let e = b.reuse_scope(Reuse::Auto, |b| b.get_variable("x", [1], Initializer::Zeros)).unwrap_err();
    assert_eq!(e, GraphError::DuplicateName { name: "x".into() });
}

#[test]
fn variables_need_a_known_shape_and_valid_names() {
    let mut b = GraphBuilder::new();
    let e = b.get_variable("v", [None, Some(3)], Initializer::Zeros).unwrap_err();
    assert!(e.to_string().contains("a variable needs a fully known shape, got [?,3]"), "{e}");
    let e = b.get_variable("bad name", [1], Initializer::Zeros).unwrap_err();
    assert!(matches!(e, GraphError::BadScopeName { .. }), "{e:?}");
}
