//! The rewrite rules of `simplify`. Each is obviously sound and keeps the
//! numerics (constants fold in f64 in the analysis and round to f32 once;
//! `add-zero` keeps the sign of a zero `x`, where IEEE's `-0 + 0` is `+0`:
//! the only bit it changes, found by tests/tests/simplify_differential.rs);
//! each has a test below that shows its intent, in the style of egg's
//! `tests/math.rs`. Constant folding itself (`add`/`sub`/`mul`/`div`/`neg` of
//! constants, `reduce_sum` of a splat = value × count, `reshape`/
//! `broadcast_like`/`identity` of a splat) is done by the analysis, not by
//! rules; it has tests here too.
//!
//! Tower algebra on data movement (concat, slice, split parts are copies, so
//! cancelling them changes no bit):
//! - `concat-pieces`: a run of a concat's inputs that are, in order, the
//!   contiguous pieces of one tensor `x` along the concat's axis, from 0 to
//!   its end, at full extent on every other axis (the parts of a split of
//!   `x` along that axis, or slices of `x`), is `x`; a concat left with one
//!   input is that input. This cancels split-then-concat in the forward and
//!   its gradient (autodiff's concat gradient is slices of `dy`, the split
//!   gradient their concat). A run that covers only part of `x` is left
//!   alone: it could be one slice, but the split it reads usually stays for
//!   its other parts, so the slice would be a launch more, and tree-cost
//!   extraction cannot see that sharing (see `cost`);
//! - `slice-full`, `split-one-part`, `concat-one`: a slice, a split part or
//!   a concat with the type of its input is that input;
//! - reshape pairs: `reshape-reshape`, `reshape-noop`.
//!
//! The graph has no transpose op (only `MatMul`'s transpose flags), so
//! there is no transpose-pair rule.

use egg::{rewrite as rw, Applier, Id, Pattern, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};

use super::lang::{Attr, TEGraph, TensorLang, TypeAnalysis};

type Rule = Rewrite<TensorLang, TypeAnalysis>;

fn pat(s: &str) -> Pattern<TensorLang> {
    s.parse().expect("pattern")
}

fn var(s: &str) -> Var {
    s.parse().expect("pattern variable")
}

/// `?v` is a splat constant equal to `value`.
fn konst_is(v: &str, value: f64) -> impl Fn(&mut TEGraph, Id, &Subst) -> bool {
    let v = var(v);
    move |eg, _, s| eg[s[v]].data.konst == Some(value)
}

/// `?v` has the (fully known) type of the matched term: replacing the term by it changes no shape.
fn same_type(v: &str) -> impl Fn(&mut TEGraph, Id, &Subst) -> bool {
    let v = var(v);
    move |eg, id, s| eg[s[v]].data.known().is_some_and(|t| eg[id].data.known() == Some(t))
}

/// `?v` is a splat f32 constant of rank > 0 (so `(scalar ?v)` is smaller and broadcasts back to it).
fn splat_tensor(v: &str) -> impl Fn(&mut TEGraph, Id, &Subst) -> bool {
    let v = var(v);
    move |eg, _, s| eg[s[v]].data.konst.is_some() && eg[s[v]].data.known().is_some_and(|t| t.shape.rank() > 0)
}

/// A contiguous piece `lo..hi` along one axis of the tensor of class `x`, at
/// full extent on every other axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    x: Id,
    lo: usize,
    hi: usize,
}

/// The pieces along `axis` that the members of `class` are: split parts of
/// a split along `axis`, and slices full on every other axis.
fn pieces(eg: &TEGraph, class: Id, axis: usize) -> Vec<Piece> {
    let mut out = Vec::new();
    for node in &eg[class].nodes {
        let (a, x) = match node {
            TensorLang::SplitPart([a, x]) | TensorLang::Slice([a, x]) => (*a, *x),
            _ => continue,
        };
        let Some(dims) = eg[x].data.known().and_then(|t| t.shape.dims()) else { continue };
        let Some(&extent) = dims.get(axis) else { continue };
        let piece = match &eg[a].data.attr {
            Some(Attr::Part { axis: ax, sizes, index }) if *ax == axis && *index < sizes.len() => {
                let lo: usize = sizes[..*index].iter().sum();
                Some((lo, lo + sizes[*index]))
            }
            Some(Attr::Slice { begin, size }) if begin.len() == dims.len() && size.len() == dims.len() => {
                let full = (0..dims.len())
                    .filter(|&j| j != axis)
                    .all(|j| begin[j] == 0 && (size[j] < 0 || size[j] as usize == dims[j]));
                let lo = begin[axis];
                let hi = if size[axis] < 0 { extent } else { lo + size[axis] as usize };
                full.then_some((lo, hi))
            }
            _ => None,
        };
        if let Some((lo, hi)) = piece.filter(|&(lo, hi)| lo <= hi && hi <= extent) {
            out.push(Piece { x: eg.find(x), lo, hi });
        }
    }
    out
}

