//! Traced training steps as Chrome trace event JSON (`towers train --trace
//! FILE`), which Perfetto (ui.perfetto.dev) and chrome://tracing load.
//!
//! Layout of the file (the `traceEvents` array format):
//! - one *process* per plan device (`pid`: the device's index in
//!   `Plan::devices`, named after it, e.g. `gpu:0`), and one *thread* per
//!   plan stream (`tid`: the stream's index in `Plan::streams`, named after
//!   the stream, e.g. `gpu:0 compute`): one lane per device stream, sorted
//!   in plan order; metadata events (`"ph":"M"`) name and sort them, and
//!   every stream gets its lane even when a step left it idle;
//! - every launch, copy, wait and all-reduce of every traced step is a
//!   complete event (`"ph":"X"`) on its stream's lane, named after its node
//!   (a wait: `wait eN`), with `cat` its kind (the kernel's name, `copy`,
//!   `wait` or `all_reduce`), `ts` and `dur` in microseconds (`ts` from the
//!   first traced step's start), and `args`: the step number, the kernel
//!   and its parameters as the plan text writes them, the operands, a copy's
//!   bytes;
//! - `otherData` says which program, backend and steps were traced.
//!
//! Within a lane events never overlap (a stream runs one step at a time).
//! Event order is stream by stream, then by time: deterministic for given
//! traces. Library code: it builds the JSON or writes it where the caller
//! says, and prints nothing.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use thiserror::Error;
use towers_codegen::text::kernel_params;
use towers_codegen::{Plan, Step};
use towers_runtime::Trace;

/// Why a trace could not be written.
#[derive(Debug, Error)]
pub enum TraceError {
    #[error("cannot write the trace {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("the trace names stream {stream}, but the plan has {streams} streams")]
    Stream { stream: usize, streams: usize },
}

/// Microseconds, as Chrome traces count them, from nanoseconds.
fn micros(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// Name, kind and arguments of a traced item, from its plan step when the
/// trace's step index names one.
fn describe(plan: &Plan, stream: usize, index: usize, kind: &str, node: &str) -> (String, Map<String, Value>) {
    let mut args = Map::new();
    let name = match plan.streams.get(stream).and_then(|s| s.steps.get(index)) {
        Some(Step::Launch { kernel, inputs, outputs, node, .. }) => {
            args.insert("kernel".into(), json!(kernel.name()));
            let params = kernel_params(kernel);
            if !params.is_empty() {
                args.insert("params".into(), json!(params));
            }
            args.insert("inputs".into(), json!(inputs.iter().map(|r| plan.ref_name(r)).collect::<Vec<_>>()));
            args.insert("outputs".into(), json!(outputs.iter().map(|r| plan.ref_name(r)).collect::<Vec<_>>()));
            node.clone()
        }
        Some(Step::Copy { from, to, bytes, node }) => {
            args.insert("from".into(), json!(plan.ref_name(from)));
            args.insert("to".into(), json!(plan.ref_name(to)));
            args.insert("bytes".into(), json!(bytes));
            node.clone()
        }
        Some(Step::AllReduce { buffers, node }) => {
            args.insert("buffers".into(), json!(buffers.iter().map(|r| plan.ref_name(r)).collect::<Vec<_>>()));
            node.clone()
        }
        Some(Step::Reduce { root, buffers, node } | Step::Broadcast { root, buffers, node }) => {
            args.insert("buffers".into(), json!(buffers.iter().map(|r| plan.ref_name(r)).collect::<Vec<_>>()));
            args.insert("root".into(), json!(root));
            node.clone()
        }
        Some(Step::Wait(e)) => {
            args.insert("event".into(), json!(e));
            format!("wait e{e}")
        }
        Some(Step::Record(e)) => format!("record e{e}"),
        None => node.to_string(),
    };
    args.insert("kind".into(), json!(kind));
    args.insert("node".into(), json!(node));
    (name, args)
}

/// The Chrome trace of `traces`, steps of the program `plan` run on `backend`.
pub fn chrome_trace(plan: &Plan, traces: &[Trace], backend: &str) -> Result<Value, TraceError> {
    let device_of = |s: usize| plan.devices.iter().position(|d| d.device == plan.streams[s].device).unwrap_or(0);
    let mut events: Vec<Value> = Vec::new();
    for (pid, d) in plan.devices.iter().enumerate() {
        events.push(
            json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": d.device.to_string()}}),
        );
        events
            .push(json!({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}));
    }
    for (tid, s) in plan.streams.iter().enumerate() {
        let pid = device_of(tid);
        let lane = format!("{} {}", s.device, s.kind.name());
        events.push(json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": lane}}));
        events
            .push(json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}));
    }
    let origin = traces.iter().map(|t| t.start_ns).min().unwrap_or(0);
    // (stream, start) of each complete event, to order them.
    let mut timed: Vec<(usize, u64, Value)> = Vec::new();
    for t in traces {
        for e in &t.events {
            if e.stream >= plan.streams.len() {
                return Err(TraceError::Stream { stream: e.stream, streams: plan.streams.len() });
            }
            let (name, mut args) = describe(plan, e.stream, e.index, e.kind, &e.node);
            args.insert("step".into(), json!(t.step));
            let start = (t.start_ns - origin).saturating_add(e.start_ns);
            timed.push((
                e.stream,
                start,
                json!({
                    "name": name,
                    "cat": e.kind,
                    "ph": "X",
                    "ts": micros(start),
                    "dur": micros(e.dur_ns),
                    "pid": device_of(e.stream),
                    "tid": e.stream,
                    "args": Value::Object(args),
                }),
            ));
        }
    }
    timed.sort_by_key(|(s, start, _)| (*s, *start));
    events.extend(timed.into_iter().map(|(_, _, v)| v));
    let steps: Vec<Value> = traces
        .iter()
        .map(|t| json!({"step": t.step, "ts": micros(t.start_ns - origin), "dur": micros(t.dur_ns)}))
        .collect();
    Ok(json!({
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"program": plan.program, "backend": backend, "steps": steps},
    }))
}

