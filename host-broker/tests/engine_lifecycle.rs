//! The broker against the real Docker engine: the bollard adapter, and the
//! whole lifecycle with the real desktop image (create → ready → stop →
//! start → ready), hardening as `docker inspect` shows it, and the engine's
//! own event log proving a resume is a plain `start`.
//!
//! Tests skip visibly without an engine or image, and fail under `CI=true`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod engine_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dormouse_broker::docker::container_engine::{BindMount, ContainerSpec};
use dormouse_broker::docker::spec::{container_spec, SUPERVISOR_CAPABILITIES};
use dormouse_broker::docker::{resume, DockerBackend, DockerConfig, DockerEngine, Engine};
use dormouse_broker::engine::{Refusal, RunState};
use dormouse_broker::lifecycle::create;
use dormouse_broker::metrics::Metrics;
use dormouse_broker::owner;
use dormouse_broker::store::{computer::RECORD_SCHEMA, ComputerRecord, Paths};
use dormouse_broker::BrokerError;
use dormouse_e2e::{desktop_image, docker_available, docker_ok, TempDir};
use dormouse_protocol::api::{ContainerState, CreateComputer, StopReason};
use engine_support::{broker_config, engine_events, engine_now, log, wait_ready, RunGuard};
use futures_util::StreamExt;
use uuid::Uuid;

/// How long a real desktop may take to get ready on a busy test machine.
const READY_LIMIT: Duration = Duration::from_secs(90);

/// Image for the adapter test: any image with `sleep` will do, so the desktop
/// image under test (`DORMOUSE_PLAIN_IMAGE` overrides it).
fn plain_image(test: &str) -> Option<String> {
    match std::env::var("DORMOUSE_PLAIN_IMAGE") {
        Ok(image) => Some(docker_ok(&[
            "image", "inspect", "--format", "{{.Id}}", &image,
        ])),
        Err(_) => desktop_image(test),
    }
}

fn inspect(name: &str, format: &str) -> String {
    docker_ok(&["inspect", "--format", format, name])
}

