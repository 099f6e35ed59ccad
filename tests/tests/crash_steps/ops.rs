//! The operations of the crash walk: each one's precondition, call, the
//! witnesses of what a crash left, and the next call.

use super::*;

/// `POST /v1/computers`: a new desktop each step; after the restart it
/// exists whole (record, directories, container running or resumable) or
/// not at all (no record, no directory, no container).
#[derive(Default)]
pub struct Create {
    note: Option<String>,
}

fn create_name(n: u32) -> String {
    format!("crash-create-{n}")
}

impl Operation for Create {
    const NAME: &'static str = "create";

    async fn before(&mut self, _rig: &Rig, _n: u32) -> Result<()> {
        Ok(())
    }

    async fn call(&mut self, api: &ApiClient, n: u32) -> Result<()> {
        api.create(&CreateComputer {
            name: Some(create_name(n)),
            ..Default::default()
        })
        .await?;
        Ok(())
    }

    async fn check(&mut self, rig: &Rig, n: u32) -> Result<Effect> {
        let listed = rig.api().list().await?;
        let mine: Vec<_> = listed.iter().filter(|s| s.name == create_name(n)).collect();
        ensure!(mine.len() <= 1, "{} computers of one create", mine.len());
        let known: Vec<String> = listed.iter().map(|s| s.id.to_string()).collect();
        for dir in rig.broker.computer_ids() {
            ensure!(
                known.contains(&dir.to_string()),
                "a computer directory without a computer: {dir}"
            );
        }
        for name in containers(rig) {
            ensure!(
                known.iter().any(|id| name == format!("dormouse-{id}")),
                "a container without a computer: {name}"
            );
        }
        self.note = None;
        let Some(made) = mine.first() else {
            return Ok(Effect::None);
        };
        let facts = engine::inspect(&format!("dormouse-{}", made.id))
            .await?
            .context("the computer exists but its container does not")?;
        // A desktop made but not started by the crash is started by the
        // restart: the create's promise is a running desktop.
        let api = rig.api();
        let mut events = EventStream::open(&api).await?;
        api.wait_for(&mut events, made.id, "running", READY, |s| {
            s.container == ContainerState::Running
        })
        .await
        .with_context(|| format!("half made: the engine says {}", facts.status))?;
        let running = engine::inspect(&format!("dormouse-{}", made.id))
            .await?
            .context("the container went")?;
        ensure!(
            running.status == "running",
            "the engine says {}",
            running.status
        );
        self.note = Some(if facts.status == "running" {
            "running".into()
        } else {
            format!("{} at the restart, then started", facts.status)
        });
        Ok(Effect::Whole)
    }

    fn note(&self) -> Option<String> {
        self.note.clone()
    }

    async fn again(&mut self, rig: &Rig, n: u32, _effect: Effect) -> Result<()> {
        let next = rig
            .desktop(&format!("{}-again", create_name(n)), false)
            .await?;
        // Keep one desktop at a time: remove this step's.
        for s in rig.api().list().await? {
            if s.name.starts_with(&create_name(n)) {
                rig.api().remove(s.id, true).await?;
            }
        }
        ensure!(rig.api().get(next).await.is_err());
        Ok(())
    }
}

/// `DELETE /v1/computers/{id}` (the workspace kept): a new running desktop
/// each step, with a file in its workspace.
#[derive(Default)]
pub struct Remove {
    id: Option<Uuid>,
}

impl Operation for Remove {
    const NAME: &'static str = "remove";

    async fn before(&mut self, rig: &Rig, n: u32) -> Result<()> {
        let id = rig.desktop(&format!("crash-remove-{n}"), false).await?;
        rig.api()
            .write_file(id, "kept.txt", b"kept".to_vec(), false)
            .await?;
        self.id = Some(id);
        Ok(())
    }

    async fn call(&mut self, api: &ApiClient, _n: u32) -> Result<()> {
        api.remove(self.id.context("no desktop")?, false).await?;
        Ok(())
    }

