//! The cost of a term: launched kernels first, then bytes written.
//!
//! A compute node costs [`KERNEL`] plus the bytes it writes; aliases
//! (`identity`, `reshape`) cost 1, so the extractor drops them when it can; a
//! constant costs 1 plus its bytes, so a scalar beats a broadcast splat;
//! leaves and attributes are free. `scalar` is a rule-only helper and costs
//! [`FORBIDDEN`], a large *finite* constant (an infinite cost with saturating
//! adds can make `find_best` loop: glenside's warning). A fused kernel
//! costs one launch plus the bytes of its output only (its inlined steps
//! write nothing), plus one, so it never replaces a plain op of equal cost.
//!
//! Extraction is egg's tree-cost `Extractor`: a subterm used twice counts
//! twice, so with heavy sharing it may pick a variant that duplicates work.
//! Our rules only shrink terms (no rule trades a shared term for a bigger
//! private one), so tree cost picks the DAG optimum here; a rule set that
//! does such trades would need `LpExtractor` or a CSE after extraction.

use egg::{CostFunction, Id, Language};

use super::lang::{node_data, TEGraph, TensorLang};

/// The fixed cost of launching one kernel, in byte-equivalents.
pub const KERNEL: u64 = 1 << 20;
/// The cost of a term that must never be extracted.
pub const FORBIDDEN: u64 = 1 << 50;

/// Kernels launched and bytes written by a term (see the module docs).
pub struct KernelCost<'a> {
    pub egraph: &'a TEGraph,
}

impl CostFunction<TensorLang> for KernelCost<'_> {
    type Cost = u64;

    fn cost<C>(&mut self, enode: &TensorLang, mut costs: C) -> u64
    where
        C: FnMut(Id) -> u64,
    {
        let bytes = || node_data(self.egraph, enode).ty.and_then(|t| t.byte_size()).unwrap_or(0) as u64;
        let own = match enode {
            TensorLang::Leaf(_) | TensorLang::Attr(_) => 0,
            TensorLang::Num(_) => 1 + bytes(),
            TensorLang::Identity(_) | TensorLang::Reshape(_) => 1,
            TensorLang::Scalar(_) => FORBIDDEN,
            // One byte-equivalent more than a plain op: a fused node wins
            // only when it replaces at least one launch, never on a tie.
            TensorLang::Fused(_) => KERNEL + bytes() + 1,
            _ => KERNEL + bytes(),
        };
        enode.fold(own, |sum, id| sum.saturating_add(costs(id)))
    }
}
