//! An op that reads other examples' rows along the batch's axis 0 (a slice
//! or gather of some rows, a max over the batch, a tile or split of axis 0)
//! cannot be computed by towers that each hold their own rows: one device
//! and N towers would silently differ (a slice of the first 2 rows: loss
//! 0.050 on one device, 0.112 on two towers). Such a graph is refused at
//! compile time with towers, naming the user's node; without towers it
//! compiles. Per-example ops on other axes, and a time-major transpose,
//! stay allowed.

use towers::prelude::*;

type Body = fn(&mut GraphBuilder, Tensor) -> Result<Tensor, GraphError>;

/// x [N,3] -> z = (x + w)² -> body(z) -> mean.
fn graph(body: Body) -> (Graph, String) {
    let mut b = GraphBuilder::with_seed(2);
    let x = b.placeholder("x", DType::F32, [None, Some(3)]).unwrap();
    let w = b.get_variable("w", [3], Initializer::Constant(F32(0.1))).unwrap();
    let z = b.add(x, w).unwrap();
    let z = b.square(z).unwrap();
    let o = body(&mut b, z).unwrap();
    let l = b.reduce_mean_all(o).unwrap();
    let g = b.finish();
    let name = g.node(l.node).name.clone();
    (g, name)
}

fn compile(body: Body, towers: u32) -> Result<Compiled, CompileError> {
    let (g, loss) = graph(body);
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(1.0) }, 4);
    o.towers = (0..towers).map(Device::gpu).collect();
    compile_train(&g, &loss, &o)
}

#[test]
fn ops_reading_across_the_batch_are_refused_with_towers_naming_the_node() {
    let cases: [(&str, Body); 6] = [
        ("Slice", |b, z| b.slice(z, &[0, 0], &[2, -1])),
        // The global batch by number: each tower has fewer rows.
        ("Slice", |b, z| b.slice(z, &[0, 0], &[4, -1])),
        ("Max", |b, z| b.reduce_max(z, &[0], false)),
        ("GatherV2", |b, z| {
            let i = b.constant("rows", DType::I32, &[3], &[0.0, 0.0, 3.0])?;
            b.gather(z, i, 0)
        }),
        ("Tile", |b, z| b.tile(z, &[2, 1])),
        ("split", |b, z| Ok(b.split(z, 0, &[1, 3])?[0])),
    ];
    for (node, body) in cases {
        compile(body, 0).unwrap_or_else(|e| panic!("{node} compiles on one device: {e}"));
        let e = compile(body, 2).err().unwrap_or_else(|| panic!("{node} is refused with towers")).to_string();
        assert!(e.contains(&format!("node '{node}'")) && e.contains("reads across the examples"), "{e}");
    }
}

#[test]
fn per_example_ops_and_a_time_major_transpose_stay_allowed() {
    let cases: [Body; 4] = [
        |b, z| b.slice(z, &[0, 1], &[-1, 2]),
        |b, z| b.slice(z, &[0, 0], &[-1, 2]),
        |b, z| b.reduce_max(z, &[1], false),
        |b, z| {
            let t = b.transpose(z, &[1, 0])?;
            let s = b.slice(t, &[1, 0], &[1, -1])?;
            b.transpose(s, &[1, 0])
        },
    ];
    for body in cases {
        compile(body, 2).expect("per example");
    }
}
