//! The typing witness: an `xterm` titled `soak-witness` running a small
//! Python program that puts its terminal in raw mode and appends every byte
//! it reads to `/home/desk/soak/typed`, with `fsync` after each read. What
//! the file holds is what the application saved; the container's own layer
//! keeps it across kills and stops (it is not in the workspace, so an
//! import does not replace it).
//!
//! The window of loss is honest and small: a key the X server took, that
//! xterm wrote to the pseudo-terminal but the program had not yet read and
//! fsynced when the container died, is acknowledged (the actions API had
//! answered) but not saved. The harness waits for each batch to be saved
//! before it sends the next, so at most one batch per desktop is in that
//! window when a fault lands; it is counted apart ("acknowledged, unsaved")
//! and never as saved.

use std::time::Duration;

use anyhow::{bail, Result};
use dormouse_e2e::guest::{Guest, GuestUser};
use tokio::time::Instant;

/// The witness's saved state.
pub(crate) const TYPED: &str = "/home/desk/soak/typed";
const PROGRAM: &str = "/home/desk/soak/witness.py";
const TITLE: &str = "soak-witness";

const SOURCE: &str = r#"import os, sys, tty
fd = sys.stdin.fileno()
tty.setraw(fd)
out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
while True:
    data = os.read(fd, 4096)
    if not data:
        break
    os.write(out, data)
    os.fsync(out)
"#;

/// Starts the witness unless it runs, and gives its window the focus.
pub(crate) async fn ensure(guest: &Guest) -> Result<()> {
    let running = guest
        .sh(
            GuestUser::Desk,
            &format!("pgrep -u 1000 -f '^python3 {PROGRAM}'"),
        )
        .await?
        .status
        .success();
    if !running {
        guest
            .sh_with_input(
                GuestUser::Desk,
                &format!("mkdir -p /home/desk/soak && cat > {PROGRAM} && touch {TYPED}"),
                SOURCE.as_bytes(),
            )
            .await?;
        guest
            .sh_detached(
                GuestUser::Desk,
                &format!(
                    "exec xterm -T {TITLE} -geometry 80x10+0+0 -e python3 {PROGRAM} {TYPED} \
                     >/tmp/soak-witness.log 2>&1"
                ),
            )
            .await?;
    }
    focus(guest).await
}

/// Gives the witness's window the focus, waiting (bounded) for it to exist.
pub(crate) async fn focus(guest: &Guest) -> Result<()> {
    let started = Instant::now();
    loop {
        let out = guest
            .sh(
                GuestUser::Desk,
                &format!(
                    "w=$(xdotool search --name '^{TITLE}$' | head -n1) && [ -n \"$w\" ] \
                     && xdotool windowactivate --sync \"$w\" && pgrep -u 1000 -f '^python3 {PROGRAM}' >/dev/null"
                ),
            )
            .await?;
        if out.status.success() {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!(
                "the typing witness never got the focus: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the witness has saved.
pub(crate) async fn saved(guest: &Guest) -> Result<String> {
    Ok(guest
        .read(GuestUser::Desk, TYPED)
        .await?
        .unwrap_or_default())
}

/// Waits (up to `within`) until the witness has saved `token`.
pub(crate) async fn wait_saved(guest: &Guest, token: &str, within: Duration) -> bool {
    let started = Instant::now();
    loop {
        if let Ok(text) = saved(guest).await {
            if text.contains(token) {
                return true;
            }
        }
        if started.elapsed() > within {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
