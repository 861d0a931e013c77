//! The readable text form of a plan: every buffer on a device, every launch
//! on a stream, every cross-stream dependency an explicit event. Byte for
//! byte deterministic: it only walks the plan's vectors in order.
//!
//! Under each launch, one `cuda ...` line per operation the CUDA backend
//! runs for it, from `towers_kernels::launch` for that launch's operand
//! sizes: the entry point with its grid, block and dynamic shared memory
//! (`cuda towers_binary_f32 grid=4 block=256 smem=0`), or a cuBLAS GEMM's
//! sizes (`cuda sgemm m=8 n=4 k=3 tb`). The CPU backend ignores them. Only
//! in the full form: grids (and the choice of launches) follow the sizes,
//! which the structural view leaves out.
//!
//! Two forms: [`Plan::to_text`], everything, arena offsets and byte counts
//! included; and [`Plan::to_structure_text`], the structural view for
//! snapshot tests, the same lines without arena sizes, offsets and byte
//! counts, so that changing one layer's width changes only the lines whose
//! shapes or kernel parameters depend on it (memory planning moves every
//! offset after a buffer that grew).

use std::fmt::Write;

use towers_vocab::{Distribution, FanMode, Initializer};

use crate::plan::{BufRef, Plan, Step};
use towers_kernels::launch::{self, Counts, LaunchError, LaunchOp, Lowering};
use towers_kernels::Kernel;

fn dims(d: &[usize]) -> String {
    let v: Vec<String> = d.iter().map(|x| x.to_string()).collect();
    format!("[{}]", v.join(","))
}

fn init(i: &Initializer) -> String {
    match i {
        Initializer::Zeros => "zeros".into(),
        Initializer::Ones => "ones".into(),
        Initializer::Constant(v) => format!("constant({v})"),
        Initializer::TruncatedNormal { mean, stddev } => format!("truncated_normal({mean}, {stddev})"),
        Initializer::GlorotUniform => "glorot_uniform".into(),
        Initializer::RandomUniform { min, max } => format!("random_uniform({min}, {max})"),
        Initializer::VarianceScaling { scale, mode, distribution } => {
            let mode = match mode {
                FanMode::FanIn => "fan_in",
                FanMode::FanOut => "fan_out",
                FanMode::FanAvg => "fan_avg",
            };
            let dist = match distribution {
                Distribution::TruncatedNormal => "truncated_normal",
                Distribution::Normal => "untruncated_normal",
                Distribution::Uniform => "uniform",
            };
            format!("variance_scaling({scale}, {mode}, {dist})")
        }
        Initializer::RandomNormal { mean, stddev } => format!("random_normal({mean}, {stddev})"),
    }
}

/// The parameters of a kernel as the plan text shows them: its family's
/// text ([`Kernel::params_text`], declared in the family's `desc.rs`).
pub fn kernel_params(k: &Kernel) -> String {
    k.params_text()
}

impl Plan {
    /// The name a reference prints as: the buffer's name, or `var:name`.
    pub fn ref_name(&self, r: &BufRef) -> String {
        match r {
            BufRef::Arena { .. } => self.buffer(r).map(|b| b.name.clone()).unwrap_or_else(|| "?".into()),
            BufRef::Variable(n) => format!("var:{n}"),
        }
    }

    /// The tensors an all-reduce sums: each buffer's views (a bucket's
    /// members), or the buffer itself when nothing views it.
    fn members(&self, rs: &[BufRef]) -> Vec<String> {
        let mut out = Vec::new();
        for r in rs {
            let mut views: Vec<&crate::plan::Buffer> = match r {
                BufRef::Arena { device, buffer } => self.devices[*device]
                    .buffers
                    .iter()
                    .filter(|b| b.kind == crate::plan::BufferKind::View { of: *buffer })
                    .collect(),
                BufRef::Variable(_) => Vec::new(),
            };
            views.sort_by_key(|b| b.offset);
            let views: Vec<String> = views.iter().map(|b| b.name.clone()).collect();
            if views.is_empty() {
                out.push(self.ref_name(r));
            } else {
                out.push(format!("{} = [{}]", self.ref_name(r), views.join(", ")));
            }
        }
        out
    }

