//! The elementwise family's descriptor (unary and binary ops with codes
//! from the op tables, the bias adds, the generated fused kernels,
//! broadcasts and their sums): operands, CUDA launches and plan text and CPU dispatch, in one
//! place (see [`crate::family`]). One grid-stride launch each, block
//! `BLOCK`, grid `grid_1d(n)`; the bias and activation gradients and the
//! sums to a shape run the reduce family's kernels.

use crate::elementwise as ew;
use crate::elementwise::FusedExpr;
use crate::family::prelude::*;
use crate::reduce::desc::REDUCE;
use crate::reduce::desc::{bias_grad, column_sums, reduced_bits_to};

entries! { "elementwise";
    BIAS_ACT_IN_PLACE = "towers_bias_act_in_place_f32";
    BINARY = "towers_binary_f32";
    BIAS_ADD = "towers_bias_add_f32";
    BIAS_ADD_ACT = "towers_bias_add_act_f32";
    UNARY = "towers_unary_f32";
    UNARY_GRAD = "towers_unary_grad_f32";
    BROADCAST_TO = "towers_broadcast_to_f32";
}

/// The elementwise family.
pub(crate) static DESC: Desc = Desc {
    name: "elementwise",
    cuda: Some(CudaFile { path: "elementwise/elementwise.cu", text: include_str!("elementwise.cu") }),
    entries: ENTRIES,
    declare,
    lower,
    text,
    run,
    backend_workspace: no_workspace,
};

