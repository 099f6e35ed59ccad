//! The supervisor's one configuration: every system path and tunable.
//!
//! Production reads `/etc/dormouse/supervisor.toml` (if present), then
//! `DORMOUSE_*` environment variables, then flags. Unit tests build a
//! [`Config`] whose paths point into a temp directory and run the production
//! code against fake `/proc` files. No other module may hard-code a system path.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

/// Where production reads the configuration file from.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/dormouse/supervisor.toml";

/// Prefix of the environment variables that override the file:
/// `DORMOUSE_WIDTH=1920` sets `width`.
pub const ENV_PREFIX: &str = "DORMOUSE_";

/// Keys whose default is "absent" (an `Option`), so they do not show up in a
/// serialised default and must be known by name.
const OPTIONAL_KEYS: &[&str] = &["browser", "taskbar"];

/// A browser the supervisor can autostart. In the configuration it is a
/// name (`chromium`, `google-chrome`/`chrome`, `firefox`/`firefox-esr`, any
/// case); any other name is a configuration error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Browser {
    /// Debian's `chromium`.
    Chromium,
    /// `google-chrome`, when installed.
    GoogleChrome,
    /// Debian's `firefox-esr`.
    Firefox,
}

impl Browser {
    /// Parses a configuration value; `None` for a name it does not know.
    pub fn from_name(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "chromium" => Some(Self::Chromium),
            "google-chrome" | "chrome" => Some(Self::GoogleChrome),
            "firefox" | "firefox-esr" => Some(Self::Firefox),
            _ => None,
        }
    }

    /// Its configuration name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Chromium => "chromium",
            Self::GoogleChrome => "google-chrome",
            Self::Firefox => "firefox",
        }
    }
}

