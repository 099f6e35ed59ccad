//! `dormouse stop`: stops a desktop (quiesced first, by the broker).

use std::io::Write;

use dormouse_client::Client;

use crate::output::print_status;
use crate::{resolve, CliError};

/// Stops `id`.
pub(crate) async fn run(
    client: &Client,
    id: &str,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let id = resolve(client, id).await?;
    let status = client.stop(id).await?;
    print_status(out, &status, json)
}
