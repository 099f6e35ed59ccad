//! Files of a workspace from the host: reads, listings, atomic writes and
//! deletes, and every hostile path and symlink case, each run through both
//! resolutions (`openat2` and the nofollow walk).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod workspace_support;

use std::fs;
use std::io::Read;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

use dormouse_broker::workspace::{
    delete, list_dir, make_dir, open, read_file, write_file, EntryType, ErrorClass, FilesConfig,
    Opened, Resolution, WorkspaceError, WorkspacePath, WorkspaceRoot, WriteOptions,
};
use workspace_support::Rig;

const BOTH: [Resolution; 2] = [Resolution::Openat2, Resolution::Walk];

fn p(s: &str) -> WorkspacePath {
    WorkspacePath::parse(s.as_bytes()).unwrap()
}

fn root(rig: &Rig, r: Resolution) -> WorkspaceRoot {
    WorkspaceRoot::open_with(&rig.ws(), r).unwrap()
}

fn read_all(root: &WorkspaceRoot, rel: &str) -> Result<Vec<u8>, WorkspaceError> {
    let f = read_file(root, &p(rel), &FilesConfig::default())?;
    let mut v = Vec::new();
    f.into_reader().read_to_end(&mut v).unwrap();
    Ok(v)
}

fn put(root: &WorkspaceRoot, rel: &str, body: &[u8]) -> Result<(), WorkspaceError> {
    write_file(
        root,
        &p(rel),
        body,
        WriteOptions::default(),
        &FilesConfig::default(),
    )
    .map(|_| ())
}

#[test]
fn read_list_write_delete_round_trip() {
    for r in BOTH {
        let rig = Rig::new();
        rig.write("docs/a.txt", b"alpha");
        rig.write("docs/sub/b.txt", b"beta");
        let root = root(&rig, r);
        assert_eq!(read_all(&root, "docs/a.txt").unwrap(), b"alpha");
        assert_eq!(read_all(&root, "docs/sub/b.txt").unwrap(), b"beta");

        let listing = list_dir(&root, &p("docs"), &FilesConfig::default()).unwrap();
        let names: Vec<_> = listing
            .entries
            .iter()
            .map(|e| (e.name.as_str(), e.kind))
            .collect();
        assert_eq!(
            names,
            vec![("a.txt", EntryType::File), ("sub", EntryType::Dir)]
        );
        assert_eq!(listing.entries[0].size, 5);
        assert!(!listing.truncated);
        let json = serde_json::to_value(&listing).unwrap();
        assert_eq!(json["entries"][0]["type"], "file");
        assert!(
            json["entries"][0]["mtime"].as_str().unwrap().ends_with('Z'),
            "{json}"
        );

        // The root lists through open() too.
        match open(&root, &WorkspacePath::root(), &FilesConfig::default()).unwrap() {
            Opened::Dir(l) => assert_eq!(l.entries.len(), 1),
            Opened::File(_) => panic!("the root is a directory"),
        }

        put(&root, "docs/a.txt", b"alpha 2").unwrap();
        assert_eq!(fs::read(rig.path("docs/a.txt")).unwrap(), b"alpha 2");
        write_file(
            &root,
            &p("new/deep/c.txt"),
            &b"gamma"[..],
            WriteOptions {
                create_parents: true,
                mode: Some(0o4777),
            },
            &FilesConfig::default(),
        )
        .unwrap();
        let meta = fs::metadata(rig.path("new/deep/c.txt")).unwrap();
        assert_eq!(
            meta.mode() & 0o7777,
            0o775,
            "set-id and world-write dropped"
        );
        assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
        let dir_meta = fs::metadata(rig.path("new/deep")).unwrap();
        assert_eq!(
            (dir_meta.uid(), dir_meta.gid(), dir_meta.mode() & 0o777),
            (1000, 1000, 0o755)
        );

        delete(&root, &p("docs/a.txt"), false, &FilesConfig::default()).unwrap();
        assert!(!rig.path("docs/a.txt").exists());
        let err = delete(&root, &p("docs"), false, &FilesConfig::default()).unwrap_err();
        assert!(matches!(err, WorkspaceError::NotEmpty { .. }), "{err}");
        assert_eq!(err.class(), ErrorClass::Conflict);
        let out = delete(&root, &p("docs"), true, &FilesConfig::default()).unwrap();
        assert_eq!(out.removed, 3);
        assert!(!rig.path("docs").exists());
        let err = read_all(&root, "docs/a.txt").unwrap_err();
        assert_eq!(err.class(), ErrorClass::NotFound, "{err}");
    }
}

