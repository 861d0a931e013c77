//! A session: loaded programs sharing one set of variables, on one backend,
//! as one rank of a communicator.
//!
//! `load` does all the work that allocates: variables are declared (first
//! use: created in the backend with their initial values) or checked, and
//! the backend prepares the plan. `run` then allocates nothing. Programs
//! share variables by name; a variable seen again must have the same dtype
//! and shape. Every read copies to host memory: `fetch` and
//! `read_variable` return owned vectors, and the `*_into` variants fill a
//! slice the caller owns without allocating.
//!
//! Values cross as `f32`, or `i32` for i32 and bool tensors: every feed,
//! fetch and variable method is generic over the sealed [`Element`] trait
//! (`fetch::<f32>`, `feed(.., &[i32])`), a thin layer over one body per
//! operation that dispatches on the dtype at run time; a tensor asked for
//! as the other type is a typed error naming it.
//!
//! Feeds come in two ways, with the same checks and errors: `feed`
//! copies the caller's slice in; `feed_with` lends the caller the
//! memory the next run reads ([`Backend::with_feed_buffer`]) to fill in
//! place, for the closure's call only (`&mut self` is held, so no step runs
//! meanwhile). The lent memory is always initialized but its values are
//! unspecified: the closure must write every element. A backend that lends
//! nothing gets the same API through a scratch vector per feed, made at its
//! first in-place write and reused after.

use std::collections::BTreeMap;
use std::sync::Arc;

use towers_codegen::{BufRef, Plan, Step};
use towers_vocab::{DType, DeviceKind, GLOBAL_STEP};

use crate::backend::{Backend, BackendError, HostSliceMut, ProgramId};
use crate::comm::{Comm, LocalComm};
use crate::cpu::CpuBackend;
use crate::devices;
use crate::error::RuntimeError;
use crate::variables::{initial_host, unknown_variable, HostVec, VarInfo, VarTable};

pub use crate::backend::Profiled;

mod colocate;
mod element;
mod feeds;
mod rate;
mod steps;
mod typed;

pub use element::Element;

struct Program {
    id: ProgramId,
    plan: Plan,
    /// Per feed (in `plan.feeds` order): the scratch `feed_with_*` fills
    /// where the backend lends no memory, made at the feed's first such call.
    scratch: Vec<Option<HostVec>>,
    /// Per feed (in `plan.feeds` order): whether it was written since the
    /// program was loaded; `run` refuses while any is not.
    fed: Vec<bool>,
    /// Whether a run completed: a fetch before the first is refused.
    ran: bool,
}

/// Executes plans on a [`Backend`] (the CPU backend by default); see the module docs.
pub struct Session {
    seed: u64,
    backend: Box<dyn Backend>,
    comm: Arc<dyn Comm>,
    vars: VarTable,
    programs: BTreeMap<String, Program>,
    memory: crate::memory::MemoryBudget,
    rate: rate::RateOwner,
    /// The step the next run of any training program takes (TF1's
    /// `global_step`: one count for the session, so two training programs
    /// run in turn draw their dropout masks from one sequence, not each
    /// from its own); `None` until a training program has run or a step
    /// was set or restored.
    train_step: Option<u64>,
}