#[tokio::test]
// Over 100 lines on purpose: one real-engine test told in order (set up,
// act, witness, clean up); its steps share the desktop and the witnesses,
// and apart the order a reader must check would be spread over helpers.
async fn the_docker_adapter_creates_hardened_containers_that_pass_the_resume_checks() {
    let test = "the_docker_adapter_creates_hardened_containers_that_pass_the_resume_checks";
    if !docker_available(test) {
        return;
    }
    let Some(image_id) = plain_image(test) else {
        return;
    };
    log();
    let guard = RunGuard::new("dm-adapter");
    let data = TempDir::new("dm-adapter");
    let paths = Paths::new(data.path());
    let engine = DockerEngine::connect().await.unwrap();
    let config = broker_config(data.path(), &image_id, &guard);
    let id = Uuid::new_v4();
    create::prepare_dirs(&paths, id, Some(&paths.workspace(id))).unwrap();
    let image = engine.image(&image_id).await.unwrap().unwrap();
    let docker = DockerConfig::from_broker(&config);
    let mut spec = container_spec(&docker, &paths, id, "tester", &image.clone().into());
    spec.command = vec!["sleep".into(), "infinity".into()];
    let record = ComputerRecord {
        schema: RECORD_SCHEMA,
        id,
        name: "adapter".into(),
        owner: "tester".into(),
        image_id: image_id.clone(),
        generation: 0,
        lease: None,
        workspace: paths.workspace(id),
        idle_timeout_ms: None,
        created_at: chrono::Utc::now(),
        spec: dormouse_broker::docker::spec::to_backend(&spec),
        workspace_from: None,
        egress: None,
        wanted_running_since: None,
    };

    let image = engine.image(&image_id).await.unwrap().unwrap();
    assert_eq!(image.id, image_id);
    assert!(engine
        .image("dormouse/no-such-image:x")
        .await
        .unwrap()
        .is_none());
    assert!(engine.inspect(&spec.name).await.unwrap().is_none());

    let mut events = engine.events(&[format!("{}={}", engine_support::RUN_LABEL, guard.run)]);
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(event)) = events.next().await {
            if tx.send(event).is_err() {
                return;
            }
        }
    });
    // The subscription is made when the stream is first polled.
    tokio::time::sleep(Duration::from_millis(500)).await;
    engine.create(&spec).await.unwrap();
    assert!(matches!(
        engine.create(&spec).await,
        Err(dormouse_broker::engine::EngineError::Conflict(_))
    ));
    let created = engine.inspect(&spec.name).await.unwrap().unwrap();
    assert_eq!(created.state, RunState::Created);
    engine.start(&spec.name).await.unwrap();
    engine.start(&spec.name).await.unwrap(); // already running: fine

    let info = engine.inspect(&spec.name).await.unwrap().unwrap();
    assert_eq!(info.state, RunState::Running);
    assert_eq!(info.image, image_id);
    assert_eq!(info.hostname, spec.hostname);
    assert_eq!(info.networks, vec!["none".to_string()]);
    assert!(!info.published_ports);
    assert_eq!(info.hardening.normalized(), spec.hardening.normalized());
    assert_eq!(info.limits, spec.limits);
    assert_eq!(info.mounts.len(), 2);
    assert!(info.started_at.is_some());
    assert_eq!(
        resume::check(record.origin(), Some(&info), Some(true)),
        Err(Refusal::Running)
    );

    // (`sleep` as PID 1 ignores SIGTERM: the engine kills it after the timeout.)
    engine
        .stop(&spec.name, Duration::from_secs(1))
        .await
        .unwrap();
    let stopped = engine.inspect(&spec.name).await.unwrap().unwrap();
    assert_eq!(stopped.state, RunState::Exited);
    assert!(
        stopped.exit_code.is_some(),
        "{}",
        inspect(&spec.name, "{{json .State}}")
    );
    assert!(stopped.finished_at.is_some());
    assert!(!stopped.oom_killed);
    // What the real engine stores passes the resume checks: our
    // normalisation matches Docker's.
    assert_eq!(
        resume::check(record.origin(), Some(&stopped), Some(true)),
        Ok(())
    );
    engine
        .stop(&spec.name, Duration::from_secs(1))
        .await
        .unwrap(); // stopped: fine

    let listed = engine
        .list(&[format!("{}={}", engine_support::RUN_LABEL, guard.run)])
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, spec.name);
    assert_eq!(listed[0].state, RunState::Exited);

    engine.start(&spec.name).await.unwrap();
    engine.kill(&spec.name, "SIGKILL").await.unwrap();
    let killed = engine.inspect(&spec.name).await.unwrap().unwrap();
    assert_eq!(killed.exit_code, Some(137));
    assert_ne!(killed.finished_at, stopped.finished_at);

    engine.remove(&spec.name).await.unwrap();
    assert!(engine.inspect(&spec.name).await.unwrap().is_none());
    assert!(
        paths.workspace(id).is_dir(),
        "the engine never touches bind sources"
    );

    let mut actions = Vec::new();
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(5), seen.recv()).await {
        assert_eq!(event.name, spec.name);
        assert_eq!(
            event.labels.get(dormouse_protocol::LABEL_COMPUTER),
            Some(&id.to_string())
        );
        actions.push(event.action);
        if actions.last().map(String::as_str) == Some("destroy") {
            break;
        }
    }
    for wanted in ["create", "start", "die", "stop", "kill", "destroy"] {
        assert!(
            actions.iter().any(|a| a == wanted),
            "{wanted} missing in {actions:?}"
        );
    }
    drop(guard);
}

