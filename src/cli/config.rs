//! The flags' meaning: [`config`] turns [`Common`] into a [`TrainConfig`],
//! [`model`] loads `--graph` or names the seed model, and `--variables auto`
//! and `--explain-cost` ask the cost model about the model that would train.

use towers::cost::Target;
use towers::data::DataSpec;
use towers::graph::layers::Activation;
use towers::models::{build, ModelKind};
use towers::passes::{BnUpdates, PsStrategy, VarPlacement};
use towers::train::{BackendChoice, OptimizerKind, TrainConfig};
use towers::trainer::Model as UserModel;

use super::args::{Act, Bn, Common, Model, Opt, PsStrat, Vars};

/// `--data`, or the embedded digits.
pub fn data_spec(c: &Common) -> Result<DataSpec, String> {
    DataSpec::parse(c.data.as_deref().unwrap_or("digits")).map_err(|e| e.to_string())
}

/// The `--graph` model file, loaded and checked (None: a seed model).
pub fn user_model(c: &Common) -> Result<Option<UserModel>, String> {
    match &c.graph {
        Some(p) => UserModel::load_json(p).map(Some).map_err(|e| format!("--graph {e}")),
        None => Ok(None),
    }
}

/// A `--graph` model whose images placeholder declares a fixed batch
/// (TF1's `tf.placeholder(tf.float32, [32, 8, 8, 1])`) trains at that batch
/// only: another `--batch` is refused here, naming both flags (evaluation
/// runs at that batch too). Under several processes each feeds part of the
/// batch, which `bind_batch` refuses in its own words.
pub fn fixed_batch(c: &Common, user: Option<&UserModel>, batch: usize, processes: usize) -> Result<(), String> {
    let Some(m) = user else { return Ok(()) };
    match m.fixed_batch() {
        Some(rows) if rows != batch && processes <= 1 => {
            let file = c.graph.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
            let shape = m
                .graph
                .get(&m.images)
                .and_then(|id| m.graph.node(id).outputs.first().map(|t| t.shape.0.clone()))
                .unwrap_or_default();
            let dims: Vec<String> = shape.iter().skip(1).map(|d| d.map_or("None".into(), |d| d.to_string())).collect();
            Err(format!(
                "--batch {batch}: the --graph {file} placeholder '{}' has a fixed batch of {rows} rows: give --batch {rows}, or declare its dimension 0 as None (tf.placeholder(tf.float32, [None, {}])) so that it takes any batch",
                m.images,
                dims.join(", ")
            ))
        }
        _ => Ok(()),
    }
}

/// The model the cost model times: the `--graph` model, or the seed model
/// `cfg` describes at this input geometry.
fn cost_model(
    user: Option<&UserModel>,
    cfg: &TrainConfig,
    input: [usize; 3],
    classes: usize,
) -> Result<(towers::graph::Graph, String), String> {
    match user {
        Some(m) => Ok((m.graph.clone(), m.loss.clone())),
        None => {
            let m = build(&towers::cost::placements::model_spec(cfg, input, classes)).map_err(|e| e.to_string())?;
            Ok((m.graph, m.loss))
        }
    }
}

/// `--cuda-contexts` left out: a context per logical GPU in one process
/// when each logical GPU has a physical GPU of its own (`physical_gpus`,
/// the machine's count); else one context, as streams. Contexts sharing a
/// GPU time-slice: on an H200, two towers in two contexts of it stepped
/// 2.0x slower than as two streams of one (0.88 against 0.44 ms, the seed
/// MLP at batch 256), four 2.8x. Under several processes one context too,
/// where the CUDA backend's NCCL all-reduce runs in its own context (a
/// gradient bucket in a logical GPU's context of its own is refused there,
/// naming the flag).
pub fn cuda_contexts(c: &Common, cfg: &mut TrainConfig, processes: usize, physical_gpus: usize) {
    if c.cuda_contexts.is_none() && (processes > 1 || cfg.towers.max(1) > physical_gpus) {
        cfg.cuda_one_context = true;
    }
}

