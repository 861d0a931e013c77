//! The plan verifier, one test per rule: each starts from a small valid plan
//! built by hand (two devices, a copy, a launch, an all-reduce, events) and
//! breaks it in exactly one way, then checks the exact error.

use towers_codegen::{
    verify, BinaryOp, BufRef, Buffer, BufferKind, ConstantDecl, ConvGeom, DevicePlan, Kernel, Mode, Plan, Step,
    StreamPlan, UnaryOp, VariableDecl,
};
use towers_graph::StreamKind;
use towers_graph::{DType, Device, Initializer, Padding};

fn buf(name: &str, dtype: DType, shape: &[usize], kind: BufferKind, offset: usize) -> Buffer {
    let bytes = shape.iter().product::<usize>() * 4;
    Buffer { name: name.into(), dtype, shape: shape.to_vec(), kind, offset, bytes }
}

fn var(name: &str, dtype: DType, shape: &[usize]) -> VariableDecl {
    VariableDecl {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        init: Initializer::Zeros,
        trainable: dtype == DType::F32,
        device: Device::CPU0,
        seed: None,
    }
}

const X: BufRef = BufRef::Arena { device: 0, buffer: 0 };
const X_GPU: BufRef = BufRef::Arena { device: 1, buffer: 0 };
const Y: BufRef = BufRef::Arena { device: 1, buffer: 1 };

fn w() -> BufRef {
    BufRef::Variable("w".into())
}

/// cpu:0 holds the feed `x` f32[2,3] (with a view of its first row) and a
/// constant; gpu:0 copies `x` in, computes `y = x · w` and all-reduces it;
/// cpu:0 increments the step after gpu:0 is done.
fn base() -> Plan {
    let cpu = DevicePlan {
        device: Device::CPU0,
        buffers: vec![
            buf("x", DType::F32, &[2, 3], BufferKind::Feed, 0),
            buf("x/row0", DType::F32, &[1, 3], BufferKind::View { of: 0 }, 0),
            buf("c", DType::F32, &[3], BufferKind::Constant, 64),
        ],
        arena_bytes: 128,
    };
    let gpu = DevicePlan {
        device: Device::gpu(0),
        buffers: vec![
            buf("x.gpu0", DType::F32, &[2, 3], BufferKind::Tensor, 0),
            buf("y", DType::F32, &[2, 2], BufferKind::Tensor, 64),
        ],
        arena_bytes: 128,
    };
    let stream = |device, kind, steps| StreamPlan { device, kind, steps };
    let matmul = Step::Launch {
        kernel: Kernel::MatMul { m: 2, n: 2, k: 3, trans_a: false, trans_b: false },
        inputs: vec![X_GPU, w()],
        outputs: vec![Y],
        workspace: None,
        node: "y".into(),
    };
    Plan {
        program: "train".into(),
        mode: Mode::Train,
        devices: vec![cpu, gpu],
        variables: vec![var("w", DType::F32, &[3, 2]), var("global_step", DType::I32, &[])],
        constants: vec![ConstantDecl { buffer: BufRef::Arena { device: 0, buffer: 2 }, data: vec![1.0, 2.0, 3.0] }],
        feeds: vec![("x".into(), X)],
        fetches: vec![("y".into(), Y)],
        tensors: vec![("x".into(), X), ("y".into(), Y)],
        streams: vec![
            stream(
                Device::CPU0,
                StreamKind::Compute,
                vec![
                    Step::Record(0),
                    Step::Wait(1),
                    Step::Launch {
                        kernel: Kernel::IncrementStep,
                        inputs: vec![],
                        outputs: vec![BufRef::Variable("global_step".into())],
                        workspace: None,
                        node: "inc".into(),
                    },
                ],
            ),
            stream(
                Device::gpu(0),
                StreamKind::Copy,
                vec![
                    Step::Wait(0),
                    Step::Copy { from: X, to: X_GPU, bytes: 24, node: "x.gpu0".into() },
                    Step::Record(2),
                ],
            ),
            stream(
                Device::gpu(0),
                StreamKind::Compute,
                vec![
                    Step::Wait(2),
                    matmul,
                    Step::AllReduce { buffers: vec![Y], node: "allreduce/y".into() },
                    Step::Record(1),
                ],
            ),
        ],
        num_events: 3,
        task: None,
        unread_feeds: Vec::new(),
    }
}

/// The error message of a plan broken by `f`.
fn err(f: impl FnOnce(&mut Plan)) -> String {
    let mut p = base();
    f(&mut p);
    verify(&p).expect_err("the broken plan verifies").to_string()
}

