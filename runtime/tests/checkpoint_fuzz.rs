//! A seeded, bounded fuzz of the checkpoint reader (safetensors header and
//! data): every mutated file is an `Ok` or a typed error, never a panic, and
//! a refused file writes nothing into the session.
//!
//! Cases (printed by the test): byte flips anywhere, truncations, header
//! lengths past the file, and header JSON with its offsets, shapes and
//! dtypes replaced by hostile values — each fed to `Session::restore`,
//! `Session::restore_partial` and `checkpoint::read_run_metadata`.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use towers_runtime::checkpoint::read_run_metadata;
use towers_runtime::Session;

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

const HOSTILE: &[i128] =
    &[0, 1, 2, 3, -1, 255, 4096, 1 << 31, 1 << 32, (1 << 53) + 1, i64::MAX as i128, u64::MAX as i128];

/// A mutation of the header JSON: one offset, shape entry or dtype replaced.
fn mutate_header(good: &[u8], rng: &mut Rng) -> Vec<u8> {
    let n = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&good[8..8 + n]).unwrap();
    let names: Vec<String> = header.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect();
    let name = &names[rng.below(names.len())];
    let t = header.get_mut(name).unwrap();
    let v = HOSTILE[rng.below(HOSTILE.len())];
    let num = serde_json::Number::from_i128(v).map(serde_json::Value::Number).unwrap_or(serde_json::Value::Null);
    match rng.below(6) {
        0 => t["data_offsets"][0] = num,
        1 => t["data_offsets"][1] = num,
        2 => {
            let shape = t["shape"].as_array_mut().unwrap();
            if shape.is_empty() {
                shape.push(num);
            } else {
                let i = rng.below(shape.len());
                shape[i] = num;
            }
        }
        3 => {
            let dtypes = [
                serde_json::json!("F64"),
                "I64".into(),
                "U8".into(),
                "BOOL".into(),
                "F16".into(),
                "nonsense".into(),
                7.into(),
            ];
            t["dtype"] = dtypes[rng.below(dtypes.len())].clone()
        }
        4 => t["shape"] = serde_json::json!([]),
        _ => {
            let other = names[rng.below(names.len())].clone();
            let dup = header[&other].clone();
            header[format!("{name}/copy")] = dup;
        }
    }
    let text = serde_json::to_vec(&header).unwrap();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend(&good[8 + n..]);
    out
}

#[test]
fn no_mutated_checkpoint_panics_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ck.safetensors");
    let mut a = Session::new(3);
    a.load("train", common::mlp_plan()).unwrap();
    a.save_with_run(&path, Some("model=mlp; batch=2")).unwrap();
    let good = std::fs::read(&path).unwrap();
    let mut rng = Rng(0x7077_E125_0023);
    let (mut ok, mut refused, mut panics) = (0usize, 0usize, Vec::new());
    let kinds = ["byte flips", "truncation", "header length", "header JSON"];
    let mut per_kind = [0usize; 4];
    for case in 0..2000 {
        let kind = case % 4;
        let bytes = match kind {
            0 => {
                let mut b = good.clone();
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(b.len());
                    b[i] ^= 1 << rng.below(8);
                }
                b
            }
            1 => good[..rng.below(good.len())].to_vec(),
            2 => {
                let mut b = good.clone();
                let v = HOSTILE[rng.below(HOSTILE.len())] as u64;
                b[..8].copy_from_slice(&v.to_le_bytes());
                b
            }
            _ => mutate_header(&good, &mut rng),
        };
        per_kind[kind] += 1;
        std::fs::write(&path, &bytes).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            let mut s = Session::new(3);
            s.load("train", common::mlp_plan()).unwrap();
            let before: Vec<Vec<f32>> =
                ["fc/biases", "fc/weights"].iter().map(|n| s.variable::<f32>(n).unwrap().to_vec()).collect();
            let strict = s.restore(&path);
            if strict.is_err() {
                let after: Vec<Vec<f32>> =
                    ["fc/biases", "fc/weights"].iter().map(|n| s.variable::<f32>(n).unwrap().to_vec()).collect();
                assert_eq!(before, after, "a refused file wrote into the session");
            }
            let partial = Session::new(3).restore_partial(&path);
            let meta = read_run_metadata(&path);
            (strict.is_ok(), partial.is_ok(), meta.is_ok())
        }));
        match r {
            Ok((true, _, _)) => ok += 1,
            Ok(_) => refused += 1,
            Err(_) => panics.push(format!("case {case} ({})", kinds[kind])),
        }
    }
    eprintln!(
        "checkpoint fuzz: {} cases ({}), {ok} restored, {refused} refused with an error, {} panics",
        ok + refused + panics.len(),
        kinds.iter().zip(per_kind).map(|(k, n)| format!("{n} {k}")).collect::<Vec<_>>().join(", "),
        panics.len()
    );
    assert!(panics.is_empty(), "{panics:?}");
    assert!(refused > 1000, "most mutations are refused: {refused}");
}
