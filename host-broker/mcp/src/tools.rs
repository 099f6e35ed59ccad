//! The tools, one method each over the API client of the call: `computer`,
//! `shell`, `read_file`, `write_file`, `list_files`, `desktops`,
//! `create_desktop`, `start_desktop`, `stop_desktop`, `screen_link`,
//! `clipboard_get`, `clipboard_set`. A refusal of the API comes back as a
//! tool error carrying its message.

use std::sync::Arc;

use base64::Engine as _;
use dormouse_client::{Endpoint, Fetched};
use dormouse_protocol::actions::{Action, ActionBatch, ActionResults};
use dormouse_protocol::api::CreateComputer;
use dormouse_protocol::exec::ExecRequest;
use dormouse_protocol::screen::{viewer_link, CreateScreen, ScreenMode};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Extensions, Implementation, JsonObject, ServerCapabilities,
    ServerConfig,
};
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, ServerHandler};
use serde::Deserialize;
use serde_json::json;

use crate::{computer, Dormouse, ToolError};

/// Most bytes of stdout and of stderr a `shell` call answers.
pub const SHELL_OUTPUT_BYTES: u64 = 64 * 1024;
/// Longest `shell` timeout, in seconds.
pub const SHELL_MAX_TIMEOUT_SECS: u64 = 600;
/// Largest file `read_file` answers. A longer one is refused at its first
/// byte past this (or at once by its length): never read whole.
pub const READ_FILE_BYTES: u64 = 8 * 1024 * 1024;

type Outcome = Result<CallToolResult, ErrorData>;

/// A tool's outcome: its content, or its error as a tool error.
fn answer(result: Result<CallToolResult, ToolError>) -> Outcome {
    Ok(result.unwrap_or_else(ToolError::into_result))
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s)])
}

fn json_text(v: &impl serde::Serialize) -> CallToolResult {
    text(serde_json::to_string_pretty(v).unwrap_or_default())
}

/// Arguments naming only a desktop.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DesktopArg {
    /// The desktop (id or name); optional when the server is bound to one.
    pub desktop: Option<String>,
}

/// `clipboard_set`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClipboardSetArgs {
    /// The text the desktop's clipboard is to hold (at most 32 KiB).
    pub text: String,
    /// The desktop (id or name); optional when the server is bound to one.
    pub desktop: Option<String>,
}

/// The one result of a one-action batch, or its failure as a tool error.
fn only_result(
    results: ActionResults,
) -> Result<dormouse_protocol::actions::ActionResult, ToolError> {
    let Some(result) = results.results.into_iter().next() else {
        return Err(ToolError::Invalid("the desktop answered no result".into()));
    };
    match &result.error {
        Some(e) if !result.ok => Err(ToolError::Invalid(format!("{}: {}", e.code, e.message))),
        _ => Ok(result),
    }
}

/// `shell`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellArgs {
    /// The command, run by `sh -c` in the workspace.
    pub command: String,
    /// Seconds before the command is killed (default 60, at most 600).
    pub timeout: Option<u64>,
    /// The desktop (id or name); optional when the server is bound to one.
    pub desktop: Option<String>,
}

/// `read_file`'s and `list_files`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathArgs {
    /// A path relative to the workspace (`""` or absent: its root).
    pub path: Option<String>,
    /// `utf-8` (default) or `base64`.
    pub encoding: Option<String>,
    /// The desktop (id or name); optional when the server is bound to one.
    pub desktop: Option<String>,
}

/// `write_file`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// A path relative to the workspace; missing directories are made.
    pub path: String,
    /// The content.
    pub content: String,
    /// `utf-8` (default) or `base64` (then `content` is base64).
    pub encoding: Option<String>,
    /// The desktop (id or name); optional when the server is bound to one.
    pub desktop: Option<String>,
}

/// `create_desktop`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// A name for it (unique).
    pub name: Option<String>,
}

/// `screen_link`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LinkArgs {
    /// `view` (watch only) or `control` (a person takes over input).
    pub mode: String,
    /// Seconds the link works (default the broker's).
    pub ttl: Option<u64>,
    /// What the person is asked to do, one line (at most 200 characters),
    /// shown on the desktop's card in the panel while the link works.
    pub reason: Option<String>,
    /// The desktop (id or name); optional when the server is bound to one.
    pub desktop: Option<String>,
}

