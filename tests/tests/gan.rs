//! A GAN the TF1 way: one graph (G under variable scope "G", D under "D"
//! applied to the real batch, to `stop_gradient(G(z))` and to `G(z)`), two
//! training programs in one session, run in turn:
//! `minimize(d_loss, var_list=tf.trainable_variables('D'))` and
//! `minimize(g_loss, var_list=tf.trainable_variables('G'))`.
//!
//! What holds: each program moves only its own variables (the other's keep
//! their bits, and it creates no slots for them), N towers equal one device
//! (`TOL`), and a wrong `var_list` is an error naming it.

use towers::prelude::*;
use towers_graph::VariableOptions;
use towers_tests::TOL;

const B: usize = 8;

fn z_data(step: usize) -> Vec<f32> {
    (0..B * 4).map(|i| (((i + 3 * step) * 37 % 17) as f32) * 0.1 - 0.8).collect()
}

fn real_data(step: usize) -> Vec<f32> {
    (0..B * 3).map(|i| (((i + 5 * step) * 13 % 11) as f32) * 0.2 - 1.0).collect()
}

/// The GAN: z[B,4] -> G (4-5-3) -> D (3-6-1, times a non-trainable
/// `D/temperature`); `d_loss` = xent(D(real), 1) + xent(D(sg(G(z))), 0),
/// `g_loss` = xent(D(G(z)), 1); `E/unused` is a variable no loss reads.
fn gan() -> Graph {
    let mut b = GraphBuilder::with_seed(11);
    let z = b.placeholder("z", DType::F32, Shape(vec![None, Some(4)])).unwrap();
    let real = b.placeholder("real", DType::F32, Shape(vec![None, Some(3)])).unwrap();
    let fake = b
        .variable_scope("G", Reuse::No, |b| {
            let h = layers::dense(b, "fc1", z, 5, Activation::Tanh)?;
            layers::dense(b, "out", h, 3, Activation::None)
        })
        .unwrap();
    let disc = |b: &mut GraphBuilder, x: Tensor| {
        b.variable_scope("D", Reuse::Auto, |b| {
            let h = layers::dense(b, "fc1", x, 6, Activation::Tanh)?;
            let logit = layers::dense(b, "logit", h, 1, Activation::None)?;
            let frozen = VariableOptions { trainable: false, ..Default::default() };
            let t = b.get_variable_with("temperature", [1], Initializer::Constant(F32(1.0)), frozen)?;
            b.mul(logit, t)
        })
        .unwrap()
    };
    let d_real = disc(&mut b, real);
    let sg = b.stop_gradient(fake).unwrap();
    let d_fake = disc(&mut b, sg);
    let d_fake_g = disc(&mut b, fake);
    let xent = |b: &mut GraphBuilder, logits: Tensor, one: bool| {
        let labels = if one { b.ones_like(logits) } else { b.zeros_like(logits) }.unwrap();
        let l = b.sigmoid_cross_entropy_with_logits(logits, labels).unwrap();
        b.reduce_mean(l, &[0, 1], false).unwrap()
    };
    let l1 = xent(&mut b, d_real, true);
    let l2 = xent(&mut b, d_fake, false);
    let dl = b.add(l1, l2).unwrap();
    b.identity(dl, "d_loss").unwrap();
    let gl = xent(&mut b, d_fake_g, true);
    b.identity(gl, "g_loss").unwrap();
    b.variable_scope("E", Reuse::No, |b| b.get_variable("unused", [2], Initializer::Zeros)).unwrap();
    b.finish()
}

fn momentum() -> Optimizer {
    Optimizer::Momentum { lr: F32(0.1), momentum: F32(0.9), nesterov: false }
}

fn opts(opt: Optimizer, towers: u32, var_list: Vec<String>) -> CompileOptions {
    let mut o = CompileOptions::new(opt, B);
    o.towers = towers_tests::towers(towers);
    o.var_list = var_list;
    o
}

/// Every f32 variable whose name starts with `prefix`, sorted by name.
fn snapshot(s: &Session, prefix: &str) -> Vec<(String, Vec<f32>)> {
    let mut names: Vec<String> = s.variable_names().into_iter().filter(|n| n.starts_with(prefix)).collect();
    names.sort();
    names.into_iter().filter_map(|n| s.variable::<f32>(&n).ok().map(|v| (n, v))).collect()
}

