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
        assert_eq!(a.variable::<f32>(n).unwrap(), b.variable::<f32>(n).unwrap(), "{n}");
    }
    assert_eq!(b.variable::<i32>("global_step").unwrap(), &[0]);
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
    assert_eq!(b.variable::<f32>("fc/biases").unwrap(), &[1.0, 2.0]);
    // The next save replaces the stray file and the checkpoint.
    a.write_variable("fc/biases", &[3.0, 4.0]).unwrap();
    a.save(&path).unwrap();
    assert!(!temp_path(&path).exists());
    b.restore(&path).unwrap();
    assert_eq!(b.variable::<f32>("fc/biases").unwrap(), &[3.0, 4.0]);
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
    // A negative step count is refused, naming the variable; nothing is written.
    let e = a.set_variable("global_step", &[-3]).unwrap_err().to_string();
    assert!(e.contains("global_step") && e.contains("cannot be -3"), "{e}");
    a.set_variable("global_step", &[7]).unwrap();
    a.save(&path).unwrap();
    let mut b = Session::new(99);
    b.restore(&path).unwrap();
    // Every tensor but the learning rate, which stays the program's.
    let mut saved = a.variable_names();
    saved.retain(|n| n != "learning_rate");
    assert_eq!(b.variable_names(), saved);
    assert_eq!(b.variable::<f32>("fc/biases").unwrap(), &[0.5, -0.5]);
    b.write_variable("fc/biases", &[1.5, -1.5]).unwrap();
    b.load("train", common::mlp_plan()).unwrap();
    assert_eq!(b.variable::<f32>("fc/biases").unwrap(), &[1.5, -1.5]);
    assert_eq!(b.variable::<f32>("fc/weights").unwrap(), a.variable::<f32>("fc/weights").unwrap());
    assert_eq!(b.variable::<i32>("global_step").unwrap(), &[7]);
    // The restored values are the backend's now: a step updates them.
    b.feed("train", "x", &[0.0; 4]).unwrap();
    b.feed("train", "labels", &[0, 1]).unwrap();
    b.feed("train", "g", &[0.0; 4]).unwrap();
    b.run("train").unwrap();
    assert_eq!(b.variable::<i32>("global_step").unwrap(), &[8]);
}

/// The element type picks the dtype on both paths a variable's values take
/// (held by the backend, or restored and pending until a plan declares
/// them): the other type is `VariableDtype`, naming the variable and its
/// dtype, and leaves the values as they were.
#[test]
fn the_other_element_type_is_a_typed_error_held_or_pending() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let mut a = session();
    a.set_variable("global_step", &[7]).unwrap();
    let held = |e: RuntimeError, var: &str, dtype: &str| {
        assert!(matches!(&e, RuntimeError::VariableDtype { name, dtype: d } if name == var && d == dtype), "{e}");
    };
    held(a.write_variable("global_step", &[1.0f32]).unwrap_err(), "global_step", "i32");
    held(a.set_variable("fc/biases", &[1i32, 2]).unwrap_err(), "fc/biases", "f32");
    held(a.variable::<i32>("fc/biases").unwrap_err(), "fc/biases", "f32");
    held(a.read_variable_into("global_step", &mut [0f32]).unwrap_err(), "global_step", "i32");
    a.save(&path).unwrap();
    let mut b = Session::new(99);
    b.restore(&path).unwrap();
    held(b.write_variable("global_step", &[1.0f32]).unwrap_err(), "global_step", "i32");
    held(b.variable::<f32>("global_step").unwrap_err(), "global_step", "i32");
    held(b.set_variable("fc/biases", &[1i32, 2]).unwrap_err(), "fc/biases", "f32");
    held(b.variable_into("fc/biases", &mut [0i32; 2]).unwrap_err(), "fc/biases", "f32");
    assert_eq!(b.variable::<i32>("global_step").unwrap(), &[7]);
    assert_eq!(b.variable::<f32>("fc/biases").unwrap(), a.variable::<f32>("fc/biases").unwrap());
}

