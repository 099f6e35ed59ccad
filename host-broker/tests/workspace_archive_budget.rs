//! Archive memory and time are bounded by budget, not by entry count:
//! a zstd archive of a million empty files under a 4 KiB-deep path
//! imports, and a workspace of 500,000 doubly linked inodes exports, each
//! in a child process whose peak RSS (`VmHWM`) stays under 128 MiB; an
//! archive whose directory times would take more than the memory budget is
//! refused with `413` naming it, the workspace unchanged; every
//! decompressed byte counts (an endless stream of global headers stops at
//! the limit); and a whole import has one time bound, however slowly its
//! bytes come.
//!
//! The heavy work runs in a child (this test binary again, running only
//! that test), so the figures are the archive code's, not the harness's
//! or the archive generator's. Each prints its peak RSS and time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod workspace_support;

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufReader, Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use dormouse_broker::workspace::{
    export_archive, export_check, replace_from_tar, Compression, ErrorClass, ImportLimits, Refusal,
    WorkspaceError, WorkspacePath, WorkspaceRoot,
};
use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;
use tar::EntryType;
use workspace_support::{pax_records, raw_header, snapshot, Rig};

/// Set in a child: which test's work to do, and where.
const CHILD: &str = "DORMOUSE_ARCHIVE_BUDGET_CHILD";
const ARCHIVE: &str = "DORMOUSE_ARCHIVE_BUDGET_ARCHIVE";
const WORKSPACE: &str = "DORMOUSE_ARCHIVE_BUDGET_WORKSPACE";

/// The peak RSS every child must stay under.
const PEAK_RSS_KIB: u64 = 128 * 1024;

/// Peak resident set of this process, in KiB.
fn peak_rss_kib() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM in /proc/self/status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Prints the figures a child reports, one line the parent parses.
fn report(figures: &[(&str, String)]) {
    let line: Vec<String> = figures.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("\nFIGURES {}", line.join(" "));
    io::stdout().flush().unwrap();
}

/// Runs the test `name` of this binary alone in a child with `env`, and
/// returns the figures it printed.
fn in_child(name: &str, env: &[(&str, &Path)]) -> BTreeMap<String, String> {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, name);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child {name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("FIGURES ").map(|(_, f)| f))
        .unwrap_or_else(|| panic!("no figures from {name}:\n{stdout}"));
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A workspace on tmpfs when there is one with room for a few million
/// inodes: a million files on a disk filesystem that recently freed
/// millions cost minutes in ext4's inode allocation alone, which is not
/// what these tests measure. Elsewhere the usual temporary directory.
fn fast_rig() -> Rig {
    let shm = Path::new("/dev/shm");
    let roomy = nix::sys::statvfs::statvfs(shm).is_ok_and(|v| v.files_available() > 2_500_000);
    let Some(dir) = roomy
        .then(|| {
            tempfile::Builder::new()
                .prefix("ws-test-")
                .tempdir_in(shm)
                .ok()
        })
        .flatten()
    else {
        return Rig::new();
    };
    fs::create_dir(dir.path().join("workspace")).unwrap();
    Rig { dir }
}

fn is_child(name: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|v| v == name)
}

fn env_path(key: &str) -> std::path::PathBuf {
    std::env::var_os(key).expect(key).into()
}

/// A tar generated entry by entry: `entry(i, out)` appends entry `i`'s
/// blocks, then the end marker follows. Nothing is kept but one entry.
struct Generated<F> {
    n: u64,
    next: u64,
    entry: F,
    buf: Vec<u8>,
    pos: usize,
}

impl<F: FnMut(u64, &mut Vec<u8>)> Generated<F> {
    fn new(n: u64, entry: F) -> Self {
        Self {
            n,
            next: 0,
            entry,
            buf: Vec::new(),
            pos: 0,
        }
    }
}

impl<F: FnMut(u64, &mut Vec<u8>)> Read for Generated<F> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
            if self.next < self.n {
                (self.entry)(self.next, &mut self.buf);
            } else if self.next == self.n {
                self.buf.resize(1024, 0);
            } else {
                return Ok(0);
            }
            self.next += 1;
        }
        let k = out.len().min(self.buf.len() - self.pos);
        out[..k].copy_from_slice(&self.buf[self.pos..self.pos + k]);
        self.pos += k;
        Ok(k)
    }
}

