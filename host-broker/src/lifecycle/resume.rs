//! `start` (resume): `docker start` of the same container, only when every
//! check passes against the record of how it was created.
//!
//! The checks fail closed: engine reachable, container present and stopped,
//! created from the recorded image and that image still present, its labels,
//! hostname, network (`none`, no published ports), hardening, limits and
//! mounts exactly as created. Anything unknown is a refusal with a reason.
//! Resume never creates, removes or recreates anything.

use dormouse_protocol::{LABEL_COMPUTER, LABEL_OWNER};

use super::{container_name, engine_error, stop_key, OpContext};
use crate::engine::ContainerInfo;
use crate::error::BrokerError;
use crate::store::ComputerRecord;

/// Why a start would be refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The container runs already (not a failure of the checks).
    Running,
    /// A check failed; the text says which, for people.
    Problem(String),
}

impl Refusal {
    /// The reason for people.
    pub fn message(&self) -> String {
        match self {
            Self::Running => "the container is already running".into(),
            Self::Problem(p) => p.clone(),
        }
    }
}

impl From<Refusal> for BrokerError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Running => BrokerError::WrongState(r.message()),
            Refusal::Problem(p) => BrokerError::NotResumable(p),
        }
    }
}

/// Every resume check, on what the engine says now. `image_present` is
/// `None` when unknown (which fails closed).
pub fn check(
    record: &ComputerRecord,
    info: Option<&ContainerInfo>,
    image_present: Option<bool>,
) -> Result<(), Refusal> {
    let spec = &record.spec;
    let problem = |p: String| Err(Refusal::Problem(p));
    let Some(info) = info else {
        return problem(format!("container {} is missing", spec.name));
    };
    if info.state.is_up() {
        return Err(Refusal::Running);
    }
    if !info.state.is_down() {
        return problem(format!("container is {}", info.state));
    }
    if info.image != record.image_id {
        return problem(format!(
            "container was created from {}, the record says {}",
            info.image, record.image_id
        ));
    }
    match image_present {
        Some(true) => {}
        Some(false) => return problem(format!("image {} is no longer present", record.image_id)),
        None => {
            return problem(format!(
                "cannot tell whether image {} is present",
                record.image_id
            ))
        }
    }
    let id = record.id.to_string();
    if info.labels.get(LABEL_COMPUTER) != Some(&id)
        || info.labels.get(LABEL_OWNER) != Some(&record.owner)
    {
        return problem("container labels do not name this computer and owner".into());
    }
    if info.hostname != spec.hostname {
        return problem(format!(
            "hostname is {}, created as {}",
            info.hostname, spec.hostname
        ));
    }
    if info.hardening.network_mode != "none" || info.networks.iter().any(|n| n != "none") {
        return problem(format!(
            "network is {} ({}), must be none",
            info.hardening.network_mode,
            info.networks.join(", ")
        ));
    }
    if info.published_ports {
        return problem("ports are published".into());
    }
    let have = info.hardening.normalized();
    let want = spec.hardening.normalized();
    if have != want {
        return problem(format!(
            "hardening differs from creation: {}",
            diff(&have, &want)
        ));
    }
    if info.limits != spec.limits {
        return problem(format!(
            "limits differ from creation: {:?}, created with {:?}",
            info.limits, spec.limits
        ));
    }
    let want_mounts = spec.mount_infos();
    let mut have_mounts = info.mounts.clone();
    have_mounts.sort();
    if have_mounts != want_mounts {
        return problem(format!(
            "mounts differ from creation: {}",
            have_mounts
                .iter()
                .map(|m| format!("{} {} -> {}", m.kind, m.source, m.target))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(())
}

fn diff(have: &crate::engine::Hardening, want: &crate::engine::Hardening) -> String {
    let mut out = Vec::new();
    macro_rules! field {
        ($f:ident) => {
            if have.$f != want.$f {
                out.push(format!(
                    "{} is {:?}, created as {:?}",
                    stringify!($f),
                    have.$f,
                    want.$f
                ));
            }
        };
    }
    field!(network_mode);
    field!(cap_add);
    field!(cap_drop);
    field!(security_opt);
    field!(ipc_mode);
    field!(cgroupns_mode);
    field!(privileged);
    field!(publish_all_ports);
    field!(restart_policy);
    field!(init);
    out.join("; ")
}

/// Checks everything afresh, clears the previous stop reason and starts the
/// same container. Returns what the engine says after the start.
pub async fn run(ctx: &OpContext, record: &ComputerRecord) -> Result<ContainerInfo, BrokerError> {
    let engine = ctx.engine.as_ref();
    let name = container_name(record.id);
    let info = engine.inspect(&name).await.map_err(engine_error)?;
    let image = engine.image(&record.image_id).await.map_err(engine_error)?;
    let image_present = Some(image.is_some_and(|i| i.id == record.image_id));
    check(record, info.as_ref(), image_present)?;
    // A start clears the reason of the previous stop.
    ctx.stops.clear(&stop_key(record.id))?;
    engine.start(&name).await.map_err(engine_error)?;
    engine
        .inspect(&name)
        .await
        .map_err(engine_error)?
        .ok_or_else(|| BrokerError::Internal("the container vanished right after its start".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BrokerConfig;
    use crate::engine::{MountInfo, RunState};
    use crate::lifecycle::create::container_spec;
    use crate::store::{computer::RECORD_SCHEMA, Paths};
    use uuid::Uuid;

    /// A record and the stopped container the engine would report for it
    /// (capabilities in Docker's CAP_ form).
    fn pair() -> (ComputerRecord, ContainerInfo) {
        let id = Uuid::new_v4();
        let paths = Paths::new("/data");
        let config = BrokerConfig::new("/data".into());
        let spec = container_spec(&config, &paths, id, "alice", "sha256:img");
        let mut hardening = spec.hardening.clone();
        hardening.cap_add = hardening
            .cap_add
            .iter()
            .map(|c| format!("CAP_{c}"))
            .collect();
        let info = ContainerInfo {
            id: "cid".into(),
            name: spec.name.clone(),
            image: "sha256:img".into(),
            hostname: spec.hostname.clone(),
            labels: spec.labels.clone(),
            state: RunState::Exited,
            started_at: None,
            finished_at: None,
            exit_code: Some(0),
            oom_killed: false,
            mounts: spec.mount_infos(),
            networks: vec!["none".into()],
            published_ports: false,
            hardening,
            limits: spec.limits,
        };
        let record = ComputerRecord {
            schema: RECORD_SCHEMA,
            id,
            name: "n".into(),
            owner: "alice".into(),
            image_id: "sha256:img".into(),
            generation: 0,
            lease: None,
            workspace: paths.workspace(id),
            idle_timeout_ms: None,
            created_at: chrono::Utc::now(),
            spec,
        };
        (record, info)
    }

    fn refused(record: &ComputerRecord, info: &ContainerInfo) -> String {
        match check(record, Some(info), Some(true)) {
            Err(Refusal::Problem(p)) => p,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_container_as_created_is_resumable() {
        let (record, info) = pair();
        assert_eq!(check(&record, Some(&info), Some(true)), Ok(()));
    }

    #[test]
    fn every_unknown_fails_closed() {
        let (record, info) = pair();
        assert!(
            matches!(check(&record, None, Some(true)), Err(Refusal::Problem(p)) if p.contains("missing"))
        );
        assert!(
            matches!(check(&record, Some(&info), None), Err(Refusal::Problem(p)) if p.contains("cannot tell"))
        );
        assert!(
            matches!(check(&record, Some(&info), Some(false)), Err(Refusal::Problem(p)) if p.contains("no longer present"))
        );
    }

    #[test]
    fn running_and_odd_states_are_refused() {
        let (record, mut info) = pair();
        info.state = RunState::Running;
        assert_eq!(
            check(&record, Some(&info), Some(true)),
            Err(Refusal::Running)
        );
        info.state = RunState::Dead;
        assert!(refused(&record, &info).contains("dead"));
    }

    #[test]
    fn a_different_image_is_refused() {
        let (record, mut info) = pair();
        info.image = "sha256:other".into();
        assert!(refused(&record, &info).contains("created from"));
    }

    #[test]
    fn network_changes_are_refused() {
        let (record, mut info) = pair();
        info.hardening.network_mode = "bridge".into();
        assert!(refused(&record, &info).contains("network"));
        let (record, mut info) = pair();
        info.networks = vec!["none".into(), "bridge".into()];
        assert!(refused(&record, &info).contains("network"));
        let (record, mut info) = pair();
        info.published_ports = true;
        assert!(refused(&record, &info).contains("ports"));
    }

    #[test]
    fn weakened_hardening_is_refused() {
        let (record, mut info) = pair();
        info.hardening.cap_add.push("CAP_SYS_ADMIN".into());
        assert!(refused(&record, &info).contains("cap_add"));
        let (record, mut info) = pair();
        info.hardening.security_opt.clear();
        assert!(refused(&record, &info).contains("security_opt"));
        let (record, mut info) = pair();
        info.hardening.privileged = true;
        assert!(refused(&record, &info).contains("privileged"));
        let (record, mut info) = pair();
        info.hardening.ipc_mode = "host".into();
        assert!(refused(&record, &info).contains("ipc_mode"));
        let (record, mut info) = pair();
        info.limits.memory *= 2;
        assert!(refused(&record, &info).contains("limits"));
    }

    #[test]
    fn changed_mounts_are_refused() {
        let (record, mut info) = pair();
        info.mounts.push(MountInfo {
            kind: "bind".into(),
            source: "/var/run/docker.sock".into(),
            target: "/var/run/docker.sock".into(),
            read_only: false,
        });
        assert!(refused(&record, &info).contains("mounts"));
        let (record, mut info) = pair();
        info.mounts[0].source = "/home/someone".into();
        assert!(refused(&record, &info).contains("mounts"));
    }

    #[test]
    fn foreign_labels_are_refused() {
        let (record, mut info) = pair();
        info.labels.insert(LABEL_OWNER.into(), "mallory".into());
        assert!(refused(&record, &info).contains("labels"));
    }
}