#[test]
fn bad_paths_are_refused_before_touching_the_disk() {
    for bad in [
        "/etc/passwd",
        "../x",
        "a/../../x",
        "a//b",
        "./a",
        "a/.",
        "a/",
        "a\0b",
    ] {
        let err = WorkspacePath::parse(bad.as_bytes()).unwrap_err();
        assert_eq!(
            WorkspaceError::from(err).class(),
            ErrorClass::BadRequest,
            "{bad:?}"
        );
    }
    let long = "x/".repeat(2100) + "x";
    assert!(WorkspacePath::parse(long.as_bytes()).is_err());
    let rig = Rig::new();
    let root = root(&rig, Resolution::Openat2);
    let err = put(&root, "", b"x").unwrap_err();
    assert_eq!(err.class(), ErrorClass::BadRequest, "{err}");
    let err = delete(&root, &WorkspacePath::root(), true, &FilesConfig::default()).unwrap_err();
    assert_eq!(err.class(), ErrorClass::BadRequest, "{err}");
    assert!(rig.ws().exists());
}

/// A symlink pointing at `/` or at another computer's workspace, at the
/// last position or on the way, is never followed: reads and writes are
/// refused and the target is untouched.
#[test]
fn symlinks_to_root_or_another_workspace_are_never_followed() {
    for r in BOTH {
        let rig = Rig::new();
        let other = Rig::new();
        other.write("secret.txt", b"other computer's data");
        symlink("/", rig.path("to-root")).unwrap();
        symlink(other.ws(), rig.path("to-other")).unwrap();
        symlink("../", rig.path("up")).unwrap();
        symlink(other.path("secret.txt"), rig.path("secret-link")).unwrap();
        fs::create_dir(rig.path("real")).unwrap();
        symlink(other.ws(), rig.path("real/nested-link")).unwrap();
        let root = root(&rig, r);
        let before = workspace_support::snapshot(&other.ws());

        for rel in [
            "to-root/etc/passwd",
            "to-other/secret.txt",
            "up/workspace/../x",
            "secret-link",
            "real/nested-link/secret.txt",
        ] {
            if let Ok(path) = WorkspacePath::parse(rel.as_bytes()) {
                let err = read_file(&root, &path, &FilesConfig::default()).unwrap_err();
                assert!(
                    matches!(err, WorkspaceError::Symlink { .. }),
                    "{r:?} read {rel}: {err}"
                );
                assert_eq!(err.class(), ErrorClass::BadRequest);
            }
        }
        for rel in [
            "to-root/tmp/pwned",
            "to-other/secret.txt",
            "to-other/new.txt",
            "secret-link",
            "real/nested-link/new.txt",
        ] {
            let err = put(&root, rel, b"pwned").unwrap_err();
            assert!(
                matches!(err, WorkspaceError::Symlink { .. }),
                "{r:?} write {rel}: {err}"
            );
            let err = write_file(
                &root,
                &p(rel),
                &b"pwned"[..],
                WriteOptions {
                    create_parents: true,
                    mode: None,
                },
                &FilesConfig::default(),
            )
            .unwrap_err();
            assert!(
                matches!(err, WorkspaceError::Symlink { .. }),
                "{r:?} write -p {rel}: {err}"
            );
        }
        let err = list_dir(&root, &p("to-other"), &FilesConfig::default()).unwrap_err();
        assert!(matches!(err, WorkspaceError::Symlink { .. }), "{err}");
        for rel in ["to-other/secret.txt", "real/nested-link/secret.txt"] {
            let err = delete(&root, &p(rel), true, &FilesConfig::default()).unwrap_err();
            assert!(
                matches!(err, WorkspaceError::Symlink { .. }),
                "{r:?} delete {rel}: {err}"
            );
        }
        assert!(!std::path::Path::new("/tmp/pwned").exists());
        assert_eq!(
            workspace_support::snapshot(&other.ws()),
            before,
            "the other workspace is untouched"
        );

        // Listing shows links as links; deleting one removes the link only.
        let listing = list_dir(&root, &WorkspacePath::root(), &FilesConfig::default()).unwrap();
        let kinds: Vec<_> = listing
            .entries
            .iter()
            .map(|e| (e.name.as_str(), e.kind))
            .collect();
        assert!(
            kinds.contains(&("to-other", EntryType::Symlink)),
            "{kinds:?}"
        );
        delete(&root, &p("to-other"), true, &FilesConfig::default()).unwrap();
        delete(&root, &p("secret-link"), false, &FilesConfig::default()).unwrap();
        delete(&root, &p("real"), true, &FilesConfig::default()).unwrap();
        assert!(fs::symlink_metadata(rig.path("to-other")).is_err());
        assert_eq!(workspace_support::snapshot(&other.ws()), before);
    }
}

