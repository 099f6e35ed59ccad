//! Tests of the self-probe: each check on a temp directory (links,
//! workspace, identity, VNC banner, services) and without a display.

use super::*;
use std::os::unix::fs::symlink;

fn service(name: &str, state: ServiceRunState) -> ServiceState {
    ServiceState {
        name: name.into(),
        state,
        pid: Some(42),
        restarts: 0,
        last_exit: None,
        ready_since: None,
    }
}

/// A home, workspace and fake procfs under a temp dir.
fn guest_dirs() -> (tempfile::TempDir, Config) {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home/desk");
    let config = Config {
        home: home.clone(),
        workspace: home.join("workspace"),
        proc_root: dir.path().join("proc"),
        tmp_dir: dir.path().join("tmp"),
        run_dir: dir.path().join("run"),
        uid: nix::unistd::geteuid().as_raw(),
        workspace_min_free_mib: 1,
        probe_timeout_ms: 500,
        ..Config::default()
    };
    std::fs::create_dir_all(config.home.join(".config")).expect("home");
    std::fs::create_dir_all(&config.workspace).expect("workspace");
    (dir, config)
}

fn make_links(config: &Config) {
    for (link, target) in expected_links(config) {
        std::fs::create_dir_all(&target).expect("target");
        symlink(&target, &link).expect("link");
    }
}

fn fake_identity(config: &Config, boot_id: &str, start: u64) {
    let p = &config.proc_root;
    std::fs::create_dir_all(p.join("sys/kernel/random")).expect("mkdir");
    std::fs::create_dir_all(p.join("self/ns")).expect("mkdir");
    std::fs::create_dir_all(p.join("1")).expect("mkdir");
    std::fs::write(p.join("sys/kernel/random/boot_id"), format!("{boot_id}\n")).expect("boot");
    std::fs::write(p.join("self/ns/pid"), "").expect("ns");
    std::fs::write(
        p.join("1/stat"),
        format!("1 (dormouse-superv) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 {start} 1 1\n"),
    )
    .expect("stat");
}

#[test]
fn profile_links_into_the_workspace_pass() {
    let (_dir, config) = guest_dirs();
    make_links(&config);
    let check = browser_profiles_check(&config);
    assert_eq!(check.status, CheckStatus::Ok, "{}", check.detail);
}

#[test]
fn relative_links_to_the_same_place_pass() {
    let (_dir, config) = guest_dirs();
    make_links(&config);
    let link = config.home.join(".mozilla");
    std::fs::remove_file(&link).expect("rm");
    symlink("workspace/./.browser-profiles/mozilla", &link).expect("relative link");
    let check = browser_profiles_check(&config);
    assert_eq!(check.status, CheckStatus::Ok, "{}", check.detail);
}

#[test]
fn wrong_or_missing_links_fail_and_name_the_link() {
    let (dir, config) = guest_dirs();
    make_links(&config);
    // A profile directory instead of a link.
    let chromium = config.home.join(".config/chromium");
    std::fs::remove_file(&chromium).expect("rm");
    std::fs::create_dir(&chromium).expect("dir");
    let check = browser_profiles_check(&config);
    assert_eq!(check.status, CheckStatus::Fail);
    assert!(
        check.detail.contains("chromium is not a link"),
        "{}",
        check.detail
    );

    // A link out of the workspace.
    std::fs::remove_dir(&chromium).expect("rm");
    symlink(dir.path(), &chromium).expect("link");
    let check = browser_profiles_check(&config);
    assert_eq!(check.status, CheckStatus::Fail);
    assert!(check.detail.contains("points to"), "{}", check.detail);
}

#[test]
fn a_redirected_profile_target_fails_and_a_missing_one_degrades() {
    let (dir, config) = guest_dirs();
    make_links(&config);
    let target = config.profiles_root().join("google-chrome");
    std::fs::remove_dir(&target).expect("rm");
    // The target itself became a link out of the workspace.
    symlink(dir.path(), &target).expect("hostile");
    let check = browser_profiles_check(&config);
    assert_eq!(check.status, CheckStatus::Fail, "{}", check.detail);
    std::fs::remove_file(&target).expect("rm");
    let check = browser_profiles_check(&config);
    assert_eq!(check.status, CheckStatus::Degraded, "{}", check.detail);
    assert!(check.detail.contains("does not exist yet"));
}

