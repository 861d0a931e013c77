//! Hand-built, hand-placed, hand-scheduled graphs lowered to plans.
#![allow(dead_code)]

pub mod seeds;

use towers_codegen::{lower, BufRef, LowerOptions, Mode, Plan, Step};
use towers_graph::{DType, Device, Graph, GraphBuilder, Initializer, Op, Optimizer, F32};
use towers_graph::{Schedule, ScheduleItem, ScheduledStream, StreamKind, TensorRef};

/// Place every node on cpu:0 and schedule all of them on one compute stream (in the program record).
pub fn one_stream(g: &mut Graph) {
    let order = g.topo_order().unwrap();
    for &id in &order {
        g.node_mut(id).device = Some(Device::CPU0);
    }
    let items = order.iter().map(|&id| ScheduleItem::Run(g.node(id).name.clone())).collect();
    g.program_mut().schedule = Some(Schedule {
        streams: vec![ScheduledStream { device: Device::CPU0, kind: StreamKind::Compute, items }],
        num_events: 0,
    });
}

/// [`mlp_plan`] lowered with every buffer its own bytes (`reuse_memory` off).
pub fn mlp_plan_without_reuse() -> Plan {
    mlp_plan_with(false)
}

/// relu(x[2,2] · w + b) → sparse softmax xent → mean; SGD on w with a fed
/// gradient `g`. Fetches `loss` and `relu`; the other tensors' bytes are
/// reused within the step.
pub fn mlp_plan() -> Plan {
    mlp_plan_with(true)
}

fn mlp_plan_with(reuse_memory: bool) -> Plan {
    let mut b = GraphBuilder::with_seed(1);
    let x = b.placeholder("x", DType::F32, [2, 2]).unwrap();
    let y = b.placeholder("labels", DType::I32, [2]).unwrap();
    let gw = b.placeholder("g", DType::F32, [2, 2]).unwrap();
    let w = b.get_variable("fc/weights", [2, 2], Initializer::GlorotUniform).unwrap();
    let bias = b.get_variable("fc/biases", [2], Initializer::Zeros).unwrap();
    let h = b.matmul(x, w).unwrap();
    let h = b.bias_add(h, bias).unwrap();
    let h = b.relu(h).unwrap();
    let relu = h;
    let xent = b.sparse_softmax_cross_entropy_with_logits(h, y).unwrap();
    let loss = b.reduce_mean_all(xent).unwrap();
    let step = b
        .op1(
            "global_step",
            Op::Variable { dtype: DType::I32, shape: vec![], init: Initializer::Zeros, trainable: false },
            &[],
        )
        .unwrap();
    let lr = b
        .op1(
            "learning_rate",
            Op::Variable { dtype: DType::F32, shape: vec![], init: Initializer::Constant(F32(0.5)), trainable: false },
            &[],
        )
        .unwrap();
    let apply =
        b.op("apply_w", Op::ApplyGradient { optimizer: Optimizer::Sgd { lr: F32(0.5) } }, &[w, gw, step, lr]).unwrap();
    let inc = b.graph_mut().add(towers_graph::NewNode {
        control_inputs: vec![apply],
        ..towers_graph::NewNode::new("inc", Op::IncrementStep, vec![step])
    });
    inc.unwrap();
    let mut g = b.finish();
    one_stream(&mut g);
    let loss = TensorRef::of(&g, loss);
    g.program_mut().fetches.insert("loss".into(), loss);
    // Fetched, so its bytes survive the step (the tests read it by its tensor name).
    let relu = TensorRef::of(&g, relu);
    g.program_mut().fetches.insert("relu".into(), relu);
    // Unfused: these tests read intermediate tensors (MatMul) by name.
    lower(&g, &LowerOptions { reuse_memory, fuse_kernels: false, ..LowerOptions::new(Mode::Train, "train") }).unwrap()
}

/// x on cpu:0 → relu (cpu:0/compute) → record e0; gpu:0/compute waits e0,
/// copies to gpu:0 and negates: out = -relu(x). Two streams, two threads.
pub fn two_device_plan() -> Plan {
    let mut b = GraphBuilder::new();
    let x = b.placeholder("x", DType::F32, [2, 3]).unwrap();
    let r = b.relu(x).unwrap();
    let c = b.op1("relu_gpu0", Op::Copy, &[r]).unwrap();
    let n = b.neg(c).unwrap();
    let mut g = b.finish();
    let name = |t: towers_graph::Tensor, g: &Graph| g.node(t.node).name.clone();
    for id in g.node_ids() {
        g.node_mut(id).device = Some(Device::CPU0);
    }
    g.node_mut(c.node).device = Some(Device::gpu(0));
    g.node_mut(n.node).device = Some(Device::gpu(0));
    g.program_mut().schedule = Some(Schedule {
        streams: vec![
            ScheduledStream {
                device: Device::CPU0,
                kind: StreamKind::Compute,
                items: vec![ScheduleItem::Run(name(r, &g)), ScheduleItem::Record(0)],
            },
            ScheduledStream {
                device: Device::gpu(0),
                kind: StreamKind::Compute,
                items: vec![ScheduleItem::Wait(0), ScheduleItem::Run(name(c, &g)), ScheduleItem::Run(name(n, &g))],
            },
        ],
        num_events: 1,
    });
    let out = TensorRef::of(&g, n);
    g.program_mut().fetches.insert("out".into(), out);
    lower(&g, &LowerOptions::new(Mode::Train, "two")).unwrap()
}