/// Write the Chrome trace of `traces` (see [`chrome_trace`]) to `path`.
pub fn write_chrome_trace(path: &Path, plan: &Plan, traces: &[Trace], backend: &str) -> Result<(), TraceError> {
    let v = chrome_trace(plan, traces, backend)?;
    let write = |source| TraceError::Write { path: path.to_path_buf(), source };
    let text = serde_json::to_string(&v).map_err(|e| write(std::io::Error::other(e)))?;
    crate::outputs::write_atomic(path, text.as_bytes()).map_err(write)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::{compile_train, CompileOptions};
    use crate::models::{build, ModelKind, ModelSpec};
    use towers_graph::{Device, Optimizer, F32};
    use towers_runtime::TraceEvent;

    fn plan() -> Plan {
        let model = build(&ModelSpec::new(ModelKind::Mlp, [8, 8, 1], 10)).expect("model");
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
        o.towers = vec![Device::gpu(0), Device::gpu(1)];
        compile_train(&model.graph, &model.loss, &o).expect("compiles").plan
    }

    /// The first launch and the first wait of a stream, as (index, node).
    fn first(plan: &Plan, stream: usize, launch: bool) -> (usize, String) {
        plan.streams[stream]
            .steps
            .iter()
            .enumerate()
            .find_map(|(i, s)| match s {
                Step::Launch { node, .. } if launch => Some((i, node.clone())),
                Step::Wait(e) if !launch => Some((i, format!("event {e}"))),
                _ => None,
            })
            .expect("a launch and a wait")
    }

    /// Two steps 1 ms apart: every stream gets a named lane of its device's
    /// process; events take their node's name (waits `wait eN`) and their
    /// step's time (µs, from the first step), sorted by time within a lane;
    /// the kernel's parameters ride along.
    #[test]
    fn events_sit_on_their_streams_lane_at_their_steps_time() {
        let plan = plan();
        let s = plan.streams.iter().position(|s| s.name() == "gpu:1/compute").expect("gpu:1/compute");
        let ((li, launch), (wi, _)) = (first(&plan, s, true), first(&plan, s, false));
        let ev = |index, kind, node: &str, start_ns| TraceEvent {
            stream: s,
            index,
            kind,
            node: node.into(),
            start_ns,
            dur_ns: 250,
        };
        let trace = |step, start_ns| Trace {
            step,
            start_ns,
            dur_ns: 900_000,
            events: vec![ev(li, "gemm", &launch, 1500), ev(wi, "wait", "event", 1000)],
        };
        let v = chrome_trace(&plan, &[trace(4, 2_000_000), trace(5, 3_000_000)], "cpu").expect("trace");
        let events = v["traceEvents"].as_array().expect("array");
        let lanes: Vec<&Value> = events.iter().filter(|e| e["name"] == "thread_name").collect();
        assert_eq!(lanes.len(), plan.streams.len());
        let lane = lanes.iter().find(|e| e["tid"] == s).expect("the lane");
        assert_eq!(lane["args"]["name"], "gpu:1 compute");
        let gpu1 = plan.devices.iter().position(|d| d.device == Device::gpu(1)).expect("gpu:1");
        assert_eq!(lane["pid"], gpu1);
        let x: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(x.len(), 4);
        assert!(x[0]["name"].as_str().is_some_and(|n| n.starts_with("wait e")), "{}", x[0]);
        assert_eq!(x[1]["name"], launch.as_str());
        assert!(x[1]["args"]["kernel"].as_str().is_some_and(|k| k.starts_with("gemm")), "{}", x[1]);
        assert!(x[1]["args"]["params"].as_str().is_some_and(|p| p.starts_with("m=")), "{}", x[1]);
        let times: Vec<(f64, f64, u64)> = x
            .iter()
            .map(|e| (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap(), e["args"]["step"].as_u64().unwrap()))
            .collect();
        assert_eq!(times, [(1.0, 0.25, 4), (1.5, 0.25, 4), (1001.0, 0.25, 5), (1001.5, 0.25, 5)]);
        let bad = Trace { events: vec![TraceEvent { stream: 99, ..ev(0, "copy", "c", 0) }], ..trace(0, 0) };
        let e = chrome_trace(&plan, &[bad], "cpu").expect_err("stream 99");
        assert_eq!(
            e.to_string(),
            format!("the trace names stream 99, but the plan has {} streams", plan.streams.len())
        );
    }
}
