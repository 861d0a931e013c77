//! The `towers` command line: `towers train` and `towers compile`. The
//! flags live in `cli/args.rs`; each command in a module of its own.

use std::process::ExitCode;

use clap::Parser;

mod cli;

use cli::args::{Cli, Cmd};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = if cli.verbose { tracing::Level::DEBUG } else { tracing::Level::WARN };
    tracing_subscriber::fmt().with_max_level(level).with_writer(std::io::stderr).with_target(false).init();
    // TOWERS_SIMD names a path this CPU lacks: refused before anything runs.
    if let Err(e) = towers_kernels::simd::selected() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let r = match cli.cmd {
        Cmd::Train(a) => cli::train::run_train(a),
        Cmd::Compile(a) => cli::compile::run_compile(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
