//! Shape errors name the op type, the node, its scope and both shapes.

use towers_graph::{DType, GraphBuilder, GraphError, Initializer, Padding, Reuse};

fn in_tower<T>(
    b: &mut GraphBuilder,
    f: impl FnOnce(&mut GraphBuilder) -> Result<T, GraphError>,
) -> Result<T, GraphError> {
    b.name_scope("tower_0", |b| b.variable_scope("fc", Reuse::No, f))
}

#[test]
fn matmul_inner_dimensions() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(784)]).unwrap();
    let e = in_tower(&mut b, |b| {
        let w = b.get_variable("weights", [100, 10], Initializer::Zeros)?;
        b.matmul(x, w)
    })
    .unwrap_err();
    assert!(matches!(e, GraphError::Shape { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "MatMul 'tower_0/fc/MatMul' (in scope 'tower_0/fc'): Dimensions must be equal, but are 784 and 100: \
         shapes [?,784] and [100,10] (transpose_a=false, transpose_b=false)"
    );
    // The failed op leaves no node behind.
    assert!(b.graph().get("tower_0/fc/MatMul").is_none());
}

#[test]
fn add_with_incompatible_broadcast() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(3)]).unwrap();
    let y = b.placeholder("y", DType::F32, [Some(4)]).unwrap();
    let e = b.name_scope("s", |b| b.add(x, y)).unwrap_err();
    assert_eq!(e.to_string(), "Add 's/add' (in scope 's'): shapes [?,3] and [4] cannot be broadcast together");
    // Broadcasting that works: [?,3] + [3] and [?,1] + [1,3].
    let z = b.placeholder("z", DType::F32, [Some(3)]).unwrap();
    let s = b.add(x, z).unwrap();
    assert_eq!(b.graph().tensor_type(s).unwrap().shape.to_string(), "[?,3]");
    let c = b.placeholder("c", DType::F32, [None, Some(1)]).unwrap();
    let r = b.placeholder("r", DType::F32, [Some(1), Some(3)]).unwrap();
    let s = b.mul(c, r).unwrap();
    assert_eq!(b.graph().tensor_type(s).unwrap().shape.to_string(), "[?,3]");
}

#[test]
fn conv2d_channel_mismatch() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("images", DType::F32, [None, Some(28), Some(28), Some(3)]).unwrap();
    let e = b
        .variable_scope("conv1", Reuse::No, |b| {
            let w = b.get_variable("weights", [5, 5, 1, 32], Initializer::Zeros)?;
            b.conv2d(x, w, [1, 1], Padding::Same)
        })
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("Conv2D 'conv1/Conv2D' (in scope 'conv1'): "), "{msg}");
    assert!(msg.contains("[?,28,28,3] (3) do not match filter [5,5,1,32] in-channels (1)"), "{msg}");
}

#[test]
fn reshape_with_wrong_element_count() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [Some(2), Some(3)]).unwrap();
    let e = b.reshape(x, &[4]).unwrap_err();
    assert_eq!(e.to_string(), "Reshape 'Reshape' (in scope ''): cannot reshape [2,3] (6 elements) into [4]");
    let e = b.reshape(x, &[-1, 4]).unwrap_err();
    assert!(e.to_string().contains("cannot reshape [2,3] (6 elements) into [-1, 4]"), "{e}");
    let e = b.reshape(x, &[-1, -1]).unwrap_err();
    assert!(e.to_string().contains("at most one -1"), "{e}");
}

#[test]
fn reshape_with_unknown_batch_accepts_any_divisible_target() {
    // TF accepts reshape([?,6], [-1,4]) at graph build: a batch of 2 makes it valid.
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(6)]).unwrap();
    let y = b.reshape(x, &[-1, 4]).unwrap();
    assert_eq!(b.graph().tensor_type(y).unwrap().shape.to_string(), "[?,4]");
    let y = b.reshape(x, &[-1, 2, 3]).unwrap();
    assert_eq!(b.graph().tensor_type(y).unwrap().shape.to_string(), "[?,2,3]");
}

