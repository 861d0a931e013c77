//! Every CUDA twin against its CPU body on a GPU, when one exists: random
//! inputs (fixed seeds), each source compiled by NVRTC to a cubin for the
//! device's own architecture, launched through cudarc's driver API, copied
//! back and compared with the CPU kernel on the same inputs.
//!
//! Tolerances, per kernel (`tol` in the table the test prints):
//! - `exact`: bit for bit (NaN matches NaN): copies, selections, integer
//!   kernels, dropout masks, pooling, the tower reduction, optimizer updates
//!   (their CUDA forms round every step as the CPU does);
//! - otherwise `|gpu - cpu| <= tol * max(|cpu|, 1)`: tree-ordered sums
//!   (1e-4: sums of up to thousands of terms in another order), softmax rows
//!   (1e-5), transcendental functions (`expf`, `tanhf`: 2e-6) differ by rounding.
//!
//! Skipped, with a message, without a CUDA driver, a GPU or NVRTC (never
//! required: CI has no GPU). The CPU bodies are called through the small
//! adapters in `mod cpu` below, the one place to fix when their signatures move.

mod common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use towers_kernels::cuda::{self, grid_1d, grid_rows, ConvArgs, Dims4, PoolArgs, BLOCK};

/// The CPU bodies, called as the runtime's dispatch (runtime/src/exec.rs) calls them.
mod cpu {
    use towers_kernels::elementwise::{self as ew, BinaryOp, UnaryOp};
    pub use towers_kernels::{batchnorm, conv, dropout, gemm, layout, misc, optim, pool, random, reduce, softmax};

    pub fn binary(op: i32, a: &[f32], sa: &[usize], b: &[f32], sb: &[usize], out: &mut [f32]) {
        let op = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div][op as usize];
        ew::binary(op, a, sa, b, sb, out).unwrap();
    }
    pub fn broadcast_to(x: &[f32], xs: &[usize], out: &mut [f32], os: &[usize]) {
        ew::broadcast_to(x, xs, out, os).unwrap();
    }
    pub fn sum_to(x: &[f32], xs: &[usize], out: &mut [f32], os: &[usize]) {
        ew::sum_to_shape(x, xs, out, os).unwrap();
    }
    pub fn bias_add(x: &[f32], b: &[f32], y: &mut [f32]) {
        ew::bias_add(x, b, y);
    }
    pub fn bias_add_grad(dy: &[f32], db: &mut [f32]) {
        ew::bias_add_grad(dy, db);
    }
    pub fn unary(op: i32, x: &[f32], y: &mut [f32]) {
        ew::unary([UnaryOp::Neg, UnaryOp::Relu, UnaryOp::Sigmoid, UnaryOp::Tanh][op as usize], x, y);
    }
    pub fn unary_grad(op: i32, dy: &[f32], y: &[f32], dx: &mut [f32]) {
        match op {
            0 => ew::scale(dy, -1.0, dx),
            1 => ew::relu_grad(dy, y, dx),
            2 => ew::sigmoid_grad(dy, y, dx),
            _ => ew::tanh_grad(dy, y, dx),
        }
    }
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(m: usize, k: usize, n: usize, ta: bool, tb: bool, a: &[f32], b: &[f32], c: &mut [f32]) {
        gemm::matmul(&gemm::MatMul::new(m, k, n).trans_a(ta).trans_b(tb), a, b, c);
    }
    /// runtime/src/exec.rs `dropout_at`.
    pub fn dropout_at(x: &[f32], keep: f32, seed: u64, step: u64, offset: usize, y: &mut [f32], mask: &mut [f32]) {
        let scale = if keep > 0.0 { 1.0 / keep.min(1.0) } else { 0.0 };
        for (k, (m, (o, v))) in mask.iter_mut().zip(y.iter_mut().zip(x)).enumerate() {
            let g = (offset + k) as u64;
            let r = random::philox_block(seed, step, g / 4);
            *m = if keep >= 1.0 || random::u32_to_unit(r[(g % 4) as usize]) < keep { scale } else { 0.0 };
            *o = *v * *m;
        }
    }
    /// exec.rs BatchNormTrain: the kernel, then the unbiased variance.
    pub fn batch_norm_train(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32, outs: &mut [Vec<f32>; 4]) {
        let [y, mean, inv_std, var] = outs;
        batchnorm::batch_norm_train(x, gamma, beta, eps, y, mean, var, inv_std);
        let rows = x.len() / gamma.len();
        if rows > 1 {
            ew::scale_inplace(var, rows as f32 / (rows - 1) as f32);
        }
    }
}

// ---------------------------------------------------------------- harness

#[repr(transparent)]
#[derive(Clone, Copy)]
struct Val<T>(T);
unsafe impl<T: Copy> DeviceRepr for Val<T> {}

/// A launch argument, by value; device buffers go as raw pointers.
enum A {
    I32(i32),
    I64(i64),
    U64(u64),
    F32(f32),
    D4(Val<Dims4>),
    Pool(Val<PoolArgs>),
    Conv(Val<ConvArgs>),
}

fn d4(v: &[usize], fill: i64) -> A {
    A::D4(Val(Dims4::padded(v, fill).unwrap()))
}
fn bs(v: &[usize]) -> A {
    A::D4(Val(Dims4::broadcast_strides(v).unwrap()))
}
fn n(v: usize) -> A {
    A::I64(v as i64)
}

struct Dev<T> {
    s: CudaSlice<T>,
    ptr: u64,
}

impl<T> Dev<T> {
    fn a(&self) -> A {
        A::U64(self.ptr)
    }
}

struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    modules: RefCell<HashMap<&'static str, Arc<CudaModule>>>,
}

