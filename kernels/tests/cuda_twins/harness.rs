//! Running CUDA twins through the CUDA backend's lowering and comparing
//! with the CPU: device buffers, the launches of `towers_kernels::launch`,
//! the recorded argument lists, the report, a seeded generator.
//!
//! Invariants:
//! - every launch goes through [`Gpu::run`]: the kernel's lowering by
//!   `towers_kernels::launch::lower` (entries, geometry, argument order,
//!   side arrays, scratch areas), exactly what `runtime/src/cuda/lower.rs`
//!   marshals; no twin builds an argument list;
//! - each lowering is recorded as text (`Gpu::take_log`) with or without a
//!   device, so CPU-only CI checks the marshalling against the snapshots;
//! - without a device, buffers live on the host and nothing is compared
//!   (`Report` counts those checks as not run).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use towers_kernels::cuda::{self, ConvArgs, Dims4, PoolArgs};
use towers_kernels::{launch, Kernel};

use crate::{common, cpu};

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

/// A buffer of the twins: on the device when there is one (then `ptr` is
/// its address), else a host copy (`ptr` a distinct fake address).
pub(crate) struct Dev<T> {
    s: Option<CudaSlice<T>>,
    host: Vec<T>,
    pub(crate) ptr: u64,
}

/// An operand of [`Gpu::run`]: (device pointer, element count).
pub(crate) type Operand = (u64, usize);

impl<T> Dev<T> {
    /// This buffer as an operand of [`Gpu::run`]: (pointer, `len` elements).
    pub(crate) fn of(&self, len: usize) -> Operand {
        (self.ptr, len)
    }
}

/// The CUDA device the twins run on.
pub(crate) struct Device {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) arch: String,
    pub(crate) modules: RefCell<HashMap<&'static str, Arc<CudaModule>>>,
}

/// The twins' runner: a [`Device`] when one can be used, and the record of
/// every lowering it was asked to run.
pub(crate) struct Gpu {
    pub(crate) dev: Option<Device>,
    /// The lowerings since the last [`Gpu::take_log`], as text.
    log: RefCell<String>,
    /// Every entry point launched, and every kernel run.
    pub(crate) entries: RefCell<BTreeSet<&'static str>>,
    pub(crate) kernels: RefCell<BTreeSet<&'static str>>,
    /// Fake addresses of host-only buffers.
    next: Cell<u64>,
}

impl Gpu {
    pub(crate) fn new(dev: Option<Device>) -> Gpu {
        Gpu {
            dev,
            log: RefCell::default(),
            entries: RefCell::default(),
            kernels: RefCell::default(),
            next: Cell::new(1 << 40),
        }
    }

    /// Whether launches run (a device) or are only recorded.
    pub(crate) fn live(&self) -> bool {
        self.dev.is_some()
    }

    /// The lowerings recorded since the last call.
    pub(crate) fn take_log(&self) -> String {
        std::mem::take(&mut *self.log.borrow_mut())
    }

