//! Fused elementwise expressions: the data of a fused kernel, shared by the
//! graph (`Op::Fused`), the plan and the kernels.
//!
//! A [`FusedExpr`] is a small straight-line program over the kernel's
//! inputs: each [`FusedStep`] is an input (broadcast to the output's shape),
//! an f32 constant, a unary op, a unary op's gradient or a binary op, and
//! reads only earlier steps; the last step is the output. Its CPU body and
//! CUDA C are `towers_kernels::elementwise::fused`'s; this module holds the
//! expression only.
//!
//! Invariants (checked by [`FusedExpr::new`]): 1 to [`MAX_STEPS`] steps,
//! every operand an earlier step, inputs numbered `0..n` with every one
//! used, `n <= `[`MAX_INPUTS`]. Shapes are launch arguments, not part of
//! the expression. The text form (`ew[$0;$1;add:0:1;relu:2]`,
//! [`fmt::Display`] and [`FromStr`]) is canonical: its FNV-1a hash names the
//! CUDA entry point.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{BinaryOp, UnaryOp};

/// The most steps one fused kernel holds (its registers live on the stack).
pub const MAX_STEPS: usize = 24;
/// The most inputs one fused kernel reads.
pub const MAX_INPUTS: usize = 8;

/// One step of a fused program; operands are indices of earlier steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FusedStep {
    /// Kernel input `k`, broadcast to the output's shape.
    Input(u8),
    /// An f32 constant, by its bits (so every value, -0.0 and NaNs included, survives the text form).
    Const(u32),
    /// `op(x)`.
    Unary(UnaryOp, u8),
    /// The gradient of `op` from the upstream gradient and the forward output: `(dy, y)`.
    UnaryGrad(UnaryOp, u8, u8),
    /// `a op b`.
    Binary(BinaryOp, u8, u8),
}

impl FusedStep {
    /// The steps this one reads.
    pub fn operands(&self) -> Vec<usize> {
        match *self {
            FusedStep::Input(_) | FusedStep::Const(_) => vec![],
            FusedStep::Unary(_, a) => vec![a as usize],
            FusedStep::UnaryGrad(_, a, b) | FusedStep::Binary(_, a, b) => vec![a as usize, b as usize],
        }
    }
}

/// A checked fused program (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FusedExpr {
    steps: Vec<FusedStep>,
    inputs: usize,
}

/// A fused expression that breaks the invariants of the module docs, or
/// text that is not one (`reason` says which step and why).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("fused elementwise kernel: {reason}")]
pub struct FusedError {
    /// What is wrong, naming the step or operand.
    pub reason: String,
}

fn bad(reason: impl Into<String>) -> FusedError {
    FusedError { reason: reason.into() }
}

impl FusedExpr {
    /// Check `steps` against the invariants of the module docs.
    pub fn new(steps: Vec<FusedStep>) -> Result<FusedExpr, FusedError> {
        if steps.is_empty() || steps.len() > MAX_STEPS {
            return Err(bad(format!("{} steps; a fused kernel holds 1 to {MAX_STEPS}", steps.len())));
        }
        let mut used = [false; MAX_INPUTS];
        let mut inputs = 0;
        for (i, s) in steps.iter().enumerate() {
            if let Some(&o) = s.operands().iter().find(|&&o| o >= i) {
                return Err(bad(format!("step {i} reads step {o}, which is not an earlier step")));
            }
            if let FusedStep::Input(k) = *s {
                let k = k as usize;
                if k >= MAX_INPUTS {
                    return Err(bad(format!("input {k}: a fused kernel reads at most {MAX_INPUTS} inputs")));
                }
                used[k] = true;
                inputs = inputs.max(k + 1);
            }
        }
        if let Some(k) = (0..inputs).find(|&k| !used[k]) {
            return Err(bad(format!("input {k} is never read; inputs must be numbered 0..n, each one used")));
        }
        Ok(FusedExpr { steps, inputs })
    }

