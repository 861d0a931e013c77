//! A session: loaded programs sharing one variable store.
//!
//! `load` does all the work that allocates: variables are created (first
//! use) or checked, arenas allocated, constants filled, steps resolved, and
//! worker threads started. `run` then allocates nothing. Programs share
//! variables by name; a variable seen again must have the same dtype and
//! shape.

use std::collections::BTreeMap;

use towers_codegen::{Plan, Step};
use towers_graph::{DType, DeviceKind};

use crate::error::RuntimeError;
use crate::mem::Slot;
use crate::prepare::{prepare, resolve_aliased, Buf, Exec, Prepared};
use crate::sched::Runner;
use crate::store::Store;

struct Program {
    plan: Plan,
    feeds: Vec<(String, Buf)>,
    /// Fetch names, then tensor names.
    fetchable: Vec<(String, Buf)>,
    runner: Runner,
    _prepared: Prepared,
}

/// Time spent in one item of a program while profiling was on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profiled {
    /// `gpu:0/compute`.
    pub stream: String,
    /// The kernel name (`gemm`, `weighted_sum`, ...), `copy` or `wait`.
    pub kernel: &'static str,
    pub node: String,
    pub nanos: u64,
}

/// Executes plans on the CPU backend; see the module docs.
pub struct Session {
    seed: u64,
    store: Store,
    programs: BTreeMap<String, Program>,
}

fn list<'a>(it: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<&str> = it.collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

impl Session {
    /// A session whose variables are initialized from `seed` and their names.
    pub fn new(seed: u64) -> Session {
        Session { seed, store: Store::default(), programs: BTreeMap::new() }
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }
    pub(crate) fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    /// Load a plan under `name`.
    pub fn load(&mut self, name: &str, plan: Plan) -> Result<(), RuntimeError> {
        if self.programs.contains_key(name) {
            return Err(RuntimeError::DuplicateProgram { program: name.into() });
        }
        for v in &plan.variables {
            self.store.ensure(v, self.seed).map_err(|existing| RuntimeError::VariableMismatch {
                program: name.into(),
                name: v.name.clone(),
                existing,
                declared: format!("{}{:?}", v.dtype, v.shape),
            })?;
        }
        let bad = |detail: String| RuntimeError::BadPlan { program: name.into(), detail };
        let prepared = prepare(&plan, &self.store).map_err(bad)?;
        let res = |r| resolve_aliased(&plan, &prepared.arenas, &self.store, &prepared.aliases, r).map_err(bad);
        let feeds =
            plan.feeds.iter().map(|(n, r)| Ok((n.clone(), res(r)?))).collect::<Result<Vec<_>, RuntimeError>>()?;
        let fetchable = plan
            .fetches
            .iter()
            .chain(&plan.tensors)
            .map(|(n, r)| Ok((n.clone(), res(r)?)))
            .collect::<Result<Vec<_>, RuntimeError>>()?;
        let Prepared { arenas, vars, streams, aliases } = prepared;
        let prepared = Prepared { arenas, vars, streams: Vec::new(), aliases };
        let threads = crate::threads::thread_plans(&plan).map_err(bad)?;
        let mut streams: Vec<Vec<Option<Exec>>> = streams;
        let threads: Vec<Vec<(usize, Exec)>> = threads
            .iter()
            .map(|t| t.items.iter().filter_map(|&(si, k)| streams[si][k].take().map(|x| (si, x))).collect())
            .collect();
        let runner = Runner::new(threads, plan.num_events, name).map_err(bad)?;
        self.programs.insert(name.into(), Program { plan, feeds, fetchable, runner, _prepared: prepared });
        Ok(())
    }

    fn program(&self, program: &str) -> Result<&Program, RuntimeError> {
        self.programs.get(program).ok_or_else(|| RuntimeError::UnknownProgram {
            program: program.into(),
            loaded: list(self.programs.keys().map(|s| s.as_str())),
        })
    }

