//! What the CLI prints: JSON (escaped), a desktop's status, the table of
//! `ls`, and the words for states, stop reasons, limits and idle timers.

use std::io::Write;
use std::time::Duration;

use dormouse_protocol::api::{ComputerStatus, ContainerState, StopReason};

use crate::escape::{safe_json, Safe};
use crate::{stdout, CliError};

pub(crate) fn container_word(state: ContainerState) -> &'static str {
    match state {
        ContainerState::Running => "running",
        ContainerState::Stopped => "stopped",
        ContainerState::Missing => "missing",
        ContainerState::Unknown => "unknown",
    }
}

/// What a person wants to know of a state, in one line.
pub(crate) fn progress_line(s: &ComputerStatus) -> String {
    let mut line = match (s.container, s.ready) {
        (ContainerState::Running, true) => "ready".to_owned(),
        (ContainerState::Running, false) => match s.phase {
            Some(phase) => format!("running, {}", serde_plain(&phase)),
            None => "running, not ready".to_owned(),
        },
        (ContainerState::Stopped, _) => stop_words(s.stop_reason),
        (other, _) => format!("container {}", container_word(other)),
    };
    if let Some(problem) = &s.problem {
        line.push_str(&format!(" ({})", Safe(problem)));
    }
    line
}

/// The stop reason as the panel says it; a neutral "stopped" when unknown.
pub(crate) fn stop_words(reason: Option<StopReason>) -> String {
    match reason {
        Some(StopReason::Idle) => "stopped because idle",
        Some(StopReason::Manual) => "stopped manually",
        Some(StopReason::Shutdown) => "stopped because the host shut down",
        Some(StopReason::Fenced) => "stopped because another controller took over",
        Some(StopReason::Killed) => "stopped because it was killed",
        Some(StopReason::Oom) => "stopped because it ran out of memory",
        None => "stopped",
    }
    .to_owned()
}

/// A unit enum's serde name (`Phase::Starting` → `starting`).
pub(crate) fn serde_plain<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

pub(crate) fn print_json<T: serde::Serialize + ?Sized>(
    out: &mut (dyn Write + Send),
    value: &T,
) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::Failed(format!("cannot print JSON: {e}")))?;
    writeln!(out, "{}", safe_json(&text)).map_err(stdout)
}

pub(crate) fn print_status(
    out: &mut (dyn Write + Send),
    s: &ComputerStatus,
    json: bool,
) -> Result<(), CliError> {
    if json {
        return print_json(out, s);
    }
    let mut text = format!(
        "id          {}\nname        {}\nowner       {}\nstate       {}\ncontainer   {}\nready       {}\n",
        s.id,
        Safe(&s.name),
        Safe(&s.owner),
        progress_line(s),
        container_word(s.container),
        s.ready
    );
    if let Some(at) = s.stopped_at {
        text.push_str(&format!("stopped at  {}\n", at.to_rfc3339()));
    }
    text.push_str(&format!(
        "resumable   {}{}\n",
        s.resumable,
        s.resumable_problem
            .as_deref()
            .map(|p| format!(" ({})", Safe(p)))
            .unwrap_or_default()
    ));
    if let Some(idle) = &s.idle {
        text.push_str(&format!("idle        {}\n", idle_words(idle)));
    }
    text.push_str(&format!(
        "generation  {}\nimage       {}\n",
        s.generation,
        Safe(&s.image_id)
    ));
    if let Some(limit) = &s.workspace_limit {
        text.push_str(&format!("workspace   {}\n", limit_words(limit)));
    }
    if let Some(health) = &s.health {
        text.push_str(&format!("health      {}\n", serde_plain(&health.overall)));
        for check in &health.checks {
            text.push_str(&format!(
                "  {:<18} {:<8} {}\n",
                Safe(&check.name),
                serde_plain(&check.status),
                Safe(&check.detail)
            ));
        }
    }
    out.write_all(text.as_bytes()).map_err(stdout)
}

/// The workspace limit in words: its sizes, or that there is none and why.
pub(crate) fn limit_words(limit: &dormouse_protocol::api::WorkspaceLimit) -> String {
    if limit.enforced {
        let bytes = limit
            .bytes
            .map_or_else(|| "?".to_owned(), |b| format!("{} MiB", b >> 20));
        let inodes = limit
            .inodes
            .map_or_else(|| "?".to_owned(), |i| i.to_string());
        format!("limited to {bytes} and {inodes} files")
    } else {
        format!(
            "no size limit ({})",
            Safe(limit.reason.as_deref().unwrap_or("not enforced"))
        )
    }
}

pub(crate) fn idle_words(idle: &dormouse_protocol::api::IdleStatus) -> String {
    let window = humantime::format_duration(Duration::from_secs(idle.timeout_ms / 1000));
    match idle.stops_at {
        Some(at) => {
            let left = u64::try_from((at - chrono::Utc::now()).num_seconds()).unwrap_or(0);
            format!(
                "stops in {} (window {window})",
                humantime::format_duration(Duration::from_secs(left))
            )
        }
        None => format!("timer paused (window {window})"),
    }
}

pub(crate) fn print_table(
    out: &mut (dyn Write + Send),
    list: &[ComputerStatus],
) -> Result<(), CliError> {
    if list.is_empty() {
        return writeln!(out, "no desktops (create one with `dormouse create`)").map_err(stdout);
    }
    let mut text = format!(
        "{:<10} {:<20} {:<10} {:<6} {}\n",
        "ID", "NAME", "CONTAINER", "READY", "STATE"
    );
    for s in list {
        let short = &s.id.to_string()[..8];
        text.push_str(&format!(
            "{:<10} {:<20} {:<10} {:<6} {}\n",
            short,
            Safe(&s.name),
            container_word(s.container),
            if s.ready { "yes" } else { "no" },
            progress_line(s)
        ));
    }
    out.write_all(text.as_bytes()).map_err(stdout)
}