fn list<'a>(it: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<&str> = it.collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn lookup<'a>(programs: &'a BTreeMap<String, Program>, program: &str) -> Result<&'a Program, RuntimeError> {
    programs.get(program).ok_or_else(|| RuntimeError::UnknownProgram {
        program: program.into(),
        loaded: list(programs.keys().map(|s| s.as_str())),
    })
}

/// Refuse, before anything is created, a plan device this machine cannot
/// serve on `backend` ([`devices::check`]): a host device other than
/// `cpu:0` (a process has one host; every backend runs `/gpu:N` devices,
/// the CPU backend as CPU devices), or a GPU device on a CUDA backend
/// where the machine has no CUDA GPU. The error names the device, what
/// the machine has and how to map it. The machine is probed only for a
/// backend that runs GPU devices on CUDA.
fn check_devices(program: &str, plan: &Plan, kind: devices::BackendKind) -> Result<(), RuntimeError> {
    let all: Vec<_> = devices::plan_devices(plan).into_iter().map(|d| d.device).collect();
    let machine = match kind {
        devices::BackendKind::Cpu => devices::Machine { cuda: devices::Cuda::Absent(String::new()), cores: 1 },
        _ => devices::Machine::probe(),
    };
    devices::check(&all, kind, &machine).map_err(|e| RuntimeError::UnservableDevice {
        program: program.into(),
        device: plan.device_name(e.device()),
        has: e.has(),
        how: e.how(),
    })
}

/// Whether a tensor of dtype `actual` can be fed or fetched as `requested`.
fn compatible(actual: DType, requested: DType) -> bool {
    actual == requested || (requested == DType::I32 && actual == DType::Bool)
}

impl Session {
    /// A session on the CPU backend; one process (world size 1). A
    /// variable's initial value comes from its name and the graph seed
    /// when its graph had one set (`GraphBuilder::with_seed`, TF's
    /// `tf.set_random_seed`), else from `seed`.
    pub fn new(seed: u64) -> Session {
        Session::with_backend(seed, Box::new(CpuBackend::new()))
    }

    /// A session on `backend`; one process (world size 1).
    pub fn with_backend(seed: u64, backend: Box<dyn Backend>) -> Session {
        Session {
            seed,
            backend,
            comm: Arc::new(LocalComm::single()),
            vars: VarTable::new(),
            programs: BTreeMap::new(),
            memory: Default::default(),
            rate: Default::default(),
            train_step: None,
        }
    }

    /// This session as one rank of `comm`: the plans loaded from now on run
    /// their collective steps through it.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use towers_runtime::{comm::LocalComm, Session};
    /// let s = Session::new(0).with_comm(Arc::new(LocalComm::single()));
    /// assert_eq!(s.comm().world_size(), 1);
    /// ```
    pub fn with_comm(mut self, comm: Arc<dyn Comm>) -> Session {
        self.comm = comm;
        self
    }

    /// The communicator this session is a rank of.
    pub fn comm(&self) -> &Arc<dyn Comm> {
        &self.comm
    }

    /// The backend's name ("cpu").
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// Load a plan under `name`. A plan of one device whose variables
    /// already live on another device (an eval program after a training
    /// program that put them on `gpu:0`) runs there instead, as TF1
    /// colocates reads with variables.
    pub fn load(&mut self, name: &str, mut plan: Plan) -> Result<(), RuntimeError> {
        if self.programs.contains_key(name) {
            return Err(RuntimeError::DuplicateProgram { program: name.into() });
        }
        // A one-device program (an eval) runs where its variables live.
        colocate::colocate(&mut plan, &self.vars);
        // The CPU kernels' SIMD path (TOWERS_SIMD): refused here, before any
        // kernel runs, when it names a path this CPU lacks.
        towers_kernels::simd::selected().map_err(RuntimeError::SimdPath)?;
        // Every plan is verified before any of it is used: a malformed plan
        // (e.g. edited JSON) is a typed error, never a bad access in a kernel.
        towers_codegen::verify(&plan)
            .map_err(|e| RuntimeError::InvalidPlan { program: name.into(), source: Box::new(e) })?;
        check_devices(name, &plan, self.backend.kind())?;
        self.rate.check(name, &plan)?;
        self.check_memory(name, &plan)?;
        let backend = |e: BackendError| RuntimeError::from_backend(name, e);
        // Check every declaration before creating anything.
        for v in &plan.variables {
            if let Some(known) = self.vars.get(&v.name) {
                if !known.matches(v) {
                    return Err(RuntimeError::VariableMismatch {
                        program: name.into(),
                        name: v.name.clone(),
                        existing: known.describe(),
                        declared: format!("{}{:?}", v.dtype, v.shape),
                    });
                }
            }
        }
        // A `global_step` restored before this load: the program continues
        // from it (as `restore` does for the programs loaded before it).
        let mut restored_step = None;
        for v in &plan.variables {
            let Some(known) = self.vars.get_mut(&v.name) else {
                // First declaration: the backend creates it with its seeded initial values.
                self.backend
                    .create_variable(v, initial_host(v, v.seed.unwrap_or(self.seed)).as_slice())
                    .map_err(backend)?;
                self.vars.insert(
                    v.name.clone(),
                    VarInfo { dtype: v.dtype, shape: v.shape.clone(), pending: None, device: Some(v.device) },
                );
                continue;
            };
            // Restored from a checkpoint before any plan declared it: the
            // backend creates it with the restored values.
            if let Some(values) = known.pending.take() {
                if let (GLOBAL_STEP, HostVec::I32(v)) = (v.name.as_str(), &values) {
                    restored_step = v.first().map(|s| (*s).max(0) as u64);
                }
                if let Err(e) = self.backend.create_variable(v, values.as_slice()) {
                    known.pending = Some(values);
                    return Err(backend(e));
                }
                known.dtype = v.dtype;
                known.device = Some(v.device);
            }
        }
        let id = self.backend.load(name, &plan, Arc::clone(&self.comm)).map_err(backend)?;
        if let Some(step) = restored_step {
            self.backend.set_step(id, step);
            self.train_step = Some(step);
        }
        let scratch = plan.feeds.iter().map(|_| None).collect();
        let fed = vec![false; plan.feeds.len()];
        self.rate.loaded(name, &plan);
        self.programs.insert(name.into(), Program { id, plan, scratch, fed, ran: false });
        Ok(())
    }

    /// Refuse a plan whose arenas and new variables exceed what the
    /// backend has, before anything is allocated (an allocation failure
    /// would abort the process).
    fn check_memory(&mut self, name: &str, plan: &Plan) -> Result<(), RuntimeError> {
        let Some(now) = self.backend.memory_available() else { return Ok(()) };
        let arenas: u64 = plan.devices.iter().map(|d| d.arena_bytes as u64).sum();
        let vars: u64 = plan
            .variables
            .iter()
            .filter(|v| !self.vars.contains_key(&v.name))
            .map(|v| v.shape.iter().product::<usize>() as u64 * v.dtype.size_bytes() as u64)
            .sum();
        let planned = arenas.saturating_add(vars);
        let Err(r) = self.memory.admit(now, planned) else { return Ok(()) };
        let mut parts: Vec<String> = plan.devices.iter().map(|d| format!("{} {} B", d.device, d.arena_bytes)).collect();
        parts.push(format!("variables {vars} B"));
        let others = r.need - planned;
        if others > 0 {
            parts.push(format!("earlier programs and the caller's data {others} B"));
        }
        parts.push(format!("margin kept free {} B", r.margin));
        Err(RuntimeError::OutOfMemory {
            program: name.into(),
            backend: self.backend.name().into(),
            planned: r.need + r.margin,
            available: r.available,
            detail: parts.join(", "),
        })
    }

    /// Take the backend's available memory now as the baseline of the
    /// memory check ([`crate::memory`]), e.g. before the caller loads its
    /// data set (which it then declares with [`Session::reserve_memory`]).
    pub fn note_memory_baseline(&mut self) {
        if let Some(now) = self.backend.memory_available() {
            self.memory.set_baseline(now);
        }
    }

    /// Count `bytes` this process holds besides the plans (the data set, on
    /// a backend whose memory is the host's) in the memory check of every
    /// later [`Session::load`] ([`crate::memory`]).
    pub fn reserve_memory(&mut self, bytes: u64) {
        self.memory.reserve(bytes);
    }

    fn program(&self, program: &str) -> Result<&Program, RuntimeError> {
        lookup(&self.programs, program)
    }

    /// The plan loaded under `program`.
    pub fn plan(&self, program: &str) -> Result<&Plan, RuntimeError> {
        Ok(&self.program(program)?.plan)
    }

    /// Elements and dtype of what `r` names in `plan`.
    fn extent(plan: &Plan, r: &BufRef) -> (usize, DType) {
        match plan.buffer(r) {
            Some(b) => (b.len(), b.dtype),
            None => plan.type_of(r).map(|(d, s)| (s.iter().product(), d)).unwrap_or((0, DType::F32)),
        }
    }

    /// Run one step of `program`. Allocates nothing on success.
    ///
    /// Every placeholder must have been fed since the program was loaded
    /// (by `feed_*` or in place by `feed_with_*`); a feed keeps its value
    /// for later runs until it is fed again. A placeholder never fed is
    /// [`RuntimeError::Unfed`], TF1's "You must feed a value for
    /// placeholder tensor 'Y'", and nothing runs.
    pub fn run(&mut self, program: &str) -> Result<(), RuntimeError> {
        let p = self.program(program)?;
        if let Some(i) = p.fed.iter().position(|&f| !f) {
            let (feed, r) = &p.plan.feeds[i];
            let dtype = Session::extent(&p.plan, r).1;
            return Err(RuntimeError::Unfed {
                program: program.into(),
                feed: feed.clone(),
                dtype: dtype.to_string(),
                shape: Session::shape_of(&p.plan, r),
            });
        }
        let id = p.id;
        let train = p.plan.mode == towers_codegen::Mode::Train;
        if let (true, Some(step)) = (train, self.train_step) {
            if self.backend.steps_run(id) != step {
                self.backend.set_step(id, step);
            }
        }
        self.backend.run(id).map_err(|e| RuntimeError::from_backend(program, e))?;
        if train {
            self.train_step = Some(self.backend.steps_run(id));
        }
        if let Some(p) = self.programs.get_mut(program) {
            p.ran = true;
        }
        Ok(())
    }

    /// The buffer a fetch names, its length, after checking the dtype.
    fn fetch_ref(&self, program: &str, name: &str, dtype: DType) -> Result<(&Program, &BufRef, usize), RuntimeError> {
        let p = self.program(program)?;
        let r = p.plan.lookup(name).ok_or_else(|| {
            // With towers, the model's tensors are replicated as `tower_i/<name>`.
            let base = name.strip_suffix(":0").unwrap_or(name);
            let replicas: Vec<&str> = p
                .plan
                .tensors
                .iter()
                .map(|(n, _)| n.as_str())
                .filter(|n| n.starts_with("tower_") && n.split_once('/').is_some_and(|(_, rest)| rest == base))
                .collect();
            if replicas.is_empty() {
                RuntimeError::UnknownFetch {
                    program: program.into(),
                    fetch: name.into(),
                    fetches: list(p.plan.fetches.iter().map(|(n, _)| n.as_str())),
                }
            } else {
                RuntimeError::ReplicatedFetch {
                    program: program.into(),
                    fetch: name.into(),
                    replicas: list(replicas.into_iter()),
                }
            }
        })?;
        // A step's tensor holds nothing before the first step (a variable
        // holds its value from the load on).
        if !p.ran && matches!(r, BufRef::Arena { .. }) {
            return Err(RuntimeError::FetchBeforeRun { program: program.into(), fetch: name.into() });
        }
        // A tensor that is no fetch may share its bytes with later buffers
        // of the step: its value after the step is not its own.
        if !p.plan.fetches.iter().any(|(n, _)| n == name) && p.plan.shares_bytes(r) {
            return Err(RuntimeError::TensorReused { program: program.into(), tensor: name.into() });
        }
        let (len, actual) = Session::extent(&p.plan, r);
        if !compatible(actual, dtype) {
            return Err(RuntimeError::WrongDtype {
                program: program.into(),
                name: name.into(),
                actual: actual.to_string(),
                requested: dtype.to_string(),
            });
        }
        Ok((p, r, len))
    }

    /// The one body of every fetch: `out` must have the tensor's length.
    fn fetch_host(&self, program: &str, name: &str, out: HostSliceMut<'_>, dtype: DType) -> Result<(), RuntimeError> {
        let (p, r, len) = self.fetch_ref(program, name, dtype)?;
        if out.len() != len {
            return Err(RuntimeError::FetchLength {
                program: program.into(),
                fetch: name.into(),
                expected: len,
                got: out.len(),
            });
        }
        self.backend.read_buffer(p.id, r, out).map_err(|e| RuntimeError::from_backend(program, e))
    }

    /// A fetch (e.g. "loss") or any tensor (`node` or `node:slot`) after
    /// `run`, copied to the host: `fetch::<f32>` for f32 tensors,
    /// `fetch::<i32>` for i32 and bool tensors (0/1); another type is
    /// [`RuntimeError::WrongDtype`]. A tensor whose bytes the plan reuses
    /// within the step ([`towers_codegen::Plan::shares_bytes`]) is refused
    /// ([`RuntimeError::TensorReused`]): fetch it, or lower without reuse.
    pub fn fetch<T: Element>(&self, program: &str, name: &str) -> Result<Vec<T>, RuntimeError> {
        let (_, _, len) = self.fetch_ref(program, name, T::DTYPE)?;
        let mut v = vec![T::default(); len];
        self.fetch_into(program, name, &mut v)?;
        Ok(v)
    }

    /// As [`Session::fetch`], into `out` (of the tensor's length), without
    /// allocating; the element type comes from `out`.
    pub fn fetch_into<T: Element>(&self, program: &str, name: &str, out: &mut [T]) -> Result<(), RuntimeError> {
        self.fetch_host(program, name, T::host_mut(out), T::DTYPE)
    }

    /// The variable `name`, after checking that it can be accessed as `dtype` with `len` elements.
    fn var(&self, name: &str, dtype: DType, len: Option<usize>) -> Result<&VarInfo, RuntimeError> {
        let v = self.vars.get(name).ok_or_else(|| unknown_variable(&self.vars, name))?;
        if !compatible(v.dtype, dtype) {
            return Err(RuntimeError::VariableDtype { name: name.into(), dtype: v.dtype.to_string() });
        }
        match len {
            Some(got) if got != v.len() => {
                Err(RuntimeError::VariableLength { name: name.into(), expected: v.len(), got })
            }
            _ => Ok(v),
        }
    }

    /// A variable's current value, copied to the host: `variable::<f32>`,
    /// or `variable::<i32>` for i32 and bool variables (e.g.
    /// `global_step`); another type is [`RuntimeError::VariableDtype`].
    pub fn variable<T: Element>(&self, name: &str) -> Result<Vec<T>, RuntimeError> {
        let mut v = vec![T::default(); self.var(name, T::DTYPE, None)?.len()];
        self.variable_into(name, &mut v)?;
        Ok(v)
    }

    /// As [`Session::variable`], into `out` (of the variable's length),
    /// without allocating; the element type comes from `out`.
    pub fn variable_into<T: Element>(&self, name: &str, out: &mut [T]) -> Result<(), RuntimeError> {
        let v = self.var(name, T::DTYPE, Some(out.len()))?;
        match &v.pending {
            // Restored from a checkpoint, not yet declared by a plan.
            Some(p) => match T::of_vec(p) {
                Some(p) => out.copy_from_slice(p),
                None => return Err(RuntimeError::VariableDtype { name: name.into(), dtype: v.dtype.to_string() }),
            },
            None => {
                self.backend.read_variable(name, T::host_mut(out)).map_err(|e| RuntimeError::from_variable(name, e))?
            }
        }
        Ok(())
    }

    /// Overwrite a variable's value: f32 data for an f32 variable, i32 for
    /// an i32 or bool one (the element type comes from `data`).
    pub fn set_variable<T: Element>(&mut self, name: &str, data: &[T]) -> Result<(), RuntimeError> {
        self.var(name, T::DTYPE, Some(data.len()))?;
        // `global_step` counts the steps taken (TF1 increments it from 0);
        // a negative count would feed dropout's masks and Adam's bias
        // correction a step that never was.
        if let (GLOBAL_STEP, crate::backend::HostSlice::I32(v)) = (name, T::host(data)) {
            if let Some(&bad) = v.iter().find(|&&x| x < 0) {
                return Err(RuntimeError::VariableAccess {
                    name: name.into(),
                    detail: format!("it counts the steps taken and cannot be {bad}; write 0 to start counting again"),
                });
            }
        }
        // `var` above named an unknown variable, with its hint.
        let v = self
            .vars
            .get_mut(name)
            .ok_or_else(|| RuntimeError::UnknownVariable { name: name.into(), hint: String::new() })?;
        match &mut v.pending {
            Some(p) => match T::of_vec_mut(p) {
                Some(p) => p.copy_from_slice(data),
                None => return Err(RuntimeError::VariableDtype { name: name.into(), dtype: v.dtype.to_string() }),
            },
            None => {
                self.backend.write_variable(name, T::host(data)).map_err(|e| RuntimeError::from_variable(name, e))?
            }
        }
        Ok(())
    }

    /// Dtype and shape of a variable.
    pub fn variable_type(&self, name: &str) -> Result<(DType, &[usize]), RuntimeError> {
        let v = self.vars.get(name).ok_or_else(|| unknown_variable(&self.vars, name))?;
        Ok((v.dtype, &v.shape))
    }

    /// A variable's value in its host type (for checkpoints).
    pub(crate) fn read_host(&self, name: &str) -> Result<HostVec, RuntimeError> {
        let v = self.vars.get(name).ok_or_else(|| unknown_variable(&self.vars, name))?;
        let mut out = HostVec::zeros(v.dtype, v.len());
        match &mut out {
            HostVec::F32(o) => self.variable_into(name, o)?,
            HostVec::I32(o) => self.variable_into(name, o)?,
        }
        Ok(out)
    }

    /// Set a variable from a checkpoint: overwrite it if known, else keep it
    /// pending until a plan declares it.
    pub(crate) fn write_host(&mut self, name: &str, shape: &[usize], values: HostVec) -> Result<(), RuntimeError> {
        if self.vars.contains_key(name) {
            return match &values {
                HostVec::F32(d) => self.set_variable(name, d),
                HostVec::I32(d) => self.set_variable(name, d),
            };
        }
        let dtype = match values {
            HostVec::F32(_) => DType::F32,
            HostVec::I32(_) => DType::I32,
        };
        self.vars.insert(name.into(), VarInfo { dtype, shape: shape.to_vec(), pending: Some(values), device: None });
        Ok(())
    }

    /// Every variable's name, sorted.
    pub fn variable_names(&self) -> Vec<String> {
        self.vars.keys().cloned().collect()
    }

    /// Names of the loaded programs, sorted.
    /// The variables the loaded programs declare that are training state
    /// rather than the model: the learning rates, the step counters
    /// (`global_step`, a named optimizer's `<name>/step`: i32 scalars) and
    /// the optimizer slots (a non-trainable `<var>/<slot>` of a trainable
    /// variable `<var>`'s dtype and shape). What a fine-tuning restore
    /// ([`Session::restore_partial`]) leaves out by default.
    pub fn training_state(&self) -> std::collections::BTreeSet<String> {
        let decls: BTreeMap<&str, &towers_codegen::VariableDecl> =
            self.programs.values().flat_map(|p| p.plan.variables.iter()).map(|v| (v.name.as_str(), v)).collect();
        let state = |v: &towers_codegen::VariableDecl| {
            if v.trainable {
                return false;
            }
            if towers_vocab::is_learning_rate(&v.name) {
                return true;
            }
            let counter = v.dtype == DType::I32 && v.shape.is_empty();
            if counter && (v.name == GLOBAL_STEP || v.name.ends_with("/step")) {
                return true;
            }
            let Some((of, _)) = v.name.rsplit_once('/') else { return false };
            decls.get(of).is_some_and(|w| w.trainable && w.dtype == v.dtype && w.shape == v.shape)
        };
        decls.values().filter(|v| state(v)).map(|v| v.name.clone()).collect()
    }

    pub fn program_names(&self) -> Vec<String> {
        self.programs.keys().cloned().collect()
    }

    /// What the CLI prints about the backend, e.g.
    /// "gpu:0 and gpu:1 run as CPU devices: no CUDA driver found", then
    /// where each device of each program runs ([`Session::device_map`]):
    /// "devices of train:" and a line per device ("  gpu:1 -> host thread
    /// 3 of 3 (...)"); a program whose lines equal an earlier one's is left out.
    pub fn backend_note(&self) -> String {
        let mut gpus: Vec<String> = Vec::new();
        for p in self.programs.values() {
            for d in p.plan.devices.iter().map(|d| d.device).chain(p.plan.streams.iter().map(|s| s.device)) {
                if d.kind == DeviceKind::Gpu && !gpus.contains(&d.to_string()) {
                    gpus.push(d.to_string());
                }
            }
        }
        gpus.sort();
        let mut note = if gpus.is_empty() && self.backend.name() == "cpu" {
            "all devices are CPU devices".to_string()
        } else {
            self.backend.device_note(&gpus)
        };
        for (name, p) in &self.programs {
            if let Some(n) = self.backend.program_note(p.id) {
                note.push_str(&format!("\n{name}: {n}"));
            }
        }
        // Where each device runs, per program ("train" first); a program
        // whose devices run as an earlier one's is not repeated.
        let machine = devices::Machine::probe();
        let mut shown: Vec<String> = Vec::new();
        let mut names: Vec<&String> = self.programs.keys().collect();
        names.sort_by_key(|n| n.as_str() != "train");
        for name in names {
            let text = match self.device_map_on(name, &machine) {
                Ok(m) => m.to_string(),
                Err(e) => format!("(no device map: {e})"),
            };
            if !shown.contains(&text) {
                note.push_str(&format!("\ndevices of {name}:"));
                for line in text.lines() {
                    note.push_str(&format!("\n  {line}"));
                }
                shown.push(text);
            }
        }
        note
    }

    /// Where each device of `program` runs on this session's backend on
    /// this machine ([`devices::plan_map`]): one line per device, e.g.
    /// `gpu:1 -> host thread 3 of 3 (arena 2.5 MB; CPU backend: no CUDA driver found)`.
    pub fn device_map(&self, program: &str) -> Result<devices::DeviceMap, RuntimeError> {
        self.device_map_on(program, &devices::Machine::probe())
    }

    fn device_map_on(&self, program: &str, machine: &devices::Machine) -> Result<devices::DeviceMap, RuntimeError> {
        let plan = &self.program(program)?.plan;
        devices::plan_map(plan, self.backend.kind(), machine).map_err(|e| match e {
            devices::PlanMapError::Unservable(u) => RuntimeError::UnservableDevice {
                program: program.into(),
                device: plan.device_name(u.device()),
                has: u.has(),
                how: u.how(),
            },
            devices::PlanMapError::Threads(detail) => RuntimeError::BadPlan { program: program.into(), detail },
        })
    }
}

/// Number of launches and copies in a plan (for reports).
pub fn count_work(plan: &Plan) -> usize {
    plan.streams.iter().flat_map(|s| &s.steps).filter(|s| matches!(s, Step::Launch { .. } | Step::Copy { .. })).count()
}
