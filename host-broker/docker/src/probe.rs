//! The start-up check that the engine's event stream delivers: a tiny
//! labelled probe container (the desktop image, a command that exits at
//! once, no network, no capabilities, no mounts) is created, started and
//! removed once, and its end must arrive on a subscription made exactly as
//! the backend's own ([`super::DockerBackend`]'s `changes`: container events,
//! judged by the labels each event carries).
//!
//! It only reports: a silent stream is logged by the caller, never a reason
//! to refuse anything (the guest channel and the periodic resync still tell
//! the broker what happened). It never touches a desktop container: the
//! probe carries [`PROBE_LABEL`], not the computer label, so nothing counts
//! it as a desktop or an orphan.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;
use uuid::Uuid;

use super::container_engine::{ContainerSpec, Engine, Hardening, Limits};
use super::spec;
use dormouse_core::engine::ChangeProbe;
use dormouse_core::paths::Paths;

/// The label of a probe container; its value is the data directory of the
/// broker that made it, so a broker removes only its own leftovers.
pub const PROBE_LABEL: &str = "dev.dormouse.probe";

/// What the probe runs: it exits at once.
const PROBE_COMMAND: &str = "true";

/// How long the probe's end may take to arrive on the stream.
pub const PROBE_WAIT: Duration = Duration::from_secs(10);

/// The probe's container name.
fn probe_name(nonce: Uuid) -> String {
    format!("{}probe-{nonce}", spec::NAME_PREFIX)
}

/// The settings of a probe: nothing a desktop has but the image.
fn probe_spec(name: &str, image: &str, data_dir: &str) -> ContainerSpec {
    ContainerSpec {
        name: name.to_owned(),
        image: image.to_owned(),
        hostname: "dormouse-probe".into(),
        labels: BTreeMap::from([(PROBE_LABEL.to_owned(), data_dir.to_owned())]),
        mounts: Vec::new(),
        hardening: Hardening {
            network_mode: "none".into(),
            cap_add: Vec::new(),
            cap_drop: vec!["ALL".into()],
            security_opt: vec!["no-new-privileges".into()],
            ipc_mode: "private".into(),
            cgroupns_mode: "private".into(),
            restart_policy: "no".into(),
            // Explicit, as for desktops: Podman's defaults exceed what a
            // container without CAP_SYS_RESOURCE may set.
            ulimits: spec::ulimits(),
            ..Hardening::default()
        },
        limits: Limits {
            nano_cpus: 100_000_000,
            memory: 64 * 1024 * 1024,
            memory_swap: 64 * 1024 * 1024,
            pids_limit: 16,
        },
        command: vec![PROBE_COMMAND.into()],
        process: None,
    }
}

/// Runs the probe once against `engine` with `image` (a reference or ID
/// the engine has; nothing is pulled).
pub async fn run(engine: Arc<dyn Engine>, paths: &Paths, image: &str) -> ChangeProbe {
    let data_dir = paths.data().display().to_string();
    let image = match engine.image(image).await {
        Ok(Some(info)) => info.id,
        Ok(None) => return ChangeProbe::NotChecked(format!("image {image} is not present")),
        Err(e) => return ChangeProbe::NotChecked(e.to_string()),
    };
    remove_leftovers(engine.as_ref(), &data_dir).await;

    let nonce = Uuid::new_v4();
    let name = probe_name(nonce);
    let wanted = vec![format!("{PROBE_LABEL}={data_dir}")];
    // Subscribed before the probe exists: the stream connects when first
    // polled, which the task does at once, long before the probe's end.
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::channel::<String>(16);
    let watch_name = name.clone();
    let mut events = engine.events(&[]);
    let watcher = tokio::spawn(async move {
        while let Some(event) = events.next().await {
            let Ok(event) = event else {
                return;
            };
            let ours = event.name == watch_name && spec::carries_labels(&event.labels, &wanted);
            if ours && seen_tx.send(event.action).await.is_err() {
                return;
            }
        }
    });

    let outcome = async {
        engine
            .create(&probe_spec(&name, &image, &data_dir))
            .await
            .map_err(|e| format!("create: {e}"))?;
        let started = Instant::now();
        engine
            .start(&name)
            .await
            .map_err(|e| format!("start: {e}"))?;
        let ended = tokio::time::timeout(PROBE_WAIT, async {
            while let Some(action) = seen_rx.recv().await {
                if matches!(action.as_str(), "die" | "died") {
                    return true;
                }
            }
            false
        })
        .await;
        Ok::<_, String>(match ended {
            Ok(true) => ChangeProbe::Delivered(started.elapsed()),
            Ok(false) | Err(_) => ChangeProbe::Silent(started.elapsed()),
        })
    }
    .await;
    watcher.abort();
    if let Err(e) = engine.remove(&name).await {
        tracing::warn!(container = %name, error = %e, "cannot remove the event probe container");
    }
    outcome.unwrap_or_else(ChangeProbe::NotChecked)
}

