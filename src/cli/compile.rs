//! `towers compile`: the model that `towers train` with the same flags
//! would train (a seed model or `--graph`), compiled and written as its
//! graph, dot, plan, plan JSON, placement report or CUDA files, or the
//! cost model's predictions (`--explain-cost`, calibrated on `--backend`:
//! the CPU backend, or CUDA as a mixed session).

use std::path::PathBuf;

use towers::compiler::{compile_train, CompileOptions};
use towers::data::DataSpec;
use towers::models::{build, ModelSpec};
use towers::passes::ProcessGroup;
use towers::trainer::{Model as UserModel, TRAIN_ACCURACY};

use super::args::{CompileArgs, Emit};
use super::config::{
    auto_variables, config, cuda_flags, explain_cost, fixed_batch, ps_tasks, unused_flags, user_model,
};

fn parse_input(s: &str) -> Result<[usize; 3], String> {
    let v: Vec<usize> = s
        .split('x')
        .map(|p| p.parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--input '{s}': {e}; give HxWxC, e.g. 28x28x1"))?;
    let dims = match v.as_slice() {
        [h, w, c] => [*h, *w, *c],
        [h, w] => [*h, *w, 1],
        _ => return Err(format!("--input '{s}' must be HxWxC, e.g. 28x28x1")),
    };
    if dims.contains(&0) || dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_none_or(|n| n > 1 << 28) {
        return Err(format!(
            "--input '{s}': every dimension must be at least 1, and the image at most 2^28 values, e.g. 28x28x1"
        ));
    }
    Ok(dims)
}

pub fn run_compile(mut a: CompileArgs) -> Result<(), String> {
    // `-o -` is standard output, as the Unix convention (and the default).
    if a.output.as_deref() == Some(std::path::Path::new("-")) {
        if matches!(a.emit, Emit::Cuda) {
            return Err(
                "--emit cuda writes one file per kernel into a folder: give it with -o DIR (-o - is standard output)"
                    .into(),
            );
        }
        a.output = None;
    }
    let mut cfg = config(&a.common)?;
    cuda_flags(&a.common, a.backend)?;
    let process = ProcessGroup::new(a.rank, a.world_size)
        .and_then(|p| p.with_ps_ranks(a.common.ps_ranks.unwrap_or(0) as usize))
        .map_err(|e| format!("--rank/--world-size: {e}"))?;
    // The same guards as `towers train`: what compiles is what would train.
    towers::guards::validate(&cfg, process.world).map_err(|e| e.to_string())?;
    unused_flags(&a.common)?;
    towers::guards::check_dump_after(&cfg, process).map_err(|e| e.to_string())?;
    if let Some(d) = &cfg.dump_dir {
        towers::outputs::check_dir("dump-dir", d)?;
    }
    match (&a.output, a.emit) {
        (Some(o), Emit::Cuda) => towers::outputs::check_dir("output", o)?,
        (Some(o), _) => towers::outputs::check_file("output", o)?,
        (None, _) => {}
    }
    if let (Some(g), Some(o)) = (&a.common.graph, &a.output) {
        towers::outputs::check_distinct(&[("graph", g, true), ("output", o, false)])?;
    }
    if a.collapse && !matches!(a.emit, Emit::Dot) {
        return Err("--collapse is a view of the dot output: use it with --emit dot".into());
    }
    let user = user_model(&a.common)?;
    fixed_batch(&a.common, user.as_ref(), cfg.batch, a.world_size)?;
    if let (Some(_), Some(_)) = (&user, &a.input) {
        return Err(
            "--input sets the seed models' geometry; a --graph model has its own (its images placeholder)".into()
        );
    }
    let (input, classes) = match &a.input {
        Some(s) => (parse_input(s)?, 10),
        None => match &cfg.data {
            DataSpec::Digits => ([8, 8, 1], 10),
            DataSpec::Mnist(_) | DataSpec::Mnist5k => ([28, 28, 1], 10),
        },
    };
    if let (Some(m), Some(_)) = (&user, &a.common.data) {
        // Given --data: the model must fit it, as `towers train` would check.
        let (train, _) = cfg.data.load().map_err(|e| e.to_string())?;
        m.check_data(&train).map_err(|e| {
            format!("--graph {}: {e}", a.common.graph.as_ref().map(|p| p.display().to_string()).unwrap_or_default())
        })?;
    }
    if a.explain_cost {
        let text = explain_cost(&a.common, user.as_ref(), &cfg, input, classes, a.backend)?;
        return match &a.output {
            Some(p) => towers::outputs::write_atomic(p, text.as_bytes())
                .map_err(|e| format!("--output: cannot write {}: {e}", p.display())),
            None => {
                out!("{text}");
                Ok(())
            }
        };
    }
    auto_variables(&a.common, user.as_ref(), &mut cfg, input, classes, a.world_size, a.backend)?;
    ps_tasks(&a.common, &mut cfg, a.world_size)?;
    let model = match user {
        Some(m) => m,
        None => {
            let mut spec = ModelSpec::new(cfg.model, input, classes);
            spec.hidden = cfg.hidden.clone();
            spec.activation = cfg.activation;
            spec.batch_norm = cfg.batch_norm;
            spec.seed = cfg.seed;
            UserModel::from_builtin(build(&spec).map_err(|e| e.to_string())?)
        }
    };
    let mut opts: CompileOptions = cfg.compile_options_for(process);
    // What `towers train` compiles: the training accuracy is fetched with the step.
    if let Some(acc) = &model.accuracy {
        opts.fetches.push((TRAIN_ACCURACY.into(), acc.clone()));
    }
    if let Some(d) = &cfg.dump_dir {
        towers::outputs::clear_stale_dumps(d)?;
    }
    let t0 = std::time::Instant::now();
    let c = compile_train(&model.graph, &model.loss, &opts).map_err(|e| e.to_string())?;
    // -v: the pass timings, as `towers train` logs them.
    c.log_timings(t0);
    let text = match a.emit {
        Emit::Graph => towers::graph::text::to_text(&c.graph).map_err(|e| e.to_string())?,
        Emit::Dot if a.collapse => towers::graph::dot::to_dot_collapsed(&c.graph).map_err(|e| e.to_string())?,
        Emit::Dot => towers::graph::dot::to_dot(&c.graph).map_err(|e| e.to_string())?,
        Emit::Plan => c.plan.to_text(),
        Emit::PlanJson => c.plan.to_json(),
        Emit::Placement => {
            let machine = towers::runtime::devices::Machine::probe();
            let devices = towers::report::device_section(&c.plan, a.backend, &machine).map_err(|e| e.to_string())?;
            towers::report::placement_report(&c.graph, &c.plan) + &devices
        }
        Emit::Fusions => c.fusions(&opts).map_err(|e| e.to_string())?.to_text(&c.graph),
        Emit::Cuda => return write_cuda(&c.plan, a.output),
    };
    match a.output {
        Some(p) => towers::outputs::write_atomic(&p, text.as_bytes())
            .map_err(|e| format!("--output: cannot write {}: {e}", p.display())),
        None => {
            out!("{text}");
            Ok(())
        }
    }
}

/// `--emit cuda -o DIR`: one `.cu` file per kernel the plan launches, and
/// `index.txt`; the `.cu` files a previous `index.txt` named that this plan
/// does not launch are removed (a convnet's kernels stayed beside an MLP's).
fn write_cuda(plan: &towers::codegen::Plan, output: Option<PathBuf>) -> Result<(), String> {
    let dir = output.ok_or("--emit cuda writes one file per kernel: give the folder with -o DIR")?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let files = towers::cuda_emit::cuda_files(plan)?;
    for old in towers::outputs::cuda_files_of_index(&dir) {
        if !files.iter().any(|(name, _)| *name == old) {
            let p = dir.join(&old);
            if p.is_file() {
                std::fs::remove_file(&p)
                    .map_err(|e| format!("--output {}: cannot remove the previous {old}: {e}", dir.display()))?;
            }
        }
    }
    for (name, text) in files {
        let p = dir.join(name);
        towers::outputs::write_atomic(&p, text.as_bytes()).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    Ok(())
}
