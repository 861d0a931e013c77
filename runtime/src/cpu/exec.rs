//! Dispatch of one launch to its CPU kernel in `towers_kernels`, no math
//! here. Everything a kernel needs was computed by codegen and resolved at
//! load, where [`check`] holds each launch's buffers to its kernel's operand
//! signature (arity, dtypes, lengths: declared once, in `towers_kernels`).
//! [`dispatch`] hands the buffers to the kernel's family
//! (`Kernel::run_cpu`, each family's `desc.rs`), which picks the typed views
//! by position; this file keeps the runtime's own decisions: which launches
//! split into ranges across threads ([`splittable`], [`dispatch_range`]).
//! It allocates nothing on success; an error message is built only on
//! failure.

use towers_codegen::Kernel;
use towers_kernels::cpu::{Io, Lists};
use towers_kernels::dtype::DType;
use towers_kernels::gemm::desc::tower_update;
use towers_kernels::operands::Actual;
use towers_kernels::{gemm, optim};

use super::mem::Slot;
use super::prepare::{Buf, Launch};

/// Check a launch's buffers against its kernel's operand signature
/// (`Kernel::signature`): arity, workspace, dtypes and lengths, once at
/// load, so [`dispatch`] indexes operands by position without checks.
pub fn check(kernel: &Kernel, ins: &[Buf], outs: &[Buf], ws: Option<&Buf>) -> Result<(), String> {
    let sig = kernel.signature().map_err(|e| format!("{} parameters are invalid: {e}", kernel.name()))?;
    let actual = |b: &Buf| Actual { dtype: b.dtype, elems: b.slot.len() };
    let (a_ins, a_outs): (Vec<Actual>, Vec<Actual>) =
        (ins.iter().map(actual).collect(), outs.iter().map(actual).collect());
    sig.check(&a_ins, &a_outs, ws.map(actual)).map_err(|m| sig.explain(&m))
}

/// Elements below which a launch is never split across threads (a split
/// costs a wake-up of tens of microseconds).
pub const SPLIT_MIN: usize = 1 << 16;

/// Output rows x their length x pair count below which a tower matmul is
/// never split: about 2 MFLOP (tens of microseconds on one core).
pub const SPLIT_MIN_FLOP: usize = 1 << 21;

/// How a launch may run as two ranges on two threads with the same bits as
/// one: `(n, mid)`, ranges `[0, mid)` and `[mid, n)` of [`dispatch_range`].
/// - a large `MeanApply` (the tower reduction fused into an update) or
///   optimizer update: elements, each computed on its own;
/// - a large `TowerMatMul` (the replicas' weight gradients as one product
///   over the whole batch): output rows, split where its body always splits
///   them (`gemm::tower_matmul_split`).
///
/// They run at the end of a multi-tower step, or as each gradient is
/// finished, where a tower's thread is idle or waiting.
/// The third value estimates the upper range's work (in flops; an
/// element of an update as [`ELEMENT_FLOPS`]) for the board of offers.
pub fn splittable(l: &Launch) -> Option<(usize, usize, usize)> {
    let elems = |l: &Launch| {
        let n = l.outs.first()?.slot.len();
        let mid = (n / 2) & !15;
        (n >= SPLIT_MIN).then_some((n, mid, (n - mid).saturating_mul(ELEMENT_FLOPS)))
    };
    match &l.kernel {
        Kernel::MeanApply { weights, .. } if weights.len() <= 16 => elems(l),
        Kernel::ApplyGradientDescent {}
        | Kernel::ApplyMomentum { .. }
        | Kernel::ApplyAdam { .. }
        | Kernel::ApplyRmsProp { .. }
        | Kernel::ApplyAdagrad { .. } => elems(l),
        Kernel::TowerMatMul { m, n, ks, .. } | Kernel::TowerMatMulApply { m, n, ks, .. } => {
            let per_row = ks.iter().sum::<usize>().saturating_mul(*n).saturating_mul(2);
            let mid = gemm::tower_matmul_split(*m);
            (per_row.saturating_mul(*m) >= SPLIT_MIN_FLOP).then_some((*m, mid, per_row.saturating_mul(m - mid)))
        }
        _ => None,
    }
}

/// An updated element's cost in flops, for comparing offers: its bytes
/// move at about a hundred flops' time on the benchmark host.
pub const ELEMENT_FLOPS: usize = 100;

