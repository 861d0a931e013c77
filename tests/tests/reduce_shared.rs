//! A reduction read by the model and directly by a loss term
//! (`loss = mean(f(s)) + mean(s)` with `s = reduce_sum(x·w, last axis)`):
//! the gradient of `s` adds a scalar's uniform gradient to a full one.
//! `simplify` once wrote that sum back into autodiff's `AddN`, which does
//! not broadcast, and the compile failed in a gradient node the user never
//! wrote. Each case compiles and its update equals central differences.

use towers::prelude::*;

fn graph(rank: usize, reduce_mean: bool, f: &str) -> Graph {
    let mut b = GraphBuilder::with_seed(1);
    let mut dims = vec![None];
    dims.extend((1..rank).map(|_| Some(2)));
    let x = b.placeholder("x", DType::F32, Shape(dims)).unwrap();
    let w = b.get_variable("w", [2], Initializer::Constant(F32(0.7))).unwrap();
    let h = b.mul(x, w).unwrap();
    let s =
        if reduce_mean { b.reduce_mean(h, &[rank - 1], false) } else { b.reduce_sum(h, &[rank - 1], false) }.unwrap();
    let p = match f {
        "softmax" => b.softmax(s).unwrap(),
        "log_softmax" => b.log_softmax(s).unwrap(),
        _ => {
            let s2 = if rank == 3 { s } else { b.reshape(s, &[-1, 2]).unwrap() };
            let w2 = b.get_variable("w2", [2, 2], Initializer::Constant(F32(0.3))).unwrap();
            b.matmul(s2, w2).unwrap()
        }
    };
    let a = b.reduce_mean_all(p).unwrap();
    let c = b.reduce_mean_all(s).unwrap();
    let loss = b.add(a, c).unwrap();
    b.identity(loss, "loss").unwrap();
    b.finish()
}

fn input(rank: usize) -> Vec<f32> {
    (0..2 * 2usize.pow(rank as u32 - 1)).map(|i| ((i * 5 % 7) as f32 - 3.0) / 3.0).collect()
}

#[test]
fn a_reduction_read_by_the_model_and_the_loss_compiles_and_its_gradient_is_right() {
    for rank in [2, 3] {
        for reduce_mean in [false, true] {
            for f in ["softmax", "log_softmax", "matmul"] {
                let what = format!("rank {rank}, reduce_{}, then {f}", if reduce_mean { "mean" } else { "sum" });
                let g = graph(rank, reduce_mean, f);
                let xs = input(rank);
                // One SGD step with lr 1: the update is the gradient.
                let c = compile_train(&g, "loss", &CompileOptions::new(Optimizer::Sgd { lr: F32(1.0) }, 2))
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let mut s = Session::new(0);
                s.load("train", c.plan).unwrap();
                s.feed("train", "x", &xs).unwrap();
                s.run("train").unwrap();
                let grad: Vec<f32> = s.variable::<f32>("w").unwrap().iter().map(|v| 0.7 - v).collect();
                // Central differences of the loss in w, on an evaluation program.
                let mut e = Session::new(0);
                e.load("eval", compile_eval(&g, &[("loss", "loss")], 2).unwrap().plan).unwrap();
                e.feed("eval", "x", &xs).unwrap();
                let h = 1e-2f32;
                for j in 0..2 {
                    let mut at = |d: f32| {
                        let mut w = [0.7f32; 2];
                        w[j] += d;
                        e.set_variable("w", &w).unwrap();
                        e.run("eval").unwrap();
                        e.fetch::<f32>("eval", "loss").unwrap()[0] as f64
                    };
                    let numeric = ((at(h) - at(-h)) / (2.0 * h as f64)) as f32;
                    assert!(
                        (grad[j] - numeric).abs() <= 2e-3 * numeric.abs().max(0.1),
                        "{what}: dL/dw[{j}] {} by autodiff, {numeric} by differences",
                        grad[j]
                    );
                }
            }
        }
    }
}
