//! Archives made by the real tools (GNU tar in its three formats, bsdtar,
//! Python's `tarfile` in each of its formats, `git archive`), imported
//! plain and gzip-compressed, and compared entry by entry with what
//! `tar -x` makes of the same archive; and the hostile archives of links
//! and compression, each refused whole with the workspace unchanged and no
//! host path in the message.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod workspace_support;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use dormouse_broker::workspace::{
    create_from_tar, export_archive, replace_from_tar, Compression, ErrorClass, ImportLimits,
    PathError, Refusal, WorkspaceError, WorkspaceRoot,
};
use tar::EntryType;
use workspace_support::{pax_records, raw_header, snapshot, Rig, Tar};

/// A tree with what real trees have: files, directories, an empty
/// directory, a relative and an absolute symlink, a hard-linked pair, an
/// executable bit, a non-ASCII name, a path longer than 100 bytes and a
/// sub-second modification time.
fn corpus_tree(root: &Path) {
    let write = |rel: &str, data: &[u8]| {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, data).unwrap();
    };
    write("docs/README.md", b"# read me\n");
    write("bin/run.sh", b"#!/bin/sh\necho run\n");
    fs::set_permissions(
        root.join("bin/run.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    write("data/a.bin", &[7u8; 5000]);
    fs::hard_link(root.join("data/a.bin"), root.join("data/a-hard.bin")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    write("ünïcødé/日本語.txt", "ü".repeat(100).as_bytes());
    // Over 100 bytes, yet splittable into ustar's prefix and name.
    let long = format!("{}/{}", "l".repeat(90), "f".repeat(70));
    write(&long, b"long path");
    symlink("docs/README.md", root.join("README")).unwrap();
    symlink("/usr/bin/python3", root.join("abs-link")).unwrap();
    symlink("../data/a.bin", root.join("bin/data-link")).unwrap();
    // A sub-second time (and fixed times elsewhere, so the second is
    // compared and not "now").
    for rel in [
        "docs/README.md",
        "bin/run.sh",
        "data/a.bin",
        "ünïcødé/日本語.txt",
    ] {
        touch(&root.join(rel), "@1700000000.123456789");
    }
    for rel in ["docs", "bin", "data", "empty", "ünïcødé"] {
        touch(&root.join(rel), "@1690000000.5");
    }
}

fn touch(path: &Path, when: &str) {
    let ok = Command::new("touch")
        .args(["-h", "-d", when])
        .arg(path)
        .status()
        .unwrap();
    assert!(ok.success());
}

/// One entry as compared: type, permission bits as the import keeps them,
/// size, mtime to the second, link target, and the first path of its
/// hard-link group.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Detail {
    kind: char,
    mode: u32,
    size: u64,
    mtime: i64,
    link: Option<PathBuf>,
    same_as: Option<PathBuf>,
}

/// Everything below `root`, never following links; modes masked as the
/// import masks them (files `& 0o775`, directories also `| 0o700`).
fn details(root: &Path) -> BTreeMap<PathBuf, Detail> {
    let mut out = BTreeMap::new();
    let mut inodes: HashMap<u64, PathBuf> = HashMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let mut names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_owned();
            let t = m.file_type();
            let (kind, mode, size, link) = if t.is_symlink() {
                ('l', 0, 0, Some(fs::read_link(&p).unwrap()))
            } else if t.is_dir() {
                stack.push(p.clone());
                ('d', (m.mode() & 0o775) | 0o700, 0, None)
            } else if t.is_file() {
                ('-', m.mode() & 0o775, m.len(), None)
            } else {
                ('?', 0, 0, None)
            };
            let same_as = (m.nlink() > 1 && !t.is_dir()).then(|| {
                let first = inodes.entry(m.ino()).or_insert_with(|| rel.clone());
                first.clone()
            });
            out.insert(
                rel,
                Detail {
                    kind,
                    mode,
                    size,
                    mtime: m.mtime(),
                    link,
                    same_as,
                },
            );
        }
    }
    // Name each group by its smallest path, whatever the walk's order.
    let mut smallest: HashMap<PathBuf, PathBuf> = HashMap::new();
    for (path, d) in &out {
        if let Some(first) = &d.same_as {
            let e = smallest
                .entry(first.clone())
                .or_insert_with(|| path.clone());
            if path < e {
                *e = path.clone();
            }
        }
    }
    for d in out.values_mut() {
        if let Some(first) = &d.same_as {
            d.same_as = Some(smallest[first].clone());
        }
    }
    out
}