/// The gpu:0/compute stream's matmul launch.
fn launch(p: &mut Plan) -> (&mut Kernel, &mut Vec<BufRef>, &mut Vec<BufRef>, &mut Option<BufRef>) {
    match &mut p.streams[2].steps[1] {
        Step::Launch { kernel, inputs, outputs, workspace, .. } => (kernel, inputs, outputs, workspace),
        _ => unreachable!(),
    }
}

fn copy(p: &mut Plan) -> (&mut BufRef, &mut BufRef, &mut usize) {
    match &mut p.streams[1].steps[1] {
        Step::Copy { from, to, bytes, .. } => (from, to, bytes),
        _ => unreachable!(),
    }
}

fn all_reduce(p: &mut Plan) -> &mut Vec<BufRef> {
    match &mut p.streams[2].steps[2] {
        Step::AllReduce { buffers, .. } => buffers,
        _ => unreachable!(),
    }
}

#[test]
fn the_base_plan_verifies() {
    assert_eq!(verify(&base()), Ok(()));
}

// Devices, buffers, views.

#[test]
fn devices_are_distinct() {
    assert_eq!(err(|p| p.devices[1].device = Device::CPU0), "device cpu:0 is listed twice (devices 0 and 1)");
}

#[test]
fn buffer_bytes_are_shape_times_dtype_size() {
    assert_eq!(
        err(|p| p.devices[1].buffers[1].bytes = 12),
        "buffer 'y' on gpu:0 is f32[2,2], which is 16 B, but has 12 B"
    );
}

#[test]
fn sizes_that_overflow_are_rejected() {
    assert_eq!(
        err(|p| p.devices[1].buffers[1].shape = vec![usize::MAX, 2]),
        "buffer 'y' on gpu:0 has an element count or byte size that overflows"
    );
}

#[test]
fn offsets_are_aligned_to_the_element_size() {
    assert_eq!(
        err(|p| p.devices[1].buffers[1].offset = 66),
        "buffer 'y' on gpu:0 starts at byte 66, not a multiple of its f32 element size"
    );
}

#[test]
fn buffers_lie_inside_their_arena() {
    assert_eq!(
        err(|p| p.devices[1].buffers[1].offset = 120),
        "buffer 'y' on gpu:0 spans bytes 120..136, outside the device's 128 B arena"
    );
}

#[test]
fn arenas_have_no_unused_tail() {
    assert_eq!(
        err(|p| p.devices[1].arena_bytes = 1 << 40),
        "the arena of gpu:0 has 1099511627776 B but its buffers end at 80 B (at most 128 B with 64-byte alignment)"
    );
}

#[test]
fn a_view_views_an_existing_buffer() {
    assert_eq!(
        err(|p| p.devices[0].buffers[1].kind = BufferKind::View { of: 7 }),
        "view 'x/row0' on cpu:0 views buffer 7, which does not exist"
    );
}

#[test]
fn a_view_lies_inside_the_buffer_it_views() {
    assert_eq!(
        err(|p| p.devices[0].buffers[1].offset = 16),
        "view 'x/row0' on cpu:0 spans bytes 16..28, outside the buffer it views, 'x' (bytes 0..24)"
    );
}

// Variables, constants, feeds, fetches, tensors.

#[test]
fn variables_are_declared_once() {
    assert_eq!(err(|p| p.variables.push(var("w", DType::F32, &[3, 2]))), "variable 'w' is declared twice");
}

#[test]
fn constants_have_one_value_per_element() {
    assert_eq!(
        err(|p| p.constants[0].data.pop().map(drop).unwrap_or(())),
        "constant 'c': 2 values for a buffer of 3 elements"
    );
}

#[test]
fn feeds_name_feed_buffers() {
    assert_eq!(err(|p| p.feeds[0].1 = Y), "feed 'x': 'y' must be a feed buffer, but it is a tensor buffer");
}

#[test]
fn fetches_name_existing_devices() {
    assert_eq!(
        err(|p| p.fetches[0].1 = BufRef::Arena { device: 2, buffer: 0 }),
        "fetch 'y': device 2 does not exist (the plan has 2 devices)"
    );
}

#[test]
fn tensors_name_existing_buffers() {
    assert_eq!(
        err(|p| p.tensors[1].1 = BufRef::Arena { device: 1, buffer: 2 }),
        "tensor 'y': buffer 2 of gpu:0 does not exist (gpu:0 has 2 buffers)"
    );
}

// Streams and steps.

#[test]
fn streams_are_distinct() {
    assert_eq!(
        err(|p| p.streams[1].kind = StreamKind::Compute),
        "stream gpu:0/compute is listed twice (streams 1 and 2)"
    );
}

