//! The plan verifier, in the spirit of Cranelift's: [`verify`] checks every
//! invariant a backend relies on (see [`crate::plan`]), so that a malformed
//! plan (a compiler bug, or a plan read from JSON) is a [`PlanError`] naming
//! the step, never an out-of-bounds access or a deadlock in a backend.
//!
//! Rules, in the order they are checked:
//! 1. devices are distinct; every buffer's bytes are its shape's element
//!    count times its dtype's size, its offset is a multiple of that size,
//!    it lies inside its device's arena, and the arena has no unused tail
//!    beyond the last buffer's aligned end; a view lies inside the buffer it
//!    views (which exists and is not itself a view);
//! 2. variables are declared once and their sizes do not overflow;
//! 3. constants, feeds, fetches and tensors name existing buffers (feeds and
//!    constants arena buffers of their kind; constants have one value per
//!    element);
//! 4. streams are distinct and run on devices of the plan; each step's
//!    references exist; a launch touches only its stream's device (variables
//!    live in the store and are reachable from any device); its arity, the
//!    element counts and dtypes of its operands agree with its kernel's
//!    parameters (see `check_kernel`), and no output overlaps another
//!    operand; a copy has equal sizes and dtypes on both sides, which do not
//!    overlap; an all-reduce sums a non-empty group of distinct f32 buffers;
//! 5. events are in range, each recorded exactly once, and replaying the
//!    streams (advance any stream whose next step is not a wait on an event
//!    not yet recorded) runs every step: no wait is left stuck.
//!
//! Cost: linear in the plan's size (name lookups through one sorted map), so
//! a backend runs it on every plan it loads. All arithmetic on the plan's
//! numbers is checked: the verifier itself never panics.

use std::collections::BTreeMap;
use std::fmt;

use thiserror::Error;
use towers_graph::{DType, Device, Padding};

use crate::kernel::{ConvGeom, Kernel, PoolGeom};
use crate::plan::{BufRef, BufferKind, Plan, Step, StreamPlan};

/// The alignment of arena ends (and of buffer offsets from the allocator).
pub const ARENA_ALIGN: usize = 64;

/// Text in a [`PlanError`]: a boxed `str` keeps the error small (it travels in `Result`s).
pub type Text = Box<str>;

/// Why a plan is malformed. Every message names where (the buffer, or the
/// step as `stream step index 'node'`) and what is wrong.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PlanError {
    #[error("device {device} is listed twice (devices {first} and {second})")]
    DuplicateDevice { device: Text, first: usize, second: usize },

    #[error("{what} has an element count or byte size that overflows")]
    TooLarge { what: Text },

    #[error("buffer '{buffer}' on {device} is {ty}, which is {expected} B, but has {bytes} B")]
    BufferBytes { device: Text, buffer: Text, ty: Text, expected: usize, bytes: usize },

    #[error("buffer '{buffer}' on {device} starts at byte {offset}, not a multiple of its {dtype} element size")]
    Misaligned { device: Text, buffer: Text, offset: usize, dtype: Text },

    #[error("buffer '{buffer}' on {device} spans bytes {offset}..{end}, outside the device's {arena} B arena")]
    OutsideArena { device: Text, buffer: Text, offset: usize, end: usize, arena: usize },

    #[error("the arena of {device} has {arena} B but its buffers end at {end} B (at most {limit} B with {ARENA_ALIGN}-byte alignment)")]
    ArenaTail { device: Text, arena: usize, end: usize, limit: usize },

    #[error("view '{buffer}' on {device} views buffer {of}, which {reason}")]
    BadView { device: Text, buffer: Text, of: usize, reason: Text },

    #[error("view '{buffer}' on {device} spans bytes {offset}..{end}, outside the buffer it views, '{of}' (bytes {of_offset}..{of_end})")]
    ViewOutside { device: Text, buffer: Text, offset: usize, end: usize, of: Text, of_offset: usize, of_end: usize },

    #[error("variable '{name}' is declared twice")]
    DuplicateVariable { name: Text },

    #[error("{at}: device {device} does not exist (the plan has {count} devices)")]
    DeviceIndex { at: Text, device: usize, count: usize },

    #[error("{at}: buffer {buffer} of {device} does not exist ({device} has {count} buffers)")]
    BufferIndex { at: Text, device: Text, buffer: usize, count: usize },

    #[error("{at}: variable '{name}' is not declared")]
    UndeclaredVariable { at: Text, name: Text },

    #[error("{at}: '{name}' must be {expected}, but it is {got}")]
    RefKind { at: Text, name: Text, expected: Text, got: Text },

    #[error("{at}: {values} values for a buffer of {elements} elements")]
    ConstantLength { at: Text, values: usize, elements: usize },

    #[error("stream {stream} is listed twice (streams {first} and {second})")]
    DuplicateStream { stream: Text, first: usize, second: usize },

    #[error("stream {stream} runs on {device}, which is not a device of the plan")]
    StreamDevice { stream: Text, device: Text },

    #[error("{at}: '{buffer}' is on {device}, not on the stream's device")]
    WrongDevice { at: Text, buffer: Text, device: Text },

    #[error("{at}: {kernel} takes {expected} {what}, got {got}")]
    Arity { at: Text, kernel: Text, what: Text, expected: Text, got: usize },

    #[error("{at}: {kernel} parameters are invalid: {reason}")]
    BadParams { at: Text, kernel: Text, reason: Text },

    #[error("{at}: {kernel} {operand} '{name}' has {got} elements, but the parameters need {expected} ({why})")]
    OperandSize { at: Text, kernel: Text, operand: Text, name: Text, got: usize, expected: usize, why: Text },

    #[error("{at}: {kernel} {operand} '{name}' is {got}, but the kernel needs {expected}")]
    OperandDtype { at: Text, kernel: Text, operand: Text, name: Text, got: Text, expected: Text },

    #[error("{at}: {kernel} needs a workspace of {expected} f32 elements, got {got}")]
    Workspace { at: Text, kernel: Text, expected: usize, got: Text },

    #[error("{at}: the launch writes '{output}' and also {role} '{other}', which overlaps it")]
    Overlap { at: Text, output: Text, other: Text, role: Text },

    #[error("{at}: copy of {bytes} B from '{from}' ({from_bytes} B) to '{to}' ({to_bytes} B): the sizes differ")]
    CopySize { at: Text, bytes: usize, from: Text, from_bytes: usize, to: Text, to_bytes: usize },

    #[error("{at}: copy from '{from}' ({from_dtype}) to '{to}' ({to_dtype}): the dtypes differ")]
    CopyDtype { at: Text, from: Text, from_dtype: Text, to: Text, to_dtype: Text },

    #[error("{at}: copy from '{from}' to '{to}': source and destination overlap")]
    CopyOverlap { at: Text, from: Text, to: Text },

    #[error("{at}: all-reduce over an empty group")]
    AllReduceEmpty { at: Text },

    #[error("{at}: all-reduce of '{buffer}', which is {dtype}: all-reduce sums f32 buffers only")]
    AllReduceDtype { at: Text, buffer: Text, dtype: Text },

    #[error("{at}: all-reduce group names '{buffer}' and '{other}', which overlap")]
    AllReduceOverlap { at: Text, buffer: Text, other: Text },

    #[error("{at}: event e{event} does not exist (the plan has {count} events)")]
    EventIndex { at: Text, event: usize, count: usize },

    #[error("event e{event} is recorded twice: at {first} and at {second}")]
    EventRecordedTwice { event: usize, first: Text, second: Text },

    #[error("{at}: waits on e{event}, which no stream records")]
    WaitNeverRecorded { at: Text, event: usize },

    #[error("event e{event} is never recorded (each of the plan's {count} events is recorded exactly once)")]
    EventNeverRecorded { event: usize, count: usize },

    #[error("the streams deadlock: stuck at {stuck}")]
    Deadlock { stuck: Text },
}