/// The extent of class `x` along `axis`, when its type is known.
fn extent(eg: &TEGraph, x: Id, axis: usize) -> Option<usize> {
    eg[x].data.known().and_then(|t| t.shape.dim(axis))
}

/// The inputs of a concat (attribute first) with every in-order run of
/// pieces covering a whole tensor replaced by it; `None` when there is none.
fn cancel_pieces(eg: &TEGraph, children: &[Id]) -> Option<Vec<Id>> {
    let Some(Attr::Axis(axis)) = children.first().and_then(|&a| eg[a].data.attr.clone()) else { return None };
    let ins = &children[1..];
    let mut out = vec![children[0]];
    let mut changed = false;
    let mut i = 0;
    'next: while i < ins.len() {
        for start in pieces(eg, ins[i], axis).into_iter().filter(|p| p.lo == 0) {
            let Some(end) = extent(eg, start.x, axis) else { continue };
            let (mut hi, mut j) = (start.hi, i);
            while hi < end && j + 1 < ins.len() {
                match pieces(eg, ins[j + 1], axis).into_iter().find(|p| p.x == start.x && p.lo == hi) {
                    Some(p) => (hi, j) = (p.hi, j + 1),
                    None => break,
                }
            }
            if hi == end {
                out.push(start.x);
                changed = true;
                i = j + 1;
                continue 'next;
            }
        }
        out.push(ins[i]);
        i += 1;
    }
    changed.then_some(out)
}

/// `concat-pieces` (see the module docs): finds the concats with a run of
/// pieces that covers a whole tensor.
struct ConcatPieces;