#[test]
fn streams_run_on_devices_of_the_plan() {
    assert_eq!(
        err(|p| p.streams[1].device = Device::gpu(1)),
        "stream gpu:1/copy runs on gpu:1, which is not a device of the plan"
    );
}

#[test]
fn launches_name_declared_variables() {
    assert_eq!(
        err(|p| launch(p).1[1] = BufRef::Variable("v".into())),
        "gpu:0/compute step 1 'y': variable 'v' is not declared"
    );
}

#[test]
fn launches_touch_only_their_streams_device() {
    assert_eq!(err(|p| launch(p).1[0] = X), "gpu:0/compute step 1 'y': 'x' is on cpu:0, not on the stream's device");
}

#[test]
fn launches_have_their_kernels_arity() {
    assert_eq!(err(|p| drop(launch(p).1.pop())), "gpu:0/compute step 1 'y': gemm takes 2 inputs (a, b), got 1");
}

#[test]
fn operand_sizes_follow_the_kernel_parameters() {
    assert_eq!(
        err(|p| *launch(p).0 = Kernel::MatMul { m: 2, n: 2, k: 4, trans_a: false, trans_b: false }),
        "gpu:0/compute step 1 'y': gemm input 0 (a) 'x.gpu0' has 6 elements, but the parameters need 8 (m*k = 2*4)"
    );
}

#[test]
fn operand_dtypes_follow_the_kernel() {
    assert_eq!(
        err(|p| p.variables[0].dtype = DType::I32),
        "gpu:0/compute step 1 'y': gemm input 1 (b) 'w' is i32[3,2], but the kernel needs f32"
    );
}

#[test]
fn kernel_parameters_are_consistent() {
    let add = Kernel::Binary { op: BinaryOp::Add, a_shape: vec![2, 3], b_shape: vec![2], out_shape: vec![2, 3] };
    assert_eq!(
        err(|p| *launch(p).0 = add),
        "gpu:0/compute step 1 'y': binary parameters are invalid: [2,3] and [2] do not broadcast to [2,3]"
    );
}

#[test]
fn a_convolution_has_its_workspace() {
    // x.gpu0 as 1x1x2x3 NHWC, w as a 1x1x3x2 filter, y as 1x1x2x2: a
    // pointwise convolution, which needs no workspace.
    let geom = ConvGeom {
        n: 1,
        h: 1,
        w: 2,
        c_in: 3,
        kh: 1,
        kw: 1,
        c_out: 2,
        stride_h: 1,
        stride_w: 1,
        padding: Padding::Valid,
    };
    let mut p = base();
    *launch(&mut p).0 = Kernel::Conv2D { geom, workspace_len: 0 };
    assert_eq!(verify(&p), Ok(()));
    assert_eq!(
        err(|p| *launch(p).0 = Kernel::Conv2D { geom, workspace_len: 5 }),
        "gpu:0/compute step 1 'y': conv2d parameters are invalid: workspace_len 5 is not the geometry's workspace of 0 f32 elements"
    );
    // A workspace handed to a kernel that needs none is refused, naming it.
    let pointwise = Kernel::Conv2D { geom, workspace_len: 0 };
    assert_eq!(
        err(|p| (*launch(p).0, *launch(p).3) = (pointwise, Some(X_GPU))),
        "gpu:0/compute step 1 'y': conv2d needs a workspace of 0 f32 elements, got 'x.gpu0' (f32[2,3], 6 elements)"
    );
}

#[test]
fn a_launch_never_writes_what_it_reads() {
    let relu = |p: &mut Plan| {
        let (kernel, inputs, outputs, _) = launch(p);
        *kernel = Kernel::Unary { op: UnaryOp::Relu };
        *inputs = vec![Y];
        *outputs = vec![Y];
    };
    assert_eq!(err(relu), "gpu:0/compute step 1 'y': the launch writes 'y' and also reads 'y', which overlaps it");
}

#[test]
fn copies_have_equal_sizes() {
    assert_eq!(
        err(|p| *copy(p).2 = 20),
        "gpu:0/copy step 1 'x.gpu0': copy of 20 B from 'x' (24 B) to 'x.gpu0' (24 B): the sizes differ"
    );
}

#[test]
fn copies_keep_the_dtype() {
    assert_eq!(
        err(|p| p.devices[1].buffers[0].dtype = DType::I32),
        "gpu:0/copy step 1 'x.gpu0': copy from 'x' (f32) to 'x.gpu0' (i32): the dtypes differ"
    );
}

