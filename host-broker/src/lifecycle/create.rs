//! `create`: a new computer from an image with a compatible protocol, in a
//! hardened container, with its workspace and run directory on the host.
//!
//! The image is resolved to its immutable ID first; the record is persisted
//! (by the owner) before the container is created; only then is the container
//! created and started. Hardening: `--network none`, no published ports,
//! `cap-drop ALL` plus exactly the supervisor's capabilities,
//! `no-new-privileges`, private IPC and cgroup namespaces, CPU/memory/swap/
//! pids limits, only the workspace and run-directory mounts, restart policy
//! `no`, no engine init (the supervisor is PID 1).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use dormouse_protocol::api::CreateComputer;
use dormouse_protocol::{LABEL_COMPUTER, LABEL_OWNER, LABEL_PROTOCOL, PROTOCOL_VERSION};
use uuid::Uuid;

use super::{container_name, engine_error, hostname, OpContext};
use crate::config::BrokerConfig;
use crate::engine::{
    BindMount, ContainerInfo, ContainerSpec, Engine, Hardening, ImageInfo, Limits,
};
use crate::error::BrokerError;
use crate::store::{ensure_dir, Paths, StoreError};

/// The capabilities a desktop keeps: exactly what its supervisor needs.
pub use dormouse_protocol::GUEST_CAPABILITIES as SUPERVISOR_CAPABILITIES;

/// Where the workspace is mounted in the guest.
pub const GUEST_WORKSPACE: &str = "/home/desk/workspace";
/// Where the run directory is mounted in the guest.
pub const GUEST_RUN_DIR: &str = "/run/dormouse";
/// uid and gid of the desk user in the guest.
pub const DESK_UID: u32 = 1000;

/// Longest computer name.
pub const MAX_NAME_LEN: usize = 64;
/// Longest owner key.
pub const MAX_OWNER_LEN: usize = 128;

/// The validated name and owner of a create request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Naming {
    /// Human name.
    pub name: String,
    /// Owner key.
    pub owner: String,
}

/// Validates a create request's name and owner (defaults: a short form of
/// the id, `default`).
pub fn validate(req: &CreateComputer, id: Uuid) -> Result<Naming, BrokerError> {
    let name = match &req.name {
        Some(n) => {
            if n.trim().is_empty() || n.len() > MAX_NAME_LEN || n.chars().any(char::is_control) {
                return Err(BrokerError::BadRequest(format!(
                    "name must be 1 to {MAX_NAME_LEN} printable characters"
                )));
            }
            n.clone()
        }
        None => hostname(id),
    };
    let owner = match &req.owner {
        Some(o) => {
            let ok = !o.is_empty()
                && o.len() <= MAX_OWNER_LEN
                && o.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._@:-".contains(c));
            if !ok {
                return Err(BrokerError::BadRequest(format!(
                    "owner must be 1 to {MAX_OWNER_LEN} characters of A-Z a-z 0-9 . _ @ : -"
                )));
            }
            o.clone()
        }
        None => "default".into(),
    };
    Ok(Naming { name, owner })
}

/// Whether an image's protocol label is one this broker speaks.
pub fn check_protocol_label(image: &ImageInfo) -> Result<(), BrokerError> {
    let Some(raw) = image.labels.get(LABEL_PROTOCOL) else {
        return Err(BrokerError::Image(format!(
            "image {} has no {LABEL_PROTOCOL} label: not a Dormouse desktop image",
            image.id
        )));
    };
    match raw.trim().parse::<u32>() {
        Ok(v) if (1..=PROTOCOL_VERSION).contains(&v) => Ok(()),
        Ok(v) => Err(BrokerError::Image(format!(
            "image {} speaks protocol {v}; this broker speaks 1 to {PROTOCOL_VERSION}",
            image.id
        ))),
        Err(_) => Err(BrokerError::Image(format!(
            "image {} has a malformed {LABEL_PROTOCOL} label",
            image.id
        ))),
    }
}