impl Searcher<TensorLang, TypeAnalysis> for ConcatPieces {
    fn search_eclass_with_limit(
        &self,
        eg: &TEGraph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, TensorLang>> {
        let found = limit > 0
            && eg[eclass].nodes.iter().any(|n| matches!(n, TensorLang::Concat(ch) if cancel_pieces(eg, ch).is_some()));
        found.then(|| SearchMatches { eclass, substs: vec![Subst::default()], ast: None })
    }

    fn vars(&self) -> Vec<Var> {
        Vec::new()
    }
}

impl Applier<TensorLang, TypeAnalysis> for ConcatPieces {
    fn apply_one(
        &self,
        eg: &mut TEGraph,
        eclass: Id,
        _subst: &Subst,
        _ast: Option<&PatternAst<TensorLang>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let concats: Vec<Box<[Id]>> = eg[eclass]
            .nodes
            .iter()
            .filter_map(|n| match n {
                TensorLang::Concat(ch) => Some(ch.clone()),
                _ => None,
            })
            .collect();
        let mut changed = Vec::new();
        for ch in concats {
            let Some(new) = cancel_pieces(eg, &ch) else { continue };
            let id = if new.len() == 2 { new[1] } else { eg.add(TensorLang::Concat(new.into_boxed_slice())) };
            // The covered tensor has the pieces' extent: the same type (checked, never assumed).
            if eg[id].data.known().is_some() && eg[id].data.ty == eg[eclass].data.ty && eg.union(eclass, id) {
                changed.push(eclass);
            }
        }
        changed
    }
}

/// All rules, in a fixed order.
pub fn rules() -> Vec<Rule> {
    let mut rules = vec![
        rw!("mul-one-right"; "(mul ?x ?c)" => "?x" if konst_is("?c", 1.0) if same_type("?x")),
        rw!("mul-one-left"; "(mul ?c ?x)" => "?x" if konst_is("?c", 1.0) if same_type("?x")),
        rw!("div-one"; "(div ?x ?c)" => "?x" if konst_is("?c", 1.0) if same_type("?x")),
        rw!("add-zero-right"; "(add ?x ?c)" => "?x" if konst_is("?c", 0.0) if same_type("?x")),
        rw!("add-zero-left"; "(add ?c ?x)" => "?x" if konst_is("?c", 0.0) if same_type("?x")),
        rw!("sub-zero"; "(sub ?x ?c)" => "?x" if konst_is("?c", 0.0) if same_type("?x")),
        rw!("neg-neg"; "(neg (neg ?x))" => "?x"),
        rw!("identity"; "(identity ?x)" => "?x"),
        rw!("reshape-reshape"; "(reshape ?s (reshape ?t ?x))" => "(reshape ?s ?x)"),
        rw!("reshape-noop"; "(reshape ?s ?x)" => "?x" if same_type("?x")),
        rw!("broadcast-noop"; "(broadcast_like ?x ?l)" => "?x" if same_type("?x")),
        rw!("slice-full"; "(slice ?s ?x)" => "?x" if same_type("?x")),
        rw!("split-one-part"; "(split_part ?p ?x)" => "?x" if same_type("?x")),
        rw!("concat-one"; "(concat ?a ?x)" => "?x" if same_type("?x")),
        Rewrite::new("concat-pieces", ConcatPieces, ConcatPieces).expect("concat-pieces binds no variables"),
    ];
    // A splat constant operand of a broadcasting binary op is the scalar
    // constant, when the other operand alone already has the result's type.
    // The operand order is kept, so every element is computed as before.
    for op in ["add", "sub", "mul", "div"] {
        let (name, lhs, rhs) =
            (format!("scalarize-{op}-left"), pat(&format!("({op} ?a ?y)")), pat(&format!("({op} (scalar ?a) ?y)")));
        rules.push(rw!(name; { lhs } => { rhs } if splat_tensor("?a") if same_type("?y")));
        let (name, lhs, rhs) =
            (format!("scalarize-{op}-right"), pat(&format!("({op} ?y ?a)")), pat(&format!("({op} ?y (scalar ?a))")));
        rules.push(rw!(name; { lhs } => { rhs } if splat_tensor("?a") if same_type("?y")));
    }
    rules
}

#[cfg(test)]
mod tests {
    use egg::{Extractor, RecExpr, Runner, SimpleScheduler};
    use towers_graph::TensorType;

    use super::*;
    use crate::simplify::cost::KernelCost;

    /// Leaves `x`, `y` f32[32,10], `v` f32[32], `b` f32[10], `s` f32[] (a non-constant scalar).
    fn analysis() -> TypeAnalysis {
        let mut a = TypeAnalysis::default();
        for (n, dims) in [("x", vec![32, 10]), ("y", vec![32, 10]), ("v", vec![32]), ("b", vec![10]), ("s", vec![])] {
            a.leaves.insert(n.into(), TensorType::f32(dims));
        }
        a
    }

    fn run(start: &str, rules: &[Rule]) -> (Runner<TensorLang, TypeAnalysis>, Id) {
        let start: RecExpr<TensorLang> = start.parse().expect("start term");
        let mut eg = TEGraph::new(analysis());
        let root = eg.add_expr(&start);
        eg.rebuild();
        let runner = Runner::default()
            .with_egraph(eg)
            .with_iter_limit(10)
            .with_node_limit(20_000)
            .with_scheduler(SimpleScheduler)
            .run(rules);
        assert!(matches!(runner.stop_reason, Some(egg::StopReason::Saturated)), "{:?}", runner.stop_reason);
        (runner, root)
    }

    /// `start` and `goal` end in one e-class, and `goal` is what extraction picks.
    fn proves(start: &str, goal: &str) {
        let (mut runner, root) = run(start, &rules());
        let goal_expr: RecExpr<TensorLang> = goal.parse().expect("goal term");
        let g = runner.egraph.add_expr(&goal_expr);
        runner.egraph.rebuild();
        assert_eq!(runner.egraph.find(root), runner.egraph.find(g), "{start} should equal {goal}");
        let (_, best) = Extractor::new(&runner.egraph, KernelCost { egraph: &runner.egraph }).find_best(root);
        assert_eq!(best.to_string(), goal_expr.to_string(), "extracting {start}");
    }

