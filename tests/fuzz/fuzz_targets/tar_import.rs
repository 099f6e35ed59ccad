//! The tar importer (`host-broker/core/src/workspace/archive/import.rs`,
//! with `compression.rs` before it: plain, gzip or zstd by the stream's
//! first bytes), through the broker's two entry points: a new workspace
//! from an archive, and an existing one replaced by it.
//!
//! Invariants: nothing is ever written beside the workspace (a sibling
//! directory stays byte for byte as it was, and no staging or set-aside
//! directory is left behind); a refused archive leaves an existing
//! workspace as it was and creates none; what was imported holds no
//! set-id, sticky or world-writable mode; a refusal is an error, never a
//! panic. Runs in a directory under /dev/shm (or `$DORMOUSE_FUZZ_TMP`), so
//! the importer's `syncfs` costs nothing.
#![no_main]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dormouse_core::workspace::archive::{create_from_tar, replace_from_tar, ImportLimits};
use dormouse_core::workspace::Owner;
use libfuzzer_sys::fuzz_target;

struct Site {
    _dir: tempfile::TempDir,
    base: PathBuf,
}

fn site() -> &'static Site {
    static SITE: OnceLock<Site> = OnceLock::new();
    SITE.get_or_init(|| {
        let parent = std::env::var_os("DORMOUSE_FUZZ_TMP")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/dev/shm"));
        let dir = tempfile::Builder::new()
            .prefix("dormouse-fuzz-tar")
            .tempdir_in(&parent)
            .or_else(|_| tempfile::tempdir())
            .unwrap_or_else(|e| panic!("a temporary directory: {e}"));
        let base = dir.path().to_owned();
        fs::create_dir(base.join("outside")).unwrap_or_else(|e| panic!("outside: {e}"));
        fs::write(base.join("outside/keep"), b"untouched").unwrap_or_else(|e| panic!("keep: {e}"));
        Site { _dir: dir, base }
    })
}

/// Every entry below `root`, never following a link: its path, its kind
/// and mode, and a file's content.
fn tree(root: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            let content = if meta.is_file() {
                fs::read(&path).unwrap_or_default()
            } else if meta.file_type().is_symlink() {
                fs::read_link(&path)
                    .map(|t| t.into_os_string().into_encoded_bytes())
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            if meta.is_dir() {
                stack.push(path.clone());
            }
            let rel = path.strip_prefix(root).unwrap_or(&path).to_owned();
            out.insert(rel, (meta.mode(), content));
        }
    }
    out
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|e| {
            e.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn check_imported(ws: &Path) {
    for (path, (mode, _)) in tree(ws) {
        let is_link = mode & 0o170000 == 0o120000;
        assert!(
            is_link || mode & 0o7002 == 0,
            "{path:?} was imported with mode {mode:o}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let site = site();
    let base = &site.base;
    let outside = tree(&base.join("outside"));
    let limits = ImportLimits {
        max_total_bytes: 1 << 20,
        max_entries: 256,
        owner: Owner {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        },
        ..ImportLimits::default()
    };

    // A new workspace from the archive.
    let ws = base.join("ws");
    let created = create_from_tar(&ws, data, &limits);
    match &created {
        Ok(_) => {
            assert_eq!(names(base), ["outside", "ws"]);
            check_imported(&ws);
            // The root of a created workspace is the owner's alone.
            let mode = fs::symlink_metadata(&ws).map(|m| m.permissions().mode());
            assert_eq!(mode.ok().map(|m| m & 0o777), Some(0o700));
        }
        Err(_) => assert_eq!(names(base), ["outside"], "a refused create left something"),
    }
    assert_eq!(
        tree(&base.join("outside")),
        outside,
        "the import wrote beside the workspace"
    );

    // An existing workspace replaced by it: all or nothing.
    let _ = fs::remove_dir_all(&ws);
    fs::create_dir(&ws).unwrap_or_else(|e| panic!("ws: {e}"));
    fs::write(ws.join("old"), b"before").unwrap_or_else(|e| panic!("old: {e}"));
    let before = tree(&ws);
    let replaced = replace_from_tar(&ws, data, &limits);
    assert_eq!(
        names(base),
        ["outside", "ws"],
        "a replace left something beside"
    );
    match &replaced {
        Ok(_) => check_imported(&ws),
        Err(e) => assert_eq!(
            tree(&ws),
            before,
            "a refused replace changed the workspace: {e}"
        ),
    }
    assert_eq!(
        created.is_ok(),
        replaced.is_ok(),
        "create and replace judged the archive apart"
    );
    assert_eq!(
        tree(&base.join("outside")),
        outside,
        "the import wrote beside the workspace"
    );
    let _ = fs::remove_dir_all(&ws);
});