#[test]
fn copies_do_not_overlap() {
    assert_eq!(
        err(|p| *copy(p).1 = X),
        "gpu:0/copy step 1 'x.gpu0': copy from 'x' to 'x': source and destination overlap"
    );
}

#[test]
fn all_reduce_groups_are_not_empty() {
    assert_eq!(err(|p| all_reduce(p).clear()), "gpu:0/compute step 2 'allreduce/y': all-reduce over an empty group");
}

#[test]
fn all_reduce_groups_are_f32() {
    assert_eq!(err(|p| all_reduce(p).push(BufRef::Variable("global_step".into()))), "gpu:0/compute step 2 'allreduce/y': all-reduce of 'global_step', which is i32: all-reduce sums f32 buffers only");
}

#[test]
fn all_reduce_groups_are_distinct() {
    assert_eq!(
        err(|p| all_reduce(p).push(Y)),
        "gpu:0/compute step 2 'allreduce/y': all-reduce group names 'y' and 'y', which overlap"
    );
}

// Events.

#[test]
fn events_are_in_range() {
    assert_eq!(
        err(|p| p.streams[2].steps[0] = Step::Wait(3)),
        "gpu:0/compute step 0 (wait e3): event e3 does not exist (the plan has 3 events)"
    );
}

#[test]
fn events_are_recorded_once() {
    assert_eq!(
        err(|p| p.streams[1].steps.push(Step::Record(0))),
        "event e0 is recorded twice: at cpu:0/compute step 0 (record e0) and at gpu:0/copy step 3 (record e0)"
    );
}

#[test]
fn waits_have_a_record() {
    assert_eq!(
        err(|p| {
            p.num_events = 4;
            p.streams[2].steps[0] = Step::Wait(3);
        }),
        "gpu:0/compute step 0 (wait e3): waits on e3, which no stream records"
    );
}

#[test]
fn every_event_is_recorded() {
    assert_eq!(
        err(|p| p.num_events = usize::MAX),
        "event e3 is never recorded (each of the plan's 18446744073709551615 events is recorded exactly once)"
    );
}

#[test]
fn the_event_graph_does_not_deadlock() {
    // cpu:0 waits for gpu:0 before recording what gpu:0's copy waits for.
    assert_eq!(err(|p| p.streams[0].steps.swap(0, 1)), "the streams deadlock: stuck at cpu:0/compute step 0 (wait e1), gpu:0/copy step 0 (wait e0), gpu:0/compute step 0 (wait e2)");
}

// Kernel parameters, a few kernels at a time: the base launch's operands are
// x.gpu0 f32[2,3] and w f32[3,2] in, y f32[2,2] out.

/// The base plan with its matmul replaced.
fn with_launch(kernel: Kernel, inputs: Vec<BufRef>, outputs: Vec<BufRef>) -> impl FnOnce(&mut Plan) {
    move |p: &mut Plan| {
        for n in ["w/m", "w/v"] {
            p.variables.push(var(n, DType::F32, &[3, 2]));
        }
        let (k, i, o, _) = launch(p);
        (*k, *i, *o) = (kernel, inputs, outputs);
    }
}

fn v(n: &str) -> BufRef {
    BufRef::Variable(n.into())
}

#[test]
fn softmax_classes_divide_the_rows() {
    assert_eq!(
        err(with_launch(Kernel::Softmax { classes: 0 }, vec![X_GPU], vec![Y])),
        "gpu:0/compute step 1 'y': softmax parameters are invalid: classes is 0"
    );
    assert_eq!(
        err(with_launch(Kernel::Softmax { classes: 3 }, vec![X_GPU], vec![Y])),
        "gpu:0/compute step 1 'y': softmax output 0 (y) 'y' has 4 elements, but the parameters need 6 (the length of input 0 (x))"
    );
}

#[test]
fn pool_windows_and_strides_are_positive() {
    use towers_codegen::PoolGeom;
    let geom = PoolGeom { n: 1, h: 2, w: 3, c: 1, kh: 2, kw: 2, stride_h: 0, stride_w: 1, padding: Padding::Same };
    assert_eq!(
        err(with_launch(Kernel::MaxPool { geom }, vec![X_GPU], vec![Y])),
        "gpu:0/compute step 1 'y': max_pool parameters are invalid: window 2 with stride 0: both must be at least 1"
    );
}

#[test]
fn concat_axes_are_in_range() {
    let k = Kernel::Concat { axis: 2, shapes: vec![vec![2, 3], vec![3, 2]] };
    assert_eq!(
        err(with_launch(k, vec![X_GPU, w()], vec![Y])),
        "gpu:0/compute step 1 'y': concat parameters are invalid: axis 2 is out of range for rank 2"
    );
}

