//! The e-graph language of `simplify` and its type/constant analysis.
//!
//! Only the pure, rewritable ops are terms of the language: every binary op
//! (`add`, `sub`, `mul`, `div`: [`Bin`]), every unary op and its gradient
//! (`neg`, `relu`, ..., `relu_grad`, ...: [`Un`], [`UnGrad`], named by the
//! kernels' [`UnaryOp::name`], so a new unary op is a term without a change
//! here), `identity`, `reshape`, `broadcast_like`, `reduce_sum`, splat f32 constants (`f32[32,1]=0.03125`: every element the
//! same value) and the attributes of reshape and reduce_sum (`dims[-1,1]`,
//! `axes[0]`, `axes[0]+keep`) as child leaves. Every other tensor is an
//! opaque `Leaf` named `node:slot`, never merged or rewritten.
//!
//! The data-movement ops that tower algebra cancels are terms too:
//! `(concat axis[1] a b ..)` (any number of inputs after the attribute),
//! `(slice begin[0,2]size[-1,12] x)`, and one output of a split,
//! `(split_part part1[10,8]#0 x)`: the multi-output `Split` is one term per
//! output, each naming the split's axis, sizes and its index, so that
//! parts of one split of one tensor are recognizable as pieces of it.
//! Writing back gathers the parts of one `(axis, sizes, x)` into one
//! `Split` node again (see `super::Writer`).
//!
//! `scalar` is a helper term used by rules only: `(scalar ?c)` is the rank-0
//! constant holding the value of the splat constant `?c`. The analysis turns
//! it into a real constant, and the cost function forbids extracting it.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use egg::{define_language, Analysis, DidMerge, EGraph, Id, Symbol};
use towers_graph::infer::infer;
use towers_graph::{BinaryOp, DType, FusedExpr, Op, Shape, TensorType, UnaryOp};

/// A splat constant: dtype, shape and one value (as f64 bits, rounded to f32 once, when materialized).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Konst {
    pub dtype: DType,
    pub dims: Vec<usize>,
    pub bits: u64,
}

impl Konst {
    pub fn new(dtype: DType, dims: Vec<usize>, value: f64) -> Konst {
        Konst { dtype, dims, bits: value.to_bits() }
    }
    pub fn value(&self) -> f64 {
        f64::from_bits(self.bits)
    }
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.dims.clone())
    }
}

fn join<T: fmt::Display>(v: &[T]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

fn parse_list<T: FromStr>(s: &str) -> Result<Vec<T>, String> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',').map(|x| x.parse::<T>().map_err(|_| format!("bad list item '{x}'"))).collect()
}

impl fmt::Display for Konst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]={:?}", self.dtype.name(), join(&self.dims), self.value())
    }
}

impl FromStr for Konst {
    type Err = String;
    fn from_str(s: &str) -> Result<Konst, String> {
        let (ty, v) = s.split_once("]=").ok_or("not a constant")?;
        let (dt, dims) = ty.split_once('[').ok_or("not a constant")?;
        let dtype = match dt {
            "f32" => DType::F32,
            _ => return Err(format!("unsupported constant dtype '{dt}'")),
        };
        let value: f64 = v.parse().map_err(|_| format!("bad constant value '{v}'"))?;
        Ok(Konst::new(dtype, parse_list(dims)?, value))
    }
}

/// The attribute of a reshape (`dims[..]`), a reduce_sum (`axes[..]`,
/// `axes[..]+keep`), a fused kernel (its expression, `ew[..]`), a concat
/// (`axis[1]`), a slice (`begin[0,2]size[-1,12]`) or one output of a split
/// (`part1[10,8]#0`: axis 1, sizes 10 and 8, output 0).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Attr {
    Dims(Vec<i64>),
    Axes { axes: Vec<usize>, keep: bool },
    Expr(FusedExpr),
    Axis(usize),
    Slice { begin: Vec<usize>, size: Vec<i64> },
    Part { axis: usize, sizes: Vec<usize>, index: usize },
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Dims(d) => write!(f, "dims[{}]", join(d)),
            Attr::Axes { axes, keep } => write!(f, "axes[{}]{}", join(axes), if *keep { "+keep" } else { "" }),
            Attr::Expr(e) => write!(f, "{e}"),
            Attr::Axis(a) => write!(f, "axis[{a}]"),
            Attr::Slice { begin, size } => write!(f, "begin[{}]size[{}]", join(begin), join(size)),
            Attr::Part { axis, sizes, index } => write!(f, "part{axis}[{}]#{index}", join(sizes)),
        }
    }
}

