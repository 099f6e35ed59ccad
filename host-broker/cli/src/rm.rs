//! `dormouse rm`: removes a desktop, its workspace kept unless purged.

use std::io::Write;

use dormouse_client::Client;

use crate::output::print_json;
use crate::{resolve, stdout, CliError};

/// Removes `id` (and with `purge` its workspace).
pub(crate) async fn run(
    client: &Client,
    id: &str,
    purge: bool,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let id = resolve(client, id).await?;
    client.remove(id, purge).await?;
    if json {
        print_json(out, &serde_json::json!({ "removed": id, "purged": purge }))
    } else {
        writeln!(
            out,
            "removed {id}{}",
            if purge {
                " and its workspace"
            } else {
                " (workspace kept)"
            }
        )
        .map_err(stdout)
    }
}
