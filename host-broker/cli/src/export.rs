//! `dormouse export`: a tar of a desktop's workspace to stdout or a file,
//! compressed as `--compress` or the file's name (`.tar.gz`, `.tgz`,
//! `.tar.zst`) says.

use std::io::Write;
use std::path::PathBuf;

use dormouse_client::Client;
use dormouse_protocol::workspace::Compression;

use crate::{resolve, CliError};

/// Exports `id` into `output` (stdout when `None`).
pub(crate) async fn run(
    client: &Client,
    id: &str,
    output: Option<PathBuf>,
    quiesce: bool,
    compress: Option<Compression>,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let id = resolve(client, id).await?;
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
                .export_compressed(id, quiesce, compression, &mut f)
                .await?;
            f.sync_all().map_err(|source| CliError::Io {
                path: file.clone(),
                source,
            })?;
            eprintln!("exported {bytes} bytes to {}", file.display());
            Ok(())
        }
        None => client
            .export_compressed(id, quiesce, compression, out)
            .await
            .map(drop)
            .map_err(Into::into),
    }
}
