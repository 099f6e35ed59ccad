//! `dormouse mcp`: the Dormouse MCP tools over stdio, for clients that
//! launch a command (`{"command": "dormouse", "args": ["mcp", "--desktop",
//! "desk"]}`). The tools are `dormouse-mcp`'s, over this CLI's API client
//! (its `--url`, token and `--generation`); stdout carries only MCP.

use dormouse_client::Client;
use dormouse_mcp::{Dormouse, Settings};
use dormouse_protocol::actions::Scale;

use crate::CliError;

/// `dormouse mcp`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct McpArgs {
    /// The desktop (id or name) a tool means when its call names none.
    #[arg(long)]
    pub desktop: Option<String>,
    /// The `computer` tool's coordinate space (default: the screen's
    /// aspect within 1568 px on the long edge and 1.15 megapixels).
    #[arg(long, value_name = "WxH", value_parser = crate::actions::parse_scale)]
    pub display: Option<Scale>,
    /// Do not answer a screenshot after actions that change the screen.
    #[arg(long)]
    pub no_screenshot: bool,
}

/// Serves until the client closes stdin.
pub(crate) async fn run(client: &Client, args: McpArgs) -> Result<(), CliError> {
    let settings = Settings {
        desktop: args.desktop,
        display: args.display,
        no_screenshot_after: args.no_screenshot,
    };
    dormouse_mcp::serve_stdio(Dormouse::over(client.clone(), settings))
        .await
        .map_err(|e| CliError::Failed(format!("mcp: {e}")))
}