fn bits(v: &[(String, Vec<f32>)]) -> Vec<(String, Vec<u32>)> {
    v.iter().map(|(n, x)| (n.clone(), x.iter().map(|f| f.to_bits()).collect())).collect()
}

/// The largest |a-b| / max(1,|b|) over two snapshots of the same variables.
fn max_rel(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
    assert_eq!(a.iter().map(|p| &p.0).collect::<Vec<_>>(), b.iter().map(|p| &p.0).collect::<Vec<_>>());
    let mut m = 0f32;
    for ((_, va), (_, vb)) in a.iter().zip(b) {
        for (x, y) in va.iter().zip(vb) {
            m = m.max((x - y).abs() / y.abs().max(1.0));
        }
    }
    m
}

/// The D and G programs, D on `D/`'s variables and G on `G/`'s.
fn programs(g: &Graph, opt: Optimizer, towers: u32) -> (Compiled, Compiled) {
    let d = compile_train(g, "d_loss", &opts(opt.clone(), towers, g.trainable_variables_in_scope("D/"))).unwrap();
    let gp = compile_train(g, "g_loss", &opts(opt, towers, g.trainable_variables_in_scope("G/"))).unwrap();
    (d, gp)
}

/// Three alternating D and G steps; after each, the other program's
/// variables must hold the same bits as before it. Returns every f32
/// variable at the end and the six losses.
fn alternate(towers: u32, opt: Optimizer) -> (Vec<(String, Vec<f32>)>, Vec<f32>) {
    let g = gan();
    let (d, gp) = programs(&g, opt, towers);
    let mut s = Session::new(1);
    s.load("d", d.plan).unwrap();
    s.load("g", gp.plan).unwrap();
    let mut losses = Vec::new();
    for step in 0..3 {
        let (g0, d0) = (snapshot(&s, "G/"), snapshot(&s, "D/"));
        s.feed("d", "z", &z_data(step)).unwrap();
        s.feed("d", "real", &real_data(step)).unwrap();
        s.run("d").unwrap();
        losses.push(s.fetch::<f32>("d", "loss").unwrap()[0]);
        assert_eq!(bits(&snapshot(&s, "G/")), bits(&g0), "the D step changed G/ ({towers} towers, step {step})");
        let d1 = snapshot(&s, "D/");
        assert_ne!(bits(&d1), bits(&d0), "the D step left D/ unchanged");
        s.feed("g", "z", &z_data(step + 7)).unwrap();
        s.run("g").unwrap();
        losses.push(s.fetch::<f32>("g", "loss").unwrap()[0]);
        assert_eq!(bits(&snapshot(&s, "D/")), bits(&d1), "the G step changed D/ ({towers} towers, step {step})");
        assert_ne!(bits(&snapshot(&s, "G/")), bits(&g0), "the G step left G/ unchanged");
    }
    (snapshot(&s, ""), losses)
}

#[test]
fn trainable_variables_in_scope_is_a_name_prefix() {
    let g = gan();
    assert_eq!(
        g.trainable_variables_in_scope("G/"),
        ["G/fc1/weights", "G/fc1/biases", "G/out/weights", "G/out/biases"]
    );
    // D/temperature is not trainable: not listed.
    assert_eq!(
        g.trainable_variables_in_scope("D/"),
        ["D/fc1/weights", "D/fc1/biases", "D/logit/weights", "D/logit/biases"]
    );
    assert!(g.trainable_variables_in_scope("X").is_empty());
}

/// Each program moves only its var_list, at 0, 1 and 2 towers, and
/// creates optimizer slots for those variables alone.
#[test]
fn each_program_moves_only_its_var_list() {
    let g = gan();
    for towers in [0, 1, 2] {
        let (d, gp) = programs(&g, momentum(), towers);
        let slots = |c: &Compiled, scope: &str| {
            c.plan.variables.iter().filter(|v| v.name.starts_with(scope) && v.name.ends_with("/Momentum")).count()
        };
        assert_eq!((slots(&d, "D/"), slots(&d, "G/")), (4, 0), "D program's slots");
        assert_eq!((slots(&gp, "G/"), slots(&gp, "D/")), (4, 0), "G program's slots");
        // The cut path to G (stop_gradient) is no longer a diagnostic: G is not in D's list.
        assert!(d.state.diagnostics.iter().all(|w| !w.message.contains("G/")), "{:?}", d.state.diagnostics);
        alternate(towers, momentum());
    }
}