impl Gpu {
    fn module(&self, family: &'static str) -> Arc<CudaModule> {
        if let Some(m) = self.modules.borrow().get(family) {
            return m.clone();
        }
        let src = cuda::source(family).unwrap();
        let t = std::time::Instant::now();
        let cubin = common::compile(src.path, src.code, &self.arch, &[]).unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "compiled {:<28} for {} in {} ms ({} bytes)",
            src.path,
            self.arch,
            t.elapsed().as_millis(),
            cubin.image.len()
        );
        let m = self.ctx.load_module(Ptx::from_binary(cubin.image)).expect("cuModuleLoadData");
        self.modules.borrow_mut().insert(family, m.clone());
        m
    }

    fn launch(&self, family: &'static str, entry: &str, grid: u32, block: u32, args: &[A]) {
        let f = self.module(family).load_function(entry).unwrap_or_else(|e| panic!("{entry}: {e:?}"));
        let mut b = self.stream.launch_builder(&f);
        for a in args {
            match a {
                A::I32(v) => b.arg(v),
                A::I64(v) => b.arg(v),
                A::U64(v) => b.arg(v),
                A::F32(v) => b.arg(v),
                A::D4(v) => b.arg(v),
                A::Pool(v) => b.arg(v),
                A::Conv(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
        unsafe { b.launch(cfg) }.unwrap_or_else(|e| panic!("{entry}: {e:?}"));
        self.stream.synchronize().unwrap_or_else(|e| panic!("{entry}: {e:?}"));
    }

    /// Elementwise geometry over `count` elements.
    fn ew(&self, family: &'static str, entry: &str, count: usize, args: &[A]) {
        self.launch(family, entry, grid_1d(count), BLOCK, args)
    }

    fn up<T: DeviceRepr + Copy + Default>(&self, v: &[T]) -> Dev<T> {
        // Never allocate zero bytes: pad empty buffers with one element.
        let v: Vec<T> = if v.is_empty() { vec![T::default()] } else { v.to_vec() };
        let s = self.stream.clone_htod(&v).unwrap();
        let ptr = {
            let (p, _sync) = s.device_ptr(&self.stream);
            p
        };
        Dev { s, ptr }
    }

    fn down<T: DeviceRepr + Copy + Default>(&self, d: &Dev<T>, len: usize) -> Vec<T> {
        let mut v = self.stream.clone_dtoh(&d.s).unwrap();
        v.truncate(len);
        v
    }

    /// A device array of the buffers' pointers.
    fn ptrs<T>(&self, bufs: &[&Dev<T>]) -> Dev<u64> {
        self.up(&bufs.iter().map(|b| b.ptr).collect::<Vec<_>>())
    }
}

// ---------------------------------------------------------------- checks

struct Check {
    kernel: &'static str,
    case: String,
    max_abs: f64,
    max_err: f64,
    tol: Option<f64>,
    pass: bool,
}

#[derive(Default)]
struct Report {
    checks: Vec<Check>,
}

impl Report {
    /// `tol: None` = bit for bit.
    fn f32(&mut self, kernel: &'static str, case: impl Into<String>, got: &[f32], want: &[f32], tol: Option<f64>) {
        let mut pass = got.len() == want.len();
        let (mut max_abs, mut max_err) = (0f64, 0f64);
        for (g, w) in got.iter().zip(want) {
            let (g, w) = (*g as f64, *w as f64);
            if g.is_nan() || w.is_nan() {
                pass &= g.is_nan() && w.is_nan();
                continue;
            }
            let d = if g == w { 0.0 } else { (g - w).abs() };
            max_abs = max_abs.max(d);
            max_err = max_err.max(d / w.abs().max(1.0));
        }
        match tol {
            None => pass &= got.iter().zip(want).all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())),
            Some(t) => pass &= max_err <= t,
        }
        self.checks.push(Check { kernel, case: case.into(), max_abs, max_err, tol, pass });
    }

    fn i32(&mut self, kernel: &'static str, case: impl Into<String>, got: &[i32], want: &[i32]) {
        let wrong = got.iter().zip(want).filter(|(g, w)| g != w).count();
        let pass = got.len() == want.len() && wrong == 0;
        let max_abs = got.iter().zip(want).map(|(g, w)| (*g as f64 - *w as f64).abs()).fold(0.0, f64::max);
        self.checks.push(Check { kernel, case: case.into(), max_abs, max_err: max_abs, tol: None, pass });
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [lo, hi).
    fn vec(&mut self, len: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..len).map(|_| lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)).collect()
    }
    /// Multiples of 1/4 in [-2, 2): many ties (pooling, argmax).
    fn coarse(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| ((self.next() >> 40) % 16) as f32 * 0.25 - 2.0).collect()
    }
    fn ints(&mut self, len: usize, hi: u64) -> Vec<i32> {
        (0..len).map(|_| (self.next() % hi) as i32).collect()
    }
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

// ---------------------------------------------------------------- the test

fn gpu() -> Result<Gpu, String> {
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so) on this machine".into());
    }
    let count = CudaContext::device_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
    if count < 1 {
        return Err("a CUDA driver but no GPU".into());
    }
    if !common::nvrtc_present() {
        return Err("no libnvrtc (libnvrtc.so.13) on LD_LIBRARY_PATH".into());
    }
    let ctx = CudaContext::new(0).map_err(|e| format!("cuCtxCreate: {e:?}"))?;
    let (major, minor) = ctx.compute_capability().map_err(|e| format!("{e:?}"))?;
    let name = ctx.name().unwrap_or_default();
    let (nv_major, nv_minor) = common::nvrtc_version();
    eprintln!("device 0: {name}, sm_{major}{minor}; NVRTC {nv_major}.{nv_minor}");
    let stream = ctx.default_stream();
    Ok(Gpu { ctx, stream, arch: format!("sm_{major}{minor}"), modules: RefCell::default() })
}

#[test]
fn cuda_twins_match_cpu() {
    let g = match gpu() {
        Ok(g) => g,
        Err(why) => {
            eprintln!("\n========== SKIPPED: cuda_twins ({why}) ==========\n");
            return;
        }
    };
    let mut r = Report::default();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    elementwise(&g, &mut r, &mut rng);
    reductions(&g, &mut r, &mut rng);
    softmax(&g, &mut r, &mut rng);
    pools(&g, &mut r, &mut rng);
    convs(&g, &mut r, &mut rng);
    layout(&g, &mut r, &mut rng);
    dropout(&g, &mut r, &mut rng);
    batchnorm(&g, &mut r, &mut rng);
    optim(&g, &mut r, &mut rng);

    eprintln!("\n{:<24} {:<44} {:>8} {:>11} {:>11}  result", "kernel", "case", "tol", "max |err|", "max rel");
    for c in &r.checks {
        let tol = c.tol.map(|t| format!("{t:.0e}")).unwrap_or_else(|| "exact".into());
        eprintln!(
            "{:<24} {:<44} {:>8} {:>11.3e} {:>11.3e}  {}",
            c.kernel,
            c.case,
            tol,
            c.max_abs,
            c.max_err,
            if c.pass { "ok" } else { "FAILED" }
        );
    }
    let mut kernels: Vec<&str> = Vec::new();
    for c in &r.checks {
        if !kernels.contains(&c.kernel) {
            kernels.push(c.kernel);
        }
    }
    let failed: Vec<&str> =
        kernels.iter().copied().filter(|k| r.checks.iter().any(|c| c.kernel == *k && !c.pass)).collect();
    let missing: Vec<&str> =
        cuda::KERNELS.iter().filter(|k| k.family.is_some() && !kernels.contains(&k.kernel)).map(|k| k.kernel).collect();
    eprintln!(
        "\n{} kernels checked ({} checks): {} passed, {} failed {:?}; not covered: {:?}",
        kernels.len(),
        r.checks.len(),
        kernels.len() - failed.len(),
        failed.len(),
        failed,
        missing
    );
    assert!(failed.is_empty() && missing.is_empty(), "failed: {failed:?}, not covered: {missing:?}");
}

