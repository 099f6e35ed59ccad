//! `dormouse activity`: what was done to a desktop and by whom, newest
//! first, one line an entry (or the broker's JSON with `--json`).

use std::io::Write;

use dormouse_client::Client;

use crate::escape::Safe;
use crate::output::print_json;
use crate::{resolve, stdout, CliError};

/// Prints the last `limit` entries of `id`'s activity.
pub(crate) async fn run(
    client: &Client,
    id: &str,
    limit: usize,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let id = resolve(client, id).await?;
    let page = client.activity(id, limit).await?;
    if json {
        return print_json(out, &page);
    }
    for e in &page.entries {
        let at = e.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let actor = e.actor.to_string();
        writeln!(
            out,
            "{:>6}  {at}  {:<24}  {}",
            e.seq,
            Safe(&actor),
            Safe(&e.summary)
        )
        .map_err(stdout)?;
    }
    Ok(())
}
