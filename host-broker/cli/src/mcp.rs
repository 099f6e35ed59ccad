//! `dormouse mcp`: the Dormouse MCP tools over stdio, for clients that
//! launch a command (`{"command": "dormouse", "args": ["mcp", "--desktop",
//! "desk"]}`). The tools are `dormouse-mcp`'s, over this CLI's API client
//! (its `--url`, token and `--generation`); stdout carries only MCP.
//! `--no-screenshot` turns off the screenshot after actions that change the
//! screen; `--format`/`--quality` encode the tool's images.

use dormouse_client::Client;
use dormouse_mcp::{Dormouse, Settings};
use dormouse_protocol::actions::Scale;
use dormouse_protocol::image::{ImageEncoding, ImageFormat};

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
    /// The encoding of the `computer` tool's images: png (default), jpeg
    /// or webp.
    #[arg(long)]
    pub format: Option<ImageFormat>,
    /// 1..=100, for jpeg and webp (default 80).
    #[arg(long)]
    pub quality: Option<u8>,
}

/// Serves until the client closes stdin.
pub(crate) async fn run(client: &Client, args: McpArgs) -> Result<(), CliError> {
    let encoding = ImageEncoding::new(args.format, args.quality)
        .map_err(|e| CliError::Usage(format!("mcp: {e}")))?;
    let settings = Settings {
        desktop: args.desktop,
        display: args.display,
        no_screenshot_after: args.no_screenshot,
        encoding,
    };
    dormouse_mcp::serve_stdio(Dormouse::over(client.clone(), settings))
        .await
        .map_err(|e| CliError::Failed(format!("mcp: {e}")))
}