    /// The plan loaded under `program`.
    pub fn plan(&self, program: &str) -> Result<&Plan, RuntimeError> {
        Ok(&self.program(program)?.plan)
    }

    fn feed_buf(&self, program: &str, feed: &str, dtype: DType, len: usize) -> Result<Slot, RuntimeError> {
        let p = self.program(program)?;
        let (_, b) = p.feeds.iter().find(|(n, _)| n == feed).ok_or_else(|| RuntimeError::UnknownFeed {
            program: program.into(),
            feed: feed.into(),
            feeds: list(p.feeds.iter().map(|(n, _)| n.as_str())),
        })?;
        let ok = b.dtype == dtype || (dtype == DType::I32 && b.dtype == DType::Bool);
        if !ok {
            return Err(RuntimeError::WrongDtype {
                program: program.into(),
                name: feed.into(),
                actual: b.dtype.to_string(),
                requested: dtype.to_string(),
            });
        }
        if b.slot.len() != len {
            return Err(RuntimeError::FeedLength {
                program: program.into(),
                feed: feed.into(),
                expected: b.slot.len(),
                got: len,
            });
        }
        Ok(b.slot)
    }

    /// Copy `data` into the placeholder `feed` of `program`.
    pub fn feed_f32(&mut self, program: &str, feed: &str, data: &[f32]) -> Result<(), RuntimeError> {
        let s = self.feed_buf(program, feed, DType::F32, data.len())?;
        // SAFETY: no step is running (`run` holds `&mut self` until done).
        unsafe { s.f32_mut().copy_from_slice(data) };
        Ok(())
    }

    /// Copy `data` into the i32 (or bool) placeholder `feed` of `program`.
    pub fn feed_i32(&mut self, program: &str, feed: &str, data: &[i32]) -> Result<(), RuntimeError> {
        let s = self.feed_buf(program, feed, DType::I32, data.len())?;
        // SAFETY: as in `feed_f32`.
        unsafe { s.i32_mut().copy_from_slice(data) };
        Ok(())
    }

    /// Run one step of `program`. Allocates nothing on success.
    pub fn run(&mut self, program: &str) -> Result<(), RuntimeError> {
        let Some(p) = self.programs.get_mut(program) else {
            return Err(self
                .program(program)
                .err()
                .unwrap_or(RuntimeError::UnknownProgram { program: program.into(), loaded: String::new() }));
        };
        p.runner.step().map_err(|(node, detail)| RuntimeError::Kernel { program: program.into(), node, detail })
    }

    /// Turn per-item timing of `program` on (totals restart) or off.
    pub fn set_profiling(&mut self, program: &str, on: bool) -> Result<(), RuntimeError> {
        self.program(program)?;
        if let Some(p) = self.programs.get_mut(program) {
            p.runner.set_profiling(on);
        }
        Ok(())
    }

    /// Time spent in each launch, copy and wait of `program` while profiling
    /// was on, with the stream's name.
    pub fn profile(&self, program: &str) -> Result<Vec<Profiled>, RuntimeError> {
        let p = self.program(program)?;
        Ok(p.runner
            .profile()
            .into_iter()
            .map(|e| Profiled {
                stream: p.plan.streams.get(e.stream).map(|s| s.name()).unwrap_or_default(),
                kernel: e.kind,
                node: e.node,
                nanos: e.nanos,
            })
            .collect())
    }

    /// How many steps `program` has run.
    pub fn steps_run(&self, program: &str) -> Result<u64, RuntimeError> {
        Ok(self.program(program)?.runner.steps_run())
    }

    fn fetch_buf(&self, program: &str, name: &str, dtype: DType) -> Result<Slot, RuntimeError> {
        let p = self.program(program)?;
        let (_, b) = p.fetchable.iter().find(|(n, _)| n == name).ok_or_else(|| RuntimeError::UnknownFetch {
            program: program.into(),
            fetch: name.into(),
            fetches: list(p.plan.fetches.iter().map(|(n, _)| n.as_str())),
        })?;
        let same = b.dtype == dtype || (dtype == DType::I32 && b.dtype == DType::Bool);
        if !same {
            return Err(RuntimeError::WrongDtype {
                program: program.into(),
                name: name.into(),
                actual: b.dtype.to_string(),
                requested: dtype.to_string(),
            });
        }
        Ok(b.slot)
    }