    async fn check(&mut self, rig: &Rig, _n: u32) -> Result<Effect> {
        let id = self.id.context("no desktop")?;
        let container = engine::inspect(&format!("dormouse-{id}")).await?;
        let kept = std::fs::read(rig.broker.workspace(id).join("kept.txt"));
        ensure!(
            kept.as_deref().ok() == Some(&b"kept"[..]),
            "the workspace lost its file"
        );
        let record = rig
            .broker
            .data_dir()
            .join(format!("computers/{id}/computer.json"));
        match rig.api().get(id).await {
            Ok(status) => {
                ensure!(record.exists(), "listed without a record");
                ensure!(
                    container.is_some(),
                    "half removed: the record is there, the container is gone (status {:?}, {:?})",
                    status.container,
                    status.resumable_problem
                );
                Ok(Effect::None)
            }
            Err(e) => {
                ensure!(e.status().map(|s| s.as_u16()) == Some(404), "{e}");
                ensure!(container.is_none(), "removed but its container is there");
                ensure!(!record.exists(), "removed but its record is there");
                Ok(Effect::Whole)
            }
        }
    }

    async fn again(&mut self, rig: &Rig, _n: u32, effect: Effect) -> Result<()> {
        let id = self.id.context("no desktop")?;
        if effect == Effect::None {
            rig.api().remove(id, false).await?;
        }
        ensure!(engine::inspect(&format!("dormouse-{id}")).await?.is_none());
        Ok(())
    }
}

/// `POST /v1/computers/{id}/start` of a stopped desktop.
pub struct Resume {
    pub id: Uuid,
}

impl Operation for Resume {
    const NAME: &'static str = "resume";

    async fn before(&mut self, rig: &Rig, _n: u32) -> Result<()> {
        rig.stopped(self.id).await
    }

    async fn call(&mut self, api: &ApiClient, _n: u32) -> Result<()> {
        api.start(self.id).await?;
        Ok(())
    }

    async fn check(&mut self, rig: &Rig, _n: u32) -> Result<Effect> {
        let (running, status) = rig.settled(self.id).await?;
        if running {
            rig.ready(self.id).await?;
            return Ok(Effect::Whole);
        }
        ensure!(status.container == ContainerState::Stopped);
        ensure!(status.resumable, "{:?}", status.resumable_problem);
        ensure!(
            status.stop_reason == Some(StopReason::Manual),
            "not started, but the reason of the stop before is lost: {:?}",
            status.stop_reason
        );
        Ok(Effect::None)
    }

    async fn again(&mut self, rig: &Rig, _n: u32, effect: Effect) -> Result<()> {
        if effect == Effect::None {
            rig.api().start(self.id).await?;
        }
        rig.ready(self.id).await
    }
}

/// `POST /v1/computers/{id}/stop` of a running, ready desktop.
pub struct Stop {
    pub id: Uuid,
}

impl Operation for Stop {
    const NAME: &'static str = "stop";

    async fn before(&mut self, rig: &Rig, _n: u32) -> Result<()> {
        rig.running(self.id).await
    }

    async fn call(&mut self, api: &ApiClient, _n: u32) -> Result<()> {
        api.stop(self.id).await?;
        Ok(())
    }

    async fn check(&mut self, rig: &Rig, _n: u32) -> Result<Effect> {
        let (running, status) = rig.settled(self.id).await?;
        if running {
            ensure!(status.stop_reason.is_none(), "{:?}", status.stop_reason);
            rig.ready(self.id).await?;
            return Ok(Effect::None);
        }
        ensure!(status.container == ContainerState::Stopped);
        // The engine says stopped a moment before the stop that the restart
        // finishes records its reason.
        let api = rig.api();
        let mut events = EventStream::open(&api).await?;
        let seen = api
            .wait_for(&mut events, self.id, "the stop's reason", READY, |s| {
                s.stop_reason.is_some()
            })
            .await
            .context("stopped without its reason")?;
        ensure!(
            seen.status.stop_reason == Some(StopReason::Manual),
            "stopped for another reason: {:?}",
            seen.status.stop_reason
        );
        ensure!(seen.status.resumable, "{:?}", seen.status.resumable_problem);
        Ok(Effect::Whole)
    }

