//! ELU end to end: built with `GraphBuilder::elu`, differentiated,
//! compiled to a plan and run on the CPU backend, one SGD step checked
//! against values computed by hand (in f64).

use towers::compiler::{compile_train, CompileOptions};
use towers_codegen::{Kernel, Step};
use towers_graph::FusedStep;
use towers_graph::{DType, GraphBuilder, Initializer, Optimizer, Shape, UnaryOp, F32};
use towers_runtime::Session;

fn elu(z: f64) -> f64 {
    if z > 0.0 {
        z
    } else {
        z.exp() - 1.0
    }
}

#[test]
fn elu_trains_on_the_cpu_backend() {
    // loss = mean(elu(x * w)) over a [2, 3] batch, w = ones[3].
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, Shape(vec![None, Some(3)])).unwrap();
    let w = b.get_variable("w", vec![3], Initializer::Ones).unwrap();
    let z = b.mul(x, w).unwrap();
    let y = b.elu(z).unwrap();
    assert_eq!(b.graph().node(y.node).op.type_name(), "Elu");
    let m = b.reduce_mean_all(y).unwrap();
    b.identity(m, "loss").unwrap();
    let g = b.finish();

    let lr = 0.5;
    let c = compile_train(&g, "loss", &CompileOptions::new(Optimizer::Sgd { lr: F32(lr) }, 2)).expect("compiles");
    let launches: Vec<&Kernel> = c
        .plan
        .streams
        .iter()
        .flat_map(|s| &s.steps)
        .filter_map(|st| match st {
            Step::Launch { kernel, .. } => Some(kernel),
            _ => None,
        })
        .collect();
    // Elu and its gradient run, each on its own or inside a fused kernel
    // (here `elu(x * w)` and `elu_grad(..) * x` are chains the compiler fuses).
    let runs = |step: &dyn Fn(&FusedStep) -> bool, alone: Kernel| {
        launches
            .iter()
            .any(|k| **k == alone || matches!(k, Kernel::Fused { expr, .. } if expr.steps().iter().any(step)))
    };
    assert!(
        runs(&|s| matches!(s, FusedStep::Unary(UnaryOp::Elu, _)), Kernel::Unary { op: UnaryOp::Elu }),
        "{launches:?}"
    );
    assert!(
        runs(&|s| matches!(s, FusedStep::UnaryGrad(UnaryOp::Elu, ..)), Kernel::UnaryGrad { op: UnaryOp::Elu }),
        "{launches:?}"
    );
    let mut s = Session::new(1);
    s.load("train", c.plan).unwrap();
    let xs = [1.0f32, -1.0, 2.0, -2.0, 0.5, -0.5];
    s.feed("train", "x", &xs).unwrap();
    s.run("train").unwrap();

    // loss = Σ elu(x) / 6; dL/dw_j = Σ_rows elu'(x_rj) x_rj / 6 with
    // elu'(z) = 1 (z > 0), exp(z) (z <= 0); SGD: w -= lr * dL/dw.
    let want_loss = xs.iter().map(|&v| elu(v as f64)).sum::<f64>() / 6.0;
    let loss = s.fetch::<f32>("train", "loss").unwrap()[0] as f64;
    assert!((loss - want_loss).abs() < 1e-6, "loss {loss} vs {want_loss}");
    let w_after = s.variable::<f32>("w").unwrap();
    for j in 0..3 {
        let grad: f64 = (0..2)
            .map(|r| {
                let v = xs[r * 3 + j] as f64;
                (if v > 0.0 { 1.0 } else { v.exp() }) * v / 6.0
            })
            .sum();
        let want = 1.0 - lr as f64 * grad;
        assert!((w_after[j] as f64 - want).abs() < 1e-6, "w[{j}] = {} vs {want}", w_after[j]);
    }
}
