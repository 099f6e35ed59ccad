//! What the desktop's services are: their kinds, their command lines and
//! environment, in start order. Plain data built from the configuration;
//! nothing here starts or watches a process.

use crate::config::{Browser, Config};

/// What kind of service, which decides readiness and failure rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceKind {
    /// The X server.
    Display,
    /// The window manager.
    WindowManager,
    /// The VNC server.
    Vnc,
    /// The taskbar (a dock window that reserves a band of the screen).
    Taskbar,
    /// An autostarted browser.
    Browser(Browser),
}

impl ServiceKind {
    /// Whether this service waits for an earlier service of kind `earlier`
    /// to run before it starts. The window manager and the VNC server need
    /// only X (they are X clients of their own), so they start side by side
    /// once X answers; the taskbar needs the window manager too (its band
    /// is reserved by the manager's work area, and a tint2 that maps its
    /// panel while openbox is still starting up is never managed); a
    /// browser needs the rest of the desktop. Readiness does not wait for
    /// the taskbar.
    pub fn waits_for(self, earlier: ServiceKind) -> bool {
        match self {
            Self::Display => false,
            Self::WindowManager | Self::Vnc => earlier == Self::Display,
            Self::Taskbar => matches!(earlier, Self::Display | Self::WindowManager),
            // Not the taskbar: readiness does not wait for it, and a
            // window opened before its band is moved up by the manager.
            Self::Browser(_) => earlier != Self::Taskbar,
        }
    }

    /// Whether the desktop is ready only while this service runs. The
    /// taskbar is not: it may come up after ready (screenshots and actions
    /// wait for it, [`crate::status::StatusCell::settled`]).
    pub fn needed_for_ready(self) -> bool {
        self != Self::Taskbar
    }

    /// The start step this service's first readiness ends.
    pub fn start_step(self) -> Option<crate::status::StartStep> {
        use crate::status::StartStep;
        match self {
            Self::Display => Some(StartStep::X),
            Self::WindowManager => Some(StartStep::WindowManager),
            Self::Vnc => Some(StartStep::Vnc),
            Self::Taskbar => Some(StartStep::Taskbar),
            Self::Browser(_) => None,
        }
    }
}

/// One service: its name in the status, kind and command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Name in the service table.
    pub name: &'static str,
    /// Kind.
    pub kind: ServiceKind,
    /// Program (looked up in `PATH`).
    pub program: String,
    /// Arguments.
    pub args: Vec<String>,
}

/// Flags every autostarted Chromium gets: it must not phone home or nag.
/// Its own sandbox stays on (the broker's seccomp profile lets it make its
/// user namespaces; docs/security.md).
pub const CHROMIUM_FLAGS: &[&str] = &[
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--password-store=basic",
    "--hide-crash-restore-bubble",
];

