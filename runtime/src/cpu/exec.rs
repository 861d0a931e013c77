//! Dispatch of one launch to its CPU kernel. Everything a kernel needs was
//! computed by codegen and resolved at load; this file only builds the
//! kernels' parameter structs (plain copies) and calls. It allocates nothing
//! on success; an error message is built only on failure.

use towers_codegen::{kernel_padding, BinaryKind, ConvGeom, Kernel, PoolGeom, UnaryKind};
use towers_graph::DType;
use towers_kernels::elementwise::{self as ew, BinaryOp, UnaryOp};
use towers_kernels::{batchnorm, conv, gemm, layout, misc, optim, pool, random, reduce, softmax};

use crate::prepare::Launch;

fn conv_p(g: &ConvGeom) -> conv::Conv2d {
    conv::Conv2d {
        n: g.n,
        h: g.h,
        w: g.w,
        c_in: g.c_in,
        kh: g.kh,
        kw: g.kw,
        c_out: g.c_out,
        stride_h: g.stride_h,
        stride_w: g.stride_w,
        padding: kernel_padding(g.padding),
        threads: 1,
    }
}

fn pool_p(g: &PoolGeom) -> pool::Pool2d {
    pool::Pool2d {
        n: g.n,
        h: g.h,
        w: g.w,
        c: g.c,
        kh: g.kh,
        kw: g.kw,
        stride_h: g.stride_h,
        stride_w: g.stride_w,
        padding: kernel_padding(g.padding),
    }
}

fn unary_op(k: UnaryKind) -> UnaryOp {
    match k {
        UnaryKind::Neg => UnaryOp::Neg,
        UnaryKind::Relu => UnaryOp::Relu,
        UnaryKind::Sigmoid => UnaryOp::Sigmoid,
        UnaryKind::Tanh => UnaryOp::Tanh,
    }
}

/// Elements per block of a fused reduction + update: the reduced gradient
/// of one block lives in a stack buffer (16 KiB, in L1), never in memory.
const MEAN_BLOCK: usize = 4096;

/// `MeanApply`: per block, the towers' weighted gradient into scratch, then
/// the optimizer update of that block of the variable and its slots.
///
/// # Safety
/// As [`dispatch`].
unsafe fn mean_apply(
    weights: &[f32],
    apply: &Kernel,
    ins: &[crate::prepare::Buf],
    outs: &[crate::prepare::Buf],
    slices: &mut crate::mem::SliceList<f32>,
) -> Result<(), String> {
    let n = weights.len();
    let len = outs[0].slot.len();
    let mut scratch = [0f32; MEAN_BLOCK];
    let step = match apply {
        Kernel::ApplyAdam { .. } => ins.get(n).map(|b| b.slot.i32().first().copied().unwrap_or(0).max(0) as u64 + 1),
        _ => None,
    };
    let mut start = 0;
    while start < len {
        let end = (start + MEAN_BLOCK).min(len);
        let g = &mut scratch[..end - start];
        slices.with(ins[..n].iter().map(|b| &b.slot.f32()[start..end]), |xs| misc::weighted_sum(xs, weights, g));
        let o = |k: usize| &mut outs[k].slot.f32_mut()[start..end];
        match apply {
            Kernel::ApplyGradientDescent { lr } => optim::apply_gradient_descent(o(0), g, *lr),
            Kernel::ApplyMomentum { lr, momentum, nesterov } => {
                optim::apply_momentum(o(0), o(1), g, *lr, *momentum, *nesterov)
            }
            Kernel::ApplyAdam { lr, beta1, beta2, epsilon } => {
                optim::apply_adam(o(0), o(1), o(2), g, *lr, *beta1, *beta2, *epsilon, step.unwrap_or(1))
            }
            other => return Err(format!("mean_apply cannot fuse into {}", other.name())),
        }
        start = end;
    }
    Ok(())
}

