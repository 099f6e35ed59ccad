//! The workspace path resolver (`host-broker/core/src/workspace/path.rs`)
//! and what feeds it: a files route's URL path and query as the HTTP
//! handlers read them (percent-decoding included), then the path resolved
//! below a workspace that holds symlinks to the outside, to its own
//! parent and to the root, with both resolutions (`openat2` and the
//! component walk).
//!
//! Invariants: a parsed path is clean (no empty, `.` or `..` component, no
//! NUL, within the limits) and parses back to itself; a directory opened
//! by either resolution is inside the workspace (by device and inode);
//! both resolutions agree; nothing through a symlink is ever opened.
#![no_main]

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt as _};
use std::path::PathBuf;
use std::sync::OnceLock;

use axum::extract::Request;
use dormouse_core::workspace::path::{MAX_COMPONENTS, MAX_NAME_BYTES, MAX_PATH_BYTES};
use dormouse_core::workspace::{Resolution, WorkspacePath, WorkspaceRoot};
use dormouse_fuzz::split_at_byte;
use libfuzzer_sys::fuzz_target;

struct Fixture {
    _dir: tempfile::TempDir,
    roots: [WorkspaceRoot; 2],
    /// (device, inode) of every directory inside the workspace.
    inside: HashSet<(u64, u64)>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let ws = dir.path().join("ws");
        let make = |p: PathBuf| fs::create_dir_all(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
        make(dir.path().join("outside/secret"));
        for d in ["a/b/c", "a/d", "e", ".hidden", "sp ace", "x/y"] {
            make(ws.join(d));
        }
        fs::write(ws.join("a/f"), b"file").unwrap_or_else(|e| panic!("a/f: {e}"));
        fs::write(ws.join("e/g"), b"file").unwrap_or_else(|e| panic!("e/g: {e}"));
        let link = |target: &str, at: &str| {
            symlink(target, ws.join(at)).unwrap_or_else(|e| panic!("{at}: {e}"));
        };
        link("/", "root");
        link("..", "up");
        link("../outside", "out");
        link(&dir.path().join("outside").display().to_string(), "abs");
        link("a", "l");
        link("../..", "a/b/upup");
        link("b", "a/lb");
        link("/etc", "a/b/c/etc");
        link("f", "a/lf");
        link("missing", "e/dangling");
        let mut inside = HashSet::new();
        let mut stack = vec![ws.clone()];
        while let Some(d) = stack.pop() {
            let meta = fs::symlink_metadata(&d).unwrap_or_else(|e| panic!("{d:?}: {e}"));
            inside.insert((meta.dev(), meta.ino()));
            for entry in fs::read_dir(&d).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
        let open = |r| WorkspaceRoot::open_with(&ws, r).unwrap_or_else(|e| panic!("root: {e}"));
        Fixture {
            roots: [open(Resolution::Openat2), open(Resolution::Walk)],
            inside,
            _dir: dir,
        }
    })
}

fn check_clean(path: &WorkspacePath) {
    let bytes = path.as_bytes();
    assert!(bytes.len() <= MAX_PATH_BYTES);
    assert!(!bytes.contains(&0));
    assert!(path.depth() <= MAX_COMPONENTS);
    if !path.is_root() {
        for name in bytes.split(|b| *b == b'/') {
            assert!(
                !name.is_empty() && name != b"." && name != b"..",
                "{path:?}"
            );
            assert!(name.len() <= MAX_NAME_BYTES);
        }
    }
    assert_eq!(WorkspacePath::parse(bytes).as_ref(), Ok(path));
}

fn resolve(path: &WorkspacePath) {
    let fixture = fixture();
    let mut seen = Vec::new();
    for root in &fixture.roots {
        let opened = root.open_dir(path).map(|fd| {
            let st = nix::sys::stat::fstat(&fd).unwrap_or_else(|e| panic!("fstat: {e}"));
            (st.st_dev, st.st_ino)
        });
        if let Ok(id) = opened {
            assert!(
                fixture.inside.contains(&id),
                "{path:?} resolved outside the workspace ({:?})",
                root.resolution()
            );
        }
        seen.push(opened.map_err(|e| e.to_string()));
        if let Ok((parent, name)) = root.open_parent(path) {
            let st = nix::sys::stat::fstat(&parent).unwrap_or_else(|e| panic!("fstat: {e}"));
            assert!(fixture.inside.contains(&(st.st_dev, st.st_ino)));
            assert!(!name.is_empty());
        }
    }
    assert_eq!(
        seen[0].is_ok(),
        seen[1].is_ok(),
        "the resolutions disagree on {path:?}: {seen:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    // The raw bytes, as an archive entry's name reaches the parser.
    if let Ok(path) = WorkspacePath::parse(data) {
        check_clean(&path);
        resolve(&path);
    }
    // The URL path of a files route, then its query, as the handlers read
    // them (`?` separates them; the rest of the input after a NUL).
    let (raw, _) = split_at_byte(data, 0);
    if let Some(bytes) = dormouse_http::fuzzing::files_percent_decode(raw) {
        if let Ok(path) = WorkspacePath::parse(&bytes) {
            check_clean(&path);
        }
    }
    let Ok(text) = std::str::from_utf8(raw) else {
        return;
    };
    let uri = format!("/v1/computers/67e55044-10b1-426f-9247-bb680e5fe0c8/files/{text}");
    let Ok(request) = Request::builder().uri(uri).body(axum::body::Body::empty()) else {
        return;
    };
    if let Ok((path, _query)) = dormouse_http::fuzzing::files_target(&request) {
        check_clean(&path);
        resolve(&path);
    }
});
