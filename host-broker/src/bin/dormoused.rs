//! `dormoused`: the Dormouse host broker daemon. A thin shell over
//! [`dormouse_broker::daemon`]: parse flags, run, turn the outcome into an
//! exit code (0 clean stop, 1 failure, 2 usage, as clap sets).

use std::process::ExitCode;

use clap::Parser as _;
use dormouse_broker::daemon::{self, DaemonArgs};

fn main() -> ExitCode {
    let args = DaemonArgs::parse();
    match daemon::main(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("dormoused: {err}");
            ExitCode::FAILURE
        }
    }
}
