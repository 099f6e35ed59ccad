//! `dormoused-faults`: `dormoused` with crash points, for the
//! crash-at-every-step test only. `DORMOUSE_FAULT=<operation>:<N>` makes it
//! abort at the Nth step of that operation ([`dormouse_core::faults`]).
//! Never shipped: it exists only with the `fault-injection` feature.

use std::process::ExitCode;

use clap::Parser as _;
use dormouse_broker::daemon::{self, DaemonArgs};

fn main() -> ExitCode {
    let args = DaemonArgs::parse();
    match dormouse_core::faults::arm_from_env() {
        Some((op, n)) => eprintln!("dormouse-fault: armed: {op} step {n}"),
        None => eprintln!("dormouse-fault: not armed (DORMOUSE_FAULT unset or malformed)"),
    }
    match daemon::main(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("dormoused-faults: {err}");
            ExitCode::FAILURE
        }
    }
}