#[tokio::test]
async fn a_changed_container_is_not_resumable_on_the_real_engine() {
    let test = "a_changed_container_is_not_resumable_on_the_real_engine";
    if !docker_available(test) {
        return;
    }
    let Some(image_id) = plain_image(test) else {
        return;
    };
    let guard = RunGuard::new("dm-changed");
    let data = TempDir::new("dm-changed");
    let paths = Paths::new(data.path());
    let engine = DockerEngine::connect().await.unwrap();
    let config = broker_config(data.path(), &image_id, &guard);
    let id = Uuid::new_v4();
    create::prepare_dirs(&paths, id, Some(&paths.workspace(id))).unwrap();
    let image = engine.image(&image_id).await.unwrap().unwrap();
    let docker = DockerConfig::from_broker(&config);
    let mut spec: ContainerSpec =
        container_spec(&docker, &paths, id, "tester", &image.clone().into());
    spec.command = vec!["sleep".into(), "infinity".into()];
    // Someone recreated it with an extra capability and a host mount.
    let mut tampered = spec.clone();
    tampered.hardening.cap_add.push("NET_ADMIN".into());
    tampered.mounts.push(BindMount {
        source: data.path().to_owned(),
        target: "/host".into(),
        read_only: false,
    });
    engine.create(&tampered).await.unwrap();
    let record = ComputerRecord {
        schema: RECORD_SCHEMA,
        id,
        name: "changed".into(),
        owner: "tester".into(),
        image_id: image_id.clone(),
        generation: 0,
        lease: None,
        workspace: paths.workspace(id),
        idle_timeout_ms: None,
        created_at: chrono::Utc::now(),
        spec: dormouse_broker::docker::spec::to_backend(&spec),
        workspace_from: None,
        egress: None,
        wanted_running_since: None,
    };
    let info = engine.inspect(&spec.name).await.unwrap().unwrap();
    let refusal = resume::check(record.origin(), Some(&info), Some(true)).unwrap_err();
    assert!(
        refusal.message().contains("cap_add"),
        "{}",
        refusal.message()
    );
    drop(guard);
}

/// The `docker create` flags that make a container as `spec` says; an
/// inline seccomp profile (what the API takes) goes through a file in
/// `dir`, as the CLI wants it (it sends the file's JSON inline).
fn create_flags(spec: &ContainerSpec, dir: &std::path::Path) -> Vec<String> {
    let h = &spec.hardening;
    let mut args = vec![
        "create".to_string(),
        format!("--name={}", spec.name),
        format!("--hostname={}", spec.hostname),
        format!("--network={}", h.network_mode),
        format!("--ipc={}", h.ipc_mode),
        format!("--cgroupns={}", h.cgroupns_mode),
        format!("--restart={}", h.restart_policy),
        format!("--cpus={}", spec.limits.nano_cpus as f64 / 1e9),
        format!("--memory={}", spec.limits.memory),
        format!("--memory-swap={}", spec.limits.memory_swap),
        format!("--pids-limit={}", spec.limits.pids_limit),
    ];
    args.extend(h.cap_drop.iter().map(|c| format!("--cap-drop={c}")));
    args.extend(h.cap_add.iter().map(|c| format!("--cap-add={c}")));
    args.extend(
        h.security_opt
            .iter()
            .map(|o| match o.strip_prefix("seccomp=") {
                Some(profile) if profile.starts_with('{') => {
                    let file = dir.join(format!("seccomp-{}.json", spec.name));
                    std::fs::write(&file, profile).unwrap();
                    format!("--security-opt=seccomp={}", file.display())
                }
                _ => format!("--security-opt={o}"),
            }),
    );
    args.extend(
        h.ulimits
            .iter()
            .map(|u| format!("--ulimit={}={}:{}", u.name, u.soft, u.hard)),
    );
    args.extend(spec.labels.iter().map(|(k, v)| format!("--label={k}={v}")));
    args.extend(spec.mounts.iter().map(|m| {
        format!(
            "--mount=type=bind,src={},dst={}{}",
            m.source.display(),
            m.target,
            if m.read_only { ",readonly" } else { "" }
        )
    }));
    args
}