#[test]
fn a_recursive_delete_never_follows_links_inside_the_tree() {
    let rig = Rig::new();
    let other = Rig::new();
    other.write("keep/precious", b"x");
    rig.write("tree/a/b/file", b"y");
    symlink(other.path("keep"), rig.path("tree/a/link")).unwrap();
    let root = root(&rig, Resolution::Openat2);
    delete(&root, &p("tree"), true, &FilesConfig::default()).unwrap();
    assert!(!rig.path("tree").exists());
    assert_eq!(fs::read(other.path("keep/precious")).unwrap(), b"x");
}

#[test]
fn a_recursive_delete_over_its_bound_removes_nothing() {
    let rig = Rig::new();
    for i in 0..50 {
        rig.write(&format!("many/{i}"), b"");
    }
    let root = root(&rig, Resolution::Openat2);
    let cfg = FilesConfig {
        max_delete_entries: 20,
        ..FilesConfig::default()
    };
    let err = delete(&root, &p("many"), true, &cfg).unwrap_err();
    assert!(
        matches!(err, WorkspaceError::TooManyEntries { limit: 20, .. }),
        "{err}"
    );
    assert_eq!(err.class(), ErrorClass::TooLarge);
    assert_eq!(fs::read_dir(rig.path("many")).unwrap().count(), 50);
}

#[test]
fn directories_are_made_owned_by_desk_and_never_through_a_link() {
    for r in BOTH {
        let rig = Rig::new();
        rig.write("f.txt", b"a file");
        fs::create_dir(rig.dir.path().join("outside")).unwrap();
        symlink(rig.dir.path().join("outside"), rig.path("out")).unwrap();
        let root = root(&rig, r);
        let cfg = FilesConfig::default();

        let made = make_dir(&root, &p("reports"), false, &cfg).unwrap();
        assert_eq!((made.bytes, made.created), (0, true));
        let meta = fs::metadata(rig.path("reports")).unwrap();
        assert!(meta.is_dir());
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o777),
            (1000, 1000, 0o755)
        );
        let again = make_dir(&root, &p("reports"), false, &cfg).unwrap();
        assert!(!again.created, "an existing directory is no error");

        let missing = make_dir(&root, &p("a/b/c"), false, &cfg).unwrap_err();
        assert_eq!(missing.class(), ErrorClass::NotFound, "{missing}");
        assert!(make_dir(&root, &p("a/b/c"), true, &cfg).unwrap().created);
        assert!(rig.path("a/b/c").is_dir());
        assert_eq!(fs::metadata(rig.path("a/b")).unwrap().uid(), 1000);

        let file = make_dir(&root, &p("f.txt"), false, &cfg).unwrap_err();
        assert_eq!(file.class(), ErrorClass::BadRequest, "{file}");
        assert_eq!(fs::read(rig.path("f.txt")).unwrap(), b"a file");
        for through in ["out", "out/inside"] {
            let err = make_dir(&root, &p(through), true, &cfg).unwrap_err();
            assert_eq!(err.class(), ErrorClass::BadRequest, "{through}: {err}");
        }
        assert_eq!(
            fs::read_dir(rig.dir.path().join("outside"))
                .unwrap()
                .count(),
            0,
            "nothing was made through the link"
        );
    }
}

