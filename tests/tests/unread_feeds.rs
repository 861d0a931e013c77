//! TF1's `feed_dict` takes any placeholder of the graph: one dictionary of
//! images, labels and flags is fed to the training and the evaluation step
//! alike. A program that does not read a placeholder (pruned: nothing it
//! computes depends on it) checks such a feed against the placeholder's
//! type and ignores it; a name that is no placeholder of the graph stays an
//! error.

use towers::prelude::*;

fn graph() -> Graph {
    let mut b = GraphBuilder::with_seed(1);
    let x = b.placeholder("images", DType::F32, [None, Some(3)]).unwrap();
    let y = b.placeholder("labels", DType::I32, [None]).unwrap();
    b.placeholder("keep_prob", DType::F32, [0usize; 0]).unwrap();
    let logits = layers::dense(&mut b, "fc", x, 2, Activation::None).unwrap();
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y).unwrap();
    let loss = b.reduce_mean(xent, &[0], false).unwrap();
    b.identity(loss, "loss").unwrap();
    b.identity(logits, "predictions").unwrap();
    b.finish()
}

#[test]
fn an_unread_placeholder_is_checked_and_ignored_as_in_a_tf1_feed_dict() {
    let g = graph();
    let mut s = Session::new(0);
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 4);
    o.towers = vec![Device::gpu(0), Device::gpu(1)];
    s.load("train", compile_train(&g, "loss", &o).unwrap().plan).unwrap();
    s.load("eval", compile_eval(&g, &[("predictions", "predictions")], 4).unwrap().plan).unwrap();
    let images: Vec<f32> = (0..12).map(|i| i as f32 / 12.0).collect();
    let labels = [0i32, 1, 1, 0];
    // One feed_dict for both programs: the step and then the evaluation.
    for program in ["train", "eval"] {
        s.feed(program, "images", &images).unwrap();
        s.feed(program, "labels", &labels).unwrap();
        s.feed(program, "keep_prob", &[0.5f32]).unwrap();
        s.run(program).unwrap();
    }
    assert_eq!(s.fetch::<f32>("eval", "predictions").unwrap().len(), 8);

    // Checked against the placeholder's type before it is ignored.
    let e = s.feed("eval", "labels", &[0.5f32; 4]).unwrap_err().to_string();
    assert!(e.contains("does not read placeholder 'labels'") && e.contains("it is i32, not f32"), "{e}");
    let e = s.feed("eval", "keep_prob", &[0.5f32, 0.5]).unwrap_err().to_string();
    assert!(e.contains("2 elements do not fill its shape []"), "{e}");
    // Any number of rows fills an unknown batch; a partial row does not.
    let e = s.feed("train", "keep_prob", &[1.0f32; 3]).unwrap_err().to_string();
    assert!(e.contains("'keep_prob'"), "{e}");
    // In place there is no memory to lend: an error that says what to do.
    let e = s.feed_with("eval", "labels", |l: &mut [i32]| l.len()).unwrap_err().to_string();
    assert!(e.contains("Session::feed"), "{e}");
    // A name the graph does not have is still an error.
    let e = s.feed("eval", "lables", &labels).unwrap_err().to_string();
    assert!(e.contains("no feed named 'lables'"), "{e}");
}