fn piped(cmd: &mut Command, input: &[u8]) -> Vec<u8> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn output(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The archives of the corpus, by the tool and format that made them.
fn corpus(src: &Path) -> Vec<(String, Vec<u8>)> {
    let mut archives = Vec::new();
    for format in ["gnu", "ustar", "posix"] {
        let a = output(Command::new("tar").arg("-C").arg(src).args([
            &format!("--format={format}"),
            "-cf",
            "-",
            ".",
        ]));
        archives.push((format!("GNU tar --format={format}"), a));
    }
    let a = output(
        Command::new("bsdtar")
            .arg("-C")
            .arg(src)
            .args(["-cf", "-", "."]),
    );
    archives.push(("bsdtar".into(), a));
    for format in ["USTAR_FORMAT", "GNU_FORMAT", "PAX_FORMAT"] {
        let script = format!(
            "import sys, tarfile\n\
             t = tarfile.open(fileobj=sys.stdout.buffer, mode='w|', format=tarfile.{format})\n\
             t.add('.', recursive=True)\n\
             t.close()\n"
        );
        let a = output(
            Command::new("python3")
                .current_dir(src)
                .args(["-c", &script]),
        );
        archives.push((format!("python tarfile {format}"), a));
    }
    archives
}

/// A repository holding a link, archived by `git archive` (which writes a
/// global PAX header with the commit id, and directories, files and the
/// link at the commit's time).
fn git_archive() -> Vec<u8> {
    let repo = tempfile::tempdir().unwrap();
    let r = repo.path();
    fs::create_dir_all(r.join("docs")).unwrap();
    fs::write(r.join("docs/README.md"), "read me\n").unwrap();
    fs::write(r.join("tool.sh"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(
        r.join("tool.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    symlink("docs/README.md", r.join("README")).unwrap();
    let git = |args: &[&str]| {
        output(
            Command::new("git")
                .current_dir(r)
                .env("GIT_AUTHOR_DATE", "1700000000 +0000")
                .env("GIT_COMMITTER_DATE", "1700000000 +0000")
                .args([
                    "-c",
                    "user.name=corpus",
                    "-c",
                    "user.email=corpus@example.invalid",
                ])
                .args([
                    "-c",
                    "init.defaultBranch=main",
                    "-c",
                    "commit.gpgsign=false",
                ])
                .args(args),
        )
    };
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-qm", "corpus"]);
    git(&["archive", "--format=tar", "HEAD"])
}

fn gzip(data: &[u8]) -> Vec<u8> {
    piped(Command::new("gzip").args(["-c", "-n"]), data)
}

/// What GNU `tar -x` makes of `archive`, told its compression (it cannot
/// tell from a pipe).
fn tar_x_with(
    archive: &[u8],
    compression: Compression,
) -> (tempfile::TempDir, BTreeMap<PathBuf, Detail>) {
    extract_by("tar", archive, compression)
}

/// What `tool -x` makes of `archive` in a scratch directory.
fn extract_by(
    tool: &str,
    archive: &[u8],
    compression: Compression,
) -> (tempfile::TempDir, BTreeMap<PathBuf, Detail>) {
    let scratch = tempfile::tempdir().unwrap();
    let flag = match compression {
        Compression::None => "--no-auto-compress",
        Compression::Gzip => "--gzip",
        Compression::Zstd => "--zstd",
    };
    let mut cmd = Command::new(tool);
    cmd.arg("-C").arg(scratch.path());
    if tool == "tar" {
        cmd.arg(flag);
    }
    piped(cmd.args(["-xf", "-"]), archive);
    let d = details(scratch.path());
    (scratch, d)
}

fn imported(archive: &[u8]) -> (Rig, BTreeMap<PathBuf, Detail>) {
    let rig = Rig::new();
    rig.write("old", b"replaced");
    replace_from_tar(&rig.ws(), archive, &ImportLimits::default()).unwrap();
    let d = details(&rig.ws());
    (rig, d)
}

#[test]
fn archives_made_by_real_tools_import_as_tar_x_extracts_them() {
    let src = tempfile::tempdir().unwrap();
    corpus_tree(src.path());
    let mut archives = corpus(src.path());
    archives.push(("git archive".into(), git_archive()));
    for (label, archive) in archives {
        // bsdtar lists a directory's later entries apart from it (a hard
        // link after the directory was left); GNU tar then leaves that
        // directory with the time of extraction, bsdtar -x restores it. So
        // bsdtar's archives are compared with bsdtar -x, the rest with
        // GNU tar -x.
        let tool = if label == "bsdtar" { "bsdtar" } else { "tar" };
        let (_scratch, want) = extract_by(tool, &archive, Compression::None);
        assert!(want.len() >= 4, "{label}: tar -x made {want:?}");
        for (how, bytes) in [("plain", archive.clone()), ("gzip", gzip(&archive))] {
            let (rig, got) = imported(&bytes);
            assert_eq!(got, want, "{label}, {how}");
            assert!(rig.siblings().is_empty(), "{label}: {:?}", rig.siblings());
        }
        if label == "git archive" {
            assert_eq!(
                want[Path::new("README")].link.as_deref(),
                Some(Path::new("docs/README.md"))
            );
        } else {
            // tar -x made the pair one file, so the comparison above checked it.
            let pair = &want[Path::new("data/a.bin")];
            assert_eq!(
                pair.same_as.as_deref(),
                Some(Path::new("data/a-hard.bin")),
                "{label}"
            );
        }
    }
}

#[test]
fn the_corpus_tree_survives_an_export_and_import_in_every_compression() {
    let src = Rig::new();
    corpus_tree(&src.ws());
    let before = details(&src.ws());
    // The tree really holds what the corpus promises.
    assert_eq!(
        before[Path::new("README")].link.as_deref(),
        Some(Path::new("docs/README.md"))
    );
    assert_eq!(
        before[Path::new("data/a.bin")].same_as,
        before[Path::new("data/a-hard.bin")].same_as
    );
    let sub_second = fs::metadata(src.path("docs/README.md"))
        .unwrap()
        .mtime_nsec();
    assert_eq!(sub_second, 123_456_789);
    for compression in [Compression::None, Compression::Gzip, Compression::Zstd] {
        let root = WorkspaceRoot::open(&src.ws()).unwrap();
        let mut archive = Vec::new();
        let summary =
            export_archive(&root, &mut archive, compression, &ImportLimits::default()).unwrap();
        assert_eq!(
            (summary.symlinks, summary.hard_links),
            (3, 1),
            "{summary:?}"
        );
        // GNU tar reads every compression the export writes.
        let (_scratch, by_tar) = tar_x_with(&archive, compression);
        assert_eq!(by_tar, before, "{compression:?} through tar -x");
        let (dst, got) = imported(&archive);
        assert_eq!(got, before, "{compression:?}");
        // Sub-second times survive (a PAX record), links are links.
        let m = fs::metadata(dst.path("docs/README.md")).unwrap();
        assert_eq!(m.mtime_nsec(), 123_456_789, "{compression:?}");
        let dir = fs::metadata(dst.path("docs")).unwrap();
        assert_eq!(
            (dir.mtime(), dir.mtime_nsec()),
            (1_690_000_000, 500_000_000)
        );
        assert_eq!(
            fs::read_link(dst.path("abs-link")).unwrap(),
            Path::new("/usr/bin/python3")
        );
        for e in [
            "README",
            "abs-link",
            "data/a.bin",
            "data/a-hard.bin",
            "empty",
        ] {
            let m = fs::symlink_metadata(dst.path(e)).unwrap();
            assert_eq!((m.uid(), m.gid()), (1000, 1000), "{e}");
        }
    }
}

/// Runs `archive` against a workspace holding a marker: refused, the
/// workspace unchanged, nothing left beside it, no host path in the
/// message; and a create from it makes nothing. Returns the refusal.
fn refused_whole(archive: impl Fn() -> Box<dyn Read>, limits: &ImportLimits) -> (String, Refusal) {
    let rig = Rig::new();
    rig.write("marker", b"intact");
    let before = snapshot(&rig.ws());
    let err = replace_from_tar(&rig.ws(), archive(), limits).unwrap_err();
    let message = err.to_string();
    let host = rig.dir.path().to_string_lossy().into_owned();
    assert!(!message.contains(&host), "{message}");
    assert!(!message.contains("/tmp"), "{message}");
    assert_eq!(snapshot(&rig.ws()), before, "the workspace is intact");
    assert!(rig.siblings().is_empty(), "left over: {:?}", rig.siblings());
    let fresh = Rig::new();
    fs::remove_dir(fresh.ws()).unwrap();
    create_from_tar(&fresh.ws(), archive(), limits).unwrap_err();
    assert!(!fresh.ws().exists());
    assert!(fresh.siblings().is_empty(), "{:?}", fresh.siblings());
    match err {
        WorkspaceError::Refused { entry, reason } => (entry, reason),
        other => panic!("expected a refusal, got {other}"),
    }
}

fn bytes(data: Vec<u8>) -> impl Fn() -> Box<dyn Read> {
    move || Box::new(io::Cursor::new(data.clone()))
}

fn link_header(name: &[u8], kind: EntryType, target: &str) -> tar::Header {
    let mut h = raw_header(name, kind, 0);
    h.set_link_name_literal(target).unwrap();
    h.set_cksum();
    h
}

#[test]
fn links_that_would_reach_out_are_refused_whole() {
    let d = ImportLimits::default();
    // A hard link to ../../etc/passwd.
    let a = Tar::new()
        .file("fine", b"x")
        .raw(
            &link_header(b"passwd", EntryType::Link, "../../etc/passwd"),
            b"",
        )
        .finish();
    let (entry, reason) = refused_whole(bytes(a), &d);
    assert_eq!(entry, "passwd");
    assert_eq!(reason, Refusal::LinkTargetPath(PathError::ParentDir));
    // A symlink a -> /etc, then an entry a/passwd: never written through.
    for second in [
        Tar::new().file("a/passwd", b"root::0:0::/:/bin/sh\n"),
        Tar::new().dir("a/sub"),
        Tar::new().raw(&link_header(b"a/evil", EntryType::Symlink, "/"), b""),
    ] {
        let first = Tar::new().raw(&link_header(b"a", EntryType::Symlink, "/etc"), b"");
        let mut a = first.finish();
        a.truncate(a.len() - 1024); // drop the end marker, then append
        a.extend(second.finish());
        let (entry, reason) = refused_whole(bytes(a), &d);
        assert!(entry.starts_with("a/"), "{entry}");
        assert_eq!(reason, Refusal::ThroughSymlink("a".into()), "{entry}");
    }
    // A hard link through a symlink to something outside.
    let a = Tar::new()
        .raw(&link_header(b"etc", EntryType::Symlink, "/etc"), b"")
        .raw(&link_header(b"shadow", EntryType::Link, "etc/shadow"), b"")
        .finish();
    let (_, reason) = refused_whole(bytes(a), &d);
    assert_eq!(reason, Refusal::LinkTargetUnknown("etc/shadow".into()));
    // `..` inside a PAX linkpath of a hard link.
    let pax = pax_records(&[("linkpath", b"../outside")]);
    let a = Tar::new()
        .raw(
            &raw_header(b"PaxHeaders/l", EntryType::XHeader, pax.len() as u64),
            &pax,
        )
        .raw(&link_header(b"l", EntryType::Link, "harmless"), b"")
        .finish();
    let (_, reason) = refused_whole(bytes(a), &d);
    assert_eq!(reason, Refusal::LinkTargetPath(PathError::ParentDir));
    // A device node.
    let mut h = raw_header(b"null", EntryType::Char, 0);
    h.set_device_major(1).unwrap();
    h.set_device_minor(3).unwrap();
    h.set_cksum();
    let (_, reason) = refused_whole(bytes(Tar::new().raw(&h, b"").finish()), &d);
    assert_eq!(reason, Refusal::Device);
}

#[test]
fn links_inside_the_archive_are_made_and_never_followed() {
    let a = Tar::new()
        .file("target", b"t")
        .raw(&link_header(b"rel", EntryType::Symlink, "target"), b"")
        .raw(&link_header(b"root", EntryType::Symlink, "/"), b"")
        .raw(
            &link_header(b"dangling", EntryType::Symlink, "no/such/thing"),
            b"",
        )
        .raw(&link_header(b"hard", EntryType::Link, "./target"), b"")
        .raw(&link_header(b"hard-to-link", EntryType::Link, "root"), b"")
        .finish();
    let rig = Rig::new();
    let summary = replace_from_tar(&rig.ws(), &a[..], &ImportLimits::default()).unwrap();
    assert_eq!(
        (summary.files, summary.symlinks, summary.hard_links),
        (1, 3, 2)
    );
    assert_eq!(fs::read_link(rig.path("root")).unwrap(), Path::new("/"));
    assert_eq!(
        fs::read_link(rig.path("dangling")).unwrap(),
        Path::new("no/such/thing")
    );
    assert_eq!(
        fs::metadata(rig.path("hard")).unwrap().ino(),
        fs::metadata(rig.path("target")).unwrap().ino()
    );
    // A hard link to a symlink names the symlink, not what it points to.
    let m = fs::symlink_metadata(rig.path("hard-to-link")).unwrap();
    assert!(m.file_type().is_symlink());
    assert_eq!(
        m.ino(),
        fs::symlink_metadata(rig.path("root")).unwrap().ino()
    );
    // Link times are the archive's (raw_header's), set without following.
    assert_eq!(
        fs::symlink_metadata(rig.path("rel")).unwrap().mtime(),
        1_700_000_000
    );
}

/// A stream that compresses as it is read, so a bomb never exists whole.
fn lazy_gzip(input: impl Read + Clone + 'static) -> impl Fn() -> Box<dyn Read> {
    move || {
        Box::new(flate2::read::GzEncoder::new(
            input.clone(),
            flate2::Compression::fast(),
        ))
    }
}

#[derive(Clone)]
struct Zeros(u64);

impl Read for Zeros {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = usize::try_from(self.0).unwrap_or(usize::MAX).min(buf.len());
        buf[..n].fill(0);
        self.0 -= n as u64;
        Ok(n)
    }
}

#[test]
fn a_gzip_bomb_is_refused_at_the_limit_with_nothing_written() {
    // 10 GiB of zeros: an end-of-archive marker, then far too much after it.
    let (entry, reason) = refused_whole(lazy_gzip(Zeros(10 << 30)), &ImportLimits::default());
    assert!(entry.starts_with("the end after"), "{entry}");
    assert!(matches!(reason, Refusal::TrailingData(_)), "{reason:?}");
    assert_eq!(reason.class(), ErrorClass::TooLarge);
    // A header announcing 10 GiB of zeros against a 1 MiB limit: refused at
    // the header, on the decompressed size.
    let header = raw_header(b"zeros.img", EntryType::Regular, 10 << 30);
    let limits = ImportLimits {
        max_total_bytes: 1 << 20,
        ..ImportLimits::default()
    };
    let head = header.as_bytes().to_vec();
    let make = move || -> Box<dyn Read> {
        Box::new(flate2::read::GzEncoder::new(
            io::Cursor::new(head.clone()).chain(Zeros(10 << 30)),
            flate2::Compression::fast(),
        ))
    };
    let (entry, reason) = refused_whole(make, &limits);
    assert_eq!(entry, "zeros.img");
    assert_eq!(reason, Refusal::TooLarge(1 << 20));
    assert_eq!(reason.class(), ErrorClass::TooLarge);
}

fn sample_tar() -> Vec<u8> {
    Tar::new()
        .file(
            "a",
            &(0..200_000u32)
                .map(|i| (i * 7 % 251) as u8)
                .collect::<Vec<_>>(),
        )
        .file("b", b"bee")
        .finish()
}

#[test]
fn zstd_with_a_forged_size_and_cut_gzip_are_refused() {
    let d = ImportLimits::default();
    let tar = sample_tar();
    // zstd whose frame header claims a content size it does not have.
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.set_pledged_src_size(Some(tar.len() as u64)).unwrap();
    enc.include_contentsize(true).unwrap();
    enc.write_all(&tar).unwrap();
    let mut z = enc.finish().unwrap();
    assert_eq!(&z[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
    let fhd = z[4];
    let single = (fhd >> 5) & 1 == 1;
    let dict = [0usize, 1, 2, 4][usize::from(fhd & 3)];
    let fcs_at = 5 + usize::from(!single) + dict;
    assert!(fhd >> 6 != 0 || single, "the frame carries its size");
    z[fcs_at] ^= 0x10;
    let (_, reason) = refused_whole(bytes(z.clone()), &d);
    assert_eq!(reason, Refusal::Corrupt("zstd"));
    // The honest frame imports.
    z[fcs_at] ^= 0x10;
    let rig = Rig::new();
    replace_from_tar(&rig.ws(), &z[..], &d).unwrap();
    assert_eq!(fs::read(rig.path("b")).unwrap(), b"bee");
    // A gzip member cut in its trailer, and in its middle.
    let gz = gzip(&tar);
    let (_, reason) = refused_whole(bytes(gz[..gz.len() - 4].to_vec()), &d);
    assert_eq!(reason, Refusal::Corrupt("gzip"));
    let (_, reason) = refused_whole(bytes(gz[..gz.len() / 2].to_vec()), &d);
    assert!(
        matches!(reason, Refusal::Corrupt("gzip") | Refusal::Truncated),
        "{reason:?}"
    );
    // A zstd stream cut short.
    let (_, reason) = refused_whole(bytes(z[..z.len() / 2].to_vec()), &d);
    assert!(
        matches!(reason, Refusal::Corrupt("zstd") | Refusal::Truncated),
        "{reason:?}"
    );
}

#[test]
fn streams_that_are_no_tar_say_what_they_are() {
    let d = ImportLimits::default();
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("f.txt"), "zip me").unwrap();
    let zip = output(Command::new("python3").current_dir(dir.path()).args([
        "-c",
        "import zipfile,sys\nz=zipfile.ZipFile(sys.stdout.buffer,'w')\nz.write('f.txt')\nz.close()",
    ]));
    let xz = piped(Command::new("xz").args(["-c"]), &sample_tar());
    let text = b"this is just some text, not an archive\n".repeat(50);
    let gz_text = gzip(&text);
    for (label, data, said) in [
        ("zip", zip, "this is a zip archive, not a tar"),
        ("xz", xz, "xz is not supported (only gzip and zstd are)"),
        ("text", text, "not a tar archive"),
        ("gzip of text", gz_text, "not a tar archive"),
    ] {
        let (entry, reason) = refused_whole(bytes(data), &d);
        assert_eq!(reason.to_string(), said, "{label} ({entry})");
    }
}
