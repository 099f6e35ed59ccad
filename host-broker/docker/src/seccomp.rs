//! Dormouse's seccomp profile: Docker's default plus what Chromium's
//! namespace sandbox needs (`clone`/`unshare` of user, PID and network
//! namespaces, and `chroot` from inside one), every addition documented in
//! docs/security.md.
//!
//! Owns the profile (embedded in the binary from `seccomp/dormouse.json`),
//! the security option that names it at create, in the form each engine
//! takes (Docker: the profile itself; Podman: a file of it under the data
//! directory, written before the create), and the canonical form a resume
//! compares (a digest of the profile, whatever its spacing). It never
//! decides whether a container may resume; `resume` does, on that form.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::Dialect;
use dormouse_core::engine::EngineError;
use dormouse_core::paths::Paths;

/// The profile as shipped.
pub const PROFILE: &str = include_str!("../seccomp/dormouse.json");

/// The prefix of a seccomp security option.
const OPTION: &str = "seccomp=";

/// The profile in one line (what Docker stores and reports back verbatim).
/// The embedded text is valid JSON (a unit test parses it), so this only
/// drops its line breaks and indentation.
pub fn compact() -> String {
    serde_json::from_str::<serde_json::Value>(PROFILE)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| PROFILE.to_owned())
}

/// The SHA-256 of a profile's canonical JSON, in hex; `None` when `text`
/// is not JSON.
pub fn digest(text: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let hash = Sha256::digest(value.to_string().as_bytes());
    Some(hash.iter().map(|b| format!("{b:02x}")).collect())
}

/// The digest of the shipped profile.
pub fn profile_digest() -> String {
    digest(PROFILE).unwrap_or_default()
}

/// Where a Podman host keeps the profile file: content-addressed, so a
/// broker with another profile never overwrites one a container names.
pub fn profile_path(paths: &Paths) -> PathBuf {
    let digest = profile_digest();
    paths
        .data()
        .join("seccomp")
        .join(format!("dormouse-{}.json", &digest[..16.min(digest.len())]))
}

/// The security option that gives a new container the profile.
pub fn security_opt(dialect: Dialect, paths: &Paths) -> String {
    match dialect {
        // Docker takes the profile itself (its CLI reads a file and sends
        // the content) and reports it back as given.
        Dialect::Docker => format!("{OPTION}{}", compact()),
        // Podman's compatible API takes a path on its host and opens it.
        Dialect::Podman => format!("{OPTION}{}", profile_path(paths).display()),
    }
}

/// Writes the profile file a Podman create names, when it is not there
/// with this content already.
pub fn install(dialect: Dialect, paths: &Paths) -> Result<(), EngineError> {
    if dialect != Dialect::Podman {
        return Ok(());
    }
    let path = profile_path(paths);
    if std::fs::read_to_string(&path).is_ok_and(|have| have == PROFILE) {
        return Ok(());
    }
    let failed = |e: std::io::Error| {
        tracing::error!(path = %path.display(), error = %e, "writing the seccomp profile failed");
        EngineError::Failed("the seccomp profile cannot be written for the engine".into())
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(failed)?;
    let partial = dir.join(format!(".{}.partial", std::process::id()));
    std::fs::write(&partial, PROFILE).map_err(failed)?;
    std::fs::rename(&partial, &path).map_err(failed)
}

/// A security option in the form a comparison uses: a seccomp profile given
/// inline becomes `seccomp=sha256:<digest>` (equal profiles compare equal
/// whatever their spacing; a diff stays short); anything else is as given.
pub fn canonical(option: &str) -> String {
    match option.strip_prefix(OPTION) {
        Some(value) if value.trim_start().starts_with('{') => match digest(value) {
            Some(d) => format!("{OPTION}sha256:{d}"),
            None => format!("{OPTION}<not JSON>"),
        },
        _ => option.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn rules() -> Vec<Value> {
        let profile: Value = serde_json::from_str(PROFILE).expect("the profile is JSON");
        profile["syscalls"].as_array().expect("syscalls").clone()
    }

    fn names(rule: &Value) -> Vec<&str> {
        rule["names"]
            .as_array()
            .expect("names")
            .iter()
            .map(|n| n.as_str().expect("a name"))
            .collect()
    }

    /// The additions are exactly the rules marked `Dormouse:`, each on the
    /// calls of the namespace sandbox, and none lets a mount, cgroup, UTS
    /// or IPC namespace be made.
    #[test]
    fn the_additions_are_the_namespace_sandboxs_and_no_more() {
        const NEWNS: u64 = 0x0002_0000;
        const NEWCGROUP: u64 = 0x0200_0000;
        const NEWUTS: u64 = 0x0400_0000;
        const NEWIPC: u64 = 0x0800_0000;
        let added: Vec<Value> = rules()
            .into_iter()
            .filter(|r| {
                r["comment"]
                    .as_str()
                    .is_some_and(|c| c.contains("Dormouse:"))
            })
            .collect();
        let added_names: Vec<&str> = added.iter().flat_map(names).collect();
        assert_eq!(added_names, ["clone", "unshare", "clone", "chroot"]);
        for rule in added.iter().filter(|r| names(r) != ["chroot"]) {
            let mask = rule["args"][0]["value"].as_u64().expect("a mask");
            assert_eq!(rule["args"][0]["op"], "SCMP_CMP_MASKED_EQ");
            assert_eq!(mask, NEWNS | NEWCGROUP | NEWUTS | NEWIPC, "{rule}");
        }
        // Nothing else gets a namespace or a mount without CAP_SYS_ADMIN.
        for rule in rules() {
            let n = names(&rule);
            if n.contains(&"mount") || n.contains(&"setns") {
                assert_eq!(rule["includes"]["caps"][0], "CAP_SYS_ADMIN", "{rule}");
            }
        }
    }

    #[test]
    fn the_option_names_the_profile_per_engine() {
        let paths = Paths::new("/data");
        let docker = security_opt(Dialect::Docker, &paths);
        assert!(docker.starts_with("seccomp={") && !docker.contains('\n'));
        assert_eq!(
            canonical(&docker),
            format!("seccomp=sha256:{}", profile_digest())
        );
        // Spacing does not matter; content does.
        assert_eq!(canonical(&docker), canonical(&format!("seccomp={PROFILE}")));
        assert_ne!(
            canonical(&docker),
            canonical(r#"seccomp={"defaultAction":"SCMP_ACT_ALLOW"}"#)
        );
        let podman = security_opt(Dialect::Podman, &paths);
        assert!(podman.starts_with("seccomp=/data/seccomp/dormouse-"));
        assert_eq!(canonical(&podman), podman);
        assert_eq!(canonical("no-new-privileges"), "no-new-privileges");
        assert_eq!(canonical("seccomp=unconfined"), "seccomp=unconfined");
    }

    #[test]
    fn podman_gets_the_file_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = Paths::new(dir.path());
        install(Dialect::Docker, &paths).expect("nothing to do");
        assert!(!profile_path(&paths).exists());
        install(Dialect::Podman, &paths).expect("written");
        let text = std::fs::read_to_string(profile_path(&paths)).expect("the file");
        assert_eq!(text, PROFILE);
        install(Dialect::Podman, &paths).expect("again, unchanged");
        let files = std::fs::read_dir(dir.path().join("seccomp"))
            .expect("dir")
            .count();
        assert_eq!(files, 1, "no partial file left behind");
    }
}
