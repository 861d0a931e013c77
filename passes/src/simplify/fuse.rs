//! Fusion in the e-graph: chains of elementwise terms become one
//! `(fused ew[..] inputs..)` term, whose kernel is generated from its
//! expression ([`towers_graph::FusedExpr`]; CPU body and CUDA C in
//! `kernels::elementwise::fused`).
//!
//! It runs after the simplification rules have saturated, on the same
//! e-graph, in rounds ([`FUSE_ROUNDS`]); each round inlines one more level:
//! for every elementwise e-node of a class (`add`, `relu`, `relu_grad`,
//! ..., or a `fused` node made by an earlier round) and every input class
//! that may be inlined, every elementwise e-node of that input class is
//! inlined, giving a new `fused` e-node that is added to the class. An input
//! class may be inlined when:
//! - it has exactly one consumer in the term DAG that extraction picks
//!   before fusion (so no work is done twice and no tensor is kept alive
//!   longer: the classic producer-consumer rule) and is not a root (a
//!   tensor the rest of the graph reads must exist);
//! - it has the consumer's full f32 type (a broadcast intermediate would be
//!   computed once per output element);
//! - the result stays within [`MAX_STEPS`] steps and [`MAX_INPUTS`] inputs.
//!
//! Classes the caller keeps get no fused node: an activation gradient read
//! by a bias gradient, which lowering fuses with it (`unary_grad_bias_grad`,
//! `max_pool_grad_act_bias_grad`: the column sums in the same pass, in
//! place); fusing its producer into it instead would save no launch.
//!
//! Scalar splat constants are inlined as constants. The expression of a fused
//! e-node is canonical (steps in post-order from the output, operands left
//! to right, equal steps shared, inputs numbered by first use), so fusing
//! the same chain along two paths hash-conses to one e-node. Extraction
//! (`KernelCost`: a fused node is one launch and its output's bytes) then
//! picks a fused node wherever it saves a launch.
//!
//! Limits are counts, never time: at most [`FUSE_ROUNDS`] rounds and
//! [`FUSE_MATCH_LIMIT`] new e-nodes per round; [`FuseReport::stop`] says
//! which ended it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use egg::{Extractor, Id};
use towers_graph::{DType, FusedExpr};
use towers_kernels::elementwise::fused::{FusedStep, MAX_INPUTS, MAX_STEPS};

use super::cost::KernelCost;
use super::lang::{Attr, TEGraph, TensorLang};

/// Rounds of inlining: a chain of up to `FUSE_ROUNDS + 1` ops fuses.
pub const FUSE_ROUNDS: usize = 8;
/// New fused e-nodes per round at most (a per-rule match limit).
pub const FUSE_MATCH_LIMIT: usize = 20_000;

/// Why fusion stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FuseStop {
    /// A round added nothing new.
    Saturated,
    /// [`FUSE_ROUNDS`] rounds ran.
    RoundLimit,
    /// A round found more than [`FUSE_MATCH_LIMIT`] candidates (the first ones were added).
    MatchLimit,
}

/// What fusion did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuseReport {
    pub rounds: usize,
    pub added: usize,
    pub stop: FuseStop,
}

/// An elementwise e-node as a program over its input classes.
fn program(eg: &TEGraph, node: &TensorLang) -> Option<(Vec<FusedStep>, Vec<Id>)> {
    let two = |a: Id, b: Id, f: &dyn Fn(u8, u8) -> FusedStep| {
        if eg.find(a) == eg.find(b) {
            (vec![FusedStep::Input(0), f(0, 0)], vec![a])
        } else {
            (vec![FusedStep::Input(0), FusedStep::Input(1), f(0, 1)], vec![a, b])
        }
    };
    Some(match node {
        TensorLang::Binary(op, [a, b]) => two(*a, *b, &|x, y| FusedStep::Binary(op.0, x, y)),
        TensorLang::UnaryGrad(op, [a, b]) => two(*a, *b, &|x, y| FusedStep::UnaryGrad(op.0, x, y)),
        TensorLang::Unary(op, [a]) => (vec![FusedStep::Input(0), FusedStep::Unary(op.0, 0)], vec![*a]),
        TensorLang::Fused(ch) => match &eg[*ch.first()?].data.attr {
            Some(Attr::Expr(e)) => (e.steps().to_vec(), ch[1..].to_vec()),
            _ => return None,
        },
        _ => return None,
    })
}