/// The services of a desktop, in start order.
pub fn desktop_services(config: &Config) -> Vec<ServiceSpec> {
    let display = config.display_name();
    let mut xvfb_args = vec![
        display.clone(),
        "-screen".into(),
        "0".into(),
        format!("{}x{}x{}", config.width, config.height, config.depth),
        "-nolisten".into(),
        "tcp".into(),
        // Stay up when the last client disconnects.
        "-noreset".into(),
        // Readiness: the display number is written to stdout.
        "-displayfd".into(),
        "1".into(),
    ];
    if !config.glx {
        xvfb_args.extend(["-extension".into(), "GLX".into()]);
    }
    let mut services = vec![
        ServiceSpec {
            name: "xvfb",
            kind: ServiceKind::Display,
            program: "Xvfb".into(),
            args: xvfb_args,
        },
        ServiceSpec {
            name: "openbox",
            kind: ServiceKind::WindowManager,
            program: "openbox".into(),
            args: vec!["--sm-disable".into()],
        },
        ServiceSpec {
            name: "vnc",
            kind: ServiceKind::Vnc,
            program: "x11vnc".into(),
            args: vec![
                "-display".into(),
                display,
                "-localhost".into(),
                "-rfbport".into(),
                config.vnc_port.to_string(),
                "-forever".into(),
                "-shared".into(),
                "-nopw".into(),
                "-noipv6".into(),
                // Accept in its own thread: without it an idle x11vnc polls
                // for new clients only every ~200 ms, which readiness waits out.
                "-threads".into(),
                // No naps: an x11vnc that saw no change for a while sleeps
                // between polls and a viewer opened on an idle desktop
                // waited seconds for its first frame.
                "-nonap".into(),
                // Leave key autorepeat alone on every (probe) connection.
                "-repeat".into(),
                // Its banner of tips is noise in the log; `PORT=` still comes.
                "-quiet".into(),
                // The clipboard: x11vnc makes the window it owns selections
                // with only once it guesses no display manager runs, 8 s
                // after the last viewer connected, and probes and viewers
                // keep connecting; until then a viewer's cut text is
                // dropped. There is no display manager here: say so, and
                // the window is made at once (docs/screens.md).
                "-env".into(),
                "X11VNC_AVOID_WINDOWS=never".into(),
            ],
        },
    ];
    if let Some(tint2rc) = &config.taskbar {
        services.push(ServiceSpec {
            name: "taskbar",
            kind: ServiceKind::Taskbar,
            program: "tint2".into(),
            args: vec!["-c".into(), tint2rc.display().to_string()],
        });
    }
    if let Some(browser) = config.browser {
        let (program, args) = match browser {
            Browser::Chromium => (
                "chromium",
                CHROMIUM_FLAGS.iter().map(|s| (*s).to_owned()).collect(),
            ),
            Browser::GoogleChrome => (
                "google-chrome",
                CHROMIUM_FLAGS.iter().map(|s| (*s).to_owned()).collect(),
            ),
            Browser::Firefox => ("firefox-esr", Vec::new()),
        };
        services.push(ServiceSpec {
            name: "browser",
            kind: ServiceKind::Browser(browser),
            program: program.into(),
            args,
        });
    }
    services
}

/// A program to run as the desktop user: the desktop's environment only,
/// in the home, and in a process group of its own, so a stop or a kill
/// reaches its helpers and a signal to the supervisor's group never
/// reaches it. std drops supplementary groups (setgroups(0)) before
/// setgid/setuid when running as root: the process keeps no capability
/// and no group of root. Callers add arguments, stdio and a working
/// directory of their own.
pub fn desktop_command(
    config: &Config,
    program: impl AsRef<std::ffi::OsStr>,
) -> std::process::Command {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = std::process::Command::new(program);
    cmd.env_clear()
        .envs(desktop_env(config))
        .current_dir(&config.home)
        .uid(config.uid)
        .gid(config.gid)
        .process_group(0);
    cmd
}

/// The environment of every desktop process.
pub fn desktop_env(config: &Config) -> Vec<(String, String)> {
    let lang = std::env::var("LANG").unwrap_or_else(|_| "C.UTF-8".into());
    let mut env = vec![
        ("HOME".into(), config.home.display().to_string()),
        ("USER".into(), "desk".into()),
        ("LOGNAME".into(), "desk".into()),
        ("SHELL".into(), "/bin/bash".into()),
        (
            "PATH".into(),
            "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin".into(),
        ),
        ("DISPLAY".into(), config.display_name()),
        ("LANG".into(), lang),
    ];
    if let Ok(tz) = std::env::var("TZ") {
        env.push(("TZ".into(), tz));
    }
    // Firefox's own sandbox stays off, the container is its sandbox:
    // Chromium's runs under the broker's seccomp profile (docs/security.md),
    // Firefox's has not been proven under it, and its content processes
    // crash where an engine's profile refuses what it needs.
    env.extend(
        FIREFOX_SANDBOX_OFF
            .iter()
            .map(|k| ((*k).to_owned(), "1".to_owned())),
    );
    // No network interface: the web is the egress proxy on the loopback.
    env.extend(
        dormouse_protocol::egress::PROXY_ENV
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    env
}

/// Variables that turn Firefox's own process sandboxes off.
pub const FIREFOX_SANDBOX_OFF: &[&str] = &[
    "MOZ_DISABLE_CONTENT_SANDBOX",
    "MOZ_DISABLE_GMP_SANDBOX",
    "MOZ_DISABLE_RDD_SANDBOX",
    "MOZ_DISABLE_SOCKET_PROCESS_SANDBOX",
    "MOZ_DISABLE_UTILITY_SANDBOX",
];
