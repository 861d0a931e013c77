//! The runtime's error type: each variant names the program, feed, variable
//! or node it is about.

use thiserror::Error;

use crate::backend::BackendError;
use crate::comm::CommError;

#[derive(Debug, Error)]
pub enum RuntimeError {
    /// `TOWERS_SIMD` names no path, or one this CPU lacks.
    #[error("{0}")]
    SimdPath(towers_kernels::KernelError),

    /// A plan device that no backend of this machine serves (issue 21, item 7).
    #[error("program '{program}' asks for device {device}, but {has}: {how}")]
    UnservableDevice { program: String, device: String, has: String, how: String },

    #[error("no program named '{program}' is loaded (loaded: {loaded})")]
    UnknownProgram { program: String, loaded: String },

    #[error("program '{program}' has no feed named '{feed}' (feeds: {feeds})")]
    UnknownFeed { program: String, feed: String, feeds: String },

    /// A feed of a placeholder the program does not read, whose values
    /// cannot have the placeholder's type (a feed that can is ignored).
    #[error("program '{program}' does not read placeholder '{feed}' (nothing it computes depends on it) and ignores its feed, but {detail}")]
    UnreadFeed { program: String, feed: String, detail: String },

    /// A feed of the wrong size, said in shapes: "expects [200,784], got
    /// 78400 elements = 100 rows".
    #[error("feed '{feed}' of program '{program}' expects {}, got {got} elements{}; feed exactly the placeholder's shape (the batch is fixed when the program is compiled: for a last, shorter batch compile a program at its rows, e.g. compile_eval(.., rows), or pad it)", shape_text(.shape), rows_note(.shape, *.got))]
    FeedLength { program: String, feed: String, shape: Vec<usize>, expected: usize, got: usize },

    /// A run whose placeholder was never fed (TF1's "You must feed a value
    /// for placeholder tensor").
    #[error("You must feed a value for placeholder tensor '{feed}' with dtype {dtype} and shape {} (program '{program}' was never given it since it was loaded): call Session::feed, or write it in place with Session::feed_with, before run", shape_text(.shape))]
    Unfed { program: String, feed: String, dtype: String, shape: Vec<usize> },

    #[error("'{name}' of program '{program}' is {actual}, not {requested}: feed or fetch it as {} values", host_type(.actual))]
    WrongDtype { program: String, name: String, actual: String, requested: String },

    #[error("program '{program}' has no fetch or tensor named '{fetch}' (fetches: {fetches}); a tensor simplification removed (an identity) or fused into another kernel is not kept: name it as a fetch when compiling (CompileOptions::fetches, or compile_eval's fetches); `towers compile --emit plan` lists the tensors a plan keeps")]
    UnknownFetch { program: String, fetch: String, fetches: String },

    /// A model tensor of a towers program, which exists once per tower.
    #[error("program '{program}' computes '{fetch}' in every tower ({replicas}), each on its tower's rows: to get it for the whole batch, in batch order, name it as a fetch when compiling (CompileOptions::fetches: a per-row f32 tensor is gathered across the towers, a scalar combined as the loss); or fetch one tower's part by its tower name")]
    ReplicatedFetch { program: String, fetch: String, replicas: String },

    #[error("tensor '{tensor}' of program '{program}' cannot be read after a step: its arena bytes are reused by later steps (memory planning by liveness); fetch it through the program's fetches (CompileOptions::fetches), or compile with memory reuse off (CompileOptions::reuse_memory = false; CLI: --no-memory-reuse)")]
    TensorReused { program: String, tensor: String },

    #[error("fetch '{fetch}' of program '{program}' before the program's first run: it holds no value yet; call Session::run(\"{program}\") first (a variable is read with Session::variable at any time)")]
    FetchBeforeRun { program: String, fetch: String },

    /// A program compiled with another learning rate than the program whose
    /// rate the session's learning-rate variable of that name holds.
    #[error("program '{program}' is compiled with learning rate {declared}, but this session's '{variable}' variable holds program '{owner}''s {owned}, and both programs' optimizers read that one variable: give each program's optimizer its own rate with CompileOptions::optimizer_name (TF1's AdamOptimizer(name=\"d_adam\"): it reads '<name>/learning_rate'), or compile both with one rate and write each step's with Session::set_variable(\"{variable}\", ..)")]
    LearningRateConflict { program: String, variable: String, declared: f32, owner: String, owned: f32 },

    #[error("fetch '{fetch}' of program '{program}' has {expected} elements, the output slice {got}")]
    FetchLength { program: String, fetch: String, expected: usize, got: usize },

    /// `hint` is empty or says which variable was probably meant.
    #[error("no variable named '{name}'{hint}")]
    UnknownVariable { name: String, hint: String },

    #[error("variable '{name}' is {existing} in the store but program '{program}' declares {declared}")]
    VariableMismatch { program: String, name: String, existing: String, declared: String },

    #[error("variable '{name}' has {expected} elements, got {got}")]
    VariableLength { name: String, expected: usize, got: usize },

    #[error("variable '{name}' is {dtype}: read or write it as {} values (e.g. variable::<{}>)", host_type(.dtype), host_type(.dtype))]
    VariableDtype { name: String, dtype: String },

    #[error("program '{program}' is already loaded")]
    DuplicateProgram { program: String },

    #[error("invalid plan for program '{program}': {detail}")]
    BadPlan { program: String, detail: String },