/// Probes of this data directory left behind by a broker that died mid-probe.
async fn remove_leftovers(engine: &dyn Engine, data_dir: &str) {
    let label = [format!("{PROBE_LABEL}={data_dir}")];
    let Ok(leftovers) = engine.list(&label).await else {
        return;
    };
    for c in leftovers {
        if let Err(e) = engine.remove(&c.name).await {
            tracing::debug!(container = %c.name, error = %e, "cannot remove an old event probe");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeEngine;

    const IMAGE: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000002";

    /// A fake whose containers end as soon as they start, as `true` does.
    fn exiting_engine() -> Arc<FakeEngine> {
        let fake = Arc::new(FakeEngine::new());
        fake.add_image(IMAGE, Some("dormouse/desktop:latest"), &[]);
        let weak = Arc::downgrade(&fake);
        fake.on_start(move |info| {
            let name = info.name.clone();
            let weak = weak.clone();
            tokio::spawn(async move {
                if let Some(fake) = weak.upgrade() {
                    fake.foreign_stop(&name);
                }
            });
        });
        fake
    }

    #[tokio::test]
    async fn the_probe_sees_its_end_and_leaves_nothing_behind() {
        let fake = exiting_engine();
        let paths = Paths::new("/data");
        let found = run(fake.clone(), &paths, "dormouse/desktop:latest").await;
        assert!(matches!(found, ChangeProbe::Delivered(_)), "{found:?}");
        let mutations = fake.mutations();
        assert_eq!(mutations.len(), 3, "{mutations:?}");
        assert!(mutations[0].starts_with("create dormouse-probe-"));
        assert!(mutations[1].starts_with("start dormouse-probe-"));
        assert!(mutations[2].starts_with("remove dormouse-probe-"));
        assert!(fake.list(&[]).await.unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_says_nothing_is_reported_silent() {
        // The probe never ends (nothing stops it): nothing can arrive.
        let fake = Arc::new(FakeEngine::new());
        fake.add_image(IMAGE, Some("dormouse/desktop:latest"), &[]);
        let found = run(fake.clone(), &Paths::new("/data"), IMAGE).await;
        assert_eq!(found, ChangeProbe::Silent(PROBE_WAIT));
        assert!(
            fake.list(&[]).await.unwrap().is_empty(),
            "removed all the same"
        );
    }

    #[tokio::test]
    async fn a_missing_image_is_not_checked() {
        let fake = Arc::new(FakeEngine::new());
        let found = run(fake, &Paths::new("/data"), "nothing:here").await;
        assert!(matches!(found, ChangeProbe::NotChecked(_)), "{found:?}");
    }

    #[test]
    fn a_probe_is_nothing_like_a_desktop() {
        let spec = probe_spec(&probe_name(Uuid::nil()), "sha256:abc", "/data");
        assert_eq!(spec::computer_of_name(&spec.name), None);
        assert!(!spec.labels.contains_key(dormouse_protocol::LABEL_COMPUTER));
        assert_eq!(spec.hardening.network_mode, "none");
        assert!(spec.hardening.cap_add.is_empty());
        assert!(spec.mounts.is_empty());
        assert_eq!(spec.command, vec![PROBE_COMMAND.to_owned()]);
    }
}