/// Run one launch. `step` is the program's 0-based run count (dropout's stream).
///
/// # Safety
/// The module invariant of [`crate::mem`]: no other thread touches the
/// launch's outputs, and its inputs are not written meanwhile.
pub unsafe fn dispatch(l: &mut Launch, step: u64) -> Result<(), String> {
    let Launch { kernel, ins, outs, ws, slices, shapes, mut_slices, .. } = l;
    let i = |k: usize| ins[k].slot.f32();
    let ii = |k: usize| ins[k].slot.i32();
    let o = |k: usize| outs[k].slot.f32_mut();
    let err = |e: towers_kernels::KernelError| e.to_string();
    match kernel {
        Kernel::MatMul { m, n, k, trans_a, trans_b } => {
            let p = gemm::MatMul::new(*m, *k, *n).trans_a(*trans_a).trans_b(*trans_b);
            gemm::matmul(&p, i(0), i(1), o(0));
        }
        Kernel::Binary { op, a_shape, b_shape, .. } => {
            let op = match op {
                BinaryKind::Add => BinaryOp::Add,
                BinaryKind::Sub => BinaryOp::Sub,
                BinaryKind::Mul => BinaryOp::Mul,
                BinaryKind::Div => BinaryOp::Div,
            };
            ew::binary(op, i(0), a_shape, i(1), b_shape, o(0)).map_err(err)?;
        }
        Kernel::AddN { .. } => slices.with(ins.iter().map(|b| b.slot.f32()), |xs| misc::add_n(xs, o(0))),
        Kernel::WeightedSum { weights } => {
            slices.with(ins.iter().map(|b| b.slot.f32()), |xs| misc::weighted_sum(xs, weights, o(0)))
        }
        Kernel::BiasAdd { .. } => ew::bias_add(i(0), i(1), o(0)),
        Kernel::BiasAddGrad { .. } => ew::bias_add_grad(i(0), o(0)),
        Kernel::Unary { op } => ew::unary(unary_op(*op), i(0), o(0)),
        Kernel::UnaryGrad { op } => match op {
            UnaryKind::Relu => ew::relu_grad(i(0), i(1), o(0)),
            UnaryKind::Sigmoid => ew::sigmoid_grad(i(0), i(1), o(0)),
            UnaryKind::Tanh => ew::tanh_grad(i(0), i(1), o(0)),
            UnaryKind::Neg => ew::scale(i(0), -1.0, o(0)),
        },
        Kernel::Conv2D { geom, .. } => conv::conv2d(&conv_p(geom), i(0), i(1), o(0), ws_f32(ws)),
        Kernel::Conv2DBackpropInput { geom, .. } => {
            conv::conv2d_backprop_input(&conv_p(geom), i(0), i(1), o(0), ws_f32(ws))
        }
        Kernel::Conv2DBackpropFilter { geom, .. } => {
            conv::conv2d_backprop_filter(&conv_p(geom), i(0), i(1), o(0), ws_f32(ws))
        }
        Kernel::MaxPool { geom } => pool::max_pool(&pool_p(geom), i(0), o(0)),
        Kernel::MaxPoolGrad { geom } => pool::max_pool_grad(&pool_p(geom), i(0), i(1), i(2), o(0)),
        Kernel::AvgPool { geom } => pool::avg_pool(&pool_p(geom), i(0), o(0)),
        Kernel::AvgPoolGrad { geom } => pool::avg_pool_grad(&pool_p(geom), i(0), o(0)),
        Kernel::Concat { axis, shapes: s } => {
            let out = o(0);
            slices
                .with(ins.iter().map(|b| b.slot.f32()), |xs| {
                    shapes.with(s.iter().map(|d| d.as_slice()), |ss| layout::concat(xs, ss, *axis, out))
                })
                .map_err(err)?;
        }
        Kernel::Split { axis, shape, sizes } => {
            let x = i(0);
            mut_slices
                .with(outs.iter().map(|b| b.slot.f32_mut()), |ys| layout::split(x, shape, *axis, sizes, ys))
                .map_err(err)?;
        }
        Kernel::Slice { shape, begin, size } => layout::slice(i(0), shape, begin, size, o(0)).map_err(err)?,
        Kernel::SliceGrad { shape, begin, size } => layout::slice_grad(i(0), shape, begin, size, o(0)).map_err(err)?,
        Kernel::BroadcastTo { x_shape, out_shape } => ew::broadcast_to(i(0), x_shape, o(0), out_shape).map_err(err)?,
        Kernel::SumTo { x_shape, out_shape } => ew::sum_to_shape(i(0), x_shape, o(0), out_shape).map_err(err)?,
        Kernel::Softmax { classes } => softmax::softmax(i(0), *classes, o(0)),
        Kernel::LogSoftmax { classes } => softmax::log_softmax(i(0), *classes, o(0)),
        Kernel::SoftmaxGrad { classes } => softmax::softmax_grad(i(0), i(1), *classes, o(0)),
        Kernel::LogSoftmaxGrad { classes } => softmax::log_softmax_grad(i(0), i(1), *classes, o(0)),
        Kernel::SparseSoftmaxXent { classes } => {
            softmax::sparse_softmax_cross_entropy(i(0), ii(1), *classes, o(0), o(1)).map_err(err)?
        }
        Kernel::SoftmaxXent { classes } => softmax::softmax_cross_entropy(i(0), i(1), *classes, o(0), o(1)),
        Kernel::L2Loss => o(0)[0] = misc::l2_loss(i(0)),
        Kernel::ReduceSum { shape, axes } => reduce::reduce_sum(i(0), shape, axes, o(0)).map_err(err)?,
        Kernel::ReduceMean { shape, axes } => reduce::reduce_mean(i(0), shape, axes, o(0)).map_err(err)?,
        Kernel::ArgMax { shape, axis } => reduce::argmax(i(0), shape, *axis, outs[0].slot.i32_mut()).map_err(err)?,
        Kernel::Equal { dtype } => {
            let out = outs[0].slot.i32_mut();
            if *dtype == DType::F32 {
                out.iter_mut().zip(i(0).iter().zip(i(1))).for_each(|(r, (a, b))| *r = (a == b) as i32);
            } else {
                out.iter_mut().zip(ii(0).iter().zip(ii(1))).for_each(|(r, (a, b))| *r = (a == b) as i32);
            }
        }
        Kernel::Cast { from, to } => cast(*from, *to, ins[0].slot, outs[0].slot),
        Kernel::Dropout { keep_prob, seed, elem_offset } => {
            dropout_at(i(0), *keep_prob, *seed, step, *elem_offset, o(0), o(1))
        }
        Kernel::Fill { value } => o(0).fill(*value),
        Kernel::BatchNormTrain { epsilon, .. } => {
            let (y, mean, inv_std, var) = (o(0), o(1), o(2), o(3));
            batchnorm::batch_norm_train(i(0), i(1), i(2), *epsilon, y, mean, var, inv_std);
            // The op's batch_var is unbiased; the kernel's is biased.
            let c = mean.len().max(1);
            let rows = i(0).len() / c;
            if rows > 1 {
                ew::scale_inplace(var, rows as f32 / (rows - 1) as f32);
            }
        }
        Kernel::BatchNormInfer { epsilon, .. } => {
            batchnorm::batch_norm_infer(i(0), i(1), i(2), i(3), i(4), *epsilon, o(0));
            o(1).copy_from_slice(i(3));
            o(3).copy_from_slice(i(4));
            o(2).iter_mut().zip(i(4)).for_each(|(s, v)| *s = 1.0 / (v + *epsilon).sqrt());
        }
        Kernel::BatchNormGrad { .. } => batchnorm::batch_norm_grad(i(0), i(1), i(2), i(3), i(4), o(0), o(1), o(2)),
        Kernel::AssignMovingAverage { decay } => {
            o(0).iter_mut().zip(i(0)).for_each(|(v, x)| *v = *v * *decay + *x * (1.0 - *decay));
        }
        Kernel::MeanApply { weights, apply } => mean_apply(weights, apply, ins, outs, slices)?,
        Kernel::ApplyGradientDescent { lr } => optim::apply_gradient_descent(o(0), i(0), *lr),
        Kernel::ApplyMomentum { lr, momentum, nesterov } => {
            optim::apply_momentum(o(0), o(1), i(0), *lr, *momentum, *nesterov)
        }
        Kernel::ApplyAdam { lr, beta1, beta2, epsilon } => {
            let t = ii(1).first().copied().unwrap_or(0).max(0) as u64 + 1;
            optim::apply_adam(o(0), o(1), o(2), i(0), *lr, *beta1, *beta2, *epsilon, t);
        }
        Kernel::IncrementStep => {
            if let Some(s) = outs[0].slot.i32_mut().first_mut() {
                *s = s.wrapping_add(1);
            }
        }
    }
    Ok(())
}

