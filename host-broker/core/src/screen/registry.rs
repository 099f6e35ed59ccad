//! The capability registry: which screen capabilities exist, what each
//! allows, and the revocation signal every open connection of one listens to.
//!
//! It owns the token digests (SHA-256 of 256 random bits; the token itself is
//! returned once at mint time and never kept), their expiry, and revocation
//! (one capability, all of a computer, or the control capabilities of an
//! older lease generation). It must never log or store a token, compare
//! digests in variable time, or decide on its own whether a computer may be
//! watched: admission (running, ready, fenced) is the owner's call, made
//! before [`ScreenRegistry::mint`].
//!
//! Expiry is checked on every look-up and swept on every call; each
//! connection also carries its deadline, so an expired capability's
//! connections close on time even when nobody calls the registry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use dormouse_protocol::screen::{
    websocket_path, RevokeReason, ScreenGrant, ScreenInfo, ScreenMode, CONTROL_RESERVE,
    MAX_SCREEN_CONNECTIONS, MAX_SCREEN_TTL_MS, MIN_SCREEN_TTL_MS,
};
use rand::RngCore;
use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

use crate::activity::ActivityLog;
use crate::secret::SecretDigest;
use dormouse_protocol::activity::{Actor, Happened};

/// Live capabilities one computer may have at once (view may hold all but
/// [`CONTROL_RESERVE`] of them).
pub const MAX_SCREENS_PER_COMPUTER: usize = 64;
/// Open connections one capability may have at once.
pub const MAX_CONNECTIONS_PER_SCREEN: usize = 32;
/// Open view connections one computer may have at once: what the guest
/// carries less what is kept for control.
pub const MAX_VIEW_CONNECTIONS: usize = MAX_SCREEN_CONNECTIONS - CONTROL_RESERVE;

/// Why the registry refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// `ttl_ms` outside the allowed range.
    #[error("ttl_ms must be between {MIN_SCREEN_TTL_MS} and {MAX_SCREEN_TTL_MS}")]
    BadTtl,
    /// The computer has all the capabilities of this mode it may have:
    /// [`MAX_SCREENS_PER_COMPUTER`] in all, view all but [`CONTROL_RESERVE`].
    #[error("{}", too_many_screens(*.0))]
    TooManyScreens(ScreenMode),
    /// No such capability (or it expired or was revoked).
    #[error("no such screen capability")]
    NotFound,
    /// Unknown capability, wrong token, or one that stopped working: one
    /// answer for all, so the id alone tells nothing.
    #[error("the screen token is not valid for this screen")]
    BadToken,
    /// The computer's screens were revoked (or its lease changed hands)
    /// between admission and mint: admit again.
    #[error("the desktop's state changed while the capability was minted; try again")]
    Raced,
    /// The capability has [`MAX_CONNECTIONS_PER_SCREEN`] open connections.
    #[error("this screen capability already has {MAX_CONNECTIONS_PER_SCREEN} connections")]
    TooManyConnections,
    /// The desktop's screen carries all the connections of this mode it
    /// can: [`MAX_SCREEN_CONNECTIONS`] in all, view all but
    /// [`CONTROL_RESERVE`].
    #[error("{}", screen_full(*.0))]
    ScreenFull(ScreenMode),
}

fn too_many_screens(mode: ScreenMode) -> String {
    match mode {
        ScreenMode::View => format!(
            "this computer already has {} live view capabilities, the most it may have \
             ({CONTROL_RESERVE} of its {MAX_SCREENS_PER_COMPUTER} are kept for control)",
            MAX_SCREENS_PER_COMPUTER - CONTROL_RESERVE
        ),
        ScreenMode::Control => {
            format!("this computer already has {MAX_SCREENS_PER_COMPUTER} live screen capabilities")
        }
    }
}

/// Short enough for a WebSocket close reason (123 bytes).
fn screen_full(mode: ScreenMode) -> String {
    match mode {
        ScreenMode::View => format!(
            "screen full: {MAX_VIEW_CONNECTIONS} view connections open ({CONTROL_RESERVE} kept for control)"
        ),
        ScreenMode::Control => {
            format!("screen full: {MAX_SCREEN_CONNECTIONS} connections open, all it carries")
        }
    }
}

/// What a connection is allowed, handed out by [`ScreenRegistry::authorize`].
#[derive(Debug)]
pub struct Ticket {
    /// The capability.
    pub screen_id: Uuid,
    /// The computer whose screen it shows.
    pub computer: Uuid,
    /// What it allows.
    pub mode: ScreenMode,
    /// When it expires (the connection closes then, 4002).
    pub deadline: Instant,
    /// Becomes `Some(reason)` when the capability is revoked; a closed
    /// channel (the entry is gone) means revoked too.
    pub revoked: watch::Receiver<Option<RevokeReason>>,
}