#[test]
fn a_writable_workspace_passes_and_leaves_nothing_behind() {
    let (_dir, config) = guest_dirs();
    let check = workspace_check(&config);
    assert_eq!(check.status, CheckStatus::Ok, "{}", check.detail);
    let left: Vec<_> = std::fs::read_dir(&config.workspace).expect("ls").collect();
    assert!(left.is_empty(), "probe file left behind");
}

#[test]
fn workspace_problems_degrade_or_fail() {
    let (_dir, mut config) = guest_dirs();
    config.workspace_min_free_mib = u64::MAX / (1024 * 1024);
    let check = workspace_check(&config);
    assert_eq!(check.status, CheckStatus::Degraded);
    assert!(check.detail.contains("below the floor"), "{}", check.detail);

    config.workspace_min_free_mib = 1;
    config.uid = config.uid.wrapping_add(1);
    let check = workspace_check(&config);
    assert_eq!(check.status, CheckStatus::Degraded);
    assert!(check.detail.contains("owned by uid"), "{}", check.detail);

    let file = config.workspace.join("plain-file");
    std::fs::write(&file, "x").expect("file");
    config.workspace = file;
    assert_eq!(workspace_check(&config).status, CheckStatus::Fail);
    config.workspace = "/nonexistent/workspace".into();
    assert_eq!(workspace_check(&config).status, CheckStatus::Fail);
}

#[test]
fn a_tmpfs_workspace_is_degraded() {
    let shm = Path::new("/dev/shm");
    let is_tmpfs = nix::sys::statfs::statfs(shm)
        .map(|fs| fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
        .unwrap_or(false);
    if !is_tmpfs {
        eprintln!("SKIPPED a_tmpfs_workspace_is_degraded: /dev/shm is not a tmpfs here");
        return;
    }
    let dir = tempfile::tempdir_in(shm).expect("tmpfs dir");
    let config = Config {
        workspace: dir.path().into(),
        uid: nix::unistd::geteuid().as_raw(),
        workspace_min_free_mib: 0,
        ..Config::default()
    };
    let check = workspace_check(&config);
    assert_eq!(check.status, CheckStatus::Degraded);
    assert!(check.detail.contains("tmpfs"), "{}", check.detail);
}

#[test]
fn rfb_banners_are_recognised() {
    assert!(is_rfb_banner(b"RFB 003.008\n"));
    assert!(is_rfb_banner(b"RFB 003.003\n"));
    assert!(!is_rfb_banner(b"SSH-2.0-Open"));
    assert!(!is_rfb_banner(b"RFB 003.008 "));
    assert!(!is_rfb_banner(b"RFB 0x3.008\n"));
}

async fn fake_vnc(banner: &'static [u8]) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt as _;
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.write_all(banner).await;
        }
    });
    port
}

#[tokio::test]
async fn vnc_check_reads_the_banner() {
    let config = Config {
        vnc_port: fake_vnc(b"RFB 003.008\n").await,
        probe_timeout_ms: 2000,
        ..Config::default()
    };
    let check = vnc_check(&config).await;
    assert_eq!(check.status, CheckStatus::Ok, "{}", check.detail);
    assert!(check.detail.starts_with("RFB 003.008"), "{}", check.detail);

    let config = Config {
        vnc_port: fake_vnc(b"HTTP/1.1 400 Bad\r\n").await,
        ..config
    };
    assert_eq!(vnc_check(&config).await.status, CheckStatus::Fail);

    // Nothing listening.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let config = Config {
        vnc_port: closed,
        ..config
    };
    assert_eq!(vnc_check(&config).await.status, CheckStatus::Fail);
}

