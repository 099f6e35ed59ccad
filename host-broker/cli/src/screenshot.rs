//! `dormouse screenshot` without `--scale`: the whole screen, saved as PNG
//! (scaled screenshots are an action, in [`crate::actions`]).

use std::io::Write;
use std::path::Path;

use dormouse_client::Client;

use crate::output::print_json;
use crate::{resolve, stdout, CliError};

/// Saves a screenshot of `id` into `output`.
pub(crate) async fn run(
    client: &Client,
    id: &str,
    output: &Path,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let id = resolve(client, id).await?;
    let png = client.screenshot(id).await?;
    std::fs::write(output, &png).map_err(|source| CliError::Io {
        path: output.to_owned(),
        source,
    })?;
    if json {
        print_json(
            out,
            &serde_json::json!({ "id": id, "file": output, "bytes": png.len() }),
        )
    } else {
        writeln!(out, "saved {} ({} bytes)", output.display(), png.len()).map_err(stdout)
    }
}
