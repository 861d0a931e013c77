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
//! Each test prints its counts; the cases are the same on every run.

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};

use towers::codegen::{verify, Plan};
use towers::compiler::{compile_train, CompileOptions};
use towers::data::{read_idx_images, read_idx_labels};
use towers::models::{build, ModelKind, ModelSpec};
use towers::runtime::Session;
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