/// Resolves the configured image to its immutable ID and checks its label.
pub async fn resolve_image(engine: &dyn Engine, reference: &str) -> Result<ImageInfo, BrokerError> {
    let image = engine
        .image(reference)
        .await
        .map_err(engine_error)?
        .ok_or_else(|| BrokerError::Image(format!("image {reference} is not present")))?;
    if !image.id.starts_with("sha256:") {
        return Err(BrokerError::Image(format!(
            "image {reference} has no immutable content ID"
        )));
    }
    check_protocol_label(&image)?;
    Ok(image)
}

/// The hardened container settings for a computer.
pub fn container_spec(
    config: &BrokerConfig,
    paths: &Paths,
    id: Uuid,
    owner: &str,
    image_id: &str,
) -> ContainerSpec {
    let mut labels: BTreeMap<String, String> = config.container_labels.clone();
    labels.insert(LABEL_COMPUTER.into(), id.to_string());
    labels.insert(LABEL_OWNER.into(), owner.into());
    let mounts = vec![
        BindMount {
            source: paths.workspace(id),
            target: GUEST_WORKSPACE.into(),
            read_only: false,
        },
        BindMount {
            source: paths.run_dir(id),
            target: GUEST_RUN_DIR.into(),
            read_only: false,
        },
    ];
    let limits = &config.limits;
    ContainerSpec {
        name: container_name(id),
        image: image_id.into(),
        hostname: hostname(id),
        labels,
        mounts,
        hardening: Hardening {
            network_mode: "none".into(),
            cap_add: SUPERVISOR_CAPABILITIES
                .iter()
                .map(|c| (*c).into())
                .collect(),
            cap_drop: vec!["ALL".into()],
            security_opt: vec!["no-new-privileges".into()],
            ipc_mode: "private".into(),
            cgroupns_mode: "private".into(),
            privileged: false,
            publish_all_ports: false,
            restart_policy: "no".into(),
            init: false,
        },
        limits: Limits {
            nano_cpus: (limits.cpus * 1e9).round() as i64,
            memory: limits.memory_bytes,
            memory_swap: limits.memory_bytes,
            pids_limit: limits.pids,
        },
        command: Vec::new(),
    }
}

/// Makes the computer's directories: the run directory (0700, the broker's)
/// and the workspace, owned by the desk user so uid 1000 can use it in the
/// guest. With `adopt` the workspace a removed computer left behind is moved
/// in instead of making a new one.
pub fn prepare_dirs(paths: &Paths, id: Uuid, adopt: Option<&Path>) -> Result<(), StoreError> {
    ensure_dir(&paths.computer_dir(id))?;
    ensure_dir(&paths.run_dir(id))?;
    let workspace = paths.workspace(id);
    match adopt {
        Some(old) => {
            fs::rename(old, &workspace).map_err(|e| StoreError::Io {
                op: "adopt workspace",
                path: old.to_owned(),
                source: e,
            })?;
            crate::store::sync_dir(&paths.computer_dir(id))?;
        }
        None => {
            match fs::create_dir(&workspace) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(StoreError::Io {
                        op: "create workspace",
                        path: workspace,
                        source: e,
                    })
                }
            }
            fs::set_permissions(&workspace, fs::Permissions::from_mode(0o700)).map_err(|e| {
                StoreError::Io {
                    op: "chmod workspace",
                    path: workspace.clone(),
                    source: e,
                }
            })?;
        }
    }
    if let Err(e) = std::os::unix::fs::chown(&workspace, Some(DESK_UID), Some(DESK_UID)) {
        // A broker without CAP_CHOWN (rootless) leaves it to the supervisor,
        // which owns the workspace as root in the guest and fixes it there.
        tracing::warn!(path = %workspace.display(), error = %e, "cannot chown the workspace to 1000:1000");
    }
    Ok(())
}