/// 2 towers = 1 tower = one device, for SGD, momentum and Adam (3 D and 3 G steps).
#[test]
fn gan_towers_equal_one_device() {
    let adam = Optimizer::Adam { lr: F32(0.01), beta1: F32(0.5), beta2: F32(0.999), epsilon: F32(1e-8) };
    for opt in [Optimizer::Sgd { lr: F32(0.1) }, momentum(), adam] {
        let (v0, l0) = alternate(0, opt.clone());
        for towers in [1, 2] {
            let (v, l) = alternate(towers, opt.clone());
            let dv = max_rel(&v, &v0);
            let dl = l.iter().zip(&l0).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0f32, f32::max);
            assert!(dv < TOL && dl < TOL, "{opt:?} at {towers} towers: variables {dv}, losses {dl}");
        }
    }
}

/// Without a var_list the G step trains D as well (the default stays TF's
/// "every trainable variable"): what var_list is for.
#[test]
fn without_a_var_list_the_g_step_moves_d() {
    let g = gan();
    let gp = compile_train(&g, "g_loss", &opts(momentum(), 0, Vec::new())).unwrap();
    let mut s = Session::new(1);
    s.load("g", gp.plan).unwrap();
    let d0 = snapshot(&s, "D/");
    s.feed("g", "z", &z_data(0)).unwrap();
    s.run("g").unwrap();
    assert_ne!(bits(&snapshot(&s, "D/")), bits(&d0));
}

/// A non-trainable variable named explicitly is trained (TF1's
/// compute_gradients takes any variable of var_list); left out, it is not.
#[test]
fn a_non_trainable_variable_named_explicitly_is_trained() {
    let g = gan();
    let run = |var_list: Vec<String>| {
        let d = compile_train(&g, "d_loss", &opts(Optimizer::Sgd { lr: F32(0.1) }, 2, var_list)).unwrap();
        let mut s = Session::new(1);
        s.load("d", d.plan).unwrap();
        s.feed("d", "z", &z_data(0)).unwrap();
        s.feed("d", "real", &real_data(0)).unwrap();
        s.run("d").unwrap();
        s.variable::<f32>("D/temperature").unwrap()[0]
    };
    assert_eq!(run(g.trainable_variables_in_scope("D/")), 1.0);
    let mut list = g.trainable_variables_in_scope("D/");
    list.push("D/temperature".into());
    assert_ne!(run(list), 1.0);
}

#[test]
fn a_wrong_var_list_is_an_error_naming_it() {
    let g = gan();
    let err = |loss: &str, list: &[&str]| {
        let list = list.iter().map(|s| s.to_string()).collect();
        compile_train(&g, loss, &opts(momentum(), 2, list)).err().expect("an error").to_string()
    };
    let e = err("d_loss", &["D/fc1/weight"]);
    assert!(e.contains("'D/fc1/weight'") && e.contains("did you mean 'D/fc1/weights'"), "{e}");
    let e = err("d_loss", &["d_loss"]);
    assert!(e.contains("'d_loss'") && e.contains("not a variable"), "{e}");
    let e = err("d_loss", &["D/fc1/weights", "D/fc1/weights"]);
    assert!(e.contains("twice"), "{e}");
    // G behind stop_gradient: reached, but no gradient flows (TF's words).
    let e = err("d_loss", &["G/fc1/weights", "G/out/biases"]);
    assert!(e.contains("No gradients provided for any variable") && e.contains("G/fc1/weights, G/out/biases"), "{e}");
    // A variable the loss never reads (pruned before autodiff): never a fallback to all.
    let e = err("d_loss", &["E/unused"]);
    assert!(e.contains("No gradients provided for any variable") && e.contains("E/unused"), "{e}");
    // One of several unreached: trained without it, and said so.
    let c = compile_train(&g, "d_loss", &opts(momentum(), 0, vec!["D/fc1/weights".into(), "E/unused".into()])).unwrap();
    assert!(
        c.state.diagnostics.iter().any(|w| w.message.contains("[E/unused]") && w.message.contains("not trained")),
        "{:?}",
        c.state.diagnostics
    );
    assert!(c.plan.variables.iter().any(|v| v.name == "D/fc1/weights/Momentum"));
    assert!(!c.plan.variables.iter().any(|v| v.name == "D/fc1/biases/Momentum"));
}
