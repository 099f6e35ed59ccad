//! Stale locks of a previous container start, and Chromium's crash flag.
//!
//! Owns the rules for which files are locks: Chromium's `SingletonLock`,
//! `SingletonSocket` and `SingletonCookie`, Firefox's `.parentlock` and its
//! `lock` (only in its symlink form), found under the profiles root only;
//! and the X server's `/tmp/.X<N>-lock` and `/tmp/.X11-unix/X<N>`. It is run
//! once per container start, before any desktop process exists, or by the
//! service runner for a service it knows is down. It must never delete
//! anything outside the profiles root and those two X paths, and never
//! follow a link while scanning (the desktop user may point a profile at `/`).

use std::ffi::OsStr;
use std::io;
use std::path::PathBuf;

use crate::config::{Browser, Config};
use crate::nofollow::{is_not_a_real_dir, EntryKind, HeldDir, Owner};

/// Directories deeper than this below the profiles root are not listed.
/// Chromium keeps its singleton files at depth 2 (`chromium/SingletonLock`),
/// Firefox its locks at depth 4 (`mozilla/firefox/<profile>/.parentlock`);
/// caches below would only make the scan slow.
const SCAN_DEPTH: usize = 3;

/// Preferences files larger than this are left alone.
const MAX_PREFERENCES_BYTES: u64 = 32 << 20;

/// The browser families whose locks can be cleared one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileFamily {
    /// Chromium and Google Chrome (`chromium`, `google-chrome`).
    Chromium,
    /// Firefox (`mozilla`).
    Firefox,
}

impl ProfileFamily {
    /// The lock family of `browser`'s profile.
    pub fn of(browser: Browser) -> Self {
        match browser {
            Browser::Chromium | Browser::GoogleChrome => Self::Chromium,
            Browser::Firefox => Self::Firefox,
        }
    }

    /// Profile-root subdirectories of this family.
    fn roots(self) -> &'static [&'static str] {
        match self {
            Self::Chromium => &["chromium", "google-chrome"],
            Self::Firefox => &["mozilla"],
        }
    }
}

/// Whether an entry found under the profiles root is a browser lock.
/// Pure, so the rules are tested on their own.
pub fn is_profile_lock(name: &OsStr, kind: EntryKind) -> bool {
    match name.to_str() {
        Some("SingletonLock" | "SingletonSocket" | "SingletonCookie" | ".parentlock") => {
            kind != EntryKind::Dir
        }
        // Firefox's `lock` is a symlink to `<ip>:+<pid>`; a file or
        // directory of that name may be anything and is left alone.
        Some("lock") => kind == EntryKind::Symlink,
        _ => false,
    }
}

/// Removes the X server's lock file and socket for the configured display.
/// Only for a display the supervisor knows is not served.
pub fn clear_x_locks(config: &Config) -> io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let tmp = HeldDir::open_trusted(&config.tmp_dir)?;
    let lock = format!(".X{}-lock", config.display);
    if remove_entry(&tmp, OsStr::new(&lock))? {
        removed.push(tmp.display(OsStr::new(&lock)));
    }
    match tmp.open_dir(OsStr::new(".X11-unix")) {
        Ok(sockets) => {
            let socket = format!("X{}", config.display);
            if remove_entry(&sockets, OsStr::new(&socket))? {
                removed.push(sockets.display(OsStr::new(&socket)));
            }
        }
        // Missing, or not a real directory: `ensure_x_socket_dir` fixes it.
        Err(e) if e.kind() == io::ErrorKind::NotFound || is_not_a_real_dir(&e) => {}
        Err(e) => return Err(e),
    }
    Ok(removed)
}

/// Removes an entry of any kind; `true` if there was one.
fn remove_entry(dir: &HeldDir, name: &OsStr) -> io::Result<bool> {
    match dir.stat(name)? {
        None => Ok(false),
        Some(_) => {
            dir.remove_tree(name)?;
            Ok(true)
        }
    }
}

