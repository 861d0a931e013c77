//! The broadcasting binary ops: [`BinaryOp`] with its names, plan-text
//! symbol, codes, scalar form and CUDA C, all generated from the one table
//! of [`binary_table!`](crate::binary_table) in this file, as
//! [`crate::unary`] does for the unary ops: this crate expands the table
//! into the enum and its metadata, `towers_kernels::elementwise::broadcast`
//! into one CPU loop per op. A new binary op is one row here (plus its
//! gradient rule in autodiff).
//!
//! CUDA links by name: an op's code is the table's `code`, never its
//! position in [`BinaryOp::ALL`]; a code the switch does not know writes
//! NaN, never another op's value.

/// The one table of binary ops. `binary_table!(m)` expands to `m! { rows }`,
/// one row per op: `Variant { name, tf, code, sym, f: (x, y) -> out, cuda:
/// out of x and y }` (CUDA C), each row after its doc comment.
#[macro_export]
macro_rules! binary_table {
    ($callback:ident) => {
        $callback! {
            /// `x + y`.
            Add { name: "add", tf: "Add", code: 0, sym: "+", f: |x: f32, y: f32| x + y, cuda: "__fadd_rn(x, y)" }
            /// `x - y`.
            Sub { name: "sub", tf: "Sub", code: 1, sym: "-", f: |x: f32, y: f32| x - y, cuda: "__fsub_rn(x, y)" }
            /// `x * y`.
            Mul { name: "mul", tf: "Mul", code: 2, sym: "*", f: |x: f32, y: f32| x * y, cuda: "__fmul_rn(x, y)" }
            /// `x / y` (TF's `RealDiv`).
            Div { name: "div", tf: "RealDiv", code: 3, sym: "/", f: |x: f32, y: f32| x / y, cuda: "__fdiv_rn(x, y)" }
            // math ops (issue 22)
            /// `max(x, y)` (TF's `tf.maximum`); a NaN operand yields the other
            /// operand, as IEEE `maxNum` (`f32::max`, CUDA's `fmaxf`).
            Maximum { name: "maximum", tf: "Maximum", code: 4, sym: " max ", f: |x: f32, y: f32| x.max(y), cuda: "fmaxf(x, y)" }
            /// `min(x, y)` (TF's `tf.minimum`); NaN as [`BinaryOp::Maximum`].
            Minimum { name: "minimum", tf: "Minimum", code: 5, sym: " min ", f: |x: f32, y: f32| x.min(y), cuda: "fminf(x, y)" }
            /// `x ^ y` (TF's `tf.pow`): `powf`, so a negative base with a
            /// non-integer exponent gives NaN and `0 ^ 0 = 1`, as TF.
            Pow { name: "pow", tf: "Pow", code: 6, sym: "^", f: |x: f32, y: f32| x.powf(y), cuda: "powf(x, y)" }
            /// `1` where `x >= y`, else `0` (f32): the mask that routes the gradient
            /// of `maximum`/`minimum` (TF's `GreaterEqual` + `Select`, as a factor).
            /// Made by autodiff only; it has no gradient.
            GreaterEqualMask {
                name: "ge_mask", tf: "GreaterEqualMask", code: 7, sym: " >= ",
                f: |x: f32, y: f32| if x >= y { 1.0 } else { 0.0 }, cuda: "(x >= y ? 1.0f : 0.0f)",
            }
            /// `z * log(x)` where `x > 0`, else `0`, from `x` and `z = pow(x, y)`:
            /// the factor of `pow`'s gradient with respect to the exponent (TF's
            /// `_PowGrad`: `where(x > 0, log(x), 0) * z`). Made by autodiff only; it
            /// has no gradient.
            PowGradY {
                name: "pow_grad_y", tf: "PowGradY", code: 8, sym: " powgrad ",
                f: |x: f32, z: f32| if x > 0.0 { z * x.ln() } else { 0.0 }, cuda: "(x > 0.0f ? __fmul_rn(y, logf(x)) : 0.0f)",
            }
            /// `dy * sign(x)` from `x` and `dy`: the gradient of `abs` (TF's
            /// `_AbsGrad`, `grad * sign(x)`): `dy` where `x > 0`, `-dy` where
            /// `x < 0`, `0` at `x = 0` (either sign), NaN where x is NaN. A
            /// binary op because the unary table's gradients see only `y = |x|`.
            /// Named `abs_grad_x`: `abs_grad` is the simplifier's term for
            /// `UnaryGrad(Abs)`. Made by autodiff only; it has no gradient.
            AbsGrad {
                name: "abs_grad_x", tf: "AbsGrad", code: 9, sym: " absgrad ",
                f: |x: f32, d: f32| if x > 0.0 { d } else if x < 0.0 { -d } else if x == 0.0 { 0.0 } else { x },
                cuda: "(x > 0.0f ? y : (x < 0.0f ? -y : (x == 0.0f ? 0.0f : x)))",
            }
        }
    };
}