fn declare(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    match k {
        Kernel::Binary { op, a_shape, b_shape, out_shape } => {
            b.param("op", op.name());
            ensure(broadcast(a_shape, b_shape).as_deref() == Some(out_shape.as_slice()), || {
                format!("{} and {} do not broadcast to {}", dims(a_shape), dims(b_shape), dims(out_shape))
            })?;
            b.input("a", F32, Len::Exact(prod(a_shape, "a_shape")?), format!("a_shape {}", dims(a_shape)));
            b.input("b", F32, Len::Exact(prod(b_shape, "b_shape")?), format!("b_shape {}", dims(b_shape)));
            let out = prod(out_shape, "out_shape")?;
            b.output("c", F32, Len::Exact(out), format!("out_shape {}", dims(out_shape)));
        }
        Kernel::Fused { expr, in_shapes, out_shape } => fused(b, expr, in_shapes, out_shape)?,
        Kernel::BiasAdd { channels } | Kernel::BiasAddAct { channels, .. } => {
            positive(*channels, "channels")?;
            b.param("channels", channels);
            if let Kernel::BiasAddAct { act, .. } = k {
                b.param("act", act.name());
            }
            b.input("x", F32, Len::Multiple(*channels), "channels");
            b.input("bias", F32, Len::Exact(*channels), "channels");
            b.output("y", F32, Len::Like(IN0), "");
        }
        Kernel::UnaryGradBiasGrad { channels, act } => {
            positive(*channels, "channels")?;
            b.param("channels", channels);
            b.param("act", act.name());
            b.input("dy", F32, Len::Multiple(*channels), "channels");
            b.input("y", F32, Len::Like(IN0), "");
            b.output("dx", F32, Len::Like(IN0), "");
            b.output("db", F32, Len::Exact(*channels), "channels");
        }
        Kernel::BiasAddGrad { channels } => {
            positive(*channels, "channels")?;
            b.param("channels", channels);
            b.input("dy", F32, Len::Multiple(*channels), "channels");
            b.output("db", F32, Len::Exact(*channels), "channels");
        }
        Kernel::Unary { op } => {
            b.param("op", op.name());
            b.input("x", F32, Len::Any, "");
            b.output("y", F32, Len::Like(IN0), "");
        }
        Kernel::UnaryGrad { op } => {
            b.param("op", op.name());
            b.input("dy", F32, Len::Any, "");
            b.input("y", F32, Len::Like(IN0), "");
            b.output("dx", F32, Len::Like(IN0), "");
        }
        Kernel::BroadcastTo { x_shape, out_shape } | Kernel::SumTo { x_shape, out_shape } => {
            let bcast = matches!(k, Kernel::BroadcastTo { .. });
            let (big, small) = if bcast { (out_shape, x_shape) } else { (x_shape, out_shape) };
            ensure(broadcast(big, small).as_deref() == Some(&big[..]), || {
                format!("{} does not broadcast to {}", dims(small), dims(big))
            })?;
            b.param("x_shape", dims(x_shape));
            b.param("out_shape", dims(out_shape));
            b.input("x", F32, Len::Exact(prod(x_shape, "x_shape")?), format!("x_shape {}", dims(x_shape)));
            let out = prod(out_shape, "out_shape")?;
            b.output("y", F32, Len::Exact(out), format!("out_shape {}", dims(out_shape)));
        }
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    match kernel {
        Kernel::Binary { op, a_shape, b_shape, out_shape } => {
            let y = cx.o(0)?;
            let r = out_shape.len();
            let args = vec![
                Arg::I32(op.code()),
                i64a(y),
                cx.inp(0)?,
                cx.inp(1)?,
                cx.out(0)?,
                cx.d4(out_shape, 1)?,
                cx.strides(&pad_to(a_shape, r))?,
                cx.strides(&pad_to(b_shape, r))?,
            ];
            cx.launch(BINARY, grid_1d(y), args);
        }
        Kernel::Fused { expr, in_shapes, out_shape } => {
            // The generated kernel of this expression (its own module).
            let g = crate::cuda::fused_source(expr);
            let y = cx.o(0)?;
            let mut args = vec![i64a(y), cx.d4(out_shape, 1)?];
            for (k, s) in in_shapes.iter().enumerate() {
                args.push(cx.inp(k)?);
                args.push(cx.strides(s)?);
            }
            args.push(cx.out(0)?);
            cx.launch(Entry { family: g.source.family, name: g.entry }, grid_1d(y), args);
        }
        Kernel::BiasAdd { channels } => {
            let y = cx.o(0)?;
            let args = vec![i64a(y), i64a(*channels), cx.inp(0)?, cx.inp(1)?, cx.out(0)?];
            cx.launch(BIAS_ADD, grid_1d(y), args);
        }
        Kernel::BiasAddAct { channels, act } => {
            let y = cx.o(0)?;
            let args = vec![Arg::I32(act.code()), i64a(y), i64a(*channels), cx.inp(0)?, cx.inp(1)?, cx.out(0)?];
            cx.launch(BIAS_ADD_ACT, grid_1d(y), args);
        }
        Kernel::Unary { op } => {
            let y = cx.o(0)?;
            let args = vec![Arg::I32(op.code()), i64a(y), cx.inp(0)?, cx.out(0)?];
            cx.launch(UNARY, grid_1d(y), args);
        }
        Kernel::UnaryGrad { op } => {
            let dx = cx.o(0)?;
            let args = vec![Arg::I32(op.code()), i64a(dx), cx.inp(0)?, cx.inp(1)?, cx.out(0)?];
            cx.launch(UNARY_GRAD, grid_1d(dx), args);
        }
        Kernel::BroadcastTo { x_shape, out_shape } => {
            let y = cx.o(0)?;
            let xs = pad_to(x_shape, out_shape.len());
            let args = vec![i64a(y), cx.inp(0)?, cx.out(0)?, cx.d4(out_shape, 1)?, cx.strides(&xs)?];
            cx.launch(BROADCAST_TO, grid_1d(y), args);
        }
        Kernel::UnaryGradBiasGrad { channels, act } => {
            let rows = cx.i(0)? / (*channels).max(1);
            let ops = [cx.inp(0)?, cx.inp(1)?, cx.out(0)?, cx.out(1)?];
            bias_grad(cx, act.code(), rows, *channels, ops);
        }
        Kernel::BiasAddGrad { channels } => {
            let rows = cx.i(0)? / (*channels).max(1);
            let (x, y) = (cx.inp(0)?, cx.out(0)?);
            column_sums(cx, rows, *channels, x, y);
        }
        Kernel::SumTo { x_shape, out_shape } => {
            let y = cx.o(0)?;
            let bits = reduced_bits_to(x_shape, out_shape);
            let args = vec![i64a(y), cx.inp(0)?, cx.out(0)?, cx.d4(x_shape, 1)?, Arg::I32(bits), Arg::F32(1.0)];
            cx.launch(REDUCE, grid_rows(y), args);
        }
        _ => return Err(Foreign::of(kernel, DESC.name).into()),
    }
    Ok(())
}

/// The CPU body of one of this family's kernels on a launch's operands.
///
/// # Safety
/// As [`Io`].
unsafe fn run(k: &Kernel, io: &dyn Io, lists: &mut Lists<'_>, _step: u64) -> Result<(), CpuError> {
    let i = |n: usize| io.f32(n);
    let o = |n: usize| io.out_f32(n);
    match k {
        Kernel::Binary { op, a_shape, b_shape, .. } => ew::binary(*op, i(0), a_shape, i(1), b_shape, o(0))?,
        Kernel::Fused { expr, in_shapes, out_shape } => {
            let out = o(0);
            lists
                .f32s
                .with((0..io.counts().0).map(|k| io.f32(k)), |xs| ew::fused(expr, xs, in_shapes, out_shape, out))?
        }
        Kernel::BiasAdd { .. } => ew::bias_add(i(0), i(1), o(0)),
        Kernel::BiasAddAct { act, .. } => ew::bias_add_act(i(0), i(1), *act, o(0)),
        Kernel::UnaryGradBiasGrad { act, .. } if io.in_place() => {
            ew::unary_grad_bias_grad_in_place(*act, o(0), i(1), o(1))
        }
        Kernel::UnaryGradBiasGrad { act, .. } => ew::unary_grad_bias_grad(*act, i(0), i(1), o(0), o(1)),
        Kernel::BiasAddGrad { .. } => ew::bias_add_grad(i(0), o(0)),
        Kernel::Unary { op } => ew::unary(*op, i(0), o(0)),
        Kernel::UnaryGrad { op } if io.in_place() => ew::unary_grad_in_place(*op, o(0), i(1)),
        Kernel::UnaryGrad { op } => ew::unary_grad(*op, i(0), i(1), o(0)),
        Kernel::BroadcastTo { x_shape, out_shape } => ew::broadcast_to(i(0), x_shape, o(0), out_shape)?,
        Kernel::SumTo { x_shape, out_shape } => ew::sum_to_shape(i(0), x_shape, o(0), out_shape)?,
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn text(k: &Kernel) -> Result<String, Foreign> {
    Ok(match k {
        Kernel::Binary { op, a_shape, b_shape, out_shape } => {
            let sym = op.symbol();
            let name = op.name();
            // The output shape is written only where it is not the larger operand's.
            let out = if out_shape == a_shape || out_shape == b_shape {
                String::new()
            } else {
                format!(" -> {}", dims(out_shape))
            };
            format!("{name} {}{sym}{}{out}", dims(a_shape), dims(b_shape))
        }
        Kernel::Fused { expr, in_shapes, out_shape } => {
            let ins: Vec<String> = in_shapes.iter().map(|s| dims(s)).collect();
            format!("{} ({}) -> {}", expr.tree(), ins.join(", "), dims(out_shape))
        }
        Kernel::BiasAdd { channels } | Kernel::BiasAddGrad { channels } => format!("c={channels}"),
        Kernel::BiasAddAct { channels, act } | Kernel::UnaryGradBiasGrad { channels, act } => {
            format!("c={channels} {}", act.name())
        }
        Kernel::Unary { op } | Kernel::UnaryGrad { op } => op.name().into(),
        Kernel::BroadcastTo { x_shape, out_shape } | Kernel::SumTo { x_shape, out_shape } => {
            format!("{} -> {}", dims(x_shape), dims(out_shape))
        }
        _ => return Err(Foreign::of(k, DESC.name)),
    })
}

fn fused(b: &mut Builder, expr: &FusedExpr, in_shapes: &[Vec<usize>], out_shape: &[usize]) -> Result<(), ParamError> {
    // A plan read from JSON carries the expression unchecked.
    let checked = FusedExpr::new(expr.steps().to_vec());
    ensure(checked.as_ref() == Ok(expr), || match &checked {
        Err(e) => e.to_string(),
        Ok(_) => "the expression's input count does not match its steps".into(),
    })?;
    ensure(in_shapes.len() == expr.inputs(), || {
        format!("{} input shapes for an expression of {} inputs", in_shapes.len(), expr.inputs())
    })?;
    let mut out: Option<Vec<usize>> = Some(Vec::new());
    for s in in_shapes {
        out = out.and_then(|o| broadcast(&o, s));
    }
    ensure(out.as_deref() == Some(out_shape), || {
        let ins: Vec<String> = in_shapes.iter().map(|s| dims(s)).collect();
        format!("inputs {} do not broadcast to {}", ins.join(", "), dims(out_shape))
    })?;
    b.param("expr", expr);
    for (i, s) in in_shapes.iter().enumerate() {
        let len = Len::Exact(prod(s, "an input shape")?);
        let x = op("x", Role::Read, F32, len, format!("input shape {}", dims(s)));
        b.inputs(vec![OperandSig { index: Some(i), ..x }], 1);
    }
    let out = prod(out_shape, "out_shape")?;
    b.output("y", F32, Len::Exact(out), format!("out_shape {}", dims(out_shape)));
    Ok(())
}

/// `s` right-aligned against rank `rank` (padded with 1 on the left).
fn pad_to(s: &[usize], rank: usize) -> Vec<usize> {
    let mut v = vec![1; rank.saturating_sub(s.len())];
    v.extend_from_slice(s);
    v
}