    /// `start` is left alone: extraction gives it back unchanged.
    fn keeps(start: &str) {
        let (runner, root) = run(start, &rules());
        let (_, best) = Extractor::new(&runner.egraph, KernelCost { egraph: &runner.egraph }).find_best(root);
        let start: RecExpr<TensorLang> = start.parse().unwrap();
        assert_eq!(best.to_string(), start.to_string());
    }

    // ---- constant folding (the analysis) ----

    #[test]
    fn folds_add_sub_mul_div_neg_of_constants() {
        proves("(add f32[]=1.5 f32[]=2.0)", "f32[]=3.5");
        proves("(sub f32[]=1.5 f32[]=2.0)", "f32[]=-0.5");
        proves("(mul f32[]=1.5 f32[]=2.0)", "f32[]=3.0");
        proves("(div f32[]=1.0 f32[]=32.0)", "f32[]=0.03125");
        proves("(neg f32[]=2.0)", "f32[]=-2.0");
    }

    #[test]
    fn folds_constants_with_broadcasting_to_the_broadcast_shape() {
        proves("(div f32[]=1.0 f32[1]=32.0)", "f32[1]=0.03125");
    }

    #[test]
    fn does_not_fold_a_division_by_zero() {
        keeps("(div f32[]=1.0 f32[]=0.0)");
    }

    #[test]
    fn reduce_sum_of_a_broadcast_constant_is_value_times_count() {
        proves("(reduce_sum axes[0]+keep (broadcast_like f32[]=1.0 v))", "f32[1]=32.0");
        proves("(reduce_sum axes[0,1] (broadcast_like f32[]=0.5 x))", "f32[]=160.0");
        proves("(reduce_sum axes[0] (broadcast_like f32[]=2.0 x))", "f32[10]=64.0");
    }

    #[test]
    fn reshape_of_a_broadcast_scalar_constant_is_a_constant_of_the_new_shape() {
        proves("(reshape dims[-1,1] (broadcast_like f32[1]=0.25 v))", "f32[32,1]=0.25");
    }

    // ---- rules ----

    #[test]
    fn mul_one() {
        proves("(mul x f32[]=1.0)", "x");
        proves("(mul f32[10]=1.0 x)", "x");
        // Multiplying by ones that broadcast b to a bigger shape is not b
        // (the broadcast ones fold into a constant, the multiply stays).
        proves("(mul b (broadcast_like f32[]=1.0 x))", "(mul b f32[32,10]=1.0)");
    }

    #[test]
    fn div_one() {
        proves("(div x f32[]=1.0)", "x");
    }

    #[test]
    fn add_zero_and_sub_zero() {
        proves("(add x f32[]=0.0)", "x");
        proves("(add f32[]=0.0 x)", "x");
        proves("(sub x f32[]=0.0)", "x");
        // 0 - x is not x.
        keeps("(sub f32[]=0.0 x)");
    }

    #[test]
    fn neg_neg() {
        proves("(neg (neg x))", "x");
        keeps("(neg x)");
    }

    #[test]
    fn identity_is_its_input() {
        proves("(identity (mul x y))", "(mul x y)");
    }

    #[test]
    fn reshape_of_reshape_is_one_reshape() {
        proves("(reshape dims[-1,5] (reshape dims[320] x))", "(reshape dims[-1,5] x)");
    }

    #[test]
    fn reshape_to_its_own_shape_is_a_no_op() {
        proves("(reshape dims[-1,10] x)", "x");
        keeps("(reshape dims[-1,1] v)");
    }

    #[test]
    fn broadcast_to_its_own_shape_is_a_no_op() {
        proves("(broadcast_like x y)", "x");
        keeps("(broadcast_like b x)");
    }

    #[test]
    fn splat_operand_becomes_a_scalar() {
        proves("(mul f32[32,1]=0.5 x)", "(mul f32[]=0.5 x)");
        proves("(mul x f32[32,1]=0.5)", "(mul x f32[]=0.5)");
        proves("(add f32[10]=2.0 x)", "(add f32[]=2.0 x)");
        proves("(sub x f32[10]=2.0)", "(sub x f32[]=2.0)");
        proves("(div f32[10]=2.0 x)", "(div f32[]=2.0 x)");
        // Not when the splat gives the result its shape: (mul f32[32,10]=2 s) needs the broadcast.
        keeps("(mul f32[32,10]=2.0 s)");
    }