impl FromStr for Attr {
    type Err = String;
    fn from_str(s: &str) -> Result<Attr, String> {
        if s.starts_with("ew[") {
            return s.parse::<FusedExpr>().map(Attr::Expr).map_err(|e| e.to_string());
        }
        if let Some(r) = s.strip_prefix("dims[").and_then(|r| r.strip_suffix(']')) {
            return Ok(Attr::Dims(parse_list(r)?));
        }
        if let Some(r) = s.strip_prefix("axes[") {
            let (r, keep) = match r.strip_suffix("]+keep") {
                Some(r) => (r, true),
                None => (r.strip_suffix(']').ok_or("not an attribute")?, false),
            };
            return Ok(Attr::Axes { axes: parse_list(r)?, keep });
        }
        if let Some(r) = s.strip_prefix("axis[").and_then(|r| r.strip_suffix(']')) {
            return Ok(Attr::Axis(r.parse().map_err(|_| format!("bad axis '{r}'"))?));
        }
        if let Some(r) = s.strip_prefix("begin[") {
            let (begin, size) = r.split_once("]size[").ok_or("not an attribute")?;
            let size = size.strip_suffix(']').ok_or("not an attribute")?;
            return Ok(Attr::Slice { begin: parse_list(begin)?, size: parse_list(size)? });
        }
        if let Some(r) = s.strip_prefix("part") {
            let (axis, r) = r.split_once('[').ok_or("not an attribute")?;
            let (sizes, index) = r.split_once("]#").ok_or("not an attribute")?;
            return Ok(Attr::Part {
                axis: axis.parse().map_err(|_| format!("bad axis '{axis}'"))?,
                sizes: parse_list(sizes)?,
                index: index.parse().map_err(|_| format!("bad index '{index}'"))?,
            });
        }
        Err("not an attribute".into())
    }
}

/// A binary op as an e-graph operator (`add`, `sub`, `mul`, `div`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bin(pub BinaryOp);

/// A unary op as an e-graph operator (`neg`, `relu`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Un(pub UnaryOp);

/// A unary op's gradient from its output as an e-graph operator (`relu_grad`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnGrad(pub UnaryOp);

impl fmt::Display for Bin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name())
    }
}

impl FromStr for Bin {
    type Err = String;
    fn from_str(s: &str) -> Result<Bin, String> {
        BinaryOp::ALL.iter().find(|o| o.name() == s).map(|o| Bin(*o)).ok_or_else(|| "not a binary op".into())
    }
}

impl fmt::Display for Un {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name())
    }
}

impl FromStr for Un {
    type Err = String;
    fn from_str(s: &str) -> Result<Un, String> {
        UnaryOp::ALL.iter().find(|o| o.name() == s).map(|o| Un(*o)).ok_or_else(|| "not a unary op".into())
    }
}

impl fmt::Display for UnGrad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_grad", self.0.name())
    }
}

impl FromStr for UnGrad {
    type Err = String;
    fn from_str(s: &str) -> Result<UnGrad, String> {
        let op: Un = s.strip_suffix("_grad").ok_or("not a unary gradient")?.parse()?;
        Ok(UnGrad(op.0))
    }
}

