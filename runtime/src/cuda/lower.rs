//! Each plan launch as what the GPU runs: CUDA C launches with the argument
//! lists `towers_kernels::cuda::KERNELS` documents, and cuBLAS GEMMs.
//! Built at load; `run` only walks the result.
//!
//! GEMMs are row-major `c[m, n] = op(a) op(b)`; cuBLAS is column-major, so
//! each call computes `c^T = op(b)^T op(a)^T`: the operands swap places, the
//! transposes stay flags, nothing is copied. Convolutions are the
//! registry's im2col/col2im chunks around GEMMs, exactly as the CPU twin
//! chunks them (the workspace holds one chunk).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};
use towers_kernels::cuda::{grid_1d, grid_rows, ConvArgs, Dims4, PoolArgs, BLOCK};
use towers_kernels::{DType, Kernel};

use super::args::{ArgPack, Side};
use super::driver::{cubin, Module};

// array ops (issue 22)
mod array;

/// One kernel launch.
pub(crate) struct KLaunch {
    pub f: sys::CUfunction,
    pub grid: u32,
    pub block: u32,
    pub args: ArgPack,
}

/// One row-major GEMM, `c = alpha op(a) op(b) + beta c`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub ta: bool,
    pub tb: bool,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub alpha: f32,
    pub beta: f32,
}

/// What one plan step becomes on its stream.
pub(crate) enum Op {
    Kernel(KLaunch),
    Gemm(Gemm),
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    Record(usize),
    Wait(usize),
    /// `Step::AllReduce` with a world of one rank: the sum over one rank is
    /// the buffer itself, so nothing runs.
    Nothing,
    /// `Step::AllReduce` over several processes: NCCL's in-place sum of the
    /// `count` f32 at `ptr` (the backend's `NcclComm`).
    AllReduce {
        ptr: u64,
        count: usize,
    },
}

/// The compiled kernel families of one context.
pub(crate) struct Modules {
    ctx: Arc<CudaContext>,
    arch: String,
    loaded: HashMap<&'static str, Module>,
}