impl Ticket {
    /// The reason, if the capability is already revoked.
    pub fn revoked_now(&self) -> Option<RevokeReason> {
        *self.revoked.borrow()
    }
}

struct Entry {
    computer: Uuid,
    mode: ScreenMode,
    generation: Option<u64>,
    digest: SecretDigest,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    deadline: Instant,
    revoke: watch::Sender<Option<RevokeReason>>,
    reason: Option<String>,
}

impl Entry {
    fn info(&self, screen_id: Uuid) -> ScreenInfo {
        ScreenInfo {
            screen_id,
            computer_id: self.computer,
            mode: self.mode,
            generation: self.generation,
            created_at: self.created_at,
            expires_at: self.expires_at,
            connections: u32::try_from(self.revoke.receiver_count()).unwrap_or(u32::MAX),
            reason: self.reason.clone(),
        }
    }
}

/// What a capability is minted with ([`ScreenRegistry::mint_as`]).
#[derive(Debug, Clone, Copy)]
pub struct Mint<'a> {
    /// `view` or `control`.
    pub mode: ScreenMode,
    /// Its lifetime.
    pub ttl_ms: u64,
    /// The lease generation a control capability is bound to.
    pub generation: u64,
    /// What [`ScreenRegistry::epoch`] said before admission.
    pub epoch: Epoch,
    /// The reason given, kept for the list.
    pub reason: Option<&'a str>,
}

/// A computer's revocation count, read before admission and checked at mint
/// ([`ScreenRegistry::epoch`]), so a revocation that lands between the
/// owner's admission and the mint cannot be missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch(u64);

#[derive(Default)]
struct State {
    entries: HashMap<Uuid, Entry>,
    /// Bumped by every revocation of a computer's screens (all, or control
    /// after a generation change). Absent = 0.
    epochs: HashMap<Uuid, u64>,
}

/// Every live screen capability of the broker. Cheap to clone (one shared map).
#[derive(Clone, Default)]
pub struct ScreenRegistry {
    state: Arc<Mutex<State>>,
    /// Where mints and revocations are recorded, if anywhere.
    activity: Option<ActivityLog>,
}

impl std::fmt::Debug for ScreenRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScreenRegistry").finish_non_exhaustive()
    }
}