/// Someone recreates the container by hand with the same name, labels and
/// settings but one thing more: every such change is refused by the resume
/// check, which names the setting.
#[tokio::test]
async fn a_container_recreated_by_hand_with_weaker_isolation_is_refused_naming_the_field() {
    let test = "a_container_recreated_by_hand_with_weaker_isolation_is_refused_naming_the_field";
    if !docker_available(test) {
        return;
    }
    let Some(image_id) = plain_image(test) else {
        return;
    };
    let guard = RunGuard::new("dm-byhand");
    let data = TempDir::new("dm-byhand");
    let paths = Paths::new(data.path());
    let engine = DockerEngine::connect().await.unwrap();
    let config = broker_config(data.path(), &image_id, &guard);
    let docker = DockerConfig::from_broker(&config);
    let image = engine.image(&image_id).await.unwrap().unwrap();
    let cases: [(&[&str], &str); 10] = [
        (&[], ""),
        (&["--pid=host"], "pid_mode"),
        (&["--ulimit=nofile=4096:4096"], "ulimits"),
        (&["--device=/dev/null:/dev/extra"], "devices"),
        (
            &["--sysctl=net.ipv4.ip_unprivileged_port_start=0"],
            "sysctls",
        ),
        (&["--read-only"], "readonly_rootfs"),
        (&["--user=0:0"], "user"),
        (&["--entrypoint=/bin/sh"], "entrypoint"),
        (&["--security-opt=seccomp=unconfined"], "security_opt"),
        (&["--security-opt=apparmor=unconfined"], "security_opt"),
    ];
    for (extra, field) in cases {
        let id = Uuid::new_v4();
        create::prepare_dirs(&paths, id, Some(&paths.workspace(id))).unwrap();
        let spec = container_spec(&docker, &paths, id, "tester", &image.clone().into());
        let mut args = create_flags(&spec, data.path());
        args.extend(extra.iter().map(|s| (*s).to_string()));
        args.push(image_id.clone());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        docker_ok(&args);
        let record = ComputerRecord {
            schema: RECORD_SCHEMA,
            id,
            name: "by-hand".into(),
            owner: "tester".into(),
            image_id: image_id.clone(),
            generation: 0,
            lease: None,
            workspace: paths.workspace(id),
            idle_timeout_ms: None,
            created_at: chrono::Utc::now(),
            spec: dormouse_broker::docker::spec::to_backend(&spec),
            workspace_from: None,
            egress: None,
            wanted_running_since: None,
        };
        let info = engine.inspect(&spec.name).await.unwrap().unwrap();
        let verdict = resume::check(record.origin(), Some(&info), Some(true));
        if field.is_empty() {
            assert_eq!(verdict, Ok(()), "made by hand exactly as the broker would");
        } else {
            let why = verdict.expect_err(field).message();
            println!("{extra:?}: refused: {why}");
            assert!(
                why.contains(field),
                "{extra:?} must be refused naming {field}: {why}"
            );
        }
        engine.remove(&spec.name).await.unwrap();
    }
    drop(guard);
}