fn pad(out: &mut Vec<u8>) {
    out.resize(out.len().div_ceil(512) * 512, 0);
}

/// A PAX `path` record and the header of an empty `kind` entry at `path`.
fn deep_entry(out: &mut Vec<u8>, path: &[u8], kind: EntryType) {
    let records = pax_records(&[("path", path)]);
    let size = u64::try_from(records.len()).unwrap();
    out.extend_from_slice(raw_header(b"PaxHeaders/deep", EntryType::XHeader, size).as_bytes());
    out.extend_from_slice(&records);
    pad(out);
    out.extend_from_slice(raw_header(&path[..99], kind, 0).as_bytes());
}

/// The same with a GNU long name (`././@LongLink`) instead, as GNU tar
/// writes it.
fn long_name_entry(out: &mut Vec<u8>, path: &[u8], kind: EntryType) {
    let size = u64::try_from(path.len() + 1).unwrap();
    out.extend_from_slice(raw_header(b"././@LongLink", EntryType::GNULongName, size).as_bytes());
    out.extend_from_slice(path);
    out.push(0);
    pad(out);
    out.extend_from_slice(raw_header(&path[..99], kind, 0).as_bytes());
}

/// Sixteen directory names of 250 bytes: a 4,016-byte path.
fn deep_dir() -> Vec<u8> {
    let parts: Vec<String> = (0..16)
        .map(|i| format!("{i:02}{}", "d".repeat(248)))
        .collect();
    parts.join("/").into_bytes()
}

/// A file name that brings the path to 4,080 bytes.
fn deep_file(i: u64) -> String {
    format!("f{i:07}{}", "x".repeat(55))
}

const MILLION: u64 = 1_000_000;

