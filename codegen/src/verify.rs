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
//!    parameters as the kernel's operand signature declares them
//!    (`Kernel::signature`, checked by the `kernel` submodule), and no output overlaps another
//!    operand, except output 0 being exactly input 0 of a kernel that works
//!    in place (`Kernel::in_place_ok`); a copy has equal sizes and dtypes on both sides, which do not
//!    overlap; an all-reduce sums a non-empty group of distinct f32 buffers;
//! 5. events are in range, each recorded exactly once, and replaying the
//!    streams (advance any stream whose next step is not a wait on an event
//!    not yet recorded) runs every step: no wait is left stuck;
//! 6. buffers of their own that share bytes are never live at once: neither
//!    is a feed, a constant or fetched, and every access of one happens
//!    before every access of the other (the `sharing` submodule).
//!
//! Cost: linear in the plan's size (name lookups through one sorted map),
//! plus for rule 6 a sort of the buffers and O(steps x streams) live ranges
//! when any buffers share bytes, so a backend runs it on every plan it loads. All arithmetic on the plan's
//! numbers is checked: the verifier itself never panics.

use std::collections::BTreeMap;
use std::fmt;

use thiserror::Error;
use towers_vocab::{DType, Device};

use crate::plan::{BufRef, BufferKind, Plan, Step, StreamPlan};

mod events;
mod kernel;
mod sharing;

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

    #[error("{at}: {kernel} takes {expected} {what} ({names}), got {got}")]
    Arity { at: Text, kernel: Text, what: Text, expected: Text, names: Text, got: usize },

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

    #[error("buffer '{buffer}' on {device} is {why} and keeps its bytes for the whole step, but shares bytes {start}..{end} with '{other}'")]
    PinnedShared { device: Text, buffer: Text, why: Text, other: Text, start: usize, end: usize },

    #[error("buffers '{a}' and '{b}' on {device} share bytes {start}..{end} but may be live at once: {ab}, and {ba}")]
    LiveShared { device: Text, a: Text, b: Text, start: usize, end: usize, ab: Text, ba: Text },
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
                    Some(
                        Step::Launch { node, .. }
                        | Step::Copy { node, .. }
                        | Step::AllReduce { node, .. }
                        | Step::Reduce { node, .. }
                        | Step::Broadcast { node, .. },
                    ) => {
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
    events::events(plan)?;
    sharing::sharing(plan)
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
                kernel::check(at, kernel, &ins, &outs, ws.as_ref())?;
                for (k, o) in outs.iter().enumerate() {
                    // An in-place kernel's output 0 may be its input 0 exactly.
                    let in_place = |j: usize, x: &Operand| k == 0 && j == 0 && kernel.in_place_ok() && x.loc == o.loc;
                    let others = ins
                        .iter()
                        .enumerate()
                        .filter(|&(j, x)| !in_place(j, x))
                        .map(|(_, x)| (x, "reads"))
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
            // A reduce to one root obeys the all-reduce's rules (its root
            // is checked against the communicator when a backend loads it:
            // the world size is not part of the plan).
            Step::AllReduce { buffers, .. } | Step::Reduce { buffers, .. } | Step::Broadcast { buffers, .. } => {
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