    fn module(&self, d: &Device, family: &'static str) -> Arc<CudaModule> {
        if let Some(m) = d.modules.borrow().get(family) {
            return m.clone();
        }
        // A generated fused family is found once lowering made it.
        let src = cuda::source(family).unwrap_or_else(|| panic!("no CUDA source for family {family}"));
        let t = std::time::Instant::now();
        let cubin = common::compile(src.path, src.code, &d.arch, &[]).unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "compiled {:<28} for {} in {} ms ({} bytes)",
            src.path,
            d.arch,
            t.elapsed().as_millis(),
            cubin.image.len()
        );
        let m = d.ctx.load_module(Ptx::from_binary(cubin.image)).expect("cuModuleLoadData");
        d.modules.borrow_mut().insert(family, m.clone());
        m
    }

    fn launch(&self, d: &Device, l: &launch::Launch, args: &[A]) {
        let entry = l.entry;
        let f = self.module(d, l.family).load_function(entry).unwrap_or_else(|e| panic!("{entry}: {e:?}"));
        let mut b = d.stream.launch_builder(&f);
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
        let cfg =
            LaunchConfig { grid_dim: (l.grid, 1, 1), block_dim: (l.block, 1, 1), shared_mem_bytes: l.shared_bytes };
        unsafe { b.launch(cfg) }.unwrap_or_else(|e| panic!("{entry}: {e:?}"));
        d.stream.synchronize().unwrap_or_else(|e| panic!("{entry}: {e:?}"));
    }

    /// [`Gpu::run_at`] at step 0.
    pub(crate) fn run(&self, kernel: &Kernel, ins: &[(u64, usize)], outs: &[(u64, usize)], ws: Option<(u64, usize)>) {
        self.run_at(kernel, ins, outs, ws, 0)
    }

    /// Run `kernel` exactly as the CUDA backend lowers it
    /// (`towers_kernels::launch::lower`: entries, geometry and argument
    /// order), its operands these buffers as (device pointer, element
    /// count); side arrays, scratch areas and the step cell (holding
    /// `step`) are uploaded here as the backend's side buffer holds them.
    /// A cuBLAS GEMM of the lowering runs on the host (`cpu::matmul` on the
    /// operands it names, at their offsets): the twins check the CUDA C,
    /// and the marshalling of every op. Without a device, the lowering is
    /// only recorded.
    pub(crate) fn run_at(
        &self,
        kernel: &Kernel,
        ins: &[(u64, usize)],
        outs: &[(u64, usize)],
        ws: Option<(u64, usize)>,
        step: u64,
    ) {
        let lens = |v: &[(u64, usize)]| v.iter().map(|d| d.1).collect::<Vec<_>>();
        let (il, ol) = (lens(ins), lens(outs));
        let counts = launch::Counts { ins: &il, outs: &ol, workspace: ws.map(|w| w.1) };
        let low = launch::lower(kernel, counts).unwrap_or_else(|e| panic!("{e}"));
        self.record(kernel, &il, &ol, ws.map(|w| w.1), &low);
        let Some(d) = &self.dev else { return };
        let addr = |o: launch::Operand| {
            let (ptr, len) = match o.which {
                launch::Which::In(i) => ins[i],
                launch::Which::Out(j) => outs[j],
                launch::Which::Workspace => ws.expect("a workspace"),
            };
            assert!(o.offset <= len, "{}: offset {} past {} elements", kernel.name(), o.offset, len);
            ptr + (o.offset * 4) as u64
        };
        let step = self.up(&[step]);
        let scratch: Vec<Dev<f32>> = low.scratch.iter().map(|&n| self.up(&vec![0f32; n])).collect();
        let mut side: Vec<Dev<u8>> = Vec::new();
        for op in &low.ops {
            let l = match op {
                launch::LaunchOp::Launch(l) => l,
                launch::LaunchOp::Gemm(gm) => {
                    self.host_gemm(d, gm, &addr);
                    continue;
                }
            };
            let mut args = Vec::new();
            for a in &l.args {
                let mut upload = |bytes: Vec<u8>| {
                    side.push(self.up(&bytes));
                    A::U64(side[side.len() - 1].ptr)
                };
                args.push(match a {
                    launch::Arg::Operand(o) => A::U64(addr(*o)),
                    launch::Arg::Null => A::U64(0),
                    launch::Arg::I32(v) => A::I32(*v),
                    launch::Arg::I64(v) => A::I64(*v),
                    launch::Arg::U64(v) => A::U64(*v),
                    launch::Arg::F32(v) => A::F32(*v),
                    launch::Arg::Dims4(d) => A::D4(Val(*d)),
                    launch::Arg::Pool(p) => A::Pool(Val(*p)),
                    launch::Arg::Conv(c) => A::Conv(Val(*c)),
                    launch::Arg::Step => A::U64(step.ptr),
                    launch::Arg::Operands(v) => upload(
                        v.iter().flat_map(|&which| addr(launch::Operand { which, offset: 0 }).to_le_bytes()).collect(),
                    ),
                    launch::Arg::F32s(v) => upload(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
                    launch::Arg::I64s(v) => upload(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
                    launch::Arg::Scratch(k) => A::U64(scratch[*k].ptr),
                });
            }
            self.launch(d, l, &args);
        }
    }

    /// One lowering's text in the log: the kernel, its operand counts, then
    /// each op (launch or GEMM) and scratch area, indented.
    fn record(&self, kernel: &Kernel, ins: &[usize], outs: &[usize], ws: Option<usize>, low: &launch::Lowering) {
        let mut log = self.log.borrow_mut();
        let ws = ws.map(|w| format!(" ws {w}")).unwrap_or_default();
        let _ = writeln!(log, "{} ins {ins:?} outs {outs:?}{ws}", kernel.name());
        for line in low.to_string().lines() {
            let _ = writeln!(log, "  {line}");
        }
        self.kernels.borrow_mut().insert(kernel.name());
        self.entries.borrow_mut().extend(low.launches().map(|l| l.entry));
    }

    /// `c = alpha op(a) op(b) + beta c` on the host, the operands read from
    /// and `c` written back to the device at the addresses the lowering names.
    fn host_gemm(&self, d: &Device, g: &launch::Gemm, addr: &impl Fn(launch::Operand) -> u64) {
        d.stream.synchronize().unwrap();
        d.ctx.bind_to_thread().unwrap();
        let read = |o: launch::Operand, len: usize| {
            let mut v = vec![0f32; len];
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut v, addr(o)) }.unwrap();
            v
        };
        // A batch reads each product's matrices at its strides (0: shared).
        let at = |o: launch::Operand, i: usize, stride: usize| launch::Operand { offset: o.offset + i * stride, ..o };
        let mut c = Vec::with_capacity(g.batch * g.m * g.n);
        for i in 0..g.batch {
            let (a, b) = (read(at(g.a, i, g.stride_a), g.m * g.k), read(at(g.b, i, g.stride_b), g.k * g.n));
            let mut ci = vec![0f32; g.m * g.n];
            cpu::matmul(g.m, g.k, g.n, g.trans_a, g.trans_b, &a, &b, &mut ci);
            c.extend(ci);
        }
        let old = if g.beta != 0.0 { read(g.c, c.len()) } else { vec![0f32; c.len()] };
        for (c, o) in c.iter_mut().zip(&old) {
            *c = g.alpha * *c + if g.beta != 0.0 { g.beta * o } else { 0.0 };
        }
        unsafe { cudarc::driver::result::memcpy_htod_sync(addr(g.c), &c) }.unwrap();
        // The copy's DMA may still be in flight when the call returns.
        d.ctx.synchronize().unwrap();
    }

    pub(crate) fn up<T: DeviceRepr + Copy + Default>(&self, v: &[T]) -> Dev<T> {
        // Never allocate zero bytes: pad empty buffers with one element.
        let v: Vec<T> = if v.is_empty() { vec![T::default()] } else { v.to_vec() };
        let Some(d) = &self.dev else {
            let ptr = self.next.get();
            self.next.set(ptr + ((v.len() * std::mem::size_of::<T>()) as u64).next_multiple_of(256));
            return Dev { s: None, host: v, ptr };
        };
        let s = d.stream.clone_htod(&v).unwrap();
        let ptr = {
            let (p, _sync) = s.device_ptr(&d.stream);
            p
        };
        Dev { s: Some(s), host: Vec::new(), ptr }
    }

    /// The first `len` elements of `b`: from the device, or (without one)
    /// the host copy as uploaded.
    pub(crate) fn down<T: DeviceRepr + Copy + Default>(&self, b: &Dev<T>, len: usize) -> Vec<T> {
        let mut v = match (&self.dev, &b.s) {
            (Some(d), Some(s)) => d.stream.clone_dtoh(s).unwrap(),
            _ => b.host.clone(),
        };
        v.truncate(len);
        v
    }
}