/// A million empty files in one directory 4,016 bytes deep (each entry's
/// path of 4,080 bytes in a GNU long name, every tenth in a PAX `path`
/// record), as zstd: about 5.2 GB once decompressed. The old import kept
/// every path (4 GB); this one keeps none.
#[test]
fn a_million_empty_files_under_a_4_kib_deep_path_import_in_bounded_memory() {
    const NAME: &str = "a_million_empty_files_under_a_4_kib_deep_path_import_in_bounded_memory";
    let files: u64 = std::env::var("DORMOUSE_ARCHIVE_BUDGET_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(MILLION);
    if is_child(NAME) {
        let input = BufReader::new(fs::File::open(env_path(ARCHIVE)).unwrap());
        let started = Instant::now();
        let summary =
            replace_from_tar(&env_path(WORKSPACE), input, &ImportLimits::default()).unwrap();
        let elapsed = started.elapsed();
        // The deepest directory is over PATH_MAX from `/`: looked at by
        // descriptor.
        let root = WorkspaceRoot::open(&env_path(WORKSPACE)).unwrap();
        let deep = root
            .open_dir(&WorkspacePath::parse(&deep_dir()).unwrap())
            .unwrap();
        let last = fstatat(
            &deep,
            deep_file(files - 1).as_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .unwrap();
        assert_eq!(last.st_mode & 0o170_000, 0o100_000, "a regular file");
        report(&[
            ("files", summary.files.to_string()),
            ("dirs", summary.dirs.to_string()),
            ("peak_rss_kib", peak_rss_kib().to_string()),
            ("elapsed_ms", elapsed.as_millis().to_string()),
        ]);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("deep.tar.zst");
    let started = Instant::now();
    let dir = deep_dir();
    let tar = Generated::new(files, move |i, out| {
        let mut path = dir.clone();
        path.push(b'/');
        path.extend_from_slice(deep_file(i).as_bytes());
        if i % 10 == 0 {
            deep_entry(out, &path, EntryType::Regular);
        } else {
            long_name_entry(out, &path, EntryType::Regular);
        }
    });
    zstd::stream::copy_encode(tar, fs::File::create(&archive).unwrap(), 1).unwrap();
    let compressed = fs::metadata(&archive).unwrap().len();
    eprintln!(
        "{files} files: {compressed} bytes of zstd made in {:?}",
        started.elapsed()
    );

    let rig = fast_rig();
    rig.write("old.txt", b"replaced");
    let figures = in_child(NAME, &[(ARCHIVE, &archive), (WORKSPACE, &rig.ws())]);
    eprintln!("import of {files} deep files: {figures:?}");
    let peak: u64 = figures["peak_rss_kib"].parse().unwrap();
    assert_eq!(figures["files"], files.to_string());
    assert!(peak < PEAK_RSS_KIB, "peak RSS {peak} KiB");
    assert!(!rig.path("old.txt").exists());
    assert!(rig.siblings().is_empty(), "{:?}", rig.siblings());
}

/// Directories 4 KiB deep, each in a branch of its own, so their times
/// cost their whole path: past the 64 MiB budget (about 16,000 of them) the
/// archive is refused with 413 naming the budget, in bounded memory and
/// time, and the workspace is as it was.
#[test]
fn directory_times_past_the_memory_budget_are_refused_and_change_nothing() {
    const NAME: &str = "directory_times_past_the_memory_budget_are_refused_and_change_nothing";
    if is_child(NAME) {
        let input = BufReader::new(fs::File::open(env_path(ARCHIVE)).unwrap());
        let started = Instant::now();
        let err =
            replace_from_tar(&env_path(WORKSPACE), input, &ImportLimits::default()).unwrap_err();
        let WorkspaceError::Refused { reason, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(*reason, Refusal::OverBudget(64 << 20), "{err}");
        assert_eq!(err.class(), ErrorClass::TooLarge);
        let message = err.to_string();
        assert!(message.contains("memory budget"), "{message}");
        report(&[
            ("peak_rss_kib", peak_rss_kib().to_string()),
            ("elapsed_ms", started.elapsed().as_millis().to_string()),
        ]);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("dirs.tar.zst");
    let rest = deep_dir();
    // Twice what the budget holds; nothing past the refusal is read.
    let tar = Generated::new(40_000, |i, out| {
        let mut path = format!("t{i:07}/").into_bytes();
        path.extend_from_slice(&rest[..4000]);
        deep_entry(out, &path, EntryType::Directory);
    });
    zstd::stream::copy_encode(tar, fs::File::create(&archive).unwrap(), 1).unwrap();

    let rig = fast_rig();
    rig.write("notes/keep.txt", b"intact");
    let before = snapshot(&rig.ws());
    let figures = in_child(NAME, &[(ARCHIVE, &archive), (WORKSPACE, &rig.ws())]);
    eprintln!("refusal of 40,000 deep directories: {figures:?}");
    let peak: u64 = figures["peak_rss_kib"].parse().unwrap();
    assert!(peak < PEAK_RSS_KIB, "peak RSS {peak} KiB");
    assert_eq!(snapshot(&rig.ws()), before);
    assert!(rig.siblings().is_empty(), "{:?}", rig.siblings());
}

/// Counts what is written and keeps nothing.
#[derive(Default)]
struct Counted(u64);

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += u64::try_from(buf.len()).unwrap();
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// 500,000 files with two names each, the first names under `a/` and the
/// second under `b/`, so every first name is kept until the end: the
/// check and the export (as the API runs them) stay under 128 MiB, and a
/// budget too small for them is refused with 413 naming it.
#[test]
fn half_a_million_doubly_linked_inodes_export_in_bounded_memory() {
    const NAME: &str = "half_a_million_doubly_linked_inodes_export_in_bounded_memory";
    const INODES: u64 = 500_000;
    const PER_DIR: u64 = 1000;
    if is_child(NAME) {
        let root = WorkspaceRoot::open(&env_path(WORKSPACE)).unwrap();
        let started = Instant::now();
        // A million names and their directories are over the default
        // entry limit: raised, so the walk goes to the end.
        let limits = ImportLimits {
            max_entries: 2 * MILLION,
            ..ImportLimits::default()
        };
        let checked = export_check(&root, &limits).unwrap();
        let mut out = Counted::default();
        let summary = export_archive(&root, &mut out, Compression::Zstd, &limits).unwrap();
        assert_eq!(summary, checked);
        let elapsed = started.elapsed();
        let peak = peak_rss_kib();
        let small = ImportLimits {
            memory_budget: 4 << 20,
            ..limits.clone()
        };
        let err = export_check(&root, &small).unwrap_err();
        assert!(
            matches!(err, WorkspaceError::ExportOverBudget { budget, .. } if budget == 4 << 20),
            "{err}"
        );
        assert_eq!(err.class(), ErrorClass::TooLarge);
        assert!(err.to_string().contains("memory budget"), "{err}");
        report(&[
            ("files", summary.files.to_string()),
            ("hard_links", summary.hard_links.to_string()),
            ("archive_bytes", out.0.to_string()),
            ("peak_rss_kib", peak.to_string()),
            ("elapsed_ms", elapsed.as_millis().to_string()),
        ]);
        return;
    }
    let rig = fast_rig();
    let started = Instant::now();
    for d in 0..INODES / PER_DIR {
        let (a, b) = (
            rig.path(&format!("a/{d:03}")),
            rig.path(&format!("b/{d:03}")),
        );
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        for f in 0..PER_DIR {
            let first = a.join(format!("{f:04}"));
            fs::File::create(&first).unwrap();
            fs::hard_link(&first, b.join(format!("{f:04}"))).unwrap();
        }
    }
    eprintln!(
        "{INODES} doubly linked inodes made in {:?}",
        started.elapsed()
    );
    let figures = in_child(NAME, &[(WORKSPACE, &rig.ws())]);
    eprintln!("export of {INODES} doubly linked inodes: {figures:?}");
    assert_eq!(figures["files"], INODES.to_string());
    assert_eq!(figures["hard_links"], INODES.to_string());
    let peak: u64 = figures["peak_rss_kib"].parse().unwrap();
    assert!(peak < PEAK_RSS_KIB, "peak RSS {peak} KiB");
}

/// Global PAX headers holding only a comment change nothing and were not
/// counted: an endless zstd stream of them decompressed for as long as it
/// came. Every decompressed byte counts now, so it stops at the limit.
#[test]
fn an_endless_stream_of_global_headers_stops_at_the_decompressed_limit() {
    let record = pax_records(&[("comment", b"nothing to see")]);
    let size = u64::try_from(record.len()).unwrap();
    let mut block = raw_header(b"pax_global_header", EntryType::XGlobalHeader, size)
        .as_bytes()
        .to_vec();
    block.extend_from_slice(&record);
    pad(&mut block);
    let endless = Generated::new(u64::MAX, move |_, out| out.extend_from_slice(&block));
    let stream = zstd::stream::read::Encoder::new(endless, 1).unwrap();
    let limits = ImportLimits {
        max_total_bytes: 64 << 20,
        ..ImportLimits::default()
    };
    let rig = Rig::new();
    rig.write("keep.txt", b"intact");
    let before = snapshot(&rig.ws());
    let started = Instant::now();
    let err = replace_from_tar(&rig.ws(), stream, &limits).unwrap_err();
    eprintln!(
        "endless global headers refused in {:?}: {err}",
        started.elapsed()
    );
    assert!(
        matches!(&err, WorkspaceError::Refused { reason: Refusal::TooLarge(n), .. } if *n == 64 << 20),
        "{err}"
    );
    assert_eq!(err.class(), ErrorClass::TooLarge);
    assert_eq!(snapshot(&rig.ws()), before);
    assert!(rig.siblings().is_empty(), "{:?}", rig.siblings());
}

/// A valid archive that trickles in, one small file every 20 ms and never
/// ending: every read makes progress, so no per-read deadline would fire.
/// The whole import's bound does, and nothing changes.
#[test]
fn a_trickling_import_is_refused_at_its_whole_time_bound() {
    struct Slow<R>(R);
    impl<R: Read> Read for Slow<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            std::thread::sleep(Duration::from_millis(20));
            let n = buf.len().min(512);
            self.0.read(&mut buf[..n])
        }
    }
    let tar = Generated::new(u64::MAX, |i, out| {
        let name = format!("f{i:010}");
        out.extend_from_slice(raw_header(name.as_bytes(), EntryType::Regular, 0).as_bytes());
    });
    let limits = ImportLimits {
        max_duration: Duration::from_secs(1),
        ..ImportLimits::default()
    };
    let rig = Rig::new();
    rig.write("keep.txt", b"intact");
    let before = snapshot(&rig.ws());
    let started = Instant::now();
    let err = replace_from_tar(&rig.ws(), Slow(tar), &limits).unwrap_err();
    let took = started.elapsed();
    eprintln!("a trickling import refused after {took:?}: {err}");
    assert!(
        matches!(&err, WorkspaceError::Refused { reason: Refusal::TooSlow(d), .. } if *d == Duration::from_secs(1)),
        "{err}"
    );
    assert_eq!(err.class(), ErrorClass::TimedOut);
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(snapshot(&rig.ws()), before);
    assert!(rig.siblings().is_empty(), "{:?}", rig.siblings());
}
