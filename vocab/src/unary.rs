//! The elementwise unary ops: [`UnaryOp`] with its names, codes, scalar
//! forward and gradient and CUDA C, all generated from the one table of
//! [`unary_table!`](crate::unary_table) in this file.
//!
//! One table, several expansions: the table is a callback macro, so each
//! crate that needs per-op code expands the same rows with its own macro.
//! This crate expands it into the enum and its metadata
//! (`define_unary_op!`); `towers_kernels::elementwise::unary` expands it
//! into one monomorphic (vectorizable) CPU loop per op. Adding an op is one
//! row here; nothing else lists the ops.
//!
//! Invariant: every gradient is a function of the upstream gradient `dy`
//! and the forward *output* `y` only (`dx = grad(dy, y)`), so the forward
//! input need not be kept alive and one generic rule differentiates every
//! op (`UnaryGrad(op)(dy, y)`). An op whose derivative cannot be written
//! from its output (`square`, `abs`) does not belong here.
//!
//! CUDA links by name: an op's code is the table's `code` ([`UnaryOp::code`]),
//! never its position in [`UnaryOp::ALL`]; codes are distinct and never
//! reused. A code the switches do not know writes NaN, never another op's
//! value.

/// The logistic function, stable on both tails (the table's `sigmoid`).
#[inline(always)]
pub fn sigmoid(v: f32) -> f32 {
    // Stable on both tails: exp of a non-positive argument only.
    if v >= 0.0 {
        1.0 / (1.0 + (-v).exp())
    } else {
        let e = v.exp();
        e / (1.0 + e)
    }
}

/// `dy` where `y > 0`, else 0. Branchless (a mask on the bits), so it
/// vectorizes: a branch on the sign of activations mispredicts about half
/// the time (measured 9x slower on a 256x256 ReLU gradient). At 0 the
/// gradient is 0, as TF's `ReluGrad`.
#[inline(always)]
pub fn pass_where_positive(dy: f32, y: f32) -> f32 {
    f32::from_bits(dy.to_bits() & u32::from(y > 0.0).wrapping_neg())
}

