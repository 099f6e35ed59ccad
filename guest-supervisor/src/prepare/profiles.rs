//! Browser profiles and user apps live in the workspace.
//!
//! Owns the links `~/.config/google-chrome`, `~/.config/chromium`,
//! `~/.mozilla` → `workspace/.browser-profiles/{google-chrome,chromium,mozilla}`
//! and `~/.local` → `workspace/.desktop-apps/local`, and the one-time
//! migration of what the image or an older container left in the home.
//!
//! Rules: an old directory is copied only into an empty target, then
//! replaced by the link; a non-empty target wins and the old directory is
//! moved aside (never deleted); a link that points elsewhere is replaced
//! (links hold no data); nothing is ever followed, so a link planted by the
//! desktop user (to `/`, say) can neither be copied from nor chowned.
//! Running it again changes nothing.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Component, Path, PathBuf};

use super::PrepareError;
use crate::config::Config;
use crate::nofollow::{EntryKind, HeldDir, Owner};

/// One link from the home into the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileLink {
    /// The link in the home, e.g. `/home/desk/.config/chromium`.
    pub link: PathBuf,
    /// Where it points, e.g. `/home/desk/workspace/.browser-profiles/chromium`.
    pub target: PathBuf,
    /// Permission bits of the target directory when it is created.
    pub mode: u32,
}

/// What [`ensure_links`] did for one link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkOutcome {
    /// It was already right.
    AlreadyLinked,
    /// Nothing was there; the link was made.
    Linked,
    /// The old directory was copied into the empty target, then linked.
    Migrated,
    /// A link pointing elsewhere (`was`) was replaced.
    Relinked {
        /// Where it pointed.
        was: PathBuf,
    },
    /// The target had data already; the old entry was moved to `to`.
    MovedAside {
        /// Where the old entry went.
        to: PathBuf,
    },
}

/// The links the preparation makes, in order.
pub fn links(config: &Config) -> Vec<ProfileLink> {
    let profiles = config.profiles_root();
    vec![
        ProfileLink {
            link: config.home.join(".config/google-chrome"),
            target: profiles.join("google-chrome"),
            mode: 0o700,
        },
        ProfileLink {
            link: config.home.join(".config/chromium"),
            target: profiles.join("chromium"),
            mode: 0o700,
        },
        ProfileLink {
            link: config.home.join(".mozilla"),
            target: profiles.join("mozilla"),
            mode: 0o700,
        },
        ProfileLink {
            link: config.home.join(".local"),
            target: config.apps_root().join("local"),
            mode: 0o755,
        },
    ]
}

/// Makes every link of [`links`]; returns what was done for each, or why
/// it could not be (one failing link does not stop the others).
pub fn ensure_links(config: &Config) -> Vec<(ProfileLink, Result<LinkOutcome, PrepareError>)> {
    let owner = Owner {
        uid: config.uid,
        gid: config.gid,
    };
    let mut done = Vec::new();
    for link in links(config) {
        let outcome = ensure_link(config, &link, owner).map_err(|source| PrepareError::Io {
            what: "linking",
            path: link.link.clone(),
            source,
        });
        match &outcome {
            Ok(LinkOutcome::AlreadyLinked) => {}
            Ok(outcome) => {
                tracing::info!(link = %link.link.display(), target = %link.target.display(), ?outcome, "profile link");
            }
            Err(e) => tracing::error!(error = %e, "profile link"),
        }
        done.push((link, outcome));
    }
    done
}

fn ensure_link(config: &Config, link: &ProfileLink, owner: Owner) -> io::Result<LinkOutcome> {
    let (Some(link_parent), Some(link_name)) = (link.link.parent(), link.link.file_name()) else {
        return Err(bad_path(&link.link));
    };
    let (Some(target_parent), Some(target_name)) = (link.target.parent(), link.target.file_name())
    else {
        return Err(bad_path(&link.target));
    };
    let targets = ensure_real_dir(
        config.anchor_for(target_parent),
        target_parent,
        0o755,
        owner,
    )?;
    let target = ensure_real_child(&targets, target_name, link.mode, owner)?;
    let parent = ensure_real_dir(config.anchor_for(link_parent), link_parent, 0o755, owner)?;

    let outcome = match parent.stat(link_name)? {
        None => LinkOutcome::Linked,
        Some(st) if st.kind == EntryKind::Symlink => {
            let was = parent.read_link(link_name)?;
            if was == link.target {
                return Ok(LinkOutcome::AlreadyLinked);
            }
            parent.unlink(link_name)?;
            LinkOutcome::Relinked { was }
        }
        Some(st) if st.kind == EntryKind::Dir => {
            let old = parent.open_dir(link_name)?;
            if old.is_empty()? {
                parent.remove_tree(link_name)?;
                LinkOutcome::Linked
            } else if target.is_empty()? {
                migrate(&old, &targets, target_name, owner)?;
                drop(old);
                parent.remove_tree(link_name)?;
                LinkOutcome::Migrated
            } else {
                LinkOutcome::MovedAside {
                    to: move_aside(&parent, link_name)?,
                }
            }
        }
        Some(_) => LinkOutcome::MovedAside {
            to: move_aside(&parent, link_name)?,
        },
    };
    parent.symlink(link_name, &link.target, owner)?;
    Ok(outcome)
}