#[test]
fn argmax_writes_i32() {
    let k = Kernel::ArgMax { shape: vec![2, 3], axis: 1 };
    assert_eq!(
        err(with_launch(k, vec![X_GPU], vec![Y])),
        "gpu:0/compute step 1 'y': argmax output 0 (indices) 'y' is f32[2,2], but the kernel needs i32"
    );
}

#[test]
fn adam_reads_an_i32_global_step() {
    let k = Kernel::ApplyAdam { beta1: 0.9, beta2: 0.999, epsilon: 1e-8 };
    assert_eq!(
        err(with_launch(k, vec![X_GPU, Y, Y], vec![w(), v("w/m"), v("w/v")])),
        "gpu:0/compute step 1 'y': apply_adam input 1 (global_step) 'y' is f32[2,2], but the kernel needs i32"
    );
}

#[test]
fn mean_apply_reads_one_gradient_per_weight() {
    let apply = Box::new(Kernel::ApplyMomentum { momentum: 0.9, nesterov: false });
    let k = Kernel::MeanApply { weights: vec![0.5, 0.5], apply };
    // Two gradients and the learning rate.
    assert_eq!(
        err(with_launch(k, vec![X_GPU], vec![w(), v("w/m")])),
        "gpu:0/compute step 1 'y': mean_apply takes 3 inputs (grad_0, grad_1, lr), got 1"
    );
}

#[test]
fn mean_apply_fuses_only_optimizer_updates() {
    let k = Kernel::MeanApply { weights: vec![1.0], apply: Box::new(Kernel::L2Loss) };
    assert_eq!(
        err(with_launch(k, vec![X_GPU], vec![w()])),
        "gpu:0/compute step 1 'y': mean_apply parameters are invalid: l2_loss is not an optimizer update"
    );
}

/// A folded tower product: one (a, b) pair per weight, each pair's k its
/// own. Base operands: x.gpu0 f32[2,3], w f32[3,2] in, y f32[2,2] out.
#[test]
fn a_tower_matmul_has_one_pair_per_weight() {
    let k = |ks: Vec<usize>, weights: Vec<f32>| Kernel::TowerMatMul {
        m: 2,
        n: 2,
        ks,
        trans_a: false,
        trans_b: false,
        weights,
    };
    let ok = |p: &mut Plan| {
        let (kernel, i, o, _) = launch(p);
        (*kernel, *i, *o) = (k(vec![3, 3], vec![0.5, 0.5]), vec![X_GPU, w(), X_GPU, w()], vec![Y]);
    };
    let mut p = base();
    ok(&mut p);
    towers_codegen::verify(&p).expect("two pairs of k = 3 verify");
    assert_eq!(
        err(with_launch(k(vec![3, 3], vec![0.5, 0.5]), vec![X_GPU, w()], vec![Y])),
        "gpu:0/compute step 1 'y': gemm_tower_mean takes 4 inputs (a_0, b_0, a_1, b_1), got 2"
    );
    assert_eq!(
        err(with_launch(k(vec![3], vec![0.5, 0.5]), vec![X_GPU, w()], vec![Y])),
        "gpu:0/compute step 1 'y': gemm_tower_mean parameters are invalid: 1 k's for 2 weights (one pair per replica, at least one)"
    );
    assert_eq!(
        err(with_launch(k(vec![3, 4], vec![0.5, 0.5]), vec![X_GPU, w(), X_GPU, w()], vec![Y])),
        "gpu:0/compute step 1 'y': gemm_tower_mean input 2 (a_1) 'x.gpu0' has 6 elements, but the parameters need 8 (pair 1: m*k = 2*4)"
    );
}

// Buffers that share bytes (memory reuse): allowed only between buffers
// whose uses are ordered by the streams and events, never for feeds,
// constants or fetches.

/// A gpu:0 tensor 'z' f32[2,2] at offset 0 (over 'x.gpu0'), filled by a
/// launch inserted at step `index` of stream `stream`.
fn with_z(stream: usize, index: usize) -> impl FnOnce(&mut Plan) {
    move |p: &mut Plan| {
        p.devices[1].buffers.push(buf("z", DType::F32, &[2, 2], BufferKind::Tensor, 0));
        let fill = Step::Launch {
            kernel: Kernel::Fill { value: 1.0 },
            inputs: vec![],
            outputs: vec![BufRef::Arena { device: 1, buffer: 2 }],
            workspace: None,
            node: "z".into(),
        };
        p.streams[stream].steps.insert(index, fill);
    }
}

