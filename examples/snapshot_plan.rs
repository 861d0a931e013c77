//! Snapshot-testing your own compiled plan and placement report with insta.
//!
//! The structural plan text ([`towers::codegen::Plan::to_structure_text`])
//! leaves out arena sizes, offsets and byte counts, so a change to one layer
//! shows in review as the lines whose shapes or kernels depend on it, not
//! as every offset after it. The placement report says where each variable
//! and op group lives and why. Run the tests with `cargo test --example
//! snapshot_plan`; after a deliberate change, review the `.snap.new` files
//! (`cargo insta review`, or `INSTA_UPDATE=always` and `git diff`). `cargo
//! run --example snapshot_plan` prints both texts.

use towers::prelude::*;

/// Your model: an MLP of one hidden layer of `width` units.
fn model(width: usize) -> Result<(Graph, String), Box<dyn std::error::Error>> {
    let mut b = GraphBuilder::with_seed(7);
    let x = b.placeholder("images", DType::F32, [None, Some(8), Some(8), Some(1)])?;
    let y = b.placeholder("labels", DType::I32, [None])?;
    let logits = b.variable_scope("MLP", Reuse::No, |b| {
        let h = b.flatten(x)?;
        let h = layers::dense(b, "fc1", h, width, Activation::Relu)?;
        layers::dense(b, "logits", h, 10, Activation::None)
    })?;
    let xent = b.sparse_softmax_cross_entropy_with_logits(logits, y)?;
    let loss = b.reduce_mean_all(xent)?;
    let loss = b.identity(loss, "loss")?;
    let g = b.finish();
    let name = g.node(loss.node).name.clone();
    Ok((g, name))
}

/// Two towers, variables on the CPU, global batch 32.
fn compile(width: usize) -> Result<Compiled, Box<dyn std::error::Error>> {
    let (g, loss) = model(width)?;
    let mut opts = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 32);
    opts.towers = vec![Device::gpu(0), Device::gpu(1)];
    Ok(compile_train(&g, &loss, &opts)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let c = compile(32)?;
    println!("{}", c.plan.to_structure_text());
    println!("{}", placement_report(&c.graph, &c.plan));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn my_plan_and_placement() {
        let c = compile(32).expect("compiles");
        insta::assert_snapshot!("my_plan", c.plan.to_structure_text());
        insta::assert_snapshot!("my_placement", placement_report(&c.graph, &c.plan));
    }

    /// What a reviewer sees when `fc1` grows from 32 to 48 units: the
    /// structural text changes only on lines that mention the new width;
    /// the full text also moves offsets on lines that have nothing to do
    /// with it.
    #[test]
    fn a_width_change_touches_only_the_lines_that_depend_on_it() {
        let (a, b) = (compile(32).expect("compiles"), compile(48).expect("compiles"));
        let changed = |x: &str, y: &str| -> Vec<String> {
            let old: std::collections::BTreeSet<&str> = x.lines().collect();
            y.lines().filter(|l| !old.contains(l)).map(str::to_string).collect()
        };
        let structural = changed(&a.plan.to_structure_text(), &b.plan.to_structure_text());
        assert!(!structural.is_empty());
        for line in &structural {
            assert!(line.contains("48"), "a line that does not depend on fc1's width changed: {line}");
        }
        let full = changed(&a.plan.to_text(), &b.plan.to_text());
        assert!(full.len() > structural.len(), "{} vs {}", full.len(), structural.len());
        assert_eq!(a.plan.to_structure_text().lines().count(), b.plan.to_structure_text().lines().count());
    }
}
