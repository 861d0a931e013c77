//! The `towers` command line: `towers train` and `towers compile`. The
//! flags live in `cli/args.rs`; each command in a module of its own.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

mod cli;

use cli::args::{Cli, Cmd};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // -v: towers' own crates (towers, towers_passes, towers_runtime, ...: a
    // target prefix) at DEBUG, the libraries' (egg's e-graph internals,
    // hundreds of lines a compile) at WARN, so the pass timings stand out.
    let level = if cli.verbose { tracing::Level::DEBUG } else { tracing::Level::WARN };
    let filter = Targets::new().with_default(tracing::Level::WARN).with_target("towers", level);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_target(false)
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .with(filter)
        .init();
    // TOWERS_SIMD names a path this CPU lacks: refused before anything runs.
    if let Err(e) = towers_kernels::simd::selected() {
        cli::out::err(format_args!("error: {e}\n"));
        return ExitCode::FAILURE;
    }
    let r = match cli.cmd {
        Cmd::Train(a) => cli::train::run_train(a),
        Cmd::Compile(a) => cli::compile::run_compile(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            cli::out::err(format_args!("error: {e}\n"));
            ExitCode::FAILURE
        }
    }
}