/// A variable holding NaN or Inf is never saved: the save is an error
/// naming it, and the previous checkpoint stays as it was.
#[test]
fn a_non_finite_variable_is_never_saved() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let mut a = session();
    a.save(&path).unwrap();
    let before = std::fs::read(&path).unwrap();
    a.write_variable("fc/biases", &[1.0, f32::INFINITY]).unwrap();
    let e = a.save(&path).unwrap_err();
    assert!(matches!(&e, RuntimeError::NonFiniteVariable { name, index: 1, .. } if name == "fc/biases"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert!(!temp_path(&path).exists());
}

/// Restore is strict (TF1's Saver): a tensor the session does not have is
/// refused, and a non-finite value is refused naming the tensor; the
/// partial restore loads what matches and lists the rest.
#[test]
fn restore_refuses_unknown_and_non_finite_tensors_and_partial_lists_what_it_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let mut a = session();
    a.write_variable("fc/biases", &[0.5, -0.5]).unwrap();
    a.save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView)> =
        st.tensors().into_iter().filter(|(n, _)| n != "fc/weights").collect();
    let two = [0u8; 8];
    tensors.push((
        "other/model".into(),
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &two).unwrap(),
    ));
    let foreign = dir.path().join("foreign.safetensors");
    std::fs::write(&foreign, safetensors::tensor::serialize(tensors, None).unwrap()).unwrap();
    let mut s = session();
    let e = s.restore(&foreign).unwrap_err();
    assert!(matches!(&e, RuntimeError::CheckpointMissing { name, .. } if name == "fc/weights"), "{e}");
    let skipped = s.restore_partial(&foreign).unwrap();
    assert_eq!(skipped.missing, ["fc/weights"]);
    assert_eq!(skipped.unknown, ["other/model"]);
    assert_eq!(s.variable::<f32>("fc/biases").unwrap(), &[0.5, -0.5]);
    assert!(!s.variable_names().contains(&"other/model".to_string()), "unknown tensors are not carried on");
    // Everything present, plus one unknown tensor: an exact resume refuses
    // it by name; a restore (TF1's Saver) keeps it for a later program.
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView)> = st.tensors();
    tensors.push((
        "other/model".into(),
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &two).unwrap(),
    ));
    std::fs::write(&foreign, safetensors::tensor::serialize(tensors, None).unwrap()).unwrap();
    let e = s.restore_ignoring(&foreign, |_| false).unwrap_err();
    assert!(matches!(&e, RuntimeError::CheckpointUnknown { names, .. } if names == &["other/model"]), "{e}");
    assert!(e.to_string().contains("restore_partial"), "{e}");
    let mut kept = session();
    kept.restore(&foreign).unwrap();
    assert_eq!(kept.variable::<f32>("other/model").unwrap(), &[0.0, 0.0], "kept for a program loaded later");
    // A NaN: refused, naming the tensor, by both restores.
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let nan = [f32::NAN.to_le_bytes(), 1f32.to_le_bytes()].concat();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView)> =
        st.tensors().into_iter().filter(|(n, _)| n != "fc/biases").collect();
    tensors.push((
        "fc/biases".into(),
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &nan).unwrap(),
    ));
    std::fs::write(&foreign, safetensors::tensor::serialize(tensors, None).unwrap()).unwrap();
    for e in [s.restore(&foreign).unwrap_err(), s.restore_partial(&foreign).unwrap_err()] {
        assert!(matches!(&e, RuntimeError::CheckpointNonFinite { name, index: 0, .. } if name == "fc/biases"), "{e}");
    }
    assert_eq!(s.variable::<f32>("fc/biases").unwrap(), &[0.5, -0.5], "nothing written from a refused file");
}

/// A target that is not a regular file is refused before anything is
/// opened (a FIFO would block, a device would be replaced), and a save
/// that fails removes its temporary file.
#[test]
fn non_regular_targets_are_refused_and_failed_saves_leave_no_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let mut s = session();
    for e in [s.save(&fifo).unwrap_err(), s.restore(&fifo).unwrap_err()] {
        assert!(e.to_string().contains("is a FIFO, not a regular file"), "{e}");
    }
    let null = dir.path().join("null");
    std::os::unix::fs::symlink("/dev/null", &null).unwrap();
    assert!(s.save(&null).unwrap_err().to_string().contains("character device"));
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device_like());
    // The rename fails (a folder with a file in it is in the way).
    let folder = dir.path().join("full");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("x"), b"x").unwrap();
    assert!(s.save(&folder).is_err());
    assert!(!temp_path(&folder).exists(), "the temporary file is removed on error");
    // Into a folder that does not exist, or through a file: the folder named, nothing written.
    let missing = dir.path().join("runs/1/model.safetensors");
    let e = s.save(&missing).unwrap_err().to_string();
    assert!(e.contains("runs/1 does not exist") && e.contains("create_dir_all"), "{e}");
    assert!(!dir.path().join("runs").exists());
    let through = folder.join("x").join("model.safetensors");
    let e = s.save(&through).unwrap_err().to_string();
    assert!(e.contains("full/x is not a folder"), "{e}");
}

trait CharDevice {
    fn is_char_device_like(&self) -> bool;
}
impl CharDevice for std::fs::FileType {
    fn is_char_device_like(&self) -> bool {
        std::os::unix::fs::FileTypeExt::is_char_device(self)
    }
}

/// Fine-tuning and resuming by hand, as a TF1 script did with `Saver`: the
/// learning rate stays the one the program was compiled with (in TF1 a
/// graph constant the Saver never saw), and the restored `global_step`
/// becomes every loaded program's step (dropout continues its masks).
#[test]
fn restore_keeps_the_programs_learning_rate_and_continues_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let mut a = session();
    a.write_variable("learning_rate", &[0.1]).unwrap();
    a.write_variable_i32("global_step", &[7]).unwrap();
    a.save(&path).unwrap();
    let mut b = session();
    let compiled = b.variable::<f32>("learning_rate").unwrap().to_vec();
    b.write_variable("learning_rate", &[0.001]).unwrap();
    b.restore(&path).unwrap();
    assert_eq!(b.variable::<f32>("learning_rate").unwrap(), &[0.001], "the learning rate is the program's");
    assert_eq!(b.variable::<i32>("global_step").unwrap(), &[7]);
    assert_eq!(b.steps_run("train").unwrap(), 7, "the step continues from global_step");
    // Restored before the program is loaded: the same.
    let mut c = Session::new(3);
    c.restore(&path).unwrap();
    c.load("train", common::mlp_plan()).unwrap();
    assert_eq!(c.variable::<f32>("learning_rate").unwrap(), compiled.as_slice());
    assert_eq!(c.steps_run("train").unwrap(), 7);
    // An exact resume restores the learning rate too.
    let mut d = session();
    d.restore_ignoring(&path, |_| false).unwrap();
    assert_eq!(d.variable::<f32>("learning_rate").unwrap(), &[0.1]);
}
