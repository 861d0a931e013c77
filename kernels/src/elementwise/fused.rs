//! Fused elementwise kernels, generated from their expression.
//!
//! A [`FusedExpr`] is a small straight-line program over the kernel's
//! inputs: each [`FusedStep`] is an input (broadcast to the output's shape),
//! an f32 constant, a unary op, a unary op's gradient or a binary op, and
//! reads only earlier steps; the last step is the output. The compiler's
//! equality saturation builds one from a chain of elementwise graph nodes
//! (`passes::simplify::fuse`); nothing here is written per combination:
//! - [`fused`] is the CPU body: it evaluates the program block by block
//!   ([`BLOCK`] elements) in stack registers, one vectorized loop per step,
//!   through the same per-op loops as the unfused kernels
//!   ([`super::unary`], [`super::unary_grad`], the binary ops), so a fused
//!   launch gives the same bits as the launches it replaces;
//! - [`cuda_kernel`] writes its CUDA C twin: one `towers_fused_<hash>` entry
//!   point with one statement per step, every product and sum rounded on its
//!   own (`__fmul_rn`, `__fadd_rn`: no contraction into a fused
//!   multiply-add), so the CUDA form matches the CPU bit for bit except in
//!   transcendental functions.
//!
//! The expression ([`FusedExpr`], [`FusedStep`]) lives in `towers_vocab`
//! and is re-exported here.
//!
//! Invariants (checked by [`FusedExpr::new`]): 1 to [`MAX_STEPS`] steps,
//! every operand an earlier step, inputs numbered `0..n` with every one
//! used, `n <= `[`MAX_INPUTS`]. Shapes are launch arguments, not part of
//! the expression: one compiled CUDA module serves every shape. The text
//! form (`ew[$0;$1;add:0:1;relu:2]`, `Display` and `FromStr`) is
//! canonical: its FNV-1a hash names the CUDA entry point.

use std::fmt::Write as _;

/// Re-exports: the expression is vocabulary (`towers_vocab::fused`).
pub use towers_vocab::fused::{FusedError, FusedExpr, FusedStep, MAX_INPUTS, MAX_STEPS};

use super::broadcast::binary_same_shape;
use super::unary::{unary, unary_grad};
use crate::shape::{bstrides, numel, pad4};
use crate::KernelError;

/// Elements per block of the CPU body: every register holds one block.
pub const BLOCK: usize = 256;

fn bad(reason: impl Into<String>) -> KernelError {
    KernelError::BadFusion { reason: reason.into() }
}

/// How one input reaches the registers.
#[derive(Clone, Copy)]
enum Mode {
    /// The output's own shape: read in place, never copied.
    Full,
    /// One value for every element.
    Scalar(f32),
    /// Broadcast along some axes: gathered through its broadcast strides.
    Strided([usize; 4]),
}

/// `dst[j] = x[offset(start + j)]` for an input with broadcast strides `s` against output dims `od`.
fn gather(x: &[f32], s: &[usize; 4], od: &[usize; 4], start: usize, dst: &mut [f32]) {
    let mut c = [0usize; 4];
    let mut r = start;
    for d in (0..4).rev() {
        c[d] = r % od[d];
        r /= od[d];
    }
    let mut j = 0;
    while j < dst.len() {
        let base = c[0] * s[0] + c[1] * s[1] + c[2] * s[2];
        let run = (od[3] - c[3]).min(dst.len() - j);
        if s[3] == 0 {
            dst[j..j + run].fill(x[base]);
        } else {
            dst[j..j + run].copy_from_slice(&x[base + c[3]..base + c[3] + run]);
        }
        j += run;
        c[3] += run;
        let mut d = 3;
        while d > 0 && c[d] == od[d] {
            c[d] = 0;
            c[d - 1] += 1;
            d -= 1;
        }
    }
}

