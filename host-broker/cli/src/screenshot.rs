//! `dormouse screenshot` without `--scale`: the whole screen, saved as PNG,
//! JPEG or WebP (scaled screenshots are an action, in [`crate::actions`]).

use std::io::Write;
use std::path::Path;

use dormouse_client::Client;
use dormouse_protocol::image::ImageEncoding;

use crate::output::print_json;
use crate::{resolve, stdout, CliError};

/// Saves a screenshot of `id` into `output`.
pub(crate) async fn run(
    client: &Client,
    id: &str,
    encoding: ImageEncoding,
    output: &Path,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let id = resolve(client, id).await?;
    let (image, media_type) = client.screenshot_as(id, encoding).await?;
    std::fs::write(output, &image).map_err(|source| CliError::Io {
        path: output.to_owned(),
        source,
    })?;
    if json {
        print_json(
            out,
            &serde_json::json!({ "id": id, "file": output, "bytes": image.len(),
                                "media_type": media_type }),
        )
    } else {
        writeln!(
            out,
            "saved {} ({} bytes, {media_type})",
            output.display(),
            image.len()
        )
        .map_err(stdout)
    }
}
