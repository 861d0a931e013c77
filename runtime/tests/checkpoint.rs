//! Checkpoints: round trip, crash safety, checked restore.

mod common;

use towers_runtime::{checkpoint::temp_path, RuntimeError, Session};

fn session() -> Session {
    let mut s = Session::new(3);
    s.load("train", common::mlp_plan()).unwrap();
    s
}

#[test]
fn round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let mut a = session();
    a.write_variable("fc/biases", &[0.25, -4.0]).unwrap();
    a.save(&path).unwrap();
    let mut b = Session::new(99);
    b.load("train", common::mlp_plan()).unwrap();
    b.restore(&path).unwrap();
    for n in ["fc/biases", "fc/weights"] {
        assert_eq!(a.read_variable(n).unwrap(), b.read_variable(n).unwrap(), "{n}");
    }
    assert_eq!(b.read_variable_i32("global_step").unwrap(), &[0]);
}

#[test]
fn a_stray_temporary_file_never_destroys_the_previous_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let mut a = session();
    a.write_variable("fc/biases", &[1.0, 2.0]).unwrap();
    a.save(&path).unwrap();
    // A crash mid-save leaves a partial temporary file behind.
    std::fs::write(temp_path(&path), b"partial garbage").unwrap();
    let mut b = session();
    b.restore(&path).unwrap();
    assert_eq!(b.read_variable("fc/biases").unwrap(), &[1.0, 2.0]);
    // The next save replaces the stray file and the checkpoint.
    a.write_variable("fc/biases", &[3.0, 4.0]).unwrap();
    a.save(&path).unwrap();
    assert!(!temp_path(&path).exists());
    b.restore(&path).unwrap();
    assert_eq!(b.read_variable("fc/biases").unwrap(), &[3.0, 4.0]);
}

#[test]
fn wrong_shape_fails_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, b"").unwrap();
    let mut other = Session::new(0);
    // Save a checkpoint where fc/biases has 3 elements.
    other.load("p", common::mlp_plan()).unwrap();
    other.save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView)> =
        st.tensors().into_iter().filter(|(n, _)| n != "fc/biases").collect();
    let three = [0u8; 12];
    tensors.push((
        "fc/biases".into(),
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![3], &three).unwrap(),
    ));
    std::fs::write(&path, safetensors::tensor::serialize(tensors, None).unwrap()).unwrap();
    let mut s = session();
    let e = s.restore(&path).unwrap_err();
    assert!(matches!(&e, RuntimeError::CheckpointMismatch { name, .. } if name == "fc/biases"), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("[3]") && msg.contains("[2]"), "{msg}");
}

#[test]
fn restoring_before_loading_keeps_the_values_until_a_plan_declares_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let mut a = session();
    a.write_variable("fc/biases", &[0.5, -0.5]).unwrap();
    a.write_variable_i32("global_step", &[7]).unwrap();
    a.save(&path).unwrap();
    let mut b = Session::new(99);
    b.restore(&path).unwrap();
    assert_eq!(b.variable_names(), a.variable_names());
    assert_eq!(b.read_variable("fc/biases").unwrap(), &[0.5, -0.5]);
    b.write_variable("fc/biases", &[1.5, -1.5]).unwrap();
    b.load("train", common::mlp_plan()).unwrap();
    assert_eq!(b.read_variable("fc/biases").unwrap(), &[1.5, -1.5]);
    assert_eq!(b.read_variable("fc/weights").unwrap(), a.read_variable("fc/weights").unwrap());
    assert_eq!(b.read_variable_i32("global_step").unwrap(), &[7]);
    // The restored values are the backend's now: a step updates them.
    b.feed_f32("train", "x", &[0.0; 4]).unwrap();
    b.feed_i32("train", "labels", &[0, 1]).unwrap();
    b.feed_f32("train", "g", &[0.0; 4]).unwrap();
    b.run("train").unwrap();
    assert_eq!(b.read_variable_i32("global_step").unwrap(), &[8]);
}