    async fn again(&mut self, rig: &Rig, _n: u32, effect: Effect) -> Result<()> {
        if effect == Effect::None {
            rig.api().stop(self.id).await?;
        }
        Ok(())
    }
}

/// `POST /v1/computers/{id}/screens` (view) on a ready desktop. A
/// capability lives in the broker's memory only: none survives a restart.
pub struct ScreenMint {
    pub id: Uuid,
}

fn view() -> CreateScreen {
    CreateScreen {
        mode: ScreenMode::View,
        ttl_ms: None,
        reason: None,
    }
}

impl Operation for ScreenMint {
    const NAME: &'static str = "screen-mint";
    const CHEAP: bool = true;
    const LEAVES_NOTHING: bool = true;

    async fn before(&mut self, rig: &Rig, _n: u32) -> Result<()> {
        rig.running(self.id).await
    }

    async fn armed(&mut self, rig: &Rig) -> Result<()> {
        rig.ready(self.id).await
    }

    async fn call(&mut self, api: &ApiClient, _n: u32) -> Result<()> {
        api.create_screen(self.id, &view()).await?;
        Ok(())
    }

    async fn check(&mut self, rig: &Rig, _n: u32) -> Result<Effect> {
        let left = rig.api().screens(self.id).await?;
        ensure!(
            left.is_empty(),
            "capabilities outlived the broker: {left:?}"
        );
        rig.ready(self.id).await?;
        Ok(Effect::None)
    }

    async fn again(&mut self, rig: &Rig, _n: u32, _effect: Effect) -> Result<()> {
        let grant = rig.api().create_screen(self.id, &view()).await?;
        let listed = rig.api().screens(self.id).await?;
        ensure!(listed.iter().any(|s| s.screen_id == grant.screen_id));
        rig.api().revoke_screen(grant.screen_id).await?;
        Ok(())
    }
}

/// `PUT /v1/computers/{id}/workspace` of a stopped desktop: the tree is the
/// archive of step N, or the one before, whole.
pub struct Import {
    pub id: Uuid,
    pub last: Option<u32>,
}

fn import_tar(n: u32) -> Vec<u8> {
    one_file_tar("imported.txt", format!("import {n}").as_bytes())
}

impl Operation for Import {
    const NAME: &'static str = "import";
    const CHEAP: bool = true;

    async fn before(&mut self, _rig: &Rig, _n: u32) -> Result<()> {
        Ok(())
    }

    async fn call(&mut self, api: &ApiClient, n: u32) -> Result<()> {
        api.import(self.id, import_tar(n)).await?;
        Ok(())
    }

    async fn check(&mut self, rig: &Rig, n: u32) -> Result<Effect> {
        let workspace = rig.broker.workspace(self.id);
        let parent = workspace.parent().context("no parent")?;
        for leftover in ["workspace.import", "workspace.previous"] {
            ensure!(!parent.join(leftover).exists(), "{leftover} left behind");
        }
        let names: Vec<String> = std::fs::read_dir(&workspace)?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_>>()?;
        let got = std::fs::read_to_string(workspace.join("imported.txt")).ok();
        if got.as_deref() == Some(format!("import {n}").as_str()) {
            ensure!(names == ["imported.txt"], "a mixed tree: {names:?}");
            self.last = Some(n);
            return Ok(Effect::Whole);
        }
        match self.last {
            Some(last) => ensure!(
                got.as_deref() == Some(format!("import {last}").as_str()),
                "neither the old tree nor the new: {got:?}"
            ),
            None => ensure!(got.is_none(), "{got:?} before any import"),
        }
        Ok(Effect::None)
    }