impl Modules {
    pub fn new(ctx: &Arc<CudaContext>, arch: String) -> Modules {
        Modules { ctx: Arc::clone(ctx), arch, loaded: HashMap::new() }
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Families compiled so far.
    pub fn families(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.loaded.keys().copied().collect();
        v.sort();
        v
    }

    /// The function `entry` of `family`, compiling and loading the family on first use.
    pub fn function(&mut self, family: &'static str, entry: &'static str) -> Result<sys::CUfunction, String> {
        if !self.loaded.contains_key(family) {
            let src =
                towers_kernels::cuda::source(family).ok_or_else(|| format!("no CUDA source for family {family}"))?;
            let image = cubin(src, &self.arch)?;
            self.loaded.insert(family, Module::load(&self.ctx, &image)?);
        }
        self.loaded.get_mut(family).ok_or("unreachable")?.function(entry)
    }
}

/// A resolved launch operand: device address and element count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dev {
    pub ptr: u64,
    pub len: usize,
    pub dtype: DType,
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

fn d4(v: &[usize], fill: i64, kernel: &str) -> Result<Dims4, String> {
    Dims4::padded(v, fill).ok_or_else(|| format!("{kernel}: rank {} is above 4, the CUDA kernels' limit", v.len()))
}

fn bstrides(v: &[usize], kernel: &str) -> Result<Dims4, String> {
    Dims4::broadcast_strides(v).ok_or_else(|| format!("{kernel}: rank {} is above 4, the CUDA kernels' limit", v.len()))
}

/// Bits of the padded (rank-4) axes that `towers_reduce_f32` sums: those of
/// `x_shape` where the right-aligned `out_shape` has extent 1 and `x` not,
/// or that `out_shape` lacks.
fn reduced_bits_to(x_shape: &[usize], out_shape: &[usize]) -> i32 {
    let (rx, ro) = (x_shape.len(), out_shape.len());
    let mut bits = 0;
    for (i, &d) in x_shape.iter().enumerate() {
        let o = (i + ro).checked_sub(rx).map(|j| out_shape[j]).unwrap_or(1);
        if o == 1 && d != 1 {
            bits |= 1 << (4 - rx + i);
        }
    }
    bits
}

/// Row blocks of the two-stage activation and bias gradient: enough to
/// fill a large GPU twice over (132 multiprocessors), from the shapes alone.
const BIAS_GRAD_PARTS: usize = 264;

/// The launches of an activation gradient with its per-channel sum
/// (`unary_grad_bias_grad`, and the tail of `max_pool_grad_act_bias_grad`)
/// over `[rows, c]`, operands `[dy, y, dx, db]`: `(entry, grid, block,
/// arguments)`. Tall tensors of at most 1024 channels take the two-stage
/// kernels (coalesced row blocks into partial sums in a scratch area of the
/// side buffer that only this launch uses, then one sum per channel); others
/// the one-block-per-channel kernel. The choice and every order in it
/// depend on the shapes only.
fn bias_grad_launches(
    code: i32,
    rows: usize,
    c: usize,
    [dy, y, dx, db]: [u64; 4],
    side: &mut Side,
) -> Vec<(&'static str, u32, u32, ArgPack)> {
    let block = if c == 0 || c > 1024 {
        0
    } else if c <= BLOCK as usize {
        (BLOCK as usize / c) * c
    } else {
        c
    };
    if block == 0 || rows < 4 * BIAS_GRAD_PARTS {
        let mut a = ArgPack::new();
        a.i32(code).i64(rows).i64(c).ptr(dy).ptr(y).ptr(dx).ptr(db);
        return vec![("towers_unary_grad_bias_grad_f32", grid_rows(c), BLOCK, a)];
    }
    let rpb = rows.div_ceil(BIAS_GRAD_PARTS);
    let parts = rows.div_ceil(rpb);
    let scratch = side.push(&vec![0f32; parts * c]);
    let mut a = ArgPack::new();
    a.i32(code).i64(rows).i64(c).i64(rpb).ptr(dy).ptr(y).ptr(dx).side_ptr(scratch);
    let mut b = ArgPack::new();
    b.i64(parts).i64(c).side_ptr(scratch).ptr(db);
    vec![
        ("towers_unary_grad_bias_partial_f32", parts as u32, block as u32, a),
        ("towers_sum_partials_f32", grid_1d(c), BLOCK, b),
    ]
}

/// A tower product's GEMMs into `c`: one per pair (operands `pair(p)`),
/// alpha = the pair's weight, the first writing (beta 0), the others adding.
#[allow(clippy::too_many_arguments)]
fn tower_gemms(
    m: usize,
    n: usize,
    ks: &[usize],
    weights: &[f32],
    (ta, tb): (bool, bool),
    pair: impl Fn(usize) -> Result<(u64, u64), String>,
    c: u64,
    ops: &mut Vec<Op>,
) -> Result<(), String> {
    for (p, (&k, &alpha)) in ks.iter().zip(weights).enumerate() {
        let (a, b) = pair(p)?;
        let beta = if p == 0 { 0.0 } else { 1.0 };
        ops.push(Op::Gemm(Gemm { m, n, k, ta, tb, a, b, c, alpha, beta }));
    }
    Ok(())
}

/// Build the ops of one launch. `ins`, `outs`, `ws` are resolved operands.
#[allow(clippy::too_many_arguments)]
pub(crate) fn lower_launch(
    kernel: &Kernel,
    ins: &[Dev],
    outs: &[Dev],
    ws: Option<Dev>,
    mods: &mut Modules,
    side: &mut Side,
    ops: &mut Vec<Op>,
) -> Result<(), String> {
    let name = kernel.name();
    let i = |k: usize| ins.get(k).copied().ok_or_else(|| format!("{name}: missing input {k}"));
    let o = |k: usize| outs.get(k).copied().ok_or_else(|| format!("{name}: missing output {k}"));
    // A launch of `entry` of `family` over a grid, with its arguments.
    let mut launch =
        |ops: &mut Vec<Op>, family: &'static str, entry: &'static str, grid: u32, block: u32, mut args: ArgPack| {
            let f = mods.function(family, entry)?;
            args.finish();
            ops.push(Op::Kernel(KLaunch { f, grid, block, args }));
            Ok::<(), String>(())
        };
    let ew = |n: usize| grid_1d(n);
    match kernel {
        Kernel::MatMul { m, n, k, trans_a, trans_b } | Kernel::MatMulBiasAct { m, n, k, trans_a, trans_b, .. } => {
            let y = o(0)?;
            let g = Gemm {
                m: *m,
                n: *n,
                k: *k,
                ta: *trans_a,
                tb: *trans_b,
                a: i(0)?.ptr,
                b: i(1)?.ptr,
                c: y.ptr,
                alpha: 1.0,
                beta: 0.0,
            };
            ops.push(Op::Gemm(g));
            if let Kernel::MatMulBiasAct { act, .. } = kernel {
                // The fused bias (and activation), in place on the product.
                let code = act.map_or(-1, |act| act.code());
                let mut a = ArgPack::new();
                a.i32(code).i64(y.len).i64(*n).ptr(i(2)?.ptr).ptr(y.ptr);
                launch(ops, "elementwise", "towers_bias_act_in_place_f32", ew(y.len), BLOCK, a)?;
            }
        }
        Kernel::TowerMatMulApply { m, n, ks, trans_a, trans_b, weights, apply } => {
            // The product into the launch's own scratch (`ws`, m*n floats,
            // allocated by the backend at load), then the update reading it.
            let g = ws.ok_or_else(|| format!("{name}: no scratch for the product"))?;
            if g.len < m * n {
                return Err(format!("{name}: a scratch of {} floats for a product of {}", g.len, m * n));
            }
            tower_gemms(
                *m,
                *n,
                ks,
                weights,
                (*trans_a, *trans_b),
                |p| Ok((i(2 * p)?.ptr, i(2 * p + 1)?.ptr)),
                g.ptr,
                ops,
            )?;
            if !matches!(**apply, Kernel::ApplyGradientDescent {} | Kernel::ApplyMomentum { nesterov: false, .. }) {
                return Err(format!("{name} cannot fuse {}", apply.name()));
            }
            // The update exactly as its own launch lowers, reading the scratch as its gradient.
            let grad = Dev { ptr: g.ptr, len: m * n, dtype: DType::F32 };
            lower_launch(apply, &[grad, i(2 * ks.len())?], outs, None, mods, side, ops)?;
        }
        Kernel::TowerMatMul { m, n, ks, trans_a, trans_b, weights } => {
            let y = o(0)?;
            tower_gemms(
                *m,
                *n,
                ks,
                weights,
                (*trans_a, *trans_b),
                |p| Ok((i(2 * p)?.ptr, i(2 * p + 1)?.ptr)),
                y.ptr,
                ops,
            )?;
        }
        Kernel::Binary { op, a_shape, b_shape, out_shape } => {
            let y = o(0)?;
            let code = op.code();
            let mut a = ArgPack::new();
            a.i32(code).i64(y.len).ptr(i(0)?.ptr).ptr(i(1)?.ptr).ptr(y.ptr);
            a.push(d4(out_shape, 1, name)?);
            // Strides of each operand right-aligned against the output's rank.
            let pad = |s: &[usize]| -> Vec<usize> {
                let mut v = vec![1; out_shape.len().saturating_sub(s.len())];
                v.extend_from_slice(s);
                v
            };
            a.push(bstrides(&pad(a_shape), name)?).push(bstrides(&pad(b_shape), name)?);
            launch(ops, "elementwise", "towers_binary_f32", ew(y.len), BLOCK, a)?;
        }
        Kernel::Fused { expr, in_shapes, out_shape } => {
            // The generated kernel of this expression (its own module).
            let g = towers_kernels::cuda::fused_source(expr);
            let y = o(0)?;
            let mut a = ArgPack::new();
            a.i64(y.len).push(d4(out_shape, 1, name)?);
            for (k, s) in in_shapes.iter().enumerate() {
                a.ptr(i(k)?.ptr).push(bstrides(s, name)?);
            }
            a.ptr(y.ptr);
            launch(ops, g.source.family, g.entry, ew(y.len), BLOCK, a)?;
        }
        Kernel::AddN { .. } | Kernel::WeightedSum { .. } => {
            let y = o(0)?;
            let ptrs: Vec<u64> = ins.iter().map(|d| d.ptr).collect();
            let xs = side.push(&ptrs);
            let mut a = ArgPack::new();
            a.i64(y.len).i32(ins.len() as i32).side_ptr(xs);
            if let Kernel::WeightedSum { weights } = kernel {
                a.side_ptr(side.push(weights));
                a.ptr(y.ptr);
                launch(ops, "misc", "towers_weighted_sum_f32", ew(y.len), BLOCK, a)?;
            } else {
                a.ptr(y.ptr);
                launch(ops, "misc", "towers_add_n_f32", ew(y.len), BLOCK, a)?;
            }
        }
        Kernel::BiasAdd { channels } => {
            let y = o(0)?;
            let mut a = ArgPack::new();
            a.i64(y.len).i64(*channels).ptr(i(0)?.ptr).ptr(i(1)?.ptr).ptr(y.ptr);
            launch(ops, "elementwise", "towers_bias_add_f32", ew(y.len), BLOCK, a)?;
        }
        Kernel::BiasAddAct { channels, act } => {
            let y = o(0)?;
            let code = act.code();
            let mut a = ArgPack::new();
            a.i32(code).i64(y.len).i64(*channels).ptr(i(0)?.ptr).ptr(i(1)?.ptr).ptr(y.ptr);
            launch(ops, "elementwise", "towers_bias_add_act_f32", ew(y.len), BLOCK, a)?;
        }
        Kernel::UnaryGradBiasGrad { channels, act } => {
            let dy = i(0)?;
            let code = act.code();
            let rows = dy.len / (*channels).max(1);
            let [dy, y, dx, db] = [dy.ptr, i(1)?.ptr, o(0)?.ptr, o(1)?.ptr];
            for (entry, grid, block, a) in bias_grad_launches(code, rows, *channels, [dy, y, dx, db], side) {
                launch(ops, "reduce", entry, grid, block, a)?;
            }
        }
        Kernel::BiasAddGrad { channels } => {
            let dy = i(0)?;
            let rows = dy.len / (*channels).max(1);
            let mut a = ArgPack::new();
            a.i64(*channels).ptr(dy.ptr).ptr(o(0)?.ptr).push(Dims4 { d: [1, 1, rows as i64, *channels as i64] });
            a.i32(0b0100).f32(1.0);
            launch(ops, "reduce", "towers_reduce_f32", grid_rows(*channels), BLOCK, a)?;
        }
        Kernel::Unary { op } => {
            let y = o(0)?;
            let code = op.code();
            let mut a = ArgPack::new();
            a.i32(code).i64(y.len).ptr(i(0)?.ptr).ptr(y.ptr);
            launch(ops, "elementwise", "towers_unary_f32", ew(y.len), BLOCK, a)?;
        }
        Kernel::UnaryGrad { op } => {
            let dx = o(0)?;
            let code = op.code();
            let mut a = ArgPack::new();
            a.i32(code).i64(dx.len).ptr(i(0)?.ptr).ptr(i(1)?.ptr).ptr(dx.ptr);
            launch(ops, "elementwise", "towers_unary_grad_f32", ew(dx.len), BLOCK, a)?;
        }
        Kernel::Conv2D { geom, .. }
        | Kernel::Conv2DBiasAct { geom, .. }
        | Kernel::Conv2DBackpropInput { geom, .. }
        | Kernel::Conv2DBackpropFilter { geom, .. } => {
            let g = ConvArgs::from(geom);
            let (rows, k, co) = (geom.rows(), geom.k(), geom.c_out);
            let pointwise = geom.kh == 1 && geom.kw == 1 && geom.stride_h == 1 && geom.stride_w == 1;
            let (a0, a1, y) = (i(0)?, i(1)?, o(0)?);
            // A fused convolution's bias and activation: one launch over the
            // whole output once its last GEMM wrote it, in place.
            let epilogue = match kernel {
                Kernel::Conv2DBiasAct { act, .. } => {
                    let code = act.code();
                    let mut a = ArgPack::new();
                    a.i32(code).i64(y.len).i64(co).ptr(i(2)?.ptr).ptr(y.ptr);
                    Some(a)
                }
                _ => None,
            };
            // A fused max pool of the output: one launch after the epilogue.
            let (pooled, pool_grid) = match kernel {
                Kernel::Conv2DBiasAct { pool: Some(pg), .. } => {
                    let mut a = ArgPack::new();
                    a.push(PoolArgs::from(pg)).ptr(y.ptr).ptr(o(1)?.ptr);
                    (Some(a), ew(pg.y_len()))
                }
                _ => (None, 0),
            };
            if pointwise || rows == 0 {
                // x viewed as [rows, c_in] already is the column matrix.
                let (m, n, k, ta, tb) = match kernel {
                    Kernel::Conv2D { .. } | Kernel::Conv2DBiasAct { .. } => (rows, co, k, false, false),
                    Kernel::Conv2DBackpropInput { .. } => (rows, k, co, false, true),
                    _ => (k, co, rows, true, false),
                };
                let gm = Gemm { m, n, k, ta, tb, a: a0.ptr, b: a1.ptr, c: y.ptr, alpha: 1.0, beta: 0.0 };
                ops.push(Op::Gemm(gm));
                if let Some(a) = epilogue {
                    launch(ops, "elementwise", "towers_bias_act_in_place_f32", ew(y.len), BLOCK, a)?;
                }
                if let Some(a) = pooled {
                    launch(ops, "pool", "towers_max_pool_f32", pool_grid, BLOCK, a)?;
                }
                return Ok(());
            }
            let ws = ws.ok_or_else(|| format!("{name}: no workspace"))?;
            let chunk = (ws.len / k.max(1)).min(rows);
            if chunk == 0 {
                return Err(format!("{name}: the workspace ({} elements) holds no row of {k}", ws.len));
            }
            let mut r0 = 0;
            while r0 < rows {
                let r = chunk.min(rows - r0);
                let im2col = |x: u64| {
                    let mut a = ArgPack::new();
                    a.push(g).i64(r0).i64(r).ptr(x).ptr(ws.ptr);
                    a
                };
                match kernel {
                    Kernel::Conv2D { .. } | Kernel::Conv2DBiasAct { .. } => {
                        launch(ops, "conv", "towers_im2col_f32", ew(r * k), BLOCK, im2col(a0.ptr))?;
                        let c = y.ptr + (r0 * co * 4) as u64;
                        ops.push(Op::Gemm(Gemm {
                            m: r,
                            n: co,
                            k,
                            ta: false,
                            tb: false,
                            a: ws.ptr,
                            b: a1.ptr,
                            c,
                            alpha: 1.0,
                            beta: 0.0,
                        }));
                    }
                    Kernel::Conv2DBackpropInput { .. } => {
                        let dy = a0.ptr + (r0 * co * 4) as u64;
                        ops.push(Op::Gemm(Gemm {
                            m: r,
                            n: k,
                            k: co,
                            ta: false,
                            tb: true,
                            a: dy,
                            b: a1.ptr,
                            c: ws.ptr,
                            alpha: 1.0,
                            beta: 0.0,
                        }));
                        let mut a = ArgPack::new();
                        a.push(g).i64(r0).i64(r).i32((r0 > 0) as i32).ptr(ws.ptr).ptr(y.ptr);
                        launch(ops, "conv", "towers_col2im_f32", ew(geom.x_len()), BLOCK, a)?;
                    }
                    _ => {
                        launch(ops, "conv", "towers_im2col_f32", ew(r * k), BLOCK, im2col(a0.ptr))?;
                        let dy = a1.ptr + (r0 * co * 4) as u64;
                        let beta = if r0 > 0 { 1.0 } else { 0.0 };
                        ops.push(Op::Gemm(Gemm {
                            m: k,
                            n: co,
                            k: r,
                            ta: true,
                            tb: false,
                            a: ws.ptr,
                            b: dy,
                            c: y.ptr,
                            alpha: 1.0,
                            beta,
                        }));
                    }
                }
                r0 += r;
            }
            if let Some(a) = epilogue {
                launch(ops, "elementwise", "towers_bias_act_in_place_f32", ew(y.len), BLOCK, a)?;
            }
            if let Some(a) = pooled {
                launch(ops, "pool", "towers_max_pool_f32", pool_grid, BLOCK, a)?;
            }
        }
        Kernel::MaxPool { geom } | Kernel::AvgPool { geom } => {
            let y = o(0)?;
            let mut a = ArgPack::new();
            a.push(PoolArgs::from(geom)).ptr(i(0)?.ptr).ptr(y.ptr);
            let e =
                if matches!(kernel, Kernel::MaxPool { .. }) { "towers_max_pool_f32" } else { "towers_avg_pool_f32" };
            launch(ops, "pool", e, ew(y.len), BLOCK, a)?;
        }
        Kernel::MaxPoolGrad { geom } => {
            let dx = o(0)?;
            let mut a = ArgPack::new();
            a.push(PoolArgs::from(geom)).ptr(i(0)?.ptr).ptr(i(1)?.ptr).ptr(i(2)?.ptr).ptr(dx.ptr);
            launch(ops, "pool", "towers_max_pool_grad_f32", ew(dx.len), BLOCK, a)?;
        }
        Kernel::MaxPoolGradActBiasGrad { geom, act } => {
            // The pool gradient into dx, then the activation and bias
            // gradients in place on it (the reduce family's fused kernel
            // with dy = dx).
            let (dx, db) = (o(0)?, o(1)?);
            let mut a = ArgPack::new();
            a.push(PoolArgs::from(geom)).ptr(i(0)?.ptr).ptr(i(1)?.ptr).ptr(i(2)?.ptr).ptr(dx.ptr);
            launch(ops, "pool", "towers_max_pool_grad_f32", ew(dx.len), BLOCK, a)?;
            let code = act.code();
            let rows = dx.len / geom.c.max(1);
            for (entry, grid, block, a) in
                bias_grad_launches(code, rows, geom.c, [dx.ptr, i(3)?.ptr, dx.ptr, db.ptr], side)
            {
                launch(ops, "reduce", entry, grid, block, a)?;
            }
        }
        Kernel::AvgPoolGrad { geom } => {
            let dx = o(0)?;
            let mut a = ArgPack::new();
            a.push(PoolArgs::from(geom)).ptr(i(0)?.ptr).ptr(dx.ptr);
            launch(ops, "pool", "towers_avg_pool_grad_f32", ew(dx.len), BLOCK, a)?;
        }
        Kernel::Concat { axis, shapes } => {
            let y = o(0)?;
            let first = shapes.first().ok_or_else(|| format!("{name}: no inputs"))?;
            let outer = numel(&first[..*axis]);
            let inner = numel(&first[axis + 1..]);
            let total: usize = shapes.iter().map(|s| s[*axis]).sum::<usize>() * inner;
            let mut off = 0;
            for (k, s) in shapes.iter().enumerate() {
                let run = s[*axis] * inner;
                let mut a = ArgPack::new();
                a.i64(outer).i64(run).i64(total).i64(off).ptr(i(k)?.ptr).ptr(y.ptr);
                launch(ops, "layout", "towers_concat_part_f32", ew(outer * run), BLOCK, a)?;
                off += run;
            }
        }
        Kernel::Split { axis, shape, sizes } => {
            let outer = numel(&shape[..*axis]);
            let inner = numel(&shape[axis + 1..]);
            let total = shape[*axis] * inner;
            let mut off = 0;
            for (k, s) in sizes.iter().enumerate() {
                let run = s * inner;
                let mut a = ArgPack::new();
                a.i64(outer).i64(run).i64(total).i64(off).ptr(i(0)?.ptr).ptr(o(k)?.ptr);
                launch(ops, "layout", "towers_split_part_f32", ew(outer * run), BLOCK, a)?;
                off += run;
            }
        }
        Kernel::Slice { shape, begin, size } | Kernel::SliceGrad { shape, begin, size } => {
            let y = o(0)?;
            let mut a = ArgPack::new();
            a.i64(y.len).ptr(i(0)?.ptr).ptr(y.ptr);
            a.push(d4(shape, 1, name)?).push(d4(begin, 0, name)?).push(d4(size, 1, name)?);
            let e = if matches!(kernel, Kernel::Slice { .. }) { "towers_slice_f32" } else { "towers_slice_grad_f32" };
            launch(ops, "layout", e, ew(y.len), BLOCK, a)?;
        }
        Kernel::BroadcastTo { x_shape, out_shape } => {
            let y = o(0)?;
            let mut xs = vec![1; out_shape.len().saturating_sub(x_shape.len())];
            xs.extend_from_slice(x_shape);
            let mut a = ArgPack::new();
            a.i64(y.len).ptr(i(0)?.ptr).ptr(y.ptr).push(d4(out_shape, 1, name)?).push(bstrides(&xs, name)?);
            launch(ops, "elementwise", "towers_broadcast_to_f32", ew(y.len), BLOCK, a)?;
        }
        Kernel::SumTo { x_shape, out_shape } => {
            let y = o(0)?;
            let mut a = ArgPack::new();
            a.i64(y.len).ptr(i(0)?.ptr).ptr(y.ptr).push(d4(x_shape, 1, name)?);
            a.i32(reduced_bits_to(x_shape, out_shape)).f32(1.0);
            launch(ops, "reduce", "towers_reduce_f32", grid_rows(y.len), BLOCK, a)?;
        }
        Kernel::ReduceSum { shape, axes } | Kernel::ReduceMean { shape, axes } => {
            let y = o(0)?;
            if shape.len() > 4 {
                return Err(format!("{name}: rank {} is above 4, the CUDA kernels' limit", shape.len()));
            }
            let bits = axes.iter().fold(0, |b, &ax| b | 1 << (4 - shape.len() + ax));
            let count: usize = axes.iter().map(|&ax| shape[ax]).product();
            let scale = if matches!(kernel, Kernel::ReduceMean { .. }) { 1.0 / count.max(1) as f32 } else { 1.0 };
            let mut a = ArgPack::new();
            a.i64(y.len).ptr(i(0)?.ptr).ptr(y.ptr).push(d4(shape, 1, name)?).i32(bits).f32(scale);
            launch(ops, "reduce", "towers_reduce_f32", grid_rows(y.len), BLOCK, a)?;
        }
        Kernel::Softmax { classes }
        | Kernel::LogSoftmax { classes }
        | Kernel::SoftmaxGrad { classes }
        | Kernel::LogSoftmaxGrad { classes } => {
            let y = o(0)?;
            let rows = y.len / (*classes).max(1);
            let mut a = ArgPack::new();
            a.i64(rows).i32(*classes as i32);
            for x in ins {
                a.ptr(x.ptr);
            }
            a.ptr(y.ptr);
            let e = match kernel {
                Kernel::Softmax { .. } => "towers_softmax_f32",
                Kernel::LogSoftmax { .. } => "towers_log_softmax_f32",
                Kernel::SoftmaxGrad { .. } => "towers_softmax_grad_f32",
                _ => "towers_log_softmax_grad_f32",
            };
            launch(ops, "softmax", e, grid_rows(rows), BLOCK, a)?;
        }
        Kernel::SparseSoftmaxXent { classes } | Kernel::SoftmaxXent { classes } => {
            let logits = i(0)?;
            let rows = logits.len / (*classes).max(1);
            let mut a = ArgPack::new();
            a.i64(rows).i32(*classes as i32).ptr(logits.ptr).ptr(i(1)?.ptr).ptr(o(0)?.ptr).ptr(o(1)?.ptr);
            if matches!(kernel, Kernel::SparseSoftmaxXent { .. }) {
                a.ptr(0); // no scale
            }
            let e = if matches!(kernel, Kernel::SparseSoftmaxXent { .. }) {
                "towers_sparse_softmax_xent_f32"
            } else {
                "towers_softmax_xent_f32"
            };
            launch(ops, "softmax", e, grid_rows(rows), BLOCK, a)?;
        }
        Kernel::SparseSoftmaxXentMeanGrad { classes } => {
            // The scaled cross-entropy, then the loss's mean and the bias
            // gradient as the reduce family's kernels (ReduceMean and
            // BiasAddGrad's launches).
            let (logits, loss, mean, dlogits, db) = (i(0)?, o(0)?, o(1)?, o(2)?, o(3)?);
            let (rows, c) = (logits.len / (*classes).max(1), *classes);
            let mut a = ArgPack::new();
            a.i64(rows).i32(c as i32).ptr(logits.ptr).ptr(i(1)?.ptr).ptr(loss.ptr).ptr(dlogits.ptr).ptr(i(2)?.ptr);
            launch(ops, "softmax", "towers_sparse_softmax_xent_f32", grid_rows(rows), BLOCK, a)?;
            let mut a = ArgPack::new();
            a.i64(1).ptr(loss.ptr).ptr(mean.ptr).push(d4(&[rows], 1, name)?).i32(0b1000).f32(1.0 / rows.max(1) as f32);
            launch(ops, "reduce", "towers_reduce_f32", grid_rows(1), BLOCK, a)?;
            let mut a = ArgPack::new();
            a.i64(c).ptr(dlogits.ptr).ptr(db.ptr).push(Dims4 { d: [1, 1, rows as i64, c as i64] });
            a.i32(0b0100).f32(1.0);
            launch(ops, "reduce", "towers_reduce_f32", grid_rows(c), BLOCK, a)?;
        }
        Kernel::L2Loss => {
            let x = i(0)?;
            let mut a = ArgPack::new();
            a.i64(x.len).ptr(x.ptr).ptr(o(0)?.ptr);
            launch(ops, "reduce", "towers_l2_loss_f32", 1, BLOCK, a)?;
        }
        Kernel::ArgMax { shape, axis } => {
            let (outer, len, inner) = (numel(&shape[..*axis]), shape[*axis], numel(&shape[axis + 1..]));
            let mut a = ArgPack::new();
            a.i64(outer).i64(len).i64(inner).ptr(i(0)?.ptr).ptr(o(0)?.ptr);
            launch(ops, "reduce", "towers_argmax_f32", ew(outer * inner), BLOCK, a)?;
        }
        Kernel::Equal { dtype } => {
            let y = o(0)?;
            let mut a = ArgPack::new();
            a.i64(y.len).ptr(i(0)?.ptr).ptr(i(1)?.ptr).ptr(y.ptr);
            let e = if *dtype == DType::F32 { "towers_equal_f32" } else { "towers_equal_i32" };
            launch(ops, "reduce", e, ew(y.len), BLOCK, a)?;
        }
        Kernel::Cast { from, to } => {
            let y = o(0)?;
            let e = match (from, to) {
                (DType::F32, DType::I32) => "towers_cast_f32_i32",
                (DType::I32 | DType::Bool, DType::F32) => "towers_cast_i32_f32",
                (DType::F32, DType::Bool) => "towers_cast_f32_bool",
                (_, DType::Bool) => "towers_cast_i32_bool",
                _ => "towers_copy_u32",
            };
            let mut a = ArgPack::new();
            a.i64(y.len).ptr(i(0)?.ptr).ptr(y.ptr);
            launch(ops, "reduce", e, ew(y.len), BLOCK, a)?;
        }
        Kernel::Dropout { keep_prob, seed, elem_offset } => {
            let y = o(0)?;
            let mut a = ArgPack::new();
            a.i64(y.len).f32(*keep_prob).u64(*seed).step().u64(*elem_offset as u64);
            a.ptr(i(0)?.ptr).ptr(y.ptr).ptr(o(1)?.ptr);
            launch(ops, "dropout", "towers_dropout_f32", ew(y.len), BLOCK, a)?;
        }
        Kernel::Fill { value } => {
            let y = o(0)?;
            let mut a = ArgPack::new();
            a.i64(y.len).f32(*value).ptr(y.ptr);
            launch(ops, "misc", "towers_fill_f32", ew(y.len), BLOCK, a)?;
        }
        Kernel::BatchNormTrain { channels, epsilon } => {
            let (x, c) = (i(0)?, *channels);
            let rows = x.len / c.max(1);
            let mut a = ArgPack::new();
            a.i64(rows).i64(c).f32(*epsilon).ptr(x.ptr).ptr(o(1)?.ptr).ptr(o(2)?.ptr).ptr(o(3)?.ptr);
            launch(ops, "batchnorm", "towers_batch_norm_stats_f32", grid_rows(c), BLOCK, a)?;
            let mut a = ArgPack::new();
            a.i64(x.len).i64(c).ptr(x.ptr).ptr(i(1)?.ptr).ptr(i(2)?.ptr).ptr(o(1)?.ptr).ptr(o(2)?.ptr).ptr(o(0)?.ptr);
            launch(ops, "batchnorm", "towers_batch_norm_apply_f32", ew(x.len), BLOCK, a)?;
        }
        Kernel::BatchNormInfer { channels, epsilon } => {
            let x = i(0)?;
            let mut a = ArgPack::new();
            a.i64(x.len).i64(*channels).f32(*epsilon);
            for k in 0..5 {
                a.ptr(i(k)?.ptr);
            }
            for k in 0..4 {
                a.ptr(o(k)?.ptr);
            }
            launch(ops, "batchnorm", "towers_batch_norm_infer_f32", ew(x.len), BLOCK, a)?;
        }
        Kernel::BatchNormGrad { channels } => {
            let (dy, x, c) = (i(0)?, i(1)?, *channels);
            let rows = x.len / c.max(1);
            let (mean, inv_std) = (i(3)?.ptr, i(4)?.ptr);
            let (dx, dgamma, dbeta) = (o(0)?.ptr, o(1)?.ptr, o(2)?.ptr);
            let mut a = ArgPack::new();
            a.i64(rows).i64(c).ptr(dy.ptr).ptr(x.ptr).ptr(mean).ptr(inv_std).ptr(dgamma).ptr(dbeta);
            launch(ops, "batchnorm", "towers_batch_norm_grad_reduce_f32", grid_rows(c), BLOCK, a)?;
            let mut a = ArgPack::new();
            a.i64(x.len).i64(c).ptr(dy.ptr).ptr(x.ptr).ptr(i(2)?.ptr).ptr(mean).ptr(inv_std);
            a.ptr(dgamma).ptr(dbeta).ptr(dx);
            launch(ops, "batchnorm", "towers_batch_norm_grad_dx_f32", ew(x.len), BLOCK, a)?;
        }
        Kernel::AssignMovingAverage { decay } => {
            let v = o(0)?;
            let mut a = ArgPack::new();
            a.i64(v.len).f32(*decay).ptr(i(0)?.ptr).ptr(v.ptr);
            launch(ops, "optim", "towers_assign_moving_average_f32", ew(v.len), BLOCK, a)?;
        }
        // The learning rate is an input buffer (f32[1]), read on the device each step.
        Kernel::ApplyGradientDescent {} => {
            let w = o(0)?;
            let mut a = ArgPack::new();
            a.i64(w.len).ptr(i(1)?.ptr).ptr(i(0)?.ptr).ptr(w.ptr);
            launch(ops, "optim", "towers_apply_gradient_descent_f32", ew(w.len), BLOCK, a)?;
        }
        Kernel::ApplyMomentum { momentum, nesterov } => {
            let w = o(0)?;
            let mut a = ArgPack::new();
            a.i64(w.len).ptr(i(1)?.ptr).f32(*momentum).i32(*nesterov as i32).ptr(i(0)?.ptr).ptr(w.ptr).ptr(o(1)?.ptr);
            launch(ops, "optim", "towers_apply_momentum_f32", ew(w.len), BLOCK, a)?;
        }
        Kernel::ApplyAdam { beta1, beta2, epsilon } => {
            let w = o(0)?;
            let mut a = ArgPack::new();
            a.i64(w.len).ptr(i(2)?.ptr).f32(*beta1).f32(*beta2).f32(*epsilon).ptr(i(0)?.ptr).ptr(i(1)?.ptr);
            a.ptr(w.ptr).ptr(o(1)?.ptr).ptr(o(2)?.ptr);
            launch(ops, "optim", "towers_apply_adam_f32", ew(w.len), BLOCK, a)?;
        }
        Kernel::MeanApply { weights, apply } => {
            let (w, count) = (o(0)?, weights.len());
            let ptrs: Vec<u64> = ins[..count.min(ins.len())].iter().map(|d| d.ptr).collect();
            let mut a = ArgPack::new();
            a.i64(w.len).i32(count as i32).side_ptr(side.push(&ptrs)).side_ptr(side.push(weights));
            let e = match apply.as_ref() {
                // Inputs after the gradients: (Adam's global_step,) the learning rate.
                Kernel::ApplyGradientDescent {} => {
                    a.ptr(i(count)?.ptr).ptr(w.ptr);
                    "towers_mean_apply_gradient_descent_f32"
                }
                Kernel::ApplyMomentum { momentum, nesterov } => {
                    a.ptr(i(count)?.ptr).f32(*momentum).i32(*nesterov as i32).ptr(w.ptr).ptr(o(1)?.ptr);
                    "towers_mean_apply_momentum_f32"
                }
                Kernel::ApplyAdam { beta1, beta2, epsilon } => {
                    a.ptr(i(count + 1)?.ptr).f32(*beta1).f32(*beta2).f32(*epsilon).ptr(i(count)?.ptr);
                    a.ptr(w.ptr).ptr(o(1)?.ptr).ptr(o(2)?.ptr);
                    "towers_mean_apply_adam_f32"
                }
                Kernel::ApplyRmsProp { decay, momentum, epsilon } => {
                    a.ptr(i(count)?.ptr).f32(*decay).f32(*momentum).f32(*epsilon);
                    a.ptr(w.ptr).ptr(o(1)?.ptr).ptr(o(2)?.ptr);
                    "towers_mean_apply_rmsprop_f32"
                }
                Kernel::ApplyAdagrad {} => {
                    a.ptr(i(count)?.ptr).ptr(w.ptr).ptr(o(1)?.ptr);
                    "towers_mean_apply_adagrad_f32"
                }
                other => return Err(format!("mean_apply cannot fuse into {}", other.name())),
            };
            launch(ops, "optim", e, ew(w.len), BLOCK, a)?;
        }
        Kernel::MultiApply { apply, count } => {
            let n = *count;
            let slots = outs.len() / n.max(1);
            let mut offsets: Vec<i64> = vec![0];
            for m in 0..n {
                offsets.push(offsets[m] + o(m * slots)?.len as i64);
            }
            let total = offsets[n] as usize;
            let array =
                |side: &mut Side, s: usize| side.push(&(0..n).map(|m| outs[m * slots + s].ptr).collect::<Vec<u64>>());
            let grads: Vec<u64> = ins[..n.min(ins.len())].iter().map(|d| d.ptr).collect();
            let mut a = ArgPack::new();
            a.i64(total).i32(n as i32).side_ptr(side.push(&offsets)).side_ptr(side.push(&grads));
            a.side_ptr(array(side, 0));
            let lr = i(ins.len().saturating_sub(1))?.ptr;
            let e = match apply.as_ref() {
                Kernel::ApplyGradientDescent {} => {
                    a.ptr(lr);
                    "towers_multi_apply_gradient_descent_f32"
                }
                Kernel::ApplyMomentum { momentum, nesterov } => {
                    a.side_ptr(array(side, 1)).ptr(lr).f32(*momentum).i32(*nesterov as i32);
                    "towers_multi_apply_momentum_f32"
                }
                Kernel::ApplyAdam { beta1, beta2, epsilon } => {
                    a.side_ptr(array(side, 1)).side_ptr(array(side, 2)).ptr(lr);
                    a.f32(*beta1).f32(*beta2).f32(*epsilon).ptr(i(n)?.ptr);
                    "towers_multi_apply_adam_f32"
                }
                Kernel::ApplyRmsProp { decay, momentum, epsilon } => {
                    a.side_ptr(array(side, 1)).side_ptr(array(side, 2)).ptr(lr);
                    a.f32(*decay).f32(*momentum).f32(*epsilon);
                    "towers_multi_apply_rmsprop_f32"
                }
                Kernel::ApplyAdagrad {} => {
                    a.side_ptr(array(side, 1)).ptr(lr);
                    "towers_multi_apply_adagrad_f32"
                }
                other => return Err(format!("multi_apply cannot run {}", other.name())),
            };
            launch(ops, "optim", e, ew(total), BLOCK, a)?;
        }
        Kernel::IncrementStep => {
            let mut a = ArgPack::new();
            a.ptr(o(0)?.ptr);
            launch(ops, "optim", "towers_increment_step_i32", 1, 1, a)?;
        }
        // array ops (issue 22)
        Kernel::OneHot { .. }
        | Kernel::Transpose { .. }
        | Kernel::Pad { .. }
        | Kernel::Gather { .. }
        | Kernel::GatherGrad { .. }
        | Kernel::Tile { .. }
        | Kernel::TileGrad { .. } => array::lower(kernel, ins, outs, mods, ops)?,
        Kernel::ApplyRmsProp { decay, momentum, epsilon } => {
            let w = o(0)?;
            let mut a = ArgPack::new();
            a.i64(w.len).ptr(i(1)?.ptr).f32(*decay).f32(*momentum).f32(*epsilon).ptr(i(0)?.ptr);
            a.ptr(w.ptr).ptr(o(1)?.ptr).ptr(o(2)?.ptr);
            launch(ops, "optim", "towers_apply_rmsprop_f32", ew(w.len), BLOCK, a)?;
        }
        Kernel::ApplyAdagrad {} => {
            let w = o(0)?;
            let mut a = ArgPack::new();
            a.i64(w.len).ptr(i(1)?.ptr).ptr(i(0)?.ptr).ptr(w.ptr).ptr(o(1)?.ptr);
            launch(ops, "optim", "towers_apply_adagrad_f32", ew(w.len), BLOCK, a)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::reduced_bits_to;

    #[test]
    fn reduced_axes_of_sum_to_shape() {
        // [N, C] -> [C]: rows (padded axis 2).
        assert_eq!(reduced_bits_to(&[8, 3], &[3]), 0b0100);
        // [N, H, W, C] -> [1, 1, 1, C].
        assert_eq!(reduced_bits_to(&[2, 4, 4, 3], &[1, 1, 1, 3]), 0b0111);
        // [2, 3] -> [] (a scalar).
        assert_eq!(reduced_bits_to(&[2, 3], &[]), 0b1100);
        // Nothing reduced where x is already 1.
        assert_eq!(reduced_bits_to(&[1, 3], &[3]), 0);
    }
}
