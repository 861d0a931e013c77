//! Dispatch of one launch to its CPU kernel in `towers_kernels`: one call
//! per [`Kernel`] variant, no math here. Everything a kernel needs was
//! computed by codegen and resolved at load, where [`check`] holds each
//! launch's buffers to its kernel's operand signature (arity, dtypes,
//! lengths: declared once, in `towers_kernels::operands`); this file then
//! only picks the typed views of the launch's buffers by position. It allocates nothing on success; an error
//! message is built only on failure.

use towers_codegen::Kernel;
use towers_kernels::dtype::{DType, Slice, SliceMut};
use towers_kernels::elementwise as ew;
use towers_kernels::operands::Actual;
use towers_kernels::{array, batchnorm, conv, dropout, gemm, init, layout, misc, optim, pool, reduce, softmax};

use super::prepare::{Buf, Launch};

/// Check a launch's buffers against its kernel's operand signature
/// (`Kernel::signature`): arity, workspace, dtypes and lengths, once at
/// load, so [`dispatch`] indexes operands by position without checks.
pub fn check(kernel: &Kernel, ins: &[Buf], outs: &[Buf], ws: Option<&Buf>) -> Result<(), String> {
    let sig = kernel.signature().map_err(|e| format!("{} parameters are invalid: {e}", kernel.name()))?;
    let actual = |b: &Buf| Actual { dtype: b.dtype, elems: b.slot.len() };
    let (a_ins, a_outs): (Vec<Actual>, Vec<Actual>) =
        (ins.iter().map(actual).collect(), outs.iter().map(actual).collect());
    sig.check(&a_ins, &a_outs, ws.map(actual)).map_err(|m| sig.explain(&m))
}

/// The typed read view of a buffer.
///
/// # Safety
/// As [`dispatch`].
unsafe fn view<'a>(b: &super::prepare::Buf) -> Slice<'a> {
    match b.dtype {
        DType::F32 => Slice::F32(b.slot.f32()),
        DType::I32 | DType::Bool => Slice::I32(b.slot.i32()),
    }
}

/// The typed write view of a buffer.
///
/// # Safety
/// As [`dispatch`].
unsafe fn view_mut<'a>(b: &super::prepare::Buf) -> SliceMut<'a> {
    match b.dtype {
        DType::F32 => SliceMut::F32(b.slot.f32_mut()),
        DType::I32 | DType::Bool => SliceMut::I32(b.slot.i32_mut()),
    }
}

/// Elements below which a launch is never split across threads (a split
/// costs a wake-up of tens of microseconds).
pub const SPLIT_MIN: usize = 1 << 16;

/// Output rows x their length x pair count below which a tower matmul is
/// never split: about 2 MFLOP (tens of microseconds on one core).
pub const SPLIT_MIN_FLOP: usize = 1 << 21;

/// How a launch may run as two ranges on two threads with the same bits as
/// one: `(n, mid)`, ranges `[0, mid)` and `[mid, n)` of [`dispatch_range`].
/// - a large `MeanApply` (the tower reduction fused into an update) or
///   optimizer update: elements, each computed on its own;
/// - a large `TowerMatMul` (the replicas' weight gradients as one product
///   over the whole batch): output rows, split where its body always splits
///   them (`gemm::tower_matmul_split`).
///
/// They run at the end of a multi-tower step, or as each gradient is
/// finished, where a tower's thread is idle or waiting.
/// The third value estimates the upper range's work (in flops; an
/// element of an update as [`ELEMENT_FLOPS`]) for the board of offers.
pub fn splittable(l: &Launch) -> Option<(usize, usize, usize)> {
    let elems = |l: &Launch| {
        let n = l.outs.first()?.slot.len();
        let mid = (n / 2) & !15;
        (n >= SPLIT_MIN).then_some((n, mid, (n - mid).saturating_mul(ELEMENT_FLOPS)))
    };
    match &l.kernel {
        Kernel::MeanApply { weights, .. } if weights.len() <= 16 => elems(l),
        Kernel::ApplyGradientDescent {}
        | Kernel::ApplyMomentum { .. }
        | Kernel::ApplyAdam { .. }
        | Kernel::ApplyRmsProp { .. }
        | Kernel::ApplyAdagrad { .. } => elems(l),
        Kernel::TowerMatMul { m, n, ks, .. } | Kernel::TowerMatMulApply { m, n, ks, .. } => {
            let per_row = ks.iter().sum::<usize>().saturating_mul(*n).saturating_mul(2);
            let mid = gemm::tower_matmul_split(*m);
            (per_row.saturating_mul(*m) >= SPLIT_MIN_FLOP).then_some((*m, mid, per_row.saturating_mul(m - mid)))
        }
        _ => None,
    }
}