    /// A split of x (f32[32,10]) concatenated back in order along the same
    /// axis is x, whatever the number of parts; also as a run inside a
    /// bigger concat.
    #[test]
    fn concat_of_a_splits_parts_in_order_is_its_input() {
        proves("(concat axis[1] (split_part part1[4,6]#0 x) (split_part part1[4,6]#1 x))", "x");
        proves("(concat axis[0] (split_part part0[16,16]#0 x) (split_part part0[16,16]#1 x))", "x");
        proves(
            "(concat axis[1] (split_part part1[2,3,5]#0 x) (split_part part1[2,3,5]#1 x) (split_part part1[2,3,5]#2 x))",
            "x",
        );
        proves(
            "(concat axis[1] y (split_part part1[4,6]#0 x) (split_part part1[4,6]#1 x) y)",
            "(concat axis[1] y x y)",
        );
    }

    /// Not in order, not all parts, another split of another tensor, or
    /// another axis: the concat stays.
    #[test]
    fn concat_of_parts_out_of_order_or_partial_stays() {
        keeps("(concat axis[1] (split_part part1[4,6]#1 x) (split_part part1[4,6]#0 x))");
        keeps("(concat axis[1] (split_part part1[2,3,5]#0 x) (split_part part1[2,3,5]#1 x))");
        keeps("(concat axis[1] (split_part part1[4,6]#0 x) (split_part part1[4,6]#1 y))");
        keeps("(concat axis[1] (split_part part0[16,16]#0 x) (split_part part0[16,16]#1 x))");
    }

    /// Autodiff's concat gradient: slices of dy at the inputs' offsets (size
    /// -1 for "to the end") concatenated again (the split's gradient) are dy;
    /// a slice and a split part of one tensor join too. Slices that are not
    /// full on the other axes are not pieces.
    #[test]
    fn concat_of_slices_covering_the_input_is_the_input() {
        proves("(concat axis[1] (slice begin[0,0]size[-1,4] x) (slice begin[0,4]size[-1,-1] x))", "x");
        proves("(concat axis[1] (split_part part1[4,6]#0 x) (slice begin[0,4]size[32,6] x))", "x");
        keeps("(concat axis[1] (slice begin[0,0]size[16,4] x) (slice begin[0,4]size[16,6] x))");
    }

    #[test]
    fn slice_of_all_of_its_input_is_the_input() {
        proves("(slice begin[0,0]size[-1,10] x)", "x");
        proves("(slice begin[0,0]size[32,10] x)", "x");
        keeps("(slice begin[0,1]size[-1,9] x)");
    }

    #[test]
    fn split_into_one_part_and_concat_of_one_input_are_their_input() {
        proves("(split_part part1[10]#0 x)", "x");
        proves("(concat axis[0] (mul x y))", "(mul x y)");
    }

    /// Data movement of splat constants folds (the analysis): every element is still the one value.
    #[test]
    fn concat_slice_and_split_of_splats_are_splats() {
        proves("(concat axis[0] f32[2]=1.5 f32[3]=1.5)", "f32[5]=1.5");
        keeps("(concat axis[0] f32[2]=1.5 f32[3]=2.5)");
        proves("(slice begin[1]size[2] f32[5]=0.5)", "f32[2]=0.5");
        proves("(split_part part0[2,3]#1 f32[5]=0.5)", "f32[3]=0.5");
    }

    /// The ReduceMean gradient as autodiff builds it for an unknown batch size,
    /// once the batch is 32: `Mul(Reshape(BroadcastLike(1 / Sum(BroadcastLike(1, v)), v)), y)`
    /// is `Mul(1/32, y)`.
    #[test]
    fn mean_gradient_becomes_one_scalar_multiply() {
        proves(
            "(mul (reshape dims[-1,1] (broadcast_like (div f32[]=1.0 (reduce_sum axes[0]+keep (broadcast_like f32[]=1.0 v))) v)) y)",
            "(mul f32[]=0.03125 y)",
        );
    }

    /// An unsound rule (a reshape is always its input) merges classes of
    /// different types and the analysis fails loudly.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "different types")]
    fn an_unsound_rule_fails_loudly() {
        let bad: Vec<Rule> = vec![rw!("bad"; "(reshape ?s ?x)" => "?x")];
        run("(reshape dims[-1,1] v)", &bad);
    }
}
