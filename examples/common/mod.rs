//! What the three TF1 ports share (`examples/port_*.rs`): the run's
//! options, the training loop of a compiled plan (momentum 0.9, cosine from
//! 0.05, batches of mnist5k fed in place) with its test accuracy, and the
//! `main` that exits non-zero below [`TARGET`]. Each port builds its own
//! graph and plan; this module never sees how.

use std::error::Error;
use std::process::ExitCode;

use towers::codegen::Plan;
use towers::data::{mnist5k_split, Batcher};
use towers::prelude::*;
use towers::schedule::{Decay, Schedule};
use towers::train::evaluate;

/// The accuracy every port must reach on the mnist5k test split.
pub const TARGET: f64 = 0.97;

/// The global batch; each tower takes `BATCH / towers` rows.
pub const BATCH: usize = 64;

/// One training run of a port.
#[derive(Debug, Clone)]
pub struct Run {
    /// The graph seed (`tf.set_random_seed`): weights, dropout, data order.
    pub seed: u64,
    pub epochs: usize,
    /// Stop after this many steps (the unit-size tests); `None`: all epochs.
    pub max_steps: Option<usize>,
    /// Towers (`/gpu:0`, `/gpu:1`, ...; CPU devices on this machine).
    pub towers: u32,
}

impl Default for Run {
    fn default() -> Self {
        Run { seed: 0, epochs: 8, max_steps: None, towers: 2 }
    }
}

/// Train the compiled `train` plan (fetching `loss`) on mnist5k as `r`
/// says, then return the test accuracy of the `eval` plan (fetching
/// `predictions`), which shares the training variables by name.
pub fn train_and_test(r: &Run, train: Plan, eval: Plan) -> Result<f64, Box<dyn Error>> {
    let (train_set, test) = mnist5k_split()?;
    let mut sess = Session::new(r.seed);
    sess.load("train", train)?;
    sess.load("eval", eval)?;
    let mut batcher = Batcher::new(&train_set, BATCH, r.seed)?;
    let total = r
        .epochs
        .checked_mul(batcher.batches_per_epoch())
        .ok_or_else(|| format!("EPOCHS {}: too many steps to count; give fewer epochs", r.epochs))?;
    let total = r.max_steps.map_or(total, |m| m.min(total));
    let schedule = Schedule { base: 0.05, decay: Decay::Cosine { total, min: 0.0 }, warmup: 0 };
    for step in 0..total {
        sess.feed_with("train", "images", |x| batcher.fill_images(x))??;
        sess.feed_with("train", "labels", |y| batcher.fill_labels(y))??;
        batcher.advance();
        sess.write_variable("learning_rate", &[schedule.at(step)])?;
        sess.run("train")?;
        let loss = sess.fetch::<f32>("train", "loss")?[0];
        if !loss.is_finite() {
            return Err(format!("step {step}: loss {loss}").into());
        }
    }
    Ok(evaluate(&mut sess, &test, 500, "images", "labels")?)
}

/// `SEED [EPOCHS]` from the command line.
pub fn run_from_args() -> Result<Run, Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut r = Run::default();
    if let Some(s) = args.first() {
        r.seed = s.parse().map_err(|e| format!("SEED '{s}': {e}"))?;
    }
    if let Some(e) = args.get(1) {
        r.epochs = e.parse().map_err(|err| format!("EPOCHS '{e}': {err}"))?;
    }
    Ok(r)
}

/// The port's `main`: run with the command line's seed and epochs, print
/// the test accuracy, and fail below [`TARGET`].
pub fn main_of(name: &str, run: fn(&Run) -> Result<f64, Box<dyn Error>>) -> ExitCode {
    let result = run_from_args().and_then(|r| run(&r).map(|acc| (r, acc)));
    match result {
        Ok((r, acc)) => {
            println!("{name} seed {} epochs {}: test accuracy {acc:.4}", r.seed, r.epochs);
            if acc >= TARGET {
                ExitCode::SUCCESS
            } else {
                eprintln!("{name}: test accuracy {acc:.4} is below {TARGET}");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}
