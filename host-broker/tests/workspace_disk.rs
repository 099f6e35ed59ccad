//! Disk usage of a workspace, checked against `du`, `df` and `statvfs`
//! taken independently.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod workspace_support;

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::symlink;
use std::time::Duration;

use dormouse_broker::workspace::{disk_usage, WorkspaceRoot, DEFAULT_DISK_DEADLINE};
use workspace_support::{run, Rig};

fn du(args: &[&str], path: &std::path::Path) -> u64 {
    let mut all: Vec<&str> = args.to_vec();
    let p = path.to_str().unwrap();
    all.push(p);
    run("du", &all)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn figures_match_du_and_statvfs() {
    let rig = Rig::new();
    rig.write("a/small.txt", b"hello");
    rig.write("a/b/c/one-mib", &vec![7u8; 1 << 20]);
    rig.write("empty", b"");
    for i in 0..100 {
        rig.write(&format!("many/{i}"), &vec![1u8; i * 100]);
    }
    // Hard links are counted once.
    fs::hard_link(rig.path("a/b/c/one-mib"), rig.path("hard-1")).unwrap();
    fs::hard_link(rig.path("a/b/c/one-mib"), rig.path("a/hard-2")).unwrap();
    // A sparse file: apparent 64 MiB, allocated a few KiB.
    let mut f = fs::File::create(rig.path("sparse")).unwrap();
    f.seek(SeekFrom::Start(64 << 20)).unwrap();
    f.write_all(b"end").unwrap();
    drop(f);
    // Links to big trees outside are not followed.
    symlink("/", rig.path("to-root")).unwrap();
    symlink("/usr", rig.path("a/to-usr")).unwrap();
    nix::unistd::mkfifo(
        &rig.path("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();

    let root = WorkspaceRoot::open(&rig.ws()).unwrap();
    let usage = disk_usage(&root, DEFAULT_DISK_DEADLINE).unwrap();
    assert!(usage.complete);
    assert_eq!(usage.layer_bytes, None);
    assert_eq!(
        usage.workspace_bytes,
        du(&["-s", "-B1"], &rig.ws()),
        "allocated = du -sB1"
    );
    assert_eq!(
        usage.apparent_bytes,
        du(&["-s", "-b"], &rig.ws()),
        "apparent = du -sb"
    );
    assert_eq!(
        usage.workspace_files + 1,
        du(&["-s", "--inodes"], &rig.ws()),
        "inodes = du -s --inodes, minus the root"
    );
    assert!(
        usage.apparent_bytes > 64 << 20 && usage.workspace_bytes < 8 << 20,
        "{usage:?}"
    );

    // free_bytes against statvfs(3) through another binding and df(1).
    let vfs = nix::sys::statvfs::statvfs(&rig.ws()).unwrap();
    let statvfs_free = vfs.blocks_available() * vfs.fragment_size();
    let df_free: u64 = run("df", &["-B1", "--output=avail", rig.ws().to_str().unwrap()])
        .lines()
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Other writers share the filesystem: allow 256 MiB of drift.
    let drift = 256 << 20;
    assert!(
        usage.free_bytes.abs_diff(statvfs_free) < drift,
        "{} vs statvfs {statvfs_free}",
        usage.free_bytes
    );
    assert!(
        usage.free_bytes.abs_diff(df_free) < drift,
        "{} vs df {df_free}",
        usage.free_bytes
    );

    let json = serde_json::to_value(&usage).unwrap();
    for key in [
        "workspace_bytes",
        "workspace_files",
        "layer_bytes",
        "free_bytes",
        "measured_at",
    ] {
        assert!(json.get(key).is_some(), "{key} in {json}");
    }
}

#[test]
fn a_walk_past_its_deadline_says_incomplete() {
    let rig = Rig::new();
    for i in 0..200 {
        rig.write(&format!("d{}/f{i}", i % 10), b"x");
    }
    let root = WorkspaceRoot::open(&rig.ws()).unwrap();
    let usage = disk_usage(&root, Duration::ZERO).unwrap();
    assert!(!usage.complete);
    assert!(usage.workspace_files < 210);
    let usage = disk_usage(&root, DEFAULT_DISK_DEADLINE).unwrap();
    assert!(usage.complete);
    assert_eq!(usage.workspace_files, 210);
}