/// The one table of unary ops. `unary_table!(m)` expands to `m! { rows }`,
/// one row per op:
/// `Variant { name, tf, tf_grad, code, f: forward(x), grad: (dy, y) -> dx,
/// cuda: forward of v, cuda_grad: dx from g = dy and v = y }` (CUDA C),
/// each row after its doc comment. `f` and `grad` are closures or paths to
/// functions of this crate, usable from any crate.
#[macro_export]
macro_rules! unary_table {
    ($callback:ident) => {
        $callback! {
            /// `-x`; `dx = -dy`.
            Neg {
                name: "neg", tf: "Neg", tf_grad: "NegGrad", code: 0,
                f: |v: f32| -v, grad: |d: f32, _y: f32| -d,
                cuda: "-v", cuda_grad: "__fmul_rn(g, -1.0f)",
            }
            /// `max(x, 0)`; `dx = dy * [y > 0]`. A NaN stays NaN, as TF's
            /// `Relu` (a NaN input must not turn into a finite loss).
            Relu {
                name: "relu", tf: "Relu", tf_grad: "ReluGrad", code: 1,
                f: |v: f32| if v < 0.0 { 0.0 } else { v },
                grad: $crate::unary::pass_where_positive,
                cuda: "v < 0.0f ? 0.0f : v", cuda_grad: "v > 0.0f ? g : 0.0f",
            }
            /// `1 / (1 + exp(-x))`; `dx = dy * y * (1 - y)`.
            Sigmoid {
                name: "sigmoid", tf: "Sigmoid", tf_grad: "SigmoidGrad", code: 2,
                f: $crate::unary::sigmoid, grad: |d: f32, y: f32| d * y * (1.0 - y),
                cuda: "sigmoid(v)", cuda_grad: "__fmul_rn(__fmul_rn(g, v), __fsub_rn(1.0f, v))",
            }
            /// `tanh(x)`; `dx = dy * (1 - y^2)`.
            Tanh {
                name: "tanh", tf: "Tanh", tf_grad: "TanhGrad", code: 3,
                f: |v: f32| v.tanh(), grad: |d: f32, y: f32| d * (1.0 - y * y),
                cuda: "tanhf(v)", cuda_grad: "__fmul_rn(g, __fsub_rn(1.0f, __fmul_rn(v, v)))",
            }
            /// `exp(x)`; `dx = dy * y`.
            Exp {
                name: "exp", tf: "Exp", tf_grad: "ExpGrad", code: 4,
                f: |v: f32| v.exp(), grad: |d: f32, y: f32| d * y,
                cuda: "expf(v)", cuda_grad: "__fmul_rn(g, v)",
            }
            /// Natural log; `log(0) = -inf`, negative inputs give NaN (as TF);
            /// `dx = dy / x = dy * exp(-y)`.
            Log {
                name: "log", tf: "Log", tf_grad: "LogGrad", code: 5,
                f: |v: f32| v.ln(), grad: |d: f32, y: f32| d * (-y).exp(),
                cuda: "logf(v)", cuda_grad: "__fmul_rn(g, expf(-v))",
            }
            /// `sqrt(x)`; `dx = dy / (2 y)` (TF's `SqrtGrad`).
            Sqrt {
                name: "sqrt", tf: "Sqrt", tf_grad: "SqrtGrad", code: 6,
                f: |v: f32| v.sqrt(), grad: |d: f32, y: f32| d * 0.5 / y,
                cuda: "__fsqrt_rn(v)", cuda_grad: "__fdiv_rn(__fmul_rn(g, 0.5f), v)",
            }
            /// `1 / sqrt(x)`; `dx = -dy * y^3 / 2` (TF's `RsqrtGrad`).
            Rsqrt {
                name: "rsqrt", tf: "Rsqrt", tf_grad: "RsqrtGrad", code: 7,
                f: |v: f32| 1.0 / v.sqrt(), grad: |d: f32, y: f32| -0.5 * d * y * y * y,
                cuda: "__fdiv_rn(1.0f, __fsqrt_rn(v))", cuda_grad: "__fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(-0.5f, g), v), v), v)",
            }
            /// `1 / x`; `dx = -dy * y^2` (TF's `ReciprocalGrad`).
            Reciprocal {
                name: "reciprocal", tf: "Reciprocal", tf_grad: "ReciprocalGrad", code: 8,
                f: |v: f32| 1.0 / v, grad: |d: f32, y: f32| -d * y * y,
                cuda: "__fdiv_rn(1.0f, v)", cuda_grad: "__fmul_rn(__fmul_rn(-g, v), v)",
            }
            /// `x` if `x > 0` else `exp(x) - 1` (TF's `tf.nn.elu`); from y:
            /// `dx = dy` if `y > 0` else `dy * (y + 1)` (since `exp(x) = y + 1`; TF's `EluGrad`).
            Elu {
                name: "elu", tf: "Elu", tf_grad: "EluGrad", code: 9,
                f: |v: f32| if v > 0.0 { v } else { v.exp_m1() },
                grad: |d: f32, y: f32| if y > 0.0 { d } else { d * (y + 1.0) },
                cuda: "v > 0.0f ? v : expm1f(v)", cuda_grad: "v > 0.0f ? g : __fmul_rn(g, __fadd_rn(v, 1.0f))",
            }
            // math ops (issue 22)
            /// `min(max(x, 0), 6)` (TF's `tf.nn.relu6`; a NaN stays NaN); `dx = dy` where `0 < y < 6`,
            /// else 0: 0 at both kinks, as TF's `Relu6Grad` (`0 < x < 6`, and
            /// `0 < y < 6` holds exactly where `0 < x < 6`).
            Relu6 {
                name: "relu6", tf: "Relu6", tf_grad: "Relu6Grad", code: 10,
                f: |v: f32| if v < 0.0 { 0.0 } else if v > 6.0 { 6.0 } else { v },
                grad: |d: f32, y: f32| if y > 0.0 && y < 6.0 { d } else { 0.0 },
                cuda: "v < 0.0f ? 0.0f : (v > 6.0f ? 6.0f : v)", cuda_grad: "(v > 0.0f && v < 6.0f) ? g : 0.0f",
            }
            /// `log(1 + exp(x))` (TF's `tf.nn.softplus`), computed stably as
            /// `max(x, 0) + log1p(exp(-|x|))`; `dx = dy * sigmoid(x)`, and from y:
            /// `sigmoid(x) = 1 - exp(-y)` (since `exp(y) = 1 + exp(x)`), written
            /// `-expm1(-y)` so it stays exact for tiny y (x far below 0).
            Softplus {
                name: "softplus", tf: "Softplus", tf_grad: "SoftplusGrad", code: 11,
                f: |v: f32| v.max(0.0) + (-v.abs()).exp().ln_1p(),
                grad: |d: f32, y: f32| d * -(-y).exp_m1(),
                cuda: "__fadd_rn(fmaxf(v, 0.0f), log1pf(expf(-fabsf(v))))", cuda_grad: "__fmul_rn(g, -expm1f(-v))",
            }
            /// `|x|` (TF's `tf.abs`). Its gradient `dy * sign(x)` (0 at 0, as
            /// TF) needs the sign of x, which y = |x| has lost: autodiff builds
            /// `Binary(AbsGrad)(x, dy)` ([`crate::BinaryOp::AbsGrad`]) instead,
            /// so `UnaryGrad(Abs)` is never built; its column writes NaN, never
            /// a wrong finite value.
            Abs {
                name: "abs", tf: "Abs", tf_grad: "AbsGradFromY", code: 12,
                f: |v: f32| v.abs(), grad: |_d: f32, _y: f32| f32::NAN,
                cuda: "fabsf(v)", cuda_grad: "__int_as_float(0x7fc00000)",
            }
            // rounding and stable logs (stop 27)
            /// `floor(x)` (TF's `tf.floor`); piecewise constant: `dx = 0`
            /// (TF's `_FloorGrad` passes none).
            Floor {
                name: "floor", tf: "Floor", tf_grad: "FloorGrad", code: 13,
                f: |v: f32| v.floor(), grad: |_d: f32, _y: f32| 0.0,
                cuda: "floorf(v)", cuda_grad: "0.0f",
            }
            /// `ceil(x)` (TF's `tf.ceil`); `dx = 0`.
            Ceil {
                name: "ceil", tf: "Ceil", tf_grad: "CeilGrad", code: 14,
                f: |v: f32| v.ceil(), grad: |_d: f32, _y: f32| 0.0,
                cuda: "ceilf(v)", cuda_grad: "0.0f",
            }
            /// The nearest integer, halves to even (TF's `tf.round`: banker's
            /// rounding, `round(0.5) = 0`, `round(1.5) = 2`, `round(-2.5) = -2`);
            /// `dx = 0` (TF's `_RoundGrad`).
            Round {
                name: "round", tf: "Round", tf_grad: "RoundGrad", code: 15,
                f: |v: f32| v.round_ties_even(), grad: |_d: f32, _y: f32| 0.0,
                cuda: "rintf(v)", cuda_grad: "0.0f",
            }
            /// `-1`, `0` or `1` (TF's `tf.sign`; `sign(-0) = 0`, NaN stays
            /// NaN); `dx = 0` (TF's `_SignGrad`).
            Sign {
                name: "sign", tf: "Sign", tf_grad: "SignGrad", code: 16,
                f: |v: f32| if v > 0.0 { 1.0 } else if v < 0.0 { -1.0 } else if v.is_nan() { v } else { 0.0 },
                grad: |_d: f32, _y: f32| 0.0,
                cuda: "v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : (v != v ? v : 0.0f))", cuda_grad: "0.0f",
            }
            /// `log(1 + x)`, accurate near 0 (TF's `tf.log1p`); `dx = dy / (1 + x)
            /// = dy * exp(-y)`.
            Log1p {
                name: "log1p", tf: "Log1p", tf_grad: "Log1pGrad", code: 17,
                f: |v: f32| v.ln_1p(), grad: |d: f32, y: f32| d * (-y).exp(),
                cuda: "log1pf(v)", cuda_grad: "__fmul_rn(g, expf(-v))",
            }
            /// `exp(x) - 1`, accurate near 0 (TF's `tf.expm1`); `dx = dy * exp(x)
            /// = dy * (y + 1)`.
            Expm1 {
                name: "expm1", tf: "Expm1", tf_grad: "Expm1Grad", code: 18,
                f: |v: f32| v.exp_m1(), grad: |d: f32, y: f32| d * (y + 1.0),
                cuda: "expm1f(v)", cuda_grad: "__fmul_rn(g, __fadd_rn(v, 1.0f))",
            }
        }
    };
}