/// Where something is, formatted only when an error is built.
#[derive(Clone, Copy)]
enum Site<'p> {
    /// Step `index` of stream `stream`.
    Step { stream: &'p StreamPlan, index: usize },
    /// A named entry of the plan: `feed 'images'`.
    Named { what: &'static str, name: &'p str },
}

impl fmt::Display for Site<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Site::Step { stream, index } => {
                write!(f, "{} step {index}", stream.name())?;
                match stream.steps.get(*index) {
                    Some(Step::Launch { node, .. } | Step::Copy { node, .. } | Step::AllReduce { node, .. }) => {
                        write!(f, " '{node}'")
                    }
                    Some(Step::Record(e)) => write!(f, " (record e{e})"),
                    Some(Step::Wait(e)) => write!(f, " (wait e{e})"),
                    None => Ok(()),
                }
            }
            Site::Named { what, name } => write!(f, "{what} '{name}'"),
        }
    }
}

/// Where an operand's memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loc {
    /// Bytes `start..end` of device `device`'s arena.
    Arena { device: usize, start: usize, end: usize },
    /// Variable `index` of `Plan::variables`.
    Var(usize),
}

impl Loc {
    fn overlaps(&self, o: &Loc) -> bool {
        match (self, o) {
            (Loc::Arena { device: a, start: s1, end: e1 }, Loc::Arena { device: b, start: s2, end: e2 }) => {
                a == b && s1 < e1 && s2 < e2 && s1 < e2 && s2 < e1
            }
            (Loc::Var(a), Loc::Var(b)) => a == b,
            _ => false,
        }
    }
}

/// A resolved reference.
#[derive(Debug, Clone, Copy)]
struct Operand<'p> {
    name: &'p str,
    dtype: DType,
    shape: &'p [usize],
    elems: usize,
    kind: Option<BufferKind>,
    loc: Loc,
}

impl Operand<'_> {
    fn ty(&self) -> String {
        format!("{}{}", self.dtype, dims(self.shape))
    }
}

fn dims(d: &[usize]) -> String {
    let v: Vec<String> = d.iter().map(|x| x.to_string()).collect();
    format!("[{}]", v.join(","))
}

/// The product of `d`, or None on overflow.
fn product(d: &[usize]) -> Option<usize> {
    d.iter().try_fold(1usize, |a, &x| a.checked_mul(x))
}

struct Verifier<'p> {
    plan: &'p Plan,
    /// Element count of each variable.
    var_elems: Vec<usize>,
    vars: BTreeMap<&'p str, usize>,
    /// Device -> index in `Plan::devices`.
    devices: BTreeMap<Device, usize>,
}

/// Check `plan` against every rule of the module docs.
pub fn verify(plan: &Plan) -> Result<(), PlanError> {
    let mut v = Verifier { plan, var_elems: Vec::new(), vars: BTreeMap::new(), devices: BTreeMap::new() };
    v.buffers()?;
    v.variables()?;
    v.entries()?;
    v.streams()?;
    events(plan)
}