#[test]
fn writes_are_atomic_owned_by_desk_and_capped() {
    let rig = Rig::new();
    rig.write("f.txt", b"old content");
    fs::set_permissions(rig.path("f.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    // A hard link to the file: a write replaces the name, never the inode.
    fs::hard_link(rig.path("f.txt"), rig.path("hard.txt")).unwrap();
    let root = root(&rig, Resolution::Openat2);

    let out = write_file(
        &root,
        &p("f.txt"),
        &b"new content"[..],
        WriteOptions::default(),
        &FilesConfig::default(),
    )
    .unwrap();
    assert_eq!((out.bytes, out.created), (11, false));
    let meta = fs::metadata(rig.path("f.txt")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
    assert_eq!(
        meta.mode() & 0o777,
        0o600,
        "an existing file keeps its bits"
    );
    assert_eq!(fs::read(rig.path("f.txt")).unwrap(), b"new content");
    assert_eq!(fs::read(rig.path("hard.txt")).unwrap(), b"old content");

    let cfg = FilesConfig {
        max_write_bytes: 8,
        ..FilesConfig::default()
    };
    let err = write_file(
        &root,
        &p("f.txt"),
        &b"123456789"[..],
        WriteOptions::default(),
        &cfg,
    )
    .unwrap_err();
    assert!(
        matches!(err, WorkspaceError::TooLarge { limit: 8, .. }),
        "{err}"
    );
    assert_eq!(fs::read(rig.path("f.txt")).unwrap(), b"new content");
    let names: Vec<_> = fs::read_dir(rig.ws())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "no temp file left: {names:?}");

    let out = write_file(
        &root,
        &p("fresh"),
        &b""[..],
        WriteOptions::default(),
        &FilesConfig::default(),
    )
    .unwrap();
    assert!(out.created);
    let meta = fs::metadata(rig.path("fresh")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o777, meta.len()),
        (1000, 1000, 0o644, 0)
    );

    // A body that fails half-way leaves the old file and no temp file.
    struct Broken(u8);
    impl Read for Broken {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0 == 0 {
                return Err(std::io::Error::other("client went away"));
            }
            self.0 -= 1;
            buf[0] = b'z';
            Ok(1)
        }
    }
    write_file(
        &root,
        &p("f.txt"),
        Broken(3),
        WriteOptions::default(),
        &FilesConfig::default(),
    )
    .unwrap_err();
    assert_eq!(fs::read(rig.path("f.txt")).unwrap(), b"new content");
    assert_eq!(fs::read_dir(rig.ws()).unwrap().count(), 3);
}

#[test]
fn special_files_directories_and_big_files_are_refused_for_reading() {
    let rig = Rig::new();
    nix::unistd::mkfifo(
        &rig.path("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    rig.write("big", &[0u8; 100]);
    fs::create_dir(rig.path("d")).unwrap();
    let root = root(&rig, Resolution::Openat2);
    // Would block forever if the fifo were opened for reading without O_NONBLOCK.
    let err = read_all(&root, "fifo").unwrap_err();
    assert!(matches!(err, WorkspaceError::NotAFile { .. }), "{err}");
    let err = put(&root, "fifo", b"x").unwrap_err();
    assert!(matches!(err, WorkspaceError::NotAFile { .. }), "{err}");
    let err = read_all(&root, "d").unwrap_err();
    assert!(matches!(err, WorkspaceError::IsADirectory { .. }), "{err}");
    let err = put(&root, "d", b"x").unwrap_err();
    assert!(matches!(err, WorkspaceError::IsADirectory { .. }), "{err}");
    let cfg = FilesConfig {
        max_read_bytes: 99,
        ..FilesConfig::default()
    };
    let err = read_file(&root, &p("big"), &cfg).unwrap_err();
    assert_eq!(err.class(), ErrorClass::TooLarge);
    let err = read_all(&root, "big/x").unwrap_err();
    assert!(matches!(err, WorkspaceError::NotADirectory { .. }), "{err}");
}

#[test]
fn listings_are_bounded() {
    let rig = Rig::new();
    for i in 0..30 {
        rig.write(&format!("{i:02}"), b"");
    }
    let root = root(&rig, Resolution::Walk);
    let cfg = FilesConfig {
        max_list_entries: 10,
        ..FilesConfig::default()
    };
    let l = list_dir(&root, &WorkspacePath::root(), &cfg).unwrap();
    assert_eq!(l.entries.len(), 10);
    assert!(l.truncated);
}

/// The guest swaps a directory for a symlink to another workspace while the
/// host reads and writes through it: the other workspace is never touched.
#[test]
fn a_directory_swapped_for_a_link_while_resolving_is_never_followed() {
    for r in BOTH {
        let rig = Rig::new();
        let other = Rig::new();
        other.write("d/secret", b"other");
        fs::create_dir_all(rig.path("d")).unwrap();
        fs::write(rig.path("d/secret"), b"mine").unwrap();
        let before = workspace_support::snapshot(&other.ws());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flipper = {
            let (stop, ws, target) = (stop.clone(), rig.ws(), other.path("d"));
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = fs::rename(ws.join("d"), ws.join("d.real"));
                    let _ = symlink(&target, ws.join("d"));
                    let _ = fs::remove_file(ws.join("d"));
                    let _ = fs::rename(ws.join("d.real"), ws.join("d"));
                }
            })
        };
        let root = root(&rig, r);
        let mut read_other = 0;
        for _ in 0..2000 {
            if let Ok(v) = read_all(&root, "d/secret") {
                if v == b"other" {
                    read_other += 1;
                }
            }
            let _ = put(&root, "d/secret", b"mine");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        flipper.join().unwrap();
        assert_eq!(read_other, 0, "{r:?}: read through the link");
        assert_eq!(
            workspace_support::snapshot(&other.ws()),
            before,
            "{r:?}: wrote through the link"
        );
    }
}