fn base64_of(encoding: Option<&str>) -> Result<bool, ToolError> {
    match encoding.unwrap_or("utf-8") {
        "utf-8" | "utf8" => Ok(false),
        "base64" => Ok(true),
        other => Err(ToolError::Invalid(format!(
            "encoding {other:?}: use utf-8 or base64"
        ))),
    }
}

/// The end of one stream of a `shell` answer, marked when it was cut.
fn stream(name: &str, output: &str, cut: bool) -> String {
    let mut s = format!("--- {name} ---\n{output}");
    if cut {
        s.push_str(&format!(
            "\n[{name} cut: only the first {SHELL_OUTPUT_BYTES} bytes are shown]"
        ));
    }
    s
}

#[tool_router(vis = "pub(crate)")]
impl Dormouse {
    #[tool(name = "computer", description = computer::DESCRIPTION, input_schema = Arc::new(computer::input_schema()))]
    async fn computer(&self, args: JsonObject, extensions: Extensions) -> Outcome {
        answer(self.run_computer(args, &extensions).await)
    }

    #[tool(
        description = "Run a shell command (sh -c) in the desktop as its user (uid 1000), in the workspace, with a timeout. Answers the exit code, stdout and stderr (each cut at 64 KiB, marked when cut). The desktop must be running."
    )]
    async fn shell(&self, Parameters(a): Parameters<ShellArgs>, extensions: Extensions) -> Outcome {
        answer(
            async {
                let (client, id) = self.target(&extensions, a.desktop.as_deref()).await?;
                let timeout = a.timeout.unwrap_or(60).clamp(1, SHELL_MAX_TIMEOUT_SECS);
                let request = ExecRequest {
                    argv: None,
                    command: Some(a.command),
                    cwd: None,
                    env: Default::default(),
                    stdin: None,
                    timeout_ms: timeout * 1000,
                    max_output_bytes: SHELL_OUTPUT_BYTES,
                };
                let r = client.exec(id, &request, false).await?;
                let status = match (r.exit_code, &r.signal) {
                    (Some(code), _) => format!("exit code: {code}"),
                    (None, Some(sig)) => format!("killed by {sig}"),
                    (None, None) => "ended".to_owned(),
                };
                let timed = if r.timed_out {
                    format!(" (timed out after {timeout} s)")
                } else {
                    String::new()
                };
                let body = format!(
                    "{status}{timed}\n{}\n{}",
                    stream("stdout", &r.stdout, r.stdout_truncated),
                    stream("stderr", &r.stderr, r.stderr_truncated)
                );
                let ok = r.exit_code == Some(0);
                Ok(if ok {
                    text(body)
                } else {
                    CallToolResult::error(vec![ContentBlock::text(body)])
                })
            }
            .await,
        )
    }

    #[tool(
        description = "Read a file of the desktop's workspace (path relative to it), at most 8 MiB. Works while the desktop is stopped. encoding utf-8 (default) or base64."
    )]
    async fn read_file(
        &self,
        Parameters(a): Parameters<PathArgs>,
        extensions: Extensions,
    ) -> Outcome {
        answer(
            async {
                let b64 = base64_of(a.encoding.as_deref())?;
                let (client, id) = self.target(&extensions, a.desktop.as_deref()).await?;
                let path = a.path.unwrap_or_default();
                let fetched = match client
                    .fetch_within(id, path.as_bytes(), READ_FILE_BYTES)
                    .await
                {
                    Err(dormouse_client::Error::TooLarge { .. }) => {
                        return Err(ToolError::Invalid(format!(
                            "{path:?} is over the limit: read_file answers files of at most \
                             {READ_FILE_BYTES} bytes (read part of it with the shell tool)"
                        )))
                    }
                    other => other?,
                };
                match fetched {
                    Fetched::Dir(_) => Err(ToolError::Invalid(format!(
                        "{path:?} is a directory: use list_files"
                    ))),
                    Fetched::File(bytes) if b64 => Ok(text(
                        base64::engine::general_purpose::STANDARD.encode(bytes),
                    )),
                    Fetched::File(bytes) => String::from_utf8(bytes).map(text).map_err(|_| {
                        ToolError::Invalid(format!(
                            "{path:?} is not UTF-8 text: read it with encoding base64"
                        ))
                    }),
                }
            }
            .await,
        )
    }

    #[tool(
        description = "Write a file into the desktop's workspace (path relative to it; missing directories are made; an existing file is replaced). Works while the desktop is stopped. encoding utf-8 (default) or base64."
    )]
    async fn write_file(
        &self,
        Parameters(a): Parameters<WriteArgs>,
        extensions: Extensions,
    ) -> Outcome {
        answer(
            async {
                let bytes = if base64_of(a.encoding.as_deref())? {
                    base64::engine::general_purpose::STANDARD
                        .decode(a.content.as_bytes())
                        .map_err(|e| ToolError::Invalid(format!("content is not base64: {e}")))?
                } else {
                    a.content.into_bytes()
                };
                let (client, id) = self.target(&extensions, a.desktop.as_deref()).await?;
                let written = client
                    .write_file(id, a.path.as_bytes(), bytes, true)
                    .await?;
                Ok(text(format!(
                    "wrote {} bytes to {:?}",
                    written.bytes, a.path
                )))
            }
            .await,
        )
    }

    #[tool(
        description = "List a directory of the desktop's workspace (path relative to it; absent: the workspace itself). Works while the desktop is stopped."
    )]
    async fn list_files(
        &self,
        Parameters(a): Parameters<PathArgs>,
        extensions: Extensions,
    ) -> Outcome {
        answer(
            async {
                let (client, id) = self.target(&extensions, a.desktop.as_deref()).await?;
                let path = a.path.unwrap_or_default();
                // A file's bytes are not wanted: none of them is read.
                match client.fetch_within(id, path.as_bytes(), 0).await {
                    Ok(Fetched::Dir(listing)) => Ok(json_text(&listing)),
                    Ok(Fetched::File(_)) | Err(dormouse_client::Error::TooLarge { .. }) => Err(
                        ToolError::Invalid(format!("{path:?} is a file: use read_file")),
                    ),
                    Err(e) => Err(e.into()),
                }
            }
            .await,
        )
    }

    #[tool(
        description = "List the desktops: id, name, whether it runs and is ready, and its lease generation."
    )]
    async fn desktops(&self, extensions: Extensions) -> Outcome {
        answer(
            async {
                let client = self.call(&extensions)?.client;
                let list: Vec<_> = client
                    .list()
                    .await?
                    .into_iter()
                    .map(|c| {
                        json!({"id": c.id, "name": c.name, "container": c.container,
                               "ready": c.ready, "generation": c.generation})
                    })
                    .collect();
                Ok(json_text(&list))
            }
            .await,
        )
    }

    #[tool(
        description = "Create a new desktop and start it; answers its status (ready: true once it can be used; poll desktops until then)."
    )]
    async fn create_desktop(
        &self,
        Parameters(a): Parameters<CreateArgs>,
        extensions: Extensions,
    ) -> Outcome {
        answer(
            async {
                let client = self.call(&extensions)?.client;
                let request = CreateComputer {
                    name: a.name,
                    ..Default::default()
                };
                Ok(json_text(&client.create(&request).await?))
            }
            .await,
        )
    }

    #[tool(
        description = "Start a desktop and answer its status (ready: true once it can be used)."
    )]
    async fn start_desktop(
        &self,
        Parameters(a): Parameters<DesktopArg>,
        extensions: Extensions,
    ) -> Outcome {
        answer(
            async {
                let (client, id) = self.target(&extensions, a.desktop.as_deref()).await?;
                Ok(json_text(&client.start(id).await?))
            }
            .await,
        )
    }

    #[tool(description = "Stop a desktop (its workspace is kept).")]
    async fn stop_desktop(
        &self,
        Parameters(a): Parameters<DesktopArg>,
        extensions: Extensions,
    ) -> Outcome {
        answer(
            async {
                let (client, id) = self.target(&extensions, a.desktop.as_deref()).await?;
                Ok(json_text(&client.stop(id).await?))
            }
            .await,
        )
    }

    #[tool(
        description = "Read the text of the desktop's clipboard (CLIPBOARD; empty when nothing was copied), at most 32 KiB. The desktop must be running."
    )]
    async fn clipboard_get(
        &self,
        Parameters(a): Parameters<DesktopArg>,
        extensions: Extensions,
    ) -> Outcome {
        answer(
            async {
                let (client, id) = self.target(&extensions, a.desktop.as_deref()).await?;
                let batch = ActionBatch {
                    actions: vec![Action::ClipboardGet {}],
                    scale: None,
                    cursor: false,
                };
                let result = only_result(client.actions(id, &batch).await?)?;
                Ok(text(result.text.unwrap_or_default()))
            }
            .await,
        )
    }

    #[tool(
        description = "Put text on the desktop's clipboard (CLIPBOARD and PRIMARY), as a copy in an application would, so a paste (ctrl+v, middle click) in the desktop inserts it; at most 32 KiB. The desktop must be running."
    )]
    async fn clipboard_set(
        &self,
        Parameters(a): Parameters<ClipboardSetArgs>,
        extensions: Extensions,
    ) -> Outcome {
        answer(
            async {
                let (client, id) = self.target(&extensions, a.desktop.as_deref()).await?;
                let bytes = a.text.len();
                let batch = ActionBatch {
                    actions: vec![Action::ClipboardSet { text: a.text }],
                    scale: None,
                    cursor: false,
                };
                only_result(client.actions(id, &batch).await?)?;
                Ok(text(format!("the clipboard holds {bytes} bytes")))
            }
            .await,
        )
    }

    #[tool(
        description = "Make a link for a person to watch (mode view) or take over (mode control) the desktop's screen, for the moment a human is needed (a login, a 2FA code). Say in `reason` what the person should do: the panel shows it on the desktop's card. Give the person the URL; a control link revokes itself when the lease changes hands."
    )]
    async fn screen_link(
        &self,
        Parameters(a): Parameters<LinkArgs>,
        extensions: Extensions,
    ) -> Outcome {
        answer(
            async {
                let mode = match a.mode.as_str() {
                    "view" => ScreenMode::View,
                    "control" => ScreenMode::Control,
                    other => {
                        return Err(ToolError::Invalid(format!(
                            "mode {other:?}: use view or control"
                        )))
                    }
                };
                let (client, id) = self.target(&extensions, a.desktop.as_deref()).await?;
                let request = CreateScreen {
                    mode,
                    ttl_ms: a.ttl.map(|s| s.saturating_mul(1000)),
                    reason: a.reason,
                };
                let grant = client.create_screen(id, &request).await?;
                let link = viewer_link(&grant);
                let url = match client.endpoint() {
                    Endpoint::Http { base } => format!("{base}{link}"),
                    _ => link,
                };
                Ok(json_text(&json!({"url": url, "mode": grant.mode,
                                      "expires_at": grant.expires_at,
                                      "screen_id": grant.screen_id})))
            }
            .await,
        )
    }
}