/// `--no-cuda-graphs` and `--cuda-contexts` tune the CUDA backend: given
/// with `--backend cpu` they would do nothing, so they are refused
/// (`--backend auto` may pick CUDA: accepted).
pub fn cuda_flags(c: &Common, backend: BackendChoice) -> Result<(), String> {
    if backend != BackendChoice::Cpu {
        return Ok(());
    }
    if c.no_cuda_graphs {
        return Err(
            "--no-cuda-graphs applies to --backend cuda only (the CPU backend replays no CUDA graph): add --backend cuda, or leave it out".into(),
        );
    }
    if let Some(k) = c.cuda_contexts {
        let name = match k {
            super::args::CudaContexts::One => "one",
            super::args::CudaContexts::PerGpu => "per-gpu",
        };
        return Err(format!(
            "--cuda-contexts {name} applies to --backend cuda only (the CPU backend has no CUDA context): add --backend cuda, or leave it out"
        ));
    }
    Ok(())
}

/// `--variables ps`: `--ps-tasks` defaults to the number of processes
/// (to K with `--ps-ranks K`); the ps flags without `--variables ps` are
/// refused, and `--ps-ranks` must leave a worker.
pub fn ps_tasks(c: &Common, cfg: &mut TrainConfig, processes: usize) -> Result<(), String> {
    if let Some(k) = c.ps_ranks {
        if !matches!(cfg.variables, VarPlacement::Ps { .. }) {
            return Err(format!(
                "--ps-ranks {k} needs --variables ps (parameter-server ranks hold the sharded variables)"
            ));
        }
        if k == 0 || k as usize >= processes {
            return Err(format!(
                "--ps-ranks {k} with {processes} process(es): give 1 or more, and fewer than the number of processes, so at least one worker runs the towers (mpirun -np {} or more)",
                k.max(1) + 1
            ));
        }
        cfg.ps_ranks = k as usize;
    }
    match (&mut cfg.variables, c.ps_tasks) {
        (VarPlacement::Ps { tasks, .. }, None) => *tasks = c.ps_ranks.map_or(processes.max(1) as u32, |k| k),
        (VarPlacement::Ps { .. }, Some(0)) => {
            return Err(
                "--ps-tasks 0 shards the variables over no parameter-server task: give --ps-tasks 1 or more".into()
            )
        }
        (VarPlacement::Ps { .. }, Some(_)) => {}
        (_, Some(k)) => {
            return Err(format!(
                "--ps-tasks {k} needs --variables ps (the variables sharded over parameter-server tasks)"
            ))
        }
        (_, None) if matches!(c.ps_strategy, PsStrat::Greedy) => {
            return Err("--ps-strategy greedy needs --variables ps".into())
        }
        _ => {}
    }
    Ok(())
}

/// `--variables auto`: the placement with the fastest predicted step for
/// this model and tower count on this machine; says why on stderr. With
/// several processes each would time its own machine and might choose
/// differently, so it is refused there.
pub fn auto_variables(
    c: &Common,
    user: Option<&UserModel>,
    cfg: &mut TrainConfig,
    input: [usize; 3],
    classes: usize,
    processes: usize,
    backend: BackendChoice,
) -> Result<(), String> {
    if !matches!(c.variables, Vars::Auto) {
        return Ok(());
    }
    if processes > 1 {
        return Err(format!(
            "--variables auto: each of the {processes} processes would time its own machine and could choose another placement; give one (cpu, gpu0, round-robin, greedy), e.g. the one `towers compile --variables auto` picks"
        ));
    }
    if cfg.towers == 0 {
        return Err(
            "--variables auto compares placements among the towers' devices and needs --towers N (e.g. --towers 2 --variables auto); without --towers every placement is cpu:0 (towers compile --explain-cost compares them at 1, 2 and 4 towers)"
                .into(),
        );
    }
    let target = cost_target(backend, cfg.towers.max(1))?;
    let (graph, loss) = cost_model(user, cfg, input, classes)?;
    let choice = towers::cost::auto_on(target, &graph, &loss, &cfg.compile_options(), cfg.towers, &c.cost_cache)
        .map_err(|e| format!("--variables auto: {e}"))?;
    errln!("--variables auto: {}", choice.reason);
    cfg.variables = choice.placement;
    Ok(())
}