/// The guest swaps a directory inside a tree for a link (to another
/// workspace) and back while the host deletes the tree recursively: every
/// answer is a success or a refusal that says why (`Changed`, a conflict,
/// or the tree already gone), never an I/O failure, and the other workspace
/// is never touched.
#[test]
fn a_recursive_delete_racing_a_directory_link_swap_answers_with_the_reason() {
    let rig = Rig::new();
    let other = Rig::new();
    other.write("keep/precious", b"x");
    let before = workspace_support::snapshot(&other.ws());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let (stop, ws, target) = (stop.clone(), rig.ws(), other.path("keep"));
        std::thread::spawn(move || {
            let (d, real) = (ws.join("t/d"), ws.join("t/d.real"));
            // The guest fills `d.real` (never a link), makes it `d`, then
            // puts a link to the other workspace where `d` was.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = fs::create_dir_all(real.join("e"));
                let _ = fs::write(real.join("e/f"), b"f");
                let _ = fs::rename(&real, &d);
                let _ = fs::rename(&d, &real);
                let _ = symlink(&target, &d);
                let _ = fs::remove_file(&d);
            }
        })
    };
    let root = root(&rig, Resolution::Openat2);
    let (mut done, mut changed, mut gone) = (0, 0, 0);
    let mut other_errors = Vec::new();
    for _ in 0..400 {
        // Never through `t/d` here: the host side must not follow it either.
        let _ = fs::create_dir_all(rig.path("t"));
        let _ = fs::write(rig.path("t/x"), b"x");
        match delete(&root, &p("t"), true, &FilesConfig::default()) {
            Ok(_) => done += 1,
            Err(WorkspaceError::Changed { .. }) => changed += 1,
            Err(WorkspaceError::NotFound { .. }) => gone += 1,
            Err(e) => other_errors.push((e.class(), e.to_string())),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flipper.join().unwrap();
    let internal: Vec<_> = other_errors
        .iter()
        .filter(|(class, _)| *class == ErrorClass::Internal)
        .collect();
    assert!(
        internal.is_empty(),
        "{} of 400 answered as I/O failures (500), e.g. {:?}",
        internal.len(),
        internal.first()
    );
    assert!(
        done > 0,
        "no delete succeeded ({changed} changed, {gone} gone, {other_errors:?})"
    );
    assert_eq!(
        workspace_support::snapshot(&other.ws()),
        before,
        "the other workspace was touched through the link"
    );
    // Once the guest stops, the tree goes.
    let _ = delete(&root, &p("t"), true, &FilesConfig::default());
    assert!(fs::symlink_metadata(rig.path("t")).is_err());
}
