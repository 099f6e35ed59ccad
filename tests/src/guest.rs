//! Inside a desktop, through `docker exec`: shell commands as the desktop user
//! (`desk`, uid 1000, as everything of the desktop runs) or as root (as an
//! administrator installing software into `/opt` would).
//!
//! This is how a test plays the user; it never goes through the broker and
//! never changes the container's configuration.

use std::process::{Output, Stdio};

use anyhow::{bail, Context, Result};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use uuid::Uuid;

/// The desktop user's home in the guest.
pub const HOME: &str = "/home/desk";

/// The workspace mount in the guest.
pub const WORKSPACE: &str = "/home/desk/workspace";

/// Who runs a command in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestUser {
    /// `desk`, uid/gid 1000, with its home and the desktop's display.
    Desk,
    /// root.
    Root,
}

impl GuestUser {
    fn exec_args(self) -> &'static [&'static str] {
        match self {
            Self::Desk => &[
                "-u",
                "1000:1000",
                "-e",
                "HOME=/home/desk",
                "-e",
                "USER=desk",
                "-e",
                "DISPLAY=:1",
                "-w",
                "/home/desk",
            ],
            Self::Root => &["-u", "0:0", "-w", "/"],
        }
    }
}

/// One desktop container, addressed by name.
#[derive(Debug, Clone)]
pub struct Guest {
    container: String,
}

impl Guest {
    /// The desktop of broker computer `id` (container `dormouse-<id>`).
    pub fn for_computer(id: Uuid) -> Self {
        Self::named(format!("dormouse-{id}"))
    }

    /// A container by name.
    pub fn named(container: impl Into<String>) -> Self {
        Self {
            container: container.into(),
        }
    }

    /// The container's name.
    pub fn container(&self) -> &str {
        &self.container
    }

    fn command(&self, user: GuestUser, flags: &[&str], script: &str) -> Command {
        let mut cmd = Command::new("docker");
        cmd.arg("exec")
            .args(flags)
            .args(user.exec_args())
            .arg(&self.container)
            .args(["sh", "-c", script]);
        cmd
    }

    /// Runs `sh -c script` and returns whatever happened.
    pub async fn sh(&self, user: GuestUser, script: &str) -> Result<Output> {
        self.command(user, &[], script)
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("docker exec in {}", self.container))
    }

    /// Runs `sh -c script`; fails with its output unless it exits 0.
    pub async fn sh_ok(&self, user: GuestUser, script: &str) -> Result<String> {
        let out = self.sh(user, script).await?;
        check(&self.container, script, &out)
    }

    /// Runs `sh -c script` with `input` on its stdin; fails unless it exits 0.
    pub async fn sh_with_input(
        &self,
        user: GuestUser,
        script: &str,
        input: &[u8],
    ) -> Result<String> {
        let mut child = self
            .command(user, &["-i"], script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("docker exec -i in {}", self.container))?;
        let mut stdin = child.stdin.take().context("docker exec -i has no stdin")?;
        stdin
            .write_all(input)
            .await
            .context("writing to docker exec")?;
        drop(stdin);
        let out = child.wait_with_output().await.context("docker exec -i")?;
        check(&self.container, script, &out)
    }

    /// Starts `sh -c script` in the background (`docker exec -d`).
    pub async fn sh_detached(&self, user: GuestUser, script: &str) -> Result<()> {
        let out = self
            .command(user, &["-d"], script)
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("docker exec -d in {}", self.container))?;
        check(&self.container, script, &out).map(drop)
    }

    /// Writes `contents` to `path` and fsyncs the file before answering, so
    /// it is on disk before anything kills the container.
    pub async fn write_synced(&self, user: GuestUser, path: &str, contents: &str) -> Result<()> {
        let script = format!(
            "mkdir -p \"$(dirname {path})\" && cat > {path}.tmp && sync {path}.tmp && mv {path}.tmp {path} && sync {path} \"$(dirname {path})\"",
            path = shell_quote(path)
        );
        self.sh_with_input(user, &script, contents.as_bytes())
            .await
            .map(drop)
    }

    /// The contents of `path`, or `None` when it does not exist.
    pub async fn read(&self, user: GuestUser, path: &str) -> Result<Option<String>> {
        let path = shell_quote(path);
        let out = self
            .sh(
                user,
                &format!("if [ -e {path} ]; then cat {path}; else exit 3; fi"),
            )
            .await?;
        match out.status.code() {
            Some(0) => Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned())),
            Some(3) => Ok(None),
            _ => bail!(
                "reading {path} in {}: {}",
                self.container,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
    }
}

fn check(container: &str, script: &str, out: &Output) -> Result<String> {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "in {container}: `{script}` failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            tail(&stdout, 2000),
            tail(&String::from_utf8_lossy(&out.stderr), 2000)
        );
    }
    Ok(stdout)
}

/// The last `max` bytes of `text` (on a character boundary), for messages.
pub fn tail(text: &str, max: usize) -> &str {
    let text = text.trim();
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// Quotes `s` for `sh` with single quotes.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn tail_keeps_the_end_on_a_char_boundary() {
        assert_eq!(tail("abcdef", 3), "def");
        assert_eq!(tail("ééé", 3), "é");
        assert_eq!(tail(" short ", 10), "short");
    }
}
