//! What the CLI writes to its standard streams, without panicking.
//! `println!` panics when a write fails ("failed printing to stdout:
//! Broken pipe", exit 101): `towers train | head -2` and `towers compile |
//! head -c 10` did. Here a closed standard output (EPIPE, the reader is
//! gone) ends the process quietly with status 141, what a shell reports
//! for a Unix tool ended by SIGPIPE (`yes | head`); any other write error
//! of standard output (a full disk: `> /dev/full`) ends it with an error
//! naming the stream and status 1. A failed write to standard error is
//! ignored: there is nowhere left to report it.

use std::io::{ErrorKind, Write};

/// The status of a run whose standard output was closed by its reader.
pub const BROKEN_PIPE_STATUS: i32 = 141;

/// Write `text` to standard output and flush it, or end the process (see the module).
pub fn out(text: std::fmt::Arguments<'_>) {
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(text).and_then(|()| o.flush()) {
        drop(o);
        if e.kind() == ErrorKind::BrokenPipe {
            std::process::exit(BROKEN_PIPE_STATUS);
        }
        err(format_args!("error: cannot write to standard output: {e}\n"));
        std::process::exit(1);
    }
}

/// Write `text` to standard error; a failure is ignored.
pub fn err(text: std::fmt::Arguments<'_>) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_fmt(text).and_then(|()| e.flush());
}

/// `print!` to standard output without panicking.
macro_rules! out {
    ($($t:tt)*) => { $crate::cli::out::out(format_args!($($t)*)) };
}

/// `println!` to standard output without panicking.
macro_rules! outln {
    ($($t:tt)*) => { $crate::cli::out::out(format_args!("{}\n", format_args!($($t)*))) };
}

/// `eprintln!` to standard error without panicking.
macro_rules! errln {
    ($($t:tt)*) => { $crate::cli::out::err(format_args!("{}\n", format_args!($($t)*))) };
}