/// Creates and starts the container of a persisted record; returns what the
/// engine says of it after the start.
pub async fn run(ctx: &OpContext, spec: &ContainerSpec) -> Result<ContainerInfo, BrokerError> {
    let engine = ctx.engine.as_ref();
    engine.create(spec).await.map_err(engine_error)?;
    engine.start(&spec.name).await.map_err(engine_error)?;
    engine
        .inspect(&spec.name)
        .await
        .map_err(engine_error)?
        .ok_or_else(|| BrokerError::Internal("the container vanished right after its start".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_is_hardened() {
        let mut config = BrokerConfig::new("/data".into());
        config.limits.cpus = 1.5;
        config.limits.memory_bytes = 1 << 30;
        config.limits.pids = 512;
        let paths = Paths::new("/data");
        let id = Uuid::new_v4();
        let spec = container_spec(&config, &paths, id, "alice", "sha256:abc");
        assert_eq!(spec.name, format!("dormouse-{id}"));
        assert_eq!(spec.image, "sha256:abc");
        assert_eq!(spec.hostname, hostname(id));
        let h = &spec.hardening;
        assert_eq!(h.network_mode, "none");
        assert_eq!(h.cap_drop, vec!["ALL".to_string()]);
        assert_eq!(
            h.cap_add,
            vec!["CHOWN", "DAC_OVERRIDE", "SETUID", "SETGID", "KILL"]
        );
        assert_eq!(h.security_opt, vec!["no-new-privileges".to_string()]);
        assert_eq!(h.ipc_mode, "private");
        assert_eq!(h.cgroupns_mode, "private");
        assert!(!h.privileged && !h.publish_all_ports && !h.init);
        assert_eq!(h.restart_policy, "no");
        assert_eq!(spec.limits.nano_cpus, 1_500_000_000);
        assert_eq!(spec.limits.memory, 1 << 30);
        assert_eq!(spec.limits.memory_swap, 1 << 30, "no swap beyond memory");
        assert_eq!(spec.limits.pids_limit, 512);
        let targets: Vec<_> = spec.mounts.iter().map(|m| m.target.as_str()).collect();
        assert_eq!(targets, vec!["/home/desk/workspace", "/run/dormouse"]);
        assert!(spec
            .mounts
            .iter()
            .all(|m| m.source.starts_with("/data/computers") && !m.read_only));
        assert_eq!(spec.labels.get(LABEL_COMPUTER), Some(&id.to_string()));
        assert_eq!(spec.labels.get(LABEL_OWNER), Some(&"alice".to_string()));
    }

    #[test]
    fn protocol_labels_are_checked() {
        let image = |v: Option<&str>| ImageInfo {
            id: "sha256:x".into(),
            labels: v
                .map(|v| BTreeMap::from([(LABEL_PROTOCOL.to_string(), v.to_string())]))
                .unwrap_or_default(),
        };
        assert!(check_protocol_label(&image(Some("1"))).is_ok());
        assert!(matches!(
            check_protocol_label(&image(None)),
            Err(BrokerError::Image(_))
        ));
        assert!(check_protocol_label(&image(Some("0"))).is_err());
        assert!(check_protocol_label(&image(Some("99"))).is_err());
        assert!(check_protocol_label(&image(Some("one"))).is_err());
    }

    #[test]
    fn names_and_owners_are_validated() {
        let id = Uuid::new_v4();
        let ok = validate(&CreateComputer::default(), id).expect("defaults");
        assert_eq!(ok.owner, "default");
        assert_eq!(ok.name, hostname(id));
        let bad_owner = CreateComputer {
            owner: Some("a b".into()),
            ..Default::default()
        };
        assert!(validate(&bad_owner, id).is_err());
        let long = CreateComputer {
            name: Some("x".repeat(65)),
            ..Default::default()
        };
        assert!(validate(&long, id).is_err());
    }

    #[test]
    fn directories_are_made_and_a_workspace_can_be_adopted() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let paths = Paths::new(tmp.path());
        let old = Uuid::new_v4();
        prepare_dirs(&paths, old, None).expect("dirs");
        fs::write(paths.workspace(old).join("kept"), "x").expect("write");
        let meta = fs::metadata(paths.run_dir(old)).expect("meta");
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        let new = Uuid::new_v4();
        prepare_dirs(&paths, new, Some(&paths.workspace(old))).expect("adopt");
        assert!(paths.workspace(new).join("kept").exists());
        assert!(!paths.workspace(old).exists());
    }
}
