//! The plan: plain data (serde), deterministic, readable as text.
//!
//! Invariants a backend may rely on:
//! - every [`BufRef::Arena`] names an existing buffer of an existing device;
//!   a [`BufferKind::View`] lies inside the buffer it views; two other
//!   buffers of one device share bytes only when every access of one (its
//!   views' included, and for a copy's source its destinations') happens
//!   before every access of the other in the order of streams and events,
//!   and neither is a feed, a constant or fetched (those keep their bytes
//!   for the whole step; see [`crate::arena`] and [`crate::liveness`]);
//! - a buffer's `bytes` are its shape's element count times its dtype's size,
//!   and it lies inside its device's arena;
//! - each launch's operands agree with its kernel's parameters (counts and
//!   dtypes), and a launch never writes a buffer it also reads;
//!
//! [`crate::verify::verify`] checks all of this (and the events) on any plan,
//! e.g. one read from JSON, so a backend may rely on it without checking.
//! - variables live outside the arenas, in the backend's store, by name;
//! - within a stream, steps run in order; across streams the only ordering
//!   is `Record(e)` → `Wait(e)`: a buffer written on one stream is read on
//!   another only after a wait on an event recorded after the write.

use serde::{Deserialize, Serialize};
use towers_vocab::StreamKind;
use towers_vocab::{DType, Device, Initializer};

use towers_kernels::Kernel;

/// Lowering mode: training (batch statistics, dropout masks) or evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    Train,
    Eval,
}

/// Options of [`crate::lower`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LowerOptions {
    pub mode: Mode,
    /// The program's name ("train", "eval").
    pub program: String,
    /// Fuse each tower reduction into the optimizer update that is its only
    /// consumer (`MeanApply`, and with `fuse_tower_updates` a folded tower
    /// product into a plain SGD or non-Nesterov momentum update:
    /// `TowerMatMulApply`); off, every reduction is its own
    /// `weighted_sum` launch on the collective stream.
    pub fuse_reductions: bool,
    /// With `fuse_reductions`, fuse folded tower products into their SGD or
    /// momentum updates ([`crate::fusion::fusable_tower_applies`]).
    pub fuse_tower_updates: bool,
    /// Fuse elementwise neighbours into one launch and run activation
    /// gradients in place (`BiasAddAct`, `Conv2DBiasAct`,
    /// `UnaryGradBiasGrad`, see [`crate::lower`]); off, every graph op
    /// that computes is its own launch with a buffer of its own (the
    /// unfused program, e.g. to measure what fusion saves).
    pub fuse_kernels: bool,
    /// Let buffers of one device share arena bytes by liveness
    /// ([`crate::arena`]); off, every buffer has bytes of its own for the
    /// whole step (any tensor can then be read after the step).
    pub reuse_memory: bool,
}

impl LowerOptions {
    /// A program named `program` in `mode`, with reductions and kernels fused and memory reused.
    pub fn new(mode: Mode, program: &str) -> LowerOptions {
        LowerOptions {
            mode,
            program: program.to_string(),
            fuse_reductions: true,
            fuse_tower_updates: true,
            fuse_kernels: true,
            reuse_memory: true,
        }
    }
}

/// Where a tensor lives: a buffer of a device's arena, or a variable by name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum BufRef {
    /// Buffer `buffer` of `Plan::devices[device]`.
    Arena { device: usize, buffer: usize },
    /// A variable in the backend's store.
    Variable(String),
}

/// What a buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BufferKind {
    /// An op's output (activation or gradient).
    Tensor,
    /// A fed placeholder.
    Feed,
    /// A constant, filled at load.
    Constant,
    /// Kernel scratch space.
    Workspace,
    /// A contiguous part of buffer `of` of the same device (an output of a
    /// leading-axis split); it takes no arena space of its own.
    View { of: usize },
}

impl BufferKind {
    /// `tensor`, `feed`, `constant`, `workspace`, `view`.
    pub fn name(self) -> &'static str {
        match self {
            BufferKind::Tensor => "tensor",
            BufferKind::Feed => "feed",
            BufferKind::Constant => "constant",
            BufferKind::Workspace => "workspace",
            BufferKind::View { .. } => "view",
        }
    }
}