    async fn again(&mut self, rig: &Rig, n: u32, _effect: Effect) -> Result<()> {
        rig.api().import(self.id, import_tar(n)).await?;
        let got = std::fs::read_to_string(rig.broker.workspace(self.id).join("imported.txt"))?;
        ensure!(got == format!("import {n}"));
        self.last = Some(n);
        Ok(())
    }
}

/// `GET /v1/computers/{id}/workspace`: changes nothing, whatever the crash.
pub struct Export {
    pub id: Uuid,
}

impl Operation for Export {
    const NAME: &'static str = "export";
    const CHEAP: bool = true;
    const LEAVES_NOTHING: bool = true;

    async fn before(&mut self, _rig: &Rig, _n: u32) -> Result<()> {
        Ok(())
    }

    async fn call(&mut self, api: &ApiClient, _n: u32) -> Result<()> {
        let mut out = Vec::new();
        api.export(self.id, true, &mut out).await?;
        Ok(())
    }

    async fn check(&mut self, rig: &Rig, _n: u32) -> Result<Effect> {
        let workspace = rig.broker.workspace(self.id);
        let names: Vec<String> = std::fs::read_dir(&workspace)?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_>>()?;
        ensure!(
            names == ["imported.txt"],
            "the export changed the tree: {names:?}"
        );
        let status = rig.api().get(self.id).await?;
        ensure!(status.container == ContainerState::Stopped);
        Ok(Effect::None)
    }

    async fn again(&mut self, rig: &Rig, _n: u32, _effect: Effect) -> Result<()> {
        let mut out = Vec::new();
        rig.api().export(self.id, true, &mut out).await?;
        let name = b"imported.txt";
        ensure!(
            out.windows(name.len()).any(|w| w == name),
            "an empty export"
        );
        Ok(())
    }
}

/// `GET /v1/computers/{id}/workspace` of a running desktop: the guest holds
/// its browsers closed while the archive is read; a crash ends the hold
/// with its connection, and the desktop is ready again, not left quiesced.
pub struct ExportRunning {
    pub id: Uuid,
}

impl Operation for ExportRunning {
    const NAME: &'static str = "export";
    const TITLE: &'static str = "export (running)";
    const CHEAP: bool = true;
    const LEAVES_NOTHING: bool = true;

    async fn before(&mut self, rig: &Rig, _n: u32) -> Result<()> {
        rig.running(self.id).await
    }

    async fn armed(&mut self, rig: &Rig) -> Result<()> {
        rig.ready(self.id).await
    }

    async fn call(&mut self, api: &ApiClient, _n: u32) -> Result<()> {
        let mut out = Vec::new();
        api.export(self.id, true, &mut out).await?;
        Ok(())
    }

    async fn check(&mut self, rig: &Rig, _n: u32) -> Result<Effect> {
        rig.ready(self.id).await?;
        let status = rig.api().get(self.id).await?;
        ensure!(
            status.phase == Some(Phase::Ready),
            "not ready after the crash: {:?} {:?}",
            status.phase,
            status.problem
        );
        Ok(Effect::None)
    }

    async fn again(&mut self, rig: &Rig, _n: u32, _effect: Effect) -> Result<()> {
        let mut out = Vec::new();
        rig.api().export(self.id, true, &mut out).await?;
        ensure!(!out.is_empty(), "an empty export");
        rig.ready(self.id).await
    }
}

/// `PUT /v1/computers/{id}/files/notes/crash.txt`: the file holds version
/// N or the one before, whole, and no temp file is left.
pub struct FileWrite {
    pub id: Uuid,
    pub last: Option<u32>,
}

fn version(n: u32) -> Vec<u8> {
    format!("version {n}\n").repeat(1000).into_bytes()
}

impl Operation for FileWrite {
    const NAME: &'static str = "file-write";
    const CHEAP: bool = true;

    async fn before(&mut self, _rig: &Rig, _n: u32) -> Result<()> {
        Ok(())
    }

    async fn call(&mut self, api: &ApiClient, n: u32) -> Result<()> {
        api.write_file(self.id, "notes/crash.txt", version(n), true)
            .await?;
        Ok(())
    }

