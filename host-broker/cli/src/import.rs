//! `dormouse import`: replaces a stopped desktop's workspace with an
//! archive from stdin or a file, or creates a desktop from it (`--new`).
//! A file named `.tar.gz`, `.tgz` or `.tar.zst` is sent as it is; with
//! `--compress` a plain tar is compressed on its way.

use std::io::Write;
use std::path::PathBuf;

use dormouse_client::{Client, Upload};
use dormouse_protocol::workspace::Compression;

use crate::cp::upload_plain;
use crate::output::{print_json, print_status};
use crate::{resolve, stdout, CliError};

/// Where the archive goes.
#[derive(Debug)]
pub(crate) enum Target {
    /// A new desktop, with its name and owner.
    New {
        name: Option<String>,
        owner: Option<String>,
    },
    /// The stopped desktop with this id, prefix or name.
    Existing(String),
}

/// Sends the archive in `input` (stdin when `None`) to `target`.
pub(crate) async fn run(
    client: &Client,
    target: Target,
    input: Option<PathBuf>,
    compress: Option<Compression>,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let tar = upload_archive(input, compress).await?;
    let id = match target {
        Target::New { name, owner } => {
            let status = client
                .create_from_tar(name.as_deref(), owner.as_deref(), tar)
                .await?;
            return print_status(out, &status, json);
        }
        Target::Existing(id) => resolve(client, &id).await?,
    };
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
