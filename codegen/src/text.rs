//! The readable text form of a plan: every buffer on a device, every launch
//! on a stream, every cross-stream dependency an explicit event. Byte for
//! byte deterministic: it only walks the plan's vectors in order.

use std::fmt::Write;

use towers_graph::Initializer;

use crate::plan::{BufRef, Plan, Step};
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
    }
}

/// The parameters of a kernel, `key=value` separated by spaces.
pub fn kernel_params(k: &Kernel) -> String {
    let s = format!("{k:?}");
    // `Name { a: 1, b: [2, 3] }` → `a=1 b=[2,3]`.
    let inner = match (s.find('{'), s.rfind('}')) {
        (Some(a), Some(b)) if a < b => s[a + 1..b].trim().to_string(),
        _ => return String::new(),
    };
    let mut out = String::new();
    let mut depth = 0;
    for ch in inner.chars() {
        match ch {
            '[' | '{' | '(' => {
                depth += 1;
                out.push(ch)
            }
            ']' | '}' | ')' => {
                depth -= 1;
                out.push(ch)
            }
            ':' if depth == 0 => out.push('='),
            ',' if depth == 0 => out.push(';'),
            ' ' => {}
            _ => out.push(ch),
        }
    }
    out.replace(';', " ")
}

impl Plan {
    /// The name a reference prints as: the buffer's name, or `var:name`.
    pub fn ref_name(&self, r: &BufRef) -> String {
        match r {
            BufRef::Arena { .. } => self.buffer(r).map(|b| b.name.clone()).unwrap_or_else(|| "?".into()),
            BufRef::Variable(n) => format!("var:{n}"),
        }
    }

    fn refs(&self, rs: &[BufRef]) -> String {
        rs.iter().map(|r| self.ref_name(r)).collect::<Vec<_>>().join(", ")
    }

    /// The readable, deterministic text form.
    pub fn to_text(&self) -> String {
        let mut o = String::new();
        let mode = match self.mode {
            crate::Mode::Train => "train",
            crate::Mode::Eval => "eval",
        };
        let _ = writeln!(o, "program {} ({mode})", self.program);
        for d in &self.devices {
            let _ = writeln!(o, "device {}  arena {} B", d.device, d.arena_bytes);
            for b in &d.buffers {
                let kind = format!("{:?}", b.kind).to_lowercase();
                let _ = writeln!(o, "  {} {}{} @{} {} B {kind}", b.name, b.dtype, dims(&b.shape), b.offset, b.bytes);
            }
        }
        if !self.variables.is_empty() {
            let _ = writeln!(o, "variables");
            for v in &self.variables {
                let t = if v.trainable { " trainable" } else { "" };
                let _ =
                    writeln!(o, "  {} {}{} on {} init={}{t}", v.name, v.dtype, dims(&v.shape), v.device, init(&v.init));
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
            let _ = writeln!(o, "stream {}", s.name());
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
                    }
                    Step::Copy { from, to, bytes, node } => {
                        let _ =
                            writeln!(o, "  copy {} -> {}  ; {node} {bytes} B", self.ref_name(from), self.ref_name(to));
                    }
                    Step::AllReduce { buffers, node } => {
                        let _ = writeln!(o, "  all_reduce sum ({})  ; {node}", self.refs(buffers));
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
