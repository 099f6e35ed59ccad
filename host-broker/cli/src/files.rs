//! `dormouse cp`, `files`, `disk`, `export` and `import`: a desktop's
//! workspace from the host, through the broker's workspace routes. None of
//! them wakes a stopped desktop (an export of a running one closes its
//! browsers first, unless `--no-quiesce`).
//!
//! Names that came from the workspace are printed escaped: the guest chose
//! them.

use std::io::Write;
use std::path::PathBuf;

use clap::Subcommand;
use dormouse_client::{Client, Fetched, Saved, Upload};
use dormouse_protocol::workspace::{Compression, EntryType};

use super::escape::Safe;
use super::{print_json, print_status, resolve, stdout, CliError};

/// The workspace subcommands (flattened into `dormouse`'s own).
#[derive(Debug, Clone, Subcommand)]
pub enum FilesCommand {
    /// Copy a file to or from a desktop's workspace: `cp ID:path LOCAL` or
    /// `cp LOCAL ID:path` (`-` is stdout or stdin). Works on a stopped
    /// desktop without starting it.
    Cp {
        /// Source: `ID:path` in the workspace, or a local file.
        src: String,
        /// Destination: a local file, or `ID:path` in the workspace.
        dst: String,
    },
    /// List a directory of a desktop's workspace (the root by default).
    Files {
        /// Id, unique id prefix, or name.
        id: String,
        /// Workspace-relative directory.
        #[arg(default_value = "")]
        path: String,
    },
    /// Disk usage of a desktop's workspace and container layer (measured
    /// now; never starts it or renews its idle timer).
    Disk {
        /// Id, unique id prefix, or name.
        id: String,
    },
    /// Write a tar of a desktop's workspace to stdout (or --output).
    Export {
        /// Id, unique id prefix, or name.
        id: String,
        /// Write here instead of stdout.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: Option<PathBuf>,
        /// Do not close a running desktop's browsers first (their profiles
        /// may then be inconsistent in the archive).
        #[arg(long)]
        no_quiesce: bool,
        /// Compress the archive: gzip, zstd or none (default: what the
        /// --output name says, `.tar.gz`/`.tgz` or `.tar.zst`; else none).
        #[arg(long, value_name = "HOW", value_parser = parse_compression)]
        compress: Option<Compression>,
    },
    /// Replace a stopped desktop's workspace with a tar read from stdin (or
    /// --input); with --new, create a desktop from it instead.
    Import {
        /// Id, unique id prefix, or name (not with --new).
        #[arg(required_unless_present = "new")]
        id: Option<String>,
        /// Read the tar from here instead of stdin.
        #[arg(short = 'i', long = "input", value_name = "FILE")]
        input: Option<PathBuf>,
        /// Create (and start) a new desktop from the archive.
        #[arg(long, conflicts_with = "id")]
        new: bool,
        /// With --new: its name.
        #[arg(long, requires = "new")]
        name: Option<String>,
        /// With --new: its owner key.
        #[arg(long, requires = "new")]
        owner: Option<String>,
        /// Compress a plain tar on its way to the broker: gzip or zstd. An
        /// input named `.tar.gz`, `.tgz` or `.tar.zst` is sent as it is
        /// (the broker reads gzip and zstd itself).
        #[arg(long, value_name = "HOW", value_parser = parse_compression)]
        compress: Option<Compression>,
    },
}

fn parse_compression(value: &str) -> Result<Compression, String> {
    Compression::parse(value).ok_or_else(|| "gzip, zstd or none".to_owned())
}