/// One buffer in a device arena.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub kind: BufferKind,
    /// Byte offset in the device's arena (64-byte aligned).
    pub offset: usize,
    /// Size in bytes.
    pub bytes: usize,
}

impl Buffer {
    /// Number of elements of the buffer's dtype.
    pub fn len(&self) -> usize {
        self.bytes / self.dtype.size_bytes()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

/// One device's arena.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DevicePlan {
    pub device: Device,
    pub buffers: Vec<Buffer>,
    pub arena_bytes: usize,
}

impl DevicePlan {
    /// The arena's size were every buffer given bytes of its own (the sum
    /// of its buffers, views excluded, each rounded up to
    /// [`crate::arena::ALIGN`]): what memory reuse is measured against.
    pub fn bytes_without_reuse(&self) -> usize {
        let align = crate::arena::ALIGN;
        self.buffers
            .iter()
            .filter(|b| !matches!(b.kind, BufferKind::View { .. }))
            .map(|b| b.bytes.div_ceil(align).saturating_mul(align))
            .fold(0usize, |a, b| a.saturating_add(b))
    }
}

/// A variable the program uses (stored by the backend, shared across programs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariableDecl {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub init: Initializer,
    pub trainable: bool,
    pub device: Device,
    /// The graph seed its initial value derives from, when the graph had
    /// one set (`GraphBuilder::with_seed`); else the session's seed decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// A constant buffer's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConstantDecl {
    pub buffer: BufRef,
    /// Values as f32 (integers exact up to 2^24); converted to the buffer's dtype at load.
    pub data: Vec<f32>,
}

/// One step of a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Step {
    Launch {
        kernel: Kernel,
        inputs: Vec<BufRef>,
        outputs: Vec<BufRef>,
        workspace: Option<BufRef>,
        node: String,
    },
    Copy {
        from: BufRef,
        to: BufRef,
        bytes: usize,
        node: String,
    },
    /// A collective over the ranks of the session's communicator (one rank
    /// per process): each f32 buffer of the group (a gradient bucket) is
    /// replaced, in place, by its sum over all ranks. Within one process the
    /// towers are reduced by kernels; this step crosses processes.
    AllReduce {
        buffers: Vec<BufRef>,
        node: String,
    },
    /// `AllReduce`'s sum delivered to rank `root` alone (`--variables ps`:
    /// a bucket of gradients that only `root`, their owner, applies): the
    /// same f32 buffers, the same rank-order sum, bit for bit, on `root`;
    /// on every other rank the buffers are only sent (their contents after
    /// the step are unspecified, and nothing reads them).
    Reduce {
        root: usize,
        buffers: Vec<BufRef>,
        node: String,
    },
    /// Every f32 buffer of the group (variables: `--variables ps`, an
    /// owner's new values) overwritten on every rank with rank `root`'s.
    Broadcast {
        root: usize,
        buffers: Vec<BufRef>,
        node: String,
    },
    Record(usize),
    Wait(usize),
}

/// The ordered steps of one stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamPlan {
    pub device: Device,
    pub kind: StreamKind,
    pub steps: Vec<Step>,
}

impl StreamPlan {
    /// `cpu:0/compute`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.device, self.kind.name())
    }
}

/// A compiled program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub program: String,
    pub mode: Mode,
    pub devices: Vec<DevicePlan>,
    pub variables: Vec<VariableDecl>,
    pub constants: Vec<ConstantDecl>,
    /// Placeholder name → buffer, sorted by name.
    pub feeds: Vec<(String, BufRef)>,
    /// User-facing fetch name → buffer, sorted by name.
    pub fetches: Vec<(String, BufRef)>,
    /// Every tensor of the program by `node` (slot 0) or `node:slot`, sorted.
    pub tensors: Vec<(String, BufRef)>,
    pub streams: Vec<StreamPlan>,
    pub num_events: usize,
    /// With several processes: this process's rank (the graph's program
    /// record), naming its devices `/job:worker/task:<rank>/device:...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<usize>,
    /// Placeholders of the graph this program does not read, sorted by
    /// name: a feed of one is checked against its type and ignored (TF1's
    /// `feed_dict` takes any placeholder of the graph).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unread_feeds: Vec<UnreadFeed>,
}