/// Whether class `c` holds a fully known f32 tensor.
fn f32_known(eg: &TEGraph, c: Id) -> bool {
    eg[c].data.known().is_some_and(|t| t.dtype == DType::F32)
}

/// Builds a canonical program: post-order from the output, equal steps shared.
#[derive(Default)]
struct Builder {
    steps: Vec<FusedStep>,
    index: HashMap<FusedStep, u8>,
    inputs: Vec<Id>,
}

impl Builder {
    fn push(&mut self, s: FusedStep) -> Option<u8> {
        if let Some(&i) = self.index.get(&s) {
            return Some(i);
        }
        if self.steps.len() >= MAX_STEPS {
            return None;
        }
        let i = self.steps.len() as u8;
        self.steps.push(s);
        self.index.insert(s, i);
        Some(i)
    }

    /// Input class `c`: a scalar constant inlined (it cannot change the
    /// output's shape), else an input numbered by first use.
    fn input(&mut self, eg: &TEGraph, c: Id) -> Option<u8> {
        let c = eg.find(c);
        let scalar = eg[c].data.known().is_some_and(|t| t.dtype == DType::F32 && t.shape.rank() == 0);
        if let (Some(v), true) = (eg[c].data.konst, scalar) {
            return self.push(FusedStep::Const((v as f32).to_bits()));
        }
        let k = match self.inputs.iter().position(|&x| x == c) {
            Some(k) => k,
            None if self.inputs.len() < MAX_INPUTS => {
                self.inputs.push(c);
                self.inputs.len() - 1
            }
            None => return None,
        };
        self.push(FusedStep::Input(k as u8))
    }
}

/// A parent program with input `j` replaced by a child program, as one canonical fused e-node.
struct Compose<'a> {
    eg: &'a TEGraph,
    parent: &'a [FusedStep],
    parent_ins: &'a [Id],
    j: usize,
    child: &'a [FusedStep],
    child_ins: &'a [Id],
    b: Builder,
    memo: BTreeMap<(bool, usize), u8>,
}

impl Compose<'_> {
    /// Step `i` of the child (`in_child`) or the parent, emitted in post-order.
    fn walk(&mut self, in_child: bool, i: usize) -> Option<u8> {
        if let Some(&s) = self.memo.get(&(in_child, i)) {
            return Some(s);
        }
        let step = if in_child { self.child[i] } else { self.parent[i] };
        let r = match step {
            FusedStep::Input(k) if !in_child && k as usize == self.j => self.walk(true, self.child.len() - 1)?,
            FusedStep::Input(k) => {
                let ins = if in_child { self.child_ins } else { self.parent_ins };
                self.b.input(self.eg, ins[k as usize])?
            }
            FusedStep::Const(bits) => self.b.push(FusedStep::Const(bits))?,
            FusedStep::Unary(op, a) => {
                let a = self.walk(in_child, a as usize)?;
                self.b.push(FusedStep::Unary(op, a))?
            }
            FusedStep::UnaryGrad(op, a, c) => {
                let (a, c) = (self.walk(in_child, a as usize)?, self.walk(in_child, c as usize)?);
                self.b.push(FusedStep::UnaryGrad(op, a, c))?
            }
            FusedStep::Binary(op, a, c) => {
                let (a, c) = (self.walk(in_child, a as usize)?, self.walk(in_child, c as usize)?);
                self.b.push(FusedStep::Binary(op, a, c))?
            }
        };
        self.memo.insert((in_child, i), r);
        Some(r)
    }
}

/// The canonical fused program of `parent` with its input `j` replaced by
/// `child` (each a program and its input classes), and its input classes;
/// `None` past the step or input limits, or with no input left.
fn inline(
    eg: &TEGraph,
    parent: (&[FusedStep], &[Id]),
    j: usize,
    child: (&[FusedStep], &[Id]),
) -> Option<(FusedExpr, Vec<Id>)> {
    let mut comp = Compose {
        eg,
        parent: parent.0,
        parent_ins: parent.1,
        j,
        child: child.0,
        child_ins: child.1,
        b: Builder::default(),
        memo: BTreeMap::new(),
    };
    comp.walk(false, parent.0.len() - 1)?;
    let Builder { steps, inputs, .. } = comp.b;
    if inputs.is_empty() {
        return None;
    }
    Some((FusedExpr::new(steps).ok()?, inputs))
}

