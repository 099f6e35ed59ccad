//! The Docker backend's conventions: container names (`dormouse-<id>`),
//! hostnames, labels, mounts, and the hardened settings every desktop
//! container is created with.
//!
//! Hardening: `--network none`, no published ports, `cap-drop ALL` plus
//! exactly the supervisor's capabilities, `no-new-privileges`, Dormouse's
//! seccomp profile ([`seccomp`]), private IPC,
//! PID, UTS and cgroup namespaces, no devices, no sysctls, explicit ulimits,
//! CPU/memory/swap/pids limits, only the workspace and run-directory mounts,
//! restart policy `no`, no engine init (the supervisor is PID 1). This module
//! only describes; it never talks to the engine.

use std::collections::BTreeMap;

use dormouse_protocol::{LABEL_COMPUTER, LABEL_OWNER};
use uuid::Uuid;

use super::container_engine::{BindMount, ContainerSpec, Hardening, Limits, Process, Ulimit};
use super::{seccomp, DockerConfig};
pub use dormouse_core::engine::hostname;
use dormouse_core::engine::{BackendSpec, EngineError, Image};
use dormouse_core::paths::Paths;

/// The capabilities a desktop keeps: exactly what its supervisor needs.
pub use dormouse_protocol::GUEST_CAPABILITIES as SUPERVISOR_CAPABILITIES;

/// Where the workspace is mounted in the guest.
pub const GUEST_WORKSPACE: &str = "/home/desk/workspace";
/// Where the run directory is mounted in the guest.
pub const GUEST_RUN_DIR: &str = "/run/dormouse";
/// Every container name of ours starts so.
pub const NAME_PREFIX: &str = "dormouse-";

/// The settings of a desktop's container as its record keeps them.
pub fn to_backend(spec: &ContainerSpec) -> BackendSpec {
    // A `ContainerSpec` is plain strings, numbers and string-keyed maps:
    // encoding it cannot fail; a null spec would be refused on use anyway.
    BackendSpec::encode(spec).unwrap_or_else(|_| BackendSpec::from(serde_json::Value::Null))
}

/// The container settings a record keeps, as [`to_backend`] wrote them (or
/// as the broker wrote them before backends were named: the same JSON).
pub fn from_backend(spec: &BackendSpec) -> Result<ContainerSpec, EngineError> {
    spec.decode().map_err(|e| {
        EngineError::Failed(format!(
            "the record's container settings cannot be read: {e}"
        ))
    })
}

/// The container name of a computer: `dormouse-<id>`.
pub fn container_name(id: Uuid) -> String {
    format!("{NAME_PREFIX}{id}")
}

/// The computer a container name of ours stands for.
pub fn computer_of_name(name: &str) -> Option<Uuid> {
    name.strip_prefix(NAME_PREFIX)
        .and_then(|v| Uuid::parse_str(v).ok())
}

/// The label filters that select this broker's containers.
pub fn our_labels(config: &DockerConfig) -> Vec<String> {
    let mut labels = vec![LABEL_COMPUTER.to_owned()];
    labels.extend(config.labels.iter().map(|(k, v)| format!("{k}={v}")));
    labels
}

/// Whether labels carry every one of `wanted` (`key` or `key=value`), the
/// way an engine's label filter means it.
pub fn carries_labels(labels: &BTreeMap<String, String>, wanted: &[String]) -> bool {
    wanted.iter().all(|w| match w.split_once('=') {
        Some((k, v)) => labels.get(k).is_some_and(|have| have == v),
        None => labels.contains_key(w.as_str()),
    })
}

/// Open files per process in a desktop (a browser with many tabs needs
/// thousands; engines commonly run with 20 000 to 1 048 576).
pub const NOFILE: i64 = 16_384;

/// Processes per user id, counted across the host (the kernel counts uid
/// 1000 of every desktop together): room for 64 desktops of a hundred
/// processes each, below the limits engines commonly run with (a container
/// without CAP_SYS_RESOURCE can only lower a limit, never raise it). The
/// per-desktop bound is the pids limit.
pub const NPROC: i64 = 8_192;