/// A placeholder the program does not read: its name and declared type
/// (`None` for an unknown dimension).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnreadFeed {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<Option<usize>>,
}

impl Plan {
    /// A device's name in this plan: TF1's `/job:worker/task:i/device:GPU:j`
    /// in a multi-process plan, else `gpu:j`.
    pub fn device_name(&self, d: Device) -> String {
        d.qualified(self.task)
    }

    /// A stream's name in this plan (`<device>/<kind>`).
    pub fn stream_name(&self, s: &StreamPlan) -> String {
        format!("{}/{}", self.device_name(s.device), s.kind.name())
    }

    /// Move a plan of one device onto `to`: its device, every stream, and
    /// the declarations of variables it would create there. Launches,
    /// buffers and events are unchanged (every kernel runs on every
    /// device kind), so the moved plan computes the same values; it is
    /// how a session runs an evaluation program where the variables it
    /// reads live. Err, naming the devices, for a plan of several.
    pub fn move_to(&mut self, to: Device) -> Result<(), String> {
        let [only] = self.devices.as_mut_slice() else {
            let names: Vec<String> = self.devices.iter().map(|d| d.device.to_string()).collect();
            return Err(format!("program '{}' runs on {}, not one device", self.program, names.join(", ")));
        };
        let from = std::mem::replace(&mut only.device, to);
        for s in &mut self.streams {
            s.device = to;
        }
        for v in &mut self.variables {
            if v.device == from {
                v.device = to;
            }
        }
        Ok(())
    }

    /// Read variable `name` through a copy of it in this one-device
    /// plan's own arena: a buffer `<name>/colocated` after the arena's
    /// end, filled by a copy at the start of the device's first compute
    /// stream, and every launch that read the variable reads the copy
    /// (stream order puts the copy first). For a program reading a
    /// variable another device holds (a kernel reads only its own
    /// device's memory; the copy crosses). Err when the plan has several
    /// devices, does not declare the variable, or writes it (a copy would
    /// lose the write).
    pub fn copy_variable_in(&mut self, name: &str) -> Result<(), String> {
        let decl =
            self.variable(name).ok_or_else(|| format!("program '{}' declares no variable '{name}'", self.program))?;
        let (dtype, shape) = (decl.dtype, decl.shape.clone());
        let var = BufRef::Variable(name.to_string());
        let writes = self.streams.iter().flat_map(|s| &s.steps).any(|st| match st {
            Step::Launch { outputs, workspace, .. } => outputs.iter().chain(workspace).any(|r| *r == var),
            Step::Copy { to, .. } => *to == var,
            _ => false,
        });
        if writes {
            return Err(format!("program '{}' writes variable '{name}'", self.program));
        }
        // The copy goes first on the first compute stream: every reader must be there.
        let reads = |st: &Step| matches!(st, Step::Launch { inputs, .. } if inputs.contains(&var));
        let home = self.streams.iter().position(|s| s.kind == StreamKind::Compute);
        if let Some(other) =
            self.streams.iter().enumerate().find(|(i, s)| Some(*i) != home && s.steps.iter().any(reads)).map(|(_, s)| s)
        {
            return Err(format!(
                "program '{}' reads variable '{name}' on stream {} too (a copy orders before one stream only)",
                self.program,
                other.name()
            ));
        }
        let Some(home) = home else { return Err(format!("program '{}' has no compute stream", self.program)) };
        let [dev] = self.devices.as_mut_slice() else {
            return Err(format!("program '{}' runs on {} devices, not one", self.program, self.devices.len()));
        };
        // Checked: a plan from a file is not yet verified here.
        let too_big = || format!("program '{}': the copy of variable '{name}' does not fit an arena", self.program);
        let bytes = shape.iter().try_fold(dtype.size_bytes(), |a, &d| a.checked_mul(d)).ok_or_else(too_big)?;
        let offset = dev.arena_bytes.checked_next_multiple_of(crate::arena::ALIGN).ok_or_else(too_big)?;
        let end = offset.checked_add(bytes).ok_or_else(too_big)?;
        let buffer = dev.buffers.len();
        let copy_name = format!("{name}/colocated");
        dev.buffers.push(Buffer { name: copy_name.clone(), dtype, shape, kind: BufferKind::Tensor, offset, bytes });
        dev.arena_bytes = end;
        let local = BufRef::Arena { device: 0, buffer };
        let stream = &mut self.streams[home];
        for st in &mut stream.steps {
            if let Step::Launch { inputs, .. } = st {
                for r in inputs.iter_mut().filter(|r| **r == var) {
                    *r = local.clone();
                }
            }
        }
        stream.steps.insert(0, Step::Copy { from: var, to: local, bytes, node: copy_name });
        Ok(())
    }

