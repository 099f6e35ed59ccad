//! The data oracle: what each desktop must hold after every resume.
//!
//! - Files: every write the API acknowledged is read back byte for byte
//!   from the host's workspace directory (not through the broker).
//! - Imports: the archive ends with a `MANIFEST`; after the resume every
//!   entry is there byte for byte (whole) or none of them is and the files
//!   acknowledged before it still are (absent). Anything else is half. An
//!   acknowledged import must be whole.
//! - Typed text: every token the witness had saved before the fault is in
//!   its file after the resume; tokens acknowledged but not yet seen saved
//!   are counted apart when they never show up (see `witness`).
//! - Leftovers: no process of an exec the soak started (its marker in the
//!   command line) and no zombie in the guest once the cycle is over.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use dormouse_e2e::guest::{Guest, GuestUser};
use tokio::time::Instant;

use crate::load::{ImportOutcome, EXEC_MARK};
use crate::witness;

/// What one desktop must hold.
#[derive(Debug, Default)]
pub(crate) struct Expected {
    /// Workspace-relative path → contents.
    pub(crate) files: BTreeMap<String, Vec<u8>>,
    /// Tokens the witness saved.
    pub(crate) typed: Vec<String>,
}

/// Acknowledged files missing or different on the host now; they are
/// forgotten once reported, so a loss is counted once.
pub(crate) fn lost_files(workspace: &Path, expected: &mut Expected) -> Vec<String> {
    let mut lost = Vec::new();
    expected.files.retain(|rel, contents| {
        let intact = std::fs::read(workspace.join(rel)).ok().as_deref() == Some(&contents[..]);
        if !intact {
            lost.push(rel.clone());
        }
        intact
    });
    lost
}

/// Where an import stands in a workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ImportState {
    Whole,
    Absent,
    /// Some entries there, some not (or different): the reason.
    Half(String),
}

