//! `dormoused --activity-argv redacted|full|none`: `redacted` by default,
//! each mode reaches the core's configuration, anything else is a usage
//! error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use clap::Parser as _;
use dormouse_broker::daemon::DaemonArgs;
use dormouse_protocol::activity::argv::ArgvRecord;

fn mode(args: &[&str]) -> ArgvRecord {
    DaemonArgs::try_parse_from(args)
        .expect("flags parse")
        .broker_config(PathBuf::from("/nonexistent"))
        .activity_argv
}

#[test]
fn the_flag_chooses_what_activity_keeps_of_an_argv() {
    assert_eq!(mode(&["dormoused"]), ArgvRecord::Redacted);
    for (given, want) in [
        ("redacted", ArgvRecord::Redacted),
        ("full", ArgvRecord::Full),
        ("none", ArgvRecord::None),
    ] {
        assert_eq!(mode(&["dormoused", "--activity-argv", given]), want);
    }
    let err = DaemonArgs::try_parse_from(["dormoused", "--activity-argv", "all"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("redacted, full or none"), "{err}");
}
