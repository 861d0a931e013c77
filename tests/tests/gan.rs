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
        compile_train(&g, loss, &opts(momentum(), 2, list)).expect_err("an error").to_string()
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

fn adam(lr: f32) -> Optimizer {
    Optimizer::Adam { lr: F32(lr), beta1: F32(0.5), beta2: F32(0.999), epsilon: F32(1e-8) }
}

/// D at Adam 4e-4 as "d_adam", G at Adam 1e-4 as "g_adam" (TTUR), 2 towers.
fn ttur(g: &Graph) -> (Compiled, Compiled) {
    let named = |lr: f32, name: &str, scope: &str| {
        let mut o = opts(adam(lr), 2, g.trainable_variables_in_scope(scope));
        o.optimizer_name = Some(name.into());
        o
    };
    let d = compile_train(g, "d_loss", &named(4e-4, "d_adam", "D/")).unwrap();
    let gp = compile_train(g, "g_loss", &named(1e-4, "g_adam", "G/")).unwrap();
    (d, gp)
}

fn feed_d(s: &mut Session, step: usize) {
    s.feed("d", "z", &z_data(step)).unwrap();
    s.feed("d", "real", &real_data(step)).unwrap();
}

/// Two programs with their own optimizers in one session: each reads its
/// own rate and counts its own Adam steps. Checked two ways: the first
/// step of each moves every element by its own rate (Adam's first update
/// is lr * g / (|g| + eps), i.e. lr * sign(g)), and every alternating step
/// equals, bit for bit, the same program run in a session of its own (its
/// own slots and step; the other program's variables copied in first), as
/// two TF1 optimizers with their own beta powers.
#[test]
fn two_named_optimizers_train_at_their_own_rates_and_steps() {
    let g = gan();
    let (d, gp) = ttur(&g);
    assert!(d.plan.variables.iter().any(|v| v.name == "D/fc1/weights/d_adam_1"), "TF1's slot names");
    let mut s = Session::new(1);
    s.load("d", d.plan.clone()).unwrap();
    s.load("g", gp.plan.clone()).unwrap();
    assert_eq!(s.variable::<f32>("d_adam/learning_rate").unwrap(), [4e-4]);
    assert_eq!(s.variable::<f32>("g_adam/learning_rate").unwrap(), [1e-4]);
    let (mut d_ref, mut g_ref) = (Session::new(1), Session::new(1));
    d_ref.load("d", d.plan).unwrap();
    g_ref.load("g", gp.plan).unwrap();
    for step in 0..3 {
        // D: the reference takes G/ (read, not trained) from the shared session.
        for (n, v) in snapshot(&s, "G/").into_iter().filter(|(n, _)| !n.ends_with("g_adam") && !n.ends_with("g_adam_1"))
        {
            d_ref.set_variable(&n, &v).unwrap();
        }
        let before = snapshot(&s, "D/");
        feed_d(&mut s, step);
        feed_d(&mut d_ref, step);
        s.run("d").unwrap();
        d_ref.run("d").unwrap();
        assert_eq!(bits(&snapshot(&s, "D/")), bits(&snapshot(&d_ref, "D/")), "D step {step}");
        if step == 0 {
            first_adam_step_moves_by(&before, &snapshot(&s, "D/"), 4e-4);
        }
        for (n, v) in snapshot(&s, "D/").into_iter().filter(|(n, _)| !n.ends_with("d_adam") && !n.ends_with("d_adam_1"))
        {
            g_ref.set_variable(&n, &v).unwrap();
        }
        let before = snapshot(&s, "G/");
        s.feed("g", "z", &z_data(step + 7)).unwrap();
        g_ref.feed("g", "z", &z_data(step + 7)).unwrap();
        s.run("g").unwrap();
        g_ref.run("g").unwrap();
        assert_eq!(bits(&snapshot(&s, "G/")), bits(&snapshot(&g_ref, "G/")), "G step {step}");
        if step == 0 {
            first_adam_step_moves_by(&before, &snapshot(&s, "G/"), 1e-4);
        }
    }
    let step = |name: &str| s.variable::<i32>(name).unwrap()[0];
    assert_eq!((step("d_adam/step"), step("g_adam/step"), step("global_step")), (3, 3, 6));
}

/// Adam's first update of a model variable: |Δ| = lr |g| / (|g| + eps), lr up
/// to eps / |g| (elements with no gradient do not move).
fn first_adam_step_moves_by(before: &[(String, Vec<f32>)], after: &[(String, Vec<f32>)], lr: f32) {
    let mut moved = 0;
    for ((n, a), (_, b)) in before.iter().zip(after).filter(|(p, _)| !p.0.contains("_adam")) {
        for (x, y) in a.iter().zip(b) {
            let d = (y - x).abs();
            if d > 0.0 {
                // f32 rounding of x - lr at |x| ~ 1 is ~6e-8, 1.5e-3 of a 4e-5 step.
                assert!((d - lr).abs() <= 2e-3 * lr + 2.0 * f32::EPSILON * x.abs(), "{n}: moved {d}, lr {lr}");
                moved += 1;
            }
        }
    }
    assert!(moved > 10, "only {moved} elements moved");
}