    /// A fetch (e.g. "loss") or any tensor (`node` or `node:slot`) after `run`.
    pub fn fetch_f32(&self, program: &str, name: &str) -> Result<&[f32], RuntimeError> {
        let s = self.fetch_buf(program, name, DType::F32)?;
        // SAFETY: no step is running while `&self` is borrowed.
        Ok(unsafe { s.f32() })
    }

    /// As [`Session::fetch_f32`] for i32 and bool tensors.
    pub fn fetch_i32(&self, program: &str, name: &str) -> Result<&[i32], RuntimeError> {
        let s = self.fetch_buf(program, name, DType::I32)?;
        // SAFETY: as in `fetch_f32`.
        Ok(unsafe { s.i32() })
    }

    fn var_slot(&self, name: &str, dtype: DType) -> Result<Slot, RuntimeError> {
        let v = self.store.vars.get(name).ok_or_else(|| RuntimeError::UnknownVariable { name: name.into() })?;
        let ok = v.dtype == dtype || (dtype == DType::I32 && v.dtype == DType::Bool);
        if !ok {
            return Err(RuntimeError::VariableDtype { name: name.into(), dtype: v.dtype.to_string() });
        }
        Ok(v.region.all())
    }

    /// A variable's current value.
    pub fn read_variable(&self, name: &str) -> Result<&[f32], RuntimeError> {
        let s = self.var_slot(name, DType::F32)?;
        // SAFETY: no step is running while `&self` is borrowed.
        Ok(unsafe { s.f32() })
    }

    /// An i32 variable's current value (e.g. `global_step`).
    pub fn read_variable_i32(&self, name: &str) -> Result<&[i32], RuntimeError> {
        let s = self.var_slot(name, DType::I32)?;
        // SAFETY: as above.
        Ok(unsafe { s.i32() })
    }

    /// Overwrite a variable's value.
    pub fn write_variable(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        let s = self.var_slot(name, DType::F32)?;
        if s.len() != data.len() {
            return Err(RuntimeError::VariableLength { name: name.into(), expected: s.len(), got: data.len() });
        }
        // SAFETY: no step is running (`&mut self`).
        unsafe { s.f32_mut().copy_from_slice(data) };
        Ok(())
    }

    /// Every variable's name, sorted.
    pub fn variable_names(&self) -> Vec<String> {
        self.store.vars.keys().cloned().collect()
    }

    /// Names of the loaded programs, sorted.
    pub fn program_names(&self) -> Vec<String> {
        self.programs.keys().cloned().collect()
    }

    /// What the CLI prints about the backend, e.g.
    /// "gpu:0 and gpu:1 run as CPU devices: no CUDA driver found".
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
        if gpus.is_empty() {
            return "all devices are CPU devices".into();
        }
        let names = match gpus.len() {
            1 => gpus[0].clone(),
            n => format!("{} and {}", gpus[..n - 1].join(", "), gpus[n - 1]),
        };
        let verb = if gpus.len() == 1 { "runs as a CPU device" } else { "run as CPU devices" };
        match crate::cuda::probe() {
            crate::cuda::CudaStatus::Found { devices } => {
                format!("{names} {verb}: a CUDA driver with {devices} device(s) was found, but this build executes plans on the CPU backend")
            }
            other => format!("{names} {verb}: {other}"),
        }
    }
}

/// Number of launches and copies in a plan (for reports).
pub fn count_work(plan: &Plan) -> usize {
    plan.streams.iter().flat_map(|s| &s.steps).filter(|s| matches!(s, Step::Launch { .. } | Step::Copy { .. })).count()
}