impl<'p> Verifier<'p> {
    fn buffers(&mut self) -> Result<(), PlanError> {
        for (di, d) in self.plan.devices.iter().enumerate() {
            if let Some(first) = self.devices.insert(d.device, di) {
                return Err(PlanError::DuplicateDevice { device: d.device.to_string().into(), first, second: di });
            }
            let mut end_max = 0usize;
            for b in &d.buffers {
                let what = || format!("buffer '{}' on {}", b.name, d.device);
                let expected = product(&b.shape)
                    .and_then(|n| n.checked_mul(b.dtype.size_bytes()))
                    .ok_or_else(|| PlanError::TooLarge { what: what().into() })?;
                if b.bytes != expected {
                    return Err(PlanError::BufferBytes {
                        device: d.device.to_string().into(),
                        buffer: b.name.clone().into(),
                        ty: format!("{}{}", b.dtype, dims(&b.shape)).into(),
                        expected,
                        bytes: b.bytes,
                    });
                }
                if b.offset % b.dtype.size_bytes() != 0 {
                    return Err(PlanError::Misaligned {
                        device: d.device.to_string().into(),
                        buffer: b.name.clone().into(),
                        offset: b.offset,
                        dtype: b.dtype.to_string().into(),
                    });
                }
                let end = b.offset.checked_add(b.bytes).ok_or_else(|| PlanError::TooLarge { what: what().into() })?;
                if end > d.arena_bytes {
                    return Err(PlanError::OutsideArena {
                        device: d.device.to_string().into(),
                        buffer: b.name.clone().into(),
                        offset: b.offset,
                        end,
                        arena: d.arena_bytes,
                    });
                }
                end_max = end_max.max(end);
                if let BufferKind::View { of } = b.kind {
                    let bad = |reason: &str| PlanError::BadView {
                        device: d.device.to_string().into(),
                        buffer: b.name.clone().into(),
                        of,
                        reason: reason.into(),
                    };
                    let Some(o) = d.buffers.get(of) else { return Err(bad("does not exist")) };
                    if std::ptr::eq(o, b) {
                        return Err(bad("is the view itself"));
                    }
                    if matches!(o.kind, BufferKind::View { .. }) {
                        return Err(bad("is itself a view"));
                    }
                    // `o` passes the size checks in its own turn; its end may overflow here first.
                    let of_end = o.offset.saturating_add(o.bytes);
                    if b.offset < o.offset || end > of_end {
                        return Err(PlanError::ViewOutside {
                            device: d.device.to_string().into(),
                            buffer: b.name.clone().into(),
                            offset: b.offset,
                            end,
                            of: o.name.clone().into(),
                            of_offset: o.offset,
                            of_end,
                        });
                    }
                }
            }
            let limit = end_max.div_ceil(ARENA_ALIGN).saturating_mul(ARENA_ALIGN);
            if d.arena_bytes > limit {
                return Err(PlanError::ArenaTail {
                    device: d.device.to_string().into(),
                    arena: d.arena_bytes,
                    end: end_max,
                    limit,
                });
            }
        }
        Ok(())
    }

    fn variables(&mut self) -> Result<(), PlanError> {
        for (i, v) in self.plan.variables.iter().enumerate() {
            if self.vars.insert(v.name.as_str(), i).is_some() {
                return Err(PlanError::DuplicateVariable { name: v.name.clone().into() });
            }
            let n = product(&v.shape)
                .filter(|n| n.checked_mul(v.dtype.size_bytes()).is_some())
                .ok_or_else(|| PlanError::TooLarge { what: format!("variable '{}'", v.name).into() })?;
            self.var_elems.push(n);
        }
        Ok(())
    }

    fn resolve(&self, at: Site<'p>, r: &'p BufRef) -> Result<Operand<'p>, PlanError> {
        match r {
            BufRef::Arena { device, buffer } => {
                let d = self.plan.devices.get(*device).ok_or_else(|| PlanError::DeviceIndex {
                    at: at.to_string().into(),
                    device: *device,
                    count: self.plan.devices.len(),
                })?;
                let b = d.buffers.get(*buffer).ok_or_else(|| PlanError::BufferIndex {
                    at: at.to_string().into(),
                    device: d.device.to_string().into(),
                    buffer: *buffer,
                    count: d.buffers.len(),
                })?;
                Ok(Operand {
                    name: &b.name,
                    dtype: b.dtype,
                    shape: &b.shape,
                    elems: b.bytes / b.dtype.size_bytes(),
                    kind: Some(b.kind),
                    loc: Loc::Arena { device: *device, start: b.offset, end: b.offset + b.bytes },
                })
            }
            BufRef::Variable(n) => {
                let &i = self.vars.get(n.as_str()).ok_or_else(|| PlanError::UndeclaredVariable {
                    at: at.to_string().into(),
                    name: n.clone().into(),
                })?;
                let v = &self.plan.variables[i];
                Ok(Operand {
                    name: &v.name,
                    dtype: v.dtype,
                    shape: &v.shape,
                    elems: self.var_elems[i],
                    kind: None,
                    loc: Loc::Var(i),
                })
            }
        }
    }

    /// Constants, feeds, fetches and tensors.
    fn entries(&self) -> Result<(), PlanError> {
        let kind_name = |o: &Operand| o.kind.map_or("a variable".to_string(), |k| format!("a {} buffer", k.name()));
        for c in &self.plan.constants {
            let at = Site::Named { what: "constant", name: self.plan.ref_name_or(&c.buffer) };
            let o = self.resolve(at, &c.buffer)?;
            if o.kind != Some(BufferKind::Constant) {
                return Err(PlanError::RefKind {
                    at: at.to_string().into(),
                    name: o.name.into(),
                    expected: "a constant buffer".into(),
                    got: kind_name(&o).into(),
                });
            }
            if c.data.len() != o.elems {
                return Err(PlanError::ConstantLength {
                    at: at.to_string().into(),
                    values: c.data.len(),
                    elements: o.elems,
                });
            }
        }
        for (n, r) in &self.plan.feeds {
            let at = Site::Named { what: "feed", name: n };
            let o = self.resolve(at, r)?;
            if o.kind != Some(BufferKind::Feed) {
                return Err(PlanError::RefKind {
                    at: at.to_string().into(),
                    name: o.name.into(),
                    expected: "a feed buffer".into(),
                    got: kind_name(&o).into(),
                });
            }
        }
        for (n, r) in &self.plan.fetches {
            self.resolve(Site::Named { what: "fetch", name: n }, r)?;
        }
        for (n, r) in &self.plan.tensors {
            self.resolve(Site::Named { what: "tensor", name: n }, r)?;
        }
        Ok(())
    }

    fn streams(&self) -> Result<(), PlanError> {
        let mut seen: BTreeMap<(Device, &str), usize> = BTreeMap::new();
        for (si, s) in self.plan.streams.iter().enumerate() {
            if let Some(first) = seen.insert((s.device, s.kind.name()), si) {
                return Err(PlanError::DuplicateStream { stream: s.name().into(), first, second: si });
            }
            let &dev = self.devices.get(&s.device).ok_or_else(|| PlanError::StreamDevice {
                stream: s.name().into(),
                device: s.device.to_string().into(),
            })?;
            for (index, step) in s.steps.iter().enumerate() {
                self.step(Site::Step { stream: s, index }, dev, step)?;
            }
        }
        Ok(())
    }

    /// An arena operand of a launch or all-reduce must be on the stream's device.
    fn on_device(&self, at: Site, dev: usize, o: &Operand) -> Result<(), PlanError> {
        match o.loc {
            Loc::Arena { device, .. } if device != dev => Err(PlanError::WrongDevice {
                at: at.to_string().into(),
                buffer: o.name.into(),
                device: self.plan.devices[device].device.to_string().into(),
            }),
            _ => Ok(()),
        }
    }

    fn step(&self, at: Site<'p>, dev: usize, step: &'p Step) -> Result<(), PlanError> {
        match step {
            Step::Launch { kernel, inputs, outputs, workspace, .. } => {
                let res = |rs: &'p [BufRef]| rs.iter().map(|r| self.resolve(at, r)).collect::<Result<Vec<_>, _>>();
                let (ins, outs) = (res(inputs)?, res(outputs)?);
                let ws = workspace.as_ref().map(|r| self.resolve(at, r)).transpose()?;
                for o in ins.iter().chain(&outs).chain(&ws) {
                    self.on_device(at, dev, o)?;
                }
                Check { at, kernel: kernel.name(), ins: &ins, outs: &outs }.kernel(kernel, ws.as_ref())?;
                for (k, o) in outs.iter().enumerate() {
                    let others = ins
                        .iter()
                        .map(|x| (x, "reads"))
                        .chain(ws.iter().map(|x| (x, "uses as workspace")))
                        .chain(outs[..k].iter().map(|x| (x, "writes")));
                    for (x, role) in others {
                        if o.loc.overlaps(&x.loc) {
                            return Err(PlanError::Overlap {
                                at: at.to_string().into(),
                                output: o.name.into(),
                                other: x.name.into(),
                                role: role.into(),
                            });
                        }
                    }
                }
                Ok(())
            }
            Step::Copy { from, to, bytes, .. } => {
                let (f, t) = (self.resolve(at, from)?, self.resolve(at, to)?);
                let size = |o: &Operand| o.elems * o.dtype.size_bytes();
                if size(&f) != *bytes || size(&t) != *bytes {
                    return Err(PlanError::CopySize {
                        at: at.to_string().into(),
                        bytes: *bytes,
                        from: f.name.into(),
                        from_bytes: size(&f),
                        to: t.name.into(),
                        to_bytes: size(&t),
                    });
                }
                if f.dtype != t.dtype {
                    return Err(PlanError::CopyDtype {
                        at: at.to_string().into(),
                        from: f.name.into(),
                        from_dtype: f.dtype.to_string().into(),
                        to: t.name.into(),
                        to_dtype: t.dtype.to_string().into(),
                    });
                }
                if f.loc.overlaps(&t.loc) {
                    return Err(PlanError::CopyOverlap {
                        at: at.to_string().into(),
                        from: f.name.into(),
                        to: t.name.into(),
                    });
                }
                Ok(())
            }
            Step::AllReduce { buffers, .. } => {
                if buffers.is_empty() {
                    return Err(PlanError::AllReduceEmpty { at: at.to_string().into() });
                }
                let group = buffers.iter().map(|r| self.resolve(at, r)).collect::<Result<Vec<_>, _>>()?;
                for (k, o) in group.iter().enumerate() {
                    self.on_device(at, dev, o)?;
                    if o.dtype != DType::F32 {
                        return Err(PlanError::AllReduceDtype {
                            at: at.to_string().into(),
                            buffer: o.name.into(),
                            dtype: o.dtype.to_string().into(),
                        });
                    }
                    if let Some(x) = group[..k].iter().find(|x| x.loc.overlaps(&o.loc)) {
                        return Err(PlanError::AllReduceOverlap {
                            at: at.to_string().into(),
                            buffer: x.name.into(),
                            other: o.name.into(),
                        });
                    }
                }
                Ok(())
            }
            Step::Record(e) | Step::Wait(e) if *e >= self.plan.num_events => {
                Err(PlanError::EventIndex { at: at.to_string().into(), event: *e, count: self.plan.num_events })
            }
            Step::Record(_) | Step::Wait(_) => Ok(()),
        }
    }
}