// ---------------------------------------------------------------- checks

pub(crate) struct Check {
    pub(crate) kernel: &'static str,
    pub(crate) case: String,
    pub(crate) max_abs: f64,
    pub(crate) max_err: f64,
    pub(crate) tol: Option<f64>,
    pub(crate) pass: bool,
}

/// The comparisons of one run: made only when the launches ran on a
/// device (`live`); without one, `got` is no GPU result and nothing is kept.
pub(crate) struct Report {
    pub(crate) live: bool,
    pub(crate) checks: Vec<Check>,
}

impl Report {
    /// `tol: None` = bit for bit.
    pub(crate) fn f32(
        &mut self,
        kernel: &'static str,
        case: impl Into<String>,
        got: &[f32],
        want: &[f32],
        tol: Option<f64>,
    ) {
        if !self.live {
            return;
        }
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

    pub(crate) fn i32(&mut self, kernel: &'static str, case: impl Into<String>, got: &[i32], want: &[i32]) {
        if !self.live {
            return;
        }
        let wrong = got.iter().zip(want).filter(|(g, w)| g != w).count();
        let pass = got.len() == want.len() && wrong == 0;
        let max_abs = got.iter().zip(want).map(|(g, w)| (*g as f64 - *w as f64).abs()).fold(0.0, f64::max);
        self.checks.push(Check { kernel, case: case.into(), max_abs, max_err: max_abs, tol: None, pass });
    }
}

pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [lo, hi).
    pub(crate) fn vec(&mut self, len: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..len).map(|_| lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)).collect()
    }
    /// Multiples of 1/4 in [-2, 2): many ties (pooling, argmax).
    pub(crate) fn coarse(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| ((self.next() >> 40) % 16) as f32 * 0.25 - 2.0).collect()
    }
    pub(crate) fn ints(&mut self, len: usize, hi: u64) -> Vec<i32> {
        (0..len).map(|_| (self.next() % hi) as i32).collect()
    }
}

pub(crate) fn numel(s: &[usize]) -> usize {
    s.iter().product()
}