/// Run range `[lo, hi)` (elements or rows, see [`splittable`]) of a
/// splittable launch. Allocates nothing.
///
/// # Safety
/// As [`dispatch`]; the ranges of one launch run concurrently touch disjoint elements.
pub unsafe fn dispatch_range(l: &Launch, lo: usize, hi: usize) -> Result<(), String> {
    let err = |e: towers_kernels::KernelError| e.to_string();
    let lr = || l.ins.last().map_or(0.0, |b| b.slot.f32()[0]);
    let mut outs: [&mut [f32]; 3] = [&mut [], &mut [], &mut []];
    for (o, b) in outs.iter_mut().zip(&l.outs) {
        *o = b.slot.range(lo, hi).f32_mut();
    }
    let k = l.outs.len().min(3);
    match &l.kernel {
        Kernel::MeanApply { weights, apply } => {
            let n = weights.len();
            let mut grads: [&[f32]; 16] = [&[]; 16];
            for (g, b) in grads.iter_mut().zip(&l.ins[..n]) {
                *g = b.slot.range(lo, hi).f32();
            }
            let t = match apply.as_ref() {
                Kernel::ApplyAdam { .. } => optim::adam_step(l.ins[n].slot.i32()),
                _ => 1,
            };
            optim::mean_apply(&grads[..n], weights, apply, t, lr(), &mut outs[..k]).map_err(err)
        }
        Kernel::ApplyGradientDescent {}
        | Kernel::ApplyMomentum { .. }
        | Kernel::ApplyAdam { .. }
        | Kernel::ApplyRmsProp { .. }
        | Kernel::ApplyAdagrad { .. } => {
            // in: grad, (Adam: global_step), learning rate.
            let t = match &l.kernel {
                Kernel::ApplyAdam { .. } => optim::adam_step(l.ins[1].slot.i32()),
                _ => 1,
            };
            let g = l.ins[0].slot.range(lo, hi).f32();
            optim::update(&l.kernel, &mut outs[..k], g, lr(), t, "apply").map_err(err)
        }
        Kernel::TowerMatMul { m, n, ks, trans_a, trans_b, weights } => {
            let p = gemm::TowerGemm { m: *m, n: *n, ks, trans_a: *trans_a, trans_b: *trans_b, weights };
            let c = l.outs[0].slot.range(lo * n, hi * n).f32_mut();
            gemm::tower_matmul_rows(&p, |i| l.ins[i].slot.f32(), c, lo, hi);
            Ok(())
        }
        Kernel::TowerMatMulApply { m, n, ks, trans_a, trans_b, weights, apply } => {
            let p = gemm::TowerGemm { m: *m, n: *n, ks, trans_a: *trans_a, trans_b: *trans_b, weights };
            let w = l.outs[0].slot.range(lo * n, hi * n).f32_mut();
            let acc = l.outs.get(1).map(|b| b.slot.range(lo * n, hi * n).f32_mut());
            gemm::tower_matmul_apply_rows(
                &p,
                tower_update(apply, lr()).map_err(err)?,
                |i| l.ins[i].slot.f32(),
                w,
                acc,
                lo,
                hi,
            )
            .map_err(err)
        }
        other => Err(format!("{} cannot run in ranges", other.name())),
    }
}

/// The launch's operands as the kernels' CPU seam sees them.
struct Ops<'l> {
    ins: &'l [Buf],
    outs: &'l [Buf],
    ws: &'l Option<Slot>,
}

// SAFETY: the slots are the launch's own buffers; `dispatch`'s contract (the
// module invariant of `super::mem`) is the trait's, and `check` held them to
// the kernel's signature at load.
unsafe impl Io for Ops<'_> {
    fn counts(&self) -> (usize, usize) {
        (self.ins.len(), self.outs.len())
    }
    fn in_dtype(&self, i: usize) -> DType {
        self.ins[i].dtype
    }
    fn out_dtype(&self, j: usize) -> DType {
        self.outs[j].dtype
    }
    fn in_place(&self) -> bool {
        matches!((self.ins.first(), self.outs.first()), (Some(a), Some(b)) if a.slot.same(&b.slot))
    }
    unsafe fn f32<'a>(&self, i: usize) -> &'a [f32] {
        self.ins[i].slot.f32()
    }
    unsafe fn i32<'a>(&self, i: usize) -> &'a [i32] {
        self.ins[i].slot.i32()
    }
    unsafe fn out_f32<'a>(&self, j: usize) -> &'a mut [f32] {
        self.outs[j].slot.f32_mut()
    }
    unsafe fn out_i32<'a>(&self, j: usize) -> &'a mut [i32] {
        self.outs[j].slot.i32_mut()
    }
    unsafe fn ws<'a>(&self) -> &'a mut [f32] {
        match self.ws {
            Some(s) => s.f32_mut(),
            None => &mut [],
        }
    }
}

/// Run one launch: its family's CPU dispatch (`Kernel::run_cpu`, declared
/// in the family's `desc.rs`). `step` is the program's 0-based run count
/// (dropout's stream).
///
/// # Safety
/// The module invariant of [`super::mem`]: no other thread touches the
/// launch's outputs, and its inputs are not written meanwhile.
pub unsafe fn dispatch(l: &mut Launch, step: u64) -> Result<(), String> {
    let Launch { kernel, ins, outs, ws, slices, shapes, mut_slices, .. } = l;
    let io = Ops { ins, outs, ws };
    let mut lists = Lists { f32s: slices, dims: shapes, muts: mut_slices };
    kernel.run_cpu(&io, &mut lists, step).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::mem::Region;

    /// The load-time check holds a launch's buffers to its kernel's
    /// signature and names the operand that disagrees.
    #[test]
    fn launches_are_checked_against_their_signature_at_load() {
        let r = Region::new(64);
        let buf = |offset: usize, len: usize, dtype: DType| Buf { slot: r.slot(offset, len).expect("in range"), dtype };
        let k = Kernel::MatMul { m: 2, n: 2, k: 3, trans_a: false, trans_b: false };
        let (a, b, c) = (buf(0, 6, DType::F32), buf(8, 6, DType::F32), buf(16, 4, DType::F32));
        assert_eq!(check(&k, &[a, b], &[c], None), Ok(()));
        assert_eq!(check(&k, &[a], &[c], None), Err("gemm takes 2 inputs (a, b), got 1".to_string()));
        let short = buf(8, 5, DType::F32);
        assert_eq!(
            check(&k, &[a, short], &[c], None),
            Err("gemm input 1 (b) has 5 elements, but the parameters need 6 (k*n = 3*2)".to_string())
        );
        let k = Kernel::SparseSoftmaxXent { classes: 3 };
        let loss = buf(24, 2, DType::F32);
        assert_eq!(
            check(&k, &[a, buf(30, 2, DType::F32)], &[loss, buf(40, 6, DType::F32)], None),
            Err("sparse_softmax_xent input 1 (labels) is f32, but the kernel needs i32".to_string())
        );
        let bad = Kernel::Softmax { classes: 0 };
        assert_eq!(check(&bad, &[a], &[c], None), Err("softmax parameters are invalid: classes is 0".to_string()));
    }
}