impl ScreenRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty registry that records every mint and revocation (expiry
    /// included) in `activity`.
    pub fn recording(activity: ActivityLog) -> Self {
        Self {
            state: Arc::default(),
            activity: Some(activity),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves whole entries behind; the map
        // is still consistent, so take it over.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The computer's current epoch; read it before asking the owner to
    /// admit a capability and pass it to [`mint`](Self::mint).
    pub fn epoch(&self, computer: Uuid) -> Epoch {
        Epoch(self.lock().epochs.get(&computer).copied().unwrap_or(0))
    }

    /// Mints a capability for `computer`. `generation` is the lease
    /// generation a control capability is bound to (the owner has already
    /// checked the caller's fence); it is ignored for `view`. `epoch` is
    /// what [`epoch`](Self::epoch) said before admission; if the computer's
    /// screens were revoked since, the mint is refused with
    /// [`RegistryError::Raced`]. `reason` (checked by
    /// [`CreateScreen::validate`](dormouse_protocol::screen::CreateScreen::validate))
    /// is kept for the list.
    pub fn mint(
        &self,
        computer: Uuid,
        mode: ScreenMode,
        ttl_ms: u64,
        generation: u64,
        epoch: Epoch,
        reason: Option<&str>,
    ) -> Result<ScreenGrant, RegistryError> {
        let mint = Mint {
            mode,
            ttl_ms,
            generation,
            epoch,
            reason,
        };
        self.mint_as(computer, mint, Actor::Api)
    }

    /// [`mint`](Self::mint), recorded as done by `actor`.
    pub fn mint_as(
        &self,
        computer: Uuid,
        mint: Mint<'_>,
        actor: Actor,
    ) -> Result<ScreenGrant, RegistryError> {
        let Mint {
            mode,
            ttl_ms,
            generation,
            epoch,
            reason,
        } = mint;
        if !(MIN_SCREEN_TTL_MS..=MAX_SCREEN_TTL_MS).contains(&ttl_ms) {
            return Err(RegistryError::BadTtl);
        }
        let ttl = Duration::from_millis(ttl_ms);
        let mut state = self.lock();
        if state.epochs.get(&computer).copied().unwrap_or(0) != epoch.0 {
            return Err(RegistryError::Raced);
        }
        let entries = &mut state.entries;
        sweep(entries, Instant::now(), self.activity.as_ref());
        let (views, all) = entries
            .values()
            .filter(|e| e.computer == computer)
            .fold((0, 0), |(v, a), e| {
                (v + usize::from(e.mode == ScreenMode::View), a + 1)
            });
        let full = match mode {
            ScreenMode::View => views >= MAX_SCREENS_PER_COMPUTER - CONTROL_RESERVE,
            ScreenMode::Control => false,
        };
        if full || all >= MAX_SCREENS_PER_COMPUTER {
            return Err(RegistryError::TooManyScreens(mode));
        }
        let mut secret = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut secret);
        let token = hex::encode(secret);
        let screen_id = Uuid::new_v4();
        let created_at = Utc::now();
        let expires_at = created_at
            + chrono::Duration::from_std(ttl).unwrap_or_else(|_| chrono::Duration::days(1));
        let (revoke, _) = watch::channel(None);
        entries.insert(
            screen_id,
            Entry {
                computer,
                mode,
                generation: (mode == ScreenMode::Control).then_some(generation),
                digest: SecretDigest::of(&token),
                created_at,
                expires_at,
                deadline: Instant::now() + ttl,
                revoke,
                reason: reason.map(str::to_owned),
            },
        );
        if let Some(activity) = &self.activity {
            let what = Happened::ScreenMinted {
                screen_id,
                mode: mode.as_str().to_owned(),
                reason: reason.map(str::to_owned),
            };
            activity.record(computer, actor, &what);
        }
        Ok(ScreenGrant {
            screen_id,
            mode,
            token,
            expires_at,
            websocket: websocket_path(screen_id),
        })
    }

    /// Checks `token` against capability `screen_id` and hands out a ticket
    /// for one connection.
    pub fn authorize(&self, screen_id: Uuid, token: &str) -> Result<Ticket, RegistryError> {
        let entries = &mut self.lock().entries;
        sweep(entries, Instant::now(), self.activity.as_ref());
        let entry = entries.get(&screen_id).ok_or(RegistryError::BadToken)?;
        if !entry.digest.matches(token) {
            return Err(RegistryError::BadToken);
        }
        if entry.revoke.borrow().is_some() {
            return Err(RegistryError::BadToken);
        }
        if entry.revoke.receiver_count() >= MAX_CONNECTIONS_PER_SCREEN {
            return Err(RegistryError::TooManyConnections);
        }
        // What the desktop's screen carries, every capability together: an
        // open connection holds its ticket's receiver until it closes.
        let (views, all) = entries
            .values()
            .filter(|e| e.computer == entry.computer)
            .fold((0, 0), |(v, a), e| {
                let n = e.revoke.receiver_count();
                (v + if e.mode == ScreenMode::View { n } else { 0 }, a + n)
            });
        let full = match entry.mode {
            ScreenMode::View => views >= MAX_VIEW_CONNECTIONS,
            ScreenMode::Control => false,
        };
        if full || all >= MAX_SCREEN_CONNECTIONS {
            return Err(RegistryError::ScreenFull(entry.mode));
        }
        Ok(Ticket {
            screen_id,
            computer: entry.computer,
            mode: entry.mode,
            deadline: entry.deadline,
            revoked: entry.revoke.subscribe(),
        })
    }

    /// The live capabilities of `computer`, oldest first (never tokens).
    pub fn list(&self, computer: Uuid) -> Vec<ScreenInfo> {
        let entries = &mut self.lock().entries;
        sweep(entries, Instant::now(), self.activity.as_ref());
        let mut list: Vec<ScreenInfo> = entries
            .iter()
            .filter(|(_, e)| e.computer == computer)
            .map(|(id, e)| e.info(*id))
            .collect();
        list.sort_by_key(|i| (i.created_at, i.screen_id));
        list
    }

    /// The computer a capability belongs to, if it is live.
    pub fn computer_of(&self, screen_id: Uuid) -> Option<Uuid> {
        let entries = &mut self.lock().entries;
        sweep(entries, Instant::now(), self.activity.as_ref());
        entries.get(&screen_id).map(|e| e.computer)
    }

    /// Revokes one capability: it stops working and its connections close.
    pub fn revoke(&self, screen_id: Uuid, reason: RevokeReason) -> Result<(), RegistryError> {
        self.revoke_as(screen_id, reason, Actor::Api)
    }

    /// [`revoke`](Self::revoke), recorded as done by `actor`.
    pub fn revoke_as(
        &self,
        screen_id: Uuid,
        reason: RevokeReason,
        actor: Actor,
    ) -> Result<(), RegistryError> {
        let entry = self
            .lock()
            .entries
            .remove(&screen_id)
            .ok_or(RegistryError::NotFound)?;
        signal(&entry, reason);
        record_revoked(self.activity.as_ref(), screen_id, &entry, reason, actor);
        Ok(())
    }

    /// Revokes every capability of `computer`; returns how many. Call on
    /// stop, kill, remove and a new container start.
    pub fn revoke_all(&self, computer: Uuid, reason: RevokeReason) -> usize {
        self.bump(computer);
        self.revoke_where(reason, |e| e.computer == computer)
    }

    /// Revokes the control capabilities of `computer` not bound to
    /// `generation`; returns how many. Call whenever the generation changes.
    /// View capabilities are not fenced and stay.
    pub fn revoke_control_except(&self, computer: Uuid, generation: u64) -> usize {
        self.bump(computer);
        self.revoke_where(RevokeReason::GenerationChanged, |e| {
            e.computer == computer
                && e.mode == ScreenMode::Control
                && e.generation != Some(generation)
        })
    }

    /// Revokes everything (broker shutdown).
    pub fn revoke_everything(&self, reason: RevokeReason) -> usize {
        self.revoke_where(reason, |_| true)
    }

    /// Moves the computer's epoch on, so a mint admitted before fails.
    /// Kept after removal too (eight bytes a computer): forgetting it would
    /// let a mint that raced the removal through.
    fn bump(&self, computer: Uuid) {
        let mut state = self.lock();
        let e = state.epochs.entry(computer).or_insert(0);
        *e = e.wrapping_add(1);
    }

    fn revoke_where(&self, reason: RevokeReason, affected: impl Fn(&Entry) -> bool) -> usize {
        let gone: Vec<(Uuid, Entry)> = {
            let entries = &mut self.lock().entries;
            let ids: Vec<Uuid> = entries
                .iter()
                .filter(|(_, e)| affected(e))
                .map(|(id, _)| *id)
                .collect();
            ids.iter()
                .filter_map(|id| entries.remove(id).map(|e| (*id, e)))
                .collect()
        };
        for (id, entry) in &gone {
            signal(entry, reason);
            record_revoked(self.activity.as_ref(), *id, entry, reason, Actor::Broker);
        }
        gone.len()
    }

    /// Drops expired capabilities and tells their connections; returns how
    /// many. Every call sweeps too; a periodic sweep only frees memory sooner.
    pub fn sweep(&self) -> usize {
        sweep(
            &mut self.lock().entries,
            Instant::now(),
            self.activity.as_ref(),
        )
    }

    /// Runs [`sweep`](Self::sweep) every `every` until the registry is the
    /// `stop` is cancelled.
    pub async fn sweep_every(&self, every: Duration, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => { self.sweep(); }
            }
        }
    }
}