fn elementwise(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    const EWF: &str = "elementwise";
    let cases: &[(&[usize], &[usize])] =
        &[(&[3, 4], &[3, 4]), (&[2, 3, 4, 5], &[3, 1, 5]), (&[64, 10], &[10]), (&[], &[7, 5]), (&[5, 1], &[1, 6])];
    for &(sa, sb) in cases {
        let (od, _) = towers_kernels::shape::broadcast_shapes("t", sa, sb).unwrap();
        let rank = sa.len().max(sb.len());
        let out_shape: Vec<usize> = od[4 - rank..].to_vec();
        let a = rng.vec(numel(sa), -2.0, 2.0);
        let b: Vec<f32> = rng.vec(numel(sb), 0.5, 2.0);
        let (da, db) = (g.up(&a), g.up(&b));
        let len = numel(&out_shape);
        let dout = g.up(&vec![0f32; len]);
        for op in 0..4 {
            g.ew(
                EWF,
                "towers_binary_f32",
                len,
                &[A::I32(op), n(len), da.a(), db.a(), dout.a(), d4(&out_shape, 1), bs(sa), bs(sb)],
            );
            let mut want = vec![0f32; len];
            cpu::binary(op, &a, sa, &b, sb, &mut want);
            r.f32("binary", format!("op {op} {sa:?} {sb:?}"), &g.down(&dout, len), &want, None);
        }
    }
    // broadcast_to and its adjoint sum_to_shape.
    for (small, big) in [(&[3usize, 1, 5][..], &[2usize, 3, 4, 5][..]), (&[4], &[6, 4]), (&[6, 1], &[6, 300])] {
        let x = rng.vec(numel(small), -1.0, 1.0);
        let dx = g.up(&x);
        let dout = g.up(&vec![0f32; numel(big)]);
        g.ew(EWF, "towers_broadcast_to_f32", numel(big), &[n(numel(big)), dx.a(), dout.a(), d4(big, 1), bs(small)]);
        let mut want = vec![0f32; numel(big)];
        cpu::broadcast_to(&x, small, &mut want, big);
        r.f32("broadcast_to", format!("{small:?} -> {big:?}"), &g.down(&dout, numel(big)), &want, None);

        let y = rng.vec(numel(big), -1.0, 1.0);
        let dy = g.up(&y);
        let ds = g.up(&vec![0f32; numel(small)]);
        let pb = Dims4::padded(big, 1).unwrap();
        let ps = Dims4::padded(small, 1).unwrap();
        let mask = (0..4).filter(|&k| ps.d[k] == 1 && pb.d[k] != 1).fold(0, |m, k| m | (1 << k));
        g.launch(
            "reduce",
            "towers_reduce_f32",
            grid_rows(numel(small)),
            BLOCK,
            &[n(numel(small)), dy.a(), ds.a(), A::D4(Val(pb)), A::I32(mask), A::F32(1.0)],
        );
        let mut want = vec![0f32; numel(small)];
        cpu::sum_to(&y, big, &mut want, small);
        r.f32("sum_to_shape", format!("{big:?} -> {small:?}"), &g.down(&ds, numel(small)), &want, Some(1e-4));
    }
    // bias_add and its gradient.
    for (rows, c) in [(7usize, 5usize), (512, 64), (3000, 10)] {
        let x = rng.vec(rows * c, -1.0, 1.0);
        let b = rng.vec(c, -1.0, 1.0);
        let (dx, db, dy) = (g.up(&x), g.up(&b), g.up(&vec![0f32; rows * c]));
        g.ew(EWF, "towers_bias_add_f32", rows * c, &[n(rows * c), n(c), dx.a(), db.a(), dy.a()]);
        let mut want = vec![0f32; rows * c];
        cpu::bias_add(&x, &b, &mut want);
        r.f32("bias_add", format!("[{rows}, {c}]"), &g.down(&dy, rows * c), &want, None);
        let dgb = g.up(&vec![0f32; c]);
        g.launch(
            "reduce",
            "towers_reduce_f32",
            grid_rows(c),
            BLOCK,
            &[n(c), dx.a(), dgb.a(), d4(&[rows, c], 1), A::I32(0b0100), A::F32(1.0)],
        );
        let mut want = vec![0f32; c];
        cpu::bias_add_grad(&x, &mut want);
        r.f32("bias_add_grad", format!("[{rows}, {c}]"), &g.down(&dgb, c), &want, Some(1e-4));
    }
    // unary and unary_grad.
    let len = 10_007;
    let mut x = rng.vec(len, -6.0, 6.0);
    x[0] = 0.0;
    x[1] = -0.0;
    x[2] = -100.0;
    x[3] = 100.0;
    let gy = rng.vec(len, -1.0, 1.0);
    let (dxx, dgy, dy, ddx) = (g.up(&x), g.up(&gy), g.up(&vec![0f32; len]), g.up(&vec![0f32; len]));
    for op in 0..4 {
        g.ew(EWF, "towers_unary_f32", len, &[A::I32(op), n(len), dxx.a(), dy.a()]);
        let mut y = vec![0f32; len];
        cpu::unary(op, &x, &mut y);
        let tol = if op >= 2 { Some(2e-6) } else { None };
        r.f32("unary", ["Neg", "Relu", "Sigmoid", "Tanh"][op as usize], &g.down(&dy, len), &y, tol);
        // The gradient from the CPU's forward output, so both sides see the same y.
        let dyy = g.up(&y);
        g.ew(EWF, "towers_unary_grad_f32", len, &[A::I32(op), n(len), dgy.a(), dyy.a(), ddx.a()]);
        let mut want = vec![0f32; len];
        cpu::unary_grad(op, &gy, &y, &mut want);
        r.f32("unary_grad", ["Neg", "Relu", "Sigmoid", "Tanh"][op as usize], &g.down(&ddx, len), &want, None);
    }
    // add_n, weighted_sum, fill.
    let len = 70_001;
    let xs: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(len, -1.0, 1.0)).collect();
    let devs: Vec<Dev<f32>> = xs.iter().map(|x| g.up(x)).collect();
    let refs: Vec<&Dev<f32>> = devs.iter().collect();
    let p = g.ptrs(&refs);
    let out = g.up(&vec![0f32; len]);
    let cx: Vec<&[f32]> = xs.iter().map(|v| v.as_slice()).collect();
    g.ew("misc", "towers_add_n_f32", len, &[n(len), A::I32(4), p.a(), out.a()]);
    let mut want = vec![0f32; len];
    cpu::misc::add_n(&cx, &mut want);
    r.f32("add_n", "4 x 70001", &g.down(&out, len), &want, None);
    let w = [0.5f32, 0.25, 0.125, 0.125];
    let dw = g.up(&w);
    g.ew("misc", "towers_weighted_sum_f32", len, &[n(len), A::I32(4), p.a(), dw.a(), out.a()]);
    cpu::misc::weighted_sum(&cx, &w, &mut want);
    r.f32("weighted_sum", "4 towers x 70001", &g.down(&out, len), &want, None);
    let w3 = [0.3f32, 0.45, 0.25];
    let dw3 = g.up(&w3);
    g.ew("misc", "towers_weighted_sum_f32", len, &[n(len), A::I32(3), p.a(), dw3.a(), out.a()]);
    cpu::misc::weighted_sum(&cx[..3], &w3, &mut want);
    r.f32("weighted_sum", "3 uneven towers", &g.down(&out, len), &want, None);
    g.ew("misc", "towers_fill_f32", len, &[n(len), A::F32(0.75), out.a()]);
    r.f32("fill", "0.75", &g.down(&out, len), &vec![0.75; len], None);
}