/// An updated element's cost in flops, for comparing offers: its bytes
/// move at about a hundred flops' time on the benchmark host.
pub const ELEMENT_FLOPS: usize = 100;

/// Run range `[lo, hi)` (elements or rows, see [`splittable`]) of a
/// splittable launch. Allocates nothing.
///
/// # Safety
/// As [`dispatch`]; the ranges of one launch run concurrently touch disjoint elements.
pub unsafe fn dispatch_range(l: &Launch, lo: usize, hi: usize) -> Result<(), String> {
    let err = |e: towers_kernels::KernelError| e.to_string();
    let lr = || l.ins.last().map_or(0.0, |b| b.slot.f32()[0]);
    let mut outs: [&mut [f32]; 3] = [&mut [], &mut [], &mut []];
    for (o, b) in outs.iter_mut().zip(&l.outs) {
        *o = b.slot.range(lo, hi).f32_mut();
    }
    let k = l.outs.len().min(3);
    match &l.kernel {
        Kernel::MeanApply { weights, apply } => {
            let n = weights.len();
            let mut grads: [&[f32]; 16] = [&[]; 16];
            for (g, b) in grads.iter_mut().zip(&l.ins[..n]) {
                *g = b.slot.range(lo, hi).f32();
            }
            let t = match apply.as_ref() {
                Kernel::ApplyAdam { .. } => optim::adam_step(l.ins[n].slot.i32()),
                _ => 1,
            };
            optim::mean_apply(&grads[..n], weights, apply, t, lr(), &mut outs[..k]).map_err(err)
        }
        Kernel::ApplyGradientDescent {}
        | Kernel::ApplyMomentum { .. }
        | Kernel::ApplyAdam { .. }
        | Kernel::ApplyRmsProp { .. }
        | Kernel::ApplyAdagrad { .. } => {
            // in: grad, (Adam: global_step), learning rate.
            let t = match &l.kernel {
                Kernel::ApplyAdam { .. } => optim::adam_step(l.ins[1].slot.i32()),
                _ => 1,
            };
            let g = l.ins[0].slot.range(lo, hi).f32();
            optim::update(&l.kernel, &mut outs[..k], g, lr(), t, "apply").map_err(err)
        }
        Kernel::TowerMatMul { m, n, ks, trans_a, trans_b, weights } => {
            let p = gemm::TowerGemm { m: *m, n: *n, ks, trans_a: *trans_a, trans_b: *trans_b, weights };
            let c = l.outs[0].slot.range(lo * n, hi * n).f32_mut();
            gemm::tower_matmul_rows(&p, |i| l.ins[i].slot.f32(), c, lo, hi);
            Ok(())
        }
        Kernel::TowerMatMulApply { m, n, ks, trans_a, trans_b, weights, apply } => {
            let p = gemm::TowerGemm { m: *m, n: *n, ks, trans_a: *trans_a, trans_b: *trans_b, weights };
            let w = l.outs[0].slot.range(lo * n, hi * n).f32_mut();
            let acc = l.outs.get(1).map(|b| b.slot.range(lo * n, hi * n).f32_mut());
            gemm::tower_matmul_apply_rows(&p, tower_update(apply, lr())?, |i| l.ins[i].slot.f32(), w, acc, lo, hi)
                .map_err(err)
        }
        other => Err(format!("{} cannot run in ranges", other.name())),
    }
}

/// The update a `TowerMatMulApply` fuses, with this step's learning rate.
fn tower_update(apply: &Kernel, lr: f32) -> Result<gemm::TowerUpdate, String> {
    match apply {
        Kernel::ApplyGradientDescent {} => Ok(gemm::TowerUpdate::Sgd { lr }),
        Kernel::ApplyMomentum { momentum, nesterov: false } => {
            Ok(gemm::TowerUpdate::Momentum { lr, momentum: *momentum })
        }
        other => Err(format!("gemm_tower_apply cannot fuse {}", other.name())),
    }
}