/// Copies `old` into a staging directory beside the target, then renames it
/// over the (empty) target, so a kill mid-copy never leaves a half-filled
/// target that would later count as "not empty".
fn migrate(old: &HeldDir, targets: &HeldDir, target_name: &OsStr, owner: Owner) -> io::Result<()> {
    let mut staging = OsString::from(".");
    staging.push(target_name);
    staging.push(".migrating");
    targets.remove_tree(&staging)?;
    // Keep the permission bits of the directory being replaced.
    let mode = old.stat_self()?.mode & 0o777 | 0o700;
    let into = targets.ensure_dir(&staging, mode, owner)?;
    old.copy_into(&into, owner)?;
    targets.rename(&staging, targets, target_name)
}

/// Renames `name` to the first free `<name>.pre-dormouse[.N]`.
fn move_aside(parent: &HeldDir, name: &OsStr) -> io::Result<PathBuf> {
    for n in 0..100 {
        let mut aside = name.to_owned();
        aside.push(".pre-dormouse");
        if n > 0 {
            aside.push(format!(".{n}"));
        }
        if parent.stat(&aside)?.is_none() {
            parent.rename(name, parent, &aside)?;
            let to = parent.display(&aside);
            tracing::warn!(from = %parent.display(name).display(), to = %to.display(), "moved aside");
            return Ok(to);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "no free name to move {} aside",
            parent.display(name).display()
        ),
    ))
}

/// Opens `path` below `anchor` as real directories all the way, creating
/// what is missing, removing links and moving aside files that stand where
/// a directory belongs.
pub(crate) fn ensure_real_dir(
    anchor: &Path,
    path: &Path,
    mode: u32,
    owner: Owner,
) -> io::Result<HeldDir> {
    let rel = path.strip_prefix(anchor).map_err(|_| bad_path(path))?;
    let mut dir = HeldDir::open_trusted(anchor)?;
    for component in rel.components() {
        match component {
            Component::Normal(name) => dir = ensure_real_child(&dir, name, mode, owner)?,
            Component::CurDir => {}
            _ => return Err(bad_path(path)),
        }
    }
    Ok(dir)
}

/// `name` in `parent` as a real directory owned by `owner`.
fn ensure_real_child(
    parent: &HeldDir,
    name: &OsStr,
    mode: u32,
    owner: Owner,
) -> io::Result<HeldDir> {
    match parent.stat(name)? {
        Some(st) if st.kind == EntryKind::Symlink => {
            tracing::warn!(path = %parent.display(name).display(), "removing a link where a directory belongs");
            parent.unlink(name)?;
        }
        Some(st) if st.kind != EntryKind::Dir => {
            move_aside(parent, name)?;
        }
        _ => {}
    }
    let dir = parent.ensure_dir(name, mode, owner)?;
    let st = dir.stat_self()?;
    if (st.uid, st.gid) != (owner.uid, owner.gid) {
        dir.chown(owner)?;
    }
    Ok(dir)
}

