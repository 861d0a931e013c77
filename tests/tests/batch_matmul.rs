//! Batched matrix products end to end (`tf.matmul` on rank >= 3, TF's
//! `BatchMatMulV2`): attention's `q·kᵀ` per example, computed by hand;
//! a self-attention classifier (`softmax(q·kᵀ/sqrt(d))·v` with dense
//! projections as products by a shared `[D,E]` weight, mean
//! cross-entropy) trained at 1, 2 and 3 uneven towers within the
//! equivalence tests' tolerance of one device, its loss falling; the
//! plan's `gemm_batched` launches and their CUDA form (one strided batched
//! cuBLAS GEMM each); the shape errors naming the node.
//!
//! Exactness: a batched product whose operands carry the examples on
//! axis 0 is per example (each example's product reads only its own
//! matrices and the shared weights), so the towers split it like any
//! row-wise op, and the weights' gradients (a sum over the batch of the
//! per-example products) are weighted by share like a dense layer's.

use towers::compiler::{compile_train, CompileOptions};
use towers::cuda_emit::cuda_files;
use towers_codegen::{Kernel, Step};
use towers_graph::{DType, GraphBuilder, Initializer, Optimizer, Tensor, F32};
use towers_passes::SplitPolicy;
use towers_runtime::Session;
use towers_tests::{batches, max_rel_diff, mean_xent_model, run, towers, TOL};

const BATCH: usize = 24;

/// The per-example Gram matrices `x·xᵀ` (`[N,2,3]·[N,2,3]ᵀ -> [N,2,2]`),
/// fetched from a training program: by hand, on one device and on two
/// uneven towers (the towers' rows concatenated in batch order).
#[test]
fn q_kt_per_example_matches_a_hand_computation_at_every_tower_count() {
    // x_0 = [1 2 0; 0 1 1], x_1 = [1 0 -1; 2 1 0], x_2 = [0 0 1; 1 1 1]:
    // x_0·x_0ᵀ = [5 2; 2 2], x_1·x_1ᵀ = [2 2; 2 5], x_2·x_2ᵀ = [1 1; 1 3].
    let xs = [1.0f32, 2.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, -1.0, 2.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
    let want = [5.0f32, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 5.0, 1.0, 1.0, 1.0, 3.0];
    for (n, split) in [(0, SplitPolicy::Even), (3, SplitPolicy::Even), (2, SplitPolicy::Weighted(vec![2, 1]))] {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, [None, Some(2), Some(3)]).unwrap();
        let gram = b.matmul_t(x, x, false, true).unwrap();
        assert_eq!(b.graph().node(gram.node).op.type_name(), "BatchMatMulV2");
        assert_eq!(b.graph().node(gram.node).name, "MatMul", "named as tf.matmul names it");
        let gram = b.identity(gram, "gram").unwrap();
        let w = b.get_variable("w", [3, 1], Initializer::Ones).unwrap();
        let y = b.matmul(x, w).unwrap();
        let loss = b.reduce_mean_all(y).unwrap();
        b.identity(loss, "loss").unwrap();
        let g = b.finish();
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 3);
        o.towers = towers(n);
        o.split = split;
        o.fetches = vec![("gram".into(), g.node(gram.node).name.clone())];
        let c = compile_train(&g, "loss", &o).expect("compiles");
        let mut s = Session::new(0);
        s.load("train", c.plan).unwrap();
        s.feed("train", "x", &xs).unwrap();
        s.run("train").unwrap();
        assert_eq!(s.fetch::<f32>("train", "gram").unwrap(), want, "{n} towers");
        // loss = mean over the 6 rows of their sums = 12/6; dL/dw_j = the
        // sum of column j over every row, / 6: (5, 5, 2) / 6.
        let loss = s.fetch::<f32>("train", "loss").unwrap()[0];
        assert!((loss - 2.0).abs() < 1e-6, "{loss}");
        let w = s.variable::<f32>("w").unwrap();
        let grad = [5.0f32 / 6.0, 5.0 / 6.0, 2.0 / 6.0];
        for j in 0..3 {
            assert!((w[j] - (1.0 - 0.1 * grad[j])).abs() < 1e-6, "w[{j}] = {} ({n} towers)", w[j]);
        }
    }
}