    async fn check(&mut self, rig: &Rig, n: u32) -> Result<Effect> {
        let dir = rig.broker.workspace(self.id).join("notes");
        let names: Vec<String> = match std::fs::read_dir(&dir) {
            Ok(entries) => entries
                .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
                .collect::<Result<_>>()?,
            Err(_) => Vec::new(),
        };
        let strays: Vec<&String> = names.iter().filter(|n| *n != "crash.txt").collect();
        ensure!(strays.is_empty(), "left behind: {strays:?}");
        let got = std::fs::read(dir.join("crash.txt")).ok();
        if got.as_deref() == Some(&version(n)[..]) {
            self.last = Some(n);
            return Ok(Effect::Whole);
        }
        ensure!(
            got == self.last.map(version),
            "neither the old content nor the new ({:?} bytes)",
            got.map(|g| g.len())
        );
        Ok(Effect::None)
    }

    async fn again(&mut self, rig: &Rig, n: u32, _effect: Effect) -> Result<()> {
        rig.api()
            .write_file(self.id, "notes/crash.txt", version(n), true)
            .await?;
        let got = std::fs::read(rig.broker.workspace(self.id).join("notes/crash.txt"))?;
        ensure!(got == version(n));
        self.last = Some(n);
        Ok(())
    }
}

/// `POST /v1/computers/{id}/lease` by a new holder once the last lease
/// lapsed: the generation moved on, with the new holder, on disk and in
/// the API alike, or neither did.
pub struct LeaseTakeover {
    pub id: Uuid,
    pub before: u64,
}

/// A lease short enough to lapse before the next step.
const SHORT_LEASE_MS: u64 = 200;

fn on_disk(rig: &Rig, id: Uuid) -> Result<(u64, Option<String>)> {
    let path = rig
        .broker
        .data_dir()
        .join(format!("computers/{id}/computer.json"));
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(path)?)?;
    let generation = record["generation"].as_u64().context("no generation")?;
    let holder = record["lease"]["holder"].as_str().map(str::to_owned);
    Ok((generation, holder))
}

impl Operation for LeaseTakeover {
    const NAME: &'static str = "lease-takeover";
    const CHEAP: bool = true;

    async fn before(&mut self, rig: &Rig, _n: u32) -> Result<()> {
        // The last lease lapses first.
        tokio::time::sleep(Duration::from_millis(SHORT_LEASE_MS + 50)).await;
        self.before = rig.api().get(self.id).await?.generation;
        Ok(())
    }

    async fn call(&mut self, api: &ApiClient, n: u32) -> Result<()> {
        let request = LeaseRequest {
            holder: format!("holder-{n}"),
            ttl_ms: SHORT_LEASE_MS,
        };
        let grant = api.lease(self.id, &request).await?;
        ensure!(grant.generation == self.before + 1);
        Ok(())
    }

    async fn check(&mut self, rig: &Rig, n: u32) -> Result<Effect> {
        let status = rig.api().get(self.id).await?;
        let (generation, holder) = on_disk(rig, self.id)?;
        ensure!(
            generation == status.generation,
            "disk says {generation}, the API {}",
            status.generation
        );
        if generation == self.before + 1 {
            ensure!(holder == Some(format!("holder-{n}")), "{holder:?}");
            return Ok(Effect::Whole);
        }
        ensure!(generation == self.before, "generation {generation}");
        ensure!(holder != Some(format!("holder-{n}")), "{holder:?}");
        Ok(Effect::None)
    }

    async fn again(&mut self, rig: &Rig, n: u32, _effect: Effect) -> Result<()> {
        let request = LeaseRequest {
            holder: format!("holder-{n}"),
            ttl_ms: SHORT_LEASE_MS,
        };
        let grant = rig.api().lease(self.id, &request).await?;
        ensure!(grant.generation > self.before, "{grant:?}");
        Ok(())
    }
}