/// How many consumers each class has in the DAG that extraction picks from
/// `roots`; roots count as read from outside (never inlined).
fn consumers(eg: &TEGraph, roots: &[Id]) -> BTreeMap<Id, usize> {
    let ex = Extractor::new(eg, KernelCost { egraph: eg });
    let mut uses: BTreeMap<Id, usize> = BTreeMap::new();
    let mut seen: BTreeSet<Id> = BTreeSet::new();
    let mut stack: Vec<Id> = Vec::new();
    for &r in roots {
        let r = eg.find(r);
        *uses.entry(r).or_default() += 2;
        stack.push(r);
    }
    while let Some(c) = stack.pop() {
        if !seen.insert(c) {
            continue;
        }
        let node = ex.find_best_node(c);
        let mut kids: Vec<Id> = node.tensor_inputs().iter().map(|&k| eg.find(k)).collect();
        kids.sort();
        kids.dedup();
        for k in kids {
            *uses.entry(k).or_default() += 1;
            stack.push(k);
        }
    }
    uses
}

/// Fuse chains of elementwise terms in `eg` (see the module docs); `roots`
/// are the classes read outside the e-graph; classes in `keep` get no fused
/// node (lowering fuses them with their consumer better).
pub fn fuse(eg: &mut TEGraph, roots: &[Id], keep: &BTreeSet<Id>) -> FuseReport {
    let uses = consumers(eg, roots);
    let inlinable: BTreeSet<Id> = uses.iter().filter(|(_, &n)| n == 1).map(|(&c, _)| c).collect();
    let mut report = FuseReport { rounds: 0, added: 0, stop: FuseStop::RoundLimit };
    for _ in 0..FUSE_ROUNDS {
        report.rounds += 1;
        let mut made: BTreeSet<(Id, FusedExpr, Vec<Id>)> = BTreeSet::new();
        let mut classes: Vec<Id> = uses.keys().copied().map(|c| eg.find(c)).collect();
        classes.sort();
        classes.dedup();
        'classes: for c in classes {
            if !f32_known(eg, c) || eg[c].data.konst.is_some() || keep.contains(&c) {
                continue;
            }
            for node in eg[c].nodes.clone() {
                let Some((parent, parent_ins)) = program(eg, &node) else { continue };
                for (j, &ic) in parent_ins.iter().enumerate() {
                    let ic = eg.find(ic);
                    if !inlinable.contains(&ic) || eg[ic].data.known() != eg[c].data.known() || ic == c {
                        continue;
                    }
                    for child_node in eg[ic].nodes.clone() {
                        let Some((child, child_ins)) = program(eg, &child_node) else { continue };
                        if child_ins.iter().any(|&x| eg.find(x) == ic || eg.find(x) == c) {
                            continue;
                        }
                        let Some((expr, inputs)) = inline(eg, (&parent, &parent_ins), j, (&child, &child_ins)) else {
                            continue;
                        };
                        made.insert((c, expr, inputs));
                        if made.len() > FUSE_MATCH_LIMIT {
                            report.stop = FuseStop::MatchLimit;
                            break 'classes;
                        }
                    }
                }
            }
        }
        let before = eg.total_number_of_nodes();
        for (c, expr, inputs) in made {
            let mut ch = vec![eg.add(TensorLang::Attr(Attr::Expr(expr)))];
            ch.extend(inputs);
            let id = eg.add(TensorLang::Fused(ch.into_boxed_slice()));
            eg.union(c, id);
        }
        eg.rebuild();
        let added = eg.total_number_of_nodes() - before;
        report.added += added;
        if report.stop == FuseStop::MatchLimit {
            return report;
        }
        if added == 0 {
            report.stop = FuseStop::Saturated;
            return report;
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use egg::{Extractor, RecExpr};
    use towers_graph::TensorType;

    use super::*;
    use crate::simplify::lang::TypeAnalysis;

    /// Leaves `x`, `y` f32[32,10], `b` f32[10].
    fn egraph() -> TEGraph {
        let mut a = TypeAnalysis::default();
        for (n, dims) in [("x", vec![32, 10]), ("y", vec![32, 10]), ("b", vec![10])] {
            a.leaves.insert(n.into(), TensorType::f32(dims));
        }
        TEGraph::new(a)
    }

    /// Add each term, fuse with them as the roots, and extract each root.
    fn fused(terms: &[&str]) -> (Vec<String>, FuseReport) {
        let mut eg = egraph();
        let roots: Vec<Id> = terms.iter().map(|t| eg.add_expr(&t.parse::<RecExpr<TensorLang>>().unwrap())).collect();
        eg.rebuild();
        let report = fuse(&mut eg, &roots, &BTreeSet::new());
        let ex = Extractor::new(&eg, KernelCost { egraph: &eg });
        (roots.iter().map(|&r| ex.find_best(r).1.to_string()).collect(), report)
    }

    fn one(term: &str) -> String {
        let (v, report) = fused(&[term]);
        assert_eq!(report.stop, FuseStop::Saturated);
        v[0].clone()
    }

    #[test]
    fn a_single_consumer_chain_becomes_one_fused_term() {
        assert_eq!(one("(relu (add x y))"), "(fused ew[$0;$1;add:0:1;relu:2] x y)");
        // Three levels, a repeated input read once.
        assert_eq!(one("(tanh (mul (neg x) (add x y)))"), "(fused ew[$0;neg:0;$1;add:0:2;mul:1:3;tanh:4] x y)");
        // Swish's gradient as autodiff writes it: `sigmoid x` has two
        // readers, so it is an input, computed once.
        assert_eq!(
            one("(add (mul y (sigmoid x)) (sigmoid_grad (mul y x) (sigmoid x)))"),
            "(fused ew[$0;$1;mul:0:1;$2;mul:0:3;sigmoid_grad:4:1;add:2:5] y (sigmoid x) x)"
        );
    }

    #[test]
    fn a_single_op_is_left_alone() {
        assert_eq!(one("(relu x)"), "(relu x)");
        assert_eq!(one("(add x b)"), "(add x b)");
    }

    #[test]
    fn scalar_constants_are_inlined() {
        assert_eq!(one("(relu (mul x f32[]=0.5))"), "(fused ew[$0;c3f000000;mul:0:1;relu:2] x)");
    }

    /// A tensor read twice, or read outside, is computed once and stays.
    #[test]
    fn shared_and_root_intermediates_are_not_inlined() {
        let (v, _) = fused(&["(relu (add x y))", "(neg (add x y))"]);
        assert_eq!(v, ["(relu (add x y))", "(neg (add x y))"]);
        let (v, _) = fused(&["(add x y)", "(relu (add x y))"]);
        assert_eq!(v, ["(add x y)", "(relu (add x y))"]);
    }

    /// A broadcast intermediate (f32[10] against f32[32,10]) stays an input:
    /// inlined, it would be computed 32 times.
    #[test]
    fn broadcast_intermediates_are_inputs() {
        assert_eq!(one("(relu (mul x (sigmoid b)))"), "(fused ew[$0;$1;mul:0:1;relu:2] x (sigmoid b))");
        assert_eq!(one("(relu (add (neg x) b))"), "(fused ew[$0;neg:0;$1;add:1:2;relu:3] x b)");
    }

    /// A chain longer than one kernel holds splits into kernels of at most `MAX_STEPS` steps.
    #[test]
    fn long_chains_split_at_the_step_limit() {
        let mut t = "x".to_string();
        for _ in 0..30 {
            t = format!("(relu {t})");
        }
        let (v, report) = fused(&[&t]);
        // 30 relus and the input: two kernels (23 + 7 relus).
        assert_eq!(v[0].matches("(fused ").count(), 2, "{}", v[0]);
        assert!(!v[0].contains("(relu "), "every relu is in a fused kernel: {}", v[0]);
        for part in v[0].split("(fused ").skip(1) {
            let expr = part.split_whitespace().next().unwrap();
            assert!(expr.parse::<FusedExpr>().unwrap().steps().len() <= MAX_STEPS);
        }
        assert_ne!(report.stop, FuseStop::MatchLimit);
    }
}