define_language! {
    /// The pure, rewritable part of a graph (see the module docs).
    pub enum TensorLang {
        "identity" = Identity([Id; 1]),
        "broadcast_like" = BroadcastLike([Id; 2]),
        // (reshape dims[..] x)
        "reshape" = Reshape([Id; 2]),
        // (reduce_sum axes[..] x)
        "reduce_sum" = ReduceSum([Id; 2]),
        // rules only: the rank-0 constant of a splat constant
        "scalar" = Scalar([Id; 1]),
        // (fused ew[..] inputs...): a fused elementwise kernel (see `fuse`)
        "fused" = Fused(Box<[Id]>),
        // (concat axis[..] inputs...)
        "concat" = Concat(Box<[Id]>),
        // (slice begin[..]size[..] x)
        "slice" = Slice([Id; 2]),
        // (split_part part<axis>[sizes]#<index> x): output <index> of a split of x
        "split_part" = SplitPart([Id; 2]),
        // (add ?a ?b), (relu ?x), (relu_grad ?dy ?y): before the leaves,
        // which parse from any string (leaf names contain a ':').
        Binary(Bin, [Id; 2]),
        Unary(Un, [Id; 1]),
        UnaryGrad(UnGrad, [Id; 2]),
        Num(Konst),
        Attr(Attr),
        Leaf(Symbol),
    }
}

impl TensorLang {
    /// The graph op of a compute node (None for leaves, constants, attributes, `scalar`).
    pub fn op(&self, attr: impl Fn(Id) -> Option<Attr>) -> Option<Op> {
        Some(match self {
            TensorLang::Binary(b, _) => Op::Binary(b.0),
            TensorLang::Unary(u, _) => Op::Unary(u.0),
            TensorLang::UnaryGrad(u, _) => Op::UnaryGrad(u.0),
            TensorLang::Identity(_) => Op::Identity,
            TensorLang::BroadcastLike(_) => Op::BroadcastLike,
            TensorLang::Reshape([a, _]) => match attr(*a)? {
                Attr::Dims(shape) => Op::Reshape { shape },
                _ => return None,
            },
            TensorLang::ReduceSum([a, _]) => match attr(*a)? {
                Attr::Axes { axes, keep } => Op::ReduceSum { axes, keep_dims: keep },
                _ => return None,
            },
            TensorLang::Fused(ch) => match attr(*ch.first()?)? {
                Attr::Expr(expr) => Op::Fused { expr },
                _ => return None,
            },
            TensorLang::Concat(ch) => match attr(*ch.first()?)? {
                Attr::Axis(axis) => Op::Concat { axis },
                _ => return None,
            },
            TensorLang::Slice([a, _]) => match attr(*a)? {
                Attr::Slice { begin, size } => Op::Slice { begin, size },
                _ => return None,
            },
            // The split of all parts; the part is the output `index` of it.
            TensorLang::SplitPart([a, _]) => match attr(*a)? {
                Attr::Part { axis, sizes, .. } => Op::Split { axis, sizes },
                _ => return None,
            },
            _ => return None,
        })
    }

    /// The output slot of the graph op that is this term (the index of a split part, else 0).
    pub fn slot(&self, attr: impl Fn(Id) -> Option<Attr>) -> usize {
        match self {
            TensorLang::SplitPart([a, _]) => match attr(*a) {
                Some(Attr::Part { index, .. }) => index,
                _ => 0,
            },
            _ => 0,
        }
    }

    /// The tensor inputs of a compute node, in graph input order (attributes left out).
    pub fn tensor_inputs(&self) -> Vec<Id> {
        match self {
            TensorLang::Reshape([_, x])
            | TensorLang::ReduceSum([_, x])
            | TensorLang::Slice([_, x])
            | TensorLang::SplitPart([_, x]) => vec![*x],
            TensorLang::Fused(ch) | TensorLang::Concat(ch) => ch.iter().skip(1).copied().collect(),
            TensorLang::Num(_) | TensorLang::Attr(_) | TensorLang::Leaf(_) => vec![],
            n => egg::Language::children(n).to_vec(),
        }
    }
}

/// What the analysis knows about an e-class: its tensor type, and the value
/// of every element when it is a splat f32 constant; or the attribute it is.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Data {
    pub ty: Option<TensorType>,
    pub konst: Option<f64>,
    pub attr: Option<Attr>,
}

impl Data {
    /// The type, when fully known.
    pub fn known(&self) -> Option<&TensorType> {
        self.ty.as_ref().filter(|t| t.shape.is_fully_known())
    }
}

