//! The elementwise comparisons with a bool result other than `Equal`
//! (TF's `Greater`, `GreaterEqual`, `Less`, `LessEqual`, `NotEqual`): one
//! table, [`compare_table!`](crate::compare_table), from which the enum,
//! its names, codes, scalar forms and the CUDA switch `compare_op` are
//! generated. No gradient (as TF).
//!
//! CUDA links by code, the table's `code`, never a position; an unknown
//! code writes -1, never another comparison's bool.

/// The one table of comparisons: `Variant { name, tf, code, sym, method }`,
/// the result being `a sym b` (Rust: `a.method(&b)`) on f32 (IEEE: any comparison with NaN is false
/// except `!=`) or i32.
#[macro_export]
macro_rules! compare_table {
    ($callback:ident) => {
        $callback! {
            /// `a > b` (TF's `tf.greater`).
            Greater { name: "greater", tf: "Greater", code: 0, sym: ">", method: gt }
            /// `a >= b` (TF's `tf.greater_equal`).
            GreaterEqual { name: "greater_equal", tf: "GreaterEqual", code: 1, sym: ">=", method: ge }
            /// `a < b` (TF's `tf.less`).
            Less { name: "less", tf: "Less", code: 2, sym: "<", method: lt }
            /// `a <= b` (TF's `tf.less_equal`).
            LessEqual { name: "less_equal", tf: "LessEqual", code: 3, sym: "<=", method: le }
            /// `a != b` (TF's `tf.not_equal`; NaN != NaN is true).
            NotEqual { name: "not_equal", tf: "NotEqual", code: 4, sym: "!=", method: ne }
        }
    };
}

macro_rules! define_comparison {
    ($( $(#[$doc:meta])* $v:ident { name: $name:literal, tf: $tf:literal, code: $code:literal, sym: $sym:literal, method: $m:ident } )*) => {
        /// An elementwise comparison (the graph's `Op::Compare`, the plan's
        /// `Kernel::Compare`), bool out.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ::serde::Serialize, ::serde::Deserialize)]
        pub enum Comparison {
            $( $(#[$doc])* $v, )*
        }

        impl Comparison {
            /// Every comparison, in table order.
            pub const ALL: &'static [Comparison] = &[$(Comparison::$v),*];

            /// The kernel-level name (`greater`, ...).
            pub fn name(self) -> &'static str {
                match self { $(Comparison::$v => $name,)* }
            }

            /// TF's op type name (`Greater`, ...).
            pub fn tf_name(self) -> &'static str {
                match self { $(Comparison::$v => $tf,)* }
            }

            /// The C/Rust operator (`>`, `!=`), as the plan text shows it.
            pub fn symbol(self) -> &'static str {
                match self { $(Comparison::$v => $sym,)* }
            }

            /// The code in the CUDA switch and launch arguments.
            pub const fn code(self) -> i32 {
                match self { $(Comparison::$v => $code,)* }
            }

            /// The comparison on two f32 values.
            pub fn apply_f32(self, a: f32, b: f32) -> bool {
                match self { $(Comparison::$v => a.$m(&b),)* }
            }

            /// The comparison on two i32 values.
            pub fn apply_i32(self, a: i32, b: i32) -> bool {
                match self { $(Comparison::$v => a.$m(&b),)* }
            }

            /// The CUDA C of `compare_op<T>(op, a, b)`: one case per
            /// comparison, numbered by [`code`](Comparison::code); any other
            /// code gives -1 (not a bool). Deterministic text.
            pub fn cuda_switch() -> String {
                let mut s = String::from(
                    "\n// Generated from the table of vocab/src/compare.rs (Comparison::cuda_switch):\n\
                     // case N is the comparison whose Comparison::code() is N; any other code gives -1.\n\
                     template <typename T> __device__ __forceinline__ int compare_op(int op, T a, T b) {\n    switch (op) {\n",
                );
                $( s.push_str(&format!("    case {}: return a {} b ? 1 : 0;  // {}\n", $code, $sym, $name)); )*
                s.push_str("    default: return -1;  // no such comparison: not a bool, never another's value\n");
                s.push_str("    }\n}\n");
                s
            }
        }
    };
}

compare_table!(define_comparison);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_forms_agree() {
        let mut codes: Vec<i32> = Comparison::ALL.iter().map(|c| c.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), Comparison::ALL.len());
        assert!(Comparison::Greater.apply_f32(2.0, 1.0) && !Comparison::Greater.apply_f32(1.0, 1.0));
        assert!(Comparison::GreaterEqual.apply_i32(1, 1) && !Comparison::Less.apply_i32(1, 1));
        assert!(Comparison::LessEqual.apply_f32(-0.0, 0.0));
        assert!(Comparison::NotEqual.apply_f32(f32::NAN, f32::NAN) && !Comparison::Less.apply_f32(f32::NAN, 1.0));
    }

    #[test]
    fn cuda_switch_has_one_case_per_comparison() {
        let s = Comparison::cuda_switch();
        for &c in Comparison::ALL {
            let case = format!("    case {}: return a {} b ? 1 : 0;", c.code(), c.symbol());
            assert_eq!(s.matches(&case).count(), 1, "{c:?}\n{s}");
        }
        assert!(s.contains("default: return -1;"));
    }
}
