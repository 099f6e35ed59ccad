//! An export is bounded by what the import accepts: a sparse file that
//! costs no disk counts at its full size, and a workspace whose archive the
//! import would refuse (too much file content, too many entries) is refused
//! by [`export_check`] before a byte is sent, and ends an export that meets
//! it without reading it. Within the bounds a sparse file is exported as
//! plain data (the import takes no holes) and imports again whole.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod workspace_support;

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt as _;

use dormouse_broker::workspace::{
    export_archive, export_check, replace_from_tar, Compression, ErrorClass, ImportLimits,
    WorkspaceError, WorkspaceRoot,
};
use workspace_support::Rig;

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

fn sparse(rig: &Rig, rel: &str, size: u64) {
    rig.write(rel, b"");
    fs::File::options()
        .write(true)
        .open(rig.path(rel))
        .unwrap()
        .set_len(size)
        .unwrap();
    let meta = fs::metadata(rig.path(rel)).unwrap();
    assert_eq!(meta.len(), size);
    assert!(meta.blocks() * 512 < 1 << 20, "the file is sparse");
}

#[test]
fn a_huge_sparse_file_is_refused_before_anything_is_read() {
    let rig = Rig::new();
    rig.write("notes.txt", b"keep me");
    sparse(&rig, "big.img", 100 << 30);
    let root = WorkspaceRoot::open(&rig.ws()).unwrap();
    let limits = ImportLimits::default();

    let err = export_check(&root, &limits).unwrap_err();
    assert!(
        matches!(&err, WorkspaceError::ExportTooLarge { path, size, .. }
            if path == "big.img" && *size == 100 << 30),
        "{err}"
    );
    assert_eq!(err.class(), ErrorClass::TooLarge);
    let message = err.to_string();
    assert!(
        message.contains("sparse") && message.contains("big.img"),
        "{message}"
    );

    // An export that meets it anyway (the file appeared after the check)
    // ends there without reading it: a few headers, no 100 GiB.
    let started = std::time::Instant::now();
    let mut out = Counted::default();
    let err = export_archive(&root, &mut out, Compression::None, &limits).unwrap_err();
    assert!(
        matches!(err, WorkspaceError::ExportTooLarge { .. }),
        "{err}"
    );
    assert!(
        out.0 < 64 * 1024,
        "{} bytes written before the refusal",
        out.0
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "the refusal read the file: {:?}",
        started.elapsed()
    );
}

#[test]
fn within_the_bounds_a_sparse_file_exports_as_data_and_imports_whole() {
    let rig = Rig::new();
    sparse(&rig, "disk.img", 4 << 20);
    rig.write("a.txt", b"alpha");
    let root = WorkspaceRoot::open(&rig.ws()).unwrap();
    let limits = ImportLimits {
        max_total_bytes: 8 << 20,
        ..ImportLimits::default()
    };
    let checked = export_check(&root, &limits).unwrap();
    assert_eq!((checked.files, checked.bytes), (2, (4 << 20) + 5));

    let mut archive = Vec::new();
    let summary = export_archive(&root, &mut archive, Compression::None, &limits).unwrap();
    assert_eq!(
        (summary.files, summary.bytes),
        (checked.files, checked.bytes)
    );
    assert!(
        archive.len() < (4 << 20) + 64 * 1024,
        "the archive is bounded by the content: {} bytes",
        archive.len()
    );

    let dst = Rig::new();
    replace_from_tar(&dst.ws(), &archive[..], &limits).unwrap();
    let copy = fs::read(dst.path("disk.img")).unwrap();
    assert_eq!(copy.len(), 4 << 20);
    assert!(copy.iter().all(|b| *b == 0));
    assert_eq!(fs::read(dst.path("a.txt")).unwrap(), b"alpha");
}

#[test]
fn content_or_entries_past_the_import_limits_are_refused_by_name() {
    let rig = Rig::new();
    for i in 0..10 {
        rig.write(&format!("f{i}"), b"0123456789");
    }
    let root = WorkspaceRoot::open(&rig.ws()).unwrap();

    let few = ImportLimits {
        max_entries: 5,
        ..ImportLimits::default()
    };
    let err = export_check(&root, &few).unwrap_err();
    assert!(
        matches!(err, WorkspaceError::ExportTooLarge { max_entries: 5, .. }),
        "{err}"
    );

    // Every byte of the archive counts, as the import counts it (headers,
    // PAX records, padding, the end marker): one byte less than the whole
    // archive is crossed by the last file.
    let mut full = Vec::new();
    export_archive(
        &root,
        &mut full,
        Compression::None,
        &ImportLimits::default(),
    )
    .unwrap();
    let len = u64::try_from(full.len()).unwrap();
    let small = ImportLimits {
        max_total_bytes: len - 1,
        ..ImportLimits::default()
    };
    let err = export_check(&root, &small).unwrap_err();
    assert!(
        matches!(&err, WorkspaceError::ExportTooLarge { path, max_bytes, .. } if path == "f9" && *max_bytes == len - 1),
        "the last file crosses {len} - 1 bytes: {err}"
    );
    // Exactly at the limit passes, and what the export writes imports.
    let exact = ImportLimits {
        max_total_bytes: len,
        max_entries: 10,
        ..ImportLimits::default()
    };
    export_check(&root, &exact).unwrap();
    let mut archive = Vec::new();
    export_archive(&root, &mut archive, Compression::None, &exact).unwrap();
    assert_eq!(archive.len(), full.len());
    replace_from_tar(&Rig::new().ws(), &archive[..], &exact).unwrap();
}