/// Expands the table into [`BinaryOp`] and its metadata (no kernels: those
/// are `towers_kernels`'s expansion of the same table).
macro_rules! define_binary_op {
    ($( $(#[$doc:meta])* $v:ident { name: $name:literal, tf: $tf:literal, code: $code:literal, sym: $sym:literal,
        f: $f:expr, cuda: $cuda:literal $(,)? } )*) => {
        /// The broadcasting arithmetic ops (the graph's `Op::Binary`, the
        /// plan's `Kernel::Binary`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ::serde::Serialize, ::serde::Deserialize)]
        pub enum BinaryOp {
            $( $(#[$doc])* $v, )*
        }

        impl BinaryOp {
            /// Every op, in declaration order.
            pub const ALL: &'static [BinaryOp] = &[$(BinaryOp::$v),*];

            /// The kernel-level name (lower case, e.g. `add`).
            pub fn name(self) -> &'static str {
                match self { $(BinaryOp::$v => $name,)* }
            }

            /// TF's op type name (`Add`, `Sub`, `Mul`, `RealDiv`).
            pub fn tf_name(self) -> &'static str {
                match self { $(BinaryOp::$v => $tf,)* }
            }

            /// What joins the operand shapes in the plan text (`+`, ` max `).
            pub fn symbol(self) -> &'static str {
                match self { $(BinaryOp::$v => $sym,)* }
            }

            /// The op on one pair of values.
            pub fn apply(self, x: f32, y: f32) -> f32 {
                match self { $(BinaryOp::$v => ($f)(x, y),)* }
            }

            /// The op's code in the CUDA switch and launch arguments: the
            /// table's `code`, never the op's position in [`BinaryOp::ALL`].
            pub const fn code(self) -> i32 {
                match self { $(BinaryOp::$v => $code,)* }
            }

            /// The op whose [`code`](BinaryOp::code) this is, if any.
            pub fn from_code(code: i32) -> Option<BinaryOp> {
                BinaryOp::ALL.iter().copied().find(|op| op.code() == code)
            }

            /// The CUDA C of `binary_op(op, x, y)`: one case per op of this
            /// table, numbered by [`code`](BinaryOp::code); any other code
            /// writes NaN. Deterministic: table order, same text every time.
            pub fn cuda_switch() -> String {
                let mut s = String::from(
                    "\n// Generated from the table of vocab/src/binary.rs (BinaryOp::cuda_switch):\n\
                     // case N is the op whose BinaryOp::code() is N; any other code writes NaN.\n\
                     __device__ __forceinline__ float binary_op(int op, float x, float y) {\n    switch (op) {\n",
                );
                $( s.push_str(&format!("    case {}: return {};  // {}\n", $code, $cuda, $name)); )*
                s.push_str("    default: return __int_as_float(0x7fc00000);  // no such op: NaN, never another op's value\n");
                s.push_str("    }\n}\n");
                s
            }
        }
    };
}

binary_table!(define_binary_op);

#[cfg(test)]
mod tests {
    use super::*;

    /// Codes and names are distinct, and each code names its op back.
    #[test]
    fn codes_and_names_are_distinct() {
        for &op in BinaryOp::ALL {
            assert!(op.code() >= 0, "{op:?}");
            assert_eq!(BinaryOp::from_code(op.code()), Some(op), "{op:?}");
        }
        let mut codes: Vec<i32> = BinaryOp::ALL.iter().map(|o| o.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), BinaryOp::ALL.len());
        let mut names: Vec<&str> = BinaryOp::ALL.iter().map(|o| o.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), BinaryOp::ALL.len());
        assert_eq!(BinaryOp::from_code(-1), None);
    }

    #[test]
    fn scalar_forms() {
        assert_eq!(BinaryOp::Sub.apply(5.0, 2.0), 3.0);
        assert_eq!(BinaryOp::Div.apply(1.0, 4.0), 0.25);
        assert_eq!(BinaryOp::Maximum.apply(f32::NAN, 2.0), 2.0);
        assert_eq!(BinaryOp::GreaterEqualMask.apply(2.0, 2.0), 1.0);
        assert_eq!(BinaryOp::PowGradY.apply(-1.0, 3.0), 0.0);
        assert_eq!(BinaryOp::Pow.apply(2.0, 3.0), 8.0);
    }

    /// One case per op, numbered by its code; an unknown code writes NaN.
    #[test]
    fn cuda_switch_has_one_case_per_op() {
        let s = BinaryOp::cuda_switch();
        for &op in BinaryOp::ALL {
            assert_eq!(s.matches(&format!("    case {}: return ", op.code())).count(), 1, "{op:?}");
        }
        assert!(s.contains("default: return __int_as_float(0x7fc00000);"));
    }
}