impl Plan {
    /// The name of what a reference names, or `?` when it names nothing.
    fn ref_name_or<'a>(&'a self, r: &'a BufRef) -> &'a str {
        match r {
            BufRef::Arena { .. } => self.buffer(r).map_or("?", |b| b.name.as_str()),
            BufRef::Variable(n) => n,
        }
    }
}

/// Events: each in range (checked with the steps) recorded exactly once, and
/// a replay of the streams that runs every step.
fn events(plan: &Plan) -> Result<(), PlanError> {
    let n = plan.num_events;
    let mut recorded_at: BTreeMap<usize, Site> = BTreeMap::new();
    for s in &plan.streams {
        for (index, step) in s.steps.iter().enumerate() {
            if let Step::Record(e) = step {
                let at = Site::Step { stream: s, index };
                if let Some(first) = recorded_at.insert(*e, at) {
                    return Err(PlanError::EventRecordedTwice {
                        event: *e,
                        first: first.to_string().into(),
                        second: at.to_string().into(),
                    });
                }
            }
        }
    }
    for s in &plan.streams {
        for (index, step) in s.steps.iter().enumerate() {
            if let Step::Wait(e) = step {
                if !recorded_at.contains_key(e) {
                    return Err(PlanError::WaitNeverRecorded {
                        at: Site::Step { stream: s, index }.to_string().into(),
                        event: *e,
                    });
                }
            }
        }
    }
    // Events are in range and recorded once, so there are at most as many
    // events as records, and an unrecorded one is found among the first
    // `records + 1`: nothing is allocated or scanned per event before this.
    if recorded_at.len() < n {
        let event = (0..=recorded_at.len()).find(|e| !recorded_at.contains_key(e)).unwrap_or(0);
        return Err(PlanError::EventNeverRecorded { event, count: n });
    }
    // Replay: a worklist of runnable streams; a stream blocked on an event
    // parks on it until the event's record runs. Each step runs once.
    let mut recorded = vec![false; n];
    let mut parked: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut pos = vec![0usize; plan.streams.len()];
    let mut ready: Vec<usize> = (0..plan.streams.len()).rev().collect();
    while let Some(si) = ready.pop() {
        let steps = &plan.streams[si].steps;
        while let Some(step) = steps.get(pos[si]) {
            match step {
                Step::Wait(e) if !recorded[*e] => {
                    parked[*e].push(si);
                    break;
                }
                Step::Record(e) => {
                    recorded[*e] = true;
                    ready.append(&mut parked[*e]);
                }
                _ => {}
            }
            pos[si] += 1;
        }
    }
    let stuck: Vec<String> = plan
        .streams
        .iter()
        .enumerate()
        .filter(|(si, s)| pos[*si] < s.steps.len())
        .map(|(si, s)| Site::Step { stream: s, index: pos[si] }.to_string())
        .collect();
    if stuck.is_empty() {
        Ok(())
    } else {
        Err(PlanError::Deadlock { stuck: stuck.join(", ").into() })
    }
}