fn reductions(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    for (shape, axes) in [
        (&[4usize, 5, 6, 7][..], &[1usize, 3][..]),
        (&[4, 5, 6, 7], &[0]),
        (&[256, 100], &[1]),
        (&[1000, 3], &[0]),
        (&[10, 20], &[0, 1]),
    ] {
        let x = rng.vec(numel(shape), -1.0, 1.0);
        let dx = g.up(&x);
        let kept: usize = (0..shape.len()).filter(|a| !axes.contains(a)).map(|a| shape[a]).product();
        let count: usize = axes.iter().map(|a| shape[*a]).product();
        let off = 4 - shape.len();
        let mask = axes.iter().fold(0, |m, a| m | (1 << (a + off)));
        let out = g.up(&vec![0f32; kept]);
        for (kernel, scale) in [("reduce_sum", 1.0f32), ("reduce_mean", 1.0 / count as f32)] {
            g.launch(
                "reduce",
                "towers_reduce_f32",
                grid_rows(kept),
                BLOCK,
                &[n(kept), dx.a(), out.a(), d4(shape, 1), A::I32(mask), A::F32(scale)],
            );
            let mut want = vec![0f32; kept];
            if kernel == "reduce_sum" {
                cpu::reduce::reduce_sum(&x, shape, axes, &mut want).unwrap();
            } else {
                cpu::reduce::reduce_mean(&x, shape, axes, &mut want).unwrap();
            }
            let first = g.down(&out, kept);
            r.f32(kernel, format!("{shape:?} axes {axes:?}"), &first, &want, Some(1e-4));
            // Deterministic: a second launch gives the same bits.
            g.launch(
                "reduce",
                "towers_reduce_f32",
                grid_rows(kept),
                BLOCK,
                &[n(kept), dx.a(), out.a(), d4(shape, 1), A::I32(mask), A::F32(scale)],
            );
            r.f32(kernel, format!("{shape:?} axes {axes:?}: run 2 = run 1"), &g.down(&out, kept), &first, None);
        }
    }
    // l2_loss
    for len in [1usize, 1000, 300_001] {
        let x = rng.vec(len, -1.0, 1.0);
        let (dx, out) = (g.up(&x), g.up(&[0f32]));
        g.launch("reduce", "towers_l2_loss_f32", 1, BLOCK, &[n(len), dx.a(), out.a()]);
        let first = g.down(&out, 1);
        r.f32("l2_loss", format!("{len}"), &first, &[cpu::misc::l2_loss(&x)], Some(1e-6));
        g.launch("reduce", "towers_l2_loss_f32", 1, BLOCK, &[n(len), dx.a(), out.a()]);
        r.f32("l2_loss", format!("{len}: run 2 = run 1"), &g.down(&out, 1), &first, None);
    }
    // argmax (ties: first)
    for (shape, axis) in [(&[3usize, 7, 5][..], 1usize), (&[64, 10], 1), (&[9, 4], 0)] {
        let x = rng.coarse(numel(shape));
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let (dx, out) = (g.up(&x), g.up(&vec![0i32; outer * inner]));
        g.ew("reduce", "towers_argmax_f32", outer * inner, &[n(outer), n(shape[axis]), n(inner), dx.a(), out.a()]);
        let mut want = vec![0i32; outer * inner];
        cpu::reduce::argmax(&x, shape, axis, &mut want).unwrap();
        r.i32("argmax", format!("{shape:?} axis {axis}"), &g.down(&out, outer * inner), &want);
    }
    // equal (exec.rs writes i32 0/1) and casts.
    let len = 5000;
    let a = rng.coarse(len);
    let b = rng.coarse(len);
    let (da, db, out) = (g.up(&a), g.up(&b), g.up(&vec![0i32; len]));
    g.ew("reduce", "towers_equal_f32", len, &[n(len), da.a(), db.a(), out.a()]);
    let want: Vec<i32> = a.iter().zip(&b).map(|(x, y)| (x == y) as i32).collect();
    r.i32("equal", "f32", &g.down(&out, len), &want);
    let ai = rng.ints(len, 5);
    let bi = rng.ints(len, 5);
    let (dai, dbi) = (g.up(&ai), g.up(&bi));
    g.ew("reduce", "towers_equal_i32", len, &[n(len), dai.a(), dbi.a(), out.a()]);
    let want: Vec<i32> = ai.iter().zip(&bi).map(|(x, y)| (x == y) as i32).collect();
    r.i32("equal", "i32", &g.down(&out, len), &want);
    let mut xf = rng.vec(len, -1e3, 1e3);
    xf[..6].copy_from_slice(&[f32::NAN, 3e9, -3e9, -0.0, 0.999, -2.5]);
    let xi: Vec<i32> = rng.ints(len, 2001).iter().map(|v| v - 1000).chain([i32::MAX, i32::MIN]).collect();
    let (dxf, dxi) = (g.up(&xf), g.up(&xi));
    let (oi, of) = (g.up(&vec![0i32; xi.len()]), g.up(&vec![0f32; xi.len()]));
    g.ew("reduce", "towers_cast_f32_i32", len, &[n(len), dxf.a(), oi.a()]);
    let mut want = vec![0i32; len];
    cpu::reduce::cast_f32_to_i32(&xf, &mut want);
    r.i32("cast", "f32 -> i32", &g.down(&oi, len), &want);
    g.ew("reduce", "towers_cast_i32_f32", xi.len(), &[n(xi.len()), dxi.a(), of.a()]);
    let mut want = vec![0f32; xi.len()];
    cpu::reduce::cast_i32_to_f32(&xi, &mut want);
    r.f32("cast", "i32 -> f32", &g.down(&of, xi.len()), &want, None);
    g.ew("reduce", "towers_cast_f32_bool", len, &[n(len), dxf.a(), oi.a()]);
    let want: Vec<i32> = xf.iter().map(|v| (*v != 0.0) as i32).collect();
    r.i32("cast", "f32 -> bool", &g.down(&oi, len), &want);
    g.ew("reduce", "towers_cast_i32_bool", xi.len(), &[n(xi.len()), dxi.a(), oi.a()]);
    let want: Vec<i32> = xi.iter().map(|v| (*v != 0) as i32).collect();
    r.i32("cast", "i32 -> bool", &g.down(&oi, xi.len()), &want);
    g.ew("reduce", "towers_copy_u32", len, &[n(len), dxf.a(), of.a()]);
    r.f32("cast", "f32 -> f32 (copy)", &g.down(&of, len), &xf, None);
}

