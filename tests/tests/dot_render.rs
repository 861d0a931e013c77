//! The compiled graph's dot renders with plain `dot -Tsvg` (Debian's
//! Graphviz), both the full view and the collapsed view: seed 003's slim
//! convnet (batch norm with decay 0.9, l2 5e-4, truncated-normal weights,
//! SAME convolutions, dropout) at 2 towers, variables on the CPU, and the
//! seed models. Without `dot` installed the tests say so loudly and pass,
//! unless `CI` is set: then they fail.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use towers::models::{build, ModelKind, ModelSpec};
use towers::prelude::*;
use towers_graph::{dot::to_dot_collapsed, GraphError, VariableOptions};

/// slim's conv2d with batch norm: weights `stddev=0.01`, l2 5e-4, no bias
/// (the normalizer's beta takes its place), relu.
fn conv_bn(b: &mut GraphBuilder, name: &str, x: Tensor, filters: usize, k: usize) -> Result<Tensor, GraphError> {
    let in_c = b.graph().tensor_type(x)?.shape.dim(3).unwrap_or(0);
    b.variable_scope(name, Reuse::No, |b| {
        let init = Initializer::TruncatedNormal { mean: F32(0.0), stddev: F32(0.01) };
        let opts = VariableOptions { l2_regularizer: Some(5e-4), ..Default::default() };
        let w = b.get_variable_with("weights", [k, k, in_c, filters], init, opts)?;
        let y = b.conv2d(x, w, [1, 1], Padding::Same)?;
        let y = layers::batch_norm(b, "BatchNorm", y, 0.9, 1e-3)?;
        b.relu(y)
    })
}

/// Seed 003's slim convnet on 28x28x1; returns the graph and its loss.
pub fn slim_convnet() -> Result<(Graph, String), GraphError> {
    let mut b = GraphBuilder::with_seed(3);
    let x = b.placeholder("images", DType::F32, [None, Some(28), Some(28), Some(1)])?;
    let y = b.placeholder("labels", DType::I32, [None])?;
    let logits = b.variable_scope("ConvNet", Reuse::No, |b| {
        let h = conv_bn(b, "conv1", x, 32, 5)?;
        let h = b.max_pool(h, [2, 2], [2, 2], Padding::Same)?;
        let h = conv_bn(b, "conv2", h, 64, 5)?;
        let h = b.max_pool(h, [2, 2], [2, 2], Padding::Same)?;
        let h = b.flatten(h)?;
        let h = layers::dense(b, "fc3", h, 256, Activation::Relu)?;
        let h = b.dropout(h, 0.5)?;
        layers::dense(b, "fc4", h, 10, Activation::None)
    })?;
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y)?;
    let data_loss = b.reduce_mean_all(xent)?;
    let reg = b.regularization_loss()?.expect("two regularized weights");
    let loss = b.add(data_loss, reg)?;
    let loss = b.identity(loss, "total_loss")?;
    let g = b.finish();
    let name = g.node(loss.node).name.clone();
    Ok((g, name))
}

/// Render `dot` text with `dot -Tsvg`; `None` when Graphviz is missing
/// (loudly, and a failure when `CI` is set). Fails on a non-zero exit, on
/// Graphviz's "trouble in init_rank", or past `limit`.
fn render(what: &str, text: &str, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let child =
        Command::new("dot").arg("-Tsvg").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but Graphviz's `dot` cannot run ({e}): apt-get install graphviz"
            );
            eprintln!(
                "\n!!! SKIPPED rendering {what}: Graphviz's `dot` is not installed ({e}); apt-get install graphviz\n"
            );
            return None;
        }
    };
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write the dot text");
    let out = child.wait_with_output().expect("dot ran");
    let took = start.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what}: dot -Tsvg failed ({}): {}",
        out.status,
        err.lines().take(5).collect::<Vec<_>>().join("\n")
    );
    // Graphviz's ranking and routing failures, which it sometimes reports
    // as warnings with exit status 0.
    for bad in ["trouble in init_rank", "lost ", "triangulation failed", "seriously wrong"] {
        assert!(
            !err.contains(bad),
            "{what}: Graphviz said {bad:?}: {}",
            err.lines().take(5).collect::<Vec<_>>().join("\n")
        );
    }
    assert!(String::from_utf8_lossy(&out.stdout).contains("<svg"), "{what}: no SVG");
    assert!(took < limit, "{what}: dot took {took:?}");
    Some(took)
}

fn compiled(g: &Graph, loss: &str, towers: u32) -> Compiled {
    compiled_with(g, loss, towers, 64, VarPlacement::Cpu)
}

fn compiled_with(g: &Graph, loss: &str, towers: u32, batch: usize, variables: VarPlacement) -> Compiled {
    let mut o = CompileOptions::new(Optimizer::Momentum { lr: F32(0.01), momentum: F32(0.9), nesterov: false }, batch);
    o.towers = (0..towers).map(Device::gpu).collect();
    o.variables = variables;
    compile_train(g, loss, &o).expect("compiles")
}

#[test]
fn the_slim_convnet_at_two_towers_renders_with_plain_dot() {
    let (g, loss) = slim_convnet().expect("builds");
    let c = compiled(&g, &loss, 2);
    let full = to_dot(&c.graph).expect("dot");
    if let Some(dir) = std::env::var_os("DOT_DUMP") {
        std::fs::write(std::path::Path::new(&dir).join("slim2.dot"), &full).expect("dump");
    }
    assert_eq!(full, to_dot(&c.graph).expect("dot"), "deterministic");
    if let Some(t) = render("slim convnet, 2 towers", &full, Duration::from_secs(30)) {
        eprintln!("slim convnet, 2 towers, {} nodes: dot -Tsvg took {t:?}", c.graph.len());
    }
    let small = to_dot_collapsed(&c.graph).expect("collapsed dot");
    render("slim convnet, 2 towers, collapsed", &small, Duration::from_secs(30));
}

#[test]
fn the_seed_models_render_in_both_views() {
    for kind in [ModelKind::Mlp, ModelKind::Convnet] {
        let mut spec = ModelSpec::new(kind, [28, 28, 1], 10);
        spec.batch_norm = kind == ModelKind::Convnet;
        let m = build(&spec).expect("builds");
        for towers in [0, 2] {
            let c = compiled(&m.graph, &m.loss, towers);
            let what = format!("{kind:?}, {towers} towers");
            render(&what, &to_dot(&c.graph).expect("dot"), Duration::from_secs(30));
            render(&format!("{what}, collapsed"), &to_dot_collapsed(&c.graph).expect("dot"), Duration::from_secs(30));
        }
    }
}

/// The collapsed view clusters groups by device, and with variables spread
/// over the towers (round-robin, greedy) its edges cross clusters both
/// ways: old dot ranking failed there ("trouble in init_rank", "lost edge")
/// until the view asked for `newrank`.
#[test]
fn the_collapsed_view_renders_with_variables_spread_over_four_towers() {
    for kind in [ModelKind::Mlp, ModelKind::Convnet] {
        let mut spec = ModelSpec::new(kind, [28, 28, 1], 10);
        spec.batch_norm = kind == ModelKind::Convnet;
        let m = build(&spec).expect("builds");
        for towers in [3, 4] {
            for variables in [VarPlacement::Gpu0, VarPlacement::RoundRobin, VarPlacement::Greedy] {
                let c = compiled_with(&m.graph, &m.loss, towers, 60, variables);
                let what = format!("{kind:?}, {towers} towers, variables {variables:?}, collapsed");
                render(&what, &to_dot_collapsed(&c.graph).expect("dot"), Duration::from_secs(30));
            }
        }
    }
}
