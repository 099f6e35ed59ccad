//! The workspace subcommands (`cp`, `files`, `disk`, `export`, `import`)
//! and the two that live here, `files` and `disk`: a desktop's workspace
//! from the host, through the broker's workspace routes. None of them
//! wakes a stopped desktop (an export of a running one closes its browsers
//! first, unless `--no-quiesce`). `cp`, `export` and `import` have files of
//! their own.
//!
//! Names that came from the workspace are printed escaped: the guest chose
//! them.

use std::io::Write;
use std::path::PathBuf;

use clap::Subcommand;
use dormouse_client::{Client, Fetched};
use dormouse_protocol::workspace::{Compression, EntryType};

use super::escape::Safe;
use super::{print_json, resolve, stdout, CliError};

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
        FilesCommand::Cp { src, dst } => crate::cp::run(client, &src, &dst, json, out).await,
        FilesCommand::Files { id, path } => {
            let id = resolve(client, &id).await?;
            // A file's bytes are not wanted: none of them is read.
            let fetched = match client.fetch_within(id, &path, 0).await {
                Err(dormouse_client::Error::TooLarge { .. }) => Fetched::File(Vec::new()),
                other => other?,
            };
            match fetched {
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
        } => crate::export::run(client, &id, output, !no_quiesce, compress, out).await,
        FilesCommand::Import {
            id,
            input,
            new,
            name,
            owner,
            compress,
        } => {
            let target = match (new, id) {
                (true, _) => crate::import::Target::New { name, owner },
                (false, Some(id)) => crate::import::Target::Existing(id),
                (false, None) => return Err(CliError::Usage("import needs an ID or --new".into())),
            };
            crate::import::run(client, target, input, compress, json, out).await
        }
    }
}
