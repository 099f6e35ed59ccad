//! Host-side limits on what a guest may write to its workspace: a project
//! quota (bytes and inodes) on the data directory's filesystem, where the
//! filesystem and the host allow one, and an honest "not enforced, because"
//! where they do not.
//!
//! It owns deciding whether a limit can be enforced and setting it, through
//! the standard tools (`chattr -p` sets the project id and its inheritance,
//! `setquota -P` or `xfs_quota` the limits: both need an ioctl or
//! `quotactl`, which the broker does not call itself, being free of
//! `unsafe`). It never blocks the caller's thread (the tools run as async
//! child processes, bounded in time), never fails a create or a start (a
//! limit that cannot be set is reported, not fatal), and never touches a
//! path outside the workspace it is given.
//!
//! A project id is derived from the computer's UUID (see [`project_id`]), so
//! the same computer gets the same id after a broker restart without storing
//! anything.

use std::path::{Path, PathBuf};
use std::time::Duration;

use dormouse_protocol::api::WorkspaceLimit;
use uuid::Uuid;

/// Default workspace size limit: 10 GiB.
pub const DEFAULT_WORKSPACE_BYTES: u64 = 10 << 30;

/// Default workspace inode limit: one million files and directories.
pub const DEFAULT_WORKSPACE_INODES: u64 = 1_000_000;

/// The smallest size limit accepted (a quota tool reads 0 as "no limit").
pub const MIN_WORKSPACE_BYTES: u64 = 1 << 20;

/// The smallest inode limit accepted (0 would mean "no limit").
pub const MIN_WORKSPACE_INODES: u64 = 1;

/// Bound on each quota tool run.
const TOOL_TIMEOUT: Duration = Duration::from_secs(10);

/// The limits asked for one workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceQuota {
    /// Most bytes.
    pub bytes: u64,
    /// Most inodes.
    pub inodes: u64,
}

impl Default for WorkspaceQuota {
    fn default() -> Self {
        Self {
            bytes: DEFAULT_WORKSPACE_BYTES,
            inodes: DEFAULT_WORKSPACE_INODES,
        }
    }
}

/// The project quota id of a computer: 31 bits of its UUID with the top bit
/// set, so it never collides with the small ids operators assign by hand
/// (ids below 2^30). Two computers share an id with odds of about n²/2^31.
pub fn project_id(id: Uuid) -> u32 {
    let b = id.as_bytes();
    let low = u32::from_be_bytes([b[12], b[13], b[14], b[15]]) & 0x3fff_ffff;
    0x4000_0000 | low
}

/// Filesystems that have project quotas, as `statfs` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QuotaFs {
    Ext4,
    Xfs,
}

/// Sets the project quota `quota` on `workspace` for computer `id` and says
/// whether it is enforced; the reason, when not, names no host path (it is
/// served in the status). Safe to call again on every start: the id and the
/// limits are simply set again (files made while no limit held are relabelled).
pub async fn apply_workspace_limit(
    id: Uuid,
    workspace: &Path,
    quota: WorkspaceQuota,
) -> WorkspaceLimit {
    match try_apply(project_id(id), workspace, quota).await {
        Ok(()) => WorkspaceLimit {
            enforced: true,
            bytes: Some(quota.bytes),
            inodes: Some(quota.inodes),
            reason: None,
        },
        Err(reason) => {
            tracing::warn!(computer = %id, reason, "the workspace has no size limit");
            not_enforced(reason)
        }
    }
}

/// A limit that is not enforced, with its reason.
pub fn not_enforced(reason: impl Into<String>) -> WorkspaceLimit {
    WorkspaceLimit {
        enforced: false,
        bytes: None,
        inodes: None,
        reason: Some(reason.into()),
    }
}

async fn try_apply(project: u32, workspace: &Path, quota: WorkspaceQuota) -> Result<(), String> {
    // A tool's message may name the workspace; the status must not.
    set_quota(project, workspace, quota)
        .await
        .map_err(|reason| reason.replace(&*workspace.to_string_lossy(), "the workspace"))
}