#[test]
fn buffers_share_bytes_when_every_use_of_one_comes_before_the_other() {
    // 'z' is filled on gpu:0/compute after the matmul, the last reader of 'x.gpu0'.
    let mut p = base();
    with_z(2, 2)(&mut p);
    assert_eq!(verify(&p), Ok(()));
}

#[test]
fn buffers_that_share_bytes_are_never_live_at_once() {
    // 'z' is filled on gpu:0/copy right after 'x.gpu0' is copied in, while
    // gpu:0/compute may still be reading 'x.gpu0' (and the copy stream has
    // written it before): neither buffer's uses all come first.
    assert_eq!(
        err(with_z(1, 2)),
        "buffers 'x.gpu0' and 'z' on gpu:0 share bytes 0..16 but may be live at once: \
         gpu:0/compute step 1 'y' ('x.gpu0') is not before gpu:0/copy step 2 'z' ('z'), and \
         gpu:0/copy step 2 'z' ('z') is not before gpu:0/copy step 1 'x.gpu0' ('x.gpu0')"
    );
}

#[test]
fn a_views_uses_are_uses_of_the_buffer_it_views() {
    // 'z' is filled after the matmul, the last reader of 'x.gpu0' itself,
    // but a launch after it reads a view of 'x.gpu0'.
    let e = err(|p| {
        with_z(2, 2)(p);
        p.devices[1].buffers.push(buf("x.gpu0/row1", DType::F32, &[1, 3], BufferKind::View { of: 0 }, 12));
        p.devices[1].buffers.push(buf("r", DType::F32, &[1, 3], BufferKind::Tensor, 96));
        let relu = Step::Launch {
            kernel: Kernel::Unary { op: UnaryOp::Relu },
            inputs: vec![BufRef::Arena { device: 1, buffer: 3 }],
            outputs: vec![BufRef::Arena { device: 1, buffer: 4 }],
            workspace: None,
            node: "r".into(),
        };
        p.streams[2].steps.insert(3, relu);
    });
    assert_eq!(
        e,
        "buffers 'x.gpu0' and 'z' on gpu:0 share bytes 0..16 but may be live at once: \
         gpu:0/compute step 3 'r' ('x.gpu0') is not before gpu:0/compute step 2 'z' ('z'), and \
         gpu:0/compute step 2 'z' ('z') is not before gpu:0/copy step 1 'x.gpu0' ('x.gpu0')"
    );
}

#[test]
fn fetched_buffers_keep_their_bytes_for_the_whole_step() {
    // 'z' would be ordered after 'y' (filled after the all-reduce), but 'y'
    // is fetched: it is read after the step.
    assert_eq!(
        err(|p| {
            with_z(2, 3)(p);
            p.devices[1].buffers[2].offset = 64;
        }),
        "buffer 'y' on gpu:0 is fetched as 'y' and keeps its bytes for the whole step, but shares bytes 64..80 with 'z'"
    );
}

#[test]
fn feeds_keep_their_bytes_for_the_whole_step() {
    assert_eq!(
        err(|p| p.devices[0].buffers.push(buf("t", DType::F32, &[2], BufferKind::Tensor, 16))),
        "buffer 'x' on cpu:0 is a feed and keeps its bytes for the whole step, but shares bytes 16..24 with 't'"
    );
}

#[test]
fn a_copy_source_lives_until_its_destination_is_read() {
    // gpu:0 copies a cpu:0 tensor 's' (instead of the feed) into 'x.gpu0'
    // and records e3 after the copy; cpu:0 waits on e3 and fills 'u' in the
    // bytes of 's'. The copy itself happens before 'u', but the matmul's
    // read of 'x.gpu0' does not, and the CPU backend elides copies: that
    // read is a read of 's'.
    let e = err(|p| {
        p.devices[0].buffers.push(buf("s", DType::F32, &[2, 3], BufferKind::Tensor, 128));
        p.devices[0].buffers.push(buf("u", DType::F32, &[2, 2], BufferKind::Tensor, 128));
        p.devices[0].arena_bytes = 192;
        p.num_events = 4;
        *copy(p).0 = BufRef::Arena { device: 0, buffer: 3 };
        p.streams[1].steps.push(Step::Record(3));
        let fill = |b: usize, node: &str| Step::Launch {
            kernel: Kernel::Fill { value: 1.0 },
            inputs: vec![],
            outputs: vec![BufRef::Arena { device: 0, buffer: b }],
            workspace: None,
            node: node.into(),
        };
        p.streams[0].steps.insert(0, fill(3, "s"));
        p.streams[0].steps.insert(2, Step::Wait(3));
        p.streams[0].steps.insert(3, fill(4, "u"));
    });
    assert_eq!(
        e,
        "buffers 's' and 'u' on cpu:0 share bytes 128..144 but may be live at once: \
         gpu:0/compute step 1 'y' ('s') is not before cpu:0/compute step 3 'u' ('u'), and \
         cpu:0/compute step 3 'u' ('u') is not before cpu:0/compute step 0 's' ('s')"
    );
}