/// The CPU body: `out = expr(ins)`, every input broadcast to `out_shape`
/// (NumPy rules, rank <= 4). Allocates nothing: registers are a fixed
/// stack block ([`MAX_STEPS`] x [`BLOCK`] floats).
///
/// Errors: an input count other than the expression's, an input shape that
/// does not broadcast to `out_shape`, or a rank above 4.
pub fn fused(
    expr: &FusedExpr,
    ins: &[&[f32]],
    in_shapes: &[Vec<usize>],
    out_shape: &[usize],
    out: &mut [f32],
) -> Result<(), KernelError> {
    if ins.len() != expr.inputs() || in_shapes.len() != expr.inputs() {
        return Err(bad(format!("{} inputs given, the expression reads {}", ins.len(), expr.inputs())));
    }
    let od = pad4("fused", out_shape)?;
    let mut modes = [Mode::Full; MAX_INPUTS];
    for (k, shape) in in_shapes.iter().enumerate() {
        let p = pad4("fused", shape)?;
        if p.iter().zip(&od).any(|(&a, &o)| a != o && a != 1) {
            return Err(KernelError::IncompatibleShapes { op: "fused", a: shape.clone(), b: out_shape.to_vec() });
        }
        debug_assert_eq!(ins[k].len(), numel(shape));
        modes[k] = if p == od {
            Mode::Full
        } else if numel(shape) == 1 {
            Mode::Scalar(ins[k][0])
        } else {
            Mode::Strided(bstrides(&p))
        };
    }
    let n = out.len();
    debug_assert_eq!(n, numel(out_shape));
    let steps = expr.steps();
    // Which steps are a full input read in place (`Some(k)`) rather than a register.
    let mut alias = [None; MAX_STEPS];
    for (i, s) in steps.iter().enumerate() {
        if let FusedStep::Input(k) = *s {
            if matches!(modes[k as usize], Mode::Full) {
                alias[i] = Some(k as usize);
            }
        }
    }
    let mut regs = [[0.0f32; BLOCK]; MAX_STEPS];
    let mut start = 0;
    while start < n {
        let len = BLOCK.min(n - start);
        for (i, step) in steps.iter().enumerate() {
            let last = i + 1 == steps.len();
            let (prev, rest) = regs.split_at_mut(i);
            let get = |k: u8| -> &[f32] {
                match alias[k as usize] {
                    Some(inp) => &ins[inp][start..start + len],
                    None => &prev[k as usize][..len],
                }
            };
            let dst: &mut [f32] = if last { &mut out[start..start + len] } else { &mut rest[0][..len] };
            match *step {
                FusedStep::Input(k) => match modes[k as usize] {
                    Mode::Full => {
                        if last {
                            dst.copy_from_slice(&ins[k as usize][start..start + len]);
                        }
                    }
                    Mode::Scalar(v) => dst.fill(v),
                    Mode::Strided(s) => gather(ins[k as usize], &s, &od, start, dst),
                },
                FusedStep::Const(b) => dst.fill(f32::from_bits(b)),
                FusedStep::Unary(op, a) => unary(op, get(a), dst),
                FusedStep::UnaryGrad(op, dy, y) => unary_grad(op, get(dy), get(y), dst),
                FusedStep::Binary(op, a, b) => binary_same_shape(op, get(a), get(b), dst),
            }
        }
        start += len;
    }
    Ok(())
}