/// Makes `/tmp/.X11-unix` a real directory owned by the supervisor with mode
/// 1777, as the X server insists (it runs unprivileged and cannot fix it).
pub fn ensure_x_socket_dir(config: &Config) -> io::Result<()> {
    let tmp = HeldDir::open_trusted(&config.tmp_dir)?;
    let name = OsStr::new(".X11-unix");
    let me = Owner {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    };
    match tmp.stat(name)? {
        Some(st) if st.kind != EntryKind::Dir => {
            tracing::warn!(path = %tmp.display(name).display(), kind = ?st.kind, "replacing a non-directory");
            tmp.remove_tree(name)?;
        }
        _ => {}
    }
    let dir = tmp.ensure_dir(name, 0o1777, me)?;
    let st = dir.stat_self()?;
    if (st.uid, st.gid) != (me.uid, me.gid) {
        dir.chown(me)?;
    }
    if st.mode != 0o1777 {
        dir.chmod(0o1777)?;
    }
    Ok(())
}

/// Removes browser locks under the profiles root (of one family, or all).
/// A profiles root that is a link is not followed and nothing is removed.
pub fn clear_profile_locks(
    config: &Config,
    family: Option<ProfileFamily>,
) -> io::Result<Vec<PathBuf>> {
    let root_path = config.profiles_root();
    let root = match HeldDir::open_beneath(config.anchor_for(&root_path), &root_path) {
        Ok(root) => root,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) if is_not_a_real_dir(&e) => {
            tracing::warn!(path = %root_path.display(), "profiles root is not a real directory; not scanning it");
            return Ok(Vec::new());
        }
        Err(e) => return Err(e),
    };
    let mut removed = Vec::new();
    let names: Vec<&str> = match family {
        Some(f) => f.roots().to_vec(),
        None => Vec::new(),
    };
    if names.is_empty() {
        scan(&root, 0, &mut removed)?;
    } else {
        for name in names {
            match root.stat(OsStr::new(name))? {
                Some(st) if st.kind == EntryKind::Dir => {
                    scan(&root.open_dir(OsStr::new(name))?, 1, &mut removed)?;
                }
                _ => {}
            }
        }
    }
    Ok(removed)
}

