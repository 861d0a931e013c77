//! The GEMM family's descriptor (`gemm`, `gemm_batched`, `gemm_bias_act`,
//! the tower products and the tower product fused into its update):
//! operands, CUDA lowering (cuBLAS GEMMs; the batched product one strided
//! batched GEMM, a shared operand at stride 0; the fused bias and
//! activation run in place on the product) and plan text and CPU dispatch,
//! in one place (see [`crate::family`]).

use crate::elementwise as ew;
use crate::elementwise::desc::BIAS_ACT_IN_PLACE;
use crate::family::prelude::*;
use crate::gemm;
use crate::KernelError;

/// No `.cu`: no entry points.
const ENTRIES: &[Entry] = &[];

/// The gemm family.
pub(crate) static DESC: Desc =
    Desc { name: "gemm", cuda: None, entries: ENTRIES, declare, lower, text, run, backend_workspace };

fn declare(k: &Kernel, b: &mut Builder) -> Result<(), ParamError> {
    match k {
        Kernel::MatMul { m, n, k, trans_a, trans_b } => {
            gemm_params(b, *m, *n, *trans_a, *trans_b);
            b.param("k", k);
            let ((mk, w1), (kn, w2), (mn_, w3)) =
                (mn(*m, *k, "m", "k", "")?, mn(*k, *n, "k", "n", "")?, mn(*m, *n, "m", "n", "")?);
            b.input("a", F32, Len::Exact(mk), w1);
            b.input("b", F32, Len::Exact(kn), w2);
            b.output("c", F32, Len::Exact(mn_), w3);
        }
        Kernel::BatchMatMul { batch, m, n, k, trans_a, trans_b, shared_a, shared_b } => {
            b.param("batch", batch);
            gemm_params(b, *m, *n, *trans_a, *trans_b);
            b.param("k", k);
            b.param("shared_a", shared_a);
            b.param("shared_b", shared_b);
            let count = |shared: bool| if shared { 1 } else { *batch };
            let (a, wa) = batched(count(*shared_a), *m, *k, "m", "k")?;
            let (bb, wb) = batched(count(*shared_b), *k, *n, "k", "n")?;
            let (c, wc) = batched(*batch, *m, *n, "m", "n")?;
            b.input("a", F32, Len::Exact(a), wa);
            b.input("b", F32, Len::Exact(bb), wb);
            b.output("c", F32, Len::Exact(c), wc);
        }
        Kernel::TowerMatMul { m, n, ks, trans_a, trans_b, weights } => {
            tower_pairs(b, *m, *n, ks, weights, *trans_a, *trans_b)?;
            let (len, why) = mn(*m, *n, "m", "n", "")?;
            b.output("c", F32, Len::Exact(len), why);
        }
        Kernel::TowerMatMulApply { m, n, ks, trans_a, trans_b, weights, apply } => {
            tower_pairs(b, *m, *n, ks, weights, *trans_a, *trans_b)?;
            let slots = match **apply {
                Kernel::ApplyGradientDescent {} => &["var"][..],
                Kernel::ApplyMomentum { momentum, nesterov: false } => {
                    b.param("momentum", momentum);
                    &["var", "accum"][..]
                }
                _ => {
                    return Err(ParamError {
                        reason: format!(
                            "{} cannot take a tower product (plain SGD or non-Nesterov momentum only)",
                            apply.name()
                        ),
                    })
                }
            };
            b.param("apply", apply.name());
            b.input("lr", F32, Len::Exact(1), "a scalar learning rate");
            let (len, why) = mn(*m, *n, "m", "n", "")?;
            for s in slots {
                b.update(s, F32, Len::Exact(len), why.clone());
            }
        }
        Kernel::MatMulBiasAct { m, n, k, trans_a, trans_b, act } => {
            gemm_params(b, *m, *n, *trans_a, *trans_b);
            b.param("k", k);
            b.param("act", act.map_or("none", |a| a.name()));
            let ((mk, w1), (kn, w2), (mn_, w3)) =
                (mn(*m, *k, "m", "k", "")?, mn(*k, *n, "k", "n", "")?, mn(*m, *n, "m", "n", "")?);
            b.input("a", F32, Len::Exact(mk), w1);
            b.input("b", F32, Len::Exact(kn), w2);
            b.input("bias", F32, Len::Exact(*n), format!("n = {n} (the bias)"));
            b.output("y", F32, Len::Exact(mn_), w3);
        }
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn lower(kernel: &Kernel, cx: &mut Cx<'_>) -> Result<(), LaunchError> {
    match kernel {
        Kernel::MatMul { m, n, k, trans_a, trans_b } | Kernel::MatMulBiasAct { m, n, k, trans_a, trans_b, .. } => {
            let (a, b, c) = (cx.operand(Which::In(0), 0)?, cx.operand(Which::In(1), 0)?, cx.operand(Which::Out(0), 0)?);
            cx.gemm(sgemm(*m, *n, *k, (*trans_a, *trans_b), a, b, c, 0.0));
            if let Kernel::MatMulBiasAct { act, .. } = kernel {
                // The fused bias (and activation), in place on the product.
                let y = cx.o(0)?;
                let code = act.map_or(-1, |act| act.code());
                let args = vec![Arg::I32(code), i64a(y), i64a(*n), cx.inp(2)?, cx.out(0)?];
                cx.launch(BIAS_ACT_IN_PLACE, grid_1d(y), args);
            }
        }
        Kernel::BatchMatMul { batch, m, n, k, trans_a, trans_b, .. } => {
            let (a, b, c) = (cx.operand(Which::In(0), 0)?, cx.operand(Which::In(1), 0)?, cx.operand(Which::Out(0), 0)?);
            let (stride_a, stride_b, stride_c) = batch_gemm(kernel).map_or((0, 0, 0), |p| p.strides());
            let g = sgemm(*m, *n, *k, (*trans_a, *trans_b), a, b, c, 0.0);
            cx.gemm(Gemm { batch: *batch, stride_a, stride_b, stride_c, ..g });
        }
        Kernel::TowerMatMul { m, n, ks, trans_a, trans_b, weights } => {
            let c = cx.operand(Which::Out(0), 0)?;
            tower_gemms(cx, *m, *n, ks, weights, (*trans_a, *trans_b), c)?;
        }
        Kernel::TowerMatMulApply { m, n, ks, trans_a, trans_b, weights, apply } => {
            // The product into the launch's own scratch (the workspace, m*n
            // floats), then the update exactly as its own launch lowers,
            // reading the scratch as its gradient.
            let have = cx.ws()?;
            if have < m * n {
                return Err(LaunchError::Workspace { kernel: cx.name, have, need: m * n });
            }
            if !matches!(**apply, Kernel::ApplyGradientDescent {} | Kernel::ApplyMomentum { nesterov: false, .. }) {
                return Err(LaunchError::CannotFuse { kernel: cx.name, inner: apply.name() });
            }
            let c = cx.operand(Which::Workspace, 0)?;
            tower_gemms(cx, *m, *n, ks, weights, (*trans_a, *trans_b), c)?;
            let lr = 2 * ks.len();
            let ins = [m * n, cx.i(lr)?];
            let mut low = crate::launch::lower(apply, Counts { ins: &ins, outs: cx.counts.outs, workspace: None })?;
            remap(&mut low, |w| match w {
                Which::In(0) => Which::Workspace,
                Which::In(_) => Which::In(lr),
                other => other,
            });
            cx.low.ops.extend(low.ops);
        }
        _ => return Err(Foreign::of(kernel, DESC.name).into()),
    }
    Ok(())
}

/// The CPU body of one of this family's kernels on a launch's operands.
///
/// # Safety
/// As [`Io`].
unsafe fn run(k: &Kernel, io: &dyn Io, _lists: &mut Lists<'_>, _step: u64) -> Result<(), CpuError> {
    let i = |n: usize| io.f32(n);
    let o = |n: usize| io.out_f32(n);
    match k {
        Kernel::MatMul { m, n, k, trans_a, trans_b } => {
            let p = gemm::MatMul::new(*m, *k, *n).trans_a(*trans_a).trans_b(*trans_b);
            gemm::matmul(&p, i(0), i(1), o(0));
        }
        Kernel::BatchMatMul { .. } => {
            if let Some(p) = batch_gemm(k) {
                gemm::batch_matmul(&p, i(0), i(1), o(0));
            }
        }
        Kernel::TowerMatMul { m, n, ks, trans_a, trans_b, weights } => {
            let p = gemm::TowerGemm { m: *m, n: *n, ks, trans_a: *trans_a, trans_b: *trans_b, weights };
            gemm::tower_matmul(&p, |k| io.f32(k), o(0));
        }
        Kernel::TowerMatMulApply { m, n, ks, trans_a, trans_b, weights, apply } => {
            let p = gemm::TowerGemm { m: *m, n: *n, ks, trans_a: *trans_a, trans_b: *trans_b, weights };
            let lr = io.counts().0.checked_sub(1).map_or(0.0, |n| io.f32(n)[0]);
            let acc = if io.counts().1 > 1 { Some(o(1)) } else { None };
            gemm::tower_matmul_apply(&p, tower_update(apply, lr)?, |k| io.f32(k), o(0), acc)?;
        }
        Kernel::MatMulBiasAct { m, n, k, trans_a, trans_b, act } => {
            let p = gemm::MatMul::new(*m, *k, *n).trans_a(*trans_a).trans_b(*trans_b);
            let y = o(0);
            gemm::matmul(&p, i(0), i(1), y);
            ew::bias_then_act_in_place(y, i(2), *act);
        }
        _ => return Err(Foreign::of(k, DESC.name).into()),
    }
    Ok(())
}

fn text(k: &Kernel) -> Result<String, Foreign> {
    Ok(match k {
        Kernel::MatMul { m, n, k, trans_a, trans_b } => {
            let ta = if *trans_a { " trans_a" } else { "" };
            let tb = if *trans_b { " trans_b" } else { "" };
            format!("m={m} n={n} k={k}{ta}{tb}")
        }
        Kernel::BatchMatMul { batch, m, n, k, trans_a, trans_b, shared_a, shared_b } => {
            let ta = if *trans_a { " trans_a" } else { "" };
            let tb = if *trans_b { " trans_b" } else { "" };
            let sa = if *shared_a { " shared_a" } else { "" };
            let sb = if *shared_b { " shared_b" } else { "" };
            format!("batch={batch} m={m} n={n} k={k}{ta}{tb}{sa}{sb}")
        }
        Kernel::TowerMatMul { m, n, ks, trans_a, trans_b, weights } => {
            let ta = if *trans_a { " trans_a" } else { "" };
            let tb = if *trans_b { " trans_b" } else { "" };
            let ks = ks.iter().map(|k| k.to_string()).collect::<Vec<_>>().join("+");
            format!("m={m} n={n} k={ks}{ta}{tb} w={}", list(weights))
        }
        Kernel::TowerMatMulApply { m, n, ks, trans_a, trans_b, weights, apply } => {
            let ta = if *trans_a { " trans_a" } else { "" };
            let tb = if *trans_b { " trans_b" } else { "" };
            let ks = ks.iter().map(|k| k.to_string()).collect::<Vec<_>>().join("+");
            let p = apply.params_text();
            let sep = if p.is_empty() { "" } else { " " };
            format!("m={m} n={n} k={ks}{ta}{tb} w={} {}{sep}{p}", list(weights), apply.name())
        }
        Kernel::MatMulBiasAct { m, n, k, trans_a, trans_b, act } => {
            let ta = if *trans_a { " trans_a" } else { "" };
            let tb = if *trans_b { " trans_b" } else { "" };
            let act = act.map_or(String::new(), |a| format!(" {}", a.name()));
            format!("m={m} n={n} k={k}{ta}{tb} +bias{act}")
        }
        _ => return Err(Foreign::of(k, DESC.name)),
    })
}

/// A batched kernel's product shape (None for any other kernel): the one
/// place the CPU body and the CUDA lowering read its strides from.
fn batch_gemm(k: &Kernel) -> Option<gemm::BatchGemm> {
    match *k {
        Kernel::BatchMatMul { batch, m, n, k, trans_a, trans_b, shared_a, shared_b } => {
            let mm = gemm::MatMul::new(m, k, n).trans_a(trans_a).trans_b(trans_b);
            Some(gemm::BatchGemm { batch, mm, shared_a, shared_b })
        }
        _ => None,
    }
}

/// `count` matrices of `r*c` elements: the length and its reason, checked.
fn batched(count: usize, r: usize, c: usize, rn: &str, cn: &str) -> Result<(usize, String), ParamError> {
    let (one, why) = mn(r, c, rn, cn, "")?;
    let len =
        one.checked_mul(count).ok_or_else(|| ParamError { reason: format!("{count} matrices of {why} overflow") })?;
    Ok((len, format!("{count} matrices of {why}")))
}

fn gemm_params(b: &mut Builder, m: usize, n: usize, trans_a: bool, trans_b: bool) {
    b.param("m", m);
    b.param("n", n);
    b.param("trans_a", trans_a);
    b.param("trans_b", trans_b);
}

/// A tower product's parameters and operand pairs: `a_p: [m, k_p]`, `b_p: [k_p, n]`.
fn tower_pairs(
    b: &mut Builder,
    m: usize,
    n: usize,
    ks: &[usize],
    weights: &[f32],
    trans_a: bool,
    trans_b: bool,
) -> Result<(), ParamError> {
    ensure(!ks.is_empty() && ks.len() == weights.len(), || {
        format!("{} k's for {} weights (one pair per replica, at least one)", ks.len(), weights.len())
    })?;
    gemm_params(b, m, n, trans_a, trans_b);
    b.param("ks", dims(ks));
    b.param("weights", format!("{weights:?}"));
    for (p, &k) in ks.iter().enumerate() {
        let (mk, w1) = mn(m, k, "m", "k", &format!("pair {p}: "))?;
        let (kn, w2) = mn(k, n, "k", "n", &format!("pair {p}: "))?;
        let pair = [op("a", Role::Read, F32, Len::Exact(mk), w1), op("b", Role::Read, F32, Len::Exact(kn), w2)];
        b.inputs(pair.into_iter().map(|o| OperandSig { index: Some(p), ..o }).collect(), 1);
    }
    Ok(())
}

/// A tower product's GEMMs into `c`: one per pair (inputs `2p`, `2p+1`),
/// alpha = the pair's weight, the first writing (beta 0), the others adding.
fn tower_gemms(
    cx: &mut Cx<'_>,
    m: usize,
    n: usize,
    ks: &[usize],
    weights: &[f32],
    t: (bool, bool),
    c: Operand,
) -> Result<(), LaunchError> {
    for (p, (&k, &alpha)) in ks.iter().zip(weights).enumerate() {
        let (a, b) = (cx.operand(Which::In(2 * p), 0)?, cx.operand(Which::In(2 * p + 1), 0)?);
        let beta = if p == 0 { 0.0 } else { 1.0 };
        cx.gemm(Gemm { alpha, ..sgemm(m, n, k, t, a, b, c, beta) });
    }
    Ok(())
}

/// Rename the operands of a lowering (the fused update reading the scratch
/// as its gradient).
fn remap(low: &mut Lowering, f: impl Fn(Which) -> Which) {
    for op in &mut low.ops {
        match op {
            LaunchOp::Gemm(g) => {
                for o in [&mut g.a, &mut g.b, &mut g.c] {
                    o.which = f(o.which);
                }
            }
            LaunchOp::Launch(l) => {
                for a in &mut l.args {
                    match a {
                        Arg::Operand(o) => o.which = f(o.which),
                        Arg::Operands(v) => v.iter_mut().for_each(|w| *w = f(*w)),
                        _ => {}
                    }
                }
            }
        }
    }
}

/// The update a `TowerMatMulApply` fuses, with this step's learning rate
/// (plain SGD or non-Nesterov momentum; the signature refuses others).
pub fn tower_update(apply: &Kernel, lr: f32) -> Result<gemm::TowerUpdate, KernelError> {
    match apply {
        Kernel::ApplyGradientDescent {} => Ok(gemm::TowerUpdate::Sgd { lr }),
        Kernel::ApplyMomentum { momentum, nesterov: false } => {
            Ok(gemm::TowerUpdate::Momentum { lr, momentum: *momentum })
        }
        other => Err(KernelError::CannotFuse { op: other.name(), into: "gemm_tower_apply" }),
    }
}

/// A fused tower update stages its product (`m * n` f32) on CUDA; the
/// other GEMMs take none.
fn backend_workspace(k: &Kernel) -> Option<usize> {
    match k {
        Kernel::TowerMatMulApply { m, n, .. } => Some(m * n),
        _ => None,
    }
}
