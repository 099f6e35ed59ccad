//! The translation between bollard's models and the engine trait's types
//! ([`super::super::container_engine`]): inspect answers, summaries and
//! events in, a container spec out, bollard's errors onto [`EngineError`].
//! Pure functions; it never talks to the engine.

use std::collections::{BTreeMap, HashMap};

use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerStateStatusEnum,
    ContainerSummary as BollardSummary, ContainerSummaryStateEnum, EventMessage, HostConfig,
    HostConfigCgroupnsModeEnum, Mount, MountType, ResourcesUlimits, RestartPolicy,
    RestartPolicyNameEnum,
};
use chrono::{TimeZone, Utc};

use crate::container_engine::{
    parse_engine_time, ContainerInfo, ContainerSpec, ContainerSummary, EngineError, EngineEvent,
    Hardening, Limits, MountInfo, Process, RunState, Ulimit,
};

/// Maps bollard's errors onto ours: transport failures mean "unreachable".
pub(super) fn map_err(e: BollardError) -> EngineError {
    match e {
        BollardError::DockerResponseServerError {
            status_code: 404,
            message,
        } => EngineError::NotFound(message),
        BollardError::DockerResponseServerError {
            status_code: 409,
            message,
        } => EngineError::Conflict(message),
        BollardError::DockerResponseServerError {
            status_code,
            message,
        } => EngineError::Failed(format!("{status_code}: {message}")),
        BollardError::RequestTimeoutError
        | BollardError::IOError { .. }
        | BollardError::HyperResponseError { .. }
        | BollardError::HyperLegacyError { .. }
        | BollardError::SocketNotFoundError(_) => EngineError::Unavailable(e.to_string()),
        other => EngineError::Failed(other.to_string()),
    }
}

/// The `label` filter of a listing or an event subscription; none for no
/// labels (an empty filter list is not something every engine accepts).
pub(super) fn label_filters(labels: &[String]) -> HashMap<String, Vec<String>> {
    if labels.is_empty() {
        return HashMap::new();
    }
    HashMap::from([("label".to_owned(), labels.to_vec())])
}

pub(super) fn run_state_of_status(status: Option<ContainerStateStatusEnum>) -> RunState {
    match status {
        Some(ContainerStateStatusEnum::CREATED) => RunState::Created,
        Some(ContainerStateStatusEnum::RUNNING) => RunState::Running,
        Some(ContainerStateStatusEnum::PAUSED) => RunState::Paused,
        Some(ContainerStateStatusEnum::RESTARTING) => RunState::Restarting,
        Some(ContainerStateStatusEnum::REMOVING) => RunState::Removing,
        Some(ContainerStateStatusEnum::EXITED) => RunState::Exited,
        Some(ContainerStateStatusEnum::DEAD) => RunState::Dead,
        _ => RunState::Other,
    }
}

pub(super) fn run_state_of_summary(state: Option<ContainerSummaryStateEnum>) -> RunState {
    match state {
        Some(ContainerSummaryStateEnum::CREATED) => RunState::Created,
        Some(ContainerSummaryStateEnum::RUNNING) => RunState::Running,
        Some(ContainerSummaryStateEnum::PAUSED) => RunState::Paused,
        Some(ContainerSummaryStateEnum::RESTARTING) => RunState::Restarting,
        Some(ContainerSummaryStateEnum::REMOVING) => RunState::Removing,
        Some(ContainerSummaryStateEnum::EXITED) => RunState::Exited,
        Some(ContainerSummaryStateEnum::DEAD) => RunState::Dead,
        _ => RunState::Other,
    }
}

pub(super) fn btree(map: Option<HashMap<String, String>>) -> BTreeMap<String, String> {
    map.unwrap_or_default().into_iter().collect()
}