    /// The steps, the last one the output.
    pub fn steps(&self) -> &[FusedStep] {
        &self.steps
    }

    /// How many inputs the kernel reads.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// FNV-1a 64 of the canonical text: stable across builds and machines.
    pub fn hash(&self) -> u64 {
        crate::fnv1a64(self.to_string().as_bytes())
    }

    /// The CUDA entry point: `towers_fused_<hash>`.
    pub fn entry(&self) -> String {
        format!("towers_fused_{:016x}", self.hash())
    }

    /// The expression as a tree (shared steps written out at each use):
    /// `(mul $0 (sigmoid $0))`.
    pub fn tree(&self) -> String {
        self.tree_of(self.steps.len() - 1)
    }

    fn tree_of(&self, i: usize) -> String {
        match self.steps[i] {
            FusedStep::Input(k) => format!("${k}"),
            FusedStep::Const(b) => format!("{:?}", f32::from_bits(b)),
            FusedStep::Unary(op, a) => format!("({} {})", op.name(), self.tree_of(a as usize)),
            FusedStep::UnaryGrad(op, a, b) => {
                format!("({}_grad {} {})", op.name(), self.tree_of(a as usize), self.tree_of(b as usize))
            }
            FusedStep::Binary(op, a, b) => {
                format!("({} {} {})", op.name(), self.tree_of(a as usize), self.tree_of(b as usize))
            }
        }
    }
}

impl fmt::Display for FusedExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ew[")?;
        for (i, s) in self.steps.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            match *s {
                FusedStep::Input(k) => write!(f, "${k}")?,
                FusedStep::Const(b) => write!(f, "c{b:08x}")?,
                FusedStep::Unary(op, a) => write!(f, "{}:{a}", op.name())?,
                FusedStep::UnaryGrad(op, a, b) => write!(f, "{}_grad:{a}:{b}", op.name())?,
                FusedStep::Binary(op, a, b) => write!(f, "{}:{a}:{b}", op.name())?,
            }
        }
        f.write_str("]")
    }
}

impl FromStr for FusedExpr {
    type Err = FusedError;

    fn from_str(s: &str) -> Result<FusedExpr, FusedError> {
        let body = s.strip_prefix("ew[").and_then(|r| r.strip_suffix(']')).ok_or_else(|| bad("not ew[...]"))?;
        let idx = |t: &str| t.parse::<u8>().map_err(|_| bad(format!("bad operand '{t}'")));
        let mut steps = Vec::new();
        for item in body.split(';') {
            let step = if let Some(k) = item.strip_prefix('$') {
                FusedStep::Input(idx(k)?)
            } else if let Some(b) = item.strip_prefix('c').filter(|b| b.len() == 8) {
                FusedStep::Const(u32::from_str_radix(b, 16).map_err(|_| bad(format!("bad constant '{item}'")))?)
            } else {
                let parts: Vec<&str> = item.split(':').collect();
                let unary_of = |n: &str| UnaryOp::ALL.iter().copied().find(|o| o.name() == n);
                match parts.as_slice() {
                    [name, a] => {
                        FusedStep::Unary(unary_of(name).ok_or_else(|| bad(format!("no op '{name}'")))?, idx(a)?)
                    }
                    [name, a, b] => match (
                        name.strip_suffix("_grad").and_then(unary_of),
                        BinaryOp::ALL.iter().find(|o| o.name() == *name),
                    ) {
                        (Some(op), _) => FusedStep::UnaryGrad(op, idx(a)?, idx(b)?),
                        (None, Some(op)) => FusedStep::Binary(*op, idx(a)?, idx(b)?),
                        _ => return Err(bad(format!("no op '{name}'"))),
                    },
                    _ => return Err(bad(format!("bad step '{item}'"))),
                }
            };
            steps.push(step);
        }
        FusedExpr::new(steps)
    }
}