/// Which backend the cost model calibrates on for `--backend`: `auto` takes
/// CUDA where the machine has a GPU. On CUDA, the devices of `towers`
/// towers must be servable: without CUDA the same refusal `towers train
/// --backend cuda` gives, naming the device.
fn cost_target(backend: BackendChoice, towers: usize) -> Result<Target, String> {
    let machine = towers::runtime::devices::Machine::probe();
    match backend.kind(&machine) {
        towers::runtime::devices::BackendKind::Cpu => Ok(Target::Cpu),
        _ => {
            let mut devices = vec![towers::graph::Device::CPU0];
            devices.extend((0..towers as u32).map(towers::graph::Device::gpu));
            towers::train::check_devices(backend, &devices, &machine).map_err(|e| e.to_string())?;
            Ok(Target::Cuda)
        }
    }
}

/// `--explain-cost`: every placement at 1, 2 and 4 towers and at
/// `--towers`, predicted; the report's text. A tower count other than
/// `--towers` is explained with an even split (`--split-weights` are the
/// user's count's), and skipped with a line saying why when `--batch` does
/// not split evenly over it (the report stopped half-way with an error).
pub fn explain_cost(
    c: &Common,
    user: Option<&UserModel>,
    cfg: &TrainConfig,
    input: [usize; 3],
    classes: usize,
    backend: BackendChoice,
) -> Result<String, String> {
    use std::fmt::Write;
    let mut counts = vec![1, 2, 4];
    if cfg.towers > 0 && !counts.contains(&cfg.towers) {
        counts.push(cfg.towers);
        counts.sort_unstable();
    }
    let target = cost_target(backend, counts.iter().copied().max().unwrap_or(4))?;
    let (graph, loss) = cost_model(user, cfg, input, classes)?;
    let mut text = String::new();
    let _ =
        writeln!(text, "cost model on {} (calibrations under {})", towers::cost::machine_key(), c.cost_cache.display());
    let _ = writeln!(
        text,
        "{}",
        match target {
            Target::Cpu => "(calibrated on the CPU backend, whose devices share the host's memory: a copy between devices is elided there, so its path costs the bookkeeping only)",
            Target::Cuda => "(calibrated on --backend cuda: cpu:* on host threads, every gpu:* stream a lane of its own on one CUDA context, copies priced by their measured path; concurrent kernels sharing SMs and contexts time-slicing are not modelled)",
        }
    );
    for towers in counts {
        let mut opts = cfg.compile_options();
        if towers != cfg.towers {
            opts.split = towers::passes::SplitPolicy::Even;
            let rows = towers * cfg.accumulate.max(1);
            if !cfg.batch.is_multiple_of(rows) {
                let per =
                    if cfg.accumulate > 1 { format!(" x --accumulate {}", cfg.accumulate) } else { String::new() };
                let _ = writeln!(
                    text,
                    "towers={towers}: skipped: --batch {} does not split evenly over {towers} towers{per}",
                    cfg.batch
                );
                continue;
            }
        }
        for v in towers::cost::PLACEMENTS {
            let k = towers::cost::candidate_on(target, &graph, &loss, &opts, towers, v, &c.cost_cache)
                .map_err(|e| format!("--explain-cost: towers={towers} variables={}: {e}", v.name()))?;
            let from = if k.cached { ", calibration cached" } else { "" };
            text.push_str(&k.prediction.text(&format!("towers={towers} variables={}{from}", v.name())));
        }
    }
    Ok(text)
}

