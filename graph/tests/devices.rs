//! Device scopes: TF1 strings, merging of nested scopes (anchor F21, F22).

use towers_graph::{DType, DeviceSpec, GraphBuilder, GraphError, Initializer, Reuse};

fn requested(b: &GraphBuilder, t: towers_graph::Tensor) -> String {
    b.graph().node(t.node).requested_device.to_string()
}

#[test]
fn nested_scopes_merge_inner_fields_over_outer() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [Some(2)]).unwrap();
    let (outer, inner) = b
        .device("/job:worker", |b| {
            let o = b.neg(x)?;
            let i = b.device("/gpu:1", |b| b.neg(x))?;
            Ok::<_, GraphError>((o, i))
        })
        .unwrap();
    assert_eq!(requested(&b, x), "");
    assert_eq!(requested(&b, outer), "/job:worker");
    assert_eq!(requested(&b, inner), "/job:worker/device:GPU:1");
    // The scope ends with its closure.
    let after = b.neg(x).unwrap();
    assert_eq!(requested(&b, after), "");
}

#[test]
fn a_variable_under_cpu_inside_a_gpu_scope() {
    let mut b = GraphBuilder::new();
    let (v, op) = b
        .device("/gpu:0", |b| {
            let v = b.device("/cpu:0", |b| {
                b.variable_scope("fc", Reuse::No, |b| b.get_variable("w", [2], Initializer::Zeros))
            })?;
            let op = b.neg(v)?;
            Ok::<_, GraphError>((v, op))
        })
        .unwrap();
    assert_eq!(requested(&b, v), "/device:CPU:0");
    assert_eq!(requested(&b, op), "/device:GPU:0");
    // Another index of the same kind overrides only the index.
    let t = b.device("/job:ps/task:1/gpu:0", |b| b.device("/device:GPU:3", |b| b.neg(v))).unwrap();
    assert_eq!(requested(&b, t), "/job:ps/task:1/device:GPU:3");
}

#[test]
fn legacy_and_canonical_forms_are_equal() {
    for (a, c) in [("/gpu:1", "/device:GPU:1"), ("/CPU:0", "/device:cpu:0"), ("/GPU:*", "/device:GPU:*")] {
        assert_eq!(DeviceSpec::parse(a).unwrap(), DeviceSpec::parse(c).unwrap(), "{a} vs {c}");
    }
    assert_eq!(DeviceSpec::parse("/GPU:*").unwrap().to_string(), "/device:GPU:*");
}

#[test]
fn unknown_device_strings_are_errors_with_tf_text() {
    let mut b = GraphBuilder::new();
    let e = b.device("/tpu:0", |b| b.placeholder("x", DType::F32, [Some(1)])).unwrap_err();
    assert_eq!(e.to_string(), "Malformed device specification '/tpu:0': Unknown attribute: 'tpu:0' in '/tpu:0'");
    let e = b.device("/job:w/bogus:1", |b| b.placeholder("x", DType::F32, [Some(1)])).unwrap_err();
    assert!(e.to_string().contains("Unknown attribute: 'bogus:1' in '/job:w/bogus:1'"), "{e}");
    let e = DeviceSpec::parse("/gpu:0/cpu:0").unwrap_err();
    assert!(e.to_string().contains("Cannot specify multiple device types: /gpu:0/cpu:0"), "{e}");
    let e = DeviceSpec::parse("/gpu:one").unwrap_err();
    assert!(e.to_string().contains("invalid literal for int: one"), "{e}");
    let e = GraphError::from(towers_graph::Device::parse("/gpu:*").unwrap_err());
    assert!(matches!(e, GraphError::IncompleteDevice { .. }), "{e:?}");
    // Nothing was created by the failed scopes.
    assert!(b.graph().is_empty());
}
