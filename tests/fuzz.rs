//! Seeded, bounded fuzz of the parsers of user files besides checkpoints
//! (those are fuzzed in runtime/tests/checkpoint_fuzz.rs): every input is
//! an `Ok` or a typed error naming the file, never a panic.
//!
//! - IDX image and label files (plain and gzip): random and mutated
//!   headers, dimensions (0, 1, huge, overflowing), bodies short, exact and
//!   long, bit flips.
//! - The plan JSON (`towers compile --emit plan-json`): the compiled plan
//!   with numbers, strings and arrays replaced by hostile values, parsed,
//!   verified (`codegen::verify`) and, when the verifier passes, loaded into
//!   a CPU session (which checks it again and plans its memory).
//!
//! - The model file (`towers train --graph`, [`Model::from_json`]): the
//!   file of the convnet with batch norm with hostile leaves, arrays
//!   dropped, doubled or reversed (nodes out of order: dangling edges and
//!   cycles), truncated or flipped text, random JSON of the file's outline;
//!   what loads is compiled at 2 towers. And one valid-JSON case per check.
//!
//! Each test prints its counts; the cases are the same on every run.

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};

use towers::codegen::{verify, Plan};
use towers::compiler::{compile_train, CompileOptions};
use towers::data::{read_idx_images, read_idx_labels};
use towers::models::{build, ModelKind, ModelSpec};
use towers::runtime::Session;
use towers::trainer::Model;
use towers_graph_reexport::*;

mod towers_graph_reexport {
    pub use towers::graph::{Optimizer, F32};
}

/// xorshift64*: a fixed seed, the same cases on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const DIMS: &[u32] = &[0, 1, 2, 3, 7, 28, 255, 65_535, 1 << 24, u32::MAX];

fn idx_file(rng: &mut Rng, labels: bool) -> Vec<u8> {
    let magic: u32 = match rng.below(5) {
        0 => rng.next() as u32,
        1 => 0x0803,
        2 => 0x0801,
        _ if labels => 0x0801,
        _ => 0x0803,
    };
    let ndims = if labels { 1 } else { 3 };
    let small = |rng: &mut Rng| if rng.below(3) == 0 { DIMS[rng.below(DIMS.len())] } else { rng.below(5) as u32 };
    let dims: Vec<u32> = (0..ndims).map(|_| small(rng)).collect();
    let mut v = magic.to_be_bytes().to_vec();
    let header_words = rng.below(ndims + 2).min(ndims);
    for d in &dims[..header_words] {
        v.extend(d.to_be_bytes());
    }
    let body = dims.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64)).min(4096) as usize;
    let len = match rng.below(4) {
        0 => body,
        1 => body.saturating_sub(1 + rng.below(3)),
        2 => body + 1 + rng.below(3),
        _ => rng.below(64),
    };
    v.extend((0..len).map(|_| (rng.next() % 12) as u8));
    if rng.below(8) == 0 && !v.is_empty() {
        let i = rng.below(v.len());
        v[i] ^= 1 << rng.below(8);
    }
    if rng.below(6) == 0 {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&v).unwrap();
        v = gz.finish().unwrap();
        if rng.below(2) == 0 {
            let cut = rng.below(v.len());
            v.truncate(cut.max(2));
        }
    }
    v
}

#[test]
fn no_idx_file_panics_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f-idx-ubyte");
    let mut rng = Rng(0x1D8_0023);
    let (mut ok, mut refused, mut panics) = (0usize, 0usize, Vec::new());
    for case in 0..3000 {
        let labels = case % 2 == 1;
        std::fs::write(&path, idx_file(&mut rng, labels)).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            let r = if labels { read_idx_labels(&path).map(|_| ()) } else { read_idx_images(&path).map(|_| ()) };
            if let Err(e) = &r {
                assert!(e.to_string().contains("f-idx-ubyte"), "the error names the file: {e}");
            }
            r.is_ok()
        }));
        match r {
            Ok(true) => ok += 1,
            Ok(false) => refused += 1,
            Err(_) => panics.push(case),
        }
    }
    eprintln!("IDX fuzz: 3000 cases (1500 image files, 1500 label files), {ok} read, {refused} refused naming the file, {} panics", panics.len());
    assert!(panics.is_empty(), "cases {panics:?} panicked");
    assert!(ok > 50 && refused > 1000, "both outcomes are exercised: {ok} read, {refused} refused");
}

