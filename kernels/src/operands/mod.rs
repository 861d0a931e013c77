//! Each kernel's operands, declared once: [`Kernel::signature`] lists, for
//! every operand of a launch in launch order, its name (`x`, `filter`,
//! `dy`, ...), its [`Role`], its dtype rule and its element count as a
//! function of the kernel's parameters ([`Len`]), plus the kernel's scalar
//! parameters for display. The plan verifier and the CPU backend check a
//! launch against it generically ([`Signature::check`]); nothing else
//! repeats a kernel's arity, dtypes or sizes.
//!
//! Invariants:
//! - `Kernel::signature` states every kernel's operands through its
//!   family's descriptor (`declare` in `kernels/src/<family>/desc.rs`,
//!   filling the [`table::Builder`]; see `crate::family`); it
//!   also validates the parameters against themselves (shapes that
//!   broadcast, axes in range, positive windows, channels and classes, the
//!   convolution's workspace length) and computes every count with checked
//!   arithmetic: an inconsistency or overflow is a [`ParamError`], never a
//!   panic.
//! - Building a signature allocates in proportion to the kernel's own
//!   parameters, never to a count read from them: a repeated operand block
//!   (`AddN`'s `n` inputs, `MultiApply`'s `count` members) is one [`Run`].
//! - A [`Ref`] inside a run may name another operand relative to the
//!   repetition (`base + r * stride`), so a member's slot can be "as long as
//!   this member's variable".
//! - Dtypes and lengths only: the verifier keeps the rules about memory
//!   (overlap, devices); `Kernel::in_place_ok` says which alias is allowed.

use std::borrow::Cow;
use std::fmt;

use crate::dtype::DType;
use crate::Kernel;

mod check;
pub(crate) mod table;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_family;

pub use check::{Actual, Mismatch};

/// What a launch does with an operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// An input, only read.
    Read,
    /// An output, fully overwritten (never read).
    Write,
    /// An output read and written in place (a variable, an optimizer slot).
    Update,
    /// Scratch owned by the launch for its duration.
    Workspace,
}

impl Role {
    /// The role's word in a signature's text.
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "written",
            Role::Update => "read-written",
            Role::Workspace => "workspace",
        }
    }
}

/// Which list of a launch an operand is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    In,
    Out,
}

impl Side {
    /// `input` or `output`.
    pub fn word(self) -> &'static str {
        match self {
            Side::In => "input",
            Side::Out => "output",
        }
    }
}

/// Another operand of the same launch: index `base + r * stride` of `side`,
/// `r` being the repetition of the [`Run`] holding the referring operand (0
/// outside a repeated run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ref {
    pub side: Side,
    pub base: usize,
    pub stride: usize,
}

impl Ref {
    /// Input `i`.
    pub const fn input(i: usize) -> Ref {
        Ref { side: Side::In, base: i, stride: 0 }
    }

    /// Output `i`.
    pub const fn output(i: usize) -> Ref {
        Ref { side: Side::Out, base: i, stride: 0 }
    }

    /// The index this reference names from repetition `r`, or None when it overflows.
    pub fn index(self, r: usize) -> Option<usize> {
        r.checked_mul(self.stride)?.checked_add(self.base)
    }
}

/// An operand's dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DTypeRule {
    /// Exactly this dtype.
    Is(DType),
    /// The dtype of another operand (layout kernels move any 4-byte element).
    Like(Ref),
    /// Any dtype (the first operand of a layout kernel).
    Any,
}

/// An operand's element count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Len {
    /// Exactly this many, from the parameters.
    Exact(usize),
    /// As many as another operand.
    Like(Ref),
    /// Another operand's count divided by `per_row` (one per row).
    Rows { of: Ref, per_row: usize },
    /// Another operand's count times `factor`.
    Times { of: Ref, factor: usize },
    /// Any length that is a multiple of this (positive) count.
    Multiple(usize),
    /// Any length up to this one.
    AtMost(usize),
    /// Any length: the buffer decides.
    Any,
}

/// One operand.
#[derive(Debug, Clone, PartialEq)]
pub struct OperandSig {
    /// Its name: `x`, `filter`, `dy`, ...
    pub name: &'static str,
    /// An index shown after the name (`a_1`: pair 1), besides a run's repetition.
    pub index: Option<usize>,
    pub role: Role,
    pub dtype: DTypeRule,
    pub len: Len,
    /// Why the length is what it is (`m*k = 2*4`), for messages; empty:
    /// the rule says it.
    pub why: Cow<'static, str>,
}

impl OperandSig {
    /// The operand's name in repetition `r` of a run repeated `times` times:
    /// `x`, `a_1`, `grad_3`.
    pub fn label(&self, r: usize, times: usize) -> String {
        match (self.index, times > 1) {
            (Some(i), true) => format!("{}_{i}_{r}", self.name),
            (Some(i), false) => format!("{}_{i}", self.name),
            (None, true) => format!("{}_{r}", self.name),
            (None, false) => self.name.to_string(),
        }
    }
}

/// A block of operands repeated `times` times in a row (`times` 1: once).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub ops: Vec<OperandSig>,
    pub times: usize,
}

/// Every operand of a kernel, in launch order, and its scalar parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Signature {
    /// The kernel's name ([`Kernel::name`]).
    pub kernel: &'static str,
    pub inputs: Vec<Run>,
    pub outputs: Vec<Run>,
    /// The workspace, when the kernel needs one (a positive exact count, f32).
    pub workspace: Option<OperandSig>,
    /// The scalar parameters, name and value, for display.
    pub params: Vec<(&'static str, String)>,
    /// The counts of inputs and outputs (checked when built).
    pub(crate) n_in: usize,
    pub(crate) n_out: usize,
}

