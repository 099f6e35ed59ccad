//! `dormouse ls`: every desktop, as a table or JSON.

use std::io::Write;

use dormouse_client::Client;

use crate::output::{print_json, print_table};
use crate::CliError;

/// Lists the desktops.
pub(crate) async fn run(
    client: &Client,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let list = client.list().await?;
    if json {
        print_json(out, &list)
    } else {
        print_table(out, &list)
    }
}