/// Which operand of a launch.
#[derive(Clone, Copy)]
enum Io {
    In(usize),
    Out(usize),
}

/// The checks of one launch against its kernel's parameters.
struct Check<'a, 'p> {
    at: Site<'p>,
    kernel: &'static str,
    ins: &'a [Operand<'p>],
    outs: &'a [Operand<'p>],
}

impl Check<'_, '_> {
    fn operand(&self, io: Io) -> (String, &Operand<'_>) {
        match io {
            Io::In(i) => (format!("input {i}"), &self.ins[i]),
            Io::Out(i) => (format!("output {i}"), &self.outs[i]),
        }
    }

    fn arity(&self, what: &str, expected: &str, ok: bool, got: usize) -> Result<(), PlanError> {
        if ok {
            return Ok(());
        }
        Err(PlanError::Arity {
            at: self.at.to_string().into(),
            kernel: self.kernel.into(),
            what: what.into(),
            expected: expected.into(),
            got,
        })
    }

    /// Exactly `n_in` inputs and `n_out` outputs.
    fn args(&self, n_in: usize, n_out: usize) -> Result<(), PlanError> {
        self.arity("inputs", &n_in.to_string(), self.ins.len() == n_in, self.ins.len())?;
        self.arity("outputs", &n_out.to_string(), self.outs.len() == n_out, self.outs.len())
    }

    fn param(&self, ok: bool, reason: impl FnOnce() -> String) -> Result<(), PlanError> {
        if ok {
            return Ok(());
        }
        Err(PlanError::BadParams {
            at: self.at.to_string().into(),
            kernel: self.kernel.into(),
            reason: reason().into(),
        })
    }

    /// A count computed from the parameters, or an error when it overflows.
    fn count(&self, v: Option<usize>, what: &str) -> Result<usize, PlanError> {
        v.ok_or_else(|| PlanError::BadParams {
            at: self.at.to_string().into(),
            kernel: self.kernel.into(),
            reason: format!("{what} overflows").into(),
        })
    }

    fn prod(&self, d: &[usize], what: &str) -> Result<usize, PlanError> {
        self.count(product(d), what)
    }

    fn size(&self, io: Io, expected: usize, why: impl FnOnce() -> String) -> Result<(), PlanError> {
        let (operand, o) = self.operand(io);
        if o.elems == expected {
            return Ok(());
        }
        Err(PlanError::OperandSize {
            at: self.at.to_string().into(),
            kernel: self.kernel.into(),
            operand: operand.into(),
            name: o.name.into(),
            got: o.elems,
            expected,
            why: why().into(),
        })
    }

    fn dtype(&self, io: Io, dtype: DType) -> Result<(), PlanError> {
        let (operand, o) = self.operand(io);
        if o.dtype == dtype {
            return Ok(());
        }
        Err(PlanError::OperandDtype {
            at: self.at.to_string().into(),
            kernel: self.kernel.into(),
            operand: operand.into(),
            name: o.name.into(),
            got: o.ty().into(),
            expected: dtype.to_string().into(),
        })
    }

    /// Every operand is f32.
    fn all_f32(&self) -> Result<(), PlanError> {
        (0..self.ins.len()).try_for_each(|i| self.dtype(Io::In(i), DType::F32))?;
        (0..self.outs.len()).try_for_each(|i| self.dtype(Io::Out(i), DType::F32))
    }

    /// Every operand has input 0's dtype (layout kernels move any 4-byte element).
    fn same_dtype(&self) -> Result<(), PlanError> {
        let Some(d) = self.ins.first().or(self.outs.first()).map(|o| o.dtype) else { return Ok(()) };
        (0..self.ins.len()).try_for_each(|i| self.dtype(Io::In(i), d))?;
        (0..self.outs.len()).try_for_each(|i| self.dtype(Io::Out(i), d))
    }

    /// Operands `ios` all have `n` elements.
    fn sizes(&self, ios: &[Io], n: usize, why: &str) -> Result<(), PlanError> {
        ios.iter().try_for_each(|&io| self.size(io, n, || why.to_string()))
    }

    /// A positive class/channel count that divides input 0's element count: the rows.
    fn rows(&self, per_row: usize, what: &str) -> Result<usize, PlanError> {
        self.param(per_row >= 1, || format!("{what} is 0"))?;
        let n = self.ins[0].elems;
        self.param(n.is_multiple_of(per_row), || {
            format!("input 0 '{}' has {n} elements, not a multiple of {what} {per_row}", self.ins[0].name)
        })?;
        Ok(n / per_row)
    }