#[test]
fn bias_add_width_mismatch() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(10)]).unwrap();
    let e = b
        .variable_scope("logits", Reuse::No, |b| {
            let bias = b.get_variable("biases", [12], Initializer::Zeros)?;
            b.bias_add(x, bias)
        })
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "BiasAdd 'logits/BiasAdd' (in scope 'logits'): bias [12] must match the last dimension of value [?,10] (rank >= 2)"
    );
}

#[test]
fn wrong_arity_names_the_node() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [Some(2), Some(2)]).unwrap();
    let e = b.op("mm", towers_graph::Op::MatMul { transpose_a: false, transpose_b: false }, &[x]).unwrap_err();
    assert_eq!(e.to_string(), "MatMul 'mm' (in scope '') expects 2 inputs, got 1");
}

#[test]
fn flatten_with_unknown_inner_dimension_names_the_scope() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, None, Some(3)]).unwrap();
    let e = b.flatten(x).unwrap_err();
    assert!(
        e.to_string().starts_with("Reshape 'Flatten' (in scope ''): flatten needs all but the batch dimension known"),
        "{e}"
    );
    let e = b.name_scope("net", |b| b.flatten(x)).unwrap_err();
    assert!(e.to_string().starts_with("Reshape 'net/Flatten' (in scope 'net')"), "{e}");
}

/// Integer class labels given to the dense cross-entropy: the error points
/// to the sparse variant.
#[test]
fn dense_cross_entropy_with_integer_labels_suggests_the_sparse_variant() {
    let mut b = GraphBuilder::new();
    let logits = b.placeholder("logits", DType::F32, [None, Some(10)]).unwrap();
    let labels = b.placeholder("labels", DType::I32, [None]).unwrap();
    let e = b.softmax_cross_entropy_with_logits(logits, labels).unwrap_err().to_string();
    assert!(e.contains("SoftmaxCrossEntropyWithLogits"), "{e}");
    assert!(e.contains("use sparse_softmax_cross_entropy_with_logits for integer class labels"), "{e}");
}

/// reduce_max/reduce_min, the comparisons and where name the node and
/// say what to write instead.
#[test]
fn reduce_max_compare_and_where_errors_name_the_node() {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [None, Some(3)]).unwrap();
    let ids = b.placeholder("ids", DType::I32, [None, Some(3)]).unwrap();
    let e = b.name_scope("pool", |b| b.reduce_max(ids, &[1], false)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Max 'pool/Max' (in scope 'pool'): reduce_max/reduce_min take f32, got i32[?,3]; cast the input first (b.cast(x, DType::F32))"
    );
    let e = b.reduce_min(x, &[2], false).unwrap_err().to_string();
    assert!(e.starts_with("Min 'Min'"), "{e}");
    let e = b.greater(x, ids).unwrap_err().to_string();
    assert!(e.starts_with("Greater 'Greater'") && e.contains("cast one operand"), "{e}");
    let row = b.placeholder("row", DType::F32, [Some(4)]).unwrap();
    let e = b.less(x, row).unwrap_err().to_string();
    assert!(e.starts_with("Less 'Less'") && e.contains("cannot be compared"), "{e}");
    let c = b.greater(x, x).unwrap();
    assert_eq!(b.graph().tensor_type(c).unwrap().dtype, DType::Bool);
    let e = b.where_(x, x, x).unwrap_err().to_string();
    assert!(e.starts_with("Select 'Select'") && e.contains("condition must be bool"), "{e}");
    let col = b.placeholder("col", DType::Bool, [Some(3)]).unwrap();
    let x2 = b.placeholder("x2", DType::F32, [Some(2), Some(3)]).unwrap();
    let e = b.where_(col, x2, x2).unwrap_err().to_string();
    assert!(e.contains("or be a vector of its first dimension"), "{e}");
    let rows = b.placeholder("rows", DType::Bool, [None]).unwrap();
    let w = b.where_(rows, x, x).unwrap();
    assert_eq!(b.graph().tensor_type(w).unwrap().shape, towers_graph::Shape(vec![None, Some(3)]));
}