/// Unnamed optimizers share `learning_rate`: a second rate is refused, and
/// the error names the way out; so is one name compiled with two rates.
#[test]
fn a_shared_rate_with_two_values_is_refused_naming_optimizer_name() {
    let g = gan();
    let d = compile_train(&g, "d_loss", &opts(adam(4e-4), 0, g.trainable_variables_in_scope("D/"))).unwrap();
    let gp = compile_train(&g, "g_loss", &opts(adam(1e-4), 0, g.trainable_variables_in_scope("G/"))).unwrap();
    let mut s = Session::new(1);
    s.load("d", d.plan).unwrap();
    let e = s.load("g", gp.plan).unwrap_err().to_string();
    assert!(e.contains("'learning_rate'") && e.contains("CompileOptions::optimizer_name"), "{e}");
    let (d, _) = ttur(&g);
    let mut o = opts(adam(1e-3), 2, g.trainable_variables_in_scope("D/"));
    o.optimizer_name = Some("d_adam".into());
    let d2 = compile_train(&g, "d_loss", &o).unwrap();
    let mut s = Session::new(1);
    s.load("d", d.plan).unwrap();
    let e = s.load("d2", d2.plan).unwrap_err().to_string();
    assert!(e.contains("'d_adam/learning_rate'") && e.contains("0.0004"), "{e}");
    o.optimizer_name = Some("bad/".into());
    let e = compile_train(&g, "d_loss", &o).expect_err("a bad name").to_string();
    assert!(e.contains("optimizer_name 'bad/'"), "{e}");
}

/// Pretrain D (momentum, lr 0.1) for 2 steps, save; a fine-tuning program
/// compiled at lr 0.01 restores it.
fn pretrained(dir: &std::path::Path) -> (std::path::PathBuf, Session, Compiled) {
    let g = gan();
    let d = compile_train(&g, "d_loss", &opts(momentum(), 2, g.trainable_variables_in_scope("D/"))).unwrap();
    let mut s = Session::new(1);
    s.load("d", d.plan).unwrap();
    for step in 0..2 {
        feed_d(&mut s, step);
        s.run("d").unwrap();
    }
    let path = dir.join("pre.safetensors");
    s.save(&path).unwrap();
    let slow = Optimizer::Momentum { lr: F32(0.01), momentum: F32(0.9), nesterov: false };
    let ft = compile_train(&g, "d_loss", &opts(slow, 2, g.trainable_variables_in_scope("D/"))).unwrap();
    (path, s, ft)
}

/// A partial restore (fine tuning) takes the model's variables and leaves
/// the training state: the learning rate stays the program's 0.01 (as
/// `restore`), global_step 0, the momentum slots zeros; all listed.
#[test]
fn restore_partial_takes_the_model_and_leaves_rate_step_and_slots() {
    let dir = tempfile::tempdir().unwrap();
    let (path, pre, ft) = pretrained(dir.path());
    let mut s = Session::new(2);
    s.load("ft", ft.plan).unwrap();
    let skipped = s.restore_partial(&path).unwrap();
    assert_eq!(s.variable::<f32>("learning_rate").unwrap(), [0.01]);
    assert_eq!(s.variable::<i32>("global_step").unwrap(), [0]);
    let model: Vec<_> = snapshot(&pre, "").into_iter().filter(|(n, _)| !n.ends_with("/Momentum")).collect();
    let mine: Vec<_> = snapshot(&s, "").into_iter().filter(|(n, _)| !n.ends_with("/Momentum")).collect();
    let rate = |v: &[(String, Vec<f32>)]| v.iter().filter(|(n, _)| n != "learning_rate").cloned().collect::<Vec<_>>();
    assert_eq!(bits(&rate(&mine)), bits(&rate(&model)));
    for (n, v) in snapshot(&s, "D/").into_iter().filter(|(n, _)| n.ends_with("/Momentum")) {
        assert!(v.iter().all(|x| *x == 0.0), "{n} came from the file");
    }
    let mut left = skipped.left_out.clone();
    left.sort();
    assert_eq!(
        left,
        [
            "D/fc1/biases/Momentum",
            "D/fc1/weights/Momentum",
            "D/logit/biases/Momentum",
            "D/logit/weights/Momentum",
            "global_step",
            "learning_rate"
        ]
    );
    assert!(skipped.missing.is_empty() && skipped.mismatched.is_empty() && skipped.unknown.is_empty(), "{skipped:?}");
}

/// `restore_partial_with` restores what the selection accepts: D/fc1/ (its
/// slots included, since selected) from the file, D/logit/ as initialized;
/// the learning rate never, even when selected.
#[test]
fn restore_partial_with_restores_the_selection_only() {
    let dir = tempfile::tempdir().unwrap();
    let (path, pre, ft) = pretrained(dir.path());
    let mut s = Session::new(2);
    s.load("ft", ft.plan).unwrap();
    let init = snapshot(&s, "D/logit/");
    let skipped = s.restore_partial_with(&path, |n| n.starts_with("D/fc1/") || n == "learning_rate").unwrap();
    assert_eq!(bits(&snapshot(&s, "D/fc1/")), bits(&snapshot(&pre, "D/fc1/")));
    assert!(snapshot(&s, "D/fc1/weights/Momentum")[0].1.iter().any(|x| *x != 0.0));
    assert_eq!(bits(&snapshot(&s, "D/logit/")), bits(&init));
    assert_eq!(s.variable::<f32>("learning_rate").unwrap(), [0.01]);
    assert!(
        skipped.left_out.iter().any(|n| n == "learning_rate")
            && skipped.left_out.iter().any(|n| n == "D/logit/weights")
    );
    // A selected global_step continues every program's step.
    let mut s = Session::new(2);
    let (_, _, ft) = pretrained(dir.path());
    s.load("ft", ft.plan).unwrap();
    s.restore_partial_with(&path, |n| n == "global_step").unwrap();
    assert_eq!(s.variable::<i32>("global_step").unwrap(), [2]);
}
