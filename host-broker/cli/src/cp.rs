//! `dormouse cp`: a file to or from a desktop's workspace, streamed both
//! ways (`-` is stdout or stdin); a stopped desktop is not started.

use std::io::Write;
use std::path::PathBuf;

use dormouse_client::{Client, Saved, Upload};

use crate::escape::Safe;
use crate::output::print_json;
use crate::{resolve, stdout, CliError};

/// Copies `src` to `dst`, one of them `ID:path`.
pub(crate) async fn run(
    client: &Client,
    src: &str,
    dst: &str,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    match (remote(src), remote(dst)) {
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
            let mut file = LazyFile::new(PathBuf::from(dst));
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
            let body = upload_plain(if src == "-" { None } else { Some(src.into()) }).await?;
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

/// A local file, or stdin, streamed to the broker as it is read.
pub(crate) async fn upload_plain(file: Option<PathBuf>) -> Result<Upload, CliError> {
    match file {
        Some(path) => Upload::file(&path)
            .await
            .map_err(|source| CliError::Io { path, source }),
        None => Ok(Upload::reader(tokio::io::stdin())),
    }
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