/// The hardened container settings for a computer. `image` is the resolved
/// image: its entrypoint, command and user are what the container must run.
pub fn container_spec(
    config: &DockerConfig,
    paths: &Paths,
    id: Uuid,
    owner: &str,
    image: &Image,
) -> ContainerSpec {
    let mut labels: BTreeMap<String, String> = config.labels.clone();
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
    let ulimits = ulimits();
    ContainerSpec {
        name: container_name(id),
        image: image.id.clone(),
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
            security_opt: vec![
                "no-new-privileges".into(),
                seccomp::security_opt(config.dialect, paths),
            ],
            ipc_mode: "private".into(),
            cgroupns_mode: "private".into(),
            privileged: false,
            publish_all_ports: false,
            restart_policy: "no".into(),
            init: false,
            pid_mode: String::new(),
            uts_mode: String::new(),
            userns_mode: String::new(),
            devices: Vec::new(),
            sysctls: BTreeMap::new(),
            readonly_rootfs: false,
            ulimits,
        },
        limits: Limits {
            nano_cpus: nano_cpus(limits.cpus),
            memory: limits.memory_bytes,
            memory_swap: limits.memory_bytes,
            pids_limit: limits.pids,
        },
        command: Vec::new(),
        process: Some(Process {
            entrypoint: image.process.entrypoint.clone(),
            cmd: image.process.cmd.clone(),
            user: image.process.user.clone(),
        }),
    }
}

/// CPUs as the engine's nano-CPU count. A float has no checked conversion
/// to an integer: through its decimal form the rounding is explicit, and
/// anything out of range becomes a value the engine refuses (never 0, which
/// would mean "no limit").
fn nano_cpus(cpus: f64) -> i64 {
    format!("{:.0}", (cpus * 1e9).round())
        .parse()
        .unwrap_or(i64::MAX)
}