    fn kernel(&self, k: &Kernel, ws: Option<&Operand>) -> Result<(), PlanError> {
        use Io::{In, Out};
        let conv_ws = matches!(
            k,
            Kernel::Conv2D { .. } | Kernel::Conv2DBackpropInput { .. } | Kernel::Conv2DBackpropFilter { .. }
        );
        if !conv_ws {
            if let Some(w) = ws {
                return Err(PlanError::Workspace {
                    at: self.at.to_string().into(),
                    kernel: self.kernel.into(),
                    expected: 0,
                    got: format!("'{}' with {} elements", w.name, w.elems).into(),
                });
            }
        }
        match k {
            Kernel::MatMul { m, n, k, .. } => {
                self.args(2, 1)?;
                self.all_f32()?;
                self.size(In(0), self.count(m.checked_mul(*k), "m*k")?, || format!("m*k = {m}*{k}"))?;
                self.size(In(1), self.count(k.checked_mul(*n), "k*n")?, || format!("k*n = {k}*{n}"))?;
                self.size(Out(0), self.count(m.checked_mul(*n), "m*n")?, || format!("m*n = {m}*{n}"))
            }
            Kernel::Binary { a_shape, b_shape, out_shape, .. } => {
                self.args(2, 1)?;
                self.all_f32()?;
                let out = broadcast(a_shape, b_shape);
                self.param(out.as_deref() == Some(out_shape.as_slice()), || {
                    format!("{} and {} do not broadcast to {}", dims(a_shape), dims(b_shape), dims(out_shape))
                })?;
                self.size(In(0), self.prod(a_shape, "a_shape")?, || format!("a_shape {}", dims(a_shape)))?;
                self.size(In(1), self.prod(b_shape, "b_shape")?, || format!("b_shape {}", dims(b_shape)))?;
                self.size(Out(0), self.prod(out_shape, "out_shape")?, || format!("out_shape {}", dims(out_shape)))
            }
            Kernel::AddN { n } => {
                self.param(*n >= 1, || "n is 0".into())?;
                self.args(*n, 1)?;
                self.all_f32()?;
                let len = self.outs[0].elems;
                self.sizes(&(0..*n).map(In).collect::<Vec<_>>(), len, "the output's length")
            }
            Kernel::WeightedSum { weights } => {
                self.param(!weights.is_empty(), || "no weights".into())?;
                self.args(weights.len(), 1)?;
                self.all_f32()?;
                let len = self.outs[0].elems;
                self.sizes(&(0..weights.len()).map(In).collect::<Vec<_>>(), len, "the output's length")
            }
            Kernel::BiasAdd { channels } => {
                self.args(2, 1)?;
                self.all_f32()?;
                self.rows(*channels, "channels")?;
                self.size(In(1), *channels, || "channels".into())?;
                self.size(Out(0), self.ins[0].elems, || "input 0's length".into())
            }
            Kernel::BiasAddGrad { channels } => {
                self.args(1, 1)?;
                self.all_f32()?;
                self.rows(*channels, "channels")?;
                self.size(Out(0), *channels, || "channels".into())
            }
            Kernel::Unary { .. } => {
                self.args(1, 1)?;
                self.all_f32()?;
                self.size(Out(0), self.ins[0].elems, || "input 0's length".into())
            }
            Kernel::UnaryGrad { .. } => {
                self.args(2, 1)?;
                self.all_f32()?;
                self.sizes(&[In(1), Out(0)], self.ins[0].elems, "input 0's length")
            }
            Kernel::Conv2D { geom, workspace_len } => {
                self.args(2, 1)?;
                self.all_f32()?;
                let c = self.conv(geom, *workspace_len, ws)?;
                self.size(In(0), c.x, || "n*h*w*c_in".into())?;
                self.size(In(1), c.filter, || "kh*kw*c_in*c_out".into())?;
                self.size(Out(0), c.y, || "n*out_h*out_w*c_out".into())
            }
            Kernel::Conv2DBackpropInput { geom, workspace_len } => {
                self.args(2, 1)?;
                self.all_f32()?;
                let c = self.conv(geom, *workspace_len, ws)?;
                self.size(In(0), c.y, || "n*out_h*out_w*c_out".into())?;
                self.size(In(1), c.filter, || "kh*kw*c_in*c_out".into())?;
                self.size(Out(0), c.x, || "n*h*w*c_in".into())
            }
            Kernel::Conv2DBackpropFilter { geom, workspace_len } => {
                self.args(2, 1)?;
                self.all_f32()?;
                let c = self.conv(geom, *workspace_len, ws)?;
                self.size(In(0), c.x, || "n*h*w*c_in".into())?;
                self.size(In(1), c.y, || "n*out_h*out_w*c_out".into())?;
                self.size(Out(0), c.filter, || "kh*kw*c_in*c_out".into())
            }
            Kernel::MaxPool { geom } | Kernel::AvgPool { geom } => {
                self.args(1, 1)?;
                self.all_f32()?;
                let (x, y) = self.pool(geom)?;
                self.size(In(0), x, || "n*h*w*c".into())?;
                self.size(Out(0), y, || "n*out_h*out_w*c".into())
            }
            Kernel::MaxPoolGrad { geom } => {
                self.args(3, 1)?;
                self.all_f32()?;
                let (x, y) = self.pool(geom)?;
                self.sizes(&[In(0), Out(0)], x, "n*h*w*c")?;
                self.sizes(&[In(1), In(2)], y, "n*out_h*out_w*c")
            }
            Kernel::AvgPoolGrad { geom } => {
                self.args(1, 1)?;
                self.all_f32()?;
                let (x, y) = self.pool(geom)?;
                self.size(In(0), y, || "n*out_h*out_w*c".into())?;
                self.size(Out(0), x, || "n*h*w*c".into())
            }
            Kernel::Concat { axis, shapes } => {
                self.param(!shapes.is_empty(), || "no shapes".into())?;
                self.args(shapes.len(), 1)?;
                self.same_dtype()?;
                let rank = shapes[0].len();
                self.param(*axis < rank, || format!("axis {axis} is out of range for rank {rank}"))?;
                let mut total = 0usize;
                for (i, s) in shapes.iter().enumerate() {
                    let same =
                        s.len() == rank && s.iter().zip(&shapes[0]).enumerate().all(|(d, (a, b))| d == *axis || a == b);
                    self.param(same, || {
                        format!("shape {} does not match {} outside axis {axis}", dims(s), dims(&shapes[0]))
                    })?;
                    total = self.count(total.checked_add(s[*axis]), "the concatenated axis")?;
                    self.size(In(i), self.prod(s, "a shape")?, || format!("shape {}", dims(s)))?;
                }
                let mut out = shapes[0].clone();
                out[*axis] = total;
                self.size(Out(0), self.prod(&out, "the output shape")?, || format!("shape {}", dims(&out)))
            }
            Kernel::Split { axis, shape, sizes } => {
                self.param(!sizes.is_empty(), || "no sizes".into())?;
                self.args(1, sizes.len())?;
                self.same_dtype()?;
                self.param(*axis < shape.len(), || format!("axis {axis} is out of range for {}", dims(shape)))?;
                let sum = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
                self.param(sum == Some(shape[*axis]), || {
                    format!("sizes {} do not add up to dimension {axis} of {}", dims(sizes), dims(shape))
                })?;
                self.size(In(0), self.prod(shape, "shape")?, || format!("shape {}", dims(shape)))?;
                for (i, &s) in sizes.iter().enumerate() {
                    let mut part = shape.clone();
                    part[*axis] = s;
                    self.size(Out(i), self.prod(&part, "a part")?, || format!("shape {}", dims(&part)))?;
                }
                Ok(())
            }
            Kernel::Slice { shape, begin, size } | Kernel::SliceGrad { shape, begin, size } => {
                self.args(1, 1)?;
                self.same_dtype()?;
                let inside = begin.len() == shape.len()
                    && size.len() == shape.len()
                    && (0..shape.len()).all(|d| begin[d].checked_add(size[d]).is_some_and(|e| e <= shape[d]));
                self.param(inside, || {
                    format!("window begin={} size={} is not inside {}", dims(begin), dims(size), dims(shape))
                })?;
                let (whole, window) = (self.prod(shape, "shape")?, self.prod(size, "size")?);
                let (x, y) = if matches!(k, Kernel::Slice { .. }) { (whole, window) } else { (window, whole) };
                self.size(In(0), x, || "the parameters' shapes".into())?;
                self.size(Out(0), y, || "the parameters' shapes".into())
            }
            Kernel::BroadcastTo { x_shape, out_shape } | Kernel::SumTo { x_shape, out_shape } => {
                self.args(1, 1)?;
                self.all_f32()?;
                let (big, small) =
                    if matches!(k, Kernel::BroadcastTo { .. }) { (out_shape, x_shape) } else { (x_shape, out_shape) };
                self.param(broadcast(big, small).as_ref() == Some(big), || {
                    format!("{} does not broadcast to {}", dims(small), dims(big))
                })?;
                self.size(In(0), self.prod(x_shape, "x_shape")?, || format!("x_shape {}", dims(x_shape)))?;
                self.size(Out(0), self.prod(out_shape, "out_shape")?, || format!("out_shape {}", dims(out_shape)))
            }
            Kernel::Softmax { classes } | Kernel::LogSoftmax { classes } => {
                self.args(1, 1)?;
                self.all_f32()?;
                self.rows(*classes, "classes")?;
                self.size(Out(0), self.ins[0].elems, || "input 0's length".into())
            }
            Kernel::SoftmaxGrad { classes } | Kernel::LogSoftmaxGrad { classes } => {
                self.args(2, 1)?;
                self.all_f32()?;
                self.rows(*classes, "classes")?;
                self.sizes(&[In(1), Out(0)], self.ins[0].elems, "input 0's length")
            }
            Kernel::SparseSoftmaxXent { classes } | Kernel::SoftmaxXent { classes } => {
                self.args(2, 2)?;
                let sparse = matches!(k, Kernel::SparseSoftmaxXent { .. });
                for io in [In(0), Out(0), Out(1)] {
                    self.dtype(io, DType::F32)?;
                }
                self.dtype(In(1), if sparse { DType::I32 } else { DType::F32 })?;
                let rows = self.rows(*classes, "classes")?;
                self.size(In(1), if sparse { rows } else { self.ins[0].elems }, || "one label per row".into())?;
                self.size(Out(0), rows, || "one loss per row".into())?;
                self.size(Out(1), self.ins[0].elems, || "the logits' length".into())
            }
            Kernel::L2Loss => {
                self.args(1, 1)?;
                self.all_f32()?;
                self.size(Out(0), 1, || "a scalar".into())
            }
            Kernel::ReduceSum { shape, axes } | Kernel::ReduceMean { shape, axes } => {
                self.args(1, 1)?;
                self.all_f32()?;
                let mut kept = shape.clone();
                for (i, &a) in axes.iter().enumerate() {
                    self.param(a < shape.len() && !axes[..i].contains(&a), || {
                        format!("axes {} are not distinct axes of {}", dims(axes), dims(shape))
                    })?;
                    kept[a] = 1;
                }
                self.size(In(0), self.prod(shape, "shape")?, || format!("shape {}", dims(shape)))?;
                self.size(Out(0), self.prod(&kept, "the kept shape")?, || format!("shape {} reduced", dims(shape)))
            }
            Kernel::ArgMax { shape, axis } => {
                self.args(1, 1)?;
                self.dtype(In(0), DType::F32)?;
                self.dtype(Out(0), DType::I32)?;
                self.param(*axis < shape.len() && shape[*axis] >= 1 && shape[*axis] <= i32::MAX as usize, || {
                    format!("axis {axis} is not a non-empty axis of {}", dims(shape))
                })?;
                let mut kept = shape.clone();
                kept[*axis] = 1;
                self.size(In(0), self.prod(shape, "shape")?, || format!("shape {}", dims(shape)))?;
                self.size(Out(0), self.prod(&kept, "the kept shape")?, || format!("shape {} reduced", dims(shape)))
            }
            Kernel::Equal { dtype } => {
                self.args(2, 1)?;
                self.dtype(In(0), *dtype)?;
                self.dtype(In(1), *dtype)?;
                self.dtype(Out(0), DType::Bool)?;
                self.sizes(&[In(1), Out(0)], self.ins[0].elems, "input 0's length")
            }
            Kernel::Cast { from, to } => {
                self.args(1, 1)?;
                self.dtype(In(0), *from)?;
                self.dtype(Out(0), *to)?;
                self.size(Out(0), self.ins[0].elems, || "input 0's length".into())
            }
            Kernel::Dropout { elem_offset, .. } => {
                self.args(1, 2)?;
                self.all_f32()?;
                let n = self.ins[0].elems;
                self.param(elem_offset.checked_add(n).is_some_and(|e| e <= u64::MAX as usize), || {
                    format!("elem_offset {elem_offset} + {n} elements overflows")
                })?;
                self.sizes(&[Out(0), Out(1)], n, "input 0's length")
            }
            Kernel::Fill { .. } => {
                self.args(0, 1)?;
                self.all_f32()
            }
            Kernel::BatchNormTrain { channels, .. } | Kernel::BatchNormInfer { channels, .. } => {
                let infer = matches!(k, Kernel::BatchNormInfer { .. });
                self.args(if infer { 5 } else { 3 }, 4)?;
                self.all_f32()?;
                self.rows(*channels, "channels")?;
                let per_channel: Vec<Io> = (1..self.ins.len()).map(In).chain((1..4).map(Out)).collect();
                self.sizes(&per_channel, *channels, "channels")?;
                self.size(Out(0), self.ins[0].elems, || "input 0's length".into())
            }
            Kernel::BatchNormGrad { channels } => {
                self.args(5, 3)?;
                self.all_f32()?;
                self.rows(*channels, "channels")?;
                self.sizes(&[In(1), Out(0)], self.ins[0].elems, "input 0's length")?;
                self.sizes(&[In(2), In(3), In(4), Out(1), Out(2)], *channels, "channels")
            }
            Kernel::AssignMovingAverage { .. } => {
                self.args(1, 1)?;
                self.all_f32()?;
                self.size(In(0), self.outs[0].elems, || "the variable's length".into())
            }
            Kernel::ApplyGradientDescent { .. } | Kernel::ApplyMomentum { .. } | Kernel::ApplyAdam { .. } => {
                self.apply(k, 1)
            }
            Kernel::MeanApply { weights, apply } => {
                self.param(!weights.is_empty(), || "no weights".into())?;
                self.param(
                    matches!(
                        **apply,
                        Kernel::ApplyGradientDescent { .. } | Kernel::ApplyMomentum { .. } | Kernel::ApplyAdam { .. }
                    ),
                    || format!("{} is not an optimizer update", apply.name()),
                )?;
                self.apply(apply, weights.len())
            }
            Kernel::IncrementStep => {
                self.args(0, 1)?;
                self.dtype(Out(0), DType::I32)?;
                self.size(Out(0), 1, || "a scalar step".into())
            }
        }
    }