#[test]
fn multi_apply_reads_one_gradient_per_member() {
    let apply = Box::new(Kernel::ApplyMomentum { momentum: 0.9, nesterov: false });
    let k = Kernel::MultiApply { apply, count: 2 };
    // Two gradients and the learning rate; each member's variable and accumulator.
    assert_eq!(
        err(with_launch(k, vec![X_GPU], vec![w(), v("w/m")])),
        "gpu:0/compute step 1 'y': multi_apply takes 3 inputs (grad_0, grad_1, lr), got 1"
    );
}

#[test]
fn multi_apply_members_match_their_variables() {
    let apply = Box::new(Kernel::ApplyMomentum { momentum: 0.9, nesterov: false });
    let k = Kernel::MultiApply { apply, count: 2 };
    assert_eq!(
        err(with_launch(k, vec![X_GPU, Y, Y], vec![w(), v("w/m"), w(), v("w/m")])),
        "gpu:0/compute step 1 'y': multi_apply input 1 (grad_1) 'y' has 4 elements, but the parameters need 6 (the length of output 2 (var_1))"
    );
    let k = Kernel::MultiApply { apply: Box::new(Kernel::L2Loss), count: 1 };
    assert_eq!(
        err(with_launch(k, vec![X_GPU], vec![w()])),
        "gpu:0/compute step 1 'y': multi_apply parameters are invalid: l2_loss is not an optimizer update"
    );
}

#[test]
fn fused_inputs_broadcast_to_the_output() {
    let expr: towers_graph::FusedExpr = "ew[$0;$1;add:0:1;relu:2]".parse().unwrap();
    let k = Kernel::Fused { expr: expr.clone(), in_shapes: vec![vec![2, 3], vec![2, 2]], out_shape: vec![2, 3] };
    assert_eq!(
        err(with_launch(k, vec![X_GPU, Y], vec![X_GPU])),
        "gpu:0/compute step 1 'y': fused_elementwise parameters are invalid: inputs [2,3], [2,2] do not broadcast to [2,3]"
    );
    let k = Kernel::Fused { expr, in_shapes: vec![vec![2, 3]], out_shape: vec![2, 3] };
    assert_eq!(
        err(with_launch(k, vec![X_GPU], vec![Y])),
        "gpu:0/compute step 1 'y': fused_elementwise parameters are invalid: 1 input shapes for an expression of 2 inputs"
    );
}