/// Types of leaves (by `node:slot`), and the type/constant analysis.
#[derive(Debug, Clone, Default)]
pub struct TypeAnalysis {
    pub leaves: BTreeMap<Symbol, TensorType>,
}

pub type TEGraph = EGraph<TensorLang, TypeAnalysis>;

/// Folds two constants: the four arithmetic ops in f64, every other op of
/// the table as its kernel computes it (in f32).
fn fold(op: BinaryOp, a: f64, b: f64) -> Option<f64> {
    let v = match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        other => other.apply(a as f32, b as f32) as f64,
    };
    v.is_finite().then_some(v)
}

/// The data of one e-node, from its children's data (used by `make` and the cost function).
pub fn node_data(egraph: &TEGraph, enode: &TensorLang) -> Data {
    let d = |i: &Id| &egraph[*i].data;
    match enode {
        TensorLang::Leaf(s) => Data { ty: egraph.analysis.leaves.get(s).cloned(), ..Data::default() },
        TensorLang::Attr(a) => Data { attr: Some(a.clone()), ..Data::default() },
        TensorLang::Num(k) => Data { ty: Some(k.ty()), konst: Some(k.value()), attr: None },
        TensorLang::Scalar([c]) => Data {
            ty: d(c).ty.as_ref().map(|t| TensorType::new(t.dtype, Shape::scalar())),
            konst: d(c).konst,
            attr: None,
        },
        n => {
            let ins: Option<Vec<TensorType>> = n.tensor_inputs().iter().map(|i| d(i).ty.clone()).collect();
            let op = n.op(|i| egraph[i].data.attr.clone());
            // A split part is one output of its split; every other term has one.
            let slot = n.slot(|i| egraph[i].data.attr.clone());
            let is_split = matches!(op, Some(Op::Split { .. }));
            let ty = match (op, ins) {
                (Some(op), Some(ins)) => infer(&op, &ins).ok().and_then(|mut v| match is_split {
                    true => (slot < v.len()).then(|| v.swap_remove(slot)),
                    false => (v.len() == 1).then(|| v.remove(0)),
                }),
                _ => None,
            };
            let f32_known = ty.as_ref().is_some_and(|t| t.dtype == DType::F32 && t.shape.is_fully_known());
            let konst = if !f32_known {
                None
            } else {
                match n {
                    TensorLang::Binary(op, [a, b]) => d(a).konst.zip(d(b).konst).and_then(|(x, y)| fold(op.0, x, y)),
                    // Only negation folds: exact in f64, as every other op would not be.
                    TensorLang::Unary(Un(UnaryOp::Neg), [x]) => d(x).konst.map(|v| -v),
                    // Moving the elements of a splat keeps it a splat.
                    TensorLang::Identity([x])
                    | TensorLang::Reshape([_, x])
                    | TensorLang::BroadcastLike([x, _])
                    | TensorLang::Slice([_, x])
                    | TensorLang::SplitPart([_, x]) => d(x).konst,
                    TensorLang::Concat(ch) => {
                        let mut vals = ch.iter().skip(1).map(|i| d(i).konst.map(f64::to_bits));
                        let first = vals.next().flatten();
                        first.filter(|b| vals.all(|v| v == Some(*b))).map(f64::from_bits)
                    }
                    TensorLang::ReduceSum([a, x]) => {
                        let (Some(Attr::Axes { axes, .. }), Some(xt)) = (&d(a).attr, d(x).known()) else {
                            return Data { ty, ..Data::default() };
                        };
                        let dims = xt.shape.dims().unwrap_or_default();
                        let count: usize = axes.iter().map(|&i| dims.get(i).copied().unwrap_or(1)).product();
                        d(x).konst.map(|v| v * count as f64)
                    }
                    _ => None,
                }
            };
            Data { ty, konst, attr: None }
        }
    }
}

impl Analysis<TensorLang> for TypeAnalysis {
    type Data = Data;

    fn make(egraph: &mut TEGraph, enode: &TensorLang, _id: Id) -> Data {
        node_data(egraph, enode)
    }