/// Run one launch. `step` is the program's 0-based run count (dropout's stream).
///
/// # Safety
/// The module invariant of [`super::mem`]: no other thread touches the
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
        Kernel::TowerMatMul { m, n, ks, trans_a, trans_b, weights } => {
            let p = gemm::TowerGemm { m: *m, n: *n, ks, trans_a: *trans_a, trans_b: *trans_b, weights };
            gemm::tower_matmul(&p, |k| ins[k].slot.f32(), o(0));
        }
        Kernel::TowerMatMulApply { m, n, ks, trans_a, trans_b, weights, apply } => {
            let p = gemm::TowerGemm { m: *m, n: *n, ks, trans_a: *trans_a, trans_b: *trans_b, weights };
            let lr = ins.last().map_or(0.0, |b| b.slot.f32()[0]);
            let acc = if outs.len() > 1 { Some(o(1)) } else { None };
            gemm::tower_matmul_apply(&p, tower_update(apply, lr)?, |k| ins[k].slot.f32(), o(0), acc).map_err(err)?;
        }
        Kernel::MatMulBiasAct { m, n, k, trans_a, trans_b, act } => {
            let p = gemm::MatMul::new(*m, *k, *n).trans_a(*trans_a).trans_b(*trans_b);
            let y = o(0);
            gemm::matmul(&p, i(0), i(1), y);
            ew::bias_then_act_in_place(y, i(2), *act);
        }
        Kernel::Binary { op, a_shape, b_shape, .. } => {
            ew::binary(*op, i(0), a_shape, i(1), b_shape, o(0)).map_err(err)?
        }
        Kernel::Fused { expr, in_shapes, out_shape } => {
            let out = o(0);
            slices
                .with(ins.iter().map(|b| b.slot.f32()), |xs| ew::fused(expr, xs, in_shapes, out_shape, out))
                .map_err(err)?
        }
        Kernel::AddN { .. } => slices.with(ins.iter().map(|b| b.slot.f32()), |xs| misc::add_n(xs, o(0))),
        Kernel::WeightedSum { weights } => {
            slices.with(ins.iter().map(|b| b.slot.f32()), |xs| misc::weighted_sum(xs, weights, o(0)))
        }
        Kernel::BiasAdd { .. } => ew::bias_add(i(0), i(1), o(0)),
        Kernel::BiasAddAct { act, .. } => ew::bias_add_act(i(0), i(1), *act, o(0)),
        Kernel::UnaryGradBiasGrad { act, .. } if ins[0].slot.same(&outs[0].slot) => {
            ew::unary_grad_bias_grad_in_place(*act, o(0), i(1), o(1))
        }
        Kernel::UnaryGradBiasGrad { act, .. } => ew::unary_grad_bias_grad(*act, i(0), i(1), o(0), o(1)),
        Kernel::BiasAddGrad { .. } => ew::bias_add_grad(i(0), o(0)),
        Kernel::Unary { op } => ew::unary(*op, i(0), o(0)),
        Kernel::UnaryGrad { op } if ins[0].slot.same(&outs[0].slot) => ew::unary_grad_in_place(*op, o(0), i(1)),
        Kernel::UnaryGrad { op } => ew::unary_grad(*op, i(0), i(1), o(0)),
        Kernel::Conv2D { geom, .. } => conv::conv2d(geom, i(0), i(1), o(0), ws_f32(ws)),
        Kernel::Conv2DBiasAct { geom, act, pool: None, .. } => {
            conv::conv2d_bias_act(geom, i(0), i(1), i(2), *act, o(0), ws_f32(ws))
        }
        Kernel::Conv2DBiasAct { geom, act, pool: Some(pool), .. } => {
            conv::conv2d_bias_act_max_pool(geom, i(0), i(1), i(2), *act, pool, o(0), o(1), ws_f32(ws))
        }
        Kernel::Conv2DBackpropInput { geom, .. } => conv::conv2d_backprop_input(geom, i(0), i(1), o(0), ws_f32(ws)),
        Kernel::Conv2DBackpropFilter { geom, .. } => conv::conv2d_backprop_filter(geom, i(0), i(1), o(0), ws_f32(ws)),
        Kernel::MaxPool { geom } => pool::max_pool(geom, i(0), o(0)),
        Kernel::MaxPoolGrad { geom } => pool::max_pool_grad(geom, i(0), i(1), i(2), o(0)),
        Kernel::MaxPoolGradActBiasGrad { geom, act } => {
            pool::max_pool_grad_act_bias_grad(geom, i(0), i(1), i(2), *act, i(3), o(0), o(1))
        }
        Kernel::AvgPool { geom } => pool::avg_pool(geom, i(0), o(0)),
        Kernel::AvgPoolGrad { geom } => pool::avg_pool_grad(geom, i(0), o(0)),
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
        Kernel::SparseSoftmaxXentMeanGrad { classes } => {
            softmax::sparse_softmax_xent_mean_grad(i(0), ii(1), *classes, i(2)[0], o(0), o(1), o(2), o(3))
                .map_err(err)?
        }
        Kernel::SoftmaxXent { classes } => softmax::softmax_cross_entropy(i(0), i(1), *classes, o(0), o(1)),
        Kernel::L2Loss => o(0)[0] = misc::l2_loss(i(0)),
        Kernel::ReduceSum { shape, axes } => reduce::reduce_sum(i(0), shape, axes, o(0)).map_err(err)?,
        Kernel::ReduceMean { shape, axes } => reduce::reduce_mean(i(0), shape, axes, o(0)).map_err(err)?,
        Kernel::ArgMax { shape, axis } => reduce::argmax(i(0), shape, *axis, outs[0].slot.i32_mut()).map_err(err)?,
        Kernel::Equal { .. } => reduce::equal(view(&ins[0]), view(&ins[1]), outs[0].slot.i32_mut()),
        Kernel::Cast { to, .. } => reduce::cast(view(&ins[0]), *to, view_mut(&outs[0])),
        Kernel::Dropout { keep_prob, seed, elem_offset } => {
            dropout::dropout(i(0), *keep_prob, *seed, step, *elem_offset, o(0), o(1))
        }
        Kernel::Fill { value } => init::fill(o(0), *value),
        Kernel::BatchNormTrain { epsilon, .. } => {
            batchnorm::batch_norm_train(i(0), i(1), i(2), *epsilon, o(0), o(1), o(3), o(2))
        }
        Kernel::BatchNormInfer { epsilon, .. } => {
            batchnorm::batch_norm_infer(i(0), i(1), i(2), i(3), i(4), *epsilon, o(0), o(1), o(2), o(3))
        }
        Kernel::BatchNormGrad { .. } => batchnorm::batch_norm_grad(i(0), i(1), i(2), i(3), i(4), o(0), o(1), o(2)),
        Kernel::AssignMovingAverage { decay } => batchnorm::assign_moving_average(o(0), i(0), *decay),
        Kernel::MeanApply { weights, apply } => {
            // Inputs: the towers' gradients, then (Adam) global_step, then the learning rate.
            let n = weights.len();
            let t = match apply.as_ref() {
                Kernel::ApplyAdam { .. } => optim::adam_step(ii(n)),
                _ => 1,
            };
            let lr = i(ins.len() - 1)[0];
            slices
                .with(ins[..n].iter().map(|b| b.slot.f32()), |gs| {
                    mut_slices.with(outs.iter().map(|b| b.slot.f32_mut()), |os| {
                        optim::mean_apply(gs, weights, apply, t, lr, os)
                    })
                })
                .map_err(err)?
        }
        Kernel::MultiApply { apply, count } => {
            // Inputs: the members' gradients, then (Adam) global_step, then the learning rate.
            let n = *count;
            let slots = optim::update_slots(apply, "multi_apply").map_err(err)?;
            let t = match apply.as_ref() {
                Kernel::ApplyAdam { .. } => optim::adam_step(ii(n)),
                _ => 1,
            };
            let lr = i(ins.len() - 1)[0];
            for m in 0..n {
                // Member m's variable and slots.
                let mut member: [&mut [f32]; 3] = [&mut [], &mut [], &mut []];
                for (s, b) in member.iter_mut().take(slots).enumerate() {
                    *b = o(m * slots + s);
                }
                optim::update(apply, &mut member[..slots], i(m), lr, t, "multi_apply").map_err(err)?;
            }
        }
        Kernel::ApplyGradientDescent {} => optim::apply_gradient_descent(o(0), i(0), i(1)[0]),
        Kernel::ApplyMomentum { momentum, nesterov } => {
            optim::apply_momentum(o(0), o(1), i(0), i(1)[0], *momentum, *nesterov)
        }
        Kernel::ApplyAdam { beta1, beta2, epsilon } => {
            optim::apply_adam(o(0), o(1), o(2), i(0), i(2)[0], *beta1, *beta2, *epsilon, optim::adam_step(ii(1)))
        }
        Kernel::IncrementStep => optim::increment_step(outs[0].slot.i32_mut()),
        // array ops (issue 22)
        Kernel::OneHot { depth, on, off } => array::one_hot(ii(0), *depth, *on, *off, o(0)),
        // Any 4-byte element: f32 views move the bits unchanged.
        Kernel::Transpose { shape, perm } => array::transpose(i(0), shape, perm, o(0)).map_err(err)?,
        Kernel::Pad { shape, before, out_shape, value } => {
            array::pad(i(0), shape, before, out_shape, *value, o(0)).map_err(err)?
        }
        Kernel::Gather { outer, limit, inner, .. } => {
            array::gather(i(0), ii(1), *outer, *limit, *inner, o(0)).map_err(err)?
        }
        Kernel::GatherGrad { outer, limit, inner, .. } => {
            array::gather_grad(i(0), ii(1), *outer, *limit, *inner, o(0)).map_err(err)?
        }
        Kernel::Tile { shape, multiples } => array::tile(i(0), shape, multiples, o(0)).map_err(err)?,
        Kernel::TileGrad { shape, multiples } => array::tile_grad(i(0), shape, multiples, o(0)).map_err(err)?,
        Kernel::ApplyRmsProp { decay, momentum, epsilon } => {
            optim::apply_rmsprop(o(0), o(1), o(2), i(0), i(1)[0], *decay, *momentum, *epsilon)
        }
        Kernel::ApplyAdagrad {} => optim::apply_adagrad(o(0), o(1), i(0), i(1)[0]),
    }
    Ok(())
}

