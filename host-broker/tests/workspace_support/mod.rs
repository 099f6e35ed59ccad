//! Shared pieces of the workspace tests: temp workspaces laid out like the
//! broker's (`<dir>/workspace`), tree snapshots to compare, and hand-made
//! tar headers for archives no honest tool would write.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A computer directory with a `workspace` in it, removed on drop.
pub struct Rig {
    pub dir: tempfile::TempDir,
}

impl Rig {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ws-test-")
            .tempdir()
            .unwrap();
        fs::create_dir(dir.path().join("workspace")).unwrap();
        fs::set_permissions(
            dir.path().join("workspace"),
            fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        Self { dir }
    }

    pub fn ws(&self) -> PathBuf {
        self.dir.path().join("workspace")
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.ws().join(rel)
    }

    pub fn write(&self, rel: &str, content: &[u8]) {
        let p = self.path(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }

    /// Names in the computer directory besides the workspace (staging and
    /// set-aside copies must not linger).
    pub fn siblings(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "workspace")
            .collect();
        v.sort();
        v
    }
}

/// One entry of a snapshot: kind, permission bits, content or link target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir(u32),
    File(u32, Vec<u8>),
    Link(PathBuf),
    Other,
}

/// Everything below `root`, never following links.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Node>) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        let meta = fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(root).unwrap().to_owned();
        let mode = meta.mode() & 0o7777;
        let node = if meta.file_type().is_symlink() {
            Node::Link(fs::read_link(&p).unwrap())
        } else if meta.is_dir() {
            walk(root, &p, out);
            Node::Dir(mode)
        } else if meta.is_file() {
            Node::File(mode, fs::read(&p).unwrap())
        } else {
            Node::Other
        };
        out.insert(rel, node);
    }
}

/// Runs a command, returns stdout; panics with stderr on failure.
pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A GNU header with `name` written as raw bytes (the tar crate refuses to
/// set absolute or `..` paths, which is what these tests need).
pub fn raw_header(name: &[u8], kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(1_700_000_000);
    let field = &mut h.as_old_mut().name;
    field.fill(0);
    field[..name.len()].copy_from_slice(name);
    h.set_cksum();
    h
}

/// Raw bytes of a PAX record set.
pub fn pax_records(records: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in records {
        let body_len = 1 + k.len() + 1 + v.len() + 1;
        let mut len = body_len + 1;
        while body_len + len.to_string().len() != len {
            len = body_len + len.to_string().len();
        }
        out.extend_from_slice(format!("{len} {k}=").as_bytes());
        out.extend_from_slice(v);
        out.push(b'\n');
    }
    out
}

/// An archive builder over a Vec that writes headers as given.
pub struct Tar {
    pub b: tar::Builder<Vec<u8>>,
}

impl Tar {
    pub fn new() -> Self {
        Self {
            b: tar::Builder::new(Vec::new()),
        }
    }

    /// A regular file, honest header.
    pub fn file(mut self, name: &str, content: &[u8]) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(content.len() as u64);
        h.set_mode(0o644);
        self.b.append_data(&mut h, name, content).unwrap();
        self
    }

    /// A directory, honest header.
    pub fn dir(mut self, name: &str) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        h.set_mode(0o755);
        self.b.append_data(&mut h, name, std::io::empty()).unwrap();
        self
    }

    /// Any header as given, with `data`.
    pub fn raw(mut self, header: &tar::Header, data: &[u8]) -> Self {
        self.b.append(header, data).unwrap();
        self
    }

    pub fn finish(self) -> Vec<u8> {
        self.b.into_inner().unwrap()
    }
}