/// The CUDA C of one fused kernel: the entry point [`FusedExpr::entry`],
/// arguments `(i64 n, Dims4 od, const float* x0, Dims4 s0, ..., float* y)`
/// (the output's element count and padded dims, then every input with its
/// broadcast strides against the output, then the output), a 1-D grid-stride
/// loop (block `cuda::BLOCK`, grid `cuda::grid_1d(n)`). It is compiled after
/// the elementwise family's source, whose `Dims4`, `bcast_offset`,
/// `unary_op`, `unary_grad_op` and `binary_op` it calls with constant op
/// codes (`UnaryOp::code`, `BinaryOp::code`: the tables', never a position).
pub fn cuda_kernel(expr: &FusedExpr) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n// Generated from {expr}:\n// {}", expr.tree());
    let mut args = vec!["i64 n".to_string(), "Dims4 od".to_string()];
    for k in 0..expr.inputs() {
        args.push(format!("const float* __restrict__ x{k}"));
        args.push(format!("Dims4 s{k}"));
    }
    args.push("float* __restrict__ y".into());
    let _ = writeln!(s, "extern \"C\" __global__ void {}({}) {{", expr.entry(), args.join(", "));
    let _ = writeln!(s, "    GRID_STRIDE(i, n) {{");
    for (i, step) in expr.steps().iter().enumerate() {
        let rhs = match *step {
            FusedStep::Input(k) => format!("x{k}[bcast_offset(i, od, s{k})]"),
            FusedStep::Const(b) => format!("__int_as_float(0x{b:08x})"),
            FusedStep::Unary(op, a) => format!("unary_op({}, v{a})", op.code()),
            FusedStep::UnaryGrad(op, a, b) => format!("unary_grad_op({}, v{a}, v{b})", op.code()),
            FusedStep::Binary(op, a, b) => format!("binary_op({}, v{a}, v{b})", op.code()),
        };
        let _ = writeln!(s, "        const float v{i} = {rhs};");
    }
    let _ = writeln!(s, "        y[i] = v{};", expr.steps().len() - 1);
    let _ = writeln!(s, "    }}\n}}");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elementwise::binary;
    use crate::testutil::Lcg;
    use crate::{BinaryOp, UnaryOp};

    fn swish_grad() -> FusedExpr {
        // dz = dy * s + sigmoid_grad(dy * z, s), s = sigmoid(z): inputs z, dy.
        "ew[$0;sigmoid:0;$1;mul:2:1;mul:2:0;sigmoid_grad:4:1;add:3:5]".parse().unwrap()
    }

    #[test]
    fn text_round_trips_and_checks_its_invariants() {
        let e = swish_grad();
        assert_eq!(e.to_string().parse::<FusedExpr>().unwrap(), e);
        assert_eq!(e.inputs(), 2);
        assert_eq!(e.tree(), "(add (mul $1 (sigmoid $0)) (sigmoid_grad (mul $1 $0) (sigmoid $0)))");
        let c: FusedExpr = "ew[$0;c3f000000;mul:0:1]".parse().unwrap();
        assert_eq!(c.tree(), "(mul $0 0.5)");
        assert!(e.entry().starts_with("towers_fused_") && e.entry() != c.entry());
        for wrong in ["ew[]", "ew[$1]", "ew[relu:0]", "ew[$0;frob:0]", "ew[$0;add:0:2]", "ew[$0;$2;add:0:1]", "x"] {
            assert!(wrong.parse::<FusedExpr>().is_err(), "{wrong} is refused");
        }
        let long = vec![FusedStep::Const(0); MAX_STEPS + 1];
        assert!(FusedExpr::new(long).is_err());
    }

    /// The fused body gives the bits of the unfused kernels run one by one,
    /// with full, scalar and broadcast inputs and lengths across blocks.
    #[test]
    fn fused_matches_the_unfused_kernels_bit_for_bit() {
        let mut r = Lcg::new(7);
        let out_shape = [3usize, 5, 67];
        let n = numel(&out_shape);
        let x: Vec<f32> = (0..n).map(|_| r.next() * 4.0 - 2.0).collect();
        let b: Vec<f32> = (0..67).map(|_| r.next() - 0.5).collect();
        let col: Vec<f32> = (0..5).map(|_| r.next() + 0.5).collect();
        let s = [1.5f32];
        // ((x + b) * col) / s, then tanh, then its gradient against x.
        let e: FusedExpr = "ew[$0;$1;add:0:1;$2;mul:2:3;$3;div:4:5;tanh:6;tanh_grad:0:7]".parse().unwrap();
        let shapes = vec![out_shape.to_vec(), vec![67], vec![5, 1], vec![]];
        let mut got = vec![0.0; n];
        fused(&e, &[&x, &b, &col, &s], &shapes, &out_shape, &mut got).unwrap();

        let mut t1 = vec![0.0; n];
        binary(BinaryOp::Add, &x, &out_shape, &b, &[67], &mut t1).unwrap();
        let mut t2 = vec![0.0; n];
        binary(BinaryOp::Mul, &t1, &out_shape, &col, &[5, 1], &mut t2).unwrap();
        binary(BinaryOp::Div, &t2, &out_shape, &s, &[], &mut t1).unwrap();
        unary(UnaryOp::Tanh, &t1, &mut t2);
        let mut want = vec![0.0; n];
        unary_grad(UnaryOp::Tanh, &x, &t2, &mut want);
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));

        let mut wrong = vec![0.0; n];
        let bad_shapes = vec![out_shape.to_vec(), vec![66], vec![5, 1], vec![]];
        assert!(fused(&e, &[&x, &b, &col, &s], &bad_shapes, &out_shape, &mut wrong).is_err());
        assert!(fused(&e, &[&x, &b], &shapes[..2], &out_shape, &mut wrong).is_err());
    }

    /// An expression that is one input copies it; a full input read twice is read in place.
    #[test]
    fn copies_and_repeated_inputs() {
        let x: Vec<f32> = (0..600).map(|i| i as f32 * 0.01).collect();
        let mut y = vec![0.0; 600];
        fused(&"ew[$0]".parse().unwrap(), &[&x], &[vec![600]], &[600], &mut y).unwrap();
        assert_eq!(x, y);
        fused(&"ew[$0;mul:0:0]".parse().unwrap(), &[&x], &[vec![600]], &[600], &mut y).unwrap();
        assert!(x.iter().zip(&y).all(|(a, b)| (a * a).to_bits() == b.to_bits()));
    }

    #[test]
    fn cuda_text_is_deterministic_and_rounds_every_step() {
        let e = swish_grad();
        let k = cuda_kernel(&e);
        assert_eq!(k, cuda_kernel(&e));
        assert!(k.contains(&format!("void {}(i64 n, Dims4 od, const float* __restrict__ x0, Dims4 s0", e.entry())));
        assert!(
            k.contains("unary_grad_op(2, v4, v1)") && k.contains("binary_op(0, v3, v5)") && k.contains("y[i] = v6;")
        );
        // The binary switch rounds every step on its own, as the CPU does.
        assert!(BinaryOp::cuda_switch().contains("case 0: return __fadd_rn(x, y);  // add"));
    }
}
