//! Every variant against its family's descriptor (`crate::family`): the
//! family's signature, CUDA lowering, plan text and CPU dispatch all take
//! it, and another family refuses it with a typed error.

use super::tests::{fit, samples, sig};
use super::Actual;
use crate::dtype::DType;

/// Every variant is described by its own family (`crate::family`): the
/// family's signature, CUDA lowering and plan text all take it, so no
/// family's arm for foreign kernels is ever reached; each family lists its
/// own entry points and no other family names one of them.
#[test]
fn every_variant_is_described_by_its_family() {
    use crate::launch::{self, Counts, LaunchError};
    use crate::Family;
    let mut seen = std::collections::BTreeSet::new();
    for k in &samples() {
        let d = k.desc();
        seen.insert(k.family());
        let s = sig(k);
        let (ins, outs, ws) = fit(&s);
        let (ins, outs): (Vec<usize>, Vec<usize>) =
            (ins.iter().map(|a| a.elems).collect(), outs.iter().map(|a| a.elems).collect());
        let ws = launch::backend_workspace(k).or(ws.map(|a| a.elems));
        match launch::lower(k, Counts { ins: &ins, outs: &outs, workspace: ws }) {
            Err(e @ LaunchError::NoLowering { .. }) => panic!("{e} (its family: {})", d.name),
            Err(e) => panic!("{}: {e}", k.name()),
            Ok(low) => {
                for l in low.launches().filter(|l| !l.family.starts_with("fused_")) {
                    let owner = Family::ALL.iter().find(|f| f.desc().name == l.family).expect("a family");
                    assert!(owner.desc().entries.iter().any(|e| e.name == l.entry), "{}: {}", k.name(), l.entry);
                }
            }
        }
        let text = k.params_text();
        assert!(!text.contains("is not a kernel of"), "{}: {text}", k.name());
        let foreign = Family::ALL.iter().find(|f| **f != k.family()).expect("two families").desc();
        let err = (foreign.text)(k).expect_err("a foreign kernel");
        assert_eq!(err.family, foreign.name);
        let mut b = super::table::Builder::new(k.name());
        let err = (foreign.declare)(k, &mut b).expect_err("a foreign kernel");
        assert!(err.reason.ends_with(&format!("not a kernel of the {} family", foreign.name)), "{}", err.reason);
        let counts = Counts { ins: &ins, outs: &outs, workspace: ws };
        let mut cx = launch::Cx { name: k.name(), counts, low: Default::default() };
        let err = (foreign.lower)(k, &mut cx).expect_err("a foreign kernel");
        assert_eq!(err, LaunchError::NoLowering { kernel: k.name(), family: foreign.name });
    }
    assert_eq!(seen.len(), Family::ALL.len(), "a sample of every family");
    let names: Vec<&str> = Family::ALL.iter().map(|f| f.desc().name).collect();
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "family names are distinct: {names:?}");
}

/// Buffers of zeros of the fitting lengths and dtypes, behind the CPU seam.
struct ZerosIo {
    ins: Vec<(*mut u32, usize, DType)>,
    outs: Vec<(*mut u32, usize, DType)>,
    ws: (*mut u32, usize),
    _store: Vec<Vec<u32>>,
}

impl ZerosIo {
    fn new(ins: &[Actual], outs: &[Actual], ws: Option<Actual>) -> ZerosIo {
        let mut store: Vec<Vec<u32>> = Vec::new();
        let mut take = |n: usize| {
            let mut v = vec![0u32; n.max(1)];
            let p = v.as_mut_ptr();
            store.push(v);
            p
        };
        let ins = ins.iter().map(|a| (take(a.elems), a.elems, a.dtype)).collect();
        let outs = outs.iter().map(|a| (take(a.elems), a.elems, a.dtype)).collect();
        let n = ws.map_or(0, |w| w.elems);
        let ws = (take(n), n);
        ZerosIo { ins, outs, ws, _store: store }
    }
}

// SAFETY: each operand is its own allocation, alive as long as the struct.
unsafe impl crate::cpu::Io for ZerosIo {
    fn counts(&self) -> (usize, usize) {
        (self.ins.len(), self.outs.len())
    }
    fn in_dtype(&self, i: usize) -> DType {
        self.ins[i].2
    }
    fn out_dtype(&self, j: usize) -> DType {
        self.outs[j].2
    }
    fn in_place(&self) -> bool {
        false
    }
    unsafe fn f32<'a>(&self, i: usize) -> &'a [f32] {
        std::slice::from_raw_parts(self.ins[i].0 as *const f32, self.ins[i].1)
    }
    unsafe fn i32<'a>(&self, i: usize) -> &'a [i32] {
        std::slice::from_raw_parts(self.ins[i].0 as *const i32, self.ins[i].1)
    }
    unsafe fn out_f32<'a>(&self, j: usize) -> &'a mut [f32] {
        std::slice::from_raw_parts_mut(self.outs[j].0 as *mut f32, self.outs[j].1)
    }
    unsafe fn out_i32<'a>(&self, j: usize) -> &'a mut [i32] {
        std::slice::from_raw_parts_mut(self.outs[j].0 as *mut i32, self.outs[j].1)
    }
    unsafe fn ws<'a>(&self) -> &'a mut [f32] {
        std::slice::from_raw_parts_mut(self.ws.0 as *mut f32, self.ws.1)
    }
}

/// Every variant runs on the CPU through its family's dispatch
/// (`Kernel::run_cpu`) on operands that fit its signature; a family handed
/// a foreign kernel says so with a typed error.
#[test]
fn every_variant_runs_through_its_family_on_the_cpu() {
    use crate::cpu::{CpuError, Lists, MutSliceList, SliceList};
    use crate::Family;
    let (mut f32s, mut dims, mut muts) =
        (SliceList::with_capacity(8), SliceList::with_capacity(8), MutSliceList::with_capacity(8));
    for k in &samples() {
        let (ins, outs, ws) = fit(&sig(k));
        let io = ZerosIo::new(&ins, &outs, ws);
        let mut lists = Lists { f32s: &mut f32s, dims: &mut dims, muts: &mut muts };
        // SAFETY: distinct allocations of the signature's lengths and dtypes.
        let r = unsafe { k.run_cpu(&io, &mut lists, 0) };
        assert_eq!(r, Ok(()), "{}", k.name());
        let foreign = Family::ALL.iter().find(|f| **f != k.family()).expect("two families").desc();
        // SAFETY: as above; a foreign family touches nothing.
        let r = unsafe { (foreign.run)(k, &io, &mut lists, 0) };
        assert!(matches!(r, Err(CpuError::Foreign(f)) if f.family == foreign.name), "{}", k.name());
    }
}