    /// The buffer a reference names (None for variables).
    pub fn buffer(&self, r: &BufRef) -> Option<&Buffer> {
        match r {
            BufRef::Arena { device, buffer } => self.devices.get(*device)?.buffers.get(*buffer),
            BufRef::Variable(_) => None,
        }
    }

    /// The variable declaration of a name.
    pub fn variable(&self, name: &str) -> Option<&VariableDecl> {
        self.variables.iter().find(|v| v.name == name)
    }

    /// Dtype and shape of what a reference names.
    pub fn type_of(&self, r: &BufRef) -> Option<(DType, &[usize])> {
        match r {
            BufRef::Arena { .. } => self.buffer(r).map(|b| (b.dtype, b.shape.as_slice())),
            BufRef::Variable(n) => self.variable(n).map(|v| (v.dtype, v.shape.as_slice())),
        }
    }

    /// A fetchable tensor: a fetch name first, then a tensor name (`node` or
    /// `node:slot`; TF1's `node:0` names slot 0, which the plan lists as
    /// `node`).
    pub fn lookup(&self, name: &str) -> Option<&BufRef> {
        fn find<'a>(v: &'a [(String, BufRef)], name: &str) -> Option<&'a BufRef> {
            v.iter().find(|(n, _)| n == name).map(|(_, r)| r)
        }
        find(&self.fetches, name)
            .or_else(|| find(&self.tensors, name))
            .or_else(|| name.strip_suffix(":0").and_then(|n| find(&self.fetches, n).or_else(|| find(&self.tensors, n))))
    }

    /// Whether what `r` names may hold another buffer's bytes once a step
    /// is over: its buffer (or the base it views, or the buffer it is
    /// copied from, which the CPU backend reads in its place) shares arena
    /// bytes with another buffer of its device (memory reuse, see
    /// [`crate::arena`]). A fetch never does; any other tensor may. Linear
    /// in the plan's size and allocation-free.
    pub fn shares_bytes(&self, r: &BufRef) -> bool {
        let mut cur = r;
        // A chain of copies is at most as long as the plan has copies.
        for _ in 0..=self.streams.iter().map(|s| s.steps.len()).sum::<usize>() {
            if self.overlaps_another(cur) {
                return true;
            }
            let from = self.streams.iter().flat_map(|s| &s.steps).find_map(|st| match st {
                Step::Copy { from, to, .. } if to == cur => Some(from),
                _ => None,
            });
            match from {
                Some(f) => cur = f,
                None => return false,
            }
        }
        false
    }

    /// Whether the base buffer of `r` overlaps another buffer of its own on its device.
    fn overlaps_another(&self, r: &BufRef) -> bool {
        let BufRef::Arena { device, buffer } = r else { return false };
        let Some(d) = self.devices.get(*device) else { return false };
        let base = match d.buffers.get(*buffer).map(|b| b.kind) {
            Some(BufferKind::View { of }) => of,
            Some(_) => *buffer,
            None => return false,
        };
        let Some(b) = d.buffers.get(base) else { return false };
        d.buffers.iter().enumerate().any(|(i, o)| {
            i != base
                && !matches!(o.kind, BufferKind::View { .. })
                && b.bytes > 0
                && o.bytes > 0
                && o.offset < b.offset.saturating_add(b.bytes)
                && b.offset < o.offset.saturating_add(o.bytes)
        })
    }

    /// JSON form.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}