    /// The element count of an operand (an arena buffer or a variable).
    fn count(&self, r: &BufRef) -> usize {
        match r {
            BufRef::Variable(n) => self.variable(n).map_or(0, |v| v.shape.iter().product()),
            _ => self.buffer(r).map_or(0, |b| b.len()),
        }
    }

    /// What the CUDA backend runs for one launch of this plan
    /// (`towers_kernels::launch::lower` over its operands' element counts,
    /// with the workspace the backend gives it).
    pub fn cuda_lowering(
        &self,
        kernel: &Kernel,
        ins: &[BufRef],
        outs: &[BufRef],
        ws: Option<&BufRef>,
    ) -> Result<Lowering, LaunchError> {
        let (ins, outs): (Vec<usize>, Vec<usize>) =
            (ins.iter().map(|r| self.count(r)).collect(), outs.iter().map(|r| self.count(r)).collect());
        let workspace = launch::backend_workspace(kernel).or(ws.map(|r| self.count(r)));
        launch::lower(kernel, Counts { ins: &ins, outs: &outs, workspace })
    }

    /// Under a launch, what the CUDA backend runs for it
    /// (`towers_kernels::launch`, for these operands' sizes): each CUDA C
    /// launch's entry, grid, block and dynamic shared memory, each cuBLAS
    /// GEMM's sizes. The CPU backend ignores these lines.
    fn cuda_lines(&self, o: &mut String, kernel: &Kernel, ins: &[BufRef], outs: &[BufRef], ws: Option<&BufRef>) {
        match self.cuda_lowering(kernel, ins, outs, ws) {
            Ok(low) => {
                for op in &low.ops {
                    let _ = match op {
                        LaunchOp::Launch(l) => writeln!(o, "    cuda {} {}", l.entry, l.geometry()),
                        LaunchOp::Gemm(g) => writeln!(
                            o,
                            "    cuda sgemm m={} n={} k={}{}{}{}",
                            g.m,
                            g.n,
                            g.k,
                            if g.trans_a { " ta" } else { "" },
                            if g.trans_b { " tb" } else { "" },
                            if g.batch != 1 {
                                format!(" batch={} strides={}/{}/{}", g.batch, g.stride_a, g.stride_b, g.stride_c)
                            } else {
                                String::new()
                            }
                        ),
                    };
                }
            }
            Err(e) => {
                let _ = writeln!(o, "    cuda none: {e}");
            }
        }
    }

    fn refs(&self, rs: &[BufRef]) -> String {
        rs.iter().map(|r| self.ref_name(r)).collect::<Vec<_>>().join(", ")
    }

    /// The readable, deterministic text form.
    pub fn to_text(&self) -> String {
        self.render(false)
    }

    /// The structural text form, for snapshots: as [`Plan::to_text`]
    /// without arena sizes, buffer offsets and byte counts (see the module
    /// docs).
    ///
    /// A user's snapshot test of their own plan (see
    /// `examples/snapshot_plan.rs`, where `compiled` comes from
    /// `towers::compiler::compile_train`):
    /// ```text
    /// insta::assert_snapshot!("my_model_plan", compiled.plan.to_structure_text());
    /// ```
    pub fn to_structure_text(&self) -> String {
        self.render(true)
    }