async fn set_quota(project: u32, workspace: &Path, quota: WorkspaceQuota) -> Result<(), String> {
    let path = workspace.to_owned();
    let (fs, mount) = tokio::task::spawn_blocking(move || inspect(&path))
        .await
        .map_err(|e| format!("inspecting the workspace's filesystem failed: {e}"))??;
    let project = project.to_string();
    let workspace_arg = workspace.as_os_str().to_owned();
    // -R: files already there (a re-adopted workspace) count too; +P: new
    // files inherit the project.
    run(
        "chattr",
        &[
            "-R".as_ref(),
            "+P".as_ref(),
            "-p".as_ref(),
            project.as_ref(),
            workspace_arg.as_os_str(),
        ],
    )
    .await?;
    let redact = |reason: String| {
        if mount.as_os_str().len() > 1 {
            reason.replace(&*mount.to_string_lossy(), "the data filesystem")
        } else {
            reason
        }
    };
    let kib = quota.bytes.div_ceil(1024).to_string();
    let inodes = quota.inodes.to_string();
    match fs {
        QuotaFs::Ext4 => run(
            "setquota",
            &[
                "-P".as_ref(),
                project.as_ref(),
                kib.as_ref(),
                kib.as_ref(),
                inodes.as_ref(),
                inodes.as_ref(),
                mount.as_os_str(),
            ],
        )
        .await
        .map_err(redact),
        QuotaFs::Xfs => {
            let command = format!(
                "limit -p bsoft={kib}k bhard={kib}k isoft={inodes} ihard={inodes} {project}"
            );
            run(
                "xfs_quota",
                &[
                    "-x".as_ref(),
                    "-c".as_ref(),
                    command.as_ref(),
                    mount.as_os_str(),
                ],
            )
            .await
            .map_err(redact)
        }
    }
}

/// The workspace's filesystem, if it has project quotas switched on, and its
/// mount point; else why not.
fn inspect(workspace: &Path) -> Result<(QuotaFs, PathBuf), String> {
    let stat = nix::sys::statfs::statfs(workspace)
        .map_err(|e| format!("the workspace's filesystem cannot be inspected: {e}"))?;
    let real = std::fs::canonicalize(workspace)
        .map_err(|e| format!("the workspace path cannot be resolved: {e}"))?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo cannot be read: {e}"))?;
    decide(stat.filesystem_type(), &mountinfo, &real)
}

/// The decision, from what `statfs` and `/proc/self/mountinfo` say about the
/// workspace at (resolved) path `real`: a filesystem with project quotas,
/// mounted with them enforced, or why not.
fn decide(
    kind: nix::sys::statfs::FsType,
    mountinfo: &str,
    real: &Path,
) -> Result<(QuotaFs, PathBuf), String> {
    let fs = if kind == nix::sys::statfs::EXT4_SUPER_MAGIC {
        QuotaFs::Ext4
    } else if kind == nix::sys::statfs::XFS_SUPER_MAGIC {
        QuotaFs::Xfs
    } else {
        return Err(format!(
            "the data directory is on {}, which has no project quotas (ext4 or xfs mounted \
             with prjquota has them)",
            fs_name(kind)
        ));
    };
    let (mount, options) = mount_of(mountinfo, real)
        .ok_or_else(|| "the workspace's mount point is not in /proc/self/mountinfo".to_owned())?;
    let enforced = options
        .split(',')
        .any(|o| matches!(o, "prjquota" | "pquota"))
        && !options.split(',').any(|o| o == "pqnoenforce");
    if !enforced {
        // The mount point goes to the log only: statuses carry no host paths.
        tracing::debug!(mount = %mount.display(), options, "no enforced project quotas");
        return Err(format!(
            "the data directory's filesystem ({}) is mounted without enforced project \
             quotas (mount option prjquota, on a kernel built with quota support)",
            match fs {
                QuotaFs::Ext4 => "ext4",
                QuotaFs::Xfs => "xfs",
            }
        ));
    }
    Ok((fs, mount))
}

/// The mount point holding `path` (the longest mount point that is a prefix
/// of it) and its mount and superblock options, from `/proc/self/mountinfo`.
fn mount_of(mountinfo: &str, path: &Path) -> Option<(PathBuf, String)> {
    let mut best: Option<(PathBuf, String)> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(point), Some(mount_opts), Some(super_opts)) =
            (fields.get(4), fields.get(5), fields.get(sep + 3))
        else {
            continue;
        };
        let point = PathBuf::from(unescape(point));
        if !path.starts_with(&point) {
            continue;
        }
        if best
            .as_ref()
            .is_none_or(|(b, _)| point.as_os_str().len() >= b.as_os_str().len())
        {
            best = Some((point, format!("{mount_opts},{super_opts}")));
        }
    }
    best
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn fs_name(kind: nix::sys::statfs::FsType) -> &'static str {
    use nix::sys::statfs::*;
    if kind == TMPFS_MAGIC {
        "tmpfs"
    } else if kind == OVERLAYFS_SUPER_MAGIC {
        "overlayfs"
    } else if kind == BTRFS_SUPER_MAGIC {
        "btrfs (use a subvolume quota by hand)"
    } else if kind == NFS_SUPER_MAGIC {
        "NFS"
    } else if kind == FUSE_SUPER_MAGIC {
        "a FUSE filesystem"
    } else {
        "a filesystem"
    }
}

