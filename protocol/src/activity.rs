//! The activity record of a desktop: what was done to it, by whom, newest
//! first (`GET /v1/computers/{id}/activity`, and `{"type": "activity"}` on
//! `/v1/events`).
//!
//! This module owns the shape of an entry and how each kind of happening
//! becomes one ([`Happened`]: its kind, a one-line summary for people and
//! its detail object). It never carries what was typed or the keys pressed:
//! an action batch is recorded by its action names and counts only, and a
//! command line by its program and the argv [`argv`] keeps of it.

pub mod argv;

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use self::argv::{Argv, ArgvRecord};

/// Most entries one read answers (and kept per desktop).
pub const MAX_ACTIVITY_LIMIT: usize = 500;
/// Entries a read answers when `limit` is left out.
pub const DEFAULT_ACTIVITY_LIMIT: usize = 100;
/// Longest summary, in characters.
pub const MAX_SUMMARY_CHARS: usize = 200;

/// Who did it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Actor {
    /// A call with the bearer token that carried no generation of a lease.
    Api,
    /// A call that carried the lease generation this holder holds.
    Lease(String),
    /// A live-screen capability (by its id).
    Screen(Uuid),
    /// The broker by itself (the idle timer, reconciliation, expiry).
    Broker,
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Api => f.write_str("api"),
            Self::Lease(holder) => write!(f, "lease:{holder}"),
            Self::Screen(id) => write!(f, "screen:{id}"),
            Self::Broker => f.write_str("broker"),
        }
    }
}

impl From<Actor> for String {
    fn from(actor: Actor) -> Self {
        actor.to_string()
    }
}

/// An actor string that is none of the four forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an actor is api, broker, lease:<holder> or screen:<id>")]
pub struct BadActor;

impl TryFrom<String> for Actor {
    type Error = BadActor;

    fn try_from(s: String) -> Result<Self, BadActor> {
        match s.as_str() {
            "api" => return Ok(Self::Api),
            "broker" => return Ok(Self::Broker),
            _ => {}
        }
        if let Some(holder) = s.strip_prefix("lease:") {
            return Ok(Self::Lease(holder.to_owned()));
        }
        if let Some(id) = s.strip_prefix("screen:") {
            return id.parse().map(Self::Screen).map_err(|_| BadActor);
        }
        Err(BadActor)
    }
}

/// What kind of thing happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum ActivityKind {
    Actions,
    Exec,
    Terminal,
    FileWrite,
    FileDelete,
    Mkdir,
    Import,
    Export,
    ScreenMinted,
    ScreenRevoked,
    LeaseAcquired,
    LeaseReleased,
    LeaseTakenOver,
    Started,
    Stopped,
}

/// One entry of a desktop's activity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivityEntry {
    /// Increases per desktop; never repeats, across broker restarts too.
    pub seq: u64,
    /// When it was recorded (RFC 3339, milliseconds, UTC).
    #[serde(with = "millis")]
    pub at: DateTime<Utc>,
    /// Who did it.
    pub actor: Actor,
    /// What kind of thing it was.
    pub kind: ActivityKind,
    /// One line for people.
    pub summary: String,
    /// The kind's own object ([`Happened::detail`]).
    pub detail: serde_json::Value,
}

impl ActivityEntry {
    /// This entry (read back from disk, perhaps recorded under another
    /// mode) as `mode` keeps it: `Some` when that changes it. An exec's or
    /// a terminal's argv is redacted or left out again; nothing left out
    /// comes back.
    pub fn kept(&self, mode: ArgvRecord) -> Option<Self> {
        let what = self.happened()?;
        let kept = what.kept(mode);
        let entry = Self {
            summary: kept.summary(),
            detail: kept.detail(),
            ..self.clone()
        };
        (entry != *self).then_some(entry)
    }

