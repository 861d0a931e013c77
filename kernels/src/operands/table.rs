//! The operand table's tools: the [`Builder`] each family's `declare`
//! (in its `desc.rs`) fills, and the checked arithmetic they share. The
//! declarations themselves are the families' ([`Kernel::declare`] asks the
//! kernel's family).

use std::borrow::Cow;

use super::{DTypeRule, Len, OperandSig, ParamError, Ref, Role, Run, Signature};
use crate::dtype::DType;
use crate::window::Padding;
use crate::Kernel;

pub(crate) const F32: DTypeRule = DTypeRule::Is(DType::F32);
pub(crate) const I32: DTypeRule = DTypeRule::Is(DType::I32);
pub(crate) const IN0: Ref = Ref::input(0);

/// A signature under construction.
pub(crate) struct Builder {
    kernel: &'static str,
    inputs: Vec<Run>,
    outputs: Vec<Run>,
    workspace: Option<OperandSig>,
    params: Vec<(&'static str, String)>,
}

/// One operand.
pub(crate) fn op(
    name: &'static str,
    role: Role,
    dtype: DTypeRule,
    len: Len,
    why: impl Into<Cow<'static, str>>,
) -> OperandSig {
    OperandSig { name, index: None, role, dtype, len, why: why.into() }
}

impl Builder {
    pub(crate) fn new(kernel: &'static str) -> Builder {
        Builder { kernel, inputs: Vec::new(), outputs: Vec::new(), workspace: None, params: Vec::new() }
    }

    /// An input read once.
    pub(crate) fn input(&mut self, name: &'static str, dtype: DTypeRule, len: Len, why: impl Into<Cow<'static, str>>) {
        self.inputs.push(Run { ops: vec![op(name, Role::Read, dtype, len, why)], times: 1 });
    }

    /// An output written once.
    pub(crate) fn output(&mut self, name: &'static str, dtype: DTypeRule, len: Len, why: impl Into<Cow<'static, str>>) {
        self.outputs.push(Run { ops: vec![op(name, Role::Write, dtype, len, why)], times: 1 });
    }

    /// An output read and written in place.
    pub(crate) fn update(&mut self, name: &'static str, dtype: DTypeRule, len: Len, why: impl Into<Cow<'static, str>>) {
        self.outputs.push(Run { ops: vec![op(name, Role::Update, dtype, len, why)], times: 1 });
    }

    /// A block of inputs repeated `times` times.
    pub(crate) fn inputs(&mut self, ops: Vec<OperandSig>, times: usize) {
        self.inputs.push(Run { ops, times });
    }

    /// A block of outputs repeated `times` times.
    pub(crate) fn outputs(&mut self, ops: Vec<OperandSig>, times: usize) {
        self.outputs.push(Run { ops, times });
    }

    /// The f32 workspace of `n` elements (none when 0).
    pub(crate) fn workspace(&mut self, n: usize) {
        if n > 0 {
            self.workspace = Some(op("workspace", Role::Workspace, F32, Len::Exact(n), "the geometry's workspace_len"));
        }
    }

    /// A scalar parameter, for display.
    pub(crate) fn param(&mut self, name: &'static str, value: impl ToString) {
        self.params.push((name, value.to_string()));
    }

    pub(crate) fn finish(self) -> Result<Signature, ParamError> {
        let total = |runs: &[Run], what: &str| {
            runs.iter()
                .try_fold(0usize, |a, r| r.ops.len().checked_mul(r.times).and_then(|n| a.checked_add(n)))
                .ok_or_else(|| ParamError { reason: format!("the number of {what} overflows") })
        };
        let (n_in, n_out) = (total(&self.inputs, "inputs")?, total(&self.outputs, "outputs")?);
        Ok(Signature {
            kernel: self.kernel,
            inputs: self.inputs,
            outputs: self.outputs,
            workspace: self.workspace,
            params: self.params,
            n_in,
            n_out,
        })
    }
}

/// `Err(reason)` unless `ok`.
pub(crate) fn ensure(ok: bool, reason: impl FnOnce() -> String) -> Result<(), ParamError> {
    if ok {
        Ok(())
    } else {
        Err(ParamError { reason: reason() })
    }
}

/// A count computed from the parameters, or an error naming it when it overflows.
pub(crate) fn count(v: Option<usize>, what: &str) -> Result<usize, ParamError> {
    v.ok_or_else(|| ParamError { reason: format!("{what} overflows") })
}

pub(crate) fn prod(d: &[usize], what: &str) -> Result<usize, ParamError> {
    count(d.iter().try_fold(1usize, |a, &x| a.checked_mul(x)), what)
}

/// `[2,3]`.
pub fn dims(d: &[usize]) -> String {
    let v: Vec<String> = d.iter().map(|x| x.to_string()).collect();
    format!("[{}]", v.join(","))
}

/// NumPy broadcasting of two shapes, or None when they do not broadcast.
pub(crate) fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| if i < rank - s.len() { 1 } else { s[i - (rank - s.len())] };
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// A positive per-row count (classes, channels).
pub(crate) fn positive(n: usize, what: &str) -> Result<(), ParamError> {
    ensure(n >= 1, || format!("{what} is 0"))
}

/// `m*k = 2*4` with its product.
pub(crate) fn mn(a: usize, b: usize, an: &str, bn: &str, pre: &str) -> Result<(usize, String), ParamError> {
    Ok((count(a.checked_mul(b), &format!("{an}*{bn}"))?, format!("{pre}{an}*{bn} = {a}*{b}")))
}

impl Kernel {
    /// Declare this kernel's operands and parameters into `b`: its
    /// family's declaration (`<family>/desc.rs`).
    pub(super) fn declare(&self, b: &mut Builder) -> Result<(), ParamError> {
        (self.desc().declare)(self, b)
    }
}

/// `same` / `valid`.
pub(crate) use crate::family::padding;

/// Output size along one axis (TF's rules, as [`crate::window`]), checked.
pub(crate) fn window(input: usize, k: usize, stride: usize, padding: Padding) -> Result<usize, ParamError> {
    ensure(k >= 1 && stride >= 1, || format!("window {k} with stride {stride}: both must be at least 1"))?;
    let out = match padding {
        Padding::Same => input.div_ceil(stride),
        Padding::Valid if input < k => 0,
        Padding::Valid => (input - k + 1).div_ceil(stride),
    };
    // The kernels' padding arithmetic: (out - 1) * stride + k.
    count(out.saturating_sub(1).checked_mul(stride).and_then(|v| v.checked_add(k)), "the window's extent")?;
    Ok(out)
}