fn bad_path(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{} is not a usable path", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::test_config;
    use std::os::unix::fs::symlink;

    fn outcome_of(done: &[(ProfileLink, LinkOutcome)], suffix: &str) -> LinkOutcome {
        done.iter()
            .find(|(l, _)| l.link.ends_with(suffix))
            .map(|(_, o)| o.clone())
            .expect("link present")
    }

    fn ensure_links(config: &Config) -> Result<Vec<(ProfileLink, LinkOutcome)>, PrepareError> {
        super::ensure_links(config)
            .into_iter()
            .map(|(link, outcome)| outcome.map(|o| (link, o)))
            .collect()
    }

    #[test]
    fn fresh_home_gets_links_and_a_second_run_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = test_config(dir.path());
        let done = ensure_links(&config).expect("links");
        assert!(done.iter().all(|(_, o)| *o == LinkOutcome::Linked));
        for link in links(&config) {
            assert_eq!(std::fs::read_link(&link.link).expect("link"), link.target);
            assert!(link.target.is_dir());
        }
        let again = ensure_links(&config).expect("links");
        assert!(again.iter().all(|(_, o)| *o == LinkOutcome::AlreadyLinked));
    }

    #[test]
    fn old_profile_is_copied_into_an_empty_target() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = test_config(dir.path());
        let old = config.home.join(".config/chromium/Default");
        std::fs::create_dir_all(&old).expect("mkdir");
        std::fs::write(old.join("Cookies"), "session").expect("write");
        // An empty target counts as empty.
        std::fs::create_dir_all(config.profiles_root().join("chromium")).expect("mkdir");
        let done = ensure_links(&config).expect("links");
        assert_eq!(outcome_of(&done, ".config/chromium"), LinkOutcome::Migrated);
        let via_link = config.home.join(".config/chromium/Default/Cookies");
        assert_eq!(std::fs::read_to_string(via_link).expect("read"), "session");
        assert!(
            std::fs::symlink_metadata(config.home.join(".config/chromium"))
                .expect("lstat")
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn a_non_empty_target_wins_and_the_old_dir_is_kept_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = test_config(dir.path());
        let target = config.profiles_root().join("mozilla");
        std::fs::create_dir_all(&target).expect("mkdir");
        std::fs::write(target.join("profiles.ini"), "workspace").expect("write");
        std::fs::create_dir_all(config.home.join(".mozilla")).expect("mkdir");
        std::fs::write(config.home.join(".mozilla/profiles.ini"), "image").expect("write");
        let done = ensure_links(&config).expect("links");
        let LinkOutcome::MovedAside { to } = outcome_of(&done, ".mozilla") else {
            panic!("expected the old dir moved aside");
        };
        assert_eq!(
            std::fs::read_to_string(to.join("profiles.ini")).expect("read"),
            "image"
        );
        assert_eq!(
            std::fs::read_to_string(config.home.join(".mozilla/profiles.ini")).expect("read"),
            "workspace"
        );
    }

    #[test]
    fn hostile_links_are_replaced_and_never_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = test_config(dir.path());
        // Something the desktop user must not be able to reach through us.
        let secret = dir.path().join("etc");
        std::fs::create_dir_all(&secret).expect("mkdir");
        std::fs::write(secret.join("shadow"), "root:x").expect("write");
        std::fs::create_dir_all(config.home.join(".config")).expect("mkdir");
        symlink(&secret, config.home.join(".config/chromium")).expect("link");
        symlink(
            &secret,
            config
                .profiles_root()
                .parent()
                .expect("ws")
                .join(".desktop-apps"),
        )
        .expect("link");
        std::fs::create_dir_all(config.profiles_root()).expect("mkdir");
        symlink(&secret, config.profiles_root().join("google-chrome")).expect("link");

        let done = ensure_links(&config).expect("links");
        assert_eq!(
            outcome_of(&done, ".config/chromium"),
            LinkOutcome::Relinked {
                was: secret.clone()
            }
        );
        for link in links(&config) {
            assert_eq!(std::fs::read_link(&link.link).expect("link"), link.target);
            let meta = std::fs::symlink_metadata(&link.target).expect("lstat");
            assert!(
                meta.is_dir(),
                "{} must be a real dir",
                link.target.display()
            );
        }
        // Nothing was copied out of, or into, the secret directory.
        let names: Vec<_> = std::fs::read_dir(&secret)
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("shadow")]);
        assert!(config
            .profiles_root()
            .join("chromium")
            .read_dir()
            .expect("ls")
            .next()
            .is_none());
    }

    #[test]
    fn an_existing_correct_link_keeps_its_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = test_config(dir.path());
        ensure_links(&config).expect("links");
        std::fs::write(config.home.join(".local/marker"), "kept").expect("write");
        let again = ensure_links(&config).expect("links");
        assert_eq!(outcome_of(&again, ".local"), LinkOutcome::AlreadyLinked);
        assert_eq!(
            std::fs::read_to_string(config.apps_root().join("local/marker")).expect("read"),
            "kept"
        );
    }
}