unsafe fn ws_f32<'a>(ws: &Option<super::mem::Slot>) -> &'a mut [f32] {
    match ws {
        Some(s) => s.f32_mut(),
        None => &mut [],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::mem::Region;

    /// The load-time check holds a launch's buffers to its kernel's
    /// signature and names the operand that disagrees.
    #[test]
    fn launches_are_checked_against_their_signature_at_load() {
        let r = Region::new(64);
        let buf = |offset: usize, len: usize, dtype: DType| Buf { slot: r.slot(offset, len).expect("in range"), dtype };
        let k = Kernel::MatMul { m: 2, n: 2, k: 3, trans_a: false, trans_b: false };
        let (a, b, c) = (buf(0, 6, DType::F32), buf(8, 6, DType::F32), buf(16, 4, DType::F32));
        assert_eq!(check(&k, &[a, b], &[c], None), Ok(()));
        assert_eq!(check(&k, &[a], &[c], None), Err("gemm takes 2 inputs (a, b), got 1".to_string()));
        let short = buf(8, 5, DType::F32);
        assert_eq!(
            check(&k, &[a, short], &[c], None),
            Err("gemm input 1 (b) has 5 elements, but the parameters need 6 (k*n = 3*2)".to_string())
        );
        let k = Kernel::SparseSoftmaxXent { classes: 3 };
        let loss = buf(24, 2, DType::F32);
        assert_eq!(
            check(&k, &[a, buf(30, 2, DType::F32)], &[loss, buf(40, 6, DType::F32)], None),
            Err("sparse_softmax_xent input 1 (labels) is f32, but the kernel needs i32".to_string())
        );
        let bad = Kernel::Softmax { classes: 0 };
        assert_eq!(check(&bad, &[a], &[c], None), Err("softmax parameters are invalid: classes is 0".to_string()));
    }
}