/// Replace one value of `v` (chosen by `pick` among `count` leaves) by a hostile one.
fn mutate(v: &mut serde_json::Value, pick: &mut usize, rng: &mut Rng) -> bool {
    use serde_json::Value;
    match v {
        Value::Object(m) => m.values_mut().any(|x| mutate(x, pick, rng)),
        Value::Array(a) => {
            if *pick == 0 && !a.is_empty() && rng.below(4) == 0 {
                match rng.below(3) {
                    0 => {
                        a.pop();
                    }
                    1 => a.push(a[0].clone()),
                    _ => a.reverse(),
                }
                return true;
            }
            a.iter_mut().any(|x| mutate(x, pick, rng))
        }
        leaf => {
            if *pick > 0 {
                *pick -= 1;
                return false;
            }
            let hostile = [
                serde_json::json!(0),
                serde_json::json!(1),
                serde_json::json!(-1),
                serde_json::json!(7),
                serde_json::json!(1u64 << 32),
                serde_json::json!(u64::MAX),
                serde_json::json!(1e300),
                serde_json::json!(""),
                serde_json::json!("nonsense"),
                serde_json::json!(null),
                serde_json::json!([]),
            ];
            *leaf = hostile[rng.below(hostile.len())].clone();
            true
        }
    }
}

fn leaves(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Object(m) => m.values().map(leaves).sum(),
        serde_json::Value::Array(a) => a.iter().map(leaves).sum(),
        _ => 1,
    }
}

#[test]
fn no_mutated_plan_json_panics_the_parser_the_verifier_or_the_loader() {
    let model = build(&ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10)).unwrap();
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
    o.towers = vec![towers::graph::Device::gpu(0), towers::graph::Device::gpu(1)];
    let plan = compile_train(&model.graph, &model.loss, &o).unwrap().plan;
    let good: serde_json::Value = serde_json::from_str(&plan.to_json()).unwrap();
    let back: Plan = serde_json::from_value(good.clone()).expect("the plan JSON round-trips");
    verify(&back).expect("the compiled plan verifies");
    let n = leaves(&good);
    let mut rng = Rng(0x9_1A_0023);
    let (mut unparsed, mut unverified, mut loaded, mut refused_at_load, mut panics) = (0, 0, 0, 0, Vec::new());
    let cases = 600;
    for case in 0..cases {
        let mut v = good.clone();
        for _ in 0..1 + rng.below(3) {
            let mut pick = rng.below(n);
            mutate(&mut v, &mut pick, &mut rng);
        }
        let r = catch_unwind(AssertUnwindSafe(|| {
            let Ok(p) = serde_json::from_value::<Plan>(v) else { return 0 };
            if verify(&p).is_err() {
                return 1;
            }
            match Session::new(0).load("train", p) {
                Ok(()) => 2,
                Err(_) => 3,
            }
        }));
        match r {
            Ok(0) => unparsed += 1,
            Ok(1) => unverified += 1,
            Ok(2) => loaded += 1,
            Ok(_) => refused_at_load += 1,
            Err(_) => panics.push(case),
        }
    }
    eprintln!(
        "plan JSON fuzz: {cases} cases, {unparsed} refused by the parser, {unverified} by the verifier, {refused_at_load} by the loader, {loaded} loaded, {} panics",
        panics.len()
    );
    assert!(panics.is_empty(), "cases {panics:?} panicked");
}