fn softmax(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    for (rows, c) in [(37usize, 10usize), (16, 1000), (5, 1)] {
        let len = rows * c;
        let mut x = rng.vec(len, -5.0, 5.0);
        x[0] = 40.0;
        let gy = rng.vec(len, -1.0, 1.0);
        let (dx, dgy) = (g.up(&x), g.up(&gy));
        let (dy, dd) = (g.up(&vec![0f32; len]), g.up(&vec![0f32; len]));
        let case = format!("[{rows}, {c}]");
        let geo = (grid_rows(rows), BLOCK);
        for (kernel, entry, grad) in [
            ("softmax", "towers_softmax_f32", "towers_softmax_grad_f32"),
            ("log_softmax", "towers_log_softmax_f32", "towers_log_softmax_grad_f32"),
        ] {
            g.launch("softmax", entry, geo.0, geo.1, &[n(rows), A::I32(c as i32), dx.a(), dy.a()]);
            let mut y = vec![0f32; len];
            let mut dxw = vec![0f32; len];
            if kernel == "softmax" {
                cpu::softmax::softmax(&x, c, &mut y);
            } else {
                cpu::softmax::log_softmax(&x, c, &mut y);
            }
            r.f32(kernel, case.clone(), &g.down(&dy, len), &y, Some(1e-5));
            let dyy = g.up(&y);
            g.launch("softmax", grad, geo.0, geo.1, &[n(rows), A::I32(c as i32), dgy.a(), dyy.a(), dd.a()]);
            if kernel == "softmax" {
                cpu::softmax::softmax_grad(&gy, &y, c, &mut dxw);
                r.f32("softmax_grad", case.clone(), &g.down(&dd, len), &dxw, Some(1e-5));
            } else {
                cpu::softmax::log_softmax_grad(&gy, &y, c, &mut dxw);
                r.f32("log_softmax_grad", case.clone(), &g.down(&dd, len), &dxw, Some(1e-5));
            }
        }
        // Cross-entropies.
        let labels = rng.ints(rows, c as u64);
        let dl = g.up(&labels);
        let (loss, bp) = (g.up(&vec![0f32; rows]), g.up(&vec![0f32; len]));
        g.launch(
            "softmax",
            "towers_sparse_softmax_xent_f32",
            geo.0,
            geo.1,
            &[n(rows), A::I32(c as i32), dx.a(), dl.a(), loss.a(), bp.a()],
        );
        let (mut wl, mut wb) = (vec![0f32; rows], vec![0f32; len]);
        cpu::softmax::sparse_softmax_cross_entropy(&x, &labels, c, &mut wl, &mut wb).unwrap();
        r.f32("sparse_softmax_xent", format!("{case} loss"), &g.down(&loss, rows), &wl, Some(1e-5));
        r.f32("sparse_softmax_xent", format!("{case} backprop"), &g.down(&bp, len), &wb, Some(1e-5));
        let mut soft = rng.vec(len, 0.0, 1.0);
        for row in soft.chunks_mut(c) {
            let s: f32 = row.iter().sum();
            row.iter_mut().for_each(|v| *v /= s);
        }
        let ds = g.up(&soft);
        g.launch(
            "softmax",
            "towers_softmax_xent_f32",
            geo.0,
            geo.1,
            &[n(rows), A::I32(c as i32), dx.a(), ds.a(), loss.a(), bp.a()],
        );
        cpu::softmax::softmax_cross_entropy(&x, &soft, c, &mut wl, &mut wb);
        r.f32("softmax_xent", format!("{case} loss"), &g.down(&loss, rows), &wl, Some(1e-5));
        r.f32("softmax_xent", format!("{case} backprop"), &g.down(&bp, len), &wb, Some(1e-5));
    }
}

fn pools(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    use cpu::pool::{self, Pool2d};
    use towers_kernels::window::Padding;
    for (p, name) in [
        (
            Pool2d { n: 2, h: 9, w: 7, c: 5, kh: 3, kw: 3, stride_h: 2, stride_w: 2, padding: Padding::Same },
            "3x3/2 SAME",
        ),
        (
            Pool2d { n: 3, h: 8, w: 8, c: 4, kh: 2, kw: 2, stride_h: 2, stride_w: 2, padding: Padding::Valid },
            "2x2/2 VALID",
        ),
        (
            Pool2d { n: 2, h: 6, w: 5, c: 3, kh: 3, kw: 2, stride_h: 1, stride_w: 1, padding: Padding::Same },
            "3x2/1 SAME",
        ),
        (
            Pool2d { n: 4, h: 28, w: 28, c: 32, kh: 2, kw: 2, stride_h: 2, stride_w: 2, padding: Padding::Same },
            "convnet 2x2/2",
        ),
    ] {
        let ga = A::Pool(Val(PoolArgs::from(&p)));
        let x = rng.coarse(p.x_len());
        let dy = rng.vec(p.y_len(), -1.0, 1.0);
        let (dx, ddy) = (g.up(&x), g.up(&dy));
        let (dyo, dxo) = (g.up(&vec![0f32; p.y_len()]), g.up(&vec![0f32; p.x_len()]));
        let mut y = vec![0f32; p.y_len()];
        let mut gx = vec![0f32; p.x_len()];
        let ga2 = || A::Pool(Val(PoolArgs::from(&p)));

        g.ew("pool", "towers_max_pool_f32", p.y_len(), &[ga, dx.a(), dyo.a()]);
        pool::max_pool(&p, &x, &mut y);
        r.f32("max_pool", name, &g.down(&dyo, p.y_len()), &y, None);
        let dyy = g.up(&y);
        g.ew("pool", "towers_max_pool_grad_f32", p.x_len(), &[ga2(), dx.a(), dyy.a(), ddy.a(), dxo.a()]);
        pool::max_pool_grad(&p, &x, &y, &dy, &mut gx);
        r.f32("max_pool_grad", format!("{name}, ties"), &g.down(&dxo, p.x_len()), &gx, None);

        g.ew("pool", "towers_avg_pool_f32", p.y_len(), &[ga2(), dx.a(), dyo.a()]);
        pool::avg_pool(&p, &x, &mut y);
        r.f32("avg_pool", name, &g.down(&dyo, p.y_len()), &y, None);
        g.ew("pool", "towers_avg_pool_grad_f32", p.x_len(), &[ga2(), ddy.a(), dxo.a()]);
        pool::avg_pool_grad(&p, &dy, &mut gx);
        r.f32("avg_pool_grad", name, &g.down(&dxo, p.x_len()), &gx, None);
    }
}

