//! `dormouse touch`: renews a desktop's idle timer.

use std::io::Write;

use dormouse_client::Client;

use crate::output::print_status;
use crate::{resolve, CliError};

/// Renews the idle timer of `id`.
pub(crate) async fn run(
    client: &Client,
    id: &str,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let id = resolve(client, id).await?;
    let status = client.touch(id).await?;
    print_status(out, &status, json)
}