/// Load a model file's text as `towers train --graph` does and, when it
/// loads, compile its training program at 2 towers: 0 refused naming the
/// file, 1 loaded but refused by the compiler, 2 compiled.
fn load_model_text(text: &str) -> u8 {
    let file = std::path::Path::new("fuzzed-model.json");
    match Model::from_json(text, file) {
        Err(e) => {
            assert!(e.to_string().contains("fuzzed-model.json"), "the error names the file: {e}");
            0
        }
        Ok(m) => {
            let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
            o.towers = vec![towers::graph::Device::gpu(0), towers::graph::Device::gpu(1)];
            if let Some(a) = &m.accuracy {
                o.fetches.push(("accuracy".into(), a.clone()));
            }
            match compile_train(&m.graph, &m.loss, &o) {
                Ok(_) => 2,
                Err(_) => 1,
            }
        }
    }
}

/// A seed model's file: the convnet with batch norm (dropout, update ops,
/// collections) and its accuracy.
fn model_file() -> String {
    let mut spec = ModelSpec::new(ModelKind::Convnet, [8, 8, 1], 10);
    spec.batch_norm = true;
    let m = Model::from_builtin(build(&spec).unwrap());
    assert!(m.accuracy.is_some());
    let text = m.to_json().unwrap();
    assert_eq!(load_model_text(&text), 2, "the seed model's file loads and compiles");
    assert_eq!(text, Model::from_json(&text, "m.json".as_ref()).unwrap().to_json().unwrap(), "it round-trips");
    text
}

/// Mutated model files (`towers train --graph`): hostile leaves, dropped,
/// doubled and reversed arrays (nodes out of order: dangling edges and
/// cycles), truncated text, flipped bytes and random JSON. Every case is a
/// model or an error naming the file; none panics the parser, the checks
/// or the compiler of what loads.
#[test]
fn no_mutated_model_file_panics_the_loader_or_the_compiler() {
    let text = model_file();
    let good: serde_json::Value = serde_json::from_str(&text).unwrap();
    let n = leaves(&good);
    let mut rng = Rng(0x0070_3E25_0022);
    let mut counts = [0usize; 3];
    let mut panics = Vec::new();
    let cases = 900;
    for case in 0..cases {
        let t = match case % 3 {
            0 => {
                let mut v = good.clone();
                for _ in 0..1 + rng.below(3) {
                    let mut pick = rng.below(n);
                    mutate(&mut v, &mut pick, &mut rng);
                }
                serde_json::to_string(&v).unwrap()
            }
            1 => {
                let mut b = text.as_bytes().to_vec();
                if rng.below(2) == 0 {
                    b.truncate(rng.below(b.len()));
                } else {
                    for _ in 0..1 + rng.below(4) {
                        let i = rng.below(b.len());
                        let alphabet = b" {}[],:\"0a-9e";
                        b[i] = alphabet[rng.below(alphabet.len())];
                    }
                }
                String::from_utf8_lossy(&b).into_owned()
            }
            _ => {
                // Random JSON of the file's outline.
                let names = ["loss", "images", "labels", "predictions", "accuracy", "nope", ""];
                let pick = |rng: &mut Rng| names[rng.below(names.len())];
                let nodes: Vec<String> = (0..rng.below(4))
                    .map(|i| {
                        format!(
                            r#"{{"name":"{}","op":{},"inputs":[["{}",{}]],"control_inputs":[],"scope":"","requested_device":{{}},"device":null,"placement_reason":null,"tower":null}}"#,
                            pick(&mut rng),
                            ["\"NoOp\"", "\"Identity\"", "{\"Placeholder\":{\"dtype\":\"F32\",\"shape\":[null]}}", "7"][rng.below(4)],
                            pick(&mut rng),
                            [0, 1, usize::MAX][i % 3]
                        )
                    })
                    .collect();
                format!(
                    r#"{{"format":"towers-model","version":1,"loss":"{}","images":"{}","labels":"{}","predictions":"{}","graph":{{"seed":0,"nodes":[{}],"collections":{{}}}}}}"#,
                    pick(&mut rng),
                    pick(&mut rng),
                    pick(&mut rng),
                    pick(&mut rng),
                    nodes.join(",")
                )
            }
        };
        match catch_unwind(AssertUnwindSafe(|| load_model_text(&t))) {
            Ok(k) => counts[k as usize] += 1,
            Err(_) => panics.push(case),
        }
    }
    eprintln!(
        "model file fuzz: {cases} cases, {} refused naming the file, {} loaded but refused by the compiler, {} compiled, {} panics",
        counts[0],
        counts[1],
        counts[2],
        panics.len()
    );
    assert!(panics.is_empty(), "cases {panics:?} panicked");
    assert!(counts[0] > 500 && counts[2] > 10, "the outcomes are exercised: {counts:?}");
}