impl Dormouse {
    async fn run_computer(
        &self,
        args: JsonObject,
        extensions: &Extensions,
    ) -> Result<CallToolResult, ToolError> {
        let named = args
            .get("desktop")
            .and_then(|d| d.as_str())
            .map(str::to_owned);
        let call = self.call(extensions)?;
        let images = computer::Images {
            encoding: call.url.encoding.unwrap_or(self.settings.encoding),
            after: call
                .url
                .screenshot_after
                .unwrap_or(!self.settings.no_screenshot_after),
        };
        // Parse first: a call that cannot be a batch is refused as such and
        // costs no screenshot.
        let unset = dormouse_protocol::actions::Scale {
            width: 1,
            height: 1,
        };
        let mut batch = computer::batch_of(args, unset, images)?;
        let id = self.desktop(&call, named.as_deref()).await?;
        batch.scale = Some(self.space(&call.client, id).await?);
        let results = call.client.actions(id, &batch).await?;
        Ok(computer::content_of(results))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Dormouse {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("dormouse", env!("CARGO_PKG_VERSION")).with_title("Dormouse"),
            )
            .with_instructions(
                "Dormouse desktops: Linux desktops in containers. Use `computer` to see and drive \
             the screen, `shell` to run commands, the file tools for the workspace (they work \
             while a desktop is stopped), and `screen_link` when a person must step in.",
            )
    }
}