/// The ulimits of every desktop (and of the event probe), explicit for
/// every engine: they are hardening too, and an engine's defaults must not
/// decide them (Podman's exceed what a container without CAP_SYS_RESOURCE
/// may set, so its start fails without these).
/// Both stay under what engines run with by default, so setting them
/// never needs a privilege the container lacks.
pub fn ulimits() -> Vec<Ulimit> {
    vec![
        Ulimit {
            name: "nofile".into(),
            soft: NOFILE,
            hard: NOFILE,
        },
        Ulimit {
            name: "nproc".into(),
            soft: NPROC,
            hard: NPROC,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_fixed_per_computer() {
        let id = Uuid::parse_str("0123abcd-4567-89ab-cdef-0123456789ab").expect("uuid");
        assert_eq!(
            container_name(id),
            "dormouse-0123abcd-4567-89ab-cdef-0123456789ab"
        );
        assert_eq!(hostname(id), "desk-0123abcd");
    }
    use dormouse_core::config::BrokerConfig;

    fn image(id: &str) -> Image {
        Image {
            id: id.into(),
            labels: BTreeMap::new(),
            process: Process::default(),
        }
    }

    #[test]
    fn the_spec_is_hardened() {
        let mut config = BrokerConfig::new("/data".into());
        config.limits.cpus = 1.5;
        config.limits.memory_bytes = 1 << 30;
        config.limits.pids = 512;
        let paths = Paths::new("/data");
        let id = Uuid::new_v4();
        let spec = container_spec(
            &DockerConfig::from_broker(&config),
            &paths,
            id,
            "alice",
            &image("sha256:abc"),
        );
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
        assert_eq!(
            h.security_opt,
            vec![
                "no-new-privileges".to_string(),
                seccomp::security_opt(crate::Dialect::Docker, &paths)
            ]
        );
        assert_eq!(h.ipc_mode, "private");
        assert_eq!(h.cgroupns_mode, "private");
        assert!(!h.privileged && !h.publish_all_ports && !h.init);
        assert_eq!(h.restart_policy, "no");
        assert!(h.pid_mode.is_empty() && h.uts_mode.is_empty() && h.userns_mode.is_empty());
        assert!(h.devices.is_empty() && h.sysctls.is_empty() && !h.readonly_rootfs);
        let limits: Vec<(&str, i64, i64)> = h
            .ulimits
            .iter()
            .map(|u| (u.name.as_str(), u.soft, u.hard))
            .collect();
        assert_eq!(
            limits,
            vec![("nofile", NOFILE, NOFILE), ("nproc", NPROC, NPROC)],
            "explicit ulimits on every engine"
        );
        let podman = DockerConfig {
            dialect: crate::Dialect::Podman,
            ..DockerConfig::from_broker(&config)
        };
        let spec2 = container_spec(&podman, &paths, id, "alice", &image("sha256:abc"));
        assert_eq!(spec2.hardening.ulimits, spec.hardening.ulimits);
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
    fn labels_are_matched_by_key_or_by_key_and_value() {
        let labels = BTreeMap::from([
            (LABEL_COMPUTER.to_owned(), "x".to_owned()),
            ("team".to_owned(), "a".to_owned()),
        ]);
        assert!(carries_labels(&labels, &[LABEL_COMPUTER.to_owned()]));
        assert!(carries_labels(
            &labels,
            &[LABEL_COMPUTER.to_owned(), "team=a".to_owned()]
        ));
        assert!(!carries_labels(&labels, &["team=b".to_owned()]));
        assert!(!carries_labels(&labels, &[LABEL_OWNER.to_owned()]));
        assert!(carries_labels(&labels, &[]));
    }

    #[test]
    fn names_map_back_to_computers() {
        let id = Uuid::new_v4();
        assert_eq!(computer_of_name(&container_name(id)), Some(id));
        assert_eq!(computer_of_name("other-x"), None);
    }

    /// The `spec` of a record as the broker wrote it when the record held
    /// this backend's `ContainerSpec` inline (no process, none of the newer
    /// hardening fields): it still reads as a `ContainerSpec`, and reads the
    /// same after a round trip through the core's opaque `BackendSpec`.
    #[test]
    fn a_spec_written_before_backends_were_named_still_reads() {
        let old = r#"{
            "name": "dormouse-0123abcd-4567-89ab-cdef-0123456789ab",
            "image": "sha256:abc",
            "hostname": "desk-0123abcd",
            "labels": {"dev.dormouse.computer": "0123abcd-4567-89ab-cdef-0123456789ab"},
            "mounts": [{"source": "/data/w", "target": "/home/desk/workspace", "read_only": false}],
            "hardening": {
              "network_mode": "none", "cap_add": ["CHOWN"], "cap_drop": ["ALL"],
              "security_opt": ["no-new-privileges"], "ipc_mode": "private",
              "cgroupns_mode": "private", "privileged": false, "publish_all_ports": false,
              "restart_policy": "no", "init": false
            },
            "limits": {"nano_cpus": 1, "memory": 2, "memory_swap": 2, "pids_limit": 3}
        }"#;
        let stored: BackendSpec = serde_json::from_str(old).expect("a record's spec");
        let spec = from_backend(&stored).expect("reads as a ContainerSpec");
        assert_eq!(spec.name, "dormouse-0123abcd-4567-89ab-cdef-0123456789ab");
        assert_eq!(spec.hardening.cap_add, vec!["CHOWN".to_string()]);
        assert!(spec.hardening.ulimits.is_empty() && spec.process.is_none());
        assert_eq!(spec.limits.pids_limit, 3);
        assert_eq!(from_backend(&to_backend(&spec)).expect("again"), spec);
        assert_eq!(
            stored.describe(),
            "container dormouse-0123abcd-4567-89ab-cdef-0123456789ab"
        );
    }

    #[test]
    fn settings_that_are_not_a_container_spec_are_refused_not_guessed() {
        let stored = BackendSpec::from(serde_json::json!({"name": "x"}));
        assert!(from_backend(&stored).is_err());
        assert!(from_backend(&BackendSpec::from(serde_json::Value::Null)).is_err());
    }
}
