//! The asynchronous mode's two programs, in one process: the worker's
//! gradients fed into the apply program update the variables as the
//! synchronous training program does, for every optimizer (the apply
//! program runs the optimizer's own kernels).

use towers_runtime::Session;

use super::*;
use crate::compiler::compile_train;
use crate::config::OptimizerKind;
use crate::data::Batcher;

fn same_updates_as_the_training_program(kind: OptimizerKind) {
    let mut cfg = TrainConfig { optimizer: kind, ..TrainConfig::default() };
    cfg.hidden = vec![16];
    cfg.batch = 16;
    let (train, _) = cfg.data.load().unwrap();
    let model = Model::from_builtin(crate::models::build(&cfg.model_spec(&train)).unwrap());
    let compiled = compile_train(&model.graph, &model.loss, &cfg.compile_options()).unwrap();
    let mut one = Session::new(cfg.seed);
    one.load("train", compiled.plan).unwrap();
    let w = worker(&model, &cfg, cfg.batch).unwrap();
    assert!(!w.variables.is_empty());
    let mut split = Session::new(cfg.seed);
    split.load("train", w.plan).unwrap();
    split.load("apply", apply(&model, &cfg, &w.variables).unwrap()).unwrap();
    let names: Vec<String> = w.variables.iter().map(|v| format!("{GRAD_PREFIX}{v}")).collect();
    let mut batcher = Batcher::new(&train, cfg.batch, cfg.seed).unwrap();
    for step in 0..3 {
        for s in [&mut one, &mut split] {
            s.feed_with("train", &model.images, |x| batcher.fill_images(x)).unwrap().unwrap();
            s.feed_with("train", &model.labels, |x| batcher.fill_labels(x)).unwrap().unwrap();
            s.run("train").unwrap();
        }
        batcher.advance();
        let (a, b) = (one.fetch::<f32>("train", "loss").unwrap()[0], split.fetch::<f32>("train", "loss").unwrap()[0]);
        assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{kind:?} step {step}: loss {a} vs {b}");
        for name in &names {
            let g = split.fetch::<f32>("train", name).unwrap();
            split.feed("apply", name, &g).unwrap();
        }
        split.run("apply").unwrap();
    }
    for v in &w.variables {
        let (a, b) = (one.read_variable(v).unwrap(), split.read_variable(v).unwrap());
        let d = a.iter().zip(&b).map(|(x, y)| (x - y).abs() / x.abs().max(1.0)).fold(0f32, f32::max);
        assert!(d <= 1e-5, "{kind:?}: {v} differs by {d}");
    }
    let step = |s: &Session| s.read_variable_i32("global_step").unwrap()[0];
    assert_eq!(step(&one), step(&split), "{kind:?}: both count 3 updates");
}

#[test]
fn worker_gradients_through_the_apply_program_update_as_the_training_program_does() {
    for kind in [
        OptimizerKind::Sgd,
        OptimizerKind::Momentum,
        OptimizerKind::Adam,
        OptimizerKind::RmsProp,
        OptimizerKind::Adagrad,
    ] {
        same_updates_as_the_training_program(kind);
    }
}

#[test]
fn refusals_name_the_flag_and_the_fix() {
    let cfg = TrainConfig { ps_async: true, ..TrainConfig::default() };
    let (train, _) = cfg.data.load().unwrap();
    let model = Model::from_builtin(crate::models::build(&cfg.model_spec(&train)).unwrap());
    let e = check(&cfg, &model, 2).unwrap_err().to_string();
    assert!(e.contains("--ps-async") && e.contains("--variables ps"), "{e}");
    let ps = VarPlacement::Ps { tasks: 2, strategy: towers_passes::PsStrategy::RoundRobin };
    let cfg = TrainConfig { variables: ps, ..cfg };
    assert!(check(&cfg, &model, 2).is_ok());
    let e = check(&cfg, &model, 1).unwrap_err().to_string();
    assert!(e.contains("mpirun -np N"), "{e}");
    let e = check(&TrainConfig { ps_ranks: 1, ..cfg.clone() }, &model, 3).unwrap_err().to_string();
    assert!(e.contains("--ps-async") && e.contains("--ps-ranks 1"), "{e}");
    let resume = TrainConfig { resume: true, ..cfg.clone() };
    assert!(check(&resume, &model, 2).unwrap_err().to_string().contains("--resume"));
    let cuda = TrainConfig { backend: crate::train::BackendChoice::Cuda, ..cfg };
    assert!(check(&cuda, &model, 2).unwrap_err().to_string().contains("--backend cpu"));
}