    fn render(&self, structural: bool) -> String {
        let mut o = String::new();
        let mode = match self.mode {
            crate::Mode::Train => "train",
            crate::Mode::Eval => "eval",
        };
        match self.task {
            Some(t) => {
                let _ = writeln!(o, "program {} ({mode}) on /job:worker/task:{t}", self.program);
            }
            None => {
                let _ = writeln!(o, "program {} ({mode})", self.program);
            }
        }
        for d in &self.devices {
            if structural {
                let _ = writeln!(o, "device {}", self.device_name(d.device));
            } else {
                let _ = writeln!(o, "device {}  arena {} B", self.device_name(d.device), d.arena_bytes);
            }
            for b in &d.buffers {
                let kind = b.kind.name();
                if structural {
                    let _ = writeln!(o, "  {} {}{} {kind}", b.name, b.dtype, dims(&b.shape));
                } else {
                    let _ =
                        writeln!(o, "  {} {}{} @{} {} B {kind}", b.name, b.dtype, dims(&b.shape), b.offset, b.bytes);
                }
            }
        }
        if !self.variables.is_empty() {
            let _ = writeln!(o, "variables");
            for v in &self.variables {
                let t = if v.trainable { " trainable" } else { "" };
                let _ = writeln!(
                    o,
                    "  {} {}{} on {} init={}{t}",
                    v.name,
                    v.dtype,
                    dims(&v.shape),
                    self.device_name(v.device),
                    init(&v.init)
                );
            }
        }
        for c in &self.constants {
            let vals: Vec<String> = c.data.iter().take(8).map(|v| v.to_string()).collect();
            let more = if c.data.len() > 8 { ", ..." } else { "" };
            let _ = writeln!(o, "const {} = [{}{more}]", self.ref_name(&c.buffer), vals.join(", "));
        }
        for (n, r) in &self.feeds {
            let _ = writeln!(o, "feed {n} -> {}", self.ref_name(r));
        }
        for (n, r) in &self.fetches {
            let _ = writeln!(o, "fetch {n} <- {}", self.ref_name(r));
        }
        for s in &self.streams {
            let _ = writeln!(o, "stream {}", self.stream_name(s));
            for step in &s.steps {
                match step {
                    Step::Launch { kernel, inputs, outputs, workspace, node } => {
                        let ws = workspace.as_ref().map(|w| format!(" ws={}", self.ref_name(w))).unwrap_or_default();
                        let params = kernel_params(kernel);
                        let sep = if params.is_empty() { "" } else { " " };
                        let _ = writeln!(
                            o,
                            "  {}{sep}{params} ({}) -> ({}){ws}  ; {node}",
                            kernel.name(),
                            self.refs(inputs),
                            self.refs(outputs)
                        );
                        if !structural {
                            self.cuda_lines(&mut o, kernel, inputs, outputs, workspace.as_ref());
                        }
                    }
                    Step::Copy { from, to, node, .. } if structural => {
                        let _ = writeln!(o, "  copy {} -> {}  ; {node}", self.ref_name(from), self.ref_name(to));
                    }
                    Step::Copy { from, to, bytes, node } => {
                        let _ =
                            writeln!(o, "  copy {} -> {}  ; {node} {bytes} B", self.ref_name(from), self.ref_name(to));
                    }
                    Step::AllReduce { buffers, node } => {
                        let bytes: usize = buffers.iter().filter_map(|b| self.buffer(b)).map(|b| b.bytes).sum();
                        let bytes = if structural { String::new() } else { format!(" {bytes} B") };
                        let _ = writeln!(
                            o,
                            "  all_reduce sum over ranks{bytes} ({})  ; {node}",
                            self.members(buffers).join(", ")
                        );
                    }
                    Step::Reduce { root, buffers, node } => {
                        let bytes: usize = buffers.iter().filter_map(|b| self.buffer(b)).map(|b| b.bytes).sum();
                        let bytes = if structural { String::new() } else { format!(" {bytes} B") };
                        let _ = writeln!(
                            o,
                            "  reduce→rank {root} sum over ranks{bytes} ({})  ; {node}",
                            self.members(buffers).join(", ")
                        );
                    }
                    Step::Broadcast { root, buffers, node } => {
                        let var = |b: &BufRef| match b {
                            BufRef::Variable(name) => self.variables.iter().find(|d| &d.name == name),
                            BufRef::Arena { .. } => None,
                        };
                        let bytes: usize = buffers
                            .iter()
                            .filter_map(var)
                            .map(|d| d.shape.iter().product::<usize>() * d.dtype.size_bytes())
                            .sum();
                        let bytes = if structural { String::new() } else { format!(" {bytes} B") };
                        let _ = writeln!(
                            o,
                            "  broadcast from rank {root}{bytes} ({})  ; {node}",
                            buffers.iter().map(|b| self.ref_name(b)).collect::<Vec<_>>().join(", ")
                        );
                    }
                    Step::Record(e) => {
                        let _ = writeln!(o, "  record e{e}");
                    }
                    Step::Wait(e) => {
                        let _ = writeln!(o, "  wait e{e}");
                    }
                }
            }
        }
        let _ = writeln!(o, "events {}", self.num_events);
        o
    }
}
