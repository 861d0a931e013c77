//! Launching CUDA twins through cudarc and comparing with the CPU: device
//! buffers, arguments by value, the report, a seeded generator.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use towers_kernels::cuda::{self, grid_1d, ConvArgs, Dims4, PoolArgs, BLOCK};
use towers_kernels::{launch, Kernel};

use crate::common;

#[repr(transparent)]
#[derive(Clone, Copy)]
pub(crate) struct Val<T>(pub(crate) T);
unsafe impl<T: Copy> DeviceRepr for Val<T> {}

/// A launch argument, by value; device buffers go as raw pointers.
pub(crate) enum A {
    I32(i32),
    I64(i64),
    U64(u64),
    F32(f32),
    D4(Val<Dims4>),
    Pool(Val<PoolArgs>),
    Conv(Val<ConvArgs>),
}

pub(crate) fn d4(v: &[usize], fill: i64) -> A {
    A::D4(Val(Dims4::padded(v, fill).unwrap()))
}
pub(crate) fn bs(v: &[usize]) -> A {
    A::D4(Val(Dims4::broadcast_strides(v).unwrap()))
}
pub(crate) fn n(v: usize) -> A {
    A::I64(v as i64)
}

pub(crate) struct Dev<T> {
    s: CudaSlice<T>,
    pub(crate) ptr: u64,
}

impl<T> Dev<T> {
    pub(crate) fn a(&self) -> A {
        A::U64(self.ptr)
    }
    /// This buffer as an operand of [`Gpu::run`]: (pointer, `len` elements).
    pub(crate) fn of(&self, len: usize) -> (u64, usize) {
        (self.ptr, len)
    }
}

pub(crate) struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) arch: String,
    pub(crate) modules: RefCell<HashMap<&'static str, Arc<CudaModule>>>,
}

impl Gpu {
    pub(crate) fn module(&self, family: &'static str) -> Arc<CudaModule> {
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

    pub(crate) fn launch(&self, family: &'static str, entry: &str, grid: u32, block: u32, args: &[A]) {
        self.launch_smem(family, entry, (grid, block, 0), args)
    }

    fn launch_smem(&self, family: &'static str, entry: &str, (grid, block, smem): (u32, u32, u32), args: &[A]) {
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
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: smem };
        unsafe { b.launch(cfg) }.unwrap_or_else(|e| panic!("{entry}: {e:?}"));
        self.stream.synchronize().unwrap_or_else(|e| panic!("{entry}: {e:?}"));
    }

    /// Run `kernel` exactly as the CUDA backend lowers it
    /// (`towers_kernels::launch::lower`: entries, geometry and argument
    /// order), its operands these buffers as (device pointer, element
    /// count); side arrays, scratch areas and the step cell (step 0) are
    /// uploaded here as the backend's side buffer holds them.
    pub(crate) fn run(&self, kernel: &Kernel, ins: &[(u64, usize)], outs: &[(u64, usize)], ws: Option<(u64, usize)>) {
        let lens = |v: &[(u64, usize)]| v.iter().map(|d| d.1).collect::<Vec<_>>();
        let (il, ol) = (lens(ins), lens(outs));
        let counts = launch::Counts { ins: &il, outs: &ol, workspace: ws.map(|w| w.1) };
        let low = launch::lower(kernel, counts).unwrap_or_else(|e| panic!("{e}"));
        let addr = |o: launch::Operand| {
            let d = match o.which {
                launch::Which::In(i) => ins[i],
                launch::Which::Out(j) => outs[j],
                launch::Which::Workspace => ws.expect("a workspace"),
            };
            assert!(o.offset <= d.1, "{}: offset {} past {} elements", kernel.name(), o.offset, d.1);
            d.0 + (o.offset * 4) as u64
        };
        let step = self.up(&[0u64]);
        let scratch: Vec<Dev<f32>> = low.scratch.iter().map(|&n| self.up(&vec![0f32; n])).collect();
        let (mut ptrs, mut floats, mut longs) = (Vec::new(), Vec::new(), Vec::new());
        for op in &low.ops {
            let l = match op {
                launch::LaunchOp::Launch(l) => l,
                launch::LaunchOp::Gemm(gm) => panic!("{}: the twins run no cuBLAS ({gm})", kernel.name()),
            };
            let mut args = Vec::new();
            for a in &l.args {
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
                    launch::Arg::Operands(v) => {
                        let p: Vec<u64> = v.iter().map(|&which| addr(launch::Operand { which, offset: 0 })).collect();
                        ptrs.push(self.up(&p));
                        A::U64(ptrs[ptrs.len() - 1].ptr)
                    }
                    launch::Arg::F32s(v) => {
                        floats.push(self.up(v));
                        A::U64(floats[floats.len() - 1].ptr)
                    }
                    launch::Arg::I64s(v) => {
                        longs.push(self.up(v));
                        A::U64(longs[longs.len() - 1].ptr)
                    }
                    launch::Arg::Scratch(k) => A::U64(scratch[*k].ptr),
                });
            }
            self.launch_smem(l.family, l.entry, (l.grid, l.block, l.shared_bytes), &args);
        }
    }

    /// Elementwise geometry over `count` elements.
    pub(crate) fn ew(&self, family: &'static str, entry: &str, count: usize, args: &[A]) {
        self.launch(family, entry, grid_1d(count), BLOCK, args)
    }

    pub(crate) fn up<T: DeviceRepr + Copy + Default>(&self, v: &[T]) -> Dev<T> {
        // Never allocate zero bytes: pad empty buffers with one element.
        let v: Vec<T> = if v.is_empty() { vec![T::default()] } else { v.to_vec() };
        let s = self.stream.clone_htod(&v).unwrap();
        let ptr = {
            let (p, _sync) = s.device_ptr(&self.stream);
            p
        };
        Dev { s, ptr }
    }

    pub(crate) fn down<T: DeviceRepr + Copy + Default>(&self, d: &Dev<T>, len: usize) -> Vec<T> {
        let mut v = self.stream.clone_dtoh(&d.s).unwrap();
        v.truncate(len);
        v
    }

    /// A device array of the buffers' pointers.
    pub(crate) fn ptrs<T>(&self, bufs: &[&Dev<T>]) -> Dev<u64> {
        self.up(&bufs.iter().map(|b| b.ptr).collect::<Vec<_>>())
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

#[derive(Default)]
pub(crate) struct Report {
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