fn signal(entry: &Entry, reason: RevokeReason) {
    // `send_replace` stores the reason even with no receiver, so a ticket
    // handed out a moment before sees it on its first look.
    entry.revoke.send_replace(Some(reason));
}

/// Records that capability `screen_id` went, for `reason`.
fn record_revoked(
    activity: Option<&ActivityLog>,
    screen_id: Uuid,
    entry: &Entry,
    reason: RevokeReason,
    actor: Actor,
) {
    let Some(activity) = activity else {
        return;
    };
    let reason = serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned));
    let what = Happened::ScreenRevoked {
        screen_id,
        mode: entry.mode.as_str().to_owned(),
        reason,
    };
    activity.record(entry.computer, actor, &what);
}

fn sweep(
    entries: &mut HashMap<Uuid, Entry>,
    now: Instant,
    activity: Option<&ActivityLog>,
) -> usize {
    let expired: Vec<Uuid> = entries
        .iter()
        .filter(|(_, e)| e.deadline <= now)
        .map(|(id, _)| *id)
        .collect();
    for id in &expired {
        if let Some(entry) = entries.remove(id) {
            signal(&entry, RevokeReason::Expired);
            record_revoked(activity, *id, &entry, RevokeReason::Expired, Actor::Broker);
        }
    }
    expired.len()
}

#[cfg(test)]
mod tests;