    /// The plan verifier refused the plan (`towers_codegen::verify`): run on
    /// every plan a session loads, including plans read from JSON.
    #[error("program '{program}' is not a valid plan: {source}")]
    InvalidPlan { program: String, source: Box<towers_codegen::PlanError> },

    #[error("program '{program}', node '{node}': {detail}")]
    Kernel { program: String, node: String, detail: String },

    #[error("program '{program}', collective '{node}': {source}")]
    Collective { program: String, node: String, source: Box<CommError> },

    #[error("program '{program}': {detail}")]
    Backend { program: String, detail: String },

    #[error("program '{program}': {detail}")]
    Unsupported { program: String, detail: String },

    #[error("variable '{name}': {detail}")]
    VariableAccess { name: String, detail: String },

    #[error("checkpoint {path}: {detail}")]
    Checkpoint { path: String, detail: String },

    #[error("checkpoint {path}: variable '{name}' is {in_file} in the checkpoint but {in_session} in the session")]
    CheckpointMismatch { path: String, name: String, in_file: String, in_session: String },

    #[error("checkpoint {path}: variable '{name}' is missing from the checkpoint (a checkpoint of another model?); to load only the variables that match (fine-tuning, evaluation) use Session::restore_partial (CLI: --restore-partial)")]
    CheckpointMissing { path: String, name: String },

    /// Tensors of the file that the session has no variable for, refused
    /// by an exact resume (`Session::restore_ignoring`).
    #[error("checkpoint {path}: holds {} tensor(s) this model does not have: {} (a checkpoint of another model or optimizer?); to load only the variables that match use Session::restore_partial (CLI: --restore-partial)", names.len(), short_list(names))]
    CheckpointUnknown { path: String, names: Vec<String> },

    /// A tensor of the file holds NaN or Inf: refused on restore.
    #[error("checkpoint {path}: tensor '{name}' holds {value} at element {index}; refusing to resume from a non-finite state (resume from an earlier checkpoint)")]
    CheckpointNonFinite { path: String, name: String, index: usize, value: f32 },

    /// A variable holds NaN or Inf: nothing is saved.
    #[error("checkpoint {path}: variable '{name}' holds {value} at element {index}; a non-finite state is never saved (the previous checkpoint is kept)")]
    NonFiniteVariable { path: String, name: String, index: usize, value: f32 },

    #[error("program '{program}' needs {} for its buffers and new variables ({detail}), but the {backend} backend has only {} available; use a smaller batch{}", gib(*planned), gib(*available), memory_hint(backend))]
    OutOfMemory { program: String, backend: String, planned: u64, available: u64, detail: String },

    /// The ranks of a group hold different variables (`Session::check_replicas`).
    #[error("{when}: the variables of rank(s) {ranks:?} differ from rank 0's (a checksum over all {world} ranks); every rank must start from the same seed or the same checkpoint, and run the same plan")]
    ReplicasDiffer { when: String, ranks: Vec<usize>, world: usize },

    #[error("checkpoint {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

impl RuntimeError {
    /// A backend's error about `program`.
    pub(crate) fn from_backend(program: &str, e: BackendError) -> RuntimeError {
        let program = program.to_string();
        match e {
            BackendError::BadPlan(detail) => RuntimeError::BadPlan { program, detail },
            BackendError::Kernel { node, detail } => RuntimeError::Kernel { program, node, detail },
            BackendError::Collective { node, source } => {
                RuntimeError::Collective { program, node, source: Box::new(source) }
            }
            BackendError::Access(detail) | BackendError::Device(detail) => RuntimeError::Backend { program, detail },
            BackendError::Unsupported(detail) => RuntimeError::Unsupported { program, detail },
        }
    }

    /// A backend's error about variable `name`.
    pub(crate) fn from_variable(name: &str, e: BackendError) -> RuntimeError {
        RuntimeError::VariableAccess { name: name.into(), detail: e.to_string() }
    }
}

/// Bytes as GiB with two decimals, for memory errors.
fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// At most 8 names, then how many more.
fn short_list(names: &[String]) -> String {
    let mut s = names.iter().take(8).map(String::as_str).collect::<Vec<_>>().join(", ");
    if names.len() > 8 {
        s.push_str(&format!(" and {} more", names.len() - 8));
    }
    s
}

/// How to fit a plan besides a smaller batch: on the CPU backend every
/// tower shares the host's memory, so more towers need more, not less.
pub fn memory_hint(backend: &str) -> &'static str {
    if backend == "cpu" {
        " or fewer towers (on the cpu backend every tower lives in the same host memory)"
    } else {
        ", or more towers on more devices"
    }
}

/// The host element type ([`crate::Element`]) of a dtype's name: `f32` for
/// f32, `i32` for i32 and bool.
fn host_type(dtype: &str) -> &'static str {
    if dtype == "f32" {
        "f32"
    } else {
        "i32"
    }
}

/// A shape as TF prints it: `[200,784]`.
pub(crate) fn shape_text(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(","))
}

/// " = 100 rows" when `got` is a whole number of the shape's rows; else
/// what one row holds.
fn rows_note(shape: &[usize], got: usize) -> String {
    let row: usize = shape.iter().skip(1).product();
    match shape.len() {
        0 => String::new(),
        1 => format!(" = {got} rows"),
        _ if row > 0 && got.is_multiple_of(row) => format!(" = {} rows", got / row),
        _ => format!(", not a whole number of rows of {row} elements ({})", shape_text(&shape[1..])),
    }
}
