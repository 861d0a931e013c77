//! The text form of a lowering, one op a line: a launch as
//! `towers_binary_f32 grid=4 block=256 smem=0 (i32 3, i64 1000, in0, in1, out0, dims[1,1,10,100], ..)`,
//! a GEMM as `gemm m=8 n=4 k=3 (in0, in1^T -> out0) alpha=1 beta=0`.
//! Deterministic: it prints the ops' fields in order.

use std::fmt;

use super::{Arg, Gemm, Launch, LaunchOp, Lowering, Operand};

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.offset == 0 {
            write!(f, "{}", self.which)
        } else {
            write!(f, "{}+{}", self.which, self.offset)
        }
    }
}

fn list<T: fmt::Display>(v: &[T]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arg::Operand(o) => write!(f, "{o}"),
            Arg::Null => write!(f, "null"),
            Arg::I32(v) => write!(f, "i32 {v}"),
            Arg::I64(v) => write!(f, "i64 {v}"),
            Arg::U64(v) => write!(f, "u64 {v}"),
            Arg::F32(v) => write!(f, "f32 {v:?}"),
            Arg::Dims4(d) => write!(f, "dims[{}]", list(&d.d)),
            Arg::Pool(p) => write!(
                f,
                "pool{{{}x{}x{}x{} k={}x{} s={}x{} out={}x{} pad={},{}}}",
                p.n, p.h, p.w, p.c, p.kh, p.kw, p.stride_h, p.stride_w, p.out_h, p.out_w, p.pad_top, p.pad_left
            ),
            Arg::Conv(c) => write!(
                f,
                "conv{{{}x{}x{}x{} k={}x{} -> {} s={}x{} out={}x{} pad={},{}}}",
                c.n,
                c.h,
                c.w,
                c.c_in,
                c.kh,
                c.kw,
                c.c_out,
                c.stride_h,
                c.stride_w,
                c.out_h,
                c.out_w,
                c.pad_top,
                c.pad_left
            ),
            Arg::Step => write!(f, "&step"),
            Arg::Operands(v) => write!(f, "&[{}]", list(v)),
            Arg::F32s(v) => write!(f, "&f32[{}]", v.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(",")),
            Arg::I64s(v) => write!(f, "&i64[{}]", list(v)),
            Arg::Scratch(k) => write!(f, "&scratch{k}"),
        }
    }
}

impl Launch {
    /// `grid=4 block=256 smem=0`: the geometry alone.
    pub fn geometry(&self) -> String {
        format!("grid={} block={} smem={}", self.grid, self.block, self.shared_bytes)
    }
}

impl fmt::Display for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} ({})",
            self.entry,
            self.geometry(),
            self.args.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ")
        )
    }
}

impl fmt::Display for Gemm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = |b: bool| if b { "^T" } else { "" };
        write!(
            f,
            "gemm m={} n={} k={} ({}{}, {}{} -> {}) alpha={:?} beta={:?}",
            self.m,
            self.n,
            self.k,
            self.a,
            t(self.trans_a),
            self.b,
            t(self.trans_b),
            self.c,
            self.alpha,
            self.beta
        )?;
        if self.batch != 1 {
            write!(f, " batch={} strides={}/{}/{}", self.batch, self.stride_a, self.stride_b, self.stride_c)?;
        }
        Ok(())
    }
}

impl fmt::Display for LaunchOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaunchOp::Launch(l) => write!(f, "{l}"),
            LaunchOp::Gemm(g) => write!(f, "{g}"),
        }
    }
}

impl fmt::Display for Lowering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for op in &self.ops {
            writeln!(f, "{op}")?;
        }
        for (k, n) in self.scratch.iter().enumerate() {
            writeln!(f, "scratch{k}: {n} f32")?;
        }
        Ok(())
    }
}