    /// Both sides of a merge are the same tensor: an unsound rule fails here, loudly.
    fn merge(&mut self, to: &mut Data, from: Data) -> DidMerge {
        debug_assert_eq!(to.ty, from.ty, "simplify: merged e-classes of different types");
        debug_assert_eq!(to.attr, from.attr, "simplify: merged different attributes");
        if let (Some(a), Some(b)) = (to.konst, from.konst) {
            debug_assert!(
                a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs()),
                "simplify: merged different constants {a} and {b}"
            );
        }
        let before = to.clone();
        if to.ty.is_none() {
            to.ty = from.ty.clone();
        }
        if to.konst.is_none() {
            to.konst = from.konst;
        }
        if to.attr.is_none() {
            to.attr = from.attr.clone();
        }
        DidMerge(*to != before, *to != from)
    }

    /// A class known to be a splat f32 constant gets the constant itself as a member.
    fn modify(egraph: &mut TEGraph, id: Id) {
        let data = &egraph[id].data;
        if let (Some(v), Some(t)) = (data.konst, data.known()) {
            if t.dtype == DType::F32 {
                let k = Konst::new(t.dtype, t.shape.dims().unwrap_or_default(), v);
                let added = egraph.add(TensorLang::Num(k));
                egraph.union(id, added);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use egg::RecExpr;

    use super::*;

    fn last(s: &str) -> TensorLang {
        let e: RecExpr<TensorLang> = s.parse().expect("parses");
        e.as_ref().last().expect("a node").clone()
    }

    /// Every kernel op is a term under the kernels' name, with no list here
    /// to keep in step: `(relu x)`, `(relu_grad dy y)`, `(div a b)`; leaves
    /// (`node:slot`) never parse as ops.
    #[test]
    fn kernel_ops_are_terms_by_their_kernel_names() {
        for &op in UnaryOp::ALL {
            assert!(matches!(last(&format!("({} x:0)", op.name())), TensorLang::Unary(Un(o), _) if o == op));
            let g = last(&format!("({}_grad dy:0 y:0)", op.name()));
            assert!(matches!(g, TensorLang::UnaryGrad(UnGrad(o), _) if o == op));
            assert_eq!(g.op(|_| None), Some(Op::UnaryGrad(op)));
        }
        for &op in BinaryOp::ALL {
            assert_eq!(last(&format!("({} a:0 b:0)", op.name())).op(|_| None), Some(Op::Binary(op)));
        }
        assert!(matches!(last("relu:0"), TensorLang::Leaf(_)));
    }

    /// The data-movement attributes print and parse back, and their terms
    /// are the graph's ops: a split part is output `index` of the split.
    #[test]
    fn concat_slice_and_split_part_terms_round_trip() {
        for a in [
            Attr::Axis(1),
            Attr::Slice { begin: vec![0, 2], size: vec![-1, 12] },
            Attr::Part { axis: 1, sizes: vec![10, 8], index: 1 },
        ] {
            assert_eq!(a.to_string().parse::<Attr>(), Ok(a.clone()), "{a}");
        }
        fn attr(s: &'static str) -> impl Fn(Id) -> Option<Attr> {
            move |_| s.parse::<Attr>().ok()
        }
        assert_eq!(last("(concat axis[1] a:0 b:0 c:0)").op(attr("axis[1]")), Some(Op::Concat { axis: 1 }));
        assert_eq!(last("(concat axis[1] a:0 b:0 c:0)").tensor_inputs().len(), 3);
        let part = last("(split_part part1[10,8]#1 x:0)");
        assert_eq!(part.op(attr("part1[10,8]#1")), Some(Op::Split { axis: 1, sizes: vec![10, 8] }));
        assert_eq!(part.slot(attr("part1[10,8]#1")), 1);
        let slice = last("(slice begin[0,2]size[-1,12] x:0)");
        assert_eq!(slice.op(attr("begin[0,2]size[-1,12]")), Some(Op::Slice { begin: vec![0, 2], size: vec![-1, 12] }));
    }
}