/// Single-head self-attention over the 8 rows of an 8x8 digit (T = 8
/// tokens of 8 features, D = 6): q, v = x·W + b, k = x·W (products by
/// shared `[8, D]` weights, `[N,T,8]·[8,D]`), p = softmax(q·kᵀ/sqrt(D)), ctx = p·v, mean
/// over the tokens, logits = dense(ctx), mean cross-entropy.
fn attention_model(seed: u64) -> towers::models::Model {
    const D: usize = 6;
    let mut b = GraphBuilder::with_seed(seed);
    let images = b.placeholder("images", DType::F32, [None, Some(8), Some(8), Some(1)]).unwrap();
    let labels = b.placeholder("labels", DType::I32, [None]).unwrap();
    let x = b.reshape(images, &[-1, 8, 8]).unwrap();
    let proj = |b: &mut GraphBuilder, name: &str, with_bias: bool| -> Tensor {
        let w = b.get_variable(&format!("{name}_weights"), [8, D], Initializer::GlorotUniform).unwrap();
        let h = b.matmul(x, w).unwrap();
        if !with_bias {
            return h;
        }
        let bias = b.get_variable(&format!("{name}_biases"), [D], Initializer::Zeros).unwrap();
        b.bias_add(h, bias).unwrap()
    };
    // No key bias: it adds q·b_k to every score of a row, which the softmax
    // cancels, so its gradient is 0 up to rounding, and Adam (m/sqrt(v))
    // would turn that rounding into full steps that differ per tower count.
    let (q, k, v) = (proj(&mut b, "q", true), proj(&mut b, "k", false), proj(&mut b, "v", true));
    let scores = b.matmul_t(q, k, false, true).unwrap();
    let scale = b.scalar(1.0 / (D as f32).sqrt()).unwrap();
    let scores = b.mul(scores, scale).unwrap();
    let p = b.softmax(scores).unwrap();
    let ctx = b.matmul(p, v).unwrap();
    let pooled = b.reduce_mean(ctx, &[1], false).unwrap();
    let w = b.get_variable("logits_weights", [D, 10], Initializer::GlorotUniform).unwrap();
    let bias = b.get_variable("logits_biases", [10], Initializer::Zeros).unwrap();
    let logits = b.matmul(pooled, w).unwrap();
    let logits = b.bias_add(logits, bias).unwrap();
    mean_xent_model(b, logits, labels, seed)
}

/// 1 device against 2 towers (3:1) and 3 towers (1:2:3) on batches of 24,
/// three steps of SGD and of Adam: every variable and every loss within
/// [`TOL`] (relative), as the equivalence tests hold the seed models.
#[test]
fn self_attention_at_two_and_three_uneven_towers_matches_one_device() {
    let model = attention_model(7);
    let data = batches(BATCH, 3, 5);
    for opt in [
        Optimizer::Sgd { lr: F32(0.5) },
        Optimizer::Adam { lr: F32(0.01), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) },
    ] {
        let single = run(&model, &CompileOptions::new(opt.clone(), BATCH), &data);
        for (n, shares) in [(2u32, vec![3, 1]), (3, vec![1, 2, 3])] {
            let mut o = CompileOptions::new(opt.clone(), BATCH);
            o.towers = towers(n);
            o.split = SplitPolicy::Weighted(shares.clone());
            let r = run(&model, &o, &data);
            let (d, var) = max_rel_diff(&r, &single);
            assert!(d <= TOL, "{opt:?} {n} towers {shares:?}: {var} differs by {d}");
            for (a, b) in r.losses.iter().zip(&single.losses) {
                assert!((a - b).abs() <= TOL * b.abs().max(1.0), "loss {a} vs {b} ({opt:?}, {n} towers)");
            }
        }
    }
}

