//! The hostile sweep, kept: bad invocations of `towers train` and `towers
//! compile`, one table row each (numbers nan/inf/negative/0/huge/past u64,
//! contradictory flags, paths missing/folder/FIFO/device/unwritable,
//! malformed data and checkpoints). Each row asserts the exit code, key
//! words of the message, and that nothing panicked (exit code 101 or
//! "panicked") or hung (every run is killed past [`LIMIT`]).
//!
//! Exit codes: 2 is clap's (a value that does not parse as the flag's type),
//! 1 is towers' own error (a value that parses but makes no sense), 0 a run
//! accepted on purpose (each with its reason in `ACCEPTED`).
//!
//! Rows are cheap: tiny `--steps`, the embedded 8x8 digits, and most rows
//! stop in the option checks. They run on a few threads at once.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest a row may run before it counts as a hang.
const LIMIT: Duration = Duration::from_secs(120);

/// (arguments, with `{d}` for the fixtures' folder; exit code; words the stderr must hold).
type Row = (&'static str, i32, &'static [&'static str]);

const NUMBERS: &[Row] = &[
    // Counts (usize): what does not parse is clap's error; 0 is ours.
    ("train --steps nan", 2, &["--steps", "invalid value"]),
    ("train --steps inf", 2, &["--steps", "invalid value"]),
    ("train --steps=-1", 2, &["--steps", "invalid value"]),
    ("train --steps 1.5", 2, &["--steps", "invalid value"]),
    ("train --steps 99999999999999999999999", 2, &["--steps", "invalid value"]),
    ("train --steps 0", 1, &["--steps", "at least 1 step"]),
    ("train --epochs 0", 1, &["--epochs", "at least 1 epoch"]),
    ("train --epochs=-3", 2, &["--epochs"]),
    ("train --epochs 18446744073709551616", 2, &["--epochs", "invalid value"]),
    ("train --epochs 18446744073709551615", 1, &["--epochs", "batches per epoch", "--steps N"]),
    ("train --batch 0 --steps 1", 1, &["--batch", "at least 1 example"]),
    ("train --batch nan", 2, &["--batch", "invalid value"]),
    ("train --batch=-32", 2, &["--batch"]),
    ("train --batch 18446744073709551616", 2, &["--batch", "invalid value"]),
    ("train --batch 4000000000 --steps 1", 1, &["needs", "GiB", "smaller --batch", "fewer --towers"]),
    ("train --batch 4000000000 --towers 2 --steps 1", 1, &["GiB", "fewer --towers"]),
    ("train --towers 0 --steps 1", 1, &["--towers", "at least 1"]),
    ("train --towers=-1", 2, &["--towers"]),
    ("train --towers inf", 2, &["--towers", "invalid value"]),
    ("train --accumulate 0 --steps 1", 1, &["--accumulate", "at least 1"]),
    ("train --accumulate 4 --steps 1", 1, &["--accumulate", "needs --towers"]),
    ("train --accumulate nan", 2, &["--accumulate"]),
    ("train --hidden 0 --steps 1", 1, &["--hidden", "width 0"]),
    ("train --hidden 64,0 --steps 1", 1, &["--hidden", "layer 2 has width 0"]),
    ("train --hidden=-5", 2, &["--hidden"]),
    ("train --hidden 1e3", 2, &["--hidden", "invalid value"]),
    ("train --hidden 64,,64", 2, &["--hidden"]),
    ("train --seed=-1", 2, &["--seed"]),
    ("train --seed 18446744073709551616", 2, &["--seed", "invalid value"]),
    ("train --seed nan", 2, &["--seed", "invalid value"]),
    ("train --log-every=-1", 2, &["--log-every"]),
    ("train --eval-every 0 --steps 1", 1, &["--eval-every", "1 or more"]),
    ("train --trace-steps 0 --trace {d}/t.json --steps 1", 1, &["--trace-steps", "at least 1"]),
    ("train --warmup-steps=-1", 2, &["--warmup-steps"]),
    ("train --lr-schedule step --lr-decay-steps 0 --steps 1", 1, &["--lr-decay-steps", "1 or more"]),
    ("train --split-weights 0,1 --towers 2 --steps 1", 1, &["--split-weights", "at least 1"]),
    ("train --split-weights 1,1,1 --towers 2 --steps 1", 1, &["--split-weights", "3 weights for 2 towers"]),
    ("train --split-weights 3,1 --steps 1", 1, &["--split-weights", "0 towers"]),
    ("train --split-weights=-1,2 --towers 2", 2, &["--split-weights"]),
    ("train --split-weights 4294967296,1 --towers 2", 2, &["--split-weights", "invalid value"]),
    // Rates (f32): every non-finite, negative, zero and out-of-range value.
    ("train --lr nan --steps 1", 1, &["--lr", "finite number above 0", "NaN"]),
    ("train --lr inf --steps 1", 1, &["--lr", "finite number above 0"]),
    ("train --lr=-inf --steps 1", 1, &["--lr", "finite number above 0"]),
    ("train --lr=-0.1 --steps 1", 1, &["--lr", "-0.1"]),
    ("train --lr 0 --steps 1", 1, &["--lr", "above 0"]),
    ("train --lr 1e40 --steps 1", 1, &["--lr", "inf"]),
    ("train --lr abc", 2, &["--lr", "invalid value"]),
    ("train --momentum nan --steps 1", 1, &["--momentum", "[0, 1)"]),
    ("train --momentum inf --steps 1", 1, &["--momentum", "[0, 1)"]),
    ("train --momentum=-0.5 --steps 1", 1, &["--momentum", "[0, 1)"]),
    ("train --momentum 1 --steps 1", 1, &["--momentum", "[0, 1)", "got 1"]),
    ("train --momentum 5 --steps 1", 1, &["--momentum", "grow without bound"]),
    ("train --momentum 1e40 --steps 1", 1, &["--momentum"]),
    ("train --lr-decay-rate 50 --lr-schedule step --steps 1", 1, &["--lr-decay-rate", "(0, 1]"]),
    ("train --lr-decay-rate 1.5 --steps 1", 1, &["--lr-decay-rate", "grows"]),
    ("train --lr-decay-rate 0 --lr-schedule step --steps 1", 1, &["--lr-decay-rate"]),
    ("train --lr-decay-rate nan --steps 1", 1, &["--lr-decay-rate"]),
    ("train --lr-decay-rate=-0.5 --steps 1", 1, &["--lr-decay-rate"]),
    ("train --lr-min nan --steps 1", 1, &["--lr-min"]),
    ("train --lr-min=-1 --steps 1", 1, &["--lr-min"]),
    ("train --lr-min 1 --lr 0.1 --steps 1", 1, &["--lr-min", "0..=--lr"]),
    ("train --lr-min inf --steps 1", 1, &["--lr-min"]),
    // Seconds and sizes (f64).
    ("train --steps 3 --checkpoint-secs 1e40 --checkpoint {d}/n1.st", 1, &["--checkpoint-secs", "at most 1e9"]),
    ("train --steps 3 --checkpoint-secs 2e19 --checkpoint {d}/n2.st", 1, &["--checkpoint-secs", "at most 1e9"]),
    ("train --steps 3 --checkpoint-secs nan --checkpoint {d}/n3.st", 1, &["--checkpoint-secs", "finite"]),
    ("train --steps 3 --checkpoint-secs inf --checkpoint {d}/n4.st", 1, &["--checkpoint-secs"]),
    ("train --steps 3 --checkpoint-secs 0 --checkpoint {d}/n5.st", 1, &["--checkpoint-secs", "above 0"]),
    ("train --steps 3 --checkpoint-secs=-5 --checkpoint {d}/n6.st", 1, &["--checkpoint-secs"]),
    ("train --steps 3 --checkpoint-secs 5", 1, &["--checkpoint-secs", "needs --checkpoint"]),
    ("train --steps 3 --comm-timeout 1e40", 1, &["--comm-timeout", "at most 1e9"]),
    ("train --steps 3 --comm-timeout 1.9e19", 1, &["--comm-timeout", "at most 1e9"]),
    ("train --steps 3 --comm-timeout nan", 1, &["--comm-timeout"]),
    ("train --steps 3 --comm-timeout inf", 1, &["--comm-timeout"]),
    ("train --steps 3 --comm-timeout 0", 1, &["--comm-timeout", "above 0"]),
    ("train --steps 3 --comm-timeout=-1", 1, &["--comm-timeout"]),
    ("train --steps 3 --comm-timeout 1e-300", 1, &["--comm-timeout", "at least 0.001"]),
    ("train --steps 3 --bucket-mb 0", 1, &["--bucket-mb", "positive"]),
    ("train --steps 3 --bucket-mb nan", 1, &["--bucket-mb"]),
    ("train --steps 3 --bucket-mb inf", 1, &["--bucket-mb"]),
    ("train --steps 3 --bucket-mb=-25", 1, &["--bucket-mb"]),
    ("train --steps 3 --bucket-mb 1e300", 1, &["--bucket-mb", "at most"]),
    ("train --checkpoint-every 0 --checkpoint {d}/n7.st --steps 1", 1, &["--checkpoint-every", "1 or more"]),
    ("train --keep 0 --checkpoint {d}/n8.st --steps 1", 1, &["--keep", "at least 1"]),
    ("train --keep=-1 --checkpoint {d}/n9.st", 2, &["--keep"]),
];

const FLAGS: &[Row] = &[
    // Contradictory or incomplete flags.
    ("train --resume --steps 1", 1, &["--resume", "needs --checkpoint"]),
    ("train --restore-partial --steps 1", 1, &["--restore-partial", "--resume"]),
    ("train --restore-partial --checkpoint {d}/rp.st --steps 1", 1, &["--restore-partial", "--resume"]),
    ("train --overwrite --steps 1", 1, &["--overwrite", "needs --checkpoint"]),
    ("train --keep 2 --steps 1", 1, &["--keep", "needs --checkpoint"]),
    ("train --checkpoint-every 5 --steps 1", 1, &["--checkpoint-every", "needs --checkpoint"]),
    ("train --dump-after nosuch --dump-dir {d}/dumps --steps 1", 1, &["--dump-after", "nosuch", "autodiff"]),
    ("train --dump-after replicate --dump-dir {d}/dumps --steps 1", 1, &["--dump-after", "replicate"]),
    ("train --dump-after autodiff --steps 1", 1, &["--dump-after", "needs --dump-dir"]),
    ("train --model transformer", 2, &["--model", "invalid value"]),
    ("train --optimizer adadelta", 2, &["--optimizer", "invalid value"]),
    ("train --activation gelu", 2, &["--activation", "invalid value"]),
    ("train --variables tpu", 2, &["--variables", "invalid value"]),
    ("train --bn-updates all", 2, &["--bn-updates", "invalid value"]),
    ("train --backend tpu", 2, &["--backend", "unknown backend"]),
    ("compile --backend tpu --emit placement", 2, &["--backend", "unknown backend"]),
    ("train --lr-schedule linear", 2, &["--lr-schedule", "constant, step, exponential or cosine"]),
    ("train --data imagenet --steps 1", 1, &["imagenet"]),
    ("train --data mnist: --steps 1", 1, &["mnist"]),
    ("train --no-such-flag", 2, &["--no-such-flag"]),
    ("train --steps", 2, &["--steps"]),
    ("train --steps 1 --steps 2", 2, &["--steps", "cannot be used multiple times"]),
    ("fly", 2, &["unrecognized subcommand"]),
    ("", 2, &["Usage"]),
    // compile goes through the same guards as train.
    ("compile --lr nan", 1, &["--lr", "NaN"]),
    ("compile --lr 0", 1, &["--lr"]),
    ("compile --momentum 5", 1, &["--momentum"]),
    ("compile --hidden 0", 1, &["--hidden", "width 0"]),
    ("compile --batch 0", 1, &["--batch"]),
    ("compile --accumulate 3", 1, &["--accumulate", "needs --towers"]),
    // A placement among the towers' devices without towers: everything would be on cpu:0.
    (
        "train --variables gpu0 --steps 1",
        1,
        &["--variables: gpu0", "needs --towers N", "--towers 1 --variables gpu0", "cpu:0"],
    ),
    ("train --variables round-robin --steps 1", 1, &["--variables: round-robin", "needs --towers N"]),
    ("compile --variables greedy", 1, &["--variables: greedy", "needs --towers N"]),
    ("train --variables auto --steps 1", 1, &["--variables auto", "needs --towers N", "--towers 2 --variables auto"]),
    ("compile --variables auto", 1, &["--variables auto", "needs --towers N"]),
    // The CUDA backend's knobs on the CPU backend (the default) would do nothing.
    ("train --no-cuda-graphs --steps 1", 1, &["--no-cuda-graphs", "--backend cuda only", "add --backend cuda"]),
    ("train --cuda-contexts one --towers 2 --steps 1", 1, &["--cuda-contexts one", "--backend cuda only"]),
    ("compile --cuda-contexts per-gpu --backend cpu", 1, &["--cuda-contexts per-gpu", "--backend cuda only"]),
    // Flags the chosen optimizer, model or schedule does not read (they were dropped in silence).
    (
        "train --steps 1 --optimizer adam --momentum 0.5",
        1,
        &["--momentum 0.5", "--optimizer adam has no momentum", "beta1"],
    ),
    ("train --steps 1 --optimizer sgd --momentum 0.5", 1, &["--momentum 0.5", "--optimizer sgd has no momentum"]),
    ("compile --optimizer adagrad --momentum 0.5", 1, &["--momentum", "--optimizer adagrad has no momentum"]),
    ("train --steps 1 --optimizer rmsprop --momentum 5", 1, &["--momentum", "[0, 1)"]),
    (
        "train --steps 1 --optimizer adam --nesterov",
        1,
        &["--nesterov", "--optimizer momentum only", "--optimizer adam"],
    ),
    ("train --steps 1 --optimizer rmsprop --nesterov", 1, &["--nesterov", "--optimizer momentum only"]),
    (
        "train --steps 1 --model convnet --hidden 64",
        1,
        &["--hidden", "--model convnet has fixed layers", "--model mlp"],
    ),
    ("compile --model convnet --activation tanh", 1, &["--activation", "--model convnet uses ReLU"]),
    ("train --steps 1 --batch-norm", 1, &["--batch-norm", "--model mlp (the default)", "add --model convnet"]),
    (
        "train --steps 1 --lr-schedule constant --lr-min 0.01",
        1,
        &["--lr-min", "--lr-schedule constant does not read it"],
    ),
    ("train --steps 1 --lr-decay-steps 3", 1, &["--lr-decay-steps", "--lr-schedule cosine does not read it"]),
    ("train --steps 1 --lr-schedule cosine --lr-decay-rate 0.5", 1, &["--lr-decay-rate", "add --lr-schedule step"]),
    ("compile --accumulate 0 --towers 2", 1, &["--accumulate"]),
    ("compile --towers 0", 1, &["--towers"]),
    ("compile --split-weights 1,2,3 --towers 2", 1, &["--split-weights"]),
    ("compile --input 28x28x0 --model convnet", 1, &["--input", "at least 1"]),
    ("compile --input 0x28", 1, &["--input", "at least 1"]),
    ("compile --input 28", 1, &["--input", "HxWxC"]),
    ("compile --input 28x28x1x1", 1, &["--input", "HxWxC"]),
    ("compile --input axbxc", 1, &["--input", "HxWxC"]),
    ("compile --input 28x28x-1", 1, &["--input", "HxWxC"]),
    ("compile --input 99999999999999999999x2", 1, &["--input"]),
    ("compile --input 65536x65536x65536", 1, &["--input", "2^28"]),
    ("compile --world-size 0", 1, &["--world-size"]),
    ("compile --world-size 2 --rank 2", 1, &["--rank"]),
    ("compile --world-size=-1", 2, &["--world-size"]),
    ("compile --bucket-mb nan", 1, &["--bucket-mb"]),
    ("compile --emit asm", 2, &["--emit", "invalid value"]),
    ("compile --emit cuda", 1, &["-o DIR"]),
    ("compile --explain-cost --emit dot", 2, &["--explain-cost", "cannot be used with", "--emit"]),
    ("compile --dump-after nosuch --dump-dir {d}/cdumps", 1, &["--dump-after", "nosuch"]),
    ("compile --dump-after prune", 1, &["--dump-after", "needs --dump-dir"]),
    ("compile --lr-decay-rate 50", 2, &["unexpected argument '--lr-decay-rate'"]),
    ("compile --steps 5", 2, &["unexpected argument '--steps'"]),
];

const PATHS: &[Row] = &[
    // Outputs: checked before any step.
    ("train --steps 1 --checkpoint {d}/missing/x.st", 1, &["--checkpoint", "does not exist"]),
    ("train --steps 1 --checkpoint {d}/dir", 1, &["--checkpoint", "a folder"]),
    ("train --steps 1 --checkpoint {d}/fifo", 1, &["--checkpoint", "a FIFO"]),
    ("train --steps 1 --checkpoint {d}/fifo --resume", 1, &["--checkpoint", "a FIFO"]),
    ("train --steps 1 --checkpoint {d}/null --overwrite", 1, &["--checkpoint", "a character device"]),
    ("train --steps 1 --checkpoint {d}/null --resume", 1, &["--checkpoint", "a character device"]),
    ("train --steps 1 --checkpoint /dev/null --overwrite", 1, &["--checkpoint", "a character device"]),
    ("train --steps 1 --checkpoint {d}/file.txt/x.st", 1, &["--checkpoint", "not a folder"]),
    ("train --steps 1 --checkpoint {d}/sock", 1, &["--checkpoint", "a socket"]),
    ("train --steps 1 --checkpoint {d}/good.st", 1, &["already exists", "--resume", "--overwrite"]),
    ("train --steps 1 --checkpoint {d}/series/x.st --keep 2", 1, &["step-stamped", "x-11350.st", "--overwrite"]),
    ("train --steps 1 --trace {d}/missing/t.json", 1, &["--trace", "does not exist"]),
    // Two outputs on one file, an output on the input model, a snapshot resumed in place.
    (
        "train --steps 1 --checkpoint {d}/same.st --trace {d}/./same.st",
        1,
        &["--checkpoint", "--trace", "are the same file"],
    ),
    ("train --steps 1 --plot {d}/p.svg --trace {d}/p.svg", 1, &["--plot", "--trace", "are the same file"]),
    ("compile --graph {d}/file.txt -o {d}/./file.txt", 1, &["--output", "is the --graph file this run reads"]),
    ("compile --emit cuda -o -", 1, &["--emit cuda", "folder", "-o DIR"]),
    (
        "train --steps 1 --checkpoint {d}/series/x-11350.st --resume",
        1,
        &["--checkpoint", "x-11350.st is the step-11350 snapshot of the series", "x.st", "cp "],
    ),
    ("train --steps 1 --trace {d}/dir", 1, &["--trace", "a folder"]),
    ("train --steps 1 --trace {d}/fifo", 1, &["--trace", "a FIFO"]),
    ("train --steps 1 --trace /dev/null", 1, &["--trace", "a character device"]),
    ("train --steps 1 --plot {d}/missing/p.svg", 1, &["--plot", "does not exist"]),
    ("train --steps 1 --plot {d}/dir.svg", 1, &["--plot", "a folder"]),
    ("train --steps 1 --plot {d}/fifo.svg", 1, &["--plot", "a FIFO"]),
    ("train --steps 1 --plot {d}/p.png", 1, &["--plot", ".svg"]),
    ("train --steps 1 --plot {d}/null.svg", 1, &["--plot", "a character device"]),
    ("train --steps 1 --plot /dev/null", 1, &["--plot", ".svg"]),
    ("train --steps 1 --logdir {d}/file.txt", 1, &["--logdir"]),
    ("train --steps 1 --dump-dir {d}/file.txt", 1, &["--dump-dir", "not a folder"]),
    ("train --steps 1 --dump-dir {d}/file.txt/sub", 1, &["--dump-dir", "not a folder"]),
    ("compile -o {d}/missing/plan.txt", 1, &["--output", "does not exist"]),
    ("compile -o {d}/dir", 1, &["--output", "a folder"]),
    ("compile -o {d}/fifo", 1, &["--output", "a FIFO"]),
    ("compile -o /dev/null", 1, &["--output", "a character device"]),
    ("compile --emit cuda -o {d}/file.txt", 1, &["--output", "not a folder"]),
    ("compile --dump-dir {d}/file.txt", 1, &["--dump-dir", "not a folder"]),
    // Unwritable places (read-only file systems, also for root): refused
    // before the run by the folder probe, which names the flag.
    ("train --steps 1 --checkpoint /proc/towers.st", 1, &["--checkpoint /proc/towers.st", "cannot create files"]),
    ("train --steps 1 --trace /proc/towers.json", 1, &["--trace /proc/towers.json", "cannot create files"]),
    ("train --steps 1 --plot /proc/towers.svg", 1, &["--plot /proc/towers.svg", "cannot create files"]),
    ("compile -o /proc/towers-plan.txt", 1, &["--output /proc/towers-plan.txt", "cannot create files"]),
    ("train --steps 1 --logdir /proc/towers-logs", 1, &["--logdir"]),
    // Data: missing, not a folder, malformed IDX files.
    ("train --data mnist:{d}/missing --steps 1", 1, &["{d}/missing"]),
    ("train --data mnist:{d}/file.txt --steps 1", 1, &["file.txt"]),
    ("train --data mnist:{d}/dir --steps 1", 1, &["train-images-idx3-ubyte"]),
    ("train --data mnist:{d}/fifo --steps 1", 1, &["fifo"]),
    ("train --data mnist:{d}/idx_magic --steps 1", 1, &["train-images-idx3-ubyte", "magic"]),
    ("train --data mnist:{d}/idx_trunc --steps 1", 1, &["train-images-idx3-ubyte"]),
    ("train --data mnist:{d}/idx_empty --steps 1", 1, &["train-images-idx3-ubyte"]),
    ("train --data mnist:{d}/idx_huge --steps 1", 1, &["train-images-idx3-ubyte"]),
    ("train --data mnist:{d}/idx_zero --steps 1", 1, &["train-images-idx3-ubyte", "at least 1"]),
    ("train --data mnist:{d}/idx_label --steps 1", 1, &["train-labels-idx1-ubyte"]),
    ("train --data mnist:{d}/idx_count --steps 1", 1, &["train-labels-idx1-ubyte"]),
    ("train --data mnist:{d}/idx_trailing --steps 1", 1, &["train-images-idx3-ubyte"]),
    ("train --data mnist:{d}/idx_gz --steps 1", 1, &["train-images-idx3-ubyte"]),
    // Checkpoints: malformed, of another model, not finite.
    ("train --steps 3 --checkpoint {d}/empty.st --resume", 1, &["empty.st", "not a safetensors file"]),
    ("train --steps 3 --checkpoint {d}/short.st --resume", 1, &["short.st", "not a safetensors file"]),
    ("train --steps 3 --checkpoint {d}/garbage.st --resume", 1, &["garbage.st", "not a safetensors file"]),
    ("train --steps 3 --checkpoint {d}/hugeheader.st --resume", 1, &["hugeheader.st", "not a safetensors file"]),
    ("train --steps 3 --checkpoint {d}/badjson.st --resume", 1, &["badjson.st", "not a safetensors file"]),
    ("train --steps 3 --checkpoint {d}/truncated.st --resume", 1, &["truncated.st"]),
    ("train --steps 3 --checkpoint {d}/nan.st --resume", 1, &["nan.st", "MLP/fc1/weights", "NaN"]),
    ("train --steps 3 --checkpoint {d}/inf.st --resume", 1, &["inf.st", "MLP/fc1/weights/Momentum", "inf"]),
    ("train --steps 3 --checkpoint {d}/nan.st --resume --restore-partial", 1, &["NaN", "MLP/fc1/weights"]),
    (
        "train --steps 3 --checkpoint {d}/extra.st --resume",
        1,
        &["extra.st", "does not have", "stale/tensor", "--restore-partial"],
    ),
    (
        "train --steps 3 --checkpoint {d}/missingvar.st --resume",
        1,
        &["missing from the checkpoint", "MLP/fc2/biases", "--restore-partial"],
    ),
    ("train --steps 3 --checkpoint {d}/shape.st --resume", 1, &["MLP/fc1/biases", "f32[3]", "--restore-partial"]),
    ("train --steps 3 --checkpoint {d}/dtype.st --resume", 1, &["MLP/fc1/biases", "i32", "--restore-partial"]),
    ("train --steps 3 --checkpoint {d}/f64.st --resume", 1, &["MLP/fc1/biases"]),
    (
        "train --steps 3 --checkpoint {d}/good.st --resume --activation tanh",
        1,
        &["another model", "activation: relu in the checkpoint, tanh"],
    ),
    ("train --steps 3 --checkpoint {d}/good.st --resume --hidden 64", 1, &["another model", "hidden: 256,256"]),
    (
        "train --steps 3 --checkpoint {d}/good.st --resume --optimizer adam",
        1,
        &["another model", "optimizer: momentum"],
    ),
    ("train --steps 3 --checkpoint {d}/good.st --resume --optimizer sgd", 1, &["another model", "optimizer"]),
    ("train --steps 3 --checkpoint {d}/good.st --resume --model convnet", 1, &["another model", "model: mlp"]),
    ("train --steps 3 --checkpoint {d}/good.st --resume --nesterov", 1, &["another model", "nesterov"]),
    ("train --steps 3 --checkpoint {d}/good.st --resume --data mnist5k", 1, &["another model", "input: 8x8x1"]),
    (
        "train --steps 3 --checkpoint {d}/convnet.st --resume --optimizer momentum",
        1,
        &["another model", "model: convnet"],
    ),
    ("train --steps 3 --checkpoint {d}/bn.st --resume --model convnet", 1, &["another model", "batch_norm: true"]),
    ("train --steps 3 --checkpoint {d}/nometa-extra.st --resume", 1, &["does not have", "stale/tensor"]),
];

/// Runs accepted on purpose, with the reason (the "silent acceptances left").
const ACCEPTED: &[(Row, &str)] = &[
    (
        ("train --steps 3 --checkpoint {d}/good.st --resume --batch 16 --overwrite", 0, &["warning: --resume: batch: 32 in the checkpoint, 16"]),
        "a different batch on resume: the variables are the same model's (TF1 allows it); a warning says the data order differs",
    ),
    (
        ("train --steps 3 --checkpoint {d}/good2.st --resume --hidden 64 --restore-partial --overwrite", 0, &["--restore-partial: skipped 'MLP/fc1/weights", "--restore-partial: hidden: 256,256"]),
        "the documented opt-in for fine tuning: every skipped tensor is printed",
    ),
    (
        ("train --epochs 1000000000000000000 --steps 3", 0, &["3 steps"]),
        "--steps overrides --epochs: the epochs' step count (past usize here) is never computed (it was, and panicked)",
    ),
    (
        ("train --steps 3 --momentum 0.5 --optimizer rmsprop", 0, &["3 steps"]),
        "--momentum is RMSProp's momentum term (TF1's RMSPropOptimizer(momentum=0.5))",
    ),
    (
        ("train --steps 2 --checkpoint {d}/series/x.st --keep 2 --overwrite", 0, &[]),
        "--overwrite writes beside another run's stamped files and never prunes them (see the crash and keep tests)",
    ),
    (
        ("train --steps 2 --checkpoint {d}/missing-resume.st --resume", 0, &[]),
        "--resume of a checkpoint that does not exist yet starts fresh (TF's MonitoredTrainingSession: one command for the first run and every restart)",
    ),
];

fn mkfifo(p: &Path) {
    let ok = Command::new("mkfifo").arg(p).status().map(|s| s.success()).unwrap_or(false);
    assert!(ok, "mkfifo {}", p.display());
}

fn idx(magic: u32, dims: &[u32], body: usize) -> Vec<u8> {
    let mut v: Vec<u8> = magic.to_be_bytes().to_vec();
    for d in dims {
        v.extend(d.to_be_bytes());
    }
    v.extend(std::iter::repeat_n(3u8, body));
    v
}

/// An MNIST folder with these four files (train images, train labels, test images, test labels).
fn mnist(dir: &Path, files: [Vec<u8>; 4]) {
    std::fs::create_dir_all(dir).unwrap();
    let names =
        ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"];
    for (n, f) in names.iter().zip(files) {
        std::fs::write(dir.join(n), f).unwrap();
    }
}

/// `good` with its tensors changed by `f` (name, dtype, shape, bytes) and its metadata kept or dropped.
fn rewrite(
    good: &[u8],
    keep_meta: bool,
    f: impl Fn(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) -> Vec<u8> {
    let st = safetensors::SafeTensors::deserialize(good).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(good).unwrap();
    let mut t: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> =
        st.tensors().into_iter().map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    t.sort_by(|a, b| a.0.cmp(&b.0));
    f(&mut t);
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = t
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let meta = if keep_meta { meta.metadata().clone() } else { None };
    safetensors::tensor::serialize(views, meta).unwrap()
}

fn set_f32(t: &mut [(String, safetensors::Dtype, Vec<usize>, Vec<u8>)], name: &str, v: f32) {
    let e = t.iter_mut().find(|e| e.0 == name).unwrap_or_else(|| panic!("{name}"));
    e.3[4..8].copy_from_slice(&v.to_le_bytes());
}

fn towers_ok(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_towers")).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The fixtures every row may name under `{d}`.
fn fixtures(d: &Path) {
    std::fs::create_dir(d.join("dir")).unwrap();
    std::fs::write(d.join("file.txt"), b"text").unwrap();
    mkfifo(&d.join("fifo"));
    std::os::unix::fs::symlink("/dev/null", d.join("null")).unwrap();
    std::os::unix::fs::symlink("/dev/null", d.join("null.svg")).unwrap();
    std::fs::create_dir(d.join("dir.svg")).unwrap();
    mkfifo(&d.join("fifo.svg"));
    let _sock = std::os::unix::net::UnixListener::bind(d.join("sock")).unwrap();
    std::mem::forget(_sock);
    std::fs::create_dir(d.join("series")).unwrap();
    for s in [11350, 11355, 11360] {
        std::fs::write(d.join(format!("series/x-{s}.st")), b"another run").unwrap();
    }
    let s = |p: &str| d.join(p).to_str().unwrap().to_string();
    towers_ok(&["train", "--steps", "2", "--checkpoint", &s("good.st")]);
    std::fs::copy(d.join("good.st"), d.join("good2.st")).unwrap();
    towers_ok(&["train", "--steps", "1", "--model", "convnet", "--optimizer", "sgd", "--checkpoint", &s("convnet.st")]);
    towers_ok(&["train", "--steps", "1", "--model", "convnet", "--batch-norm", "--checkpoint", &s("bn.st")]);
    let good = std::fs::read(d.join("good.st")).unwrap();
    let w = |n: &str, b: Vec<u8>| std::fs::write(d.join(n), b).unwrap();
    w("empty.st", Vec::new());
    w("short.st", vec![1, 2, 3, 4]);
    w("garbage.st", b"this is not a checkpoint at all, just some text".to_vec());
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend(b"{}");
    w("hugeheader.st", huge);
    let mut bad = 8u64.to_le_bytes().to_vec();
    bad.extend(b"{not js}");
    w("badjson.st", bad);
    w("truncated.st", good[..good.len() / 2].to_vec());
    w("nan.st", rewrite(&good, true, |t| set_f32(t, "MLP/fc1/weights", f32::NAN)));
    w("inf.st", rewrite(&good, true, |t| set_f32(t, "MLP/fc1/weights/Momentum", f32::INFINITY)));
    let extra = |t: &mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>| {
        t.push(("stale/tensor".into(), safetensors::Dtype::F32, vec![2], vec![0; 8]))
    };
    w("extra.st", rewrite(&good, true, extra));
    w("nometa-extra.st", rewrite(&good, false, extra));
    w("missingvar.st", rewrite(&good, true, |t| t.retain(|e| e.0 != "MLP/fc2/biases")));
    w(
        "shape.st",
        rewrite(&good, true, |t| {
            let e = t.iter_mut().find(|e| e.0 == "MLP/fc1/biases").unwrap();
            (e.2, e.3) = (vec![3], vec![0; 12]);
        }),
    );
    w(
        "dtype.st",
        rewrite(&good, true, |t| t.iter_mut().find(|e| e.0 == "MLP/fc1/biases").unwrap().1 = safetensors::Dtype::I32),
    );
    w(
        "f64.st",
        rewrite(&good, true, |t| {
            let e = t.iter_mut().find(|e| e.0 == "MLP/fc1/biases").unwrap();
            e.1 = safetensors::Dtype::F64;
            e.2 = vec![128];
        }),
    );
    // IDX folders, each wrong in one way (the test split is well formed).
    let (ti, tl) = (idx(0x803, &[2, 8, 8], 128), idx(0x801, &[2], 2));
    mnist(&d.join("idx_magic"), [idx(0x802, &[2, 8, 8], 128), tl.clone(), ti.clone(), tl.clone()]);
    mnist(&d.join("idx_trunc"), [idx(0x803, &[2, 8, 8], 100), tl.clone(), ti.clone(), tl.clone()]);
    mnist(&d.join("idx_empty"), [Vec::new(), tl.clone(), ti.clone(), tl.clone()]);
    mnist(&d.join("idx_huge"), [idx(0x803, &[u32::MAX, u32::MAX, u32::MAX], 16), tl.clone(), ti.clone(), tl.clone()]);
    mnist(&d.join("idx_zero"), [idx(0x803, &[2, 0, 8], 0), tl.clone(), ti.clone(), tl.clone()]);
    let mut bad_label = tl.clone();
    *bad_label.last_mut().unwrap() = 10;
    mnist(&d.join("idx_label"), [ti.clone(), bad_label, ti.clone(), tl.clone()]);
    mnist(&d.join("idx_count"), [ti.clone(), idx(0x801, &[3], 3), ti.clone(), tl.clone()]);
    mnist(&d.join("idx_trailing"), [idx(0x803, &[2, 8, 8], 130), tl.clone(), ti.clone(), tl.clone()]);
    let mut gz = vec![0x1f, 0x8b];
    gz.extend(b"not really gzip");
    mnist(&d.join("idx_gz"), [gz, tl.clone(), ti, tl]);
}

/// What one row did.
enum Outcome {
    Ok,
    Failed(String),
}

fn run_row(d: &str, (args, code, words): &Row, panics: &AtomicUsize, hangs: &AtomicUsize) -> Outcome {
    let args: Vec<String> = args.split_whitespace().map(|a| a.replace("{d}", d)).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_towers"))
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the towers binary runs");
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t.elapsed() > LIMIT {
            let _ = child.kill();
            hangs.fetch_add(1, Ordering::Relaxed);
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let Some(status) = status else { return Outcome::Failed(format!("{args:?}: hung past {LIMIT:?}")) };
    let got = status.code().unwrap_or(-1);
    if got == 101 || stderr.contains("panicked") {
        panics.fetch_add(1, Ordering::Relaxed);
        return Outcome::Failed(format!("{args:?} panicked:\n{stderr}"));
    }
    if got != *code {
        return Outcome::Failed(format!("{args:?}: exit code {got}, expected {code}:\n{stderr}"));
    }
    let missing: Vec<&str> =
        words.iter().map(|w| w.replace("{d}", d)).filter(|w| !stderr.contains(w.as_str())).map(|_| "").collect();
    if !missing.is_empty() {
        let lacking: Vec<String> =
            words.iter().map(|w| w.replace("{d}", d)).filter(|w| !stderr.contains(w.as_str())).collect();
        return Outcome::Failed(format!("{args:?}: the message lacks {lacking:?}:\n{stderr}"));
    }
    Outcome::Ok
}

#[test]
fn every_hostile_invocation_is_a_clear_error_or_accepted_on_purpose() {
    let dir = tempfile::tempdir().unwrap();
    fixtures(dir.path());
    let d = dir.path().to_str().unwrap().to_string();
    let rows: Vec<&Row> = NUMBERS.iter().chain(FLAGS).chain(PATHS).chain(ACCEPTED.iter().map(|(r, _)| r)).collect();
    let (panics, hangs) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let failures = Mutex::new(Vec::new());
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(row) = rows.get(i) else { break };
                if let Outcome::Failed(why) = run_row(&d, row, &panics, &hangs) {
                    failures.lock().unwrap().push(why);
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    let errors = rows.iter().filter(|r| r.1 != 0).count();
    eprintln!(
        "hostile sweep: {} cases, {errors} expected clear errors, {} accepted on purpose, {} panics, {} hangs, {} failures",
        rows.len(),
        ACCEPTED.len(),
        panics.load(Ordering::Relaxed),
        hangs.load(Ordering::Relaxed),
        failures.len()
    );
    assert!(rows.len() >= 150, "the sweep keeps at least 150 cases");
    assert!(failures.is_empty(), "{} row(s) failed:\n{}", failures.len(), failures.join("\n\n"));
}
