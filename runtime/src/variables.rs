//! The session's variable table, backend-neutral: each variable's dtype and
//! shape, and where its value is. A variable is *resident* once a loaded
//! plan declared it (its storage then lives in the backend, created with its
//! initial values seeded by (graph seed if the plan's declaration carries
//! one, else session seed; variable name), so the same seed
//! and name always give the same values whatever the load order), or
//! *pending* when a checkpoint restored it before any plan declared it: its
//! value then waits in host memory and becomes the backend's initial value
//! at the first declaration.

use std::collections::BTreeMap;

use towers_codegen::VariableDecl;
use towers_kernels::init;
use towers_vocab::{DType, Initializer};

use crate::backend::{HostSlice, HostSliceMut};

/// Owned host values of a tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum HostVec {
    F32(Vec<f32>),
    /// i32 and bool.
    I32(Vec<i32>),
}

impl HostVec {
    /// Zeros of the host type of `dtype`.
    pub fn zeros(dtype: DType, n: usize) -> HostVec {
        match dtype {
            DType::F32 => HostVec::F32(vec![0.0; n]),
            DType::I32 | DType::Bool => HostVec::I32(vec![0; n]),
        }
    }
    pub fn as_slice(&self) -> HostSlice<'_> {
        match self {
            HostVec::F32(v) => HostSlice::F32(v),
            HostVec::I32(v) => HostSlice::I32(v),
        }
    }
    pub fn as_mut_slice(&mut self) -> HostSliceMut<'_> {
        match self {
            HostVec::F32(v) => HostSliceMut::F32(v),
            HostVec::I32(v) => HostSliceMut::I32(v),
        }
    }
}

/// Initial values of a variable as f32.
pub fn initial_values(d: &VariableDecl, seed: u64) -> Vec<f32> {
    let n: usize = d.shape.iter().product();
    let mut v = vec![0.0f32; n];
    match &d.init {
        Initializer::Zeros => {}
        Initializer::Ones => init::fill(&mut v, 1.0),
        Initializer::Constant(c) => init::fill(&mut v, c.0),
        Initializer::TruncatedNormal { mean, stddev } => {
            init::truncated_normal(&mut v, mean.0, stddev.0, seed, &d.name)
        }
        Initializer::GlorotUniform => init::glorot_uniform(&mut v, &d.shape, seed, &d.name),
        Initializer::RandomUniform { min, max } => init::uniform(&mut v, min.0, max.0, seed, &d.name),
        Initializer::VarianceScaling { scale, mode, distribution } => {
            init::variance_scaling(&mut v, &d.shape, scale.0, *mode, *distribution, seed, &d.name)
        }
        Initializer::RandomNormal { mean, stddev } => init::random_normal(&mut v, mean.0, stddev.0, seed, &d.name),
    }
    v
}

/// Initial values of a variable in its host type.
pub fn initial_host(d: &VariableDecl, seed: u64) -> HostVec {
    let v = initial_values(d, seed);
    match d.dtype {
        DType::F32 => HostVec::F32(v),
        DType::I32 | DType::Bool => HostVec::I32(v.iter().map(|x| *x as i32).collect()),
    }
}

/// One variable the session knows.
pub struct VarInfo {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Restored before any plan declared it: the value, not yet in the backend.
    pub pending: Option<HostVec>,
    /// The device whose memory holds it: the first declaration's (None
    /// while pending).
    pub device: Option<towers_vocab::Device>,
}

impl VarInfo {
    pub fn describe(&self) -> String {
        format!("{}{:?}", self.dtype, self.shape)
    }
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    /// Whether a declaration agrees (a pending i32 may become a bool variable:
    /// checkpoints store both as i32).
    pub fn matches(&self, d: &VariableDecl) -> bool {
        let same =
            self.dtype == d.dtype || (self.pending.is_some() && self.dtype == DType::I32 && d.dtype == DType::Bool);
        same && self.shape == d.shape
    }
}

/// Variables by name (sorted: checkpoints and listings are deterministic).
pub type VarTable = BTreeMap<String, VarInfo>;

/// [`RuntimeError::UnknownVariable`] for `name`, with the variable of `vars`
/// it probably means: one whose scoped name ends with it (`fc/weights` for
/// `net/fc/weights`), else the nearest by edit distance when close enough.
pub(crate) fn unknown_variable(vars: &VarTable, name: &str) -> crate::error::RuntimeError {
    let suffix = format!("/{name}");
    let by_suffix: Vec<&String> = vars.keys().filter(|k| k.ends_with(&suffix)).collect();
    let near = || {
        vars.keys()
            .map(|k| (edit_distance(k, name), k))
            .filter(|(d, _)| *d <= (name.len() / 4).max(2))
            .min()
            .map(|(_, k)| k)
    };
    let hint = match by_suffix.as_slice() {
        [one] => format!("; did you mean '{one}'?"),
        [] => near().map_or_else(String::new, |k| format!("; did you mean '{k}'?")),
        many => {
            format!("; did you mean one of {}?", many.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(", "))
        }
    };
    crate::error::RuntimeError::UnknownVariable { name: name.into(), hint }
}

/// Levenshtein distance over chars (names are short; called on errors only).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}