/// Adam on one fixed batch of 24 for 40 steps: the loss falls below 0.7
/// of its start (about ln 10 ≈ 2.3 for untrained logits; one device went
/// 2.41 -> 1.54), at one device and at 3 uneven towers alike.
#[test]
fn self_attention_loss_falls() {
    let model = attention_model(3);
    let one = batches(BATCH, 1, 2);
    let data: Vec<_> = (0..40).map(|_| one[0].clone()).collect();
    let adam = Optimizer::Adam { lr: F32(0.02), beta1: F32(0.9), beta2: F32(0.999), epsilon: F32(1e-8) };
    for n in [0u32, 3] {
        let mut o = CompileOptions::new(adam.clone(), BATCH);
        o.towers = towers(n);
        o.split = if n == 3 { SplitPolicy::Weighted(vec![1, 2, 3]) } else { SplitPolicy::Even };
        let r = run(&model, &o, &data);
        let (first, last) = (r.losses[0], *r.losses.last().unwrap());
        assert!(last < 0.7 * first, "{n} towers: loss {first} -> {last}: {:?}", r.losses);
    }
}

/// The plan runs the products as `gemm_batched` launches (the forward's
/// shared-weight projections with `shared_b`, `q·kᵀ` with `trans_b`, and
/// the gradients' batched products), never as rank-2 `gemm`s of a
/// batched operand; their CUDA form is one strided batched cuBLAS GEMM
/// each, shown in the plan text and in `--emit cuda`'s index and headers.
#[test]
fn the_plan_launches_batched_gemms_and_lists_their_cuda_form() {
    let model = attention_model(1);
    let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, BATCH);
    o.towers = towers(2);
    let c = compile_train(&model.graph, &model.loss, &o).expect("compiles");
    // The loss is known as a mean over the rows through the batched
    // products (else grad_mean would warn that it is neither mean nor sum).
    assert!(c.state.diagnostics.is_empty(), "{:?}", c.state.diagnostics);
    let batched: Vec<&Kernel> = c
        .plan
        .streams
        .iter()
        .flat_map(|s| &s.steps)
        .filter_map(|st| match st {
            Step::Launch { kernel: k @ Kernel::BatchMatMul { .. }, .. } => Some(k),
            _ => None,
        })
        .collect();
    // Per tower: 3 projections, q·kᵀ and p·v forward; backward two products
    // for each of q·kᵀ and p·v and one weight gradient per projection (the
    // input x needs no gradient).
    assert_eq!(batched.len(), 2 * (5 + 4 + 3), "{batched:#?}");
    let has = |f: &dyn Fn(&Kernel) -> bool| batched.iter().any(|k| f(k));
    // Two even towers of 12 examples: q·kᵀ is 12 products [8,6]·[8,6]ᵀ,
    // a projection 12 products [8,8]·[8,6] of one shared weight.
    assert!(has(&|k| matches!(k, Kernel::BatchMatMul { batch: 12, m: 8, n: 8, k: 6, trans_b: true, .. })));
    assert!(has(&|k| matches!(k, Kernel::BatchMatMul { batch: 12, m: 8, n: 6, k: 8, shared_b: true, .. })));
    let text = c.plan.to_text();
    assert!(text.contains("gemm_batched batch=12 m=8 n=8 k=6 trans_b"), "{text}");
    assert!(text.contains("cuda sgemm m=8 n=8 k=6 tb batch=12 strides=48/48/64"), "{text}");
    assert!(text.contains("cuda sgemm m=8 n=6 k=8 batch=12 strides=64/0/48"), "{text}");
    let files = cuda_files(&c.plan).expect("every launch lowers for CUDA");
    let index = &files.last().expect("index.txt").1;
    assert!(index.contains("gemm_batched: cuBLAS sgemm only (no source)"), "{index}");
}