/// Runs one workspace subcommand.
pub(crate) async fn run(
    client: &Client,
    command: FilesCommand,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    match command {
        FilesCommand::Cp { src, dst } => match (remote(&src), remote(&dst)) {
            (Some(_), Some(_)) => Err(CliError::Usage(
                "cp copies between a workspace and a local file, not between two workspaces".into(),
            )),
            (None, None) => Err(CliError::Usage(
                "cp needs ID:path on one side (the workspace) and a local file on the other".into(),
            )),
            (Some((who, path)), None) => {
                let id = resolve(client, who).await?;
                let is_dir = || {
                    CliError::Failed(format!(
                        "{} is a directory (list it with `dormouse files`)",
                        Safe(path)
                    ))
                };
                if dst == "-" {
                    return match client.fetch_into(id, path, out).await? {
                        Saved::File(_) => Ok(()),
                        Saved::Dir(_) => Err(is_dir()),
                    };
                }
                // Streamed into the file, which is only created once the
                // broker answers with a file (a directory leaves nothing).
                let mut file = LazyFile::new(PathBuf::from(&dst));
                let saved = client.fetch_into(id, path, &mut file).await;
                let bytes = match saved? {
                    Saved::File(bytes) => bytes,
                    Saved::Dir(_) => return Err(is_dir()),
                };
                file.finish()?;
                if json {
                    print_json(
                        out,
                        &serde_json::json!({ "id": id, "file": dst, "bytes": bytes }),
                    )
                } else {
                    writeln!(out, "copied {bytes} bytes to {dst}").map_err(stdout)
                }
            }
            (None, Some((who, path))) => {
                let id = resolve(client, who).await?;
                let body = upload_plain(if src == "-" {
                    None
                } else {
                    Some(src.clone().into())
                })
                .await?;
                let written = client.write_file(id, path, body, true).await?;
                if json {
                    print_json(out, &written)
                } else {
                    writeln!(
                        out,
                        "{} {} bytes to {}:{}",
                        if written.created {
                            "created"
                        } else {
                            "replaced"
                        },
                        written.bytes,
                        id,
                        Safe(path)
                    )
                    .map_err(stdout)
                }
            }
        },
        FilesCommand::Files { id, path } => {
            let id = resolve(client, &id).await?;
            match client.fetch(id, &path).await? {
                Fetched::Dir(listing) if json => print_json(out, &listing),
                Fetched::Dir(listing) => {
                    for e in &listing.entries {
                        let kind = match e.kind {
                            EntryType::File => "-",
                            EntryType::Dir => "d",
                            EntryType::Symlink => "l",
                            EntryType::Other => "?",
                        };
                        writeln!(
                            out,
                            "{kind} {:>12} {} {}",
                            e.size,
                            e.mtime.format("%Y-%m-%d %H:%M:%S"),
                            Safe(&e.name)
                        )
                        .map_err(stdout)?;
                    }
                    if listing.truncated {
                        writeln!(out, "(more entries not listed)").map_err(stdout)?;
                    }
                    Ok(())
                }
                Fetched::File(_) => Err(CliError::Failed(format!(
                    "{} is a file (copy it with `dormouse cp`)",
                    Safe(&path)
                ))),
            }
        }
        FilesCommand::Disk { id } => {
            let id = resolve(client, &id).await?;
            let usage = client.disk(id).await?;
            if json {
                return print_json(out, &usage);
            }
            let layer = usage
                .layer_bytes
                .map_or_else(|| "unknown".to_owned(), |b| b.to_string());
            writeln!(
                out,
                "workspace {} bytes ({} apparent) in {} files; container layer {layer} bytes; \
                 {} bytes free; measured at {}{}",
                usage.workspace_bytes,
                usage.apparent_bytes,
                usage.workspace_files,
                usage.free_bytes,
                usage.measured_at.to_rfc3339(),
                if usage.complete {
                    ""
                } else {
                    " (incomplete: lower bounds)"
                }
            )
            .map_err(stdout)
        }
        FilesCommand::Export {
            id,
            output,
            no_quiesce,
            compress,
        } => {
            let id = resolve(client, &id).await?;
            let by_name = output
                .as_deref()
                .map(|p| Compression::of_file_name(&p.to_string_lossy()))
                .unwrap_or_default();
            let compression = compress.unwrap_or(by_name);
            match output {
                Some(file) => {
                    let mut f = std::fs::File::create(&file).map_err(|source| CliError::Io {
                        path: file.clone(),
                        source,
                    })?;
                    let bytes = client
                        .export_compressed(id, !no_quiesce, compression, &mut f)
                        .await?;
                    f.sync_all().map_err(|source| CliError::Io {
                        path: file.clone(),
                        source,
                    })?;
                    eprintln!("exported {bytes} bytes to {}", file.display());
                    Ok(())
                }
                None => client
                    .export_compressed(id, !no_quiesce, compression, out)
                    .await
                    .map(drop)
                    .map_err(Into::into),
            }
        }
        FilesCommand::Import {
            id,
            input,
            new,
            name,
            owner,
            compress,
        } => {
            let tar = upload_archive(input, compress).await?;
            if new {
                let status = client
                    .create_from_tar(name.as_deref(), owner.as_deref(), tar)
                    .await?;
                return print_status(out, &status, json);
            }
            let Some(id) = id else {
                return Err(CliError::Usage("import needs an ID or --new".into()));
            };
            let id = resolve(client, &id).await?;
            let summary = client.import(id, tar).await?;
            if json {
                print_json(out, &summary)
            } else {
                writeln!(
                    out,
                    "imported {} files and {} directories ({} bytes) into {id}",
                    summary.files, summary.dirs, summary.bytes
                )
                .map_err(stdout)
            }
        }
    }
}