/// An expression read from JSON is checked like one built in memory: a step
/// that reads a later step is refused before any kernel runs it.
#[test]
fn fused_expressions_from_json_are_checked() {
    let expr: towers_graph::FusedExpr = "ew[$0;$1;add:0:1]".parse().unwrap();
    let k = Kernel::Fused { expr, in_shapes: vec![vec![2, 3], vec![2, 3]], out_shape: vec![2, 3] };
    let json = serde_json::to_string(&k).unwrap().replace(r#"["Add",0,1]"#, r#"["Add",0,5]"#);
    let bad: Kernel = serde_json::from_str(&json).expect("the JSON parses");
    assert_eq!(
        err(with_launch(bad, vec![X_GPU, X_GPU], vec![Y])),
        "gpu:0/compute step 1 'y': fused_elementwise parameters are invalid: fused elementwise kernel: step 2 reads step 5, which is not an earlier step"
    );
}

/// A count near `usize::MAX` (a mutated plan) is an error, not an overflow.
#[test]
fn multi_apply_counts_that_overflow_are_rejected() {
    let apply = Box::new(Kernel::ApplyAdam { beta1: 0.9, beta2: 0.999, epsilon: 1e-8 });
    let k = Kernel::MultiApply { apply, count: usize::MAX };
    assert_eq!(
        err(with_launch(k, vec![X_GPU], vec![w()])),
        "gpu:0/compute step 1 'y': multi_apply parameters are invalid: count + shared inputs overflows"
    );
}

// array ops (issue 22)
#[test]
fn array_kernels_check_index_dtypes_permutations_and_counts() {
    let k = Kernel::Gather { outer: 1, limit: 2, inner: 2, count: 2 };
    let e = err(with_launch(k, vec![X_GPU, Y], vec![Y]));
    assert!(e.ends_with("gather input 1 (indices) 'y' is f32[2,2], but the kernel needs i32"), "{e}");
    let k = Kernel::Transpose { shape: vec![2, 2], perm: vec![0, 0] };
    let e = err(with_launch(k, vec![X_GPU], vec![Y]));
    assert!(e.contains("transpose parameters are invalid: perm") && e.contains("is not a permutation"), "{e}");
    // x.gpu0 is f32[2,3], y f32[2,2].
    let k = Kernel::Tile { shape: vec![2, 3], multiples: vec![1, 2] };
    let e = err(with_launch(k, vec![X_GPU], vec![Y]));
    assert!(e.contains("tile output 0 (y) 'y' has 4 elements, but the parameters need 12"), "{e}");
    let k = Kernel::Pad { shape: vec![2, 2], before: vec![1, 0], out_shape: vec![2, 2], value: 0.0 };
    let e = err(with_launch(k, vec![X_GPU], vec![Y]));
    assert!(e.contains("pad parameters are invalid") && e.contains("is not inside"), "{e}");
}

// The operands are declared once, by `Kernel::signature`: every mismatch
// names the operand by index and by its name in the signature.
#[test]
fn a_wrong_arity_lists_the_operands_by_name() {
    let k = Kernel::SparseSoftmaxXent { classes: 3 };
    assert_eq!(
        err(with_launch(k, vec![X_GPU, v("global_step")], vec![Y])),
        "gpu:0/compute step 1 'y': sparse_softmax_xent takes 2 outputs (loss, backprop), got 1"
    );
}

#[test]
fn a_wrong_dtype_names_the_operand() {
    // x.gpu0 f32[2,3] as logits of 3 classes: the labels must be i32.
    let k = Kernel::SparseSoftmaxXent { classes: 3 };
    assert_eq!(
        err(with_launch(k, vec![X_GPU, Y], vec![Y, X_GPU])),
        "gpu:0/compute step 1 'y': sparse_softmax_xent input 1 (labels) 'y' is f32[2,2], but the kernel needs i32"
    );
}

#[test]
fn a_wrong_size_names_the_operand_and_the_rule() {
    // Two rows of logits need two labels, not one.
    let k = Kernel::SparseSoftmaxXent { classes: 3 };
    assert_eq!(
        err(with_launch(k, vec![X_GPU, v("global_step")], vec![Y, X_GPU])),
        "gpu:0/compute step 1 'y': sparse_softmax_xent input 1 (labels) 'global_step' has 1 elements, but the parameters need 2 (one label per row)"
    );
    // x.gpu0 has 6 elements: not rows of 4 channels.
    let k = Kernel::BiasAdd { channels: 4 };
    assert_eq!(
        err(with_launch(k, vec![X_GPU, Y], vec![Y])),
        "gpu:0/compute step 1 'y': bias_add parameters are invalid: input 0 (x) 'x.gpu0' has 6 elements, not a multiple of channels 4"
    );
}

/// A reduce to one rank (`--variables ps`) obeys the all-reduce's rules.
#[test]
fn reduce_groups_follow_the_all_reduce_rules() {
    let to_root = |p: &mut Plan| {
        let step = &mut p.streams[2].steps[2];
        let Step::AllReduce { buffers, node } = step.clone() else { unreachable!() };
        *step = Step::Reduce { root: 1, buffers, node };
    };
    let mut p = base();
    to_root(&mut p);
    assert_eq!(verify(&p), Ok(()));
    fn reduce(p: &mut Plan) -> &mut Vec<BufRef> {
        match &mut p.streams[2].steps[2] {
            Step::Reduce { buffers, .. } => buffers,
            _ => unreachable!(),
        }
    }
    let err_reduce = |f: &dyn Fn(&mut Plan)| {
        let mut p = base();
        to_root(&mut p);
        f(&mut p);
        verify(&p).expect_err("the broken plan verifies").to_string()
    };
    assert_eq!(
        err_reduce(&|p| reduce(p).clear()),
        "gpu:0/compute step 2 'allreduce/y': all-reduce over an empty group"
    );
    assert!(err_reduce(&|p| reduce(p).push(BufRef::Variable("global_step".into()))).contains("sums f32 buffers only"));
    assert!(err_reduce(&|p| reduce(p).push(Y)).contains("which overlap"));
    // The plan text names the root.
    let mut p = base();
    to_root(&mut p);
    assert!(p.to_text().contains("reduce→rank 1 sum over ranks"), "{}", p.to_text());
}
