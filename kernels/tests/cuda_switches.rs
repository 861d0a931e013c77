//! CUDA links by name (CPU only, no NVRTC): the op switches every CUDA
//! source holds are generated from the Rust tables (`UnaryOp::cuda_switches`,
//! `BinaryOp::cuda_switch`), one case per op numbered by `op.code()`, and a
//! code no op has writes NaN. `cuda_compile.rs` compiles the same text with
//! NVRTC and checks what an unknown code compiles to.

use towers_kernels::cuda;
use towers_kernels::{BinaryOp, UnaryOp};

/// The cases of the switch that starts at `entry` in `code`, as
/// (code, the text of the case), and the text of its `default:`.
fn switch_cases(code: &str, entry: &str) -> (Vec<(i32, String)>, String) {
    let body = code.split(entry).nth(1).expect("the function").split("\n}\n").next().unwrap_or("");
    let switch = body.split("switch (op) {").nth(1).expect("a switch");
    let (cases, default) = switch.split_once("default:").expect("a default");
    let cases = cases
        .split("case ")
        .skip(1)
        .map(|c| {
            let (n, rest) = c.split_once(':').expect("case N:");
            (n.trim().parse().expect("a numeric case"), rest.trim().to_string())
        })
        .collect();
    (cases, default.lines().next().unwrap_or("").to_string())
}

/// CUDA links by name: the generated switches have exactly one case per
/// op, numbered by `op.code()` and computing that op's CUDA form from
/// the table, in every source; a code no op has writes NaN (the
/// `default:` computes no op), so an op added to a table always gets its
/// case and never falls into another op's.
#[test]
fn the_generated_cuda_switches_have_one_case_per_op_code_and_nan_otherwise() {
    let nan = "__int_as_float(0x7fc00000)";
    for src in cuda::sources() {
        assert!(src.code.starts_with(cuda::prelude()), "{}", src.path);
        let (cases, default) = switch_cases(src.code, "float unary_op(int op, float v) {");
        let want: Vec<i32> = UnaryOp::ALL.iter().map(|o| o.code()).collect();
        assert_eq!(cases.iter().map(|c| c.0).collect::<Vec<_>>(), want, "{}: unary_op", src.path);
        for (op, (_, text)) in UnaryOp::ALL.iter().zip(&cases) {
            assert!(text.ends_with(&format!("break;  // {}", op.name())), "{}: {op:?}: {text}", src.path);
        }
        assert!(default.contains(&format!("r = {nan}; break;")), "{}: unary_op default: {default}", src.path);
        let (cases, default) = switch_cases(src.code, "float unary_grad_op(int op, float g, float v) {");
        assert_eq!(cases.iter().map(|c| c.0).collect::<Vec<_>>(), want, "{}: unary_grad_op", src.path);
        assert!(default.contains(&format!("r = {nan}; break;")), "{}: unary_grad_op default: {default}", src.path);
        let (cases, default) = switch_cases(src.code, "float binary_op(int op, float x, float y) {");
        let want: Vec<i32> = BinaryOp::ALL.iter().map(|o| o.code()).collect();
        assert_eq!(cases.iter().map(|c| c.0).collect::<Vec<_>>(), want, "{}: binary_op", src.path);
        for (op, (_, text)) in BinaryOp::ALL.iter().zip(&cases) {
            assert!(text.ends_with(&format!(";  // {}", op.name())), "{}: {op:?}: {text}", src.path);
        }
        assert!(default.contains(&format!("return {nan};")), "{}: binary_op default: {default}", src.path);
        // No hand-written switch over op codes is left in a family's own text.
        assert!(!src.body().contains("switch (op)"), "{}: a switch over op codes outside the tables", src.path);
    }
    // Generated once: the same text on every call.
    assert_eq!(UnaryOp::cuda_switches(), UnaryOp::cuda_switches());
    assert!(std::ptr::eq(cuda::prelude(), cuda::prelude()));
}