/// Mismatched inner dimensions and batches are shape errors naming the
/// node, in TF's words; a broadcast of both operands' batches, which one
/// strided GEMM cannot walk, says to tile.
#[test]
fn shape_errors_name_the_node() {
    let mut b = GraphBuilder::new();
    let q = b.placeholder("q", DType::F32, [None, Some(4), Some(8)]).unwrap();
    let k = b.placeholder("k", DType::F32, [None, Some(5), Some(6)]).unwrap();
    let e = b.matmul_t(q, k, false, true).unwrap_err().to_string();
    assert!(e.contains("BatchMatMulV2 'MatMul'"), "{e}");
    assert!(e.contains("In[0] mismatch In[1] shape: 8 vs. 6: [?,4,8] [?,5,6] false true"), "{e}");
    let a = b.placeholder("a", DType::F32, [Some(3), Some(4), Some(8)]).unwrap();
    let c = b.placeholder("c", DType::F32, [Some(5), Some(8), Some(2)]).unwrap();
    let e = b.matmul(a, c).unwrap_err().to_string();
    assert!(e.contains("'MatMul_1'") && e.contains("must have compatible batch dimensions: [3] vs. [5]"), "{e}");
    let h = b.placeholder("h", DType::F32, [Some(3), Some(1), Some(4), Some(8)]).unwrap();
    let t = b.placeholder("t", DType::F32, [Some(1), Some(2), Some(8), Some(2)]).unwrap();
    let e = b.matmul(h, t).unwrap_err().to_string();
    assert!(e.contains("'MatMul_2'") && e.contains("tile the operand"), "{e}");
    let v = b.placeholder("v", DType::F32, [Some(8)]).unwrap();
    let e = b.matmul(a, v).unwrap_err().to_string();
    assert!(e.contains("must have rank >= 2"), "{e}");
    // The rank-2 product keeps its own op and error.
    let m = b.placeholder("m", DType::F32, [Some(2), Some(3)]).unwrap();
    let e = b.matmul(m, m).unwrap_err().to_string();
    assert!(e.starts_with("MatMul 'MatMul_4'") && e.contains("Dimensions must be equal"), "{e}");
}

/// A placeholder declared with exactly the batch's rows is split only when
/// its axis 0 is the examples': `x: [8,8,8]` (a batch of 8 row tensors)
/// is, the shared right operand `p: [8,6]` of `x·p` (8 rows that happen
/// to equal the batch) is not, and 2 towers compute one device's loss.
#[test]
fn a_hard_coded_batch_splits_the_batched_operand_not_the_shared_one() {
    let build = || {
        let mut b = GraphBuilder::new();
        let x = b.placeholder("x", DType::F32, [Some(8), Some(8), Some(8)]).unwrap();
        let p = b.placeholder("p", DType::F32, [Some(8), Some(6)]).unwrap();
        let w = b.get_variable("w", [6, 1], Initializer::Ones).unwrap();
        let h = b.matmul(x, p).unwrap();
        let y = b.matmul(h, w).unwrap();
        let sq = b.square(y).unwrap();
        let loss = b.reduce_mean_all(sq).unwrap();
        b.identity(loss, "loss").unwrap();
        b.finish()
    };
    let xs: Vec<f32> = (0..512).map(|i| ((i * 37 % 17) as f32 - 8.0) / 16.0).collect();
    let ps: Vec<f32> = (0..48).map(|i| ((i * 11 % 7) as f32 - 3.0) / 8.0).collect();
    let mut out = Vec::new();
    for n in [0u32, 2] {
        let mut o = CompileOptions::new(Optimizer::Sgd { lr: F32(0.1) }, 8);
        o.towers = towers(n);
        let c = compile_train(&build(), "loss", &o).expect("compiles");
        assert_eq!(c.state.batch_inputs, ["x"], "{n} towers");
        let mut s = Session::new(0);
        s.load("train", c.plan).unwrap();
        s.feed("train", "x", &xs).unwrap();
        s.feed("train", "p", &ps).unwrap();
        s.run("train").unwrap();
        out.push((s.fetch::<f32>("train", "loss").unwrap()[0], s.variable::<f32>("w").unwrap()));
    }
    let ((l0, w0), (l2, w2)) = (&out[0], &out[1]);
    assert!((l0 - l2).abs() <= TOL * l0.abs().max(1.0), "loss {l2} vs one device {l0}");
    assert!(w0.iter().zip(w2).all(|(a, b)| (a - b).abs() <= TOL * a.abs().max(1.0)), "{w2:?} vs {w0:?}");
}