/// Our plain view of an inspect answer.
// Over 100 lines on purpose: a field-by-field translation of one inspect
// answer into `ContainerInfo`; each line is one field, and apart the
// fields of one answer would be spread over helpers.
pub(super) fn container_info(raw: ContainerInspectResponse) -> ContainerInfo {
    let state = raw.state.unwrap_or_default();
    let host = raw.host_config.unwrap_or_default();
    let config = raw.config.unwrap_or_default();
    let mut mounts: Vec<MountInfo> = raw
        .mounts
        .unwrap_or_default()
        .into_iter()
        .map(|m| MountInfo {
            kind: m.typ.unwrap_or_default(),
            source: m.source.or(m.name).unwrap_or_default(),
            target: m.destination.unwrap_or_default(),
            read_only: !m.rw.unwrap_or(true),
        })
        .collect();
    mounts.sort();
    let mut networks: Vec<String> = raw
        .network_settings
        .and_then(|n| n.networks)
        .map(|n| n.into_keys().collect())
        .unwrap_or_default();
    networks.sort();
    let published_ports = host.port_bindings.as_ref().is_some_and(|p| {
        p.values()
            .any(|b| b.as_ref().is_some_and(|b| !b.is_empty()))
    });
    let hardening = Hardening {
        network_mode: host.network_mode.clone().unwrap_or_default(),
        cap_add: host.cap_add.clone().unwrap_or_default(),
        cap_drop: host.cap_drop.clone().unwrap_or_default(),
        security_opt: host.security_opt.clone().unwrap_or_default(),
        ipc_mode: host.ipc_mode.clone().unwrap_or_default(),
        cgroupns_mode: host
            .cgroupns_mode
            .map(|m| m.to_string())
            .unwrap_or_default(),
        privileged: host.privileged.unwrap_or(false),
        publish_all_ports: host.publish_all_ports.unwrap_or(false),
        restart_policy: host
            .restart_policy
            .as_ref()
            .and_then(|r| r.name)
            .map(|n| n.to_string())
            .unwrap_or_default(),
        init: host.init.unwrap_or(false),
        pid_mode: host.pid_mode.clone().unwrap_or_default(),
        uts_mode: host.uts_mode.clone().unwrap_or_default(),
        userns_mode: host.userns_mode.clone().unwrap_or_default(),
        devices: host
            .devices
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|d| {
                format!(
                    "{}:{}:{}",
                    d.path_on_host.unwrap_or_default(),
                    d.path_in_container.unwrap_or_default(),
                    d.cgroup_permissions.unwrap_or_default()
                )
            })
            .chain(
                host.device_requests
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|r| format!("request:{}", r.driver.unwrap_or_default())),
            )
            .chain(
                host.device_cgroup_rules
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|r| format!("cgroup-rule:{r}")),
            )
            .collect(),
        sysctls: btree(host.sysctls.clone()),
        readonly_rootfs: host.readonly_rootfs.unwrap_or(false),
        ulimits: host
            .ulimits
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|u| Ulimit {
                name: u.name.unwrap_or_default(),
                soft: u.soft.unwrap_or(0),
                hard: u.hard.unwrap_or(0),
            })
            .collect(),
    };
    let limits = Limits {
        nano_cpus: host.nano_cpus.unwrap_or(0),
        memory: host.memory.unwrap_or(0),
        memory_swap: host.memory_swap.unwrap_or(0),
        pids_limit: host.pids_limit.unwrap_or(0),
    };
    let process = Process {
        entrypoint: config.entrypoint.clone().unwrap_or_default(),
        cmd: config.cmd.clone().unwrap_or_default(),
        user: config.user.clone().unwrap_or_default(),
    };
    ContainerInfo {
        process,
        apparmor_profile: raw.app_armor_profile.unwrap_or_default(),
        id: raw.id.unwrap_or_default(),
        name: raw
            .name
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_owned(),
        image: raw.image.unwrap_or_default(),
        hostname: config.hostname.unwrap_or_default(),
        labels: btree(config.labels),
        state: run_state_of_status(state.status),
        started_at: parse_engine_time(state.started_at.as_deref()),
        finished_at: parse_engine_time(state.finished_at.as_deref()),
        exit_code: state.exit_code,
        oom_killed: state.oom_killed.unwrap_or(false),
        mounts,
        networks,
        published_ports,
        hardening,
        limits,
    }
}