/// The `--optimizer` as its flag value.
fn opt_name(o: Opt) -> &'static str {
    match o {
        Opt::Sgd => "sgd",
        Opt::Momentum => "momentum",
        Opt::Adam => "adam",
        Opt::Rmsprop => "rmsprop",
        Opt::Adagrad => "adagrad",
    }
}

/// Flags the user typed that the chosen optimizer or model does not read
/// are refused, naming the flag and what reads it, rather than dropped in
/// silence (`--optimizer adam --momentum 0.5` trained as plain Adam).
/// Checked after `guards::validate`, so a nonsensical value is named first.
pub fn unused_flags(c: &Common) -> Result<(), String> {
    if let Some(m) = c.momentum {
        if matches!(c.optimizer, Opt::Sgd | Opt::Adam | Opt::Adagrad) {
            let extra = if matches!(c.optimizer, Opt::Adam) { " (adam's beta1 is fixed at 0.9)" } else { "" };
            return Err(format!(
                "--momentum {m}: --optimizer {} has no momentum{extra}; --momentum applies to --optimizer momentum and to RMSProp's momentum term (--optimizer rmsprop): leave --momentum out, or choose one of those",
                opt_name(c.optimizer)
            ));
        }
    }
    if c.nesterov && !matches!(c.optimizer, Opt::Momentum) {
        return Err(format!(
            "--nesterov applies to --optimizer momentum only (Nesterov's look-ahead momentum); --optimizer {} has none: leave --nesterov out, or use --optimizer momentum",
            opt_name(c.optimizer)
        ));
    }
    if c.graph.is_none() {
        match c.model {
            Model::Convnet if c.hidden.is_some() => {
                return Err(
                    "--hidden sets the widths of --model mlp's hidden layers; --model convnet has fixed layers: leave --hidden out, or use --model mlp".into(),
                )
            }
            Model::Convnet if c.activation.is_some() => {
                return Err(
                    "--activation sets the activation of --model mlp's hidden layers; --model convnet uses ReLU: leave --activation out, or use --model mlp".into(),
                )
            }
            Model::Mlp if c.batch_norm => {
                return Err(
                    "--batch-norm adds batch norm after each convolution of --model convnet; --model mlp (the default) has no convolution: add --model convnet, or leave --batch-norm out".into(),
                )
            }
            _ => {}
        }
    }
    Ok(())
}

/// `--bucket-mb` in bytes (at least one byte, finite).
fn bucket_bytes(mb: f64) -> Result<usize, String> {
    let bytes = mb * (1u64 << 20) as f64;
    if !bytes.is_finite() || bytes < 1.0 || mb > 1e6 {
        return Err(format!(
            "--bucket-mb {mb:e}: give a positive size in MiB, at most 1e6 (a terabyte), e.g. 25 (PyTorch DDP's default)"
        ));
    }
    Ok(bytes as usize)
}