/// The whole lifecycle with the real desktop image.
#[tokio::test]
// Over 100 lines on purpose: one real-engine test told in order (set up,
// act, witness, clean up); its steps share the desktop and the witnesses,
// and apart the order a reader must check would be spread over helpers.
async fn create_ready_stop_start_ready_with_the_real_image() {
    let test = "create_ready_stop_start_ready_with_the_real_image";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    log();
    let guard = RunGuard::new("dm-life");
    let data = TempDir::new("dm-life");
    let engine: Arc<dyn Engine> = Arc::new(DockerEngine::connect().await.unwrap());
    let metrics = Arc::new(Metrics::default());
    let config = broker_config(data.path(), &image, &guard);
    let limits = config.limits.clone();
    let backend = Arc::new(DockerBackend::for_broker(engine, &config));
    let (broker, core) = owner::spawn_backend(config, backend, metrics.clone())
        .await
        .unwrap();

    let t = Instant::now();
    let created = broker.create(CreateComputer::default()).await.unwrap();
    assert_eq!(created.container, ContainerState::Running);
    let created = wait_ready(&broker, created.id, READY_LIMIT).await;
    eprintln!("create → ready: {} ms", t.elapsed().as_millis());
    assert_eq!(created.image_id, image);
    let id = created.id;
    let name = format!("dormouse-{id}");
    let paths = Paths::new(data.path());

    // Hardening, as the engine itself reports it.
    assert_eq!(inspect(&name, "{{.HostConfig.NetworkMode}}"), "none");
    assert_eq!(inspect(&name, "{{json .HostConfig.CapDrop}}"), r#"["ALL"]"#);
    let cap_add = inspect(&name, "{{json .HostConfig.CapAdd}}");
    for cap in SUPERVISOR_CAPABILITIES {
        assert!(cap_add.contains(cap), "{cap} missing in {cap_add}");
    }
    let caps: Vec<String> = serde_json::from_str(&cap_add).unwrap();
    assert_eq!(caps.len(), SUPERVISOR_CAPABILITIES.len(), "{cap_add}");
    assert!(inspect(&name, "{{json .HostConfig.SecurityOpt}}").contains("no-new-privileges"));
    assert_eq!(inspect(&name, "{{.HostConfig.IpcMode}}"), "private");
    assert_eq!(inspect(&name, "{{.HostConfig.CgroupnsMode}}"), "private");
    assert_eq!(inspect(&name, "{{.HostConfig.Privileged}}"), "false");
    assert_eq!(inspect(&name, "{{.HostConfig.RestartPolicy.Name}}"), "no");
    let no_ports = ["{}", "null"];
    let bindings = inspect(&name, "{{json .HostConfig.PortBindings}}");
    assert!(no_ports.contains(&bindings.as_str()), "{bindings}");
    let ports = inspect(&name, "{{json .NetworkSettings.Ports}}");
    assert!(no_ports.contains(&ports.as_str()), "{ports}");
    assert_eq!(inspect(&name, "{{.HostConfig.PublishAllPorts}}"), "false");
    assert_eq!(
        inspect(&name, "{{.HostConfig.NanoCpus}}"),
        format!("{:.0}", (limits.cpus * 1e9).round())
    );
    assert_eq!(
        inspect(&name, "{{.HostConfig.Memory}}"),
        limits.memory_bytes.to_string()
    );
    assert_eq!(
        inspect(&name, "{{.HostConfig.MemorySwap}}"),
        limits.memory_bytes.to_string()
    );
    assert_eq!(
        inspect(&name, "{{.HostConfig.PidsLimit}}"),
        limits.pids.to_string()
    );
    assert_eq!(
        inspect(&name, "{{.Config.Hostname}}"),
        format!("desk-{}", &id.simple().to_string()[..8])
    );
    let mounts = inspect(
        &name,
        "{{range .Mounts}}{{.Type}} {{.Source}} {{.Destination}} {{.RW}};{{end}}",
    );
    let mut mounts: Vec<String> = mounts
        .split(';')
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .collect();
    mounts.sort();
    let mut expected = vec![
        format!(
            "bind {} /home/desk/workspace true",
            paths.workspace(id).display()
        ),
        format!("bind {} /run/dormouse true", paths.run_dir(id).display()),
    ];
    expected.sort();
    assert_eq!(mounts, expected, "only the workspace and run directory");
    assert!(!inspect(&name, "{{json .Mounts}}").contains("docker.sock"));
    assert_eq!(
        inspect(&name, "{{index .Config.Labels \"dev.dormouse.computer\"}}"),
        id.to_string()
    );

    // A marker in the workspace, written as the desk user.
    docker_ok(&[
        "exec",
        "-u",
        "1000",
        &name,
        "sh",
        "-c",
        "echo kept > /home/desk/workspace/marker",
    ]);

    let stopped = broker.stop(id, None).await.unwrap();
    assert_eq!(stopped.container, ContainerState::Stopped);
    assert_eq!(stopped.stop_reason, Some(StopReason::Manual));
    assert!(stopped.resumable, "{:?}", stopped.resumable_problem);

    let since = engine_now();
    let t = Instant::now();
    let answered = broker.start(id, None).await.unwrap();
    let answer_ms = t.elapsed().as_millis();
    assert_eq!(answered.container, ContainerState::Running);
    let resumed = wait_ready(&broker, id, READY_LIMIT).await;
    let ms = t.elapsed().as_millis();
    eprintln!("resume: start answered after {answer_ms} ms (running), ready after {ms} ms");
    let until = engine_now();
    assert_eq!(resumed.stop_reason, None);
    let actions: Vec<String> = engine_events(&guard, &since, &until)
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert!(actions.iter().any(|a| a == "start"), "{actions:?}");
    for banned in ["create", "destroy", "remove"] {
        assert!(
            !actions.iter().any(|a| a == banned),
            "{banned} in {actions:?}"
        );
    }
    assert_eq!(
        docker_ok(&["exec", &name, "cat", "/home/desk/workspace/marker"]),
        "kept"
    );
    let png = broker.screenshot(id).await.unwrap();
    assert!(png.starts_with(b"\x89PNG"));

    broker.remove(id, true, None).await.unwrap();
    assert!(!paths.computer_dir(id).exists());
    drop(broker);
    core.await.unwrap();
    drop(guard);
}

#[tokio::test]
async fn a_symlink_planted_at_the_socket_path_is_refused() {
    let test = "a_symlink_planted_at_the_socket_path_is_refused";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    log();
    let guard = RunGuard::new("dm-symlink");
    let data = TempDir::new("dm-symlink");
    let engine: Arc<dyn Engine> = Arc::new(DockerEngine::connect().await.unwrap());
    let config = broker_config(data.path(), &image, &guard);
    let backend = Arc::new(DockerBackend::for_broker(engine, &config));
    let (broker, _core) = owner::spawn_backend(config, backend, Arc::new(Metrics::default()))
        .await
        .unwrap();
    let id = broker.create(CreateComputer::default()).await.unwrap().id;
    wait_ready(&broker, id, READY_LIMIT).await;
    let paths = Paths::new(data.path());
    let socket = paths.socket(id);
    // The guest (root in its container) swaps the socket for a symlink to a
    // host socket.
    let decoy_dir = TempDir::new("dm-decoy");
    let decoy = decoy_dir.path().join("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&decoy).unwrap();
    listener.set_nonblocking(true).unwrap();
    let name = format!("dormouse-{id}");
    docker_ok(&[
        "exec", &name, "sh", "-c",
        "mv /run/dormouse/supervisor.sock /run/dormouse/real.sock && ln -s /decoy/host.sock /run/dormouse/supervisor.sock",
    ]);
    // Point the in-guest symlink at the decoy as the host sees it.
    std::fs::remove_file(&socket).unwrap();
    std::os::unix::fs::symlink(&decoy, &socket).unwrap();
    let err = broker.screenshot(id).await.unwrap_err();
    assert!(
        matches!(&err, BrokerError::Guest(m) if m.to_string().contains("symlink")),
        "{err}"
    );
    assert!(
        listener.accept().is_err(),
        "the decoy was never connected to"
    );
    let status = broker.get(id).await.unwrap();
    assert_eq!(
        status.container,
        ContainerState::Running,
        "the broker and desktop carry on"
    );
    drop(guard);
}
