//! The Docker backend's resume check: `docker start` of the same container
//! only when every setting is as it was created.
//!
//! The checks fail closed: container present and stopped, created from the
//! recorded image and that image still present, its labels, hostname,
//! network (`none`, no published ports), hardening (capabilities, security
//! options with their seccomp (Dormouse's own, compared by digest) and
//! AppArmor profiles, IPC, PID, UTS, user and
//! cgroup namespaces, devices, sysctls, read-only root, ulimits), entrypoint,
//! command and user, limits and mounts exactly as created. Anything unknown
//! is a refusal that names what differs. This module only judges.

use dormouse_protocol::{LABEL_COMPUTER, LABEL_OWNER};

use super::container_engine::{ContainerInfo, Hardening};
use super::spec;
use dormouse_core::engine::{Origin, Provenance, Refusal};

/// The AppArmor profiles an engine applies by default: none (AppArmor off),
/// Docker's and Podman's. Anything else (`unconfined`, a custom profile) was
/// not what the broker created.
fn apparmor_ok(profile: &str) -> bool {
    profile.is_empty() || profile == "docker-default" || profile.starts_with("containers-default")
}

impl Provenance for ContainerInfo {
    fn check(&self, origin: Origin<'_>, image_present: Option<bool>) -> Result<(), Refusal> {
        check(origin, Some(self), image_present)
    }
}