/// Whole, absent or half, by the archive's own entries.
pub(crate) fn import_state(workspace: &Path, outcome: &ImportOutcome) -> ImportState {
    let mut present = 0;
    let mut wrong = Vec::new();
    for (rel, contents) in &outcome.entries {
        match std::fs::read(workspace.join(rel)) {
            Ok(found) if found == *contents => present += 1,
            Ok(_) => wrong.push(format!("{rel} differs")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => wrong.push(format!("{rel}: {e}")),
        }
    }
    if wrong.is_empty() && present == outcome.entries.len() {
        ImportState::Whole
    } else if wrong.is_empty() && present == 0 {
        ImportState::Absent
    } else {
        ImportState::Half(format!(
            "{present} of {} entries intact; {}",
            outcome.entries.len(),
            wrong.join(", ")
        ))
    }
}

/// Applies an import's verdict to what the desktop must hold: a whole
/// import replaced the workspace (its entries are what is expected now);
/// an absent one left it as it was.
pub(crate) fn settle_import(expected: &mut Expected, outcome: &ImportOutcome, state: &ImportState) {
    if *state == ImportState::Whole {
        expected.files = outcome.entries.iter().cloned().collect();
    }
}

/// The tokens in the witness's file (each typed as `.token.`).
fn tokens(saved: &str) -> HashSet<&str> {
    saved.split('.').filter(|t| !t.is_empty()).collect()
}

/// What the typed-text check found.
#[derive(Debug, Default)]
pub(crate) struct TypedVerdict {
    /// Saved before, missing now.
    pub(crate) lost: Vec<String>,
    /// Acknowledged, never seen saved, and not saved now either.
    pub(crate) unsaved: usize,
}

/// Checks the witness's file against the saved tokens and settles the
/// unconfirmed ones (saved now: expected from now on; else counted).
pub(crate) async fn check_typed(
    guest: &Guest,
    expected: &mut Expected,
    unconfirmed: Vec<String>,
) -> Result<TypedVerdict> {
    let saved = witness::saved(guest).await?;
    let found = tokens(&saved);
    let mut verdict = TypedVerdict::default();
    expected.typed.retain(|t| {
        let there = found.contains(t.as_str());
        if !there {
            verdict.lost.push(t.clone());
        }
        there
    });
    for t in unconfirmed {
        if found.contains(t.as_str()) {
            expected.typed.push(t);
        } else {
            verdict.unsaved += 1;
        }
    }
    Ok(verdict)
}

/// An import's staging tree or set-aside workspace left beside the
/// workspace on the host once the cycle is over (the broker removes both
/// when an import ends and recovers them at start-up after a crash).
pub(crate) fn staging_leftovers(workspace: &Path) -> Vec<String> {
    [".import", ".previous"]
        .iter()
        .map(|suffix| {
            let mut name = workspace.as_os_str().to_owned();
            name.push(suffix);
            std::path::PathBuf::from(name)
        })
        .filter(|p| p.symlink_metadata().is_ok())
        .map(|p| p.display().to_string())
        .collect()
}

/// Processes of the soak's execs still in the guest, and zombies, after a
/// grace of up to 10 s for the ones that are on their way out.
pub(crate) async fn leftovers(guest: &Guest) -> Result<(usize, usize)> {
    let script = format!(
        "echo $(ps -eo args= | grep -c '[{}]{}') $(ps -eo stat= | grep -c '^Z')",
        &EXEC_MARK[..1],
        &EXEC_MARK[1..]
    );
    let started = Instant::now();
    loop {
        let out = guest.sh_ok(GuestUser::Root, &script).await?;
        let mut counts = out
            .split_whitespace()
            .map(|n| n.parse::<usize>().unwrap_or(0));
        let execs = counts.next().unwrap_or(0);
        let zombies = counts.next().unwrap_or(0);
        if (execs == 0 && zombies == 0) || started.elapsed() > Duration::from_secs(10) {
            return Ok((execs, zombies));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(entries: &[(&str, &[u8])]) -> ImportOutcome {
        ImportOutcome {
            acked: false,
            error: None,
            entries: entries
                .iter()
                .map(|(n, d)| ((*n).to_owned(), d.to_vec()))
                .collect(),
        }
    }

    #[test]
    fn an_import_is_whole_absent_or_half() {
        let dir = tempfile::tempdir().unwrap();
        let o = outcome(&[("a/f0", b"zero"), ("a/MANIFEST", b"a/f0 4\n")]);
        assert_eq!(import_state(dir.path(), &o), ImportState::Absent);
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/f0"), b"zero").unwrap();
        assert!(matches!(import_state(dir.path(), &o), ImportState::Half(_)));
        std::fs::write(dir.path().join("a/MANIFEST"), b"a/f0 4\n").unwrap();
        assert_eq!(import_state(dir.path(), &o), ImportState::Whole);
        std::fs::write(dir.path().join("a/f0"), b"zer").unwrap();
        assert!(matches!(import_state(dir.path(), &o), ImportState::Half(_)));
    }

    #[test]
    fn staging_beside_the_workspace_is_a_leftover() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        std::fs::create_dir(&workspace).unwrap();
        assert!(staging_leftovers(&workspace).is_empty());
        std::fs::create_dir(dir.path().join("workspace.import")).unwrap();
        assert_eq!(staging_leftovers(&workspace).len(), 1);
    }

    #[test]
    fn a_lost_file_is_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kept"), b"k").unwrap();
        let mut e = Expected::default();
        e.files.insert("kept".into(), b"k".to_vec());
        e.files.insert("gone".into(), b"g".to_vec());
        assert_eq!(lost_files(dir.path(), &mut e), ["gone"]);
        assert!(lost_files(dir.path(), &mut e).is_empty());
    }

    #[test]
    fn a_cut_token_does_not_hide_the_next() {
        let found = tokens(".c1d0n0abcdef..c1d0n1ab.c2d0n0xyzxyz.");
        assert!(found.contains("c1d0n0abcdef"));
        assert!(found.contains("c2d0n0xyzxyz"));
        assert!(!found.contains("c1d0n1abcdef"));
    }
}