/// Runs a quota tool, bounded in time; its failure as a reason.
async fn run(program: &str, args: &[&std::ffi::OsStr]) -> Result<(), String> {
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(TOOL_TIMEOUT, child).await {
        Err(_) => Err(format!("{program} did not finish within {TOOL_TIMEOUT:?}")),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "{program} is not installed (package {})",
            match program {
                "chattr" => "e2fsprogs",
                "setquota" => "quota",
                _ => "xfsprogs",
            }
        )),
        Ok(Err(e)) => Err(format!("{program} could not run: {e}")),
        Ok(Ok(out)) if out.status.success() => Ok(()),
        Ok(Ok(out)) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let first = stderr
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(200)
                .collect::<String>();
            Err(format!("{program} failed ({}): {first}", out.status))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_ids_are_stable_and_above_hand_assigned_ones() {
        let id = Uuid::parse_str("67e55044-10b1-426f-9247-bb680e5fe0c8").expect("uuid");
        assert_eq!(project_id(id), project_id(id));
        assert!(project_id(id) >= 0x4000_0000);
        assert!(project_id(Uuid::max()) < 0x8000_0000);
        assert_ne!(project_id(id), project_id(Uuid::new_v4()));
    }

    #[test]
    fn the_mount_of_a_path_is_the_longest_prefix() {
        let info = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw,errors=remount-ro
30 22 8:2 / /srv/dormouse rw,relatime shared:2 - xfs /dev/vdb rw,prjquota
31 22 0:40 / /srv/dormouse\\040x rw - tmpfs tmpfs rw,size=1024k
";
        let (point, opts) =
            mount_of(info, Path::new("/srv/dormouse/computers/x/workspace")).expect("found");
        assert_eq!(point, PathBuf::from("/srv/dormouse"));
        assert!(opts.contains("prjquota"));
        let (point, _) = mount_of(info, Path::new("/srv/dormouse x/a")).expect("found");
        assert_eq!(point, PathBuf::from("/srv/dormouse x"));
        let (point, _) = mount_of(info, Path::new("/home/a")).expect("found");
        assert_eq!(point, PathBuf::from("/"));
    }

    const MOUNTS: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw,errors=remount-ro
30 22 8:2 / /srv/q rw,relatime shared:2 - ext4 /dev/vdb rw,prjquota
31 22 8:3 / /srv/x rw,relatime shared:3 - xfs /dev/vdc rw,attr2,inode64,prjquota
32 22 8:4 / /srv/noenforce rw,relatime shared:4 - xfs /dev/vdd rw,pqnoenforce,prjquota
33 22 8:5 / /srv/user rw,relatime shared:5 - ext4 /dev/vde rw,usrquota
";

    #[test]
    fn only_ext4_and_xfs_with_enforced_project_quotas_are_enforced() {
        use nix::sys::statfs::{EXT4_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC};
        let at = |p: &str| Path::new(p).to_owned();
        assert_eq!(
            decide(
                EXT4_SUPER_MAGIC,
                MOUNTS,
                &at("/srv/q/computers/a/workspace")
            ),
            Ok((QuotaFs::Ext4, at("/srv/q")))
        );
        assert_eq!(
            decide(XFS_SUPER_MAGIC, MOUNTS, &at("/srv/x/w")),
            Ok((QuotaFs::Xfs, at("/srv/x")))
        );
        let refused = |kind, path: &str| decide(kind, MOUNTS, &at(path)).unwrap_err();
        // Quotas counted but not enforced, user quotas only, none at all.
        for path in ["/srv/noenforce/w", "/srv/user/w", "/home/w"] {
            let kind = if path.starts_with("/srv/noenforce") {
                XFS_SUPER_MAGIC
            } else {
                EXT4_SUPER_MAGIC
            };
            let why = refused(kind, path);
            assert!(why.contains("without enforced project quotas"), "{why}");
            assert!(why.contains("prjquota"), "{why}");
            assert!(
                !why.contains("/srv") && !why.contains("/dev/"),
                "no host path: {why}"
            );
        }
        let why = refused(TMPFS_MAGIC, "/srv/q/w");
        assert!(
            why.contains("tmpfs") && why.contains("no project quotas"),
            "{why}"
        );
        assert!(refused(nix::sys::statfs::OVERLAYFS_SUPER_MAGIC, "/w").contains("overlayfs"));
        assert!(refused(EXT4_SUPER_MAGIC, "relative/w").contains("mount point"));
    }

    /// Here the data directory is a temporary directory: on tmpfs, or on an
    /// ext4/xfs without prjquota (or a kernel without quotas). Either way
    /// the answer is "not enforced" with a reason, and nothing fails.
    #[tokio::test]
    async fn an_unsupported_filesystem_is_reported_not_enforced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let limit =
            apply_workspace_limit(Uuid::new_v4(), dir.path(), WorkspaceQuota::default()).await;
        if limit.enforced {
            eprintln!("the test directory's filesystem enforces project quotas: {limit:?}");
            return;
        }
        let reason = limit.reason.expect("a reason");
        eprintln!("not enforced: {reason}");
        assert!(!reason.is_empty());
        assert_eq!(limit.bytes, None);
    }
}