/// The options both commands share, as a training configuration.
pub fn config(c: &Common) -> Result<TrainConfig, String> {
    let optimizer = match c.optimizer {
        Opt::Sgd => OptimizerKind::Sgd,
        Opt::Momentum => OptimizerKind::Momentum,
        Opt::Adam => OptimizerKind::Adam,
        Opt::Rmsprop => OptimizerKind::RmsProp,
        Opt::Adagrad => OptimizerKind::Adagrad,
    };
    let lr = c.lr.unwrap_or(match (optimizer, c.model) {
        (OptimizerKind::Adam | OptimizerKind::RmsProp, _) => 0.001,
        (OptimizerKind::Adagrad, _) => 0.05,
        _ if c.graph.is_some() => 0.05,
        (_, Model::Mlp) => 0.1,
        (_, Model::Convnet) => 0.05,
    });
    Ok(TrainConfig {
        data: data_spec(c)?,
        model: match c.model {
            Model::Mlp => ModelKind::Mlp,
            Model::Convnet => ModelKind::Convnet,
        },
        hidden: c.hidden.clone().unwrap_or_else(|| vec![256, 256]),
        activation: match c.activation.unwrap_or(Act::Relu) {
            Act::Relu => Activation::Relu,
            Act::Sigmoid => Activation::Sigmoid,
            Act::Tanh => Activation::Tanh,
            Act::Swish => Activation::Swish,
        },
        batch_norm: c.batch_norm,
        optimizer,
        lr,
        // --momentum is checked (range, and which optimizer has one) by
        // `guards::validate` and `unused_flags`; RMSProp's term is 0 unless given.
        momentum: c.momentum.unwrap_or(0.9),
        nesterov: c.nesterov,
        rmsprop_momentum: if optimizer == OptimizerKind::RmsProp { c.momentum.unwrap_or(0.0) } else { 0.0 },
        batch: c.batch,
        seed: c.seed,
        towers: match c.towers {
            Some(0) => return Err("--towers must be at least 1 (omit it for one device without towers)".into()),
            Some(n) => n,
            None => 0,
        },
        variables: match c.variables {
            Vars::Cpu => VarPlacement::Cpu,
            Vars::Gpu0 => VarPlacement::Gpu0,
            Vars::RoundRobin => VarPlacement::RoundRobin,
            Vars::Greedy => VarPlacement::Greedy,
            // --ps-tasks defaults to the number of processes (`ps_tasks`, once it is known).
            Vars::Ps => VarPlacement::Ps {
                tasks: c.ps_tasks.unwrap_or(1),
                strategy: match c.ps_strategy {
                    PsStrat::RoundRobin => PsStrategy::RoundRobin,
                    PsStrat::Greedy => PsStrategy::Greedy,
                },
            },
            // Replaced by the cost model's choice (`auto_variables`) before any compile.
            Vars::Auto => VarPlacement::default(),
        },
        split_weights: c.split_weights.clone(),
        accumulate: c.accumulate,
        clip_norm: c.clip_norm,
        bn_updates: match c.bn_updates {
            Bn::Tower0 => BnUpdates::Tower0,
            Bn::Mean => BnUpdates::Mean,
        },
        dump_dir: c.dump_dir.clone(),
        dump_after: c.dump_after.clone(),
        bucket_bytes: bucket_bytes(c.bucket_mb)?,
        memory_reuse: !c.no_memory_reuse,
        fuse_kernels: !c.no_fusion,
        cuda_graphs: !c.no_cuda_graphs,
        // Under several processes `cuda_contexts` decides the default.
        cuda_one_context: c.cuda_contexts == Some(super::args::CudaContexts::One),
        ..TrainConfig::default()
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::args::{Cli, Cmd};
    use super::*;

    fn one_context(args: &[&str], processes: usize, gpus: usize) -> bool {
        let cli = Cli::try_parse_from([&["towers", "train"], args].concat()).expect("parses");
        let Cmd::Train(a) = cli.cmd else { unreachable!("train") };
        let mut cfg = config(&a.common).expect("a config");
        cuda_contexts(&a.common, &mut cfg, processes, gpus);
        cfg.cuda_one_context
    }

    /// Left out, `--cuda-contexts` is per-gpu in one process where every
    /// logical GPU has a physical one, one where they would share a GPU
    /// (contexts time-slice) and under several processes (NCCL's
    /// all-reduce runs in one context); given, it holds.
    #[test]
    fn cuda_contexts_default_to_one_unless_each_logical_gpu_has_a_gpu() {
        assert!(!one_context(&["--towers", "2"], 1, 2));
        assert!(!one_context(&["--towers", "2"], 1, 8));
        assert!(!one_context(&[], 1, 1));
        assert!(one_context(&["--towers", "2"], 1, 1));
        assert!(one_context(&["--towers", "4"], 1, 0));
        assert!(one_context(&["--towers", "2"], 2, 8));
        assert!(!one_context(&["--towers", "2", "--cuda-contexts", "per-gpu"], 2, 1));
        assert!(one_context(&["--cuda-contexts", "one"], 1, 8));
    }
}