    /// An optimizer update with `grads` gradients (one per tower when fused):
    /// in: the gradients, then Adam's i32 global_step; out: the variable and its slots.
    fn apply(&self, k: &Kernel, grads: usize) -> Result<(), PlanError> {
        let (slots, step) = match k {
            Kernel::ApplyGradientDescent { .. } => (1, 0),
            Kernel::ApplyMomentum { .. } => (2, 0),
            _ => (3, 1),
        };
        self.args(grads + step, slots)?;
        let len = self.outs[0].elems;
        for i in 0..grads {
            self.dtype(Io::In(i), DType::F32)?;
            self.size(Io::In(i), len, || "the variable's length".into())?;
        }
        for i in 0..slots {
            self.dtype(Io::Out(i), DType::F32)?;
            self.size(Io::Out(i), len, || "the variable's length".into())?;
        }
        if step == 1 {
            self.dtype(Io::In(grads), DType::I32)?;
            self.size(Io::In(grads), 1, || "a scalar global_step".into())?;
        }
        Ok(())
    }

    /// Lengths of a convolution's x, filter and y, with its workspace checked.
    fn conv(&self, g: &ConvGeom, workspace_len: usize, ws: Option<&Operand>) -> Result<ConvLens, PlanError> {
        let oh = self.window(g.h, g.kh, g.stride_h, g.padding)?;
        let ow = self.window(g.w, g.kw, g.stride_w, g.padding)?;
        let x = self.prod(&[g.n, g.h, g.w, g.c_in], "n*h*w*c_in")?;
        let filter = self.prod(&[g.kh, g.kw, g.c_in, g.c_out], "kh*kw*c_in*c_out")?;
        let y = self.prod(&[g.n, oh, ow, g.c_out], "n*out_h*out_w*c_out")?;
        self.prod(&[g.n, oh, ow, g.kh, g.kw, g.c_in.max(1)], "the column matrix")?;
        // Every product above is in range, so the kernel's own arithmetic is too.
        let expected = towers_kernels::conv::Conv2d {
            n: g.n,
            h: g.h,
            w: g.w,
            c_in: g.c_in,
            kh: g.kh,
            kw: g.kw,
            c_out: g.c_out,
            stride_h: g.stride_h,
            stride_w: g.stride_w,
            padding: crate::select::kernel_padding(g.padding),
            threads: 1,
        }
        .workspace_len();
        let got = ws.map_or(0, |w| w.elems);
        let f32_ws = ws.is_none_or(|w| w.dtype == DType::F32);
        if workspace_len != expected || got != expected || !f32_ws || (expected == 0 && ws.is_some()) {
            return Err(PlanError::Workspace {
                at: self.at.to_string().into(),
                kernel: self.kernel.into(),
                expected,
                got: match ws {
                    Some(w) => {
                        format!("'{}' ({}, {} elements; workspace_len={workspace_len})", w.name, w.ty(), w.elems).into()
                    }
                    None => format!("none (workspace_len={workspace_len})").into(),
                },
            });
        }
        Ok(ConvLens { x, filter, y })
    }