/// Expands the table into [`UnaryOp`] and its metadata (no kernels: those
/// are `towers_kernels`'s expansion of the same table).
macro_rules! define_unary_op {
    ($( $(#[$doc:meta])* $v:ident { name: $name:literal, tf: $tf:literal, tf_grad: $tfg:literal, code: $code:literal,
        f: $f:expr, grad: $g:expr, cuda: $cuda:literal, cuda_grad: $cudag:literal $(,)? } )*) => {
        /// An elementwise unary function (the graph's `Op::Unary`, the
        /// plan's `Kernel::Unary`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ::serde::Serialize, ::serde::Deserialize)]
        pub enum UnaryOp {
            $( $(#[$doc])* $v, )*
        }

        impl UnaryOp {
            /// Every op, in declaration order.
            pub const ALL: &'static [UnaryOp] = &[$(UnaryOp::$v),*];

            /// The kernel-level name (lower case, e.g. `relu`).
            pub fn name(self) -> &'static str {
                match self { $(UnaryOp::$v => $name,)* }
            }

            /// TF's op type name (`Relu`).
            pub fn tf_name(self) -> &'static str {
                match self { $(UnaryOp::$v => $tf,)* }
            }

            /// TF's type name of the gradient op (`ReluGrad`).
            pub fn tf_grad_name(self) -> &'static str {
                match self { $(UnaryOp::$v => $tfg,)* }
            }

            /// The op on one value.
            pub fn apply(self, x: f32) -> f32 {
                match self { $(UnaryOp::$v => ($f)(x),)* }
            }

            /// The gradient on one value, from the upstream `dy` and the output `y`.
            pub fn grad(self, dy: f32, y: f32) -> f32 {
                match self { $(UnaryOp::$v => ($g)(dy, y),)* }
            }

            /// The op's code in the CUDA switches and launch arguments: the
            /// table's `code`, never the op's position in [`UnaryOp::ALL`].
            pub const fn code(self) -> i32 {
                match self { $(UnaryOp::$v => $code,)* }
            }

            /// The op whose [`code`](UnaryOp::code) this is, if any.
            pub fn from_code(code: i32) -> Option<UnaryOp> {
                UnaryOp::ALL.iter().copied().find(|op| op.code() == code)
            }

            /// The CUDA C of `unary_op(op, v)` and `unary_grad_op(op, g, v)`
            /// (`g` = dy, `v` = y), one case per op of this table, numbered
            /// by [`code`](UnaryOp::code); any other code writes NaN.
            /// Products are rounded one by one (no fused multiply-add), as
            /// the CPU bodies, so results match bit for bit where the CPU's
            /// do. Deterministic: table order, same text every time.
            pub fn cuda_switches() -> String {
                let mut s = String::from(
                    "\n// Generated from the table of vocab/src/unary.rs (UnaryOp::cuda_switches):\n\
                     // case N is the op whose UnaryOp::code() is N; any other code writes NaN.\n\
                     __device__ __forceinline__ float unary_op(int op, float v) {\n    float r;\n    switch (op) {\n",
                );
                $( s.push_str(&format!("    case {}: r = {}; break;  // {}\n", $code, $cuda, $name)); )*
                s.push_str("    default: r = __int_as_float(0x7fc00000); break;  // no such op: NaN, never another op's value\n");
                s.push_str("    }\n    return r;\n}\n\n");
                s.push_str("__device__ __forceinline__ float unary_grad_op(int op, float g, float v) {\n    float r;\n    switch (op) {\n");
                $( s.push_str(&format!("    case {}: r = {}; break;  // {}\n", $code, $cudag, $tfg)); )*
                s.push_str("    default: r = __int_as_float(0x7fc00000); break;  // no such op: NaN, never another op's value\n");
                s.push_str("    }\n    return r;\n}\n");
                s
            }
        }
    };
}