fn convs(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    use cpu::conv::{self, Conv2d};
    use towers_kernels::window::Padding;
    for (p, name) in [
        (
            Conv2d {
                n: 2,
                h: 9,
                w: 7,
                c_in: 3,
                kh: 3,
                kw: 3,
                c_out: 4,
                stride_h: 2,
                stride_w: 2,
                padding: Padding::Same,
                threads: 1,
            },
            "3x3/2 SAME",
        ),
        (
            Conv2d {
                n: 3,
                h: 8,
                w: 6,
                c_in: 2,
                kh: 5,
                kw: 3,
                c_out: 5,
                stride_h: 1,
                stride_w: 1,
                padding: Padding::Valid,
                threads: 1,
            },
            "5x3/1 VALID",
        ),
        (
            Conv2d {
                n: 2,
                h: 28,
                w: 28,
                c_in: 1,
                kh: 5,
                kw: 5,
                c_out: 32,
                stride_h: 1,
                stride_w: 1,
                padding: Padding::Same,
                threads: 1,
            },
            "convnet conv1 5x5 SAME",
        ),
    ] {
        let ga = || A::Conv(Val(ConvArgs::from(&p)));
        let (rows, k, co) = (p.rows(), p.k(), p.c_out);
        let x = rng.vec(p.x_len(), -1.0, 1.0);
        let f = rng.vec(p.filter_len(), -1.0, 1.0);
        let dy = rng.vec(p.y_len(), -1.0, 1.0);
        let mut ws = vec![0f32; p.workspace_len().max(rows * k)];
        let dx = g.up(&x);
        // im2col in two chunks, as the plan's chunked workspace would run it.
        let split = rows / 3;
        let col = g.up(&vec![0f32; rows * k]);
        let col_b = g.up(&vec![0f32; (rows - split) * k]);
        g.ew("conv", "towers_im2col_f32", split * k, &[ga(), n(0), n(split), dx.a(), col.a()]);
        g.ew("conv", "towers_im2col_f32", (rows - split) * k, &[ga(), n(split), n(rows - split), dx.a(), col_b.a()]);
        let mut cols = g.down(&col, split * k);
        cols.extend(g.down(&col_b, (rows - split) * k));
        // conv2d = im2col, then the GEMM (here on the host).
        let mut y = vec![0f32; p.y_len()];
        cpu::matmul(rows, k, co, false, false, &cols, &f, &mut y);
        let mut want = vec![0f32; p.y_len()];
        conv::conv2d(&p, &x, &f, &mut want, &mut ws);
        r.f32("conv2d", format!("{name}: im2col + GEMM"), &y, &want, Some(1e-5));
        // conv2d_backprop_filter = im2col, then col^T dy.
        let mut dw = vec![0f32; p.filter_len()];
        cpu::matmul(k, rows, co, true, false, &cols, &dy, &mut dw);
        let mut want = vec![0f32; p.filter_len()];
        conv::conv2d_backprop_filter(&p, &x, &dy, &mut want, &mut ws);
        r.f32("conv2d_backprop_filter", format!("{name}: im2col + GEMM"), &dw, &want, Some(1e-5));
        // conv2d_backprop_input = dy W^T (host GEMM), then col2im in two chunks.
        let mut dcol = vec![0f32; rows * k];
        cpu::matmul(rows, co, k, false, true, &dy, &f, &mut dcol);
        let (d1, d2) = (g.up(&dcol[..split * k]), g.up(&dcol[split * k..]));
        let dxo = g.up(&vec![f32::NAN; p.x_len()]);
        g.ew("conv", "towers_col2im_f32", p.x_len(), &[ga(), n(0), n(split), A::I32(0), d1.a(), dxo.a()]);
        g.ew("conv", "towers_col2im_f32", p.x_len(), &[ga(), n(split), n(rows - split), A::I32(1), d2.a(), dxo.a()]);
        let mut want = vec![0f32; p.x_len()];
        conv::conv2d_backprop_input(&p, &dy, &f, &mut want, &mut ws);
        r.f32("conv2d_backprop_input", format!("{name}: GEMM + col2im"), &g.down(&dxo, p.x_len()), &want, Some(1e-5));
    }
}

fn layout(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    use cpu::layout;
    // concat along axis 1 of rank-3 tensors, then split it back.
    let shapes: Vec<Vec<usize>> = vec![vec![4, 3, 5], vec![4, 1, 5], vec![4, 6, 5]];
    let axis = 1;
    let xs: Vec<Vec<f32>> = shapes.iter().map(|s| rng.vec(numel(s), -1.0, 1.0)).collect();
    let (outer, inner) = (4usize, 5usize);
    let total: usize = shapes.iter().map(|s| s[axis] * inner).sum();
    let out = g.up(&vec![0f32; outer * total]);
    let mut off = 0;
    for (x, s) in xs.iter().zip(&shapes) {
        let run = s[axis] * inner;
        let dx = g.up(x);
        g.ew("layout", "towers_concat_part_f32", outer * run, &[n(outer), n(run), n(total), n(off), dx.a(), out.a()]);
        off += run;
    }
    let mut want = vec![0f32; outer * total];
    let refs: Vec<&[f32]> = xs.iter().map(|v| v.as_slice()).collect();
    let srefs: Vec<&[usize]> = shapes.iter().map(|v| v.as_slice()).collect();
    layout::concat(&refs, &srefs, axis, &mut want).unwrap();
    r.f32("concat", "3 inputs, axis 1", &g.down(&out, outer * total), &want, None);
    let sizes = [3usize, 1, 6];
    let full = [4usize, 10, 5];
    let mut wants: Vec<Vec<f32>> = sizes.iter().map(|s| vec![0f32; outer * s * inner]).collect();
    {
        let mut outs: Vec<&mut [f32]> = wants.iter_mut().map(|v| v.as_mut_slice()).collect();
        layout::split(&want, &full, axis, &sizes, &mut outs).unwrap();
    }
    let mut off = 0;
    for (s, w) in sizes.iter().zip(&wants) {
        let run = s * inner;
        let dy = g.up(&vec![0f32; outer * run]);
        g.ew("layout", "towers_split_part_f32", outer * run, &[n(outer), n(run), n(total), n(off), out.a(), dy.a()]);
        r.f32("split", format!("size {s} of {full:?}, axis 1"), &g.down(&dy, outer * run), w, None);
        off += run;
    }
    // slice and slice_grad.
    for (shape, begin, size) in [
        (&[6usize, 7, 8][..], &[1usize, 2, 0][..], &[3usize, 4, 8][..]),
        (&[2, 3, 4, 5], &[1, 0, 1, 2], &[1, 3, 2, 3]),
        (&[9], &[4], &[5]),
    ] {
        let x = rng.vec(numel(shape), -1.0, 1.0);
        let (dx, out) = (g.up(&x), g.up(&vec![0f32; numel(size)]));
        let args = |a: A, b: A| vec![a, b, d4(shape, 1), d4(begin, 0), d4(size, 1)];
        let mut a = vec![n(numel(size))];
        a.extend(args(dx.a(), out.a()));
        g.ew("layout", "towers_slice_f32", numel(size), &a);
        let mut want = vec![0f32; numel(size)];
        layout::slice(&x, shape, begin, size, &mut want).unwrap();
        r.f32("slice", format!("{shape:?} at {begin:?} size {size:?}"), &g.down(&out, numel(size)), &want, None);
        let gy = rng.vec(numel(size), -1.0, 1.0);
        let (dgy, dgx) = (g.up(&gy), g.up(&vec![f32::NAN; numel(shape)]));
        let mut a = vec![n(numel(shape))];
        a.extend(args(dgy.a(), dgx.a()));
        g.ew("layout", "towers_slice_grad_f32", numel(shape), &a);
        let mut want = vec![0f32; numel(shape)];
        layout::slice_grad(&gy, shape, begin, size, &mut want).unwrap();
        r.f32("slice_grad", format!("{shape:?} at {begin:?} size {size:?}"), &g.down(&dgx, numel(shape)), &want, None);
    }
}