/// `ID:path` → (`ID`, `path`); anything with a `/` before its first `:`,
/// or no `:`, is a local path (`./a:b` is local).
fn remote(arg: &str) -> Option<(&str, &str)> {
    let (who, path) = arg.split_once(':')?;
    (!who.is_empty() && !who.contains('/')).then_some((who, path))
}

/// A local file created on the first write (or by [`LazyFile::finish`],
/// for an empty one), so an answer that is not a file leaves none behind.
struct LazyFile {
    path: PathBuf,
    file: Option<std::fs::File>,
}

impl LazyFile {
    fn new(path: PathBuf) -> Self {
        Self { path, file: None }
    }

    fn open(&mut self) -> std::io::Result<&mut std::fs::File> {
        match &mut self.file {
            Some(f) => Ok(f),
            slot => Ok(slot.insert(std::fs::File::create(&self.path)?)),
        }
    }

    /// Creates the file if nothing was written, and syncs it.
    fn finish(mut self) -> Result<(), CliError> {
        let path = self.path.clone();
        self.open()
            .and_then(|f| f.sync_all())
            .map_err(|source| CliError::Io { path, source })
    }
}

impl Write for LazyFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.open()?.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.file {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

/// An archive from a local file, or stdin, streamed to the broker as it is
/// read (never held whole in memory); a file named as compressed is
/// labelled so, and `compress` compresses a plain one on the way.
async fn upload_archive(
    file: Option<PathBuf>,
    compress: Option<Compression>,
) -> Result<Upload, CliError> {
    let by_name = file
        .as_deref()
        .map(|p| Compression::of_file_name(&p.to_string_lossy()))
        .unwrap_or_default();
    let compress = compress.filter(|c| *c != Compression::None);
    match (compress, by_name) {
        (Some(asked), Compression::Gzip | Compression::Zstd) if asked != by_name => {
            return Err(CliError::Usage(format!(
                "the input is {} by its name; --compress is for a plain tar",
                by_name.name()
            )))
        }
        (Some(asked), Compression::None) => return compressing(file, asked),
        _ => {}
    }
    Ok(upload_plain(file).await?.compressed_as(by_name))
}

/// A local file, or stdin, streamed to the broker as it is read.
async fn upload_plain(file: Option<PathBuf>) -> Result<Upload, CliError> {
    match file {
        Some(path) => Upload::file(&path)
            .await
            .map_err(|source| CliError::Io { path, source }),
        None => Ok(Upload::reader(tokio::io::stdin())),
    }
}

/// An upload of `file` (or stdin) compressed as it is read, by a thread
/// writing into a pipe whose other end is streamed.
fn compressing(file: Option<PathBuf>, how: Compression) -> Result<Upload, CliError> {
    let pipe_err = |source| CliError::Io {
        path: PathBuf::from("<pipe>"),
        source,
    };
    let (reader, writer) = nix::unistd::pipe().map_err(|e| pipe_err(e.into()))?;
    let writer = std::fs::File::from(writer);
    let mut source: Box<dyn std::io::Read + Send> = match &file {
        Some(path) => Box::new(std::fs::File::open(path).map_err(|source| CliError::Io {
            path: path.clone(),
            source,
        })?),
        None => Box::new(std::io::stdin()),
    };
    std::thread::spawn(move || {
        // An error drops the pipe early: the upload breaks off and the
        // broker changes nothing.
        let result = match how {
            Compression::Zstd => zstd::stream::write::Encoder::new(writer, 3).and_then(|mut e| {
                std::io::copy(&mut source, &mut e)?;
                e.finish().map(drop)
            }),
            _ => {
                let mut e = flate2::write::GzEncoder::new(writer, flate2::Compression::new(3));
                std::io::copy(&mut source, &mut e).and_then(|_| e.finish().map(drop))
            }
        };
        if let Err(e) = result {
            eprintln!("dormouse: compressing the upload failed: {e}");
        }
    });
    let reader = tokio::fs::File::from_std(std::fs::File::from(reader));
    Ok(Upload::reader(reader).compressed_as(how))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_and_local_arguments_are_told_apart() {
        assert_eq!(remote("desk:notes/a.txt"), Some(("desk", "notes/a.txt")));
        assert_eq!(remote("./a:b"), None);
        assert_eq!(remote("/tmp/x"), None);
        assert_eq!(remote(":x"), None);
    }
}