fn scan(dir: &HeldDir, depth: usize, removed: &mut Vec<PathBuf>) -> io::Result<()> {
    for name in dir.entries()? {
        let Some(st) = dir.stat(&name)? else {
            continue;
        };
        if is_profile_lock(&name, st.kind) {
            dir.unlink(&name)?;
            removed.push(dir.display(&name));
        } else if st.kind == EntryKind::Dir && depth < SCAN_DEPTH {
            match dir.open_dir(&name) {
                Ok(sub) => scan(&sub, depth + 1, removed)?,
                // Replaced by a link between stat and open: not followed.
                Err(e) if is_not_a_real_dir(&e) || e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Marks every Chromium profile as exited cleanly (`profile.exit_type` =
/// `Normal`, `profile.exited_cleanly` = true), so a desktop that was killed
/// does not greet its user with a "restore pages" bubble. Returns the files
/// changed. Only while no browser runs.
pub fn mark_chromium_exited_cleanly(config: &Config) -> io::Result<Vec<PathBuf>> {
    let owner = Owner {
        uid: config.uid,
        gid: config.gid,
    };
    let mut changed = Vec::new();
    for family_root in ProfileFamily::Chromium.roots() {
        let path = config.profiles_root().join(family_root);
        let user_data = match HeldDir::open_beneath(config.anchor_for(&path), &path) {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound || is_not_a_real_dir(&e) => continue,
            Err(e) => return Err(e),
        };
        for profile in user_data.entries()? {
            let Ok(dir) = user_data.open_dir(&profile) else {
                continue; // a file, a link, or gone
            };
            let name = OsStr::new("Preferences");
            match dir.stat(name)? {
                Some(st) if st.kind == EntryKind::File => {}
                _ => continue,
            }
            match fix_preferences(&dir, name, owner) {
                Ok(true) => changed.push(dir.display(name)),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(path = %dir.display(name).display(), error = %e, "cannot mark the profile as exited cleanly");
                }
            }
        }
    }
    Ok(changed)
}

fn fix_preferences(dir: &HeldDir, name: &OsStr, owner: Owner) -> io::Result<bool> {
    use std::io::Read as _;
    let file = dir.open_file(name)?;
    let meta = file.metadata()?;
    if meta.len() > MAX_PREFERENCES_BYTES {
        return Ok(false);
    }
    let mut text =
        Vec::with_capacity(usize::try_from(meta.len().min(MAX_PREFERENCES_BYTES)).unwrap_or(0));
    file.take(MAX_PREFERENCES_BYTES).read_to_end(&mut text)?;
    let mut prefs: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if !mark_clean_exit(&mut prefs) {
        return Ok(false);
    }
    let out =
        serde_json::to_vec(&prefs).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    use std::os::unix::fs::PermissionsExt as _;
    dir.replace_file(name, &out, meta.permissions().mode() & 0o777, owner)?;
    Ok(true)
}

/// Sets the clean-exit markers in a parsed `Preferences`; `true` if it
/// changed anything. Pure.
pub fn mark_clean_exit(prefs: &mut serde_json::Value) -> bool {
    let Some(root) = prefs.as_object_mut() else {
        return false;
    };
    let profile = root
        .entry("profile")
        .or_insert_with(|| serde_json::Value::Object(Default::default()));
    let Some(profile) = profile.as_object_mut() else {
        return false;
    };
    let mut changed = false;
    if profile.get("exit_type").and_then(|v| v.as_str()) != Some("Normal") {
        profile.insert("exit_type".into(), "Normal".into());
        changed = true;
    }
    if profile.get("exited_cleanly").and_then(|v| v.as_bool()) != Some(true) {
        profile.insert("exited_cleanly".into(), true.into());
        changed = true;
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::test_config;
    use std::os::unix::fs::symlink;

    #[test]
    fn lock_rules() {
        let lock = |n: &str, k| is_profile_lock(OsStr::new(n), k);
        assert!(lock("SingletonLock", EntryKind::Symlink));
        assert!(lock("SingletonSocket", EntryKind::Symlink));
        assert!(lock("SingletonCookie", EntryKind::Symlink));
        assert!(lock(".parentlock", EntryKind::File));
        assert!(lock("lock", EntryKind::Symlink));
        assert!(!lock("lock", EntryKind::File));
        assert!(!lock("lock", EntryKind::Dir));
        assert!(!lock("SingletonLock", EntryKind::Dir));
        assert!(!lock("Cookies", EntryKind::File));
    }

    #[test]
    fn profile_locks_go_and_everything_else_stays() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = test_config(dir.path());
        let root = config.profiles_root();
        let chromium = root.join("chromium");
        let firefox = root.join("mozilla/firefox/abc.default-esr");
        std::fs::create_dir_all(&chromium).expect("mkdir");
        std::fs::create_dir_all(&firefox).expect("mkdir");
        symlink("oldhost-4242", chromium.join("SingletonLock")).expect("link");
        symlink(
            "/tmp/gone/SingletonSocket",
            chromium.join("SingletonSocket"),
        )
        .expect("link");
        symlink("123456", chromium.join("SingletonCookie")).expect("link");
        std::fs::write(firefox.join(".parentlock"), "").expect("write");
        symlink("127.0.0.1:+4242", firefox.join("lock")).expect("link");
        std::fs::write(firefox.join("prefs.js"), "keep").expect("write");
        std::fs::write(chromium.join("lock"), "a file named lock is not a lock").expect("write");
        // Outside the profiles root: never touched.
        symlink("elsewhere", config.home.join("SingletonLock")).expect("link");

        let removed = clear_profile_locks(&config, None).expect("clear");
        assert_eq!(removed.len(), 5, "{removed:?}");
        for gone in ["SingletonLock", "SingletonSocket", "SingletonCookie"] {
            assert!(std::fs::symlink_metadata(chromium.join(gone)).is_err());
        }
        assert!(!firefox.join(".parentlock").exists());
        assert!(std::fs::symlink_metadata(firefox.join("lock")).is_err());
        assert!(firefox.join("prefs.js").exists());
        assert!(chromium.join("lock").exists());
        assert!(std::fs::symlink_metadata(config.home.join("SingletonLock")).is_ok());
    }

    #[test]
    fn one_family_at_a_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = test_config(dir.path());
        let root = config.profiles_root();
        std::fs::create_dir_all(root.join("chromium")).expect("mkdir");
        std::fs::create_dir_all(root.join("mozilla/firefox/p")).expect("mkdir");
        symlink("h-1", root.join("chromium/SingletonLock")).expect("link");
        std::fs::write(root.join("mozilla/firefox/p/.parentlock"), "").expect("write");
        let removed = clear_profile_locks(&config, Some(ProfileFamily::Chromium)).expect("clear");
        assert_eq!(removed, vec![root.join("chromium/SingletonLock")]);
        assert!(root.join("mozilla/firefox/p/.parentlock").exists());
    }

    #[test]
    fn a_linked_profiles_root_or_subdir_is_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = test_config(dir.path());
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("chromium")).expect("mkdir");
        symlink("h-1", elsewhere.join("chromium/SingletonLock")).expect("link");
        symlink(&elsewhere, config.profiles_root()).expect("link root");
        assert!(clear_profile_locks(&config, None)
            .expect("clear")
            .is_empty());
        assert!(std::fs::symlink_metadata(elsewhere.join("chromium/SingletonLock")).is_ok());

        // A link inside a real root is not descended into either.
        std::fs::remove_file(config.profiles_root()).expect("unlink");
        std::fs::create_dir_all(config.profiles_root()).expect("mkdir");
        symlink(
            elsewhere.join("chromium"),
            config.profiles_root().join("chromium"),
        )
        .expect("link");
        assert!(clear_profile_locks(&config, None)
            .expect("clear")
            .is_empty());
        assert!(std::fs::symlink_metadata(elsewhere.join("chromium/SingletonLock")).is_ok());
    }

    #[test]
    fn x_locks_and_socket_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = test_config(dir.path());
        config.tmp_dir = dir.path().join("tmp");
        std::fs::create_dir_all(config.tmp_dir.join(".X11-unix")).expect("mkdir");
        std::fs::write(config.x_lock_path(), "      42\n").expect("write");
        std::fs::write(config.x_socket_path(), "").expect("write");
        std::fs::write(config.tmp_dir.join(".X2-lock"), "other display").expect("write");
        let removed = clear_x_locks(&config).expect("clear");
        assert_eq!(removed.len(), 2);
        assert!(!config.x_lock_path().exists());
        assert!(!config.x_socket_path().exists());
        assert!(config.tmp_dir.join(".X2-lock").exists());

        // A planted link instead of the socket directory is replaced.
        std::fs::remove_dir(config.x_socket_dir()).expect("rmdir");
        symlink(dir.path(), config.x_socket_dir()).expect("link");
        ensure_x_socket_dir(&config).expect("ensure");
        let meta = std::fs::symlink_metadata(config.x_socket_dir()).expect("lstat");
        assert!(meta.is_dir());
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(meta.permissions().mode() & 0o7777, 0o1777);
    }

    #[test]
    fn preferences_are_marked_clean_and_nothing_else_changes() {
        let mut prefs = serde_json::json!({
            "profile": {"exit_type": "Crashed", "exited_cleanly": false, "name": "Person 1"},
            "browser": {"x": 1}
        });
        assert!(mark_clean_exit(&mut prefs));
        assert_eq!(prefs["profile"]["exit_type"], "Normal");
        assert_eq!(prefs["profile"]["exited_cleanly"], true);
        assert_eq!(prefs["profile"]["name"], "Person 1");
        assert_eq!(prefs["browser"]["x"], 1);
        assert!(!mark_clean_exit(&mut prefs), "already clean");

        let dir = tempfile::tempdir().expect("tempdir");
        let config = test_config(dir.path());
        let default = config.profiles_root().join("chromium/Default");
        std::fs::create_dir_all(&default).expect("mkdir");
        std::fs::write(
            default.join("Preferences"),
            r#"{"profile":{"exit_type":"Crashed","exited_cleanly":false}}"#,
        )
        .expect("write");
        let changed = mark_chromium_exited_cleanly(&config).expect("mark");
        assert_eq!(changed, vec![default.join("Preferences")]);
        let text = std::fs::read_to_string(default.join("Preferences")).expect("read");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["profile"]["exit_type"], "Normal");
        assert!(mark_chromium_exited_cleanly(&config)
            .expect("mark")
            .is_empty());
    }
}
