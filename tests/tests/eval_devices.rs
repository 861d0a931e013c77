//! TF1's evaluation graph (cifar10_eval.py) is the training tower's model
//! built again: its ops under `/gpu:0`, its variables created on `/cpu:0`
//! (`_variable_on_cpu`). `compile_eval` runs it where its scopes say (the
//! variables on the host, the ops on gpu:0, copies between), as it runs a
//! model without scopes: the same loss.

use towers::prelude::*;

/// x [N,4] -> dense 3 (weights made on `var_dev`, ops on `op_dev`) -> mean square.
fn model(op_dev: Option<&str>, var_dev: Option<&str>) -> Graph {
    let mut b = GraphBuilder::with_seed(5);
    let x = b.placeholder("x", DType::F32, [None, Some(4)]).unwrap();
    let body = |b: &mut GraphBuilder| -> Result<Tensor, GraphError> {
        let var = |b: &mut GraphBuilder, name: &str, shape: Vec<usize>| match var_dev {
            Some(d) => b.device(d, |b| b.get_variable(name, shape.clone(), Initializer::GlorotUniform)),
            None => b.get_variable(name, shape.clone(), Initializer::GlorotUniform),
        };
        let w = var(b, "w", vec![4, 3])?;
        let bias = var(b, "b", vec![3])?;
        let h = b.matmul(x, w)?;
        let h = b.bias_add(h, bias)?;
        let h = b.tanh(h)?;
        let sq = b.square(h)?;
        let loss = b.reduce_mean_all(sq)?;
        b.identity(loss, "loss")
    };
    match op_dev {
        Some(d) => b.device(d, body).unwrap(),
        None => body(&mut b).unwrap(),
    };
    b.finish()
}

fn eval_loss(g: &Graph) -> f32 {
    let c = compile_eval(g, &[("loss", "loss")], 3).expect("compiles");
    let mut s = Session::new(0);
    s.load("eval", c.plan).expect("loads");
    s.feed("eval", "x", &[0.5, -1.0, 2.0, 0.1, 1.5, 0.0, -0.5, 0.3, 0.2, 0.2, -0.7, 1.0]).unwrap();
    s.run("eval").unwrap();
    s.fetch::<f32>("eval", "loss").unwrap()[0]
}

#[test]
fn an_eval_graph_with_ops_on_gpu0_and_variables_on_the_cpu_runs_as_placed() {
    let plain = eval_loss(&model(None, None));
    let g = model(Some("/gpu:0"), Some("/cpu:0"));
    let c = compile_eval(&g, &[("loss", "loss")], 3).expect("TF1's eval graph compiles");
    let devices: Vec<String> = c.plan.devices.iter().map(|d| d.device.to_string()).collect();
    assert_eq!(devices, ["cpu:0", "gpu:0"], "run where the scopes say");
    let scoped = eval_loss(&g);
    assert!(plain > 0.0 && (scoped - plain).abs() <= 1e-6 * plain, "{scoped} vs {plain}");
}
