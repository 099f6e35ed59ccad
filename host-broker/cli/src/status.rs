//! `dormouse status`: one desktop's status, once or as it changes.

use std::io::Write;

use dormouse_client::Client;

use crate::output::print_status;
use crate::wait::watch_status;
use crate::{resolve, CliError};

/// Prints the status of `id`; with `watch`, every change of it.
pub(crate) async fn run(
    client: &Client,
    id: &str,
    watch: bool,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let id = resolve(client, id).await?;
    if watch {
        watch_status(client, id, json, out).await
    } else {
        let status = client.get(id).await?;
        print_status(out, &status, json)
    }
}
