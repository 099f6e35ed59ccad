//! Export and import throughput of a workspace: builds a 200 MiB workspace
//! (40 files of 4 MiB and 10,240 of 4 KiB in 64 directories), then times
//! an export into a file, an export through the channel an HTTP body would
//! read, an import from the file and an import through the channel.
//!
//! `cargo run -p dormouse-broker --example workspace_throughput [DIR]`
//! (DIR: where to build it, default the system temp directory). Figures are
//! with a warm page cache. Each phase starts after a `sync(2)`, so it pays
//! only for its own writes; the import's figure includes its `syncfs`
//! (the staged tree is durable before the swap), and the export into a
//! file is fsynced to compare like with like.

use std::fs;
use std::io::{self, Read, Write};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use dormouse_broker::workspace::{
    export_tar, replace_from_tar, ChannelReader, ChannelWriter, ImportLimits, WorkspaceRoot,
};

const MIB: f64 = 1024.0 * 1024.0;

fn fill(ws: &Path) -> Result<u64> {
    let mut total = 0u64;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut noise = |buf: &mut [u8]| {
        for chunk in buf.chunks_mut(8) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let bytes = seed.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    };
    let mut big = vec![0u8; 4 << 20];
    let mut small = vec![0u8; 4 << 10];
    for d in 0..64 {
        let dir = ws.join(format!("dir-{d:02}"));
        fs::create_dir_all(&dir)?;
        for f in 0..160 {
            noise(&mut small);
            fs::write(dir.join(format!("small-{f:03}")), &small)?;
            total += small.len() as u64;
        }
    }
    for f in 0..40 {
        noise(&mut big);
        fs::write(ws.join(format!("dir-{:02}/big-{f:02}", f % 64)), &big)?;
        total += big.len() as u64;
    }
    Ok(total)
}

fn rate(bytes: u64, started: Instant) -> String {
    let secs = started.elapsed().as_secs_f64();
    format!("{:>7.1} MiB/s ({:.2} s)", bytes as f64 / MIB / secs, secs)
}

fn main() -> Result<()> {
    let base = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new()
        .prefix("ws-bench-")
        .tempdir_in(&base)?;
    let src = dir.path().join("src/workspace");
    let dst = dir.path().join("dst/workspace");
    fs::create_dir_all(&src)?;
    fs::create_dir_all(&dst)?;
    let content = fill(&src).context("building the workspace")?;
    println!(
        "workspace: {:.0} MiB of content in 10,280 files",
        content as f64 / MIB
    );

    let root = WorkspaceRoot::open(&src)?;
    let tar_path = dir.path().join("ws.tar");
    nix::unistd::sync();
    let started = Instant::now();
    let mut out = io::BufWriter::with_capacity(1 << 20, fs::File::create(&tar_path)?);
    export_tar(&root, &mut out)?;
    out.flush()?;
    out.get_ref().sync_all()?;
    drop(out);
    let tar_len = fs::metadata(&tar_path)?.len();
    println!(
        "export to a file:        {}  tar {:.0} MiB",
        rate(content, started),
        tar_len as f64 / MIB
    );

    nix::unistd::sync();
    let started = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<dormouse_broker::workspace::stream::Chunk>(16);
    let reader = std::thread::spawn(move || {
        let mut n = 0u64;
        while let Some(Ok(chunk)) = rx.blocking_recv() {
            n += chunk.len() as u64;
        }
        n
    });
    let mut writer = ChannelWriter::new(tx, 256 * 1024);
    export_tar(&root, &mut writer)?;
    writer.finish()?;
    let streamed = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))?;
    anyhow::ensure!(
        streamed == tar_len,
        "channel carried {streamed} bytes, file has {tar_len}"
    );
    println!("export through channel:  {}", rate(content, started));

    nix::unistd::sync();
    let started = Instant::now();
    let input = io::BufReader::with_capacity(1 << 20, fs::File::open(&tar_path)?);
    let summary = replace_from_tar(&dst, input, &ImportLimits::default())?;
    println!(
        "import from a file:      {}  ({} files)",
        rate(content, started),
        summary.files
    );

    nix::unistd::sync();
    let started = Instant::now();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let feeder = {
        let tar_path = tar_path.clone();
        std::thread::spawn(move || -> io::Result<()> {
            let mut f = fs::File::open(tar_path)?;
            loop {
                let mut buf = vec![0u8; 256 * 1024];
                let n = f.read(&mut buf)?;
                if n == 0 {
                    return Ok(());
                }
                buf.truncate(n);
                if tx.blocking_send(Ok(buf)).is_err() {
                    return Ok(());
                }
            }
        })
    };
    replace_from_tar(&dst, ChannelReader::new(rx), &ImportLimits::default())?;
    feeder
        .join()
        .map_err(|_| anyhow::anyhow!("feeder panicked"))??;
    println!(
        "import through channel:  {}  (replacing the previous import)",
        rate(content, started)
    );
    Ok(())
}
