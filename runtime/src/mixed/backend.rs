//! [`MixedBackend`]: a [`Backend`] made of parts, each serving the plan's
//! devices of one kind; see the module docs of [`super`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use towers_codegen::{BufRef, Plan, VariableDecl};
use towers_vocab::DeviceKind;

use super::bridge::Bridge;
use super::drive::{Driver, Shared};
use super::part::{Part, PartPlan};
use super::split::{split, Split};
use crate::backend::{Backend, BackendError, HostSlice, HostSliceMut, Profiled, ProgramId};
use crate::comm::Comm;
use crate::host_memory::HostMemory;
use crate::trace::Trace;

struct Program {
    /// Per part, its program.
    ids: Vec<ProgramId>,
    split: Split,
    bridge: Arc<Bridge>,
}

/// One plan, each device served by the part of its kind; see [`super`].
pub struct MixedBackend {
    kinds: Vec<DeviceKind>,
    parts: Vec<Shared>,
    /// Drivers of parts 1.. (part 0 runs on the caller's thread).
    drivers: Vec<Driver>,
    /// Where the bridge's flags live (pinned where a GPU part writes them).
    memory: Arc<dyn HostMemory>,
    /// Which part holds each variable.
    vars: BTreeMap<String, usize>,
    programs: Vec<Program>,
    name: &'static str,
    kind: crate::devices::BackendKind,
}

impl MixedBackend {
    /// A session backend of `parts`, each serving the plan's devices of its
    /// kind (one part per kind); the bridges' flags come from `memory`
    /// (pinned when a part is a GPU). `name` is what `Backend::name` says.
    pub fn new(
        name: &'static str,
        parts: Vec<(DeviceKind, Box<dyn Part>)>,
        memory: Arc<dyn HostMemory>,
    ) -> Result<MixedBackend, BackendError> {
        let mut kinds = Vec::new();
        let mut shared: Vec<Shared> = Vec::new();
        for (k, p) in parts {
            if kinds.contains(&k) {
                return Err(BackendError::Unsupported(format!(
                    "two parts serve {k:?} devices; give one part per kind"
                )));
            }
            kinds.push(k);
            shared.push(Arc::new(Mutex::new(p)));
        }
        if shared.is_empty() {
            return Err(BackendError::Unsupported("a mixed session needs at least one part".into()));
        }
        let drivers = shared
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, p)| Driver::start(Arc::clone(p), i))
            .collect::<Result<_, _>>()?;
        let kind = crate::devices::BackendKind::of_name(name);
        Ok(MixedBackend {
            kinds,
            parts: shared,
            drivers,
            memory,
            vars: BTreeMap::new(),
            programs: Vec::new(),
            name,
            kind,
        })
    }

    /// The mixed session of a machine with CUDA: `cpu:*` on a CPU backend
    /// whose arenas and variables are page-locked (`cuda.pinned_host()`),
    /// `gpu:*` on `cuda`, each logical GPU in a CUDA context of its own
    /// (`crate::devices::gpu_contexts`) or, with `one_context`, every
    /// logical GPU as streams of one context on GPU 0. The bridge's flags
    /// are pinned too, so GPU streams write and wait on them.
    pub fn with_cuda(cuda: crate::CudaBackend, one_context: bool) -> Result<MixedBackend, BackendError> {
        let memory = cuda.pinned_host();
        let cuda = cuda.with_context_per_gpu(!one_context);
        let parts: Vec<(DeviceKind, Box<dyn Part>)> = vec![
            (DeviceKind::Cpu, Box::new(crate::CpuBackend::with_host_memory(Arc::clone(&memory)))),
            (DeviceKind::Gpu, Box::new(cuda)),
        ];
        let name = if one_context { "cpu+cuda (one context)" } else { "cpu+cuda" };
        MixedBackend::new(name, parts, memory)
    }

    /// The mixed session on two CPU backends: `cpu:*` on one, `gpu:*` (as
    /// host threads) on the other, with real copies and bridged events
    /// between them. What a host part beside a CUDA part does, testable
    /// without a GPU.
    pub fn cpu_pair() -> Result<MixedBackend, BackendError> {
        let memory: Arc<dyn HostMemory> = Arc::new(crate::host_memory::Pageable);
        let parts: Vec<(DeviceKind, Box<dyn Part>)> = vec![
            (DeviceKind::Cpu, Box::new(crate::CpuBackend::with_host_memory(Arc::clone(&memory)))),
            (DeviceKind::Gpu, Box::new(crate::CpuBackend::new())),
        ];
        MixedBackend::new("cpu+cpu", parts, memory)
    }

    fn program(&self, id: ProgramId) -> Result<&Program, BackendError> {
        self.programs.get(id.0).ok_or_else(|| BackendError::Access(format!("no program {}", id.0)))
    }

    fn part(&self, k: usize) -> std::sync::MutexGuard<'_, Box<dyn Part>> {
        self.parts[k].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The part holding a buffer of program `id`, and that part's program.
    fn owner(&self, id: ProgramId, r: &BufRef) -> Result<(usize, ProgramId), BackendError> {
        let p = self.program(id)?;
        let k = match r {
            BufRef::Arena { device, .. } => p.split.device_part.get(*device).copied(),
            BufRef::Variable(n) => self.vars.get(n).copied(),
        };
        let k = k.ok_or_else(|| BackendError::Access(format!("no part holds {r:?}")))?;
        Ok((k, p.ids[k]))
    }

    fn var_part(&self, name: &str) -> Result<usize, BackendError> {
        self.vars.get(name).copied().ok_or_else(|| BackendError::Access(format!("variable '{name}' does not exist")))
    }
}

