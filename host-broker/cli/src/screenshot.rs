//! `dormouse screenshot` without `--scale`: the whole screen, saved as PNG,
//! JPEG or WebP (scaled screenshots are an action, in [`crate::actions`]);
//! with `--last`, the screen kept at the last stop.

use std::io::Write;
use std::path::Path;

use dormouse_client::Client;
use dormouse_protocol::image::ImageEncoding;

use crate::output::print_json;
use crate::{resolve, stdout, CliError};

/// Saves the screen kept at `id`'s last stop into `output`.
pub(crate) async fn last(
    client: &Client,
    id: &str,
    output: &Path,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let id = resolve(client, id).await?;
    let kept = client.last_screenshot(id).await?;
    save(output, &kept.image)?;
    if json {
        print_json(
            out,
            &serde_json::json!({ "id": id, "file": output, "bytes": kept.image.len(),
                                "media_type": "image/webp", "live": false,
                                "taken_at": kept.taken_at }),
        )
    } else {
        writeln!(
            out,
            "saved {} ({} bytes, image/webp): the screen at {}, not live",
            output.display(),
            kept.image.len(),
            kept.taken_at
        )
        .map_err(stdout)
    }
}

fn save(output: &Path, image: &[u8]) -> Result<(), CliError> {
    std::fs::write(output, image).map_err(|source| CliError::Io {
        path: output.to_owned(),
        source,
    })
}

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
    save(output, &image)?;
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
