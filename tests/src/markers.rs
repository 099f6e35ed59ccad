//! Marker files that prove a desktop came back as it was: one in the home
//! directory (the container's own layer), one in `/opt` written as root (an
//! installed app), one in the workspace (the host mount), and the browser
//! profiles (a Chromium login cookie, a Firefox profile).
//!
//! Every file is fsynced before the writer answers. Verification reports
//! every missing marker at once, not only the first.

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::browser;
use crate::guest::{Guest, GuestUser};

/// In the container's own layer: only survives if the container is reused.
pub const HOME_MARKER: &str = "/home/desk/dormouse-marker";
/// Root-owned, like software installed by an administrator.
pub const OPT_MARKER: &str = "/opt/dormouse-marker";
/// On the workspace mount, in the guest.
pub const WORKSPACE_MARKER: &str = "/home/desk/workspace/dormouse-marker";
/// The same file's name in the host's workspace directory.
pub const WORKSPACE_MARKER_NAME: &str = "dormouse-marker";
/// A file of ours inside the Firefox profile.
pub const FIREFOX_MARKER: &str = "/home/desk/.mozilla/firefox/dormouse-e2e/dormouse-marker";

/// One set of markers, all carrying the same unique token.
#[derive(Debug, Clone)]
pub struct Markers {
    token: String,
}

impl Default for Markers {
    fn default() -> Self {
        Self::new()
    }
}

impl Markers {
    /// A fresh set with a unique token.
    pub fn new() -> Self {
        Self {
            token: uuid::Uuid::new_v4().simple().to_string(),
        }
    }

    /// The token every marker carries.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Writes the home, `/opt` and workspace markers (fsynced).
    pub async fn write_files(&self, guest: &Guest) -> Result<()> {
        guest
            .write_synced(GuestUser::Desk, HOME_MARKER, &self.token)
            .await
            .context("home marker")?;
        guest
            .write_synced(GuestUser::Root, OPT_MARKER, &self.token)
            .await
            .context("/opt marker (as root)")?;
        guest
            .write_synced(GuestUser::Desk, WORKSPACE_MARKER, &self.token)
            .await
            .context("workspace marker")?;
        Ok(())
    }

    /// Logs Chromium in (a persistent cookie) and makes a Firefox profile
    /// with a marker file in it, opened once by Firefox itself.
    pub async fn write_browser_profiles(&self, guest: &Guest) -> Result<()> {
        browser::chromium_set_cookie(guest, &self.token)
            .await
            .context("Chromium cookie")?;
        browser::firefox_opens_profile(guest)
            .await
            .context("first Firefox run")?;
        guest
            .write_synced(GuestUser::Desk, FIREFOX_MARKER, &self.token)
            .await
            .context("Firefox profile marker")?;
        Ok(())
    }

    /// Checks the home, `/opt` and workspace markers in the guest and the
    /// workspace marker on the host (`workspace` is the host directory).
    pub async fn verify_files(&self, guest: &Guest, workspace: &Path) -> Result<()> {
        let mut lost = Vec::new();
        for (path, user) in [
            (HOME_MARKER, GuestUser::Desk),
            (OPT_MARKER, GuestUser::Root),
            (WORKSPACE_MARKER, GuestUser::Desk),
        ] {
            self.expect(guest, user, path, &mut lost).await?;
        }
        let host = workspace.join(WORKSPACE_MARKER_NAME);
        match std::fs::read_to_string(&host) {
            Ok(text) if text == self.token => {}
            Ok(text) => lost.push(format!("{} (host) holds {text:?}", host.display())),
            Err(e) => lost.push(format!("{} (host): {e}", host.display())),
        }
        report(lost)
    }

    /// Checks the workspace marker alone (the only one a new container sees).
    pub async fn verify_workspace(&self, guest: &Guest, workspace: &Path) -> Result<()> {
        let mut lost = Vec::new();
        self.expect(guest, GuestUser::Desk, WORKSPACE_MARKER, &mut lost)
            .await?;
        let host = workspace.join(WORKSPACE_MARKER_NAME);
        if std::fs::read_to_string(&host).ok().as_deref() != Some(self.token.as_str()) {
            lost.push(format!("{} (host)", host.display()));
        }
        report(lost)
    }

    /// Checks the browser profiles: Chromium still sends the cookie, the
    /// Firefox marker is there and Firefox opens the profile again.
    pub async fn verify_browser_profiles(&self, guest: &Guest) -> Result<()> {
        let mut lost = Vec::new();
        self.expect(guest, GuestUser::Desk, FIREFOX_MARKER, &mut lost)
            .await?;
        if let Err(e) = browser::chromium_has_cookie(guest, &self.token).await {
            lost.push(format!("{e:#}"));
        }
        if let Err(e) = browser::firefox_opens_profile(guest).await {
            lost.push(format!("{e:#}"));
        }
        report(lost)
    }

    async fn expect(
        &self,
        guest: &Guest,
        user: GuestUser,
        path: &str,
        lost: &mut Vec<String>,
    ) -> Result<()> {
        match guest.read(user, path).await? {
            Some(text) if text == self.token => {}
            Some(text) => lost.push(format!("{path} holds {text:?}, not {:?}", self.token)),
            None => lost.push(format!("{path} is gone")),
        }
        Ok(())
    }
}

fn report(lost: Vec<String>) -> Result<()> {
    if lost.is_empty() {
        return Ok(());
    }
    bail!("markers lost:\n  {}", lost.join("\n  "))
}