fn dropout(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    // Philox known answers (kernels/src/random.rs).
    let (c, k, o) = (g.up(&[0u32; 4]), g.up(&[0u32; 2]), g.up(&[0u32; 4]));
    g.launch("dropout", "towers_philox4x32_10", 1, 32, &[c.a(), k.a(), o.a()]);
    let got: Vec<i32> = g.down(&o, 4).iter().map(|v| *v as i32).collect();
    let want: Vec<i32> = cpu::random::philox4x32_10([0; 4], [0; 2]).iter().map(|v| *v as i32).collect();
    r.i32("dropout", "philox4x32_10 known answer", &got, &want);
    let ctr = [0x243f6a88u32, 0x85a308d3, 0x13198a2e, 0x03707344];
    let key = [0xa4093822u32, 0x299f31d0];
    let (c, k) = (g.up(&ctr), g.up(&key));
    g.launch("dropout", "towers_philox4x32_10", 1, 32, &[c.a(), k.a(), o.a()]);
    let got: Vec<i32> = g.down(&o, 4).iter().map(|v| *v as i32).collect();
    let want: Vec<i32> = cpu::random::philox4x32_10(ctr, key).iter().map(|v| *v as i32).collect();
    r.i32("dropout", "philox4x32_10 pi digits", &got, &want);
    // Masks and outputs, from element 0 (the kernels' dropout) and at an offset (a tower's rows).
    for (len, keep, seed, step, offset) in [
        (40_000usize, 0.75f32, 7u64, 3u64, 0usize),
        (10_001, 0.5, 0x1234_5678_9abc_def0, 1 << 33, 5),
        (4096, 0.9, 42, 0, 123_457),
        (100, 1.0, 1, 1, 3),
        (100, 0.0, 1, 1, 0),
    ] {
        let x = rng.vec(len, -1.0, 1.0);
        let (dx, y, m) = (g.up(&x), g.up(&vec![0f32; len]), g.up(&vec![0f32; len]));
        g.ew(
            "dropout",
            "towers_dropout_f32",
            len,
            &[n(len), A::F32(keep), A::U64(seed), A::U64(step), A::U64(offset as u64), dx.a(), y.a(), m.a()],
        );
        let (mut wy, mut wm) = (vec![0f32; len], vec![0f32; len]);
        if offset == 0 {
            cpu::dropout::dropout(&x, keep, seed, step, &mut wy, &mut wm);
        } else {
            cpu::dropout_at(&x, keep, seed, step, offset, &mut wy, &mut wm);
        }
        let case = format!("n {len} keep {keep} offset {offset}");
        r.f32("dropout", format!("{case}: mask"), &g.down(&m, len), &wm, None);
        r.f32("dropout", format!("{case}: y"), &g.down(&y, len), &wy, None);
    }
}

fn batchnorm(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    let eps = 1e-3f32;
    for (rows, c) in [(8usize, 3usize), (256 * 14 * 14 / 4, 32), (1000, 256), (1, 4)] {
        let len = rows * c;
        let x: Vec<f32> = rng.vec(len, -2.0, 3.0);
        let gamma = rng.vec(c, 0.5, 1.5);
        let beta = rng.vec(c, -0.5, 0.5);
        let (dx, dg, db) = (g.up(&x), g.up(&gamma), g.up(&beta));
        let z = || g.up(&vec![0f32; c]);
        let (mean, inv_std, var, y) = (z(), z(), z(), g.up(&vec![0f32; len]));
        g.launch(
            "batchnorm",
            "towers_batch_norm_stats_f32",
            grid_rows(c),
            BLOCK,
            &[n(rows), n(c), A::F32(eps), dx.a(), mean.a(), inv_std.a(), var.a()],
        );
        g.ew(
            "batchnorm",
            "towers_batch_norm_apply_f32",
            len,
            &[n(len), n(c), dx.a(), dg.a(), db.a(), mean.a(), inv_std.a(), y.a()],
        );
        let mut w = [vec![0f32; len], vec![0f32; c], vec![0f32; c], vec![0f32; c]];
        cpu::batch_norm_train(&x, &gamma, &beta, eps, &mut w);
        let case = format!("[{rows}, {c}]");
        r.f32("batch_norm_train", format!("{case} y"), &g.down(&y, len), &w[0], Some(1e-4));
        r.f32("batch_norm_train", format!("{case} mean"), &g.down(&mean, c), &w[1], Some(1e-5));
        r.f32("batch_norm_train", format!("{case} inv_std"), &g.down(&inv_std, c), &w[2], Some(1e-4));
        r.f32("batch_norm_train", format!("{case} var (unbiased)"), &g.down(&var, c), &w[3], Some(1e-4));

        // Infer, from moving statistics.
        let mm = rng.vec(c, -0.5, 0.5);
        let mv = rng.vec(c, 0.5, 2.0);
        let (dmm, dmv) = (g.up(&mm), g.up(&mv));
        let (om, oi, ov) = (z(), z(), z());
        g.ew(
            "batchnorm",
            "towers_batch_norm_infer_f32",
            len,
            &[n(len), n(c), A::F32(eps), dx.a(), dg.a(), db.a(), dmm.a(), dmv.a(), y.a(), om.a(), oi.a(), ov.a()],
        );
        let mut wy = vec![0f32; len];
        cpu::batchnorm::batch_norm_infer(&x, &gamma, &beta, &mm, &mv, eps, &mut wy);
        let wi: Vec<f32> = mv.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
        r.f32("batch_norm_infer", format!("{case} y"), &g.down(&y, len), &wy, Some(1e-6));
        r.f32(
            "batch_norm_infer",
            format!("{case} mean, var"),
            &[g.down(&om, c), g.down(&ov, c)].concat(),
            &[mm.clone(), mv.clone()].concat(),
            None,
        );
        r.f32("batch_norm_infer", format!("{case} inv_std"), &g.down(&oi, c), &wi, None);

        // Grad, from the CPU's saved statistics.
        let gy = rng.vec(len, -1.0, 1.0);
        let (dgy, dm, dis) = (g.up(&gy), g.up(&w[1]), g.up(&w[2]));
        let (dgam, dbet, dxo) = (z(), z(), g.up(&vec![0f32; len]));
        g.launch(
            "batchnorm",
            "towers_batch_norm_grad_reduce_f32",
            grid_rows(c),
            BLOCK,
            &[n(rows), n(c), dgy.a(), dx.a(), dm.a(), dis.a(), dgam.a(), dbet.a()],
        );
        g.ew(
            "batchnorm",
            "towers_batch_norm_grad_dx_f32",
            len,
            &[n(len), n(c), dgy.a(), dx.a(), dg.a(), dm.a(), dis.a(), dgam.a(), dbet.a(), dxo.a()],
        );
        let (mut wdx, mut wdg, mut wdb) = (vec![0f32; len], vec![0f32; c], vec![0f32; c]);
        cpu::batchnorm::batch_norm_grad(&gy, &x, &gamma, &w[1], &w[2], &mut wdx, &mut wdg, &mut wdb);
        r.f32("batch_norm_grad", format!("{case} dgamma"), &g.down(&dgam, c), &wdg, Some(1e-4));
        r.f32("batch_norm_grad", format!("{case} dbeta"), &g.down(&dbet, c), &wdb, Some(1e-4));
        r.f32("batch_norm_grad", format!("{case} dx"), &g.down(&dxo, len), &wdx, Some(1e-4));
    }
}

