//! `b.split` (TF's `tf.split`) where its parts are views of the input: in a
//! tower the input is a copy of the batch rows or of a variable, and the CPU
//! backend elides copies by reading the source in place, so the views must
//! see the copied bytes; a variable split on axis 0 (a fused kernel cut
//! into blocks) is split by the kernel. Every case against its formula and
//! against one device.
//!
//! Before: a tower holding one row read zeros (4 towers on a batch of 4
//! gave loss 0), and a split variable failed to compile at 0 towers.

use towers::prelude::*;

/// loss = mean(x[:, 2, :] · w) over a [B, 3, 2] batch, one SGD step (lr 1):
/// the loss and dL/dw = mean over rows of x[:, 2, :] / 2.
fn step_split_rows(towers: u32, split: SplitPolicy, reuse: bool) -> (f32, Vec<f32>) {
    let mut b = GraphBuilder::with_seed(1);
    let x = b.placeholder("x", DType::F32, [None, Some(3), Some(2)]).unwrap();
    let w = b.get_variable("w", [2], Initializer::Ones).unwrap();
    let parts = b.split(x, 1, &[1, 1, 1]).unwrap();
    let xt = b.squeeze(parts[2], &[1]).unwrap();
    let m = b.mul(xt, w).unwrap();
    let l = b.reduce_mean_all(m).unwrap();
    b.identity(l, "loss").unwrap();
    let g = b.finish();
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(1.0) }, 4);
    o.towers = (0..towers).map(Device::gpu).collect();
    o.split = split;
    o.reuse_memory = reuse;
    let mut s = Session::new(1);
    s.load("train", compile_train(&g, "loss", &o).unwrap().plan).unwrap();
    let xs: Vec<f32> = (0..24).map(|i| i as f32).collect();
    s.feed("train", "x", &xs).unwrap();
    s.run("train").unwrap();
    let dw = s.variable::<f32>("w").unwrap().iter().map(|v| 1.0 - v).collect();
    (s.fetch::<f32>("train", "loss").unwrap()[0], dw)
}

#[test]
fn split_parts_of_a_towers_rows_read_the_rows_even_one_row_per_tower() {
    // Row r's step 2 is [6r + 4, 6r + 5]: the mean of the 8 values is 13.5,
    // and dL/dw_j = mean_r(x[r, 2, j]) / 2 = [6.5, 7.0].
    let (want_loss, want_dw) = (13.5f32, [6.5f32, 7.0]);
    let cases = [
        (0, SplitPolicy::Even, true),
        (2, SplitPolicy::Even, true),
        (4, SplitPolicy::Even, true),
        (4, SplitPolicy::Even, false),
        (2, SplitPolicy::Weighted(vec![3, 1]), true),
        (3, SplitPolicy::Weighted(vec![1, 1, 2]), true),
    ];
    for (towers, split, reuse) in cases {
        let what = format!("{towers} towers {split:?} reuse_memory {reuse}");
        let (loss, dw) = step_split_rows(towers, split, reuse);
        assert!((loss - want_loss).abs() < 1e-5, "{what}: loss {loss}, want {want_loss}");
        assert!(dw.iter().zip(want_dw).all(|(a, b)| (a - b).abs() < 1e-5), "{what}: dw {dw:?}, want {want_dw:?}");
    }
}

/// loss = mean(x·W0 + x·W1) with [W0; W1] = split(W, 2, axis 0), W = 0.5
/// everywhere, x = [[1, 2], [3, 4]]: each product's entries are the row
/// sums times 0.5, so the loss is 2 · mean(1.5, 3.5) = 5.
#[test]
fn a_split_variable_is_split_by_the_kernel_at_every_placement() {
    let mut b = GraphBuilder::with_seed(1);
    let x = b.placeholder("x", DType::F32, [None, Some(2)]).unwrap();
    let w = b.get_variable("w", [4, 2], Initializer::Constant(F32(0.5))).unwrap();
    let parts = b.split(w, 0, &[2, 2]).unwrap();
    let a = b.matmul(x, parts[0]).unwrap();
    let c = b.matmul(x, parts[1]).unwrap();
    let sum = b.add(a, c).unwrap();
    let l = b.reduce_mean_all(sum).unwrap();
    b.identity(l, "loss").unwrap();
    let g = b.finish();
    let mut reference: Option<Vec<f32>> = None;
    for (towers, variables) in
        [(0, VarPlacement::Cpu), (1, VarPlacement::Cpu), (2, VarPlacement::Cpu), (2, VarPlacement::Gpu0)]
    {
        let what = format!("{towers} towers, variables {variables:?}");
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 2);
        o.towers = (0..towers).map(Device::gpu).collect();
        o.variables = variables;
        let c = compile_train(&g, "loss", &o).unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut s = Session::new(1);
        s.load("train", c.plan).unwrap();
        s.feed("train", "x", &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
        s.run("train").unwrap();
        let loss = s.fetch::<f32>("train", "loss").unwrap()[0];
        assert!((loss - 5.0).abs() < 1e-6, "{what}: loss {loss}, want 5");
        let w = s.variable::<f32>("w").unwrap();
        match &reference {
            None => reference = Some(w),
            Some(r) => assert!(r.iter().zip(&w).all(|(a, b)| (a - b).abs() < 1e-6), "{what}: {w:?} vs {r:?}"),
        }
    }
}