unsafe fn ws_f32<'a>(ws: &Option<crate::mem::Slot>) -> &'a mut [f32] {
    match ws {
        Some(s) => s.f32_mut(),
        None => &mut [],
    }
}

unsafe fn cast(from: DType, to: DType, x: crate::mem::Slot, y: crate::mem::Slot) {
    match (from, to) {
        (DType::F32, DType::F32) => y.f32_mut().copy_from_slice(x.f32()),
        (DType::F32, DType::I32) => reduce::cast_f32_to_i32(x.f32(), y.i32_mut()),
        (DType::F32, DType::Bool) => y.i32_mut().iter_mut().zip(x.f32()).for_each(|(o, v)| *o = (*v != 0.0) as i32),
        (_, DType::F32) => reduce::cast_i32_to_f32(x.i32(), y.f32_mut()),
        (_, DType::I32) => y.i32_mut().copy_from_slice(x.i32()),
        (_, DType::Bool) => y.i32_mut().iter_mut().zip(x.i32()).for_each(|(o, v)| *o = (*v != 0) as i32),
    }
}

/// The kernels' dropout with the element stream starting at `offset`, so a
/// tower holding rows `first_row..` draws the mask one device would draw for
/// them: element `offset + i` uses lane `(offset+i) % 4` of Philox block
/// `(offset+i) / 4`, exactly as `towers_kernels::dropout::dropout` does from 0.
fn dropout_at(x: &[f32], keep: f32, seed: u64, step: u64, offset: usize, y: &mut [f32], mask: &mut [f32]) {
    let scale = if keep > 0.0 { 1.0 / keep.min(1.0) } else { 0.0 };
    let mut block = u64::MAX;
    let mut r = [0u32; 4];
    for (k, (m, (o, v))) in mask.iter_mut().zip(y.iter_mut().zip(x)).enumerate() {
        let g = (offset + k) as u64;
        if g / 4 != block {
            block = g / 4;
            r = random::philox_block(seed, step, block);
        }
        *m = if keep >= 1.0 || random::u32_to_unit(r[(g % 4) as usize]) < keep { scale } else { 0.0 };
        *o = *v * *m;
    }
}