fn optim(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    use cpu::{misc, optim};
    let len = 50_003;
    let w0 = rng.vec(len, -1.0, 1.0);
    let grad = rng.vec(len, -1.0, 1.0);
    let s1 = rng.vec(len, -0.1, 0.1);
    let s2 = rng.vec(len, 0.0, 0.01);
    let dgr = g.up(&grad);
    let o = A::F32;

    // AssignMovingAverage
    let v = g.up(&w0);
    g.ew("optim", "towers_assign_moving_average_f32", len, &[n(len), o(0.99), dgr.a(), v.a()]);
    let want: Vec<f32> = w0.iter().zip(&grad).map(|(v, x)| *v * 0.99 + *x * (1.0 - 0.99)).collect();
    r.f32("assign_moving_average", "decay 0.99", &g.down(&v, len), &want, None);

    // The three optimizers, plain and fused with the tower reduction (3 towers).
    let towers: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(len, -1.0, 1.0)).collect();
    let weights = [0.375f32, 0.375, 0.25];
    let tdev: Vec<Dev<f32>> = towers.iter().map(|t| g.up(t)).collect();
    let tp = g.ptrs(&tdev.iter().collect::<Vec<_>>());
    let dwt = g.up(&weights);
    let mut mean_g = vec![0f32; len];
    misc::weighted_sum(&towers.iter().map(|t| t.as_slice()).collect::<Vec<_>>(), &weights, &mut mean_g);
    let step = 4i32; // global_step: the update uses t = 5
    let dstep = g.up(&[step]);

    for fused in [false, true] {
        let gsrc: &[f32] = if fused { &mean_g } else { &grad };
        let kernel = |k: &'static str| if fused { "mean_apply" } else { k };
        let tag = |s: &str| if fused { format!("{s}, 3 towers fused") } else { s.to_string() };
        let head = |nn: usize| if fused { vec![n(nn), A::I32(3), tp.a(), dwt.a()] } else { vec![n(nn)] };

        let w = g.up(&w0);
        let mut a = head(len);
        a.push(o(0.1));
        if !fused {
            a.push(dgr.a());
        }
        a.push(w.a());
        g.ew(
            "optim",
            if fused { "towers_mean_apply_gradient_descent_f32" } else { "towers_apply_gradient_descent_f32" },
            len,
            &a,
        );
        let mut want = w0.clone();
        optim::apply_gradient_descent(&mut want, gsrc, 0.1);
        r.f32(kernel("apply_gradient_descent"), tag("gradient descent"), &g.down(&w, len), &want, None);

        for nesterov in [0, 1] {
            let (w, acc) = (g.up(&w0), g.up(&s1));
            let mut a = head(len);
            a.extend([o(0.05), o(0.9), A::I32(nesterov)]);
            if !fused {
                a.push(dgr.a());
            }
            a.extend([w.a(), acc.a()]);
            g.ew("optim", if fused { "towers_mean_apply_momentum_f32" } else { "towers_apply_momentum_f32" }, len, &a);
            let (mut ww, mut wa) = (w0.clone(), s1.clone());
            optim::apply_momentum(&mut ww, &mut wa, gsrc, 0.05, 0.9, nesterov == 1);
            let case = tag(if nesterov == 1 { "momentum, nesterov" } else { "momentum" });
            r.f32(kernel("apply_momentum"), format!("{case}: w"), &g.down(&w, len), &ww, None);
            r.f32(kernel("apply_momentum"), format!("{case}: accum"), &g.down(&acc, len), &wa, None);
        }

        let (w, m, vv) = (g.up(&w0), g.up(&s1), g.up(&s2));
        let mut a = head(len);
        a.extend([o(0.001), o(0.9), o(0.999), o(1e-8)]);
        if !fused {
            a.push(dgr.a());
        }
        a.extend([dstep.a(), w.a(), m.a(), vv.a()]);
        g.ew("optim", if fused { "towers_mean_apply_adam_f32" } else { "towers_apply_adam_f32" }, len, &a);
        let (mut ww, mut wm, mut wv) = (w0.clone(), s1.clone(), s2.clone());
        optim::apply_adam(&mut ww, &mut wm, &mut wv, gsrc, 0.001, 0.9, 0.999, 1e-8, step as u64 + 1);
        r.f32(kernel("apply_adam"), tag("adam step 5: w"), &g.down(&w, len), &ww, None);
        r.f32(kernel("apply_adam"), tag("adam step 5: m"), &g.down(&m, len), &wm, None);
        r.f32(kernel("apply_adam"), tag("adam step 5: v"), &g.down(&vv, len), &wv, None);
    }

    // IncrementStep, wrapping.
    for s in [0i32, 41, i32::MAX] {
        let d = g.up(&[s]);
        g.launch("optim", "towers_increment_step_i32", 1, 1, &[d.a()]);
        r.i32("increment_step", format!("{s}"), &g.down(&d, 1), &[s.wrapping_add(1)]);
    }
}