    /// The command line an exec's or a terminal's detail holds, back as
    /// what happened; `None` for other kinds (and a detail not of its kind).
    fn happened(&self) -> Option<Happened> {
        let d = &self.detail;
        let argv = || -> Option<Argv> {
            let strings = |v: &serde_json::Value| -> Option<Vec<String>> {
                v.as_array()?
                    .iter()
                    .map(|s| s.as_str().map(str::to_owned))
                    .collect()
            };
            let argv = d.get("argv").and_then(strings);
            let program = match d.get("program").and_then(serde_json::Value::as_str) {
                Some(p) => p.to_owned(),
                None => argv.as_ref()?.first().cloned().unwrap_or_default(),
            };
            Some(Argv {
                program,
                argv,
                cut: d.get("argv_cut").and_then(serde_json::Value::as_bool) == Some(true),
            })
        };
        let count = |key: &str| d.get(key).and_then(serde_json::Value::as_u64).unwrap_or(0);
        match self.kind {
            ActivityKind::Exec => Some(Happened::Exec {
                argv: argv()?,
                exit_code: d
                    .get("exit_code")
                    .and_then(serde_json::Value::as_i64)
                    .and_then(|c| i32::try_from(c).ok()),
                timed_out: d.get("timed_out").and_then(serde_json::Value::as_bool) == Some(true),
                stdout_bytes: count("stdout_bytes"),
                stderr_bytes: count("stderr_bytes"),
            }),
            ActivityKind::Terminal => Some(Happened::Terminal { argv: argv() }),
            _ => None,
        }
    }
}

/// `GET /v1/computers/{id}/activity`: newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivityPage {
    /// The entries, newest first.
    pub entries: Vec<ActivityEntry>,
}

/// Something that happened to a desktop, before it is an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Happened {
    /// A batch of computer-use actions ran (or failed).
    Actions {
        /// How many of each action the batch held.
        names: BTreeMap<String, u64>,
        /// Whether the batch ran and every action did what it was asked.
        ok: bool,
    },
    /// A command ran to its end (or was given up).
    Exec {
        /// What ran (as given; [`Happened::kept`] applies the mode).
        argv: Argv,
        /// Its exit code, if it exited.
        exit_code: Option<i32>,
        /// Whether its timeout ended it.
        timed_out: bool,
        /// Bytes of standard output the broker got (never the bytes).
        stdout_bytes: u64,
        /// Bytes of standard error the broker got (never the bytes).
        stderr_bytes: u64,
    },
    /// A terminal session was opened.
    Terminal {
        /// What it runs; the login shell when absent.
        argv: Option<Argv>,
    },
    /// A file was written.
    FileWrite {
        /// Its workspace path.
        path: String,
        /// Bytes written.
        bytes: u64,
    },
    /// A file, link or tree was removed.
    FileDelete {
        /// Its workspace path.
        path: String,
        /// Entries removed, the entry itself included.
        removed: u64,
    },
    /// A directory was made.
    Mkdir {
        /// Its workspace path.
        path: String,
    },
    /// The workspace was replaced from an archive.
    Import {
        /// Bytes of file content.
        bytes: u64,
        /// Files, directories, links.
        entries: u64,
    },
    /// The workspace was exported as an archive.
    Export {
        /// Bytes of file content.
        bytes: u64,
        /// Files, directories, links.
        entries: u64,
    },
    /// A live-screen capability was minted.
    ScreenMinted {
        /// The capability.
        screen_id: Uuid,
        /// `view` or `control`.
        mode: String,
        /// The reason given at the mint.
        reason: Option<String>,
    },
    /// A live-screen capability was revoked (or expired).
    ScreenRevoked {
        /// The capability.
        screen_id: Uuid,
        /// `view` or `control`.
        mode: String,
        /// Why it went.
        reason: Option<String>,
    },
    /// A lease was granted to a holder where none was live.
    LeaseAcquired {
        /// The holder.
        holder: String,
        /// Its generation.
        generation: u64,
    },
    /// The holder gave its lease back.
    LeaseReleased {
        /// The holder.
        holder: String,
        /// Its generation.
        generation: u64,
    },
    /// A new holder took over a lapsed lease of another.
    LeaseTakenOver {
        /// The new holder.
        holder: String,
        /// The new generation.
        generation: u64,
    },
    /// The desktop started (a create's first start, or a resume).
    Started,
    /// The desktop stopped.
    Stopped {
        /// Why (`idle`, `manual`, `fenced`, `killed`, …).
        reason: String,
    },
}