/// Every resume check, on what the engine says now. `image_present` is
/// `None` when unknown (which fails closed).
// Over 100 lines on purpose: every resume check in one list, each a few
// lines comparing one setting; apart, a check left out would not show.
pub fn check(
    origin: Origin<'_>,
    info: Option<&ContainerInfo>,
    image_present: Option<bool>,
) -> Result<(), Refusal> {
    let problem = |p: String| Err(Refusal::Problem(p));
    let spec = match spec::from_backend(origin.spec) {
        Ok(spec) => spec,
        Err(e) => return problem(e.to_string()),
    };
    let Some(info) = info else {
        return problem(format!("container {} is missing", spec.name));
    };
    if info.state.is_up() {
        return Err(Refusal::Running);
    }
    if !info.state.is_down() {
        return problem(format!("container is {}", info.state));
    }
    if info.image != origin.image_id {
        return problem(format!(
            "container was created from {}, the record says {}",
            info.image, origin.image_id
        ));
    }
    match image_present {
        Some(true) => {}
        Some(false) => return problem(format!("image {} is no longer present", origin.image_id)),
        None => {
            return problem(format!(
                "cannot tell whether image {} is present",
                origin.image_id
            ))
        }
    }
    let id = origin.id.to_string();
    if info.labels.get(LABEL_COMPUTER) != Some(&id)
        || info.labels.get(LABEL_OWNER).map(String::as_str) != Some(origin.owner)
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
    if let Some(want) = &spec.expected_process() {
        let have = &info.process;
        for (field, differs) in [
            ("entrypoint", have.entrypoint != want.entrypoint),
            ("cmd", have.cmd != want.cmd),
            ("user", have.user != want.user),
        ] {
            if differs {
                return problem(format!(
                    "{field} differs from creation: runs {:?} as {:?}, created to run {:?} as {:?}",
                    [&have.entrypoint[..], &have.cmd[..]].concat(),
                    have.user,
                    [&want.entrypoint[..], &want.cmd[..]].concat(),
                    want.user
                ));
            }
        }
    }
    if !apparmor_ok(&info.apparmor_profile) {
        return problem(format!(
            "apparmor_profile is {:?}, created with the engine's default",
            info.apparmor_profile
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

fn diff(have: &Hardening, want: &Hardening) -> String {
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
    field!(pid_mode);
    field!(uts_mode);
    field!(userns_mode);
    field!(devices);
    field!(sysctls);
    field!(readonly_rootfs);
    field!(ulimits);
    out.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container_engine::MountInfo;
    use crate::spec::container_spec;
    use crate::DockerConfig;
    use dormouse_core::config::BrokerConfig;
    use dormouse_core::engine::RunState;
    use dormouse_core::engine::{Image, Process};
    use dormouse_core::store::{computer::RECORD_SCHEMA, ComputerRecord, Paths};
    use uuid::Uuid;

    /// A record and the stopped container the engine would report for it
    /// (capabilities in Docker's CAP_ form).
    fn pair() -> (ComputerRecord, ContainerInfo) {
        let id = Uuid::new_v4();
        let paths = Paths::new("/data");
        let config = BrokerConfig::new("/data".into());
        let image = Image {
            id: "sha256:img".into(),
            labels: Default::default(),
            process: Process {
                entrypoint: vec!["/usr/local/bin/dormouse-supervisor".into()],
                cmd: vec![],
                user: String::new(),
            },
        };
        let spec = container_spec(
            &DockerConfig::from_broker(&config),
            &paths,
            id,
            "alice",
            &image,
        );
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
            process: spec.process.clone().unwrap_or_default(),
            apparmor_profile: "docker-default".into(),
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
            spec: crate::spec::to_backend(&spec),
            workspace_from: None,
            egress: None,
            wanted_running_since: None,
        };
        (record, info)
    }

    fn refused(record: &ComputerRecord, info: &ContainerInfo) -> String {
        match check(record.origin(), Some(info), Some(true)) {
            Err(Refusal::Problem(p)) => p,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_container_as_created_is_resumable() {
        let (record, info) = pair();
        assert_eq!(check(record.origin(), Some(&info), Some(true)), Ok(()));
    }

    #[test]
    fn every_unknown_fails_closed() {
        let (record, info) = pair();
        assert!(
            matches!(check(record.origin(), None, Some(true)), Err(Refusal::Problem(p)) if p.contains("missing"))
        );
        assert!(
            matches!(check(record.origin(), Some(&info), None), Err(Refusal::Problem(p)) if p.contains("cannot tell"))
        );
        assert!(
            matches!(check(record.origin(), Some(&info), Some(false)), Err(Refusal::Problem(p)) if p.contains("no longer present"))
        );
    }

    #[test]
    fn running_and_odd_states_are_refused() {
        let (record, mut info) = pair();
        info.state = RunState::Running;
        assert_eq!(
            check(record.origin(), Some(&info), Some(true)),
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

    #[test]
    fn namespaces_devices_sysctls_and_root_are_compared_by_name() {
        type Change = fn(&mut ContainerInfo);
        let cases: [(&str, Change); 8] = [
            ("pid_mode", |i| i.hardening.pid_mode = "host".into()),
            ("uts_mode", |i| i.hardening.uts_mode = "host".into()),
            ("userns_mode", |i| i.hardening.userns_mode = "host".into()),
            ("devices", |i| {
                i.hardening.devices = vec!["/dev/kvm:/dev/kvm:rwm".into()]
            }),
            ("sysctls", |i| {
                i.hardening
                    .sysctls
                    .insert("net.ipv4.ip_forward".into(), "1".into());
            }),
            ("readonly_rootfs", |i| i.hardening.readonly_rootfs = true),
            ("ulimits", |i| {
                i.hardening.ulimits.push(crate::container_engine::Ulimit {
                    name: "nofile".into(),
                    soft: 1 << 20,
                    hard: 1 << 20,
                })
            }),
            ("security_opt", |i| {
                i.hardening.security_opt.push("seccomp=unconfined".into())
            }),
        ];
        for (field, change) in cases {
            let (record, mut info) = pair();
            change(&mut info);
            let why = refused(&record, &info);
            assert!(why.contains(field), "{field}: {why}");
        }
    }

    #[test]
    fn what_the_container_runs_and_its_apparmor_profile_are_compared() {
        let (record, mut info) = pair();
        info.process.entrypoint = vec!["/bin/sh".into()];
        assert!(refused(&record, &info).contains("entrypoint"));
        let (record, mut info) = pair();
        info.process.cmd = vec!["-c".into(), "id".into()];
        assert!(refused(&record, &info).contains("cmd"));
        let (record, mut info) = pair();
        info.process.user = "1000".into();
        assert!(refused(&record, &info).contains("user"));
        let (record, mut info) = pair();
        info.apparmor_profile = "unconfined".into();
        assert!(refused(&record, &info).contains("apparmor"));
        let (record, mut info) = pair();
        info.apparmor_profile = String::new();
        assert_eq!(check(record.origin(), Some(&info), Some(true)), Ok(()));
    }

    /// The seccomp profile is provenance: a container with another profile
    /// (or with the engine's default, or none) is refused by name, and one
    /// with Dormouse's profile spelled differently is the same container.
    #[test]
    fn the_seccomp_profile_is_part_of_provenance() {
        let ours = crate::seccomp::security_opt(crate::Dialect::Docker, &Paths::new("/data"));
        let (record, info) = pair();
        assert!(info.hardening.security_opt.contains(&ours));
        type Change = fn(&mut Vec<String>);
        let cases: [(&str, Change); 3] = [
            ("another profile", |opts| {
                opts.retain(|o| !o.starts_with("seccomp="));
                opts.push(r#"seccomp={"defaultAction":"SCMP_ACT_ALLOW"}"#.into());
            }),
            ("the engine's default", |opts| {
                opts.retain(|o| !o.starts_with("seccomp="))
            }),
            ("unconfined", |opts| {
                opts.retain(|o| !o.starts_with("seccomp="));
                opts.push("seccomp=unconfined".into());
            }),
        ];
        for (what, change) in cases {
            let mut info = info.clone();
            change(&mut info.hardening.security_opt);
            let why = refused(&record, &info);
            assert!(why.contains("security_opt"), "{what}: {why}");
            assert!(
                why.len() < 600,
                "{what}: the diff names a digest, not the profile: {why}"
            );
        }
        let mut info = info.clone();
        info.hardening.security_opt = vec![
            format!("seccomp={}", crate::seccomp::PROFILE),
            "no-new-privileges:true".into(),
        ];
        assert_eq!(check(record.origin(), Some(&info), Some(true)), Ok(()));
        // A record made before the profile (none) resumes its container
        // made so, and refuses one that has it.
        let (mut old, mut info) = pair();
        let mut spec = crate::spec::from_backend(&old.spec).unwrap();
        spec.hardening.security_opt = vec!["no-new-privileges".into()];
        old.spec = crate::spec::to_backend(&spec);
        assert!(refused(&old, &info).contains("security_opt"));
        info.hardening.security_opt = vec!["no-new-privileges".into()];
        assert_eq!(check(old.origin(), Some(&info), Some(true)), Ok(()));
    }

    #[test]
    fn records_written_before_the_process_was_kept_still_resume() {
        let (mut record, info) = pair();
        let mut spec = crate::spec::from_backend(&record.spec).unwrap();
        spec.process = None;
        record.spec = crate::spec::to_backend(&spec);
        assert_eq!(check(record.origin(), Some(&info), Some(true)), Ok(()));
    }
}