impl Serialize for Browser {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Browser {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::from_name(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "browser {name:?} is not chromium, google-chrome or firefox"
            ))
        })
    }
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this struct.
    #[error("{origin}: {message}")]
    Parse {
        /// File, variable or flag the value came from.
        origin: String,
        /// What was wrong.
        message: String,
    },
    /// A variable or flag names no configuration key.
    #[error("{origin}: unknown key {key:?}")]
    UnknownKey {
        /// Variable or flag it came from.
        origin: String,
        /// The key.
        key: String,
    },
    /// A value parses but makes no sense.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Everything the supervisor needs to know about the system it runs on.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// procfs root (`/proc`).
    pub proc_root: PathBuf,
    /// The desktop user's home (`/home/desk`).
    pub home: PathBuf,
    /// The persistent workspace mount (`/home/desk/workspace`).
    pub workspace: PathBuf,
    /// `/tmp`, where X keeps `.X<N>-lock` and `.X11-unix/`.
    pub tmp_dir: PathBuf,
    /// The run directory shared with the host (`/run/dormouse`).
    pub run_dir: PathBuf,
    /// Container-local state that survives `docker stop`/`start` of this
    /// container but not a new container (`/var/lib/dormouse-supervisor`).
    pub state_dir: PathBuf,
    /// uid of the desktop user.
    pub uid: u32,
    /// gid of the desktop user.
    pub gid: u32,
    /// X display number (`:1`).
    pub display: u32,
    /// Screen width in pixels.
    pub width: u32,
    /// Screen height in pixels.
    pub height: u32,
    /// Screen depth in bits.
    pub depth: u32,
    /// Loopback TCP port of the VNC server.
    pub vnc_port: u16,
    /// Offer OpenGL (the X server's GLX extension, software-rendered) to the
    /// desktop's apps. Off by default: loading the software GL driver is the
    /// largest single part of Xvfb's start (~150-200 ms of a resume in a
    /// freshly started container), and browsers run with `--disable-gpu`.
    pub glx: bool,
    /// Browser started after the desktop is up: `chromium`, `firefox` or none.
    pub browser: Option<Browser>,
    /// The taskbar's tint2 configuration file: when set, `tint2 -c <file>`
    /// runs as a service once the window manager does, and the status
    /// reports the height of the band it keeps. Absent: no taskbar.
    pub taskbar: Option<PathBuf>,
    /// Free space the workspace must have for the probe to pass, in MiB.
    pub workspace_min_free_mib: u64,
    /// CPU percent (of one core) above which a uid-1000 process counts as busy.
    pub busy_cpu_percent: f64,
    /// Upper bound for a graceful stop, in milliseconds.
    pub stop_timeout_ms: u64,
    /// Most guest-socket connections served at once; more are closed at once.
    pub socket_max_connections: usize,
    /// How long a connection may stay silent between requests (not `watch`), ms.
    pub socket_idle_timeout_ms: u64,
    /// Bound for the rest of a frame once its first byte arrived, and for
    /// every write to a client, ms.
    pub socket_io_timeout_ms: u64,
    /// Largest quiesce bound a client may ask for, ms.
    pub quiesce_max_ms: u64,
    /// How long `activity` samples the CPU use of uid-1000 processes, ms.
    pub busy_sample_ms: u64,
    /// Bound for each step of the self-probe (X, VNC) and for a screenshot, ms.
    pub probe_timeout_ms: u64,
    /// Re-probe a probed desktop this often even without service changes, ms
    /// (0: only when the service set changes).
    pub reprobe_interval_ms: u64,
    /// Bound for one service to become ready after it was spawned, ms.
    pub service_ready_timeout_ms: u64,
    /// First restart delay after a failure; it doubles with every failure in
    /// a row, ms.
    pub restart_base_ms: u64,
    /// Longest restart delay, ms.
    pub restart_max_ms: u64,
    /// A service that ran this long before it failed starts its backoff
    /// afresh, ms.
    pub restart_stable_ms: u64,
    /// This many failures of one service within `crash_loop_window_ms` make a
    /// crash loop: the service is marked failed and the desktop degraded.
    pub crash_loop_failures: u32,
    /// Window for counting failures, ms.
    pub crash_loop_window_ms: u64,
    /// How long a crash-looping service rests before it is tried again, ms.
    pub crash_loop_cooldown_ms: u64,
    /// Log verbosity: `error`, `warn`, `info`, `debug` or `trace`.
    pub log_level: String,
    /// Log format on stderr: `text` or `json`.
    pub log_format: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            proc_root: "/proc".into(),
            home: "/home/desk".into(),
            workspace: "/home/desk/workspace".into(),
            tmp_dir: "/tmp".into(),
            run_dir: "/run/dormouse".into(),
            state_dir: "/var/lib/dormouse-supervisor".into(),
            uid: 1000,
            gid: 1000,
            display: 1,
            width: 1280,
            height: 800,
            depth: 24,
            vnc_port: 5900,
            glx: false,
            browser: None,
            taskbar: None,
            workspace_min_free_mib: 64,
            busy_cpu_percent: 20.0,
            stop_timeout_ms: 5000,
            socket_max_connections: 64,
            socket_idle_timeout_ms: 10_000,
            socket_io_timeout_ms: 5_000,
            quiesce_max_ms: 60_000,
            busy_sample_ms: 200,
            probe_timeout_ms: 5_000,
            reprobe_interval_ms: 60_000,
            service_ready_timeout_ms: 20_000,
            restart_base_ms: 250,
            restart_max_ms: 30_000,
            restart_stable_ms: 30_000,
            crash_loop_failures: 5,
            crash_loop_window_ms: 60_000,
            crash_loop_cooldown_ms: 60_000,
            log_level: "info".into(),
            log_format: "text".into(),
        }
    }
}

