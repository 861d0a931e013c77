//! The one generic check of a launch's operands against its kernel's
//! [`Signature`]: arity, then the workspace, then every dtype, then every
//! length, each in launch order, so the first mismatch reported is the
//! same whoever checks (the plan verifier, the CPU backend at load). It
//! walks the operands once and allocates nothing.

use super::{DTypeRule, Len, Ref, Side, Signature};
use crate::dtype::DType;

/// What a launch actually passes for one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Actual {
    pub dtype: DType,
    pub elems: usize,
}

/// The first way a launch disagrees with its signature. Operands are named
/// by side and index; [`Signature::name`] and [`Signature::why`] say more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    /// `side` has `got` operands, the signature `expected`.
    Arity { side: Side, expected: usize, got: usize },
    /// The workspace: `expected` f32 elements (0: none), `got` what was passed.
    Workspace { expected: usize, got: Option<Actual> },
    /// Operand `index` of `side` is `got`, the kernel needs `expected`.
    Dtype { side: Side, index: usize, expected: DType, got: DType },
    /// Operand `index` of `side` has `got` elements, the kernel needs `expected`.
    Size { side: Side, index: usize, expected: usize, got: usize },
    /// Operand `index` of `side` has `got` elements, not a multiple of `of`.
    Multiple { side: Side, index: usize, of: usize, got: usize },
    /// Operand `index` of `side` has `got` elements, more than `limit`.
    TooLong { side: Side, index: usize, limit: usize, got: usize },
    /// The length operand `index` of `side` needs overflows (`Len::Times`).
    Overflow { side: Side, index: usize },
}

impl Signature {
    /// Check a launch's inputs, outputs and workspace against the signature.
    pub fn check(&self, ins: &[Actual], outs: &[Actual], ws: Option<Actual>) -> Result<(), Mismatch> {
        for (side, got, expected) in [(Side::In, ins.len(), self.n_in), (Side::Out, outs.len(), self.n_out)] {
            if got != expected {
                return Err(Mismatch::Arity { side, expected, got });
            }
        }
        let expected = match &self.workspace {
            Some(w) => match w.len {
                Len::Exact(n) => n,
                _ => 0,
            },
            None => 0,
        };
        let ws_ok = match ws {
            None => expected == 0,
            Some(a) => expected > 0 && a.elems == expected && a.dtype == DType::F32,
        };
        if !ws_ok {
            return Err(Mismatch::Workspace { expected, got: ws });
        }
        let actual = |x: Ref, r: usize| -> Option<Actual> {
            let i = x.index(r)?;
            match x.side {
                Side::In => ins.get(i).copied(),
                Side::Out => outs.get(i).copied(),
            }
        };
        for (side, got, runs) in [(Side::In, ins, &self.inputs), (Side::Out, outs, &self.outputs)] {
            let mut index = 0;
            for run in runs {
                for r in 0..run.times {
                    for o in &run.ops {
                        let a = got[index];
                        let expected = match o.dtype {
                            DTypeRule::Is(d) => Some(d),
                            DTypeRule::Like(x) => actual(x, r).map(|x| x.dtype),
                            DTypeRule::Any => None,
                        };
                        if let Some(expected) = expected.filter(|&d| d != a.dtype) {
                            return Err(Mismatch::Dtype { side, index, expected, got: a.dtype });
                        }
                        index += 1;
                    }
                }
            }
        }
        for (side, got, runs) in [(Side::In, ins, &self.inputs), (Side::Out, outs, &self.outputs)] {
            let mut index = 0;
            for run in runs {
                for r in 0..run.times {
                    for o in &run.ops {
                        let n = got[index].elems;
                        let size = |expected: usize| Mismatch::Size { side, index, expected, got: n };
                        // A reference past the operands cannot be built by the
                        // table; treat it as "no such operand": length 0.
                        let len_of = |x: Ref| actual(x, r).map_or(0, |a| a.elems);
                        match o.len {
                            Len::Exact(e) if e != n => return Err(size(e)),
                            Len::Like(x) if len_of(x) != n => return Err(size(len_of(x))),
                            Len::Rows { of, per_row } if per_row == 0 || len_of(of) / per_row != n => {
                                return Err(size(len_of(of).checked_div(per_row).unwrap_or(0)))
                            }
                            Len::Times { of, factor } => match len_of(of).checked_mul(factor) {
                                None => return Err(Mismatch::Overflow { side, index }),
                                Some(e) if e != n => return Err(size(e)),
                                Some(_) => {}
                            },
                            Len::Multiple(of) if of == 0 || !n.is_multiple_of(of) => {
                                return Err(Mismatch::Multiple { side, index, of, got: n })
                            }
                            Len::AtMost(limit) if n > limit => {
                                return Err(Mismatch::TooLong { side, index, limit, got: n })
                            }
                            _ => {}
                        }
                        index += 1;
                    }
                }
            }
        }
        Ok(())
    }
}

impl Signature {
    /// A mismatch in words, naming the operand by index and name:
    /// `gemm input 0 (a) has 6 elements, but the parameters need 8 (m*k = 2*4)`.
    pub fn explain(&self, m: &Mismatch) -> String {
        let at = |side: Side, i: usize| format!("{} {} {i} ({})", self.kernel, side.word(), self.name(side, i));
        match *m {
            Mismatch::Arity { side, expected, got } => {
                format!("{} takes {expected} {}s ({}), got {got}", self.kernel, side.word(), self.names(side))
            }
            Mismatch::Workspace { expected, got } => match got {
                Some(a) => format!(
                    "{} needs a workspace of {expected} f32 elements, got {} {} elements",
                    self.kernel, a.dtype, a.elems
                ),
                None => format!("{} needs a workspace of {expected} f32 elements, got none", self.kernel),
            },
            Mismatch::Dtype { side, index, expected, got } => {
                format!("{} is {got}, but the kernel needs {expected}", at(side, index))
            }
            Mismatch::Size { side, index, expected, got } => format!(
                "{} has {got} elements, but the parameters need {expected} ({})",
                at(side, index),
                self.why(side, index)
            ),
            Mismatch::Multiple { side, index, of, got } => {
                format!("{} has {got} elements, not a multiple of {} {of}", at(side, index), self.why(side, index))
            }
            Mismatch::TooLong { side, index, limit, got } => {
                format!("{} has {got} elements, more than {limit}: {}", at(side, index), self.why(side, index))
            }
            Mismatch::Overflow { side, index } => {
                format!("the length {} needs overflows ({})", at(side, index), self.why(side, index))
            }
        }
    }
}