/// The output buffer of the stream's first launch.
fn launch_output(plan: &Plan, stream: usize) -> BufRef {
    plan.streams[stream]
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Launch { outputs, .. } => Some(outputs[0].clone()),
            _ => None,
        })
        .expect("a launch")
}

/// [`two_device_plan`] (out = -relu(x), relu on cpu:0, neg on gpu:0)
/// with an all-reduce of relu's output on cpu:0 before its event, and one of
/// the output at the end of gpu:0's stream: with world size W and inputs
/// x_r, Relu = Σ_r relu(x_r) and out = W · -(Σ_r relu(x_r)). The two
/// collectives run on different device threads, ordered by the event.
pub fn two_device_plan_with_all_reduce() -> Plan {
    let mut plan = two_device_plan();
    let (cpu, gpu) = (0, 1);
    assert!(matches!(plan.streams[cpu].steps.last(), Some(Step::Record(0))));
    let relu = launch_output(&plan, cpu);
    let out = plan.lookup("out").expect("out").clone();
    let at = plan.streams[cpu].steps.len() - 1;
    plan.streams[cpu].steps.insert(at, Step::AllReduce { buffers: vec![relu], node: "allreduce/relu".into() });
    plan.streams[gpu].steps.push(Step::AllReduce { buffers: vec![out], node: "allreduce/out".into() });
    plan
}

/// The CPU backend behind a backend that lends no feed memory (the trait's
/// default `with_feed_buffer`): what any other backend gets, so that
/// `Session::feed_with_*` falls back to its own scratch and `write_buffer`.
/// The second field, when set, is the kind of backend it says it is
/// (`Backend::kind`: e.g. a mixed session, for the load-time device check).
pub struct CopyingFeeds(pub towers_runtime::CpuBackend, pub Option<towers_runtime::devices::BackendKind>);

mod copying {
    use std::sync::Arc;

    use towers_codegen::{BufRef, Plan, VariableDecl};
    use towers_runtime::{Backend, BackendError, Comm, HostSlice, HostSliceMut, Profiled, ProgramId, Trace};

    impl Backend for super::CopyingFeeds {
        fn name(&self) -> &'static str {
            "copying"
        }
        fn create_variable(&mut self, decl: &VariableDecl, init: HostSlice<'_>) -> Result<(), BackendError> {
            self.0.create_variable(decl, init)
        }
        fn load(&mut self, name: &str, plan: &Plan, comm: Arc<dyn Comm>) -> Result<ProgramId, BackendError> {
            self.0.load(name, plan, comm)
        }
        fn run(&mut self, program: ProgramId) -> Result<(), BackendError> {
            self.0.run(program)
        }
        fn write_buffer(&mut self, program: ProgramId, buf: &BufRef, data: HostSlice<'_>) -> Result<(), BackendError> {
            self.0.write_buffer(program, buf, data)
        }
        fn read_buffer(&self, program: ProgramId, buf: &BufRef, out: HostSliceMut<'_>) -> Result<(), BackendError> {
            self.0.read_buffer(program, buf, out)
        }
        fn write_variable(&mut self, name: &str, data: HostSlice<'_>) -> Result<(), BackendError> {
            self.0.write_variable(name, data)
        }
        fn read_variable(&self, name: &str, out: HostSliceMut<'_>) -> Result<(), BackendError> {
            self.0.read_variable(name, out)
        }
        fn set_profiling(&mut self, program: ProgramId, on: bool) {
            self.0.set_profiling(program, on)
        }
        fn profile(&self, program: ProgramId) -> Vec<Profiled> {
            self.0.profile(program)
        }
        fn set_tracing(&mut self, program: ProgramId, on: bool) -> Result<(), BackendError> {
            self.0.set_tracing(program, on)
        }
        fn trace(&self, program: ProgramId) -> Result<Trace, BackendError> {
            self.0.trace(program)
        }
        fn steps_run(&self, program: ProgramId) -> u64 {
            self.0.steps_run(program)
        }
        fn set_step(&mut self, program: ProgramId, step: u64) {
            self.0.set_step(program, step)
        }
        fn device_note(&self, gpus: &[String]) -> String {
            self.0.device_note(gpus)
        }
        fn kind(&self) -> towers_runtime::devices::BackendKind {
            self.1.unwrap_or(towers_runtime::devices::BackendKind::Cpu)
        }
    }
}