pub(super) fn summary(raw: BollardSummary) -> ContainerSummary {
    ContainerSummary {
        id: raw.id.unwrap_or_default(),
        name: raw
            .names
            .and_then(|n| n.into_iter().next())
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_owned(),
        labels: btree(raw.labels),
        state: run_state_of_summary(raw.state),
    }
}

pub(super) fn event(raw: EventMessage) -> Option<EngineEvent> {
    let actor = raw.actor?;
    let mut labels = btree(actor.attributes);
    // Event attributes mix labels with `name`, `image` and `exitCode`.
    let name = labels.remove("name").unwrap_or_default();
    labels.remove("image");
    labels.remove("exitCode");
    let time = raw
        .time_nano
        .map(|ns| Utc.timestamp_nanos(ns))
        .or_else(|| raw.time.and_then(|s| Utc.timestamp_opt(s, 0).single()));
    Some(EngineEvent {
        action: raw.action.unwrap_or_default(),
        container_id: actor.id.unwrap_or_default(),
        name,
        labels,
        time,
    })
}

pub(super) fn create_body(spec: &ContainerSpec) -> ContainerCreateBody {
    let hardening = &spec.hardening;
    let host_config = HostConfig {
        network_mode: Some(hardening.network_mode.clone()),
        cap_add: Some(hardening.cap_add.clone()),
        cap_drop: Some(hardening.cap_drop.clone()),
        security_opt: Some(hardening.security_opt.clone()),
        ipc_mode: Some(hardening.ipc_mode.clone()),
        cgroupns_mode: Some(match hardening.cgroupns_mode.as_str() {
            "host" => HostConfigCgroupnsModeEnum::HOST,
            _ => HostConfigCgroupnsModeEnum::PRIVATE,
        }),
        privileged: Some(hardening.privileged),
        publish_all_ports: Some(hardening.publish_all_ports),
        restart_policy: Some(RestartPolicy {
            name: Some(match hardening.restart_policy.as_str() {
                "always" => RestartPolicyNameEnum::ALWAYS,
                "unless-stopped" => RestartPolicyNameEnum::UNLESS_STOPPED,
                "on-failure" => RestartPolicyNameEnum::ON_FAILURE,
                _ => RestartPolicyNameEnum::NO,
            }),
            maximum_retry_count: None,
        }),
        init: Some(hardening.init),
        pid_mode: (!hardening.pid_mode.is_empty()).then(|| hardening.pid_mode.clone()),
        uts_mode: (!hardening.uts_mode.is_empty()).then(|| hardening.uts_mode.clone()),
        userns_mode: (!hardening.userns_mode.is_empty()).then(|| hardening.userns_mode.clone()),
        sysctls: (!hardening.sysctls.is_empty())
            .then(|| hardening.sysctls.clone().into_iter().collect()),
        readonly_rootfs: Some(hardening.readonly_rootfs),
        ulimits: (!hardening.ulimits.is_empty()).then(|| {
            hardening
                .ulimits
                .iter()
                .map(|u| ResourcesUlimits {
                    name: Some(u.name.clone()),
                    soft: Some(u.soft),
                    hard: Some(u.hard),
                })
                .collect()
        }),
        nano_cpus: Some(spec.limits.nano_cpus),
        memory: Some(spec.limits.memory),
        memory_swap: Some(spec.limits.memory_swap),
        pids_limit: Some(spec.limits.pids_limit),
        mounts: Some(
            spec.mounts
                .iter()
                .map(|m| Mount {
                    target: Some(m.target.clone()),
                    source: Some(m.source.to_string_lossy().into_owned()),
                    typ: Some(MountType::BIND),
                    read_only: Some(m.read_only),
                    ..Default::default()
                })
                .collect(),
        ),
        ..Default::default()
    };
    let command = (!spec.command.is_empty()).then(|| spec.command.clone());
    ContainerCreateBody {
        entrypoint: command,
        cmd: (!spec.command.is_empty()).then(Vec::new),
        image: Some(spec.image.clone()),
        hostname: Some(spec.hostname.clone()),
        labels: Some(spec.labels.clone().into_iter().collect()),
        host_config: Some(host_config),
        ..Default::default()
    }
}