/// Structurally valid JSON of a wrong graph, one case per check: each is a
/// typed error saying what is wrong.
#[test]
fn valid_json_of_a_wrong_model_is_a_typed_error_saying_what_is_wrong() {
    use towers::trainer::{ModelError, ModelFileError};
    let text = model_file();
    let good: serde_json::Value = serde_json::from_str(&text).unwrap();
    let nodes = |v: &mut serde_json::Value| v["graph"]["nodes"].as_array_mut().unwrap().clone();
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = good.clone();
        f(&mut v);
        Model::from_json(&serde_json::to_string(&v).unwrap(), "w.json".as_ref()).unwrap_err()
    };
    // A cycle: the first node's input is the last node.
    let e = edit(&|v| {
        let last = nodes(v).last().unwrap()["name"].clone();
        let n = v["graph"]["nodes"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|n| !n["inputs"].as_array().unwrap().is_empty())
            .unwrap();
        n["inputs"][0][0] = last;
    });
    assert!(matches!(&e, ModelFileError::Graph { .. }) && e.to_string().contains("not defined before it"), "{e}");
    // An input slot the node does not have.
    let e = edit(&|v| {
        let n = v["graph"]["nodes"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|n| !n["inputs"].as_array().unwrap().is_empty())
            .unwrap();
        n["inputs"][0][1] = serde_json::json!(5);
    });
    assert!(matches!(&e, ModelFileError::Graph { .. }), "{e}");
    // Names of the parts that are missing or of the wrong kind.
    for (field, to, want) in [
        ("loss", "logits", "loss 'logits'"),
        ("images", "labels", "images 'labels'"),
        ("labels", "images", "labels 'images'"),
        ("predictions", "loss", "predictions 'loss'"),
        ("accuracy", "predictions", "accuracy 'predictions'"),
        ("loss", "no/such/node", "not a node of the graph"),
    ] {
        let e = edit(&|v| v[field] = serde_json::json!(to));
        assert!(matches!(&e, ModelFileError::Model { .. }) && e.to_string().contains(want), "{field}: {e}");
    }
    let e = edit(&|v| v["graph"]["collections"]["update_ops"] = serde_json::json!(["ghost"]));
    assert!(e.to_string().contains("ghost"), "{e}");
    let e = edit(&|v| v["version"] = serde_json::json!("1"));
    assert!(matches!(&e, ModelFileError::Format { .. }), "{e}");
    let e = edit(&|v| v["extra"] = serde_json::json!(1));
    assert!(matches!(&e, ModelFileError::Json { .. }) && e.to_string().contains("extra"), "{e}");
    // A model that loads but does not fit the data set's images.
    let m = Model::from_json(&text, "m.json".as_ref()).unwrap();
    let (mnist, _) = towers::data::DataSpec::Mnist5k.load().unwrap();
    assert!(matches!(m.check_data(&mnist), Err(ModelError::DataMismatch { .. })));
}