unary_table!(define_unary_op);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct() {
        let mut names: Vec<&str> = UnaryOp::ALL.iter().map(|o| o.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), UnaryOp::ALL.len());
    }

    /// Codes are distinct and non-negative (the CUDA epilogues take -1 for
    /// "no activation"), and each names its op back.
    #[test]
    fn codes_are_distinct_and_name_their_op() {
        for &op in UnaryOp::ALL {
            assert!(op.code() >= 0, "{op:?}");
            assert_eq!(UnaryOp::from_code(op.code()), Some(op), "{op:?}");
        }
        let mut codes: Vec<i32> = UnaryOp::ALL.iter().map(|o| o.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), UnaryOp::ALL.len());
        assert_eq!(UnaryOp::from_code(-1), None);
    }

    /// The scalar forms on values whose results are exact in f32.
    #[test]
    fn scalar_forms() {
        assert_eq!(UnaryOp::Neg.apply(2.0), -2.0);
        assert_eq!(UnaryOp::Relu.apply(-1.0), 0.0);
        assert_eq!(UnaryOp::Relu6.apply(9.0), 6.0);
        assert_eq!(UnaryOp::Sigmoid.apply(0.0), 0.5);
        assert_eq!(UnaryOp::Sigmoid.apply(-200.0), 0.0);
        assert_eq!(UnaryOp::Relu.grad(3.0, 0.0), 0.0);
        assert_eq!(UnaryOp::Relu.grad(3.0, 1.0), 3.0);
        // tanh' from y: 1 - y^2.
        assert_eq!(UnaryOp::Tanh.grad(2.0, 0.5), 1.5);
    }

    /// Every op has one case in each CUDA switch, numbered by its code, and
    /// an unknown code writes NaN.
    #[test]
    fn cuda_switches_have_one_case_per_op() {
        let s = UnaryOp::cuda_switches();
        for &op in UnaryOp::ALL {
            assert_eq!(s.matches(&format!("    case {}: ", op.code())).count(), 2, "{op:?}");
        }
        assert_eq!(s.matches("default: r = __int_as_float(0x7fc00000)").count(), 2);
    }

    #[test]
    fn serde_round_trip() {
        for &op in UnaryOp::ALL {
            let j = serde_json::to_string(&op).unwrap();
            assert_eq!(serde_json::from_str::<UnaryOp>(&j).unwrap(), op);
        }
    }
}