impl Backend for MixedBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn kind(&self) -> crate::devices::BackendKind {
        self.kind
    }

    fn create_variable(&mut self, decl: &VariableDecl, init: HostSlice<'_>) -> Result<(), BackendError> {
        let k = self.kinds.iter().position(|k| *k == decl.device.kind).ok_or_else(|| {
            BackendError::BadPlan(format!(
                "variable '{}' is placed on {}, and no part of this session serves {:?} devices",
                decl.name, decl.device, decl.device.kind
            ))
        })?;
        self.part(k).create_variable(decl, init)?;
        self.vars.insert(decl.name.clone(), k);
        Ok(())
    }

    /// Divide the plan ([`split`]), check the whole plan cannot deadlock,
    /// reserve every part's arenas, lend each part the other parts' memory
    /// its copies name, then load each part's share.
    fn load(&mut self, name: &str, plan: &Plan, comm: Arc<dyn Comm>) -> Result<ProgramId, BackendError> {
        let bad = BackendError::BadPlan;
        let split = split(plan, &self.kinds, &self.vars).map_err(|e| bad(format!("program '{name}': {e}")))?;
        crate::cpu::global_order(plan).map_err(|e| bad(format!("program '{name}': {e}")))?;
        let bridge = Arc::new(Bridge::new(split.bridged.clone(), &*self.memory).map_err(BackendError::Device)?);
        let mut reservations = Vec::with_capacity(self.parts.len());
        for k in 0..self.parts.len() {
            reservations.push(self.part(k).reserve(name, plan, &split.served[k])?);
        }
        let mut foreign = Vec::with_capacity(self.parts.len());
        for k in 0..self.parts.len() {
            let mut lent = BTreeMap::new();
            for (r, &o) in &split.foreign[k] {
                lent.insert(r.clone(), self.part(o).lend(reservations[o], r)?);
            }
            foreign.push(lent);
        }
        let mut ids = Vec::with_capacity(self.parts.len());
        for k in 0..self.parts.len() {
            let part = PartPlan { plan, served: &split.served[k], foreign: &foreign[k], bridge: &bridge };
            ids.push(self.part(k).load_part(reservations[k], &part, Arc::clone(&comm))?);
        }
        self.programs.push(Program { ids, split, bridge });
        Ok(ProgramId(self.programs.len() - 1))
    }

    /// Clear the bridge, run every part's share at once (part 0 here, the
    /// others on their drivers), and return when all are complete: the
    /// first error by part order, after every part finished.
    fn run(&mut self, id: ProgramId) -> Result<(), BackendError> {
        let p = self.programs.get(id.0).ok_or_else(|| BackendError::Access(format!("no program {}", id.0)))?;
        p.bridge.clear();
        for (d, pid) in self.drivers.iter().zip(&p.ids[1..]) {
            d.start_step(*pid);
        }
        let first = self.parts[0].lock().unwrap_or_else(|p| p.into_inner()).run(p.ids[0]);
        let mut result = first;
        for d in &self.drivers {
            let r = d.finish_step();
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    fn write_buffer(&mut self, id: ProgramId, buf: &BufRef, data: HostSlice<'_>) -> Result<(), BackendError> {
        let (k, pid) = self.owner(id, buf)?;
        self.part(k).write_buffer(pid, buf, data)
    }

    fn with_feed_buffer(
        &mut self,
        id: ProgramId,
        buf: &BufRef,
        fill: &mut dyn FnMut(HostSliceMut<'_>),
    ) -> Result<bool, BackendError> {
        let (k, pid) = self.owner(id, buf)?;
        self.part(k).with_feed_buffer(pid, buf, fill)
    }

    fn read_buffer(&self, id: ProgramId, buf: &BufRef, out: HostSliceMut<'_>) -> Result<(), BackendError> {
        let (k, pid) = self.owner(id, buf)?;
        self.part(k).read_buffer(pid, buf, out)
    }

    fn write_variable(&mut self, name: &str, data: HostSlice<'_>) -> Result<(), BackendError> {
        let k = self.var_part(name)?;
        self.part(k).write_variable(name, data)
    }

    fn read_variable(&self, name: &str, out: HostSliceMut<'_>) -> Result<(), BackendError> {
        let k = self.var_part(name)?;
        self.part(k).read_variable(name, out)
    }

    fn set_profiling(&mut self, id: ProgramId, on: bool) {
        if let Some(p) = self.programs.get(id.0) {
            for (k, pid) in p.ids.iter().enumerate() {
                self.part(k).set_profiling(*pid, on);
            }
        }
    }

    fn profile(&self, id: ProgramId) -> Vec<Profiled> {
        let Some(p) = self.programs.get(id.0) else { return Vec::new() };
        p.ids.iter().enumerate().flat_map(|(k, pid)| self.part(k).profile(*pid)).collect()
    }

    fn set_tracing(&mut self, id: ProgramId, on: bool) -> Result<(), BackendError> {
        let ids = self.program(id)?.ids.clone();
        for (k, pid) in ids.iter().enumerate() {
            self.part(k).set_tracing(*pid, on)?;
        }
        Ok(())
    }

    /// The parts' timelines of the last traced step, merged; each part's
    /// times count from its own start of the step (the parts start together,
    /// within a thread wake-up of each other).
    fn trace(&self, id: ProgramId) -> Result<Trace, BackendError> {
        let p = self.program(id)?;
        let mut merged: Option<Trace> = None;
        for (k, pid) in p.ids.iter().enumerate() {
            let t = self.part(k).trace(*pid)?;
            match &mut merged {
                None => merged = Some(t),
                Some(m) => {
                    m.dur_ns = m.dur_ns.max(t.dur_ns);
                    m.events.extend(t.events);
                }
            }
        }
        let mut m = merged.ok_or_else(|| BackendError::Access("a mixed program without parts".into()))?;
        m.events.sort_by_key(|e| (e.stream, e.index));
        Ok(m)
    }

    fn steps_run(&self, id: ProgramId) -> u64 {
        self.programs.get(id.0).map_or(0, |p| self.part(0).steps_run(p.ids[0]))
    }

    fn set_step(&mut self, id: ProgramId, step: u64) {
        if let Some(p) = self.programs.get(id.0) {
            for (k, pid) in p.ids.iter().enumerate() {
                self.part(k).set_step(*pid, step);
            }
        }
    }

    /// Each part's own note, then where the devices go.
    fn device_note(&self, gpus: &[String]) -> String {
        let parts: Vec<String> = self
            .kinds
            .iter()
            .enumerate()
            .map(|(k, kind)| {
                let p = self.part(k);
                let what = match kind {
                    DeviceKind::Cpu => "cpu:*",
                    DeviceKind::Gpu => "gpu:*",
                };
                match (kind, p.name()) {
                    (DeviceKind::Gpu, "cpu") => format!("{what} on a second {} backend (host threads)", p.name()),
                    (DeviceKind::Gpu, _) => format!("{what} on the {} backend: {}", p.name(), p.device_note(gpus)),
                    _ => format!("{what} on the {} backend", p.name()),
                }
            })
            .collect();
        format!("mixed session: {}", parts.join("; "))
    }

    fn program_note(&self, id: ProgramId) -> Option<String> {
        let p = self.programs.get(id.0)?;
        let notes: Vec<String> =
            p.ids.iter().enumerate().filter_map(|(k, pid)| self.part(k).program_note(*pid)).collect();
        let bridged = p.split.bridged.iter().filter(|b| **b).count();
        let mut s = format!("{bridged} event(s) cross parts");
        for n in notes {
            s.push_str("; ");
            s.push_str(&n);
        }
        Some(s)
    }

    /// The least any part can still allocate (every part's share must fit).
    fn memory_available(&self) -> Option<u64> {
        (0..self.parts.len()).map(|k| self.part(k).memory_available()).min().flatten()
    }
}