impl Happened {
    /// What a record keeps of it under `mode`: a command line's argv
    /// redacted, whole or left out (cut to [`argv::MAX_ARGV_BYTES`]);
    /// anything else as it is.
    pub fn kept(&self, mode: ArgvRecord) -> Self {
        match self {
            Self::Exec {
                argv,
                exit_code,
                timed_out,
                stdout_bytes,
                stderr_bytes,
            } => Self::Exec {
                argv: argv.kept(mode),
                exit_code: *exit_code,
                timed_out: *timed_out,
                stdout_bytes: *stdout_bytes,
                stderr_bytes: *stderr_bytes,
            },
            Self::Terminal { argv } => Self::Terminal {
                argv: argv.as_ref().map(|a| a.kept(mode)),
            },
            other => other.clone(),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> ActivityKind {
        match self {
            Self::Actions { .. } => ActivityKind::Actions,
            Self::Exec { .. } => ActivityKind::Exec,
            Self::Terminal { .. } => ActivityKind::Terminal,
            Self::FileWrite { .. } => ActivityKind::FileWrite,
            Self::FileDelete { .. } => ActivityKind::FileDelete,
            Self::Mkdir { .. } => ActivityKind::Mkdir,
            Self::Import { .. } => ActivityKind::Import,
            Self::Export { .. } => ActivityKind::Export,
            Self::ScreenMinted { .. } => ActivityKind::ScreenMinted,
            Self::ScreenRevoked { .. } => ActivityKind::ScreenRevoked,
            Self::LeaseAcquired { .. } => ActivityKind::LeaseAcquired,
            Self::LeaseReleased { .. } => ActivityKind::LeaseReleased,
            Self::LeaseTakenOver { .. } => ActivityKind::LeaseTakenOver,
            Self::Started => ActivityKind::Started,
            Self::Stopped { .. } => ActivityKind::Stopped,
        }
    }

    /// The detail object of its kind.
    pub fn detail(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Self::Actions { names, ok } => {
                json!({"count": names.values().sum::<u64>(), "names": names, "ok": ok})
            }
            Self::Exec {
                argv,
                exit_code,
                timed_out,
                stdout_bytes,
                stderr_bytes,
            } => json!({
                "program": argv.program,
                "argv": argv.argv,
                "argv_cut": argv.cut,
                "exit_code": exit_code,
                "timed_out": timed_out,
                "stdout_bytes": stdout_bytes,
                "stderr_bytes": stderr_bytes,
            }),
            Self::Terminal { argv: Some(argv) } => json!({
                "program": argv.program,
                "argv": argv.argv,
                "argv_cut": argv.cut,
            }),
            Self::Terminal { argv: None } => json!({"program": null, "argv": null}),
            Self::FileWrite { path, bytes } => json!({"path": path, "bytes": bytes}),
            Self::FileDelete { path, removed } => {
                json!({"path": path, "bytes": 0, "removed": removed})
            }
            Self::Mkdir { path } => json!({"path": path, "bytes": 0}),
            Self::Import { bytes, entries } | Self::Export { bytes, entries } => {
                json!({"bytes": bytes, "entries": entries})
            }
            Self::ScreenMinted {
                screen_id,
                mode,
                reason,
            }
            | Self::ScreenRevoked {
                screen_id,
                mode,
                reason,
            } => json!({"screen_id": screen_id, "mode": mode, "reason": reason}),
            Self::LeaseAcquired { holder, generation }
            | Self::LeaseReleased { holder, generation }
            | Self::LeaseTakenOver { holder, generation } => {
                json!({"holder": holder, "generation": generation})
            }
            Self::Started => json!({}),
            Self::Stopped { reason } => json!({ "reason": reason }),
        }
    }

    /// One line for people: control characters shown as `?`, at most
    /// [`MAX_SUMMARY_CHARS`].
    pub fn summary(&self) -> String {
        let line = match self {
            Self::Actions { names, ok } => {
                let count: u64 = names.values().sum();
                let parts: Vec<String> = names
                    .iter()
                    .map(|(name, n)| {
                        if *n > 1 {
                            format!("{name} ×{n}")
                        } else {
                            name.clone()
                        }
                    })
                    .collect();
                let plural = if count == 1 { "" } else { "s" };
                let failed = if *ok { "" } else { " (failed)" };
                format!("{count} action{plural}: {}{failed}", parts.join(", "))
            }
            Self::Exec {
                argv,
                exit_code,
                timed_out,
                ..
            } => {
                let end = match (exit_code, timed_out) {
                    (_, true) => "timed out".to_owned(),
                    (Some(code), false) => format!("exit {code}"),
                    (None, false) => "no exit code".to_owned(),
                };
                format!("exec {}: {end}", argv.line())
            }
            Self::Terminal { argv: Some(argv) } => format!("terminal: {}", argv.line()),
            Self::Terminal { argv: None } => "terminal: login shell".to_owned(),
            Self::FileWrite { path, bytes } => format!("wrote {path} ({bytes} bytes)"),
            Self::FileDelete { path, removed } => {
                let plural = if *removed == 1 { "y" } else { "ies" };
                format!("deleted {path} ({removed} entr{plural})")
            }
            Self::Mkdir { path } => format!("made directory {path}"),
            Self::Import { bytes, entries } => {
                format!("workspace imported ({entries} entries, {bytes} bytes)")
            }
            Self::Export { bytes, entries } => {
                format!("workspace exported ({entries} entries, {bytes} bytes)")
            }
            Self::ScreenMinted { mode, .. } => format!("{mode} screen opened"),
            Self::ScreenRevoked { mode, reason, .. } => match reason {
                Some(reason) => format!("{mode} screen closed: {reason}"),
                None => format!("{mode} screen closed"),
            },
            Self::LeaseAcquired { holder, generation } => {
                format!("lease acquired by {holder} (generation {generation})")
            }
            Self::LeaseReleased { holder, generation } => {
                format!("lease released by {holder} (generation {generation})")
            }
            Self::LeaseTakenOver { holder, generation } => {
                format!("lease taken over by {holder} (generation {generation})")
            }
            Self::Started => "started".to_owned(),
            Self::Stopped { reason } => format!("stopped ({reason})"),
        };
        one_line(&line)
    }
}

/// `s` with control characters as `?`, cut to [`MAX_SUMMARY_CHARS`].
fn one_line(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(MAX_SUMMARY_CHARS)
        .collect();
    if s.chars().count() > MAX_SUMMARY_CHARS {
        out.pop();
        out.push('…');
    }
    out
}

/// Times as `2026-12-02T19:01:02.345Z`.
mod millis {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&at.to_rfc3339_opts(SecondsFormat::Millis, true))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        DateTime::<Utc>::deserialize(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_round_trip_as_strings() {
        let id = Uuid::new_v4();
        for actor in [
            Actor::Api,
            Actor::Broker,
            Actor::Lease("agent-7".into()),
            Actor::Screen(id),
        ] {
            let json = serde_json::to_value(&actor).unwrap();
            assert!(json.is_string());
            assert_eq!(serde_json::from_value::<Actor>(json).unwrap(), actor);
        }
        assert_eq!(
            serde_json::to_value(Actor::Lease("a:b".into())).unwrap(),
            "lease:a:b"
        );
        assert!(serde_json::from_str::<Actor>("\"someone\"").is_err());
    }

    #[test]
    fn an_actions_entry_counts_names_and_keeps_no_text() {
        let mut names = BTreeMap::new();
        names.insert("left_click".to_owned(), 2);
        names.insert("type".to_owned(), 1);
        let h = Happened::Actions { names, ok: true };
        assert_eq!(h.summary(), "3 actions: left_click ×2, type");
        assert_eq!(
            h.detail(),
            serde_json::json!({"count": 3, "names": {"left_click": 2, "type": 1}, "ok": true})
        );
        let entry = ActivityEntry {
            seq: 17,
            at: "2026-12-02T19:01:02.345678Z".parse().unwrap(),
            actor: Actor::Api,
            kind: h.kind(),
            summary: h.summary(),
            detail: h.detail(),
        };
        let json = serde_json::to_value(&entry).unwrap();
        assert_eq!(json["at"], "2026-12-02T19:01:02.345Z");
        assert_eq!(json["kind"], "actions");
        let back: ActivityEntry = serde_json::from_value(json).unwrap();
        assert_eq!(back.seq, 17);
    }

    #[test]
    fn an_exec_entry_keeps_sizes_and_a_redacted_argv() {
        let argv: Vec<String> = [
            "curl",
            "-H",
            "Authorization: Bearer sekrit",
            "https://a:b@h/",
        ]
        .map(String::from)
        .to_vec();
        let h = Happened::Exec {
            argv: Argv::given(argv.clone()),
            exit_code: Some(0),
            timed_out: false,
            stdout_bytes: 12,
            stderr_bytes: 3,
        };
        let kept = h.kept(ArgvRecord::Redacted);
        assert_eq!(
            kept.detail(),
            serde_json::json!({
                "program": "curl",
                "argv": ["curl", "-H", "Authorization: [redacted]", "https://[redacted]@h/"],
                "argv_cut": false,
                "exit_code": 0,
                "timed_out": false,
                "stdout_bytes": 12,
                "stderr_bytes": 3,
            })
        );
        assert_eq!(
            kept.summary(),
            "exec curl -H Authorization: [redacted] https://[redacted]@h/: exit 0"
        );
        let none = h.kept(ArgvRecord::None);
        assert_eq!(none.detail()["argv"], serde_json::Value::Null);
        assert_eq!(none.summary(), "exec curl: exit 0");

        // An entry recorded in full (or before redaction) is redacted when
        // read back, and one already redacted is left as it is.
        let full = h.kept(ArgvRecord::Full);
        let entry = ActivityEntry {
            seq: 1,
            at: Utc::now(),
            actor: Actor::Api,
            kind: full.kind(),
            summary: full.summary(),
            detail: full.detail(),
        };
        assert!(entry.summary.contains("sekrit"));
        let again = entry.kept(ArgvRecord::Redacted).unwrap();
        assert_eq!(again.detail, kept.detail());
        assert_eq!(again.summary, kept.summary());
        assert_eq!(again.kept(ArgvRecord::Redacted), None);
        let old = ActivityEntry {
            detail: serde_json::json!({"argv": argv, "exit_code": 0, "timed_out": false}),
            ..entry
        };
        let text = serde_json::to_string(&old.kept(ArgvRecord::Redacted).unwrap()).unwrap();
        assert!(!text.contains("sekrit"), "{text}");
    }

    #[test]
    fn summaries_are_one_bounded_line() {
        let h = Happened::FileWrite {
            path: format!("a\nb{}", "x".repeat(500)),
            bytes: 3,
        };
        let s = h.summary();
        assert!(!s.contains('\n'));
        assert_eq!(s.chars().count(), MAX_SUMMARY_CHARS);
        assert!(s.ends_with('…'));
    }
}