    /// Lengths of a pool's x and y.
    fn pool(&self, g: &PoolGeom) -> Result<(usize, usize), PlanError> {
        let oh = self.window(g.h, g.kh, g.stride_h, g.padding)?;
        let ow = self.window(g.w, g.kw, g.stride_w, g.padding)?;
        Ok((self.prod(&[g.n, g.h, g.w, g.c], "n*h*w*c")?, self.prod(&[g.n, oh, ow, g.c], "n*out_h*out_w*c")?))
    }

    /// Output size along one axis (TF's rules, as `towers_kernels::window`), checked.
    fn window(&self, input: usize, k: usize, stride: usize, padding: Padding) -> Result<usize, PlanError> {
        self.param(k >= 1 && stride >= 1, || format!("window {k} with stride {stride}: both must be at least 1"))?;
        let out = match padding {
            Padding::Same => input.div_ceil(stride),
            Padding::Valid if input < k => 0,
            Padding::Valid => (input - k + 1).div_ceil(stride),
        };
        // The kernels' padding arithmetic: (out - 1) * stride + k.
        self.count(out.saturating_sub(1).checked_mul(stride).and_then(|v| v.checked_add(k)), "the window's extent")?;
        Ok(out)
    }
}

struct ConvLens {
    x: usize,
    filter: usize,
    y: usize,
}

/// NumPy broadcasting of two shapes, or None when they do not broadcast.
fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
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