#[test]
fn identity_must_match_a_fresh_reading() {
    let (_dir, config) = guest_dirs();
    fake_identity(&config, "boot-a", 777);
    let fresh = fresh_identity(&config).expect("fresh");
    assert_eq!(fresh.boot_id, "boot-a");
    assert_eq!(fresh.pid1_start_time, 777);
    assert_eq!(
        identity_check(&config, Some(&fresh)).status,
        CheckStatus::Ok
    );
    assert_eq!(identity_check(&config, None).status, CheckStatus::Ok);

    // The container was restarted under this process's feet.
    fake_identity(&config, "boot-a", 778);
    let check = identity_check(&config, Some(&fresh));
    assert_eq!(check.status, CheckStatus::Fail);
    assert!(check.detail.contains("differs"), "{}", check.detail);

    // No procfs: the reported identity still stands, degraded.
    std::fs::remove_dir_all(&config.proc_root).expect("rm");
    assert_eq!(
        identity_check(&config, Some(&fresh)).status,
        CheckStatus::Degraded
    );
    assert_eq!(identity_check(&config, None).status, CheckStatus::Fail);
}

#[test]
fn a_missing_wm_hint_degrades_only_when_the_wm_runs() {
    let running = [service("openbox", ServiceRunState::Running)];
    assert_eq!(
        wm_check(Ok(WmState::Missing), &running).status,
        CheckStatus::Degraded
    );
    assert_eq!(
        wm_check(Ok(WmState::Missing), &[]).status,
        CheckStatus::Fail
    );
    assert_eq!(
        wm_check(Ok(WmState::Stale { window: 9 }), &[]).status,
        CheckStatus::Fail
    );
    let ok = wm_check(
        Ok(WmState::Present {
            window: 0x400001,
            name: Some("Openbox".into()),
        }),
        &[],
    );
    assert_eq!(ok.status, CheckStatus::Ok);
    assert!(ok.detail.contains("Openbox"));
}

#[test]
fn services_check_names_what_does_not_run() {
    let check = services_check(&[
        service("xvfb", ServiceRunState::Running),
        service("vnc", ServiceRunState::Backoff),
    ]);
    assert_eq!(check.status, CheckStatus::Fail);
    assert_eq!(check.detail, "vnc backoff");
}

#[tokio::test]
async fn without_a_display_the_probe_fails_with_reasons() {
    let (_dir, config) = guest_dirs();
    make_links(&config);
    fake_identity(&config, "boot", 5);
    let report = probe_once(&config, &[]).await;
    assert_eq!(report.overall, CheckStatus::Fail);
    assert_eq!(report.schema_version, "1");
    for name in [
        checks::X_DISPLAY,
        checks::WINDOW_MANAGER,
        checks::SCREENSHOT,
    ] {
        let check = report.check(name).expect(name);
        assert_eq!(check.status, CheckStatus::Fail);
        assert!(check.detail.contains("display :1"), "{}", check.detail);
    }
    assert_eq!(
        report.check(checks::WORKSPACE).map(|c| c.status),
        Some(CheckStatus::Ok)
    );
    assert_eq!(
        report.check(checks::BROWSER_PROFILES).map(|c| c.status),
        Some(CheckStatus::Ok)
    );
    assert!(report.check(checks::SERVICES).is_none());
}

#[tokio::test(start_paused = true)]
async fn the_loop_waits_for_services_and_backs_off_without_spinning() {
    let (_dir, config) = guest_dirs();
    fake_identity(&config, "boot", 5);
    let cell = StatusCell::new(fresh_identity(&config).expect("identity"));
    let mut rx = cell.subscribe();
    let probe_loop = tokio::spawn(run_probe_loop(Arc::new(config), cell.clone()));

    // Preparing: no probe however long we wait.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(cell.snapshot().health.is_none());

    cell.set_prepared();
    cell.set_services(vec![service("xvfb", ServiceRunState::Starting)], None);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(
        cell.snapshot().health.is_none(),
        "probed before services ran"
    );

    // Services run: a probe follows (and fails: there is no display).
    cell.set_services(vec![service("xvfb", ServiceRunState::Running)], None);
    rx.borrow_and_update();
    let mut reports = 0u32;
    let window = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::timeout_at(window, rx.changed()).await.is_ok() {
        let status = rx.borrow_and_update().clone();
        if status.health.is_some() {
            reports += 1;
            assert!(!status.ready);
        }
    }
    // 25 ms doubling to 1 s: about 14 retries in 10 s, never a spin.
    assert!((3..=20).contains(&reports), "{reports} probes in 10 s");
    probe_loop.abort();
}