impl Config {
    /// Loads the configuration: defaults, then the TOML `file`, then every
    /// `DORMOUSE_<KEY>` of `env`, then `overrides` (`key=value` flags), each
    /// layer winning over the one before. A missing file is fine unless
    /// `file_required` (it was named explicitly). Returns the configuration
    /// and notes worth logging once logging is up (e.g. ignored variables).
    pub fn load(
        file: &Path,
        file_required: bool,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &[(String, String)],
    ) -> Result<(Self, Vec<String>), ConfigError> {
        let mut notes = Vec::new();
        let mut config = match std::fs::read_to_string(file) {
            Ok(text) => {
                notes.push(format!("configuration file {}", file.display()));
                Self::from_toml(&text, &file.display().to_string())?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !file_required => {
                notes.push(format!("no {}, using defaults", file.display()));
                Self::default()
            }
            Err(source) => {
                return Err(ConfigError::Read {
                    path: file.to_owned(),
                    source,
                })
            }
        };
        let mut env: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX) && k != "DORMOUSE_CONFIG")
            .collect();
        // Deterministic order, so two variables for one key cannot race.
        env.sort();
        for (name, value) in env {
            let key = name[ENV_PREFIX.len()..].to_ascii_lowercase();
            if !config.has_key(&key) {
                // The guest may carry DORMOUSE_* variables meant for others.
                notes.push(format!("ignoring {name}: no such configuration key"));
                continue;
            }
            config.set(&key, &value, &name)?;
        }
        for (key, value) in overrides {
            config.set(key, value, &format!("--set {key}"))?;
        }
        config.validate()?;
        Ok((config, notes))
    }

    /// Parses the TOML file (one flat table, see [`crate::config_file`]);
    /// missing keys keep their defaults, unknown keys are an error (a typo
    /// must not be silently ignored).
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let table = crate::config_file::parse(text).map_err(|e| ConfigError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        let mut config = Self::default();
        config.replace_from(table, origin)?;
        Ok(config)
    }

    /// Whether `key` names a configuration field.
    pub fn has_key(&self, key: &str) -> bool {
        OPTIONAL_KEYS.contains(&key) || self.as_table().is_some_and(|t| t.contains_key(key))
    }

    /// Sets one field from its string form, typed like the field: `width` =
    /// `"1920"` is the integer 1920. For an optional field an empty value or
    /// `none` clears it. `origin` names the variable or flag for errors.
    pub fn set(&mut self, key: &str, value: &str, origin: &str) -> Result<(), ConfigError> {
        let mut table = self.as_table().ok_or_else(|| ConfigError::Parse {
            origin: origin.to_owned(),
            message: "the configuration cannot be represented as a table".into(),
        })?;
        let bad = |message: String| ConfigError::Parse {
            origin: origin.to_owned(),
            message,
        };
        let typed = if OPTIONAL_KEYS.contains(&key) {
            let trimmed = value.trim();
            (!trimmed.is_empty() && !trimmed.eq_ignore_ascii_case("none"))
                .then(|| Value::String(trimmed.to_owned()))
        } else {
            let number = |n: Option<Number>| {
                n.map(Value::Number).ok_or_else(|| {
                    bad(format!(
                        "{key}: {value:?} is not a number of the right kind"
                    ))
                })
            };
            Some(match table.get(key) {
                Some(Value::Number(n)) if n.is_f64() => {
                    number(value.trim().parse().ok().and_then(Number::from_f64))?
                }
                Some(Value::Number(_)) => {
                    let v = value.trim();
                    number(
                        v.parse::<u64>()
                            .ok()
                            .map(Number::from)
                            .or_else(|| v.parse::<i64>().ok().map(Number::from)),
                    )?
                }
                Some(Value::Bool(_)) => Value::Bool(
                    value
                        .trim()
                        .parse()
                        .map_err(|e| bad(format!("{key}: {value:?} is not a boolean: {e}")))?,
                ),
                Some(_) => Value::String(value.to_owned()),
                None => {
                    return Err(ConfigError::UnknownKey {
                        origin: origin.to_owned(),
                        key: key.to_owned(),
                    })
                }
            })
        };
        match typed {
            Some(v) => table.insert(key.to_owned(), v),
            None => table.remove(key),
        };
        self.replace_from(table, origin)
    }

    /// Rejects values that parse but cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        for (name, path) in [
            ("proc_root", &self.proc_root),
            ("home", &self.home),
            ("workspace", &self.workspace),
            ("tmp_dir", &self.tmp_dir),
            ("run_dir", &self.run_dir),
            ("state_dir", &self.state_dir),
        ] {
            if !path.is_absolute() {
                return invalid(format!("{name} must be an absolute path, not {path:?}"));
            }
        }
        if let Some(taskbar) = self.taskbar.as_ref().filter(|p| !p.is_absolute()) {
            return invalid(format!("taskbar must be an absolute path, not {taskbar:?}"));
        }
        if self.uid == 0 || self.gid == 0 {
            return invalid("the desktop must never run as root (uid or gid 0)".into());
        }
        if !(1..=16_384).contains(&self.width) || !(1..=16_384).contains(&self.height) {
            return invalid(format!(
                "screen {}x{} is out of range",
                self.width, self.height
            ));
        }
        if ![8, 15, 16, 24, 32].contains(&self.depth) {
            return invalid(format!(
                "depth {} is not one of 8, 15, 16, 24, 32",
                self.depth
            ));
        }
        if self.crash_loop_failures == 0 {
            return invalid("crash_loop_failures must be at least 1".into());
        }
        if self.restart_base_ms == 0 || self.restart_max_ms < self.restart_base_ms {
            return invalid("restart_base_ms must be > 0 and <= restart_max_ms".into());
        }
        if !["text", "json"].contains(&self.log_format.as_str()) {
            return invalid(format!(
                "log_format {:?} is not text or json",
                self.log_format
            ));
        }
        if self.log_level.parse::<tracing::Level>().is_err() {
            return invalid(format!("log_level {:?} is not a level", self.log_level));
        }
        Ok(())
    }

    /// This configuration as key → value (optional keys that are unset are
    /// absent).
    fn as_table(&self) -> Option<Map<String, Value>> {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut map)) => {
                map.retain(|_, v| !v.is_null());
                Some(map)
            }
            _ => None,
        }
    }

    /// Replaces this configuration by `table` laid over it: keys in `table`
    /// win, optional keys absent from `table` are unset.
    fn replace_from(&mut self, table: Map<String, Value>, origin: &str) -> Result<(), ConfigError> {
        let mut merged = self.as_table().unwrap_or_default();
        for key in OPTIONAL_KEYS {
            merged.remove(*key);
        }
        merged.extend(table);
        *self = serde_json::from_value(Value::Object(merged)).map_err(|e| ConfigError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        Ok(())
    }

    /// The trusted directory above `path`: the parent of the home for
    /// anything in the home (the home itself belongs to the desktop user),
    /// else the parent of `path`.
    pub fn anchor_for<'a>(&'a self, path: &'a Path) -> &'a Path {
        if let Some(above_home) = self.home.parent() {
            if path.starts_with(above_home) && path != above_home {
                return above_home;
            }
        }
        path.parent().unwrap_or(Path::new("/"))
    }

    /// The supervisor socket.
    pub fn socket_path(&self) -> PathBuf {
        self.run_dir.join(dormouse_protocol::SOCKET_FILE_NAME)
    }

    /// `DISPLAY` value, e.g. `:1`.
    pub fn display_name(&self) -> String {
        format!(":{}", self.display)
    }

    /// Root of the browser profiles inside the workspace.
    pub fn profiles_root(&self) -> PathBuf {
        self.workspace.join(".browser-profiles")
    }

    /// Root of the apps installed into the workspace (`~/.local` lives here).
    pub fn apps_root(&self) -> PathBuf {
        self.workspace.join(".desktop-apps")
    }

    /// Where the identity of the last preparation is recorded.
    pub fn identity_record_path(&self) -> PathBuf {
        self.state_dir.join("prepared-identity.json")
    }

    /// `/tmp/.X11-unix`.
    pub fn x_socket_dir(&self) -> PathBuf {
        self.tmp_dir.join(".X11-unix")
    }

    /// `/tmp/.X<N>-lock`.
    pub fn x_lock_path(&self) -> PathBuf {
        self.tmp_dir.join(format!(".X{}-lock", self.display))
    }

    /// `/tmp/.X11-unix/X<N>`.
    pub fn x_socket_path(&self) -> PathBuf {
        self.tmp_dir
            .join(".X11-unix")
            .join(format!("X{}", self.display))
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::path::Path;

    use crate::config::Config;

    /// A config whose home, workspace, `/tmp`, state and run dirs are in
    /// `base`, owned by whoever runs the test.
    pub(crate) fn test_config(base: &Path) -> Config {
        let home = base.join("home/desk");
        std::fs::create_dir_all(home.join("workspace")).expect("mkdir");
        std::fs::create_dir_all(base.join("tmp")).expect("mkdir");
        Config {
            workspace: home.join("workspace"),
            home,
            tmp_dir: base.join("tmp"),
            state_dir: base.join("state"),
            run_dir: base.join("run/dormouse"),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            ..Config::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn layers_win_in_order_file_env_flags() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("supervisor.toml");
        std::fs::write(
            &file,
            "width = 1920\nheight = 1080\nbrowser = \"chromium\"\n",
        )
        .expect("write");
        let (config, notes) = Config::load(
            &file,
            true,
            env(&[
                ("DORMOUSE_HEIGHT", "1200"),
                ("DORMOUSE_BUSY_CPU_PERCENT", "12.5"),
                ("DORMOUSE_TEST_IMAGE", "ignored"),
                ("PATH", "/bin"),
            ]),
            &[
                ("height".into(), "900".into()),
                ("browser".into(), "none".into()),
            ],
        )
        .expect("load");
        assert_eq!(config.width, 1920);
        assert_eq!(config.height, 900);
        assert!((config.busy_cpu_percent - 12.5).abs() < f64::EPSILON);
        assert_eq!(config.browser, None);
        assert!(notes.iter().any(|n| n.contains("DORMOUSE_TEST_IMAGE")));
    }

    #[test]
    fn a_missing_default_file_means_defaults() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("none.toml");
        let (config, _) = Config::load(&missing, false, env(&[]), &[]).expect("defaults");
        assert_eq!(config, Config::default());
        assert!(matches!(
            Config::load(&missing, true, env(&[]), &[]),
            Err(ConfigError::Read { .. })
        ));
    }

    #[test]
    fn typos_and_bad_values_are_errors() {
        assert!(matches!(
            Config::from_toml("widht = 3", "f"),
            Err(ConfigError::Parse { .. })
        ));
        let mut config = Config::default();
        assert!(matches!(
            config.set("widht", "3", "--set"),
            Err(ConfigError::UnknownKey { .. })
        ));
        assert!(matches!(
            config.set("width", "wide", "--set"),
            Err(ConfigError::Parse { .. })
        ));
        config.set("browser", "firefox", "--set").expect("browser");
        assert_eq!(config.browser, Some(Browser::Firefox));
        // A browser it does not know is an error, never dropped.
        assert!(matches!(
            config.set("browser", "lynx", "--set"),
            Err(ConfigError::Parse { .. })
        ));
        assert_eq!(config.browser, Some(Browser::Firefox));
        config.set("home", "/srv/home", "--set").expect("path");
        assert_eq!(config.home, PathBuf::from("/srv/home"));
    }

    #[test]
    fn the_image_file_is_valid_and_matches_the_defaults() {
        let text = include_str!("../../images/desktop/supervisor.toml");
        let config = Config::from_toml(text, "images/desktop/supervisor.toml").expect("parses");
        config.validate().expect("valid");
        // The image adds its taskbar; everything else is the default.
        assert_eq!(
            config.taskbar.as_deref(),
            Some(Path::new("/etc/dormouse/tint2rc"))
        );
        assert_eq!(
            config,
            Config {
                taskbar: config.taskbar.clone(),
                ..Config::default()
            }
        );
    }

    #[test]
    fn numbers_keep_their_kind() {
        let mut config = Config::default();
        config
            .set("busy_cpu_percent", "7", "--set")
            .expect("float from an integer");
        assert!((config.busy_cpu_percent - 7.0).abs() < f64::EPSILON);
        assert!(
            config.set("vnc_port", "70000", "--set").is_err(),
            "u16 overflow"
        );
        assert!(config.set("uid", "-1", "--set").is_err(), "negative uid");
        assert!(Config::from_toml("width = \"wide\"", "f").is_err());
    }

    #[test]
    fn nonsense_is_rejected() {
        for (key, value) in [
            ("uid", "0"),
            ("depth", "12"),
            ("home", "relative/home"),
            ("log_format", "xml"),
            ("crash_loop_failures", "0"),
            ("taskbar", "tint2rc"),
        ] {
            let mut config = Config::default();
            config.set(key, value, "--set").expect("parses");
            assert!(config.validate().is_err(), "{key}={value} must be invalid");
        }
        Config::default().validate().expect("defaults are valid");
    }
}