/// Parameters that contradict themselves, or counts that overflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError {
    pub reason: String,
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for ParamError {}

impl Kernel {
    /// This kernel's operands and parameters, or why its parameters are
    /// invalid. See the [module docs](crate::operands).
    pub fn signature(&self) -> Result<Signature, ParamError> {
        let mut b = table::Builder::new(self.name());
        self.declare(&mut b)?;
        b.finish()
    }
}

impl Signature {
    /// How many inputs a launch takes.
    pub fn input_count(&self) -> usize {
        self.n_in
    }

    /// How many outputs a launch takes.
    pub fn output_count(&self) -> usize {
        self.n_out
    }

    fn runs(&self, side: Side) -> &[Run] {
        match side {
            Side::In => &self.inputs,
            Side::Out => &self.outputs,
        }
    }

    /// Operand `i` of `side`, with its repetition and its run's count.
    pub fn operand(&self, side: Side, i: usize) -> Option<(&OperandSig, usize, usize)> {
        let mut start = 0usize;
        for run in self.runs(side) {
            let len = run.ops.len().saturating_mul(run.times);
            if i - start < len {
                let k = i - start;
                return Some((&run.ops[k % run.ops.len()], k / run.ops.len(), run.times));
            }
            // In range: `finish` checked that the runs' total does not overflow.
            start += len;
        }
        None
    }

    /// The name of operand `i` of `side` (`?` past the end).
    pub fn name(&self, side: Side, i: usize) -> String {
        self.operand(side, i).map_or_else(|| "?".into(), |(o, r, times)| o.label(r, times))
    }

    /// The names of `side`'s operands, comma separated (a long run shown by
    /// its first and last).
    pub fn names(&self, side: Side) -> String {
        let mut parts: Vec<String> = Vec::new();
        for run in self.runs(side) {
            if run.times > 2 {
                let first: Vec<String> = run.ops.iter().map(|o| o.label(0, run.times)).collect();
                let last: Vec<String> = run.ops.iter().map(|o| o.label(run.times - 1, run.times)).collect();
                parts.push(format!("{}, ..., {}", first.join(", "), last.join(", ")));
            } else {
                for r in 0..run.times {
                    parts.extend(run.ops.iter().map(|o| o.label(r, run.times)));
                }
            }
        }
        parts.join(", ")
    }

    /// Why operand `i` of `side` has its length, for messages.
    pub fn why(&self, side: Side, i: usize) -> String {
        let Some((o, r, _)) = self.operand(side, i) else { return String::new() };
        if !o.why.is_empty() {
            return o.why.to_string();
        }
        let at = |x: Ref| match x.index(r) {
            Some(j) => format!("{} {j} ({})", x.side.word(), self.name(x.side, j)),
            None => "?".into(),
        };
        match o.len {
            Len::Exact(n) => format!("{n}"),
            Len::Like(x) => format!("the length of {}", at(x)),
            Len::Rows { of, per_row } => format!("one per row of {per_row} of {}", at(of)),
            Len::Times { of, factor } => format!("{factor} per element of {}", at(of)),
            Len::Multiple(n) => format!("a multiple of {n}"),
            Len::AtMost(n) => format!("at most {n}"),
            Len::Any => "any length".into(),
        }
    }
}

impl fmt::Display for Len {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = |x: &Ref| {
            let s = if x.stride > 0 { format!("+{}r", x.stride) } else { String::new() };
            format!("{}{}{s}", if x.side == Side::In { "in" } else { "out" }, x.base)
        };
        match self {
            Len::Exact(n) => write!(f, "{n}"),
            Len::Like(x) => write!(f, "=len({})", r(x)),
            Len::Rows { of, per_row } => write!(f, "=len({})/{per_row}", r(of)),
            Len::Times { of, factor } => write!(f, "=len({})*{factor}", r(of)),
            Len::Multiple(n) => write!(f, "k*{n}"),
            Len::AtMost(n) => write!(f, "<={n}"),
            Len::Any => f.write_str("any"),
        }
    }
}

/// One line per kernel: `gemm(in a: f32[6] read, ...; m=2, ...)`.
impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.kernel)?;
        let mut sep = "";
        let op = |f: &mut fmt::Formatter<'_>, o: &OperandSig, label: String| {
            let dt = match o.dtype {
                DTypeRule::Is(d) => d.to_string(),
                DTypeRule::Like(x) => format!("dtype({}{})", if x.side == Side::In { "in" } else { "out" }, x.base),
                DTypeRule::Any => "any".into(),
            };
            write!(f, "{label}: {dt}[{}] {}", o.len, o.role.name())
        };
        for (side, runs) in [(Side::In, &self.inputs), (Side::Out, &self.outputs)] {
            for run in runs {
                for o in &run.ops {
                    f.write_str(sep)?;
                    sep = ", ";
                    let label =
                        if run.times == 1 { o.label(0, 1) } else { format!("{}_r (r < {})", o.label(0, 1), run.times) };
                    write!(f, "{} ", side.word())?;
                    op(f, o, label)?;
                }
            }
        }
        if let Some(w) = &self.workspace {
            f.write_str(sep)?;
            op(f, w, w.name.to_string())?;
        }
        if !self.params.is_empty() {
            f.write_str("; ")?;
            let ps: Vec<String> = self.params.iter().map(|(n, v)| format!("{n}={v}")).collect();
            f.write_str(&ps.join(", "))?;
        }
        f.write_str(")")
    }
}
